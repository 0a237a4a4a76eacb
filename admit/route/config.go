package route

import (
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"
)

// StalePolicy says what happens to a peer whose state record is too old.
type StalePolicy uint8

const (
	// StaleClosed drops a stale peer (fail-closed): its last load may be far below its real
	// load, and routing on a stale low number is how a burst lands on one engine.
	StaleClosed StalePolicy = iota
	// StaleOpen keeps a stale peer and scores it at its last known load (fail-open).
	StaleOpen
)

// String returns "closed" or "open".
func (s StalePolicy) String() string {
	switch s {
	case StaleClosed:
		return "closed"
	case StaleOpen:
		return "open"
	}
	return fmt.Sprintf("StalePolicy(%d)", uint8(s))
}

// MarshalText writes "closed" or "open".
func (s StalePolicy) MarshalText() ([]byte, error) {
	if s > StaleOpen {
		return nil, fmt.Errorf("route: unknown stale policy %d: %w", s, ErrInvalidConfig)
	}
	return []byte(s.String()), nil
}

// UnmarshalText reads "closed" or "open".
func (s *StalePolicy) UnmarshalText(b []byte) error {
	v, err := ParseStalePolicy(string(b))
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// ParseStalePolicy parses "closed" or "open".
func ParseStalePolicy(s string) (StalePolicy, error) {
	switch s {
	case "closed":
		return StaleClosed, nil
	case "open":
		return StaleOpen, nil
	}
	return 0, fmt.Errorf("route: unknown stale policy %q (want closed or open): %w", s, ErrInvalidConfig)
}

// ErrInvalidConfig is wrapped by every Config validation error.
var ErrInvalidConfig = errors.New("route: invalid config")

// Weights blend the score terms (see the package doc). A zero weight takes its default; a
// negative one (-1) turns its term off. The load gate does not read them, so no setting can
// stop it moving traffic.
type Weights struct {
	Prefix  float64 `json:"prefix"`  // × fraction of the prompt already cached on the peer
	Load    float64 `json:"load"`    // × token load in [0,1), subtracted
	FreeKV  float64 `json:"free_kv"` // × free KV fraction
	Power   float64 `json:"power"`   // × power headroom fraction
	Thermal float64 `json:"thermal"` // × thermal penalty in [0,1], subtracted
	// × adapter residency of an adapter's request: 1 resident, 0.5 a free slot, 0 a swap
	Adapter float64 `json:"adapter,advanced"`
}

// Config configures a Router. The zero rule, as in every kvmesh config: a zero field means its
// default (DefaultConfig's value), which New and NewPolicy fill in, so Config{} is
// DefaultConfig(); a setting that can be turned off is turned off by an explicit field (a bool
// such as DisablePowerCapFilter) or by the negative value its documentation names, never by
// zero. The JSON names are the config file's (kvmesh node --config, section "route").
type Config struct {
	// Filters.

	// MaxAge is the age of a state record past which a peer is stale (the file's
	// route.stale_after, which a node gives gossip too). Default 3 s: records are
	// sent on change and at least every second, so three missed records. (llm-d uses 200 ms
	// against a 50 ms scrape, the same ratio of a few missed updates.)
	MaxAge time.Duration `json:"stale_after"`
	// StalePolicy is what happens to a stale peer (a node gives gossip the same). Default StaleClosed. A node's own state
	// (Peer.Self) is never stale.
	StalePolicy StalePolicy `json:"stale_policy"`
	// ModelBytes is the VRAM each model needs; a model never lands on a card whose
	// VRAMTotalBytes is smaller. Unknown models and cards reporting no VRAM pass.
	ModelBytes map[string]uint64 `json:"model_bytes"`
	// ModelVendors lists the GPU vendors a model may run on (empty or missing: any).
	ModelVendors map[string][]string `json:"model_vendors"`
	// Roles lists the peer roles that can run a whole request (empty: any role). A prefill peer
	// never does; a decode peer runs one (DecodeLocalPrefill) only when Roles is empty or
	// lists "decode". A mixed peer runs either half of a split request only when Roles lets it
	// run whole ones, so that a node routing excludes gets no half either.
	Roles []string `json:"roles"`
	// BusyKVUse is the KV use above which a peer is busy for a request: blocks used, plus
	// blocks this node reserved, plus the blocks the request would add there (its uncached
	// prompt and max_tokens), over total. Default 0.95, admission's KV.QueueOn: the request
	// fits with 5% left for the running sequences' growth. Thresholds on use alone (llm-d's
	// 0.8, Dynamo's 0.70–0.95) turned a short request away from an engine that one long
	// prompt holds at 80%, and a long prompt away from the engine that caches most of it;
	// counting the request judges what it costs there. A peer using no blocks is never busy
	// by KV.
	BusyKVUse float64 `json:"busy_kv_use"`
	// BusyQueuedPrefillTokens is the queued prefill tokens (plus tokens this node reserved)
	// above which a peer is busy. Default 16384, inside Dynamo's 5,000–20,000. The request's own
	// prompt is not counted, so an idle peer always takes a long prompt (a queue threshold that
	// counted it starved long prompts: Dynamo PR #8163).
	BusyQueuedPrefillTokens int `json:"busy_queued_prefill_tokens"`
	// BusyWaiting is the engine queue depth (requests waiting to be scheduled) at which a peer
	// is busy. Default 5, llm-d's queueDepthThreshold: an engine's own queue is first come first
	// served, so past a few waiting requests new work is better held in kvmesh's waiting room,
	// where priority and deadlines order it. Negative (-1) turns the check off.
	BusyWaiting int `json:"busy_waiting,advanced"`
	// DisablePowerCapFilter turns off the soft power cap, on by default: peers drawing at
	// least PowerCapFraction of their cap are dropped, but only if some remaining peer is
	// under its cap.
	DisablePowerCapFilter bool `json:"disable_power_cap_filter"`
	// PowerCapFraction of PowerCapWatts counts as at the cap. Default 1.0 (drawing the
	// enforced limit means the GPU is already clocking down).
	PowerCapFraction float64 `json:"power_cap_fraction,advanced"`
	// ThermalSoftC starts a score penalty growing linearly to ThermalHardC, which it must stay
	// below. Default 80 °C.
	ThermalSoftC float64 `json:"thermal_soft_c,advanced"`
	// ThermalHardC and above: not a candidate. Default 90 °C (data-centre GPUs slow down
	// near here). A TempC of 0 means unknown and passes.
	ThermalHardC float64 `json:"thermal_hard_c,advanced"`

	// Score.

	// Weights of the score terms. Default prefix 1.0, load 0.5, free KV 0.25, power 0.1,
	// thermal 0.5, adapter 1.0: the prefix leads (a hit saves real prefill), load is next; the gate, not
	// the weights, keeps the prefix from herding.
	Weights Weights `json:"weights"`
	// AdapterLoadTime is the time an engine takes to bring a LoRA adapter into a GPU slot,
	// added to the predicted TTFT of a peer the request's adapter is not resident on (the
	// engines do not report it). Default 200 ms, the embedded engine's lora_load_time; an
	// adapter read from a local disk into vLLM takes from tens of milliseconds to about a
	// second by its rank and size.
	AdapterLoadTime time.Duration `json:"adapter_load_time,advanced"`
	// AdapterSheddableSlots are the free adapter slots of a peer that a sheddable request
	// (priority < 0) of an adapter not resident there leaves to the others: with that many or
	// fewer free, the peer is busy for it (seatless). A request holds its adapter's slot for
	// its whole reply, and while every slot holds a running adapter the engine skips the
	// requests of every other adapter, whatever their class. Default 1; negative: none.
	AdapterSheddableSlots int `json:"adapter_sheddable_slots,advanced"`
	// AdapterSheddableSlack: a sheddable request (priority < 0) of an adapter not resident on
	// a peer finds the peer busy (seatless) while more than this is left of its slack
	// (Request.Slack): it waits in the waiting room for a peer where its adapter is resident
	// (an interactive request of the adapter loads it) or for its slack to run this low, and
	// so leaves the free slots to the interactive requests of adapters resident nowhere, which
	// have no time to wait for one. Default 10 s (a 30 s target, less a fifth of it as
	// dispatch slack, waits up to 14 s); negative: it takes a free slot at once.
	AdapterSheddableSlack time.Duration `json:"adapter_sheddable_slack,advanced"`
	// LoadHalfTokens is the token load scored 0.5: load = t/(t+LoadHalfTokens). Default 16384,
	// the busy threshold's scale; saturating, so heavily loaded peers still rank.
	LoadHalfTokens int `json:"load_half_tokens,advanced"`
	// DefaultPrefillTokensPerSecond is used for peers that report no prefill rate. Default
	// 20000 (below the 25k–37k an H100 manages on an 8B model: conservative).
	DefaultPrefillTokensPerSecond float64 `json:"default_prefill_tokens_per_second,advanced"`
	// DefaultDecodeStepSeconds is used for peers that report no decode step. Default 0.02.
	DefaultDecodeStepSeconds float64 `json:"default_decode_step_seconds,advanced"`
	// DecodeBatchShare is the share of a decode step that grows with the batch size, for the
	// predicted TPOT. Default 0.5. At most 1; negative (-1): none, the step does not grow.
	DecodeBatchShare float64 `json:"decode_batch_share,advanced"`

	// Load gate (on predicted TTFT, after scoring).

	// GateSlackFactor scales the time a candidate's cached prefix saves into the TTFT it may
	// lose against the fastest other candidate. Default 1 (the rule as stated); positive.
	GateSlackFactor float64 `json:"gate_slack_factor,advanced"`
	// GateMaxSlack caps that slack. Default 5 s (llm-d's max TTFT penalty is 5–18 s).
	GateMaxSlack time.Duration `json:"gate_max_slack,advanced"`
	// GateTolerance is added to every slack so that tiny TTFT differences do not override the
	// score. Default 25 ms (about one decode step). Negative ("-1ms"): none, strictly the
	// faster candidate.
	GateTolerance time.Duration `json:"gate_tolerance,advanced"`

	// Prefix homes (locality.go): used only for a request that carries a TTFT target
	// (Request.TTFTTarget).

	// PrefixHomeMinTokens is the cached prefix, in the request's tokens, from which the peers
	// holding the request's longest cached prefix are its prefix homes. Default 1024 (one
	// anchor stride of 16-token blocks, about 50 ms of prefill): a shorter prefix saves less
	// than a decode step's worth of queueing. Negative (-1): no prefix homes, the load gate
	// alone orders the holders.
	PrefixHomeMinTokens int `json:"prefix_home_min_tokens,advanced"`
	// PrefixHomeShare is the share of the request's TTFT target within which a peer counts as
	// meeting it, for the locality rule: a home keeps the request while it predicts within it,
	// and the request leaves for another peer only when that peer predicts within it, its
	// recompute included. Default 0.5: the prediction misses what other ingresses sent since
	// the last record, and a request in the waiting room still needs its dispatch slack. In
	// (0, 1].
	PrefixHomeShare float64 `json:"prefix_home_share,advanced"`
	// StepTokens is the prefill a step of a peer's engine carries beside its decodes (its
	// chunked-prefill token budget, vLLM's max_num_batched_tokens), for Candidate.SharedTPOT:
	// while prefill is queued on a peer, each step computes up to this many of its tokens and
	// every running decode waits for them. Default 2048, the embedded engine's. Negative (-1):
	// a step carries no queued prefill, SharedTPOT is PredictedTPOT.
	StepTokens int `json:"step_tokens,advanced"`

	// Tie-break and stickiness.

	// Epsilon is the score distance within which candidates count as equal; among them the
	// pick is power of two choices. Default 0.02. Negative (-1): only exact ties.
	Epsilon float64 `json:"epsilon,advanced"`
	// MaxSessions bounds the session→peer LRU. Default 65536.
	MaxSessions int `json:"max_sessions,advanced"`
	// Seed seeds the tie-break's random source: equal seeds and inputs, equal picks. Default 0.
	Seed uint64 `json:"seed,advanced"`

	// HomeBalance is ε of the bounded-load choice of a new agent's home (Request.StayHome):
	// a peer takes a new agent only while its agent load is under ceil((1+ε)·(total+1)/peers).
	// Default 0: the first peer in the agent's rendezvous order among those under the mean
	// plus one, so homes differ by at most about one agent. A larger ε leaves more new agents
	// on their first rendezvous choice, which buys nothing here (a placed agent never moves
	// while its home is healthy, and a new one has no prefix anywhere) and costs balance: at
	// 0.25, two peers may hold 99 and 58 of 157 agents, a wider split than the plain hash's
	// 85 and 72 on the agent benchmark. Must not be negative.
	HomeBalance float64 `json:"home_balance,advanced"`

	// Disaggregated prefill and decode (pair.go, docs/design/disaggregation.md): the split
	// rule's constants. Used only in a mesh with prefill or decode peers.

	// PrefillBusyQueuedPrefillTokens is BusyQueuedPrefillTokens for a prefill node in the
	// prefill half's search. Default 32768, twice a mixed node's: a prefill node runs no decode
	// whose TPOT its queue would stretch, so its queue is bounded by the TTFT alone (about 1 s
	// of prefill at 31k tokens/s, half the interactive TTFT target).
	PrefillBusyQueuedPrefillTokens int `json:"prefill_busy_queued_prefill_tokens,advanced"`
	// SplitMinTokens is P_min: a request whose uncached prompt on the best mixed candidate is
	// shorter runs whole. Default 2048, the embedded engine's step budget: a prompt that fits
	// one chunk lengthens a mixed node's decodes for a single step.
	SplitMinTokens int `json:"split_min_tokens"`
	// KVBytesPerToken is b, the model's KV bytes per prompt token. Default 131072 (128 KiB,
	// Llama-3.1-8B in BF16); a node gives its embedded engine the same.
	KVBytesPerToken int64 `json:"kv_bytes_per_token"`
	// LinkGBps is bw, the bandwidth of the link the KV crosses between a prefill and a decode
	// node, in GB/s. Default 25 (RDMA class); a node gives its embedded engine the same.
	LinkGBps float64 `json:"link_gbps"`
	// SplitHop is h, the ingress's forward round trip to the decode node added to a pair's
	// predicted TTFT. Default 1 ms (a LAN). Negative ("-1ms"): none.
	SplitHop time.Duration `json:"split_hop,advanced"`
	// DecodeLocalPrefill lets a decode peer run a whole request, prefill included, when the
	// split rule finds the prefill pool of no use to it: its uncached prompt there is under
	// SplitMinTokens, or the best pair misses the request's TTFT target (no pair at all
	// included) while the decode peer meets it and its TPOT SLO (Decide). Nil, the default
	// (null in a config file, which prints it like every other key), is on; false turns it off. A decode node reads its own: with it off it runs decode
	// halves only, says so in its state record (Peer.HalvesOnly), so that no ingress offers it
	// a whole request, and refuses one (wrong_role) all the same. An ingress with it off
	// offers decode peers none.
	DecodeLocalPrefill *bool `json:"decode_local_prefill"`
	// Delegate: a node that serves none of a request's model hands the routing decision to a
	// member of the model's domain (Delegate), which knows its prefixes and fresh load. Nil,
	// the default, is on; false routes such requests here, on this node's view of the domain.
	Delegate *bool `json:"delegate"`

	// Reservations.

	// ReservationTTL drops a reservation no record or Release has cleared. Default 3 s (MaxAge:
	// a peer silent for longer is stale anyway).
	ReservationTTL time.Duration `json:"reservation_ttl,advanced"`
	// ObserveMargin: a record received at least this long after a dispatch is taken to include
	// it (forwarding plus gossip latency). Default 200 ms. Negative ("-1ms"): none, the
	// first record after a dispatch is taken to include it.
	ObserveMargin time.Duration `json:"observe_margin,advanced"`
	// MaxReservationsPerPeer bounds memory; the oldest is dropped past it. Default 4096.
	MaxReservationsPerPeer int `json:"max_reservations_per_peer,advanced"`

	// Eject configures the node's Ejector (NewEjector), which marks peers that cannot be
	// reached Peer.Ejected for every policy; the Router itself does not read it.
	Eject EjectConfig `json:"eject,advanced"`
	// RetryBudget configures the node's RetryBudget (NewRetryBudget), which bounds the
	// forwards it retries after a failed one; the Router itself does not read it.
	RetryBudget RetryBudgetConfig `json:"retry_budget,advanced"`
}

// DefaultConfig returns the documented defaults.
func DefaultConfig() Config {
	return Config{
		MaxAge:                         3 * time.Second,
		StalePolicy:                    StaleClosed,
		BusyKVUse:                      0.95,
		BusyQueuedPrefillTokens:        16384,
		BusyWaiting:                    5,
		PowerCapFraction:               1.0,
		ThermalSoftC:                   80,
		ThermalHardC:                   90,
		Weights:                        Weights{Prefix: 1.0, Load: 0.5, FreeKV: 0.25, Power: 0.1, Thermal: 0.5, Adapter: 1.0},
		AdapterLoadTime:                200 * time.Millisecond,
		AdapterSheddableSlots:          1,
		AdapterSheddableSlack:          10 * time.Second,
		LoadHalfTokens:                 16384,
		DefaultPrefillTokensPerSecond:  20000,
		DefaultDecodeStepSeconds:       0.02,
		DecodeBatchShare:               0.5,
		GateSlackFactor:                1,
		GateMaxSlack:                   5 * time.Second,
		GateTolerance:                  25 * time.Millisecond,
		PrefixHomeMinTokens:            1024,
		PrefixHomeShare:                0.5,
		StepTokens:                     2048,
		Epsilon:                        0.02,
		MaxSessions:                    65536,
		ReservationTTL:                 3 * time.Second,
		ObserveMargin:                  200 * time.Millisecond,
		MaxReservationsPerPeer:         4096,
		SplitMinTokens:                 2048,
		PrefillBusyQueuedPrefillTokens: 32768,
		KVBytesPerToken:                128 << 10,
		LinkGBps:                       25,
		SplitHop:                       time.Millisecond,
		Eject:                          DefaultEjectConfig(),
		RetryBudget:                    DefaultRetryBudgetConfig(),
	}
}

// fill sets every zero field to its default (the zero rule), then validates.
func (c *Config) fill() error {
	d := DefaultConfig()
	fillDur := func(v *time.Duration, def time.Duration) {
		if *v == 0 {
			*v = def
		}
	}
	fillF := func(v *float64, def float64) {
		if *v == 0 {
			*v = def
		}
	}
	fillI := func(v *int, def int) {
		if *v == 0 {
			*v = def
		}
	}
	fillDur(&c.MaxAge, d.MaxAge)
	fillF(&c.BusyKVUse, d.BusyKVUse)
	fillI(&c.BusyQueuedPrefillTokens, d.BusyQueuedPrefillTokens)
	fillI(&c.BusyWaiting, d.BusyWaiting)
	fillF(&c.PowerCapFraction, d.PowerCapFraction)
	fillF(&c.ThermalSoftC, d.ThermalSoftC)
	fillF(&c.ThermalHardC, d.ThermalHardC)
	fillF(&c.Weights.Prefix, d.Weights.Prefix)
	fillF(&c.Weights.Load, d.Weights.Load)
	fillF(&c.Weights.FreeKV, d.Weights.FreeKV)
	fillF(&c.Weights.Power, d.Weights.Power)
	fillF(&c.Weights.Thermal, d.Weights.Thermal)
	fillF(&c.Weights.Adapter, d.Weights.Adapter)
	fillDur(&c.AdapterLoadTime, d.AdapterLoadTime)
	fillI(&c.AdapterSheddableSlots, d.AdapterSheddableSlots)
	fillDur(&c.AdapterSheddableSlack, d.AdapterSheddableSlack)
	fillI(&c.LoadHalfTokens, d.LoadHalfTokens)
	fillF(&c.DefaultPrefillTokensPerSecond, d.DefaultPrefillTokensPerSecond)
	fillF(&c.DefaultDecodeStepSeconds, d.DefaultDecodeStepSeconds)
	fillF(&c.DecodeBatchShare, d.DecodeBatchShare)
	fillF(&c.GateSlackFactor, d.GateSlackFactor)
	fillDur(&c.GateMaxSlack, d.GateMaxSlack)
	fillDur(&c.GateTolerance, d.GateTolerance)
	fillI(&c.PrefixHomeMinTokens, d.PrefixHomeMinTokens)
	fillF(&c.PrefixHomeShare, d.PrefixHomeShare)
	fillI(&c.StepTokens, d.StepTokens)
	fillF(&c.Epsilon, d.Epsilon)
	fillI(&c.MaxSessions, d.MaxSessions)
	fillDur(&c.ReservationTTL, d.ReservationTTL)
	fillDur(&c.ObserveMargin, d.ObserveMargin)
	fillI(&c.MaxReservationsPerPeer, d.MaxReservationsPerPeer)
	fillI(&c.SplitMinTokens, d.SplitMinTokens)
	fillI(&c.PrefillBusyQueuedPrefillTokens, d.PrefillBusyQueuedPrefillTokens)
	if c.KVBytesPerToken == 0 {
		c.KVBytesPerToken = d.KVBytesPerToken
	}
	fillF(&c.LinkGBps, d.LinkGBps)
	fillDur(&c.SplitHop, d.SplitHop)
	if c.DecodeLocalPrefill != nil { // its own copy: the live config is never changed in place
		on := *c.DecodeLocalPrefill
		c.DecodeLocalPrefill = &on
	}
	if c.Delegate != nil {
		on := *c.Delegate
		c.Delegate = &on
	}
	if err := c.Eject.fill(); err != nil {
		return err
	}
	if err := c.RetryBudget.fill(); err != nil {
		return err
	}
	return c.validate()
}

// LocalPrefill reports whether DecodeLocalPrefill is on (nil: on).
func (c *Config) LocalPrefill() bool { return c.DecodeLocalPrefill == nil || *c.DecodeLocalPrefill }

// Delegates reports whether Delegate is on (nil: on).
func (c *Config) Delegates() bool { return c.Delegate == nil || *c.Delegate }

// on is a weight or share in use: a negative one (turned off) counts as 0.
func on(v float64) float64 { return max(v, 0) }

// onDur is a margin in use: a negative one (turned off) counts as 0.
func onDur(v time.Duration) time.Duration { return max(v, 0) }

func (c *Config) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("route: "+format+": %w", append(args, ErrInvalidConfig)...)
	}
	finite := func(v float64) bool { return !math.IsInf(v, 0) && !math.IsNaN(v) }
	finiteNonNeg := func(v float64) bool { return v >= 0 && finite(v) }
	switch {
	case c.MaxAge < 0:
		return bad("MaxAge %v is negative", c.MaxAge)
	case c.StalePolicy > StaleOpen:
		return bad("unknown StalePolicy %d", c.StalePolicy)
	case !(c.BusyKVUse > 0 && c.BusyKVUse <= 1):
		return bad("BusyKVUse %v not in (0,1]", c.BusyKVUse)
	case c.BusyQueuedPrefillTokens < 0:
		return bad("BusyQueuedPrefillTokens %d is negative", c.BusyQueuedPrefillTokens)
	case !(c.PowerCapFraction > 0 && c.PowerCapFraction <= 2):
		return bad("PowerCapFraction %v not in (0,2]", c.PowerCapFraction)
	case !(c.ThermalSoftC < c.ThermalHardC) || !(c.ThermalHardC > 0) || math.IsInf(c.ThermalHardC, 0):
		return bad("ThermalSoftC %v must be below ThermalHardC %v, which must be positive", c.ThermalSoftC, c.ThermalHardC)
	case !finite(c.Weights.Prefix) || !finite(c.Weights.Load) || !finite(c.Weights.FreeKV) ||
		!finite(c.Weights.Power) || !finite(c.Weights.Thermal) || !finite(c.Weights.Adapter):
		return bad("weights must be finite: %+v", c.Weights)
	case c.AdapterLoadTime < 0:
		return bad("AdapterLoadTime %v is negative", c.AdapterLoadTime)
	case c.LoadHalfTokens < 0:
		return bad("LoadHalfTokens %d is negative", c.LoadHalfTokens)
	case !(c.DefaultPrefillTokensPerSecond > 0) || math.IsInf(c.DefaultPrefillTokensPerSecond, 0):
		return bad("DefaultPrefillTokensPerSecond %v must be positive", c.DefaultPrefillTokensPerSecond)
	case !(c.DefaultDecodeStepSeconds > 0) || math.IsInf(c.DefaultDecodeStepSeconds, 0):
		return bad("DefaultDecodeStepSeconds %v must be positive", c.DefaultDecodeStepSeconds)
	case !(c.DecodeBatchShare <= 1) || math.IsInf(c.DecodeBatchShare, 0):
		return bad("DecodeBatchShare %v must be at most 1", c.DecodeBatchShare)
	case !finiteNonNeg(c.GateSlackFactor):
		return bad("GateSlackFactor %v must be finite and non-negative", c.GateSlackFactor)
	case c.GateMaxSlack < 0:
		return bad("GateMaxSlack %v is negative", c.GateMaxSlack)
	case !(c.PrefixHomeShare > 0 && c.PrefixHomeShare <= 1):
		return bad("PrefixHomeShare %v not in (0,1]", c.PrefixHomeShare)
	case !finite(c.Epsilon):
		return bad("Epsilon %v must be finite", c.Epsilon)
	case c.HomeBalance < 0 || math.IsNaN(c.HomeBalance):
		return bad("HomeBalance %v must not be negative", c.HomeBalance)
	case c.MaxSessions < 0:
		return bad("MaxSessions %d is negative", c.MaxSessions)
	case c.ReservationTTL < 0:
		return bad("ReservationTTL %v is negative", c.ReservationTTL)
	case c.MaxReservationsPerPeer < 0:
		return bad("MaxReservationsPerPeer %d is negative", c.MaxReservationsPerPeer)
	case c.PrefillBusyQueuedPrefillTokens < 0:
		return bad("PrefillBusyQueuedPrefillTokens %d is negative", c.PrefillBusyQueuedPrefillTokens)
	case c.SplitMinTokens < 0:
		return bad("SplitMinTokens %d is negative", c.SplitMinTokens)
	case c.KVBytesPerToken < 0:
		return bad("KVBytesPerToken %d is negative", c.KVBytesPerToken)
	case !(c.LinkGBps > 0) || math.IsInf(c.LinkGBps, 0):
		return bad("LinkGBps %v must be positive", c.LinkGBps)
	}
	return nil
}

// Validate reports whether c is a valid Config once its zero fields are filled, as New and
// SetConfig would find it.
func (c Config) Validate() error { return c.fill() }

// liveConfig is a policy's Config, replaced whole by SetConfig while the policy runs, never
// changed in place: Route loads it once for its filters, scores and gate.
type liveConfig struct {
	p atomic.Pointer[Config]
}

// init stores the filled and validated cfg New was given.
func (l *liveConfig) init(cfg Config) { l.p.Store(&cfg) }

func (l *liveConfig) conf() *Config { return l.p.Load() }

// Config returns the configuration in use, defaults filled.
func (l *liveConfig) Config() Config { return *l.conf() }

// SetConfig replaces the configuration while the policy runs: thresholds, weights, the gate,
// the tie-break's epsilon, reservation timing and the rest take effect from the next decision.
// Seed and MaxSessions keep the values the policy was built with (its random source and
// session table stay). An invalid cfg is an error and changes nothing.
func (l *liveConfig) SetConfig(cfg Config) error {
	if err := cfg.fill(); err != nil {
		return err
	}
	old := l.conf()
	cfg.Seed, cfg.MaxSessions = old.Seed, old.MaxSessions
	l.p.Store(&cfg)
	return nil
}
