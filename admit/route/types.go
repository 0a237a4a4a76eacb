package route

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"time"
)

// Request is what routing needs to know about one request.
type Request struct {
	Model string
	// Parent is the base model of the LoRA adapter Model names; "" for a base model's request.
	// A peer serving Parent with adapter slots runs the request, and where the adapter stands
	// on a peer scores (adapter.go).
	Parent       string
	PromptTokens int
	MaxTokens    int
	Priority     int
	// Session is the agent or session id (X-Kvmesh-Agent); empty means none.
	Session string
	// StayHome marks a step of an agent (Session) under agent-level admission, which must run
	// where its context and its window are: its home. A peer that advertises the agent
	// (AgentKeys) is its home, so an agent stays where it is while that peer is healthy; a new
	// agent's home is chosen by load, the first peer in the agent's rendezvous order whose
	// agent load is under ceil((1+HomeBalance)·(total+1)/peers) (see homeLocked). Every
	// ingress so agrees on an existing agent's home once gossip has carried the home's record,
	// and on a new agent's as long as its steps do not reach two ingresses before that. (The
	// longest cached prefix does not do: a prompt prefix shared by every agent would send them
	// all to whichever peer cached it first.) The home stays a candidate even when busy or
	// gated and goes first (Sticky), because its agent window, not the load filters, decides
	// when the step runs.
	StayHome bool
	// KeepBusy keeps busy peers, and peers whose owner refused a request of this priority, as
	// candidates, scored as usual (their load terms rank them last): for a node with no
	// waiting room (admission "none" or "queue-cap"), where the engine's own queue is the only
	// place to wait, as with a plain router.
	KeepBusy bool
	// BlockTokens is the KV block size the prompt was hashed with (≤ 0: kvindex's default).
	BlockTokens int
	// TTFTTarget is the TTFT the request must still meet, counted from now (its SLO less the
	// time it has waited), and TPOTTarget its TPOT SLO; zero: none known. With a TTFT target,
	// the peers holding the request's longest cached prefix are its prefix homes and keep it
	// (the locality rule, locality.go); without one, the load gate alone orders the holders.
	TTFTTarget, TPOTTarget time.Duration
	// Slack is the time left, counted from now, before the waiting room's deadline for the
	// request's own TTFT SLO (its SLO less admission's dispatch slack, less the time it has
	// waited), not capped at the normal class's as a sheddable request's TTFTTarget is; zero:
	// none known. A sheddable request of an adapter waits for its adapter's residency while
	// more than Config.AdapterSheddableWait of it is left (seatless).
	Slack time.Duration
	// StepTPOTTarget is the TPOT the decodes already running on a peer must keep, whatever
	// their class: the tightest TPOT SLO of the classes and of this request (zero: none known).
	// Under the locality rule a home keeps the request past the load gate while its
	// Candidate.SharedTPOT is within it: its queue then costs its decodes no SLO.
	StepTPOTTarget time.Duration
	// TokenScale is PromptTokens over the prompt's length in kvindex's own tokens, in which
	// blocks are cut: a cached block holds BlockTokens × TokenScale of the request's tokens
	// (≤ 0: 1). It differs from 1 once the node has learned a model's bytes per token.
	TokenScale float64
	// Blocks are the prompt's chained block hashes (kvindex's, of BlockTokens each), nil when
	// unknown. Under the locality rule a prompt whose prefix no peer holds is placed by a
	// hash of its head (coldKey): every ingress then puts a tenant's cold prefix on the same
	// peer while that peer serves it in time, and the prefix returns there after an eviction.
	Blocks []uint64
}

