package gossip

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"golang.org/x/time/rate"

	"github.com/kvmesh/kvmesh/kvindex"
)

// Wire envelope of every kvmesh gossip message: version byte, kind byte, body.
const (
	wireVersion = 1
	msgState    = 1
	msgDelta    = 2
	msgPushPull = 3
	msgRecord   = 4 // a state record sent straight to a domain member, not relayed

	// maxMessage keeps every broadcast well inside one memberlist UDP packet (1400 bytes less
	// compound, label and encryption overhead); a larger broadcast would never be sent.
	maxMessage   = 1024
	maxNameBytes = 128
)

// Liveness is a member's failure-detector state.
type Liveness string

// Liveness values, as memberlist's SWIM reports them. memberlist v0.7.0 reports joins and
// deaths to its event delegate but not the transient suspect state, so a suspected member
// shows as alive until it is declared dead; LivenessSuspect is part of the vocabulary (the
// /v1/mesh/peers JSON) for when that signal is available.
const (
	LivenessAlive   Liveness = "alive"
	LivenessSuspect Liveness = "suspect"
	LivenessDead    Liveness = "dead"
	LivenessLeft    Liveness = "left"
)

// Member is one node in this node's view of the mesh.
type Member struct {
	Name string
	// Addr is the member's gossip address (host:port).
	Addr     string
	Liveness Liveness
	// State is the member's last state record (zero if none arrived yet).
	State State
	// Updated is when this node received that record; Age is now minus Updated.
	Updated time.Time
	Age     time.Duration
	// Stale: no record for longer than MaxAge (or none at all). MaxAge is StaleAfter, or three
	// mesh intervals for a member outside this node's domains in a mesh large enough that their
	// records come only that often (Config.MeshPublishInterval).
	Stale  bool
	MaxAge time.Duration
	// Candidate: alive with a record, and fresh or stale under FailOpen; the router may send it work.
	Candidate bool
	// PrefixBlocks is how many of the member's prefix blocks this node's index holds.
	PrefixBlocks int
	// Incarnation counts the boots (distinct BootIDs) of the member this node has seen,
	// from 1; a restart increments it. memberlist's internal SWIM incarnation is not exported.
	Incarnation uint32
	Self        bool
}

// Errors of the Gossip lifecycle.
var (
	ErrStarted = errors.New("gossip: already started")
	ErrClosed  = errors.New("gossip: closed")
)

// Drop reasons, the label values of kvmesh_gossip_dropped_messages_total.
const (
	dropVersion       = "version"
	dropMalformed     = "malformed"
	dropType          = "unknown_type"
	dropUnknownMember = "unknown_member"
	dropDeadMember    = "dead_member"
	dropStaleBoot     = "stale_boot"
	dropBandwidth     = "bandwidth"
	dropOtherModel    = "other_model"
)

var dropReasons = []string{dropVersion, dropMalformed, dropType, dropUnknownMember, dropDeadMember, dropStaleBoot, dropBandwidth, dropOtherModel}

// Prefix domains send each target, every GossipInterval, its share of the byte budget
// (MaxBytesPerSecond × GossipInterval / GossipNodes) and at least the bytes of one memberlist
// gossip packet: UDPBufferSize (1,400) less the compound header (2) and AES-GCM's overhead
// (29), counting 2 bytes a message. Each message goes in a packet of its own.
// packetOverhead is what a message sent on its own costs besides its bytes: memberlist's
// message type and AES-GCM's version, nonce and tag. The budget counts it.
const packetOverhead = 2 + 29

// Gossip is this node's mesh membership: it publishes the local state and prefix residency and
// keeps every peer's. Create it with New, run it with Start, stop it with Close or Leave.
type Gossip struct {
	cfg    Config
	log    *slog.Logger
	idx    *kvindex.Index
	met    *metrics
	bootID uint64
	queue  *memberlist.TransmitLimitedQueue
	// alive counts alive members including this one: the queue's NumNodes, kept here so the
	// queue never calls into memberlist's locks.
	alive atomic.Int32
	// dropDeltas is a test hook: prefix rounds send nothing and discard the pending deltas,
	// so only push/pull tells peers this node's residency.
	dropDeltas atomic.Bool
	// sendTo sends one message to one member (memberlist's SendToAddress; tests replace it).
	sendTo func(memberlist.Address, []byte) error

	mu      sync.Mutex
	started bool
	closed  bool
	ml      *memberlist.Memberlist
	localFn func() State
	local   State
	pub     State  // last published record
	pubBody []byte // its encoding with Seq zeroed, for change detection
	pubAt   time.Time
	// meshPub and meshAt are the last record queued for memberlist's gossip to the whole mesh;
	// recNext is the domain member the next round's records start from.
	meshPub    State
	meshAt     time.Time
	recNext    int
	deltaSeq   uint64
	pend       map[uint64]bool // block → stored (true) or evicted (false) since the last flush
	pendOrder  []uint64
	snapshotFn func() []uint64
	peers      map[string]*peerInfo
	tokens     float64
	tokensAt   time.Time
	// byModel lists, per model, the alive peers (not this node) whose record serves it, by
	// name; domains are this node's own models' prefix domains. Both are rebuilt when a
	// liveness or a record's model list changes (domainsDirty), not per request.
	byModel      map[string][]string
	domains      map[string]*domain
	domainsDirty bool
	inDomain     int // alive peers sharing a model with this node, as of the last rebuild
	// staleIn and staleOut are the record ages past which a peer inside and outside this
	// node's domains is stale (staleAfterLocked), refreshed with each flush and rebuild so
	// that listing members, once a request, costs no more than it did.
	staleIn, staleOut time.Duration
	// claims are the other members' claims (State.Claims), rebuilt when a record's claims or
	// a liveness changed, and at least every PublishInterval so that a claim in a record gone
	// stale stops counting.
	claims      []heldClaim
	claimsDirty bool
	claimsBuilt time.Time

	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
	// leaving is set as Leave begins: this node's memberlist meta then says so (metaLeaving),
	// which is how peers tell its departure from its death.
	leaving atomic.Bool
}

type peerInfo struct {
	addr        string
	liveness    Liveness
	changed     time.Time
	state       State
	hasState    bool
	updated     time.Time
	bootID      uint64
	retired     []uint64 // superseded boot ids: their late messages are dropped
	incarnation uint32
	// Delta dedup: the highest delta seq applied and a bitmap of the 64 below it, so deltas
	// that arrive out of order are still applied once.
	maxDelta uint64
	seen     uint64
	// synced is the boot id of this peer's process that was sent this node's whole residency;
	// a peer whose boot id differs (new, restarted, back from dead, newly in a domain, or
	// missed deltas this node dropped) is sent it at the next prefix round the budget allows.
	synced uint64
	// recAt is when this node last sent the peer its record straight (records by domain).
	recAt time.Time
}

