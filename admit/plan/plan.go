package plan

import (
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/carbon"
)

// Mode is how much of admission a node runs.
type Mode uint8

// Modes. ModeNone and ModeQueueCap exist to compare kvmesh with a plain router.
const (
	// ModeKvmesh runs every layer and the waiting room.
	ModeKvmesh Mode = iota
	// ModeNone validates and budgets only: everything else runs at once on the first
	// candidate and queues inside the engine.
	ModeNone
	// ModeQueueCap is ModeNone that refuses (429 queue_full) once the chosen engine has
	// Config.QueueCap requests waiting, as an engine's fixed queue limit does.
	ModeQueueCap
)

// Mode names, as the node's configuration spells them.
const (
	ModeNameKvmesh   = "kvmesh"
	ModeNameNone     = "none"
	ModeNameQueueCap = "queue-cap"
)

func (m Mode) String() string {
	switch m {
	case ModeNone:
		return ModeNameNone
	case ModeQueueCap:
		return ModeNameQueueCap
	}
	return ModeNameKvmesh
}

// ParseMode parses a Mode name; "" is ModeKvmesh.
func ParseMode(s string) (Mode, error) {
	switch s {
	case "", ModeNameKvmesh:
		return ModeKvmesh, nil
	case ModeNameNone:
		return ModeNone, nil
	case ModeNameQueueCap:
		return ModeQueueCap, nil
	}
	return 0, fmt.Errorf("plan: admission mode %q: want %s, %s or %s: %w", s, ModeNameKvmesh, ModeNameNone, ModeNameQueueCap, ErrConfig)
}

// HTTP statuses of refusals (net/http's values; a pure library does not import it).
const (
	statusBadRequest         = 400
	statusNotFound           = 404
	statusTooManyRequests    = 429
	statusServiceUnavailable = 503
)

// ErrConfig reports an invalid Config.
var ErrConfig = errors.New("plan: invalid config")

// CodeCarbonDeferred is the refusal (429) of a sheddable request when every grid with room
// is over the carbon threshold.
const CodeCarbonDeferred = carbon.ReasonDeferred

// LayerCarbon is the Decision.Layer of a carbon refusal.
const LayerCarbon = "carbon"

// AgentStepSLO is the TTFT and TPOT target a step of an agent is decided again with when its
// own cannot be met: none that matters, as the queue TTL bounds the wait (see decide).
const AgentStepSLO = 24 * time.Hour

// Config configures a Planner. A zero field takes DefaultConfig's value.
type Config struct {
	Mode Mode
	// QueueCap is ModeQueueCap's limit of requests waiting in the chosen engine.
	QueueCap int
	// Agents is agent-level admission: a step of an agent runs at its home, whose window
	// admits it, and is never refused here for a predicted TTFT.
	Agents bool
	// RetryAfter is the Retry-After of refusals that have no better estimate.
	RetryAfter time.Duration
}

// DefaultConfig returns ModeKvmesh with a 64-request queue cap and a 1 s Retry-After.
func DefaultConfig() Config {
	return Config{Mode: ModeKvmesh, QueueCap: 64, RetryAfter: time.Second}
}

// Grid is the carbon shedding rule with this node's own grid; *carbon.Tracker implements it.
type Grid interface {
	Decide(now time.Time, priority int, others []carbon.Option) carbon.Decision
	RetryAfter(now time.Time) time.Duration
}

// Planner runs the decision pipeline: route, carbon, admit. It holds no state of its own
// beyond its parts (the policy's reservations, the admitter's waiting room and buckets), so
// it is safe for concurrent use as they are.
type Planner struct {
	cfg    Config
	adm    *admit.Admitter
	policy route.Policy
	grid   Grid
	// held is the decode blocks of this node's split requests still prefilling (Hold): they
	// are in the prefill nodes' gossiped queues too, and are not counted twice (inFlight).
	held atomic.Int64
}