// Peer is one node's view of a peer (or of itself), mapped from its gossiped state record.
type Peer struct {
	Name   string
	Self   bool // this node: its state is exact, so it is never stale
	Models []string
	Age    time.Duration // since its last state record was received
	Stale  bool          // marked stale by the gossip layer, whatever its Age
	// MaxAge, when longer than Config.MaxAge, is this peer's own: a peer outside the ingress's
	// prefix domains in a large mesh, whose records come only at the mesh-wide interval.
	MaxAge  time.Duration
	Healthy bool
	// Ejected: forwards to the peer failed at the transport lately (Ejector), so it is not a
	// candidate until its ejection ends.
	Ejected bool
	Role    string
	Vendor  string
	// WholeOnly: the peer's engine runs whole requests only (an external engine without a
	// prefill or decode role), so it is no candidate for either half of a split request.
	WholeOnly bool
	// HalvesOnly: a decode peer that runs decode halves only (its own
	// Config.DecodeLocalPrefill off, gossiped), so it is no local candidate (PairSearch.Local).
	HalvesOnly bool

	VRAMTotalBytes, VRAMFreeBytes uint64
	KVBlocksTotal, KVBlocksUsed   int
	HitRate                       float64
	Running, Waiting, MaxRunning  int
	QueuedPrefillTokens           int
	// PriorityScheduling: the peer's engine runs waiting work by priority, so of its queued
	// prefill only QueuedBeforeHigh (every running prefill and the waiting high requests') is
	// ahead of a high request, and all but QueuedLowWaiting (the waiting sheddable requests')
	// ahead of a normal one (QueuedAhead).
	PriorityScheduling                 bool
	QueuedBeforeHigh, QueuedLowWaiting int
	InFlightTokens                     int
	PrefillTokensPerSecond             float64
	DecodeStepSeconds                  float64
	PowerWatts, PowerCapWatts          float64
	TempC                              float64
	CarbonIntensity                    float64

	// Agents is how many agents the peer is home to (under agent-level admission), and
	// AgentKeys the AgentKey of some of them, sorted ascending: all of them, or the most
	// recently active ones when there are too many to gossip. A StayHome step of an agent a
	// peer advertises goes there.
	Agents    int
	AgentKeys []uint64

	// ResidentAdapters are the LoRA adapters holding a GPU slot on the peer's engine, LoRASlots
	// its adapter slots (0: none or unknown) and LoRAFree those no adapter holds.
	ResidentAdapters    []string
	LoRASlots, LoRAFree int
	// AdaptersCut: the peer's engine serves more adapters than its record can list, so it may
	// serve an adapter of its base model that Models does not name (Request.Serves).
	AdaptersCut bool

	// PrefixBlocks is the longest contiguous run of this request's blocks, from block 0, that
	// the peer holds (kvindex lookup).
	PrefixBlocks int

	// AdapterLoad is the time the peer takes to load the request's LoRA adapter before it can
	// run it (0: none to load); it adds to the predicted TTFT.
	AdapterLoad time.Duration
}

// Terms are the parts of a candidate's score, for logs and the explain header.
type Terms struct {
	PrefixTokens   int           // cached prompt tokens on the peer (PrefixBlocks × BlockTokens, ≤ prompt)
	PrefixSaved    time.Duration // prefill time those tokens save on the peer
	Prefix         float64       // PrefixTokens / PromptTokens, in [0,1]
	LoadTokens     int           // queued prefill + in-flight + reserved prefill tokens
	Load           float64       // LoadTokens/(LoadTokens+LoadHalfTokens), in [0,1)
	FreeKV         float64       // free KV fraction after reservations, 0.5 when unknown
	Power          float64       // power headroom 1−W/cap, 0.5 when unknown
	Thermal        float64       // penalty in [0,1] between the soft and hard limits
	ReservedTokens int           // prefill tokens this node reserved on the peer
	ReservedBlocks int           // KV blocks this node reserved on the peer
	// PrefillRate and Step are the peer's prefill rate (tokens/s) and decode step as predicted
	// with (its own, else the defaults); Batch is its predicted batch with the request.
	PrefillRate float64
	Step        time.Duration
	Batch       int
	// Residency is where the request's adapter stands on the peer (ResidencyNone for a base
	// model's request), and Adapter its score term: 1 resident, 0.5 a free slot, 0 a swap.
	Residency Residency
	Adapter   float64
	// Spill is, under the locality rule, the cached prefix tokens the request's home holds and
	// this peer does not: the prefill it recomputes here, and the KV of other prompts its
	// storing evicts (0 on a home, and without a home).
	Spill int
}

// Candidate is one peer that survived the filters.
type Candidate struct {
	Peer          int // index into the peers slice given to Route
	Name          string
	Score         float64
	Terms         Terms
	PredictedTTFT time.Duration
	PredictedTPOT time.Duration
	// SharedTPOT is the TPOT the peer's decodes see while the prefill queued there, this
	// request's uncached prompt included, runs in the same steps: PredictedTPOT plus one
	// step's share of that prefill (up to Config.StepTokens of it) at the peer's prefill rate.
	// It is what concentrating requests on a peer costs the decodes it runs.
	SharedTPOT time.Duration
	// Gated is set when the load gate moved this candidate behind the others.
	Gated bool
	// Sticky is set on the candidate chosen because it served the session last.
	Sticky bool
	// Home is set on a prefix home of the request under the locality rule (locality.go).
	Home bool
	// Pair, when set, makes the candidate a split request's pair (pair.go): Peer and Name are
	// the prefill peer's, the terms its prefill's, and PredictedTTFT and PredictedTPOT the
	// pair's (Pair.TTFT, the decode peer's TPOT). Nil for a whole request's candidate.
	Pair *Pair

	overCap, tooHot bool
}

// String is a compact one-line form for logs and the explain header, e.g.
// "n2 score=0.820 prefix=1536 load=0.10 kv=0.55 ttft=120ms tpot=20ms", with "lora=resident",
// "lora=free_slot" or "lora=swap" before ttft for an adapter's request.
func (c Candidate) String() string {
	var b []byte
	return string(c.appendTo(b))
}

