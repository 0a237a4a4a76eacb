package plan

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/carbon"
)

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
	// Blocks are the prompt's chained block hashes (route.Request.Blocks), nil when unknown.
	Blocks []uint64
}

// Reset empties v, keeping its storage.
func (v *View) Reset(blockTokens int) {
	v.Peers, v.Dirty, v.BlockTokens, v.Blocks = v.Peers[:0], v.Dirty[:0], blockTokens, nil
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
	rreq.Blocks = v.Blocks
	if p.cfg.Mode == ModeKvmesh {
		rreq.TTFTTarget, rreq.TPOTTarget = p.targets(now, req, it != nil)
		rreq.StepTPOTTarget = p.stepTPOT(rreq.TPOTTarget)
		rreq.Slack = p.slack(now, req)
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
// spare capacity it may run on (admission's spare rule), not its own loose SLO. Once it has
// waited past the normal target, what is left of its own SLO is its target: it no longer
// waits for spare capacity but for room, and without a target routing would hand it to the
// load gate, which spreads the sheddable work that waited longest over every node, each
// recomputing its prefix and evicting other prompts' cache. Zero TTFT: none is left.
func (p *Planner) targets(now time.Time, req admit.Request, queued bool) (ttft, tpot time.Duration) {
	ttft, tpot = p.adm.SLOFor(req)
	cfg := p.adm.Config()
	if queued {
		ttft -= time.Duration(float64(ttft) * max(cfg.Queue.DispatchSlack, 0))
	}
	waited := now.Sub(req.SLOClock())
	if normal := time.Duration(cfg.SLO.Normal.TTFT); req.Priority < 0 && normal > waited {
		ttft = min(ttft, normal)
	}
	return max(ttft-waited, 0), tpot
}

// slack is the time left before the waiting room's deadline for req's own TTFT SLO
// (route.Request.Slack): the SLO less the dispatch slack, less the time it has waited. Zero:
// none is left, or req has no TTFT SLO.
func (p *Planner) slack(now time.Time, req admit.Request) time.Duration {
	ttft, _ := p.adm.SLOFor(req)
	ttft -= time.Duration(float64(ttft) * max(p.adm.Config().Queue.DispatchSlack, 0))
	return max(ttft-now.Sub(req.SLOClock()), 0)
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