// New returns a Planner over the admitter and the routing policy; grid nil turns carbon
// shedding off. It does no I/O.
func New(cfg Config, adm *admit.Admitter, policy route.Policy, grid Grid) (*Planner, error) {
	def := DefaultConfig()
	if cfg.QueueCap <= 0 {
		cfg.QueueCap = def.QueueCap
	}
	if cfg.RetryAfter <= 0 {
		cfg.RetryAfter = def.RetryAfter
	}
	if cfg.Mode > ModeQueueCap {
		return nil, fmt.Errorf("plan: mode %d: %w", cfg.Mode, ErrConfig)
	}
	if adm == nil || policy == nil {
		return nil, fmt.Errorf("plan: an admitter and a routing policy are required: %w", ErrConfig)
	}
	return &Planner{cfg: cfg, adm: adm, policy: policy, grid: grid}, nil
}

// Config returns the configuration in use, defaults filled.
func (p *Planner) Config() Config { return p.cfg }

// Policy returns the routing policy.
func (p *Planner) Policy() route.Policy { return p.policy }

// View is one decision's picture of the mesh: the peers (this node first, with its exact
// state) and, per peer, whether its grid is over the carbon threshold.
type View struct {
	Peers []route.Peer
	Dirty []bool
	// BlockTokens is the KV block size the prompt was hashed with.
	BlockTokens int
}

// Reset empties v, keeping its storage.
func (v *View) Reset(blockTokens int) {
	v.Peers, v.Dirty, v.BlockTokens = v.Peers[:0], v.Dirty[:0], blockTokens
}

// Add appends a peer.
func (v *View) Add(p route.Peer, dirty bool) {
	v.Peers = append(v.Peers, p)
	v.Dirty = append(v.Dirty, dirty)
}

// Plan is one pass of the pipeline: the candidates best first, admission's view of them, the
// decision, and the reservation an accept made on its chosen candidate. Reuse one Plan per
// request; its slices keep their storage.
type Plan struct {
	Cands    []route.Candidate
	Opts     []admit.Option
	D        admit.Decision
	Res      route.Reservation
	Reserved bool
	// CarbonRouted: the carbon rule dropped dirty candidates and clean ones remained.
	CarbonRouted bool

	// In a mesh with prefill or decode peers (route.Disaggregated), the pair's searches
	// (Search) and the split rule's reason (SplitWhy, route.Decide's; "" when no pair was
	// searched). A split request's pair is a candidate with Pair set, first in Cands, the whole
	// candidates after it as fallbacks; accepted, it reserves its prefill on the prefill peer
	// (Res) and its KV on the decode peer (ResDecode). A request the rule runs whole on a
	// decode peer (route.RunsLocal(SplitWhy)) has that peer first, then the pair, then the
	// whole candidates.
	Search    route.PairSearch
	SplitWhy  string
	ResDecode route.Reservation
	// decodeHeld: ResDecode is a Hold (the half still prefilling), not yet a reservation on
	// the decode node the handover went to (Handover).
	decodeHeld bool
}

// Ingress decides a new request over v: Accept (reserving on the chosen candidate), Queue or
// Refuse. It never blocks.
func (p *Planner) Ingress(now time.Time, req admit.Request, v *View, pl *Plan) {
	p.decide(now, req, nil, nil, v, pl)
}

// Queued decides again for an item waiting in the room (from WaitingRoom.Next's canRun). claim,
// when not nil, is the room the pool's blocked head waits for: the item runs beside the head
// only on what is left.
func (p *Planner) Queued(now time.Time, it *admit.Item, claim *admit.Claim, v *View, pl *Plan) {
	p.decide(now, it.Req, it, claim, v, pl)
}