// domain is one model's prefix domain as this node sees it: the alive peers serving the model.
type domain struct {
	members []string // this node excluded, sorted
}

// New validates cfg and returns a Gossip that has not touched the network.
func New(cfg Config) (*Gossip, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if len(cfg.Name) > maxNameBytes {
		return nil, fmt.Errorf("%w: name longer than %d bytes", ErrConfig, maxNameBytes)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	met, err := newMetrics(cfg.Registerer, cfg.StalePolicy)
	if err != nil {
		return nil, err
	}
	var boot [16]byte
	_, _ = crand.Read(boot[:])
	g := &Gossip{
		cfg:     cfg,
		log:     log.With("component", "gossip"),
		idx:     kvindex.NewIndex(kvindex.IndexConfig{MaxBlocksPerPeer: cfg.MaxBlocksPerPeer}),
		met:     met,
		bootID:  binary.LittleEndian.Uint64(boot[:]) | 1, // never 0: 0 means "no boot id"
		pend:    make(map[uint64]bool),
		peers:   make(map[string]*peerInfo),
		byModel: make(map[string][]string),
		domains: make(map[string]*domain),
		staleIn: cfg.StaleAfter, staleOut: cfg.StaleAfter,
	}
	g.queue = &memberlist.TransmitLimitedQueue{
		NumNodes:       func() int { return int(g.alive.Load()) },
		RetransmitMult: 4,
	}
	if cfg.RetransmitMult > 0 {
		g.queue.RetransmitMult = cfg.RetransmitMult
	}
	return g, nil
}

// Index returns every member's prefix residency, this node's included. Use it for
// LongestPrefix and AddSpeculative.
func (g *Gossip) Index() *kvindex.Index { return g.idx }

// LongestPrefix is Index().LongestPrefix at the current time.
func (g *Gossip) LongestPrefix(blocks []uint64, dst []kvindex.Match) []kvindex.Match {
	return g.idx.LongestPrefix(blocks, time.Now(), dst)
}

// Name returns this member's name.
func (g *Gossip) Name() string { return g.cfg.Name }

// SetLocal sets the function gossip calls (at most every FlushInterval, never with gossip's
// locks held) for this node's current state. Name, BootID and Seq are overwritten.
func (g *Gossip) SetLocal(fn func() State) {
	g.mu.Lock()
	g.localFn = fn
	g.mu.Unlock()
}

// UpdateLocal sets this node's state to s (replacing any SetLocal function); it is published at
// the next flush if it changed.
func (g *Gossip) UpdateLocal(s State) {
	g.mu.Lock()
	g.localFn = nil
	g.local = s
	g.mu.Unlock()
}

// SetSnapshot sets the function that returns this node's full residency (least recent first)
// for push/pull. Without one, the index's own record of PrefixStored/PrefixEvicted is used.
func (g *Gossip) SetSnapshot(fn func() []uint64) {
	g.mu.Lock()
	g.snapshotFn = fn
	g.mu.Unlock()
}

// PrefixStored records that this node's engine stored blocks; they are in the local index at
// once and broadcast, coalesced, at the next flush.
func (g *Gossip) PrefixStored(blocks []uint64) { g.queueDelta(blocks, true) }

// PrefixEvicted records that this node's engine evicted blocks.
func (g *Gossip) PrefixEvicted(blocks []uint64) { g.queueDelta(blocks, false) }

func (g *Gossip) queueDelta(blocks []uint64, stored bool) {
	if len(blocks) == 0 {
		return
	}
	if stored {
		g.idx.Add(g.cfg.Name, blocks)
	} else {
		g.idx.Remove(g.cfg.Name, blocks)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, h := range blocks {
		if _, ok := g.pend[h]; !ok {
			g.pendOrder = append(g.pendOrder, h)
		}
		g.pend[h] = stored
	}
	if limit := g.idx.MaxBlocksPerPeer(); len(g.pend) > limit {
		// More change than one snapshot holds: send none of it; the members are sent the
		// residency again (sync), as after a dropped round.
		g.met.dropped.WithLabelValues(dropBandwidth).Inc()
		clear(g.pend)
		g.pendOrder = g.pendOrder[:0]
		for _, p := range g.peers {
			p.synced = 0
		}
	}
}

// Start creates the memberlist (binding its sockets), publishes the local state, joins the
// seeds and starts the publish loop. A failed join is retried in the background with backoff,
// so a node started before its seeds still converges. A ctx already done refuses to start.
func (g *Gossip) Start(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("gossip: start: %w", err)
	}
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return ErrClosed
	}
	if g.started {
		g.mu.Unlock()
		return ErrStarted
	}
	g.started = true
	g.mu.Unlock()

	mlc := memberlist.DefaultLANConfig()
	mlc.Name = g.cfg.Name
	mlc.BindAddr = g.cfg.BindAddr
	mlc.BindPort = max(g.cfg.BindPort, 0) // AnyPort: memberlist's 0 picks one
	mlc.AdvertiseAddr = g.cfg.AdvertiseAddr
	mlc.AdvertisePort = g.cfg.AdvertisePort
	if mlc.AdvertisePort == 0 {
		// The bound port (a free one, once picked: memberlist or newDropTransport sets it).
		// memberlist advertises an address given without a port as port 0, where no peer
		// can reach it.
		mlc.AdvertisePort = mlc.BindPort
	}
	mlc.PushPullInterval = g.cfg.PushPullInterval
	setDur(&mlc.ProbeInterval, g.cfg.ProbeInterval)
	setDur(&mlc.ProbeTimeout, g.cfg.ProbeTimeout)
	setDur(&mlc.GossipInterval, g.cfg.GossipInterval)
	setDur(&mlc.TCPTimeout, g.cfg.TCPTimeout)
	setDur(&mlc.DeadNodeReclaimTime, g.cfg.DeadNodeReclaimTime)
	if g.cfg.GossipNodes > 0 {
		mlc.GossipNodes = g.cfg.GossipNodes
	}
	if g.cfg.SuspicionMult > 0 {
		mlc.SuspicionMult = g.cfg.SuspicionMult
	}
	if g.cfg.RetransmitMult > 0 {
		mlc.RetransmitMult = g.cfg.RetransmitMult
	}
	if len(g.cfg.Key) > 0 {
		kr, err := memberlist.NewKeyring(nil, g.cfg.Key)
		if err != nil {
			return fmt.Errorf("gossip: keyring: %w", err)
		}
		mlc.Keyring = kr
		mlc.GossipVerifyIncoming = true
		mlc.GossipVerifyOutgoing = true
	}
	mlc.Delegate = &delegate{g}
	mlc.Events = &events{g}
	mlc.LogOutput = io.Discard
	if g.cfg.Logger != nil {
		mlc.LogOutput = newLogWriter(g.log.With("component", "memberlist"))
	}
	if g.cfg.Drop != nil {
		dt, err := newDropTransport(mlc, g.cfg.Drop)
		if err != nil {
			return fmt.Errorf("gossip: start memberlist: %w", err)
		}
		mlc.Transport = dt
	}
	ml, err := memberlist.Create(mlc)
	if err != nil {
		if mlc.Transport != nil {
			_ = mlc.Transport.Shutdown()
		}
		return fmt.Errorf("gossip: start memberlist: %w", err)
	}
	lctx, cancel := context.WithCancel(context.Background())
	g.mu.Lock()
	g.ml = ml
	g.cancel = cancel
	g.mu.Unlock()
	g.flush(time.Now())

	g.wg.Add(2)
	go g.publishLoop(lctx)
	go g.reconnectLoop(lctx)
	if len(g.cfg.Join) > 0 {
		// memberlist's Join takes no context; each seed attempt is bounded by TCPTimeout.
		if _, err := ml.Join(g.cfg.Join); err != nil {
			g.log.Warn("join failed, retrying in background", "seeds", g.cfg.Join, "err", err)
		}
		g.wg.Add(1)
		go g.joinLoop(lctx)
	}
	return nil
}