func (c Candidate) appendTo(b []byte) []byte {
	b = append(b, c.Name...)
	b = append(b, " score="...)
	b = strconv.AppendFloat(b, c.Score, 'f', 3, 64)
	b = append(b, " prefix="...)
	b = strconv.AppendInt(b, int64(c.Terms.PrefixTokens), 10)
	b = append(b, " load="...)
	b = strconv.AppendFloat(b, c.Terms.Load, 'f', 2, 64)
	b = append(b, " kv="...)
	b = strconv.AppendFloat(b, c.Terms.FreeKV, 'f', 2, 64)
	if c.Terms.ReservedTokens > 0 {
		b = append(b, " rsv="...)
		b = strconv.AppendInt(b, int64(c.Terms.ReservedTokens), 10)
	}
	if c.Terms.Thermal > 0 {
		b = append(b, " hot="...)
		b = strconv.AppendFloat(b, c.Terms.Thermal, 'f', 2, 64)
	}
	if c.Terms.Residency != ResidencyNone {
		b = append(b, " lora="...)
		b = append(b, c.Terms.Residency.String()...)
	}
	b = append(b, " ttft="...)
	b = append(b, c.PredictedTTFT.Round(time.Millisecond).String()...)
	b = append(b, " tpot="...)
	b = append(b, c.PredictedTPOT.Round(time.Millisecond).String()...)
	if c.Terms.Spill > 0 {
		b = append(b, " spill="...)
		b = strconv.AppendInt(b, int64(c.Terms.Spill), 10)
	}
	if c.Home {
		b = append(b, " home"...)
	}
	if c.Gated {
		b = append(b, " gated"...)
	}
	if c.Sticky {
		b = append(b, " sticky"...)
	}
	if c.Pair != nil {
		b = append(b, " decode="...)
		b = append(b, c.Pair.Decode.Name...)
	}
	return b
}

// Explain renders the first n candidates for the X-Kvmesh-Explain header, separated by "; ".
// Control characters in names are replaced so the result is a valid header value.
func Explain(cands []Candidate, n int) string {
	n = min(n, len(cands))
	var b []byte
	for i := range n {
		if i > 0 {
			b = append(b, "; "...)
		}
		b = cands[i].appendTo(b)
	}
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return '_'
		}
		return r
	}, string(b))
}

// Reason is why a filter dropped a peer, in filter order.
type Reason uint8

// Filter reasons, in the order the filters run.
const (
	ReasonModel      Reason = iota // does not host the model
	ReasonStale                    // state too old (StaleClosed)
	ReasonUnhealthy                // engine reports unhealthy
	ReasonEjected                  // unreachable at the transport lately (Peer.Ejected)
	ReasonCapability               // VRAM too small, wrong vendor or role
	ReasonBusy                     // KV use or queued prefill tokens over threshold
	ReasonPowerCap                 // at its power cap while another peer is under its cap
	ReasonThermal                  // at or above the thermal hard limit
	NumReasons
)

var reasonNames = [NumReasons]string{"model", "stale", "unhealthy", "ejected", "capability", "busy", "power_cap", "thermal"}

// String is the reason's metric label value.
func (r Reason) String() string {
	if r < NumReasons {
		return reasonNames[r]
	}
	return "unknown"
}

// FilterCounts counts dropped peers by Reason.
type FilterCounts [NumReasons]int

// ErrNoCandidate is wrapped by *NoCandidateError.
var ErrNoCandidate = errors.New("route: no candidate")

// NoCandidateError says why no peer survived the filters.
type NoCandidateError struct {
	Model  string
	Peers  int // peers considered
	Counts FilterCounts
}

func (e *NoCandidateError) Error() string {
	b := []byte("route: no candidate for model ")
	b = strconv.AppendQuote(b, e.Model)
	b = append(b, " among "...)
	b = strconv.AppendInt(b, int64(e.Peers), 10)
	b = append(b, " peers:"...)
	for r, n := range e.Counts {
		if n > 0 {
			b = append(b, ' ')
			b = append(b, Reason(r).String()...)
			b = append(b, '=')
			b = strconv.AppendInt(b, int64(n), 10)
		}
	}
	return string(b)
}

// Unwrap makes errors.Is(err, ErrNoCandidate) true.
func (e *NoCandidateError) Unwrap() error { return ErrNoCandidate }

// NoHost reports that no peer hosts the model at all: the node answers 503 no_capacity.
func (e *NoCandidateError) NoHost() bool { return e.Counts[ReasonModel] == e.Peers }

// Busy reports that some peer hosting the model was dropped for a passing reason (busy,
// ejected for a backoff, power cap, thermal): admission should queue or answer 429 with
// Retry-After, not 503. When neither NoHost nor Busy holds, every host is stale, unhealthy or
// incapable: 503.
func (e *NoCandidateError) Busy() bool {
	return !e.NoHost() && e.Counts[ReasonBusy]+e.Counts[ReasonEjected]+e.Counts[ReasonPowerCap]+e.Counts[ReasonThermal] > 0
}

// toDuration converts seconds to a Duration, saturating instead of overflowing.
func toDuration(s float64) time.Duration {
	if !(s < float64(math.MaxInt64)/1e9) {
		return time.Duration(math.MaxInt64)
	}
	if s < 0 {
		return 0
	}
	return time.Duration(s * 1e9)
}