func (p *Planner) decide(now time.Time, req admit.Request, it *admit.Item, claim *admit.Claim, v *View, pl *Plan) {
	pl.CarbonRouted, pl.SplitWhy, pl.Search.Busy = false, "", false
	rreq := p.routeRequest(req, v.BlockTokens)
	if p.cfg.Mode == ModeKvmesh {
		rreq.TTFTTarget, rreq.TPOTTarget = p.targets(now, req, it != nil)
		rreq.StepTPOTTarget = p.stepTPOT(rreq.TPOTTarget)
	}
	var err error
	pl.Cands, err = p.policy.Route(now, rreq, v.Peers, pl.Cands[:0])
	if !rreq.StayHome && route.Disaggregated(v.Peers) {
		// An agent's step stays home, whole; anything else may run on a pair.
		err = p.pair(now, req, rreq, v, pl, err)
	}
	pl.Opts = pl.Opts[:0]
	var nce *route.NoCandidateError
	switch {
	case err == nil:
	case errors.As(err, &nce) && (nce.Busy() || pl.Search.Busy):
		// Every host is busy: admission sees them with no room, so it queues (or sheds).
		p.busyOptions(v, &rreq, pl)
	default:
		pl.D = admit.Decision{Action: admit.Refuse, Status: statusServiceUnavailable, Layer: admit.LayerRoute,
			Code: admit.CodeNoCapacity, Message: "no node can serve model " + req.Model + " now: " + err.Error(),
			RetryAfter: p.cfg.RetryAfter, Option: -1}
		return
	}
	if !p.shed(now, req.Priority, v, pl) {
		return
	}
	// A step of an agent goes to its home and nowhere else, where its context and its window
	// are; it still waits here for KV room there like any request, so the window's agents
	// cannot push the engine into preemption.
	if rreq.StayHome && len(pl.Cands) > 0 && pl.Cands[0].Sticky {
		pl.Cands = pl.Cands[:1]
	}
	for i := range pl.Cands {
		c := &pl.Cands[i]
		if c.Pair != nil {
			pl.Opts = append(pl.Opts, p.pairOption(c, v, req))
			continue
		}
		pl.Opts = append(pl.Opts, OptionOf(c, &v.Peers[c.Peer], req.Priority, v.BlockTokens))
	}
	if claim != nil {
		claim.Take(pl.Opts) // it runs beside a blocked head only on room the head does not wait for
	}
	for i := homesFirst(pl.Cands, len(pl.Opts)); i < len(pl.Opts); i++ {
		pl.Opts[i].Fallback = true
	}
	if it == nil {
		pl.D = p.adm.Admit(now, req, pl.Opts)
	} else {
		pl.D = p.adm.Ready(now, it, pl.Opts)
	}
	if rreq.StayHome && pl.D.Code == admit.CodeSLOUnattainable {
		// With agent admission on, an agent's steps are admitted by its home's window, not per
		// request: refusing a step for a predicted TTFT would only send its client away while
		// its slot, and the KV the window keeps for it, sit idle. Decided again without its
		// SLO, the step still waits here for KV room at its home (within the room's caps).
		if it == nil {
			pl.D = p.adm.Admit(now, WithoutSLO(req), pl.Opts)
		} else {
			relaxed := *it
			relaxed.Req = WithoutSLO(req)
			pl.D = p.adm.Ready(now, &relaxed, pl.Opts)
		}
	}
	if p.cfg.Mode != ModeKvmesh {
		p.plain(v, pl)
	}
	if pl.D.Action == admit.Accept && pl.D.Option >= len(pl.Cands) {
		// Only busy hosts were offered (routing found none with room); never run on one of them.
		pl.D.Action, pl.D.Layer, pl.D.Code, pl.D.Option = admit.Queue, admit.LayerKV, admit.CodeWaitKV, -1
	}
	if pl.D.Action == admit.Accept {
		p.Reserve(now, req, pl, pl.D.Option)
	}
}

// homesFirst is how many of the n options admission chooses among: when routing's locality
// rule kept the request at its prefix homes (the first candidates, homes and not gated), those
// homes only. The candidates behind them are admit.Option.Fallback: dispatch's fallbacks for a
// home that refuses or fails, where admission does not run the request because a home lacks
// KV room or spare capacity now. The request waits in the room for its home instead, as
// routing decided, rather than recomputing its prefix elsewhere and evicting another's there.
func homesFirst(cands []route.Candidate, n int) int {
	k := 0
	for k < len(cands) && k < n && cands[k].Home && !cands[k].Gated && cands[k].Pair == nil {
		k++
	}
	if k == 0 || k == len(cands) {
		return n
	}
	return k
}

