package gossip

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/kvmesh/kvmesh/gossip/round"
	"github.com/kvmesh/kvmesh/kvindex"
)

// Errors of the Gossip lifecycle.
var (
	ErrStarted = errors.New("gossip: already started")
	ErrClosed  = errors.New("gossip: closed")
)

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
	join  joinState // the last join of the seeds (join.go)

	// mu guards every field from here to cancel, grouped by the file that owns them; methods
	// ending in Locked need it held.
	mu sync.Mutex
	// Lifecycle (gossip.go). direct is how prefix rounds and records by domain reach one
	// member: the memberlist, set by Start (or by newGossip), nil before.
	started bool
	closed  bool
	ml      *memberlist.Memberlist
	direct  directSender
	// Publishing records (publish.go). meshPub and meshAt are the last record queued for
	// memberlist's gossip to the whole mesh.
	localFn func() State
	local   State
	pub     State  // last published record
	pubBody []byte // its encoding with Seq zeroed, for change detection
	pubAt   time.Time
	meshPub State
	meshAt  time.Time
	// Prefix rounds and the byte budget (prefixes.go, package round). recNext is the domain
	// member the next round's records start from; budget is shared with memberlist's gossip
	// (getBroadcasts).
	recNext    int
	deltaSeq   uint64
	pend       map[uint64]bool // block → stored (true) or evicted (false) since the last flush
	pendOrder  []uint64
	snapshotFn func() []uint64
	budget     round.Bucket
	// The members (members.go), by name, this node included once memberlist reports it.
	peers map[string]*peerInfo
	// Model domains (domains.go). byModel lists, per model, the alive peers (not this node)
	// whose record serves it, by name; domains are this node's own models' prefix domains.
	// Both are rebuilt when a liveness or a record's model list changes (domainsDirty), not
	// per request.
	byModel      map[string][]string
	domains      map[string]*domain
	domainsDirty bool
	inDomain     int // alive peers sharing a model with this node, as of the last rebuild
	// staleIn and staleOut are the record ages past which a peer inside and outside this
	// node's domains is stale (staleAfterLocked), refreshed with each flush and rebuild so
	// that listing members, once a request, reads them without recomputing them.
	staleIn, staleOut time.Duration
	// Claims (claims.go): the other members' claims (State.Claims), rebuilt when a record's
	// claims or a liveness changed, and at least every PublishInterval so that a claim in a
	// record gone stale stops counting.
	claims      []heldClaim
	claimsDirty bool
	claimsBuilt time.Time
	// Name conflicts (conflict.go): this node's gossip address as memberlist advertises it (set
	// by Start), the first member memberlist refused for claiming this node's name, and when
	// each conflict was last logged.
	selfAddr     string
	selfConflict *memberlist.Node
	conflictLog  map[string]time.Time

	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
	// leaving is set as Leave begins: this node's memberlist meta then says so (metaLeaving),
	// which is how peers tell its departure from its death.
	leaving atomic.Bool
}

type peerInfo struct {
	addr     string
	liveness Liveness
	changed  time.Time
	state    State
	hasState bool
	updated  time.Time
	bootID   uint64
	retired  []uint64 // superseded boot ids: their late messages are dropped
	// refused are the processes whose records came from another address than the member's
	// (a name conflict): their messages are dropped (refusedLocked). heard is when a message
	// of the current boot id was last applied.
	refused     []refusal
	heard       time.Time
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

// refusal is a process refused for a member's name: its boot id and the address its records
// came from.
type refusal struct {
	boot uint64
	addr string
}

// New validates cfg and returns a Gossip that has not touched the network.
func New(cfg Config) (*Gossip, error) { return newGossip(cfg, nil) }

// newGossip is New with the direct sends going through direct instead of the memberlist
// Start creates (nil: through it).
func newGossip(cfg Config, direct directSender) (*Gossip, error) {
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
		cfg:         cfg,
		log:         log.With("component", "gossip"),
		idx:         kvindex.NewIndex(kvindex.IndexConfig{MaxBlocksPerPeer: cfg.MaxBlocksPerPeer}),
		met:         met,
		bootID:      binary.LittleEndian.Uint64(boot[:]) | 1, // never 0: 0 means "no boot id"
		pend:        make(map[uint64]bool),
		peers:       make(map[string]*peerInfo),
		byModel:     make(map[string][]string),
		conflictLog: make(map[string]time.Time),
		domains:     make(map[string]*domain),
		staleIn:     cfg.StaleAfter, staleOut: cfg.StaleAfter,
		budget: round.Bucket{Rate: float64(cfg.MaxBytesPerSecond)},
		direct: direct,
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

// Start creates the memberlist (binding its sockets), publishes the local state, joins the
// seeds and starts the publish loop. It shuts down and returns ErrNameConflict when the join
// finds a live member at another address with this node's name. A failed join is retried in the background with backoff,
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

	mlc, err := g.memberlistConfig()
	if err != nil {
		return err
	}
	ml, err := memberlist.Create(mlc)
	if err != nil {
		if mlc.Transport != nil {
			_ = mlc.Transport.Shutdown()
		}
		return fmt.Errorf("gossip: start memberlist: %w", err)
	}
	lctx, cancel := context.WithCancel(context.Background())
	self := ml.LocalNode().Address() // before g.mu: memberlist calls in with its own lock held
	g.mu.Lock()
	g.ml = ml
	g.selfAddr = self
	if g.direct == nil {
		g.direct = ml
	}
	g.cancel = cancel
	g.mu.Unlock()
	g.flush(time.Now())

	g.wg.Add(2)
	go g.publishLoop(lctx)
	go g.reconnectLoop(lctx)
	if len(g.cfg.Join) > 0 {
		g.joinSeeds(time.Now(), ml)
		if err := g.refuseIfTaken(ml); err != nil {
			_ = g.shutdown(false, 0)
			return err
		}
		g.wg.Add(1)
		go g.joinLoop(lctx)
	}
	return nil
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