func setDur(dst *time.Duration, v time.Duration) {
	if v > 0 {
		*dst = v
	}
}

// LocalAddr returns the bound gossip address (host:port), or "" before Start.
func (g *Gossip) LocalAddr() string {
	g.mu.Lock()
	ml := g.ml
	g.mu.Unlock()
	if ml == nil {
		return ""
	}
	return ml.LocalNode().Address()
}

// joinLoop joins the seeds again whenever this node is alone: after a first join that failed,
// and after one that reached only this node itself (two nodes started together whose seed name
// resolved to themselves would otherwise stay two meshes for good), or once every peer left.
func (g *Gossip) joinLoop(ctx context.Context) {
	defer g.wg.Done()
	backoff := 100 * time.Millisecond
	for {
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		g.mu.Lock()
		ml := g.ml
		g.mu.Unlock()
		if ml.NumMembers() > 1 {
			backoff = g.cfg.JoinRetryMax // not alone: look again later
			continue
		}
		n, err := ml.Join(g.cfg.Join)
		if err == nil && ml.NumMembers() > 1 {
			g.log.Info("joined", "contacted", n)
			backoff = g.cfg.JoinRetryMax
			continue
		}
		g.log.Debug("join retry: still alone", "contacted", n, "err", err)
		backoff = min(2*backoff, g.cfg.JoinRetryMax)
	}
}

func (g *Gossip) publishLoop(ctx context.Context) {
	defer g.wg.Done()
	t := time.NewTicker(g.cfg.FlushInterval)
	defer t.Stop()
	pt := time.NewTicker(g.cfg.PrefixInterval)
	defer pt.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			g.flush(now)
		case now := <-pt.C:
			g.sendPrefixes(now)
		}
	}
}

// flush publishes the state if it changed or is due, bounds the queue and refreshes the
// gauges.
func (g *Gossip) flush(now time.Time) {
	g.mu.Lock()
	fn := g.localFn
	g.mu.Unlock()
	var st State
	if fn != nil {
		st = fn()
	}

	g.mu.Lock()
	if fn == nil {
		st = g.local
	}
	st.Name, st.BootID, st.Seq = g.cfg.Name, g.bootID, 0
	var out []memberlist.Broadcast
	body, err := EncodeState(st)
	for err == nil && 2+len(body) > maxMessage && len(st.Claims) > 0 {
		// Claims are the record's one optional part: one left out costs its head the mesh's
		// help, a record too large for a broadcast would cost the node its place in the mesh.
		st.Claims = st.Claims[:len(st.Claims)-1]
		body, err = EncodeState(st)
	}
	if err != nil {
		g.log.Error("local state not encodable", "err", err)
	} else if due := now.Sub(g.pubAt) >= g.cfg.PublishInterval; due ||
		(!slices.Equal(body, g.pubBody) && now.Sub(g.pubAt) >= g.cfg.MinPublishInterval) {
		st.Seq = g.pub.Seq + 1
		msg, _ := AppendState([]byte{wireVersion, msgState}, st)
		if !sameModels(st.Models, g.pub.Models) {
			g.domainsDirty = true
		}
		g.pub, g.pubBody, g.pubAt = st, body, now
		// Every record while memberlist carries them all (up to about 32 members, as always);
		// past that, one a mesh interval and any change of structure.
		if !g.directRecordsLocked() || now.Sub(g.meshAt) >= g.meshIntervalLocked() || !sameStructure(st, g.meshPub) {
			g.meshPub, g.meshAt = st, now
			out = append(out, &namedBroadcast{name: g.cfg.Name, msg: msg})
		}
	}
	g.markStaleLocked(now)
	g.rebuildDomainsLocked()
	g.mu.Unlock()

	for _, b := range out {
		g.queue.QueueBroadcast(b)
	}
	if maxQueued := max(16, 2*g.cfg.MaxBytesPerSecond/maxMessage); g.queue.NumQueued() > maxQueued {
		n := g.queue.NumQueued()
		g.queue.Prune(maxQueued)
		// Relayed records may be queued concurrently, so the queue can have regrown already;
		// count what Prune removed at most, never a negative number.
		g.met.dropped.WithLabelValues(dropBandwidth).Add(float64(max(0, n-maxQueued)))
	}
	g.idx.Expire(now)
	is := g.idx.Stats()
	g.met.indexBytes.Set(float64(is.Bytes))
	g.met.indexBlocks.Set(float64(is.Blocks))
}

// sameStructure reports whether a and b agree on what decides where requests may go: the
// models, role, addresses and engine health. A change there goes to the whole mesh at once,
// whatever the mesh interval.
func sameStructure(a, b State) bool {
	return a.Seq != 0 && b.Seq != 0 && sameModels(a.Models, b.Models) && a.Role == b.Role &&
		a.HTTPAddr == b.HTTPAddr && a.QUICAddr == b.QUICAddr && a.EngineHealthy == b.EngineHealthy
}

// meshIntervalLocked is the interval of this node's records to the whole mesh: the configured
// one, or MeshInterval for the members alive now.
func (g *Gossip) meshIntervalLocked() time.Duration {
	if g.cfg.MeshPublishInterval > 0 {
		return g.cfg.MeshPublishInterval
	}
	return MeshInterval(g.cfg.PublishInterval, int(g.alive.Load()))
}

// directRecordsLocked reports whether records also go straight to the domains' members: once
// the mesh-wide interval is longer than PublishInterval, which they would otherwise miss.
func (g *Gossip) directRecordsLocked() bool { return g.meshIntervalLocked() > g.cfg.PublishInterval }