// pair searches a prefill and a decode peer for req and applies the split rule against the
// whole candidates Route found (werr its error): split, the pair goes first in pl.Cands; whole
// on a decode peer (route.RunsLocal), that peer goes first and the pair, if any, next, as its
// fallback; either way the error is cleared.
func (p *Planner) pair(now time.Time, req admit.Request, rreq route.Request, v *View, pl *Plan, werr error) error {
	ttft, tpot := p.adm.SLOFor(req)
	p.policy.Pair(now, rreq, v.Peers, tpot, &pl.Search)
	var whole []route.Candidate
	if werr == nil {
		whole = pl.Cands
	}
	cfg := p.policy.Config()
	pr, split, why := route.Choose(&cfg, rreq, whole, &pl.Search, ttft, tpot)
	pl.SplitWhy = why
	local := route.RunsLocal(why)
	if !split && !local {
		return werr
	}
	if werr != nil {
		pl.Cands = pl.Cands[:0]
	}
	if pr != nil {
		pl.Cands = slices.Insert(pl.Cands, 0, pr.Candidate())
	}
	if local {
		pl.Cands = slices.Insert(pl.Cands, 0, pl.Search.Local[0])
	}
	return nil
}

// pairOption is the pair candidate c as admission's option: the pair's TTFT and TPOT, the
// prefill peer's cached prefix and rate, and the decode peer's KV, which holds the request,
// forecast for when the handover arrives there (t_a = now + TTFT_pair − step_d).
func (p *Planner) pairOption(c *route.Candidate, v *View, req admit.Request) admit.Option {
	d := &c.Pair.Decode
	peer := &v.Peers[d.Peer]
	o := OptionOf(d, peer, req.Priority, v.BlockTokens)
	o.Peer, o.PredictedTTFT, o.PredictedTPOT = c.Name, c.PredictedTTFT, c.PredictedTPOT
	o.CachedTokens, o.PrefillTokensPerSecond = c.Terms.PrefixTokens, v.Peers[c.Peer].PrefillTokensPerSecond
	o.Split = true
	o.Decode = admit.DecodeForecast{
		Node: d.Name, Total: peer.KVBlocksTotal,
		Used:     peer.KVBlocksUsed + QueuedBlocks(route.QueuedAhead(peer, req.Priority), v.BlockTokens),
		InFlight: d.Terms.ReservedBlocks + othersInFlight(v, req.Model, int(p.held.Load())),
		Step:     d.Terms.Step, Arrive: max(c.PredictedTTFT-d.Terms.Step, 0),
	}
	return o
}

// othersInFlight is one decode node's share of the split requests other ingresses sent the
// prefill pool of model: the prefill nodes' gossiped queued prefill, in blocks, less the
// blocks this node holds for its own (held), over the nodes that can decode it. Only the
// prompt's blocks are known; the output's are not counted.
func othersInFlight(v *View, model string, held int) int {
	queued, decoders := 0, 0
	for i := range v.Peers {
		peer := &v.Peers[i]
		if !peer.Healthy || !slices.Contains(peer.Models, model) {
			continue
		}
		switch {
		case peer.Role == route.RolePrefill:
			queued += QueuedBlocks(peer.QueuedPrefillTokens, v.BlockTokens)
		case !peer.WholeOnly && (peer.Role == route.RoleDecode || route.IsMixed(peer.Role)):
			decoders++
		}
	}
	if decoders == 0 {
		return 0
	}
	return max(queued-held, 0) / decoders
}

func (p *Planner) routeRequest(req admit.Request, blockTokens int) route.Request {
	maxTokens := 0
	if req.MaxTokens != nil {
		maxTokens = *req.MaxTokens
	}
	return route.Request{
		Model: req.Model, Parent: req.Parent, PromptTokens: req.PromptTokens, MaxTokens: maxTokens, Priority: req.Priority,
		Session: req.Agent, BlockTokens: blockTokens, TokenScale: req.TokenScale, StayHome: p.cfg.Agents && req.Agent != "",
		KeepBusy: p.cfg.Mode != ModeKvmesh, // no waiting room: the engine queues
	}
}