// directEveryLocked is how often this node's record goes straight to its domains' members:
// every PublishInterval, or, in a domain so large that that would take more than half the byte
// budget, as often as half the budget carries it to all of them, so records never crowd out
// the prefix rounds (a record is about 250 bytes with its packet: 275 members at 64 KiB/s).
func (g *Gossip) directEveryLocked() time.Duration {
	perRound := float64(g.inDomain * (len(g.pubBody) + 4 + packetOverhead))
	d := time.Duration(perRound / (float64(g.cfg.MaxBytesPerSecond) / 2) * float64(time.Second))
	return max(g.cfg.PublishInterval, d)
}

// refreshStaleLocked sets the record ages past which a peer is stale: StaleAfter, or three
// times the interval records come at once they are spread thinner than PublishInterval: for a
// member of this node's domains the shorter of the direct and the mesh-wide intervals (this
// node's own pace stands in for the peer's: a peer in more or larger domains sends less often
// than that; a record could carry its pace), for one outside them the mesh-wide one.
func (g *Gossip) refreshStaleLocked() {
	g.staleIn, g.staleOut = g.cfg.StaleAfter, g.cfg.StaleAfter
	if !g.directRecordsLocked() {
		return
	}
	mesh := g.meshIntervalLocked()
	g.staleIn = max(g.cfg.StaleAfter, 3*min(mesh, g.directEveryLocked()))
	g.staleOut = max(g.cfg.StaleAfter, 3*mesh)
}

// staleAfterLocked is the record age past which p is stale (refreshStaleLocked). A peer whose
// models are not known yet counts as inside; with no models of its own, this node is in no
// domain and gets every record through the mesh.
func (g *Gossip) staleAfterLocked(p *peerInfo) time.Duration {
	if len(g.pub.Models) > 0 && !g.otherModelLocked(p) {
		return g.staleIn
	}
	return g.staleOut
}

func sameModels(a, b []ModelInfo) bool {
	return slices.EqualFunc(a, b, func(x, y ModelInfo) bool { return x.Name == y.Name })
}

// rebuildDomainsLocked rebuilds byModel and this node's domains after a liveness or a model
// list changed, and forgets the residency of peers that share no model with this node: it is
// kept only for peers whose prefixes a request here could use.
func (g *Gossip) rebuildDomainsLocked() {
	if !g.domainsDirty {
		return
	}
	g.domainsDirty = false
	for m, names := range g.byModel {
		g.byModel[m] = names[:0]
	}
	for name, p := range g.peers {
		if name == g.cfg.Name || p.liveness != LivenessAlive || !p.hasState {
			continue
		}
		for _, mi := range p.state.Models {
			if names := g.byModel[mi.Name]; !slices.Contains(names, name) {
				g.byModel[mi.Name] = append(names, name)
			}
		}
	}
	for m, names := range g.byModel {
		if len(names) == 0 {
			delete(g.byModel, m)
			continue
		}
		slices.Sort(names)
	}
	for m := range g.domains {
		if !slices.ContainsFunc(g.pub.Models, func(mi ModelInfo) bool { return mi.Name == m }) {
			delete(g.domains, m) // no longer served: its queued messages have no one to go to
		}
	}
	for _, mi := range g.pub.Models {
		d := g.domains[mi.Name]
		if d == nil {
			d = &domain{}
			g.domains[mi.Name] = d
		}
		d.members = g.byModel[mi.Name]
	}
	inDomain := 0
	for name, p := range g.peers {
		if name == g.cfg.Name || !p.hasState {
			continue
		}
		if g.otherModelLocked(p) {
			// Each side drops the other's residency: back in a domain, both resend theirs.
			g.idx.DropPeer(name)
			p.maxDelta, p.seen, p.synced = 0, 0, 0
		} else if p.liveness == LivenessAlive {
			inDomain++
		}
	}
	g.inDomain = inDomain
	g.refreshStaleLocked()
	g.met.domainPeers.Set(float64(inDomain))
}

// otherModelLocked reports whether p is outside every prefix domain of this node: both
// records list models and they share none. Until both are known the peer counts as inside.
func (g *Gossip) otherModelLocked(p *peerInfo) bool {
	if !p.hasState || len(p.state.Models) == 0 || len(g.pub.Models) == 0 {
		return false
	}
	for _, mi := range p.state.Models {
		if g.domains[mi.Name] != nil {
			return false
		}
	}
	return true
}

// sendPrefixes is one prefix round, every PrefixInterval: this node's deltas, coalesced since
// the last round, go straight to every alive member of its domains, and its whole residency to
// the members that have not been sent it (synced). Nothing is relayed: each member receives
// each delta once, from its origin, which is the least any scheme that keeps every member's
// view whole can send, where an epidemic sends every delta its retransmit limit's times over.
// A round is sent whole while the byte budget's bucket is not in debt, and may overdraw it by
// up to two seconds' worth, so a round to a large domain is never too big to go: the next
// rounds (and state records) wait until the bucket is back above zero, which holds the average
// to the budget. A round past two seconds of budget is dropped, and the members it was for are
// sent the residency again instead, a few a round.
func (g *Gossip) sendPrefixes(now time.Time) {
	g.mu.Lock()
	if g.ml == nil && g.sendTo == nil {
		g.mu.Unlock()
		return
	}
	g.rebuildDomainsLocked()
	var names []string
	for _, d := range g.domains {
		names = append(names, d.members...)
	}
	if len(g.domains) > 1 {
		slices.Sort(names)
		names = slices.Compact(names) // a member in two of this node's domains is sent once
	}
	to := make([]*peerInfo, len(names))
	for i, name := range names {
		to[i] = g.peers[name]
	}
	if len(to) == 0 || g.dropDeltas.Load() {
		g.clearPendLocked() // no one to tell: a member joining later is sent the residency
		g.mu.Unlock()
		return
	}
	g.refillLocked(now)
	// This node's record, straight to the domains' members, when the mesh-wide gossip carries
	// it too seldom for them: to each member every PublishInterval, at most half the budget a
	// round, going round the members from where the last round stopped (so in a domain too
	// large for that, each gets it every directEveryLocked). It is small and goes first,
	// whatever the bucket's debt, so a prefix round's overdraft never makes this node stale.
	// A member not yet synced gets it with the residency (sync).
	var rec []byte
	var recTo []int
	if g.directRecordsLocked() && g.pub.Seq > 0 {
		rec, _ = AppendState([]byte{wireVersion, msgRecord}, g.pub)
		cost := len(rec) + packetOverhead
		budget := max(cost, int(float64(g.cfg.MaxBytesPerSecond)/2*g.cfg.PrefixInterval.Seconds()))
		spent, start := 0, g.recNext%len(to)
		for k := range to {
			i := (start + k) % len(to)
			p := to[i]
			if p.synced != p.bootID || now.Sub(p.recAt) < g.cfg.PublishInterval {
				continue
			}
			if spent+cost > budget {
				break
			}
			recTo, spent, p.recAt, g.recNext = append(recTo, i), spent+cost, now, i+1
		}
		g.tokens -= float64(spent)
	}
	var deltas [][]byte
	if deltas = g.deltaMessagesLocked(); len(deltas) > 0 {
		cost := float64(len(to) * bytesOf(deltas))
		switch {
		case g.tokens > 0 && cost <= 2*float64(g.cfg.MaxBytesPerSecond):
			g.clearPendLocked()
			g.tokens -= cost
		case g.tokens > 0:
			g.clearPendLocked()
			g.met.dropped.WithLabelValues(dropBandwidth).Add(float64(len(deltas)))
			for _, p := range to {
				p.synced = 0
			}
			deltas = nil
		default:
			deltas = nil // wait for the budget; the pending changes keep coalescing
		}
	}
	g.deltaSeq += uint64(len(deltas))
	var unsynced []*peerInfo
	var unsyncedNames []string
	for i, p := range to {
		if p.synced != p.bootID {
			unsynced = append(unsynced, p)
			unsyncedNames = append(unsyncedNames, names[i])
		}
	}
	fn, send := g.snapshotFn, g.sendTo
	if send == nil {
		send = g.ml.SendToAddress
	}
	addrs := make([]memberlist.Address, len(to))
	for i, p := range to {
		addrs[i] = memberlist.Address{Addr: p.addr, Name: names[i]}
	}
	g.mu.Unlock()

	sent := 0
	for _, i := range recTo {
		sent += g.send(send, addrs[i], rec)
	}
	for _, a := range addrs {
		for _, msg := range deltas {
			sent += g.send(send, a, msg)
		}
	}
	if len(unsynced) > 0 {
		sent += g.sync(now, send, fn, unsynced, unsyncedNames)
	}
	if sent > 0 {
		g.met.sent.Add(float64(sent))
	}
}