// targets are req's TTFT target from now and its TPOT target, for routing's locality rule:
// its SLOs less the time it has waited and, for a request in the room, less the dispatch slack
// admission keeps (Admitter.Ready). A sheddable request's TTFT target is at most the normal
// class's: routing's margin of it (route.Config.PrefixHomeShare, half by default) is then the
// spare capacity it may run on (admission's spare rule), not its own loose SLO. Zero TTFT:
// none is left.
func (p *Planner) targets(now time.Time, req admit.Request, queued bool) (ttft, tpot time.Duration) {
	ttft, tpot = p.adm.SLOFor(req)
	cfg := p.adm.Config()
	if queued {
		ttft -= time.Duration(float64(ttft) * max(cfg.Queue.DispatchSlack, 0))
	}
	if normal := time.Duration(cfg.SLO.Normal.TTFT); req.Priority < 0 && normal > 0 {
		ttft = min(ttft, normal)
	}
	return max(ttft-now.Sub(req.SLOClock()), 0), tpot
}

// stepTPOT is the TPOT the decodes running on a peer must keep, for routing's locality rule
// (route.Request.StepTPOTTarget): the tightest of tpot, the request's own, and the classes'
// TPOT SLOs, since a peer's decodes may be of any class and a queue's prefill slows them all
// alike. Zero: none is set.
func (p *Planner) stepTPOT(tpot time.Duration) time.Duration {
	slo := p.adm.Config().SLO
	for _, c := range []admit.Duration{slo.High.TPOT, slo.Normal.TPOT, slo.Low.TPOT} {
		if d := time.Duration(c); d > 0 && (tpot <= 0 || d < tpot) {
			tpot = d
		}
	}
	return tpot
}

// Reserve reserves req's prefill and pl.D.KVBlocks on candidate i, releasing the plan's
// earlier reservation if any (dispatch moving on to the next candidate).
func (p *Planner) Reserve(now time.Time, req admit.Request, pl *Plan, i int) {
	p.Release(pl)
	c := &pl.Cands[i]
	prefill := max(req.PromptTokens-c.Terms.PrefixTokens, 0)
	if c.Pair != nil {
		// The prefill peer computes the prompt; the decode peer will hold the request's KV,
		// from the handover on: held until then (Handover).
		pl.Res = p.policy.Reserve(now, c.Name, prefill, 0)
		pl.ResDecode, pl.decodeHeld = p.policy.Hold(now, c.Pair.Decode.Name, pl.D.KVBlocks), true
		p.held.Add(int64(pl.ResDecode.Blocks))
		pl.Reserved = true
		return
	}
	pl.Res = p.policy.Reserve(now, c.Name, prefill, pl.D.KVBlocks)
	pl.Reserved = true
}

// Release gives back the plan's reservations (its request will not run there, or ran).
func (p *Planner) Release(pl *Plan) {
	if pl.Reserved {
		p.policy.Release(pl.Res)
		p.releaseDecode(pl)
		pl.Reserved = false
	}
}

func (p *Planner) releaseDecode(pl *Plan) {
	if pl.ResDecode.Peer == "" {
		return
	}
	p.policy.Release(pl.ResDecode)
	if pl.decodeHeld {
		p.held.Add(-int64(pl.ResDecode.Blocks))
	}
	pl.ResDecode, pl.decodeHeld = route.Reservation{}, false
}

// Handover moves a split request's decode blocks, held while it prefilled, onto peer, the
// decode node its handover goes to now (the pair's, or another decode candidate), as a
// reservation there that peer's next record clears.
func (p *Planner) Handover(now time.Time, pl *Plan, peer string) {
	if !pl.Reserved || pl.ResDecode.Peer == "" {
		return
	}
	blocks := pl.ResDecode.Blocks
	p.releaseDecode(pl)
	pl.ResDecode = p.policy.Reserve(now, peer, 0, blocks)
}