// sync sends this node's residency, as deltas of added blocks, to the members in to, as many
// as the budget allows this round, after its record when records go straight to the domains. A member that held some of it stale (it missed evictions
// in a dropped backlog) keeps those until the next push/pull snapshot replaces its view.
func (g *Gossip) sync(now time.Time, send func(memberlist.Address, []byte) error, fn func() []uint64, to []*peerInfo, names []string) int {
	blocks := g.residency(fn)
	g.mu.Lock()
	msgs := g.summaryMessagesLocked(blocks, nil)
	g.deltaSeq += uint64(len(msgs))
	withRecord := g.directRecordsLocked() && g.pub.Seq > 0
	if withRecord {
		// A new member may wait a mesh interval for this node's record otherwise.
		rec, _ := AppendState([]byte{wireVersion, msgRecord}, g.pub)
		msgs = append([][]byte{rec}, msgs...)
	}
	cost := float64(bytesOf(msgs))
	if cost > 2*float64(g.cfg.MaxBytesPerSecond) {
		// Past what a round may overdraw: the push/pull snapshot brings these members up to date.
		for _, p := range to {
			p.synced = p.bootID
		}
		g.mu.Unlock()
		g.met.dropped.WithLabelValues(dropBandwidth).Inc()
		return 0
	}
	var addrs []memberlist.Address
	for i, p := range to {
		if g.tokens <= 0 {
			break // the rest at a later round
		}
		g.tokens -= cost
		p.synced = p.bootID
		if withRecord {
			p.recAt = now
		}
		addrs = append(addrs, memberlist.Address{Addr: p.addr, Name: names[i]})
	}
	g.mu.Unlock()
	sent := 0
	for _, a := range addrs {
		for _, msg := range msgs {
			sent += g.send(send, a, msg)
		}
	}
	return sent
}

// send sends msg to a and returns the bytes it cost.
func (g *Gossip) send(send func(memberlist.Address, []byte) error, a memberlist.Address, msg []byte) int {
	if err := send(a, msg); err != nil {
		g.log.Debug("prefix summary not sent", "member", a.Name, "err", err)
		return 0
	}
	return len(msg) + packetOverhead
}

func bytesOf(msgs [][]byte) int {
	n := 0
	for _, m := range msgs {
		n += len(m) + packetOverhead
	}
	return n
}

// deltaMessagesLocked cuts the pending deltas into messages that each fit one packet; it
// leaves them pending (clearPendLocked takes them).
func (g *Gossip) deltaMessagesLocked() [][]byte {
	if len(g.pendOrder) == 0 {
		return nil
	}
	var added, evicted []uint64
	for _, h := range g.pendOrder {
		if g.pend[h] {
			added = append(added, h)
		} else {
			evicted = append(evicted, h)
		}
	}
	return g.summaryMessagesLocked(added, evicted)
}

func (g *Gossip) clearPendLocked() {
	clear(g.pend)
	g.pendOrder = g.pendOrder[:0]
}

// summaryMessagesLocked cuts added and evicted blocks into delta messages that each fit one
// packet, numbered from deltaSeq+1 on.
func (g *Gossip) summaryMessagesLocked(added, evicted []uint64) [][]byte {
	head := deltaHeader(g.cfg.Name, g.bootID)
	per := (maxMessage - len(head) - 32) / 8
	var out [][]byte
	seq := g.deltaSeq
	for len(added)+len(evicted) > 0 {
		var s kvindex.Summary
		n := min(per, len(added))
		s.Added, added = added[:n], added[n:]
		m := min(per-n, len(evicted))
		s.Evicted, evicted = evicted[:m], evicted[m:]
		seq++
		s.Seq = seq
		msg, _ := s.AppendBinary(slices.Clip(head))
		out = append(out, msg)
	}
	return out
}

func deltaHeader(name string, boot uint64) []byte {
	b := []byte{wireVersion, msgDelta}
	b = binary.AppendUvarint(b, uint64(len(name)))
	b = append(b, name...)
	return binary.LittleEndian.AppendUint64(b, boot)
}

// decodeDelta parses a delta body (after the envelope): origin, boot id, summary.
func decodeDelta(b []byte) (string, uint64, kvindex.Summary, error) {
	l, n := binary.Uvarint(b)
	if n <= 0 || l == 0 || l > maxNameBytes || uint64(len(b)-n) < l+8 {
		return "", 0, kvindex.Summary{}, fmt.Errorf("%w: delta header", ErrMalformed)
	}
	name := string(b[n : n+int(l)])
	b = b[n+int(l):]
	boot := binary.LittleEndian.Uint64(b)
	s, err := kvindex.DecodeSummary(b[8:])
	if err != nil {
		return "", 0, s, err
	}
	if s.Snapshot || s.Seq == 0 || boot == 0 {
		return "", 0, s, fmt.Errorf("%w: delta fields", ErrMalformed)
	}
	return name, boot, s, nil
}

func (g *Gossip) markStaleLocked(now time.Time) {
	g.refreshStaleLocked()
	stale := 0
	for name, p := range g.peers {
		if name == g.cfg.Name {
			continue
		}
		if p.liveness == LivenessDead || p.liveness == LivenessLeft {
			if now.Sub(p.changed) > g.cfg.DeadRetention {
				delete(g.peers, name)
			}
			continue
		}
		if !p.hasState || now.Sub(p.updated) > g.staleAfterLocked(p) {
			stale++
		}
	}
	g.met.stale.Set(float64(stale))
}

// heldClaim is a claim and the member whose record holds it.
type heldClaim struct {
	by string
	Claim
}

// ClaimedAhead adds to dst, by peer name, the KV blocks the other members' latest records
// claim for requests that outrank one of priority that arrived at arrived (Claim.Outranks):
// the room such a request must leave alone. The claims of except (the ingress a request came
// from, whose own claim must not stand in its way, "" for none) are left out. Only alive
// members with a fresh record count. One lock and a walk of the mesh's claims, a handful.
func (g *Gossip) ClaimedAhead(dst map[string]int, priority int, arrived time.Time, except string) {
	now := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.freshClaimsLocked(now)
	for _, c := range g.claims {
		if c.by != except && c.Outranks(priority, arrived) {
			dst[c.Peer] = min(dst[c.Peer]+c.Blocks, MaxClaimBlocks)
		}
	}
}

// freshClaimsLocked rebuilds the claims index if a record's claims or a liveness changed since,
// or a PublishInterval passed. A claim counts while its record is at most StaleAfter old,
// however long the peer itself stays fresh: a claim holds room for a head blocked now, which
// its claimant republishes every pass, and a record that comes slower than that (from outside
// this node's domains in a large mesh, every mesh interval) would hold the room for seconds
// or minutes after the head left.
func (g *Gossip) freshClaimsLocked(now time.Time) {
	if !g.claimsDirty && now.Sub(g.claimsBuilt) < g.cfg.PublishInterval {
		return
	}
	g.claims = g.claims[:0]
	for name, p := range g.peers {
		if len(p.state.Claims) == 0 || name == g.cfg.Name || p.liveness != LivenessAlive || !p.hasState ||
			now.Sub(p.updated) > g.cfg.StaleAfter {
			continue
		}
		for _, c := range p.state.Claims {
			g.claims = append(g.claims, heldClaim{by: name, Claim: c})
		}
	}
	g.claimsDirty, g.claimsBuilt = false, now
}