// shed applies the carbon rule to the candidates of a request of priority: a sheddable
// request runs only where the grid is clean, so dirty candidates are dropped, and with none
// left it is refused carbon_deferred. It reports whether to go on.
func (p *Planner) shed(now time.Time, priority int, v *View, pl *Plan) bool {
	if p.grid == nil || priority >= 0 || len(pl.Cands) == 0 {
		return true
	}
	self := ""
	var others []carbon.Option
	for _, c := range pl.Cands {
		if v.Peers[c.Peer].Self {
			self = c.Name
			continue
		}
		others = append(others, carbon.Option{Name: c.Name, Dirty: v.Dirty[c.Peer], HasRoom: true})
	}
	// This node may run it only as a candidate; its own grid is the tracker's.
	d := p.grid.Decide(now, priority, others)
	if d.Action == carbon.ActionLocal && self == "" {
		d.Action = carbon.ActionRoute
	}
	if d.Action == carbon.ActionAny {
		return true
	}
	kept := pl.Cands[:0]
	for _, c := range pl.Cands {
		if (d.Action == carbon.ActionLocal && c.Name == self) || slices.Contains(d.Peers, c.Name) {
			kept = append(kept, c)
		}
	}
	pl.CarbonRouted = len(kept) > 0 && len(kept) < len(pl.Cands)
	pl.Cands = kept
	if len(kept) == 0 {
		retry := d.RetryAfter
		if retry <= 0 {
			retry = p.grid.RetryAfter(now)
		}
		pl.D = carbonDeferred("sheddable request deferred: every grid with room is over the carbon threshold", retry)
		return false
	}
	return true
}

func carbonDeferred(msg string, retry time.Duration) admit.Decision {
	return admit.Decision{Action: admit.Refuse, Status: statusTooManyRequests, Layer: LayerCarbon,
		Code: CodeCarbonDeferred, Message: msg, RetryAfter: retry, Option: -1}
}

// plain replaces the load-aware verdict with what a plain router does: send it to the first
// candidate now (the engine queues it), refusing only requests that can never run and, in
// ModeQueueCap, requests whose engine already has QueueCap waiting.
func (p *Planner) plain(v *View, pl *Plan) {
	if len(pl.Cands) == 0 || pl.D.Refused() && (pl.D.Status == statusBadRequest || pl.D.Status == statusNotFound) {
		return
	}
	d := pl.D
	if p.cfg.Mode == ModeQueueCap {
		if peer := &v.Peers[pl.Cands[0].Peer]; peer.Waiting >= p.cfg.QueueCap {
			pl.D = admit.Decision{Action: admit.Refuse, Status: statusTooManyRequests, Layer: admit.LayerQueue,
				Code: admit.CodeQueueFull, Message: fmt.Sprintf("the engine has %d requests waiting", peer.Waiting),
				RetryAfter: p.cfg.RetryAfter, MaxTokens: d.MaxTokens, Tenant: d.Tenant, Option: -1}
			return
		}
	}
	pl.D = admit.Decision{Action: admit.Accept, Layer: admit.LayerRoute, Code: admit.CodeAccepted, Option: 0,
		MaxTokens: d.MaxTokens, ExpectedTokens: d.ExpectedTokens, Tenant: d.Tenant, KVBlocks: d.KVBlocks}
}

// OptionOf maps a route candidate on peer into admission's view of it for a request of
// priority: routing's predicted TTFT and TPOT, and the KV free after the peer's running work,
// the queued work ahead of the request (route.QueuedAhead) and this node's reservations on it.
func OptionOf(c *route.Candidate, peer *route.Peer, priority, blockTokens int) admit.Option {
	free := peer.KVBlocksTotal - peer.KVBlocksUsed - QueuedBlocks(route.QueuedAhead(peer, priority), blockTokens) - c.Terms.ReservedBlocks
	return admit.Option{
		Peer: c.Name, PredictedTTFT: c.PredictedTTFT, PredictedTPOT: c.PredictedTPOT,
		FreeKVBlocks: max(free, 0), TotalKVBlocks: peer.KVBlocksTotal, BlockTokens: blockTokens,
		CachedTokens: c.Terms.PrefixTokens, PrefillTokensPerSecond: peer.PrefillTokensPerSecond,
	}
}

// QueuedBlocks is the KV the engine's queued prefill will take before a new request runs: its
// queue is first come first served and its head waits for blocks (as vLLM's does), so the
// blocks free now are not free for a request behind it (admit.Option.FreeKVBlocks).
func QueuedBlocks(tokens, blockTokens int) int {
	if tokens <= 0 || blockTokens <= 0 {
		return 0
	}
	return (tokens + blockTokens - 1) / blockTokens
}