// Members returns this node's view of the mesh, itself included, sorted by name.
func (g *Gossip) Members() []Member {
	now := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]Member, 0, len(g.peers)+1)
	self := Member{
		Name: g.cfg.Name, Liveness: LivenessAlive, State: g.pub, Updated: g.pubAt,
		Age: now.Sub(g.pubAt), Candidate: true, Incarnation: 1, Self: true,
	}
	if p := g.peers[g.cfg.Name]; p != nil {
		self.Addr, self.Liveness = p.addr, p.liveness
	}
	self.PrefixBlocks = g.idx.PeerBlocks(g.cfg.Name)
	out = append(out, self)
	for name, p := range g.peers {
		if name != g.cfg.Name {
			out = append(out, g.memberLocked(name, p, now))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func (g *Gossip) memberLocked(name string, p *peerInfo, now time.Time) Member {
	m := Member{
		Name: name, Addr: p.addr, Liveness: p.liveness, State: p.state, Updated: p.updated,
		Incarnation: p.incarnation, PrefixBlocks: g.idx.PeerBlocks(name),
	}
	if p.hasState {
		m.Age = now.Sub(p.updated)
	}
	m.MaxAge = g.staleAfterLocked(p)
	m.Stale = !p.hasState || m.Age > m.MaxAge
	m.Candidate = p.liveness == LivenessAlive && p.hasState && (!m.Stale || g.cfg.StalePolicy == FailOpen)
	return m
}

// MembersServing appends to dst the alive members other than this node whose last record
// lists model, sorted by name, as Members would describe them. It reads an index by model kept
// as liveness and records' model lists change, so its cost is the model's members, not the
// mesh's: what a routing decision needs.
func (g *Gossip) MembersServing(dst []Member, model string) []Member {
	now := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.rebuildDomainsLocked()
	for _, name := range g.byModel[model] {
		dst = append(dst, g.memberLocked(name, g.peers[name], now))
	}
	return dst
}

// Close leaves the mesh gracefully (waiting up to LeaveTimeout) and shuts down; with a
// negative LeaveTimeout it shuts down without a word, as a crash would. Safe to call twice.
func (g *Gossip) Close() error {
	if g.cfg.LeaveTimeout < 0 {
		return g.shutdown(false, 0)
	}
	return g.Leave(g.cfg.LeaveTimeout)
}

// MarkLeaving tells the mesh ahead of Leave that this member is about to leave (its memberlist
// meta), so that peers count its departure as one, not as a death, and Leave gives the
// departure itself all of its time. It waits up to timeout for the mark to go out; before
// Start, or with timeout ≤ 0, it does nothing.
func (g *Gossip) MarkLeaving(timeout time.Duration) error {
	g.mu.Lock()
	ml, closed := g.ml, g.closed
	g.mu.Unlock()
	if ml == nil || closed || timeout <= 0 || g.leaving.Swap(true) {
		return nil
	}
	return ml.UpdateNode(timeout)
}

// Leave broadcasts this node's departure (waiting up to timeout), then shuts down. A departure
// not sent within timeout is logged, not returned: peers stopping at the same moment may
// never take it, and the failure detector marks the node dead without it. Safe to call twice;
// later calls return the first result.
func (g *Gossip) Leave(timeout time.Duration) error { return g.shutdown(true, timeout) }

func (g *Gossip) shutdown(leave bool, timeout time.Duration) error {
	g.closeOnce.Do(func() {
		g.mu.Lock()
		g.closed = true
		ml, cancel := g.ml, g.cancel
		g.mu.Unlock()
		if cancel != nil {
			cancel()
		}
		g.wg.Wait()
		if ml == nil {
			return
		}
		var errs []error
		if leave {
			// memberlist tells a departure from a death only to itself (the node passed to
			// NotifyLeave never says which), so the node first says it is leaving in its meta
			// (unless MarkLeaving did, earlier), in half the time, then sends the departure in
			// what is left.
			if !g.leaving.Swap(true) && timeout > 0 {
				start := time.Now()
				if err := ml.UpdateNode(timeout / 2); err != nil {
					g.log.Debug("leaving the mesh: the leaving mark not sent; peers will count the node dead", "err", err)
				}
				timeout = max(timeout-time.Since(start), time.Millisecond)
			}
			if err := ml.Leave(timeout); err != nil {
				g.log.Warn("leaving the mesh: departure not sent; peers will detect the node gone", "err", err)
			}
		}
		if err := ml.Shutdown(); err != nil {
			errs = append(errs, fmt.Errorf("gossip: shutdown: %w", err))
		}
		g.closeErr = errors.Join(errs...)
	})
	return g.closeErr
}

// handleMsg is a user message from memberlist (a broadcast from any member).
func (g *Gossip) handleMsg(b []byte) {
	g.met.received.Add(float64(len(b)))
	if len(b) < 2 {
		g.drop(dropMalformed)
		return
	}
	if b[0] != wireVersion {
		g.drop(dropVersion)
		return
	}
	now := time.Now()
	switch b[1] {
	case msgState:
		st, err := DecodeState(b[2:])
		if err != nil {
			g.drop(reasonOf(err))
			return
		}
		if relay, reason := g.applyState(st, now); reason != "" {
			g.drop(reason)
		} else if relay {
			g.queue.QueueBroadcast(&namedBroadcast{name: st.Name, msg: slices.Clone(b)})
		}
	case msgRecord:
		st, err := DecodeState(b[2:])
		if err != nil {
			g.drop(reasonOf(err))
			return
		}
		// Sent by its origin to this node alone: applied, never relayed.
		if _, reason := g.applyState(st, now); reason != "" {
			g.drop(reason)
		}
	case msgDelta:
		origin, boot, s, err := decodeDelta(b[2:])
		if err != nil {
			g.drop(reasonOf(err))
			return
		}
		// Deltas come from their origin and are not relayed (sendPrefixes).
		if _, reason := g.applyDelta(origin, boot, s); reason != "" {
			g.drop(reason)
		}
	default:
		g.drop(dropType)
	}
}

func reasonOf(err error) string {
	if errors.Is(err, ErrVersion) || errors.Is(err, kvindex.ErrVersion) {
		return dropVersion
	}
	return dropMalformed
}

func (g *Gossip) drop(reason string) { g.met.dropped.WithLabelValues(reason).Inc() }

// applyState stores a peer's record if it is new; relay says whether to pass it on.
func (g *Gossip) applyState(st State, now time.Time) (relay bool, reason string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if st.Name == g.cfg.Name {
		return false, ""
	}
	p, reason := g.originLocked(st.Name, st.BootID)
	if reason != "" {
		return false, reason
	}
	if p.hasState && st.Seq <= p.state.Seq {
		return false, ""
	}
	if !p.hasState || !sameModels(st.Models, p.state.Models) {
		g.domainsDirty = true
	}
	if !slices.Equal(st.Claims, p.state.Claims) || len(st.Claims) > 0 && now.Sub(p.updated) > g.cfg.StaleAfter {
		// Claims changed, or came back fresh after their record had aged out of the index.
		g.claimsDirty = true
	}
	p.state, p.hasState, p.updated = st, true, now
	return true, ""
}

// applyDelta applies a peer's delta if it is new (applied).
func (g *Gossip) applyDelta(origin string, boot uint64, s kvindex.Summary) (applied bool, reason string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if origin == g.cfg.Name {
		return false, ""
	}
	p, reason := g.originLocked(origin, boot)
	if reason != "" {
		return false, reason
	}
	g.rebuildDomainsLocked()
	if g.otherModelLocked(p) {
		return false, dropOtherModel
	}
	if !p.markSeen(s.Seq) {
		return false, ""
	}
	g.idx.Add(origin, s.Added)
	g.idx.Remove(origin, s.Evicted)
	return true, ""
}

// originLocked checks a message's origin and boot id. A new boot id means the member
// restarted: its old residency is dropped and the old id retired, so late messages of the
// previous process cannot bring it back.
func (g *Gossip) originLocked(name string, boot uint64) (*peerInfo, string) {
	p := g.peers[name]
	switch {
	case name == "" || boot == 0:
		return nil, dropMalformed
	case p == nil:
		return nil, dropUnknownMember
	case slices.Contains(p.retired, boot):
		return nil, dropStaleBoot
	case p.liveness == LivenessDead || p.liveness == LivenessLeft:
		return nil, dropDeadMember
	}
	if p.bootID != boot {
		if p.bootID != 0 {
			p.retired = append(p.retired, p.bootID)
			if len(p.retired) > 8 {
				p.retired = p.retired[1:]
			}
			g.idx.DropPeer(name)
			p.hasState, p.maxDelta, p.seen = false, 0, 0
			g.domainsDirty = true
			g.log.Info("member restarted", "member", name)
		}
		p.bootID = boot
		p.incarnation++
	}
	return p, ""
}

func (p *peerInfo) markSeen(seq uint64) bool {
	if seq > p.maxDelta {
		if d := seq - p.maxDelta; d >= 64 {
			p.seen = 0
		} else {
			p.seen <<= d
		}
		p.seen |= 1
		p.maxDelta = seq
		return true
	}
	d := p.maxDelta - seq
	if d >= 64 || p.seen&(1<<d) != 0 {
		return false
	}
	p.seen |= 1 << d
	return true
}

// residency is this node's whole residency, least recent first, at most what the index keeps
// of a peer: fn's (SetSnapshot) or, without one, the index's record of PrefixStored.
func (g *Gossip) residency(fn func() []uint64) []uint64 {
	var blocks []uint64
	if fn != nil {
		blocks = fn()
	} else {
		blocks = g.idx.AppendPeerBlocks(nil, g.cfg.Name)
	}
	if limit := g.idx.MaxBlocksPerPeer(); len(blocks) > limit {
		blocks = blocks[len(blocks)-limit:]
	}
	return blocks
}

// localState is the push/pull payload: this node's record and its full residency.
func (g *Gossip) localState() []byte {
	g.mu.Lock()
	fn, st, seq := g.snapshotFn, g.pub, g.deltaSeq
	g.mu.Unlock()
	blocks := g.residency(fn)
	rec, err := EncodeState(st)
	if err != nil {
		return nil
	}
	b := []byte{wireVersion, msgPushPull}
	b = binary.AppendUvarint(b, uint64(len(rec)))
	b = append(b, rec...)
	b, err = kvindex.Summary{Snapshot: true, Seq: seq, Added: blocks}.AppendBinary(b)
	if err != nil {
		return nil
	}
	return b
}

func (g *Gossip) mergeRemoteState(b []byte) {
	g.met.received.Add(float64(len(b)))
	if len(b) < 2 {
		g.drop(dropMalformed)
		return
	}
	if b[0] != wireVersion {
		g.drop(dropVersion)
		return
	}
	if b[1] != msgPushPull {
		g.drop(dropType)
		return
	}
	l, n := binary.Uvarint(b[2:])
	if n <= 0 || l > uint64(len(b)-2-n) {
		g.drop(dropMalformed)
		return
	}
	rest := b[2+n:]
	st, err := DecodeState(rest[:l])
	if err != nil {
		g.drop(reasonOf(err))
		return
	}
	s, err := kvindex.DecodeSummary(rest[l:])
	if err == nil && !s.Snapshot {
		err = fmt.Errorf("%w: push/pull without snapshot", ErrMalformed)
	}
	if err != nil {
		g.drop(reasonOf(err))
		return
	}
	if _, reason := g.applyState(st, time.Now()); reason != "" {
		g.drop(reason)
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	p := g.peers[st.Name]
	if p == nil || st.Name == g.cfg.Name || s.Seq < p.maxDelta {
		return // ours, or older than deltas already applied
	}
	g.rebuildDomainsLocked()
	if g.otherModelLocked(p) {
		// memberlist pairs members at random across the mesh; a snapshot of a peer outside
		// every domain of this node is not kept.
		if len(s.Added) > 0 {
			g.drop(dropOtherModel)
		}
		return
	}
	g.idx.Replace(st.Name, s.Added)
	p.maxDelta, p.seen = s.Seq, math.MaxUint64
}

// getBroadcasts hands memberlist the queued state records that fit limit bytes and the
// bandwidth budget, which state records and prefix rounds share.
func (g *Gossip) getBroadcasts(overhead, limit int) [][]byte {
	g.mu.Lock()
	g.refillLocked(time.Now())
	limit = min(limit, int(g.tokens))
	g.mu.Unlock()
	if limit <= overhead {
		return nil
	}
	msgs := g.queue.GetBroadcasts(overhead, limit)
	sent := 0
	for _, m := range msgs {
		sent += len(m) + overhead
	}
	if sent > 0 {
		g.mu.Lock()
		g.tokens -= float64(sent)
		g.mu.Unlock()
		g.met.sent.Add(float64(sent))
	}
	return msgs
}

// refillLocked adds the budget's bytes since the last refill to the bucket, which holds one
// second's worth at most.
func (g *Gossip) refillLocked(now time.Time) {
	rate := float64(g.cfg.MaxBytesPerSecond)
	if g.tokensAt.IsZero() {
		g.tokens = rate
	} else {
		g.tokens = min(rate, g.tokens+rate*now.Sub(g.tokensAt).Seconds())
	}
	g.tokensAt = now
}

func (g *Gossip) memberEvent(n *memberlist.Node, live Liveness) {
	g.mu.Lock()
	defer g.mu.Unlock()
	p := g.peers[n.Name]
	if p == nil {
		p = &peerInfo{}
		g.peers[n.Name] = p
	}
	p.addr = n.Address()
	if live != "" && live != p.liveness {
		if live == LivenessAlive {
			// Back from dead or new: each side dropped the other's residency, so accept the
			// next snapshot and send this node's.
			p.maxDelta, p.seen, p.synced = 0, 0, 0
		} else if n.Name != g.cfg.Name {
			g.idx.DropPeer(n.Name)
		}
		p.liveness, p.changed = live, time.Now()
		g.domainsDirty, g.claimsDirty = true, true
	}
	counts := map[Liveness]int{}
	for _, q := range g.peers {
		counts[q.liveness]++
	}
	g.alive.Store(int32(counts[LivenessAlive]))
	for _, l := range []Liveness{LivenessAlive, LivenessSuspect, LivenessDead, LivenessLeft} {
		g.met.members.WithLabelValues(string(l)).Set(float64(counts[l]))
	}
}

// delegate adapts memberlist.Delegate to Gossip.
type delegate struct{ g *Gossip }

func (d *delegate) NodeMeta(int) []byte {
	if d.g.leaving.Load() {
		return []byte{metaLeaving}
	}
	return nil
}
func (d *delegate) NotifyMsg(b []byte)                  { d.g.handleMsg(b) }
func (d *delegate) GetBroadcasts(o, limit int) [][]byte { return d.g.getBroadcasts(o, limit) }
func (d *delegate) LocalState(bool) []byte              { return d.g.localState() }
func (d *delegate) MergeRemoteState(b []byte, _ bool)   { d.g.mergeRemoteState(b) }

// metaLeaving is a member's memberlist meta while it leaves (Gossip.leaving).
const metaLeaving = 1

// events adapts memberlist.EventDelegate to Gossip.
type events struct{ g *Gossip }

func (e *events) NotifyJoin(n *memberlist.Node) { e.g.memberEvent(n, LivenessAlive) }
func (e *events) NotifyUpdate(n *memberlist.Node) {
	e.g.memberEvent(n, "")
}
func (e *events) NotifyLeave(n *memberlist.Node) {
	live := LivenessDead
	if len(n.Meta) > 0 && n.Meta[0] == metaLeaving {
		live = LivenessLeft
	}
	e.g.memberEvent(n, live)
}

// namedBroadcast is a state record: a newer one from the same origin replaces it in the queue.
type namedBroadcast struct {
	name string
	msg  []byte
}

func (b *namedBroadcast) Name() string { return "state/" + b.name }
func (b *namedBroadcast) Invalidates(o memberlist.Broadcast) bool {
	ob, ok := o.(*namedBroadcast)
	return ok && ob.name == b.name
}
func (b *namedBroadcast) Message() []byte { return b.msg }
func (b *namedBroadcast) Finished()       {}

// logWriter routes memberlist's log lines ("[LEVEL] memberlist: ...") into slog. Its warnings
// and errors pass at most logBurst at once, then one a second: anyone who can reach the gossip
// port makes one with each packet the key does not open, and must not flood the node's log.
// The next line let through counts the ones held back.
type logWriter struct {
	l       *slog.Logger
	limit   *rate.Limiter
	now     func() time.Time
	dropped atomic.Int64
}

const logBurst = 10

func newLogWriter(l *slog.Logger) *logWriter {
	return &logWriter{l: l, limit: rate.NewLimiter(1, logBurst), now: time.Now}
}

func (w *logWriter) Write(p []byte) (int, error) {
	msg := strings.TrimSpace(string(p))
	level := slog.LevelDebug
	switch {
	case strings.Contains(msg, "use of closed network connection"):
		// memberlist's probes racing its own shutdown: the node is stopping, nothing failed.
	case strings.Contains(msg, "[ERR]"):
		level = slog.LevelError
	case strings.Contains(msg, "[WARN]"):
		level = slog.LevelWarn
	case strings.Contains(msg, "[INFO]"):
		level = slog.LevelInfo
	}
	if level >= slog.LevelWarn {
		if !w.limit.AllowN(w.now(), 1) {
			w.dropped.Add(1)
			return len(p), nil
		}
		if n := w.dropped.Swap(0); n > 0 {
			w.l.Log(context.Background(), level, msg, "held_back", n)
			return len(p), nil
		}
	}
	w.l.Log(context.Background(), level, msg)
	return len(p), nil
}