// busyOptions lists the busy hosts of req's model as options, when routing found none with
// room: their free KV as it is, and the prefill queued on them as the wait. A host is one
// routing would run req on (route.Request.Serves): for a LoRA adapter, also a node serving its
// base model whose record lists fewer adapters than its engine serves, so that an adapter past
// every record's bound waits in the room like any other request instead of being refused
// no_capacity. The blocked head's claim goes where it fits first (Admitter.ClaimFor); an accept
// on a busy host never runs (decide).
func (p *Planner) busyOptions(v *View, req *route.Request, pl *Plan) {
	for i := range v.Peers {
		peer := &v.Peers[i]
		if !peer.Healthy || !req.Serves(peer) {
			continue
		}
		ahead := route.QueuedAhead(peer, req.Priority)
		var ttft time.Duration
		if peer.PrefillTokensPerSecond > 0 {
			ttft = time.Duration(float64(ahead) / peer.PrefillTokensPerSecond * float64(time.Second))
		}
		free := peer.KVBlocksTotal - peer.KVBlocksUsed - QueuedBlocks(ahead, v.BlockTokens)
		pl.Opts = append(pl.Opts, admit.Option{Peer: peer.Name, PredictedTTFT: ttft, FreeKVBlocks: max(free, 0),
			TotalKVBlocks: peer.KVBlocksTotal, BlockTokens: v.BlockTokens, PrefillTokensPerSecond: peer.PrefillTokensPerSecond})
	}
}

// Owner is the owner's authoritative check of a request a peer forwarded here, against self:
// this node as a route.Peer built from its engine's exact state (its own prefix lookup in
// PrefixBlocks). It predicts with the same functions as the ingress (route's Predict, then
// OptionOf), so that on the same state both reach the same verdict. knownAgent reports that
// this node's agent window knows req.Agent: its steps are admitted by the window, not here.
//
// The result is Accept (with the effective MaxTokens) or Refuse; a Queue verdict is a 429 with
// its code, since the ingress, not the owner, keeps the waiting room.
func (p *Planner) Owner(now time.Time, req admit.Request, self route.Peer, blockTokens int, knownAgent bool) admit.Decision {
	if p.grid != nil && req.Priority < 0 {
		if d := p.grid.Decide(now, req.Priority, nil); d.Action == carbon.ActionDefer {
			return carbonDeferred("this node's grid is over the carbon threshold", d.RetryAfter)
		}
	}
	o := p.LocalOption(req, self, blockTokens)
	d := p.adm.Recheck(now, req, o)
	if p.cfg.Agents && req.Agent != "" && d.Code == admit.CodeSLOUnattainable {
		d = p.adm.Recheck(now, WithoutSLO(req), o) // as the ingress does: see decide
	}
	if d.Action == admit.Accept || d.Status == statusBadRequest {
		return d
	}
	if p.cfg.Mode != ModeKvmesh || knownAgent {
		// A plain router's engine queues what it is sent; a known agent's window admits it.
		return admit.Decision{Action: admit.Accept, Layer: d.Layer, Code: admit.CodeAccepted, Option: 0,
			Tenant: d.Tenant, MaxTokens: d.MaxTokens, ExpectedTokens: d.ExpectedTokens, KVBlocks: d.KVBlocks}
	}
	if d.Action == admit.Queue {
		d.Action, d.Status = admit.Refuse, statusTooManyRequests
	}
	return d
}

// LocalOption is self, this node from its engine's exact state, as admission's one option
// for req: what Owner checks against, predicted as the ingress predicts every candidate.
func (p *Planner) LocalOption(req admit.Request, self route.Peer, blockTokens int) admit.Option {
	self.Self = true
	c := p.policy.Predict(p.routeRequest(req, blockTokens), &self)
	c.Name = self.Name
	return OptionOf(&c, &self, req.Priority, blockTokens)
}

// WithoutSLO is req with the SLO of an agent step decided again (AgentStepSLO).
func WithoutSLO(req admit.Request) admit.Request {
	req.TTFTSLO, req.TPOTSLO = AgentStepSLO, AgentStepSLO
	return req
}
