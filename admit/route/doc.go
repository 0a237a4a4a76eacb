// Package route decides where a request runs: it filters the mesh's peers, scores the
// survivors on cached prefix and load, applies a load gate on predicted TTFT, and breaks
// near-ties in a way that spreads. Admission (package admit) asks it "where" before it says
// yes, and uses each candidate's predicted TTFT and TPOT for SLO feasibility.
//
// It is a pure library: std, kvindex and its hash (xxhash) only, no sockets, no goroutines,
// time passed in.
//
// # Filters
//
// In order, each dropped peer counted under one Reason (Router.Counts, and the
// *NoCandidateError when none survives):
//
//  1. model: the peer serves Request.Model.
//  2. stale: Age > MaxAge (or the peer's own, longer MaxAge) or Stale; dropped under StaleClosed, kept at its last load under
//     StaleOpen. The Self peer is never stale.
//  3. unhealthy: the peer's engine reports unhealthy.
//  4. ejected: forwards to the peer failed at the transport lately (Peer.Ejected, set by the
//     node from its Ejector: Failures in a row eject a peer for Backoff, doubling to
//     MaxBackoff, until a forward succeeds).
//  5. capability: ModelBytes[model] ≤ VRAMTotalBytes, vendor in ModelVendors[model], role in
//     Roles (each check skipped when unconfigured or unknown).
//
// Filters 1–5 read a peer's record alone: they are one list (filter), run in that order by
// Route and by the pair's searches (PairSearch), the capability filter asking whether the
// peer's role runs the part asked of it (a whole request, or one half). The busy test is each
// search's own, since each part costs a peer differently; the power cap and thermal limit
// (7, 8) weigh a peer against the other survivors of the same search, in every search.
//
//  6. busy: (KVBlocksUsed + reserved blocks + the request's new blocks)/KVBlocksTotal >
//     BusyKVUse on a peer using any blocks (new blocks: its uncached prompt and MaxTokens), or
//     Waiting ≥ BusyWaiting, or QueuedPrefillTokens + reserved prefill tokens >
//     BusyQueuedPrefillTokens, or the peer's owner refused a request of this priority or
//     higher since its last record (Refused). Skipped for Request.KeepBusy (a node with no
//     waiting room, where the engine's queue is the only place to wait).
//  7. power_cap: PowerWatts ≥ PowerCapFraction × PowerCapWatts, dropped only if some other
//     survivor is under its cap and below the thermal hard limit.
//  8. thermal: TempC ≥ ThermalHardC.
//
// Every filter runs before scoring, so a peer of another model, an incapable one and a busy
// one (its KV test counts its cached prefix: a busy peer holding none cannot take the request)
// are never scored. The node passes only the model's peers and itself (gossip's index by
// model), so a decision costs the model's peers, not the mesh's; given the whole mesh, a peer
// of another model costs a string comparison (BenchmarkRoute1024Peers100Model).
//
// NoCandidateError.NoHost (no peer serves the model: 503 no_capacity) is told apart from
// NoCandidateError.Busy (hosts exist but are loaded, ejected or hot: queue or 429).
//
// # Score
//
// With prompt tokens P, cached tokens C = min(PrefixBlocks × BlockTokens, P), token load
// L = QueuedPrefillTokens + InFlightTokens + reserved prefill tokens:
//
//	score = Wprefix·C/P − Wload·L/(L+LoadHalfTokens) + Wkv·freeKV + Wpower·(1 − W/cap) − Wthermal·hot
//
// freeKV counts reserved blocks as used; hot rises linearly from 0 at ThermalSoftC to 1 at
// ThermalHardC; unknown KV or power capacity scores 0.5 (neutral).
//
// # Predicted latency
//
//	TTFT = (QueuedPrefillTokens + reserved prefill + P − C) / PrefillTokensPerSecond + DecodeStepSeconds
//	TPOT = DecodeStepSeconds × (1 − s + s·batch/max(Running,1)),  batch = Running + reserved requests + 1
//
// where s is DecodeBatchShare and batch is capped at MaxRunning when known. Defaults stand in
// for peers that report no rates.
//
// # Load gate
//
// After scoring (and in place of the locality rule's gating when that decides nothing), on
// predicted TTFT only, so no weight can switch it off: with saved(c) =
// C(c)/PrefillTokensPerSecond(c), the time c's cached prefix saves,
//
//	c is gated  ⇔  TTFT(c) − min_{d≠c} TTFT(d) > min(GateSlackFactor·saved(c), GateMaxSlack) + GateTolerance
//
// Gated candidates go behind every ungated one (Candidate.Gated), fastest first. The fastest candidate is
// never gated, so the first candidate is always ungated: a prefix holder whose queue costs
// more than its cache saves loses the request to the fastest other peer whatever the weights.
//
// # Locality
//
// A request with a TTFT target (Request.TTFTTarget, which the planner sets to its SLO less
// the time it has waited) has prefix homes: the peers, busy or not, holding its longest
// cached prefix, when that is at least PrefixHomeMinTokens. A peer meets the target when its
// predicted TTFT is within PrefixHomeShare of it (and its TPOT within TPOTTarget). A home
// that meets it keeps the request when the load gate would keep it against the others, or
// when its decodes keep Request.StepTPOTTarget beside its queue (Candidate.SharedTPOT: a
// chunked step carries up to Config.StepTokens of the queued prefill): the other candidates
// go behind it, gated (fallbacks for a home that refuses or fails; the planner marks them so
// that admission does not choose them), and while every home is busy, by its queue or its
// KV, they are dropped (counted busy), so the request waits in the room for one. A home that
// meets it but that the gate would move, its decodes past the step target, leaves the load
// gate to decide. When no home meets it, the request spills to the candidates that relieve
// the homes (they meet it, sooner than the fastest home by more than the gate's slack),
// every other gated, by score (the prefix leads: the peer holding most of the prefix first);
// the peer that takes it is a second home. When nobody relieves them, a home meeting the
// whole target keeps a request no other candidate serves with the margin, or only barely
// sooner; else the load gate decides. Candidate.Terms.Spill is the prefix a candidate lacks
// against the home: its recompute, and the KV of other prompts storing it evicts.
// A prompt of at least PrefixHomeMinTokens whose prefix no peer holds (cold) goes to the first
// candidate in its head's rendezvous order (Request.Blocks; the key is the block holding its
// PrefixHomeMinTokens-th token) that a home would keep, the others gated behind it, so every
// ingress places a cold prefix on the same peer and it returns there after an eviction; when
// none would keep it, the load gate decides.
// Without a target, for an agent's step and for KeepBusy, the rule is off.
//
// # Tie-break and sessions
//
// If the request's Session last went to a peer that is an ungated candidate, that peer goes
// first (Sticky). Otherwise among the ungated candidates within Epsilon of the best score, two
// are drawn at random (seeded by Config.Seed) and the one with the lower token load goes
// first. Route records session → first candidate in a bounded LRU; Stick corrects it when
// dispatch ends elsewhere.
//
// # Agent homes
//
// A StayHome request (a step of an agent under agent-level admission) goes to its agent's
// home, first and Sticky whatever the filters and the gate say of it. Among the healthy peers
// serving the model: a peer advertising the agent (Peer.AgentKeys, AgentKey of its id) is the
// home, so an agent never moves while its home is healthy (several advertising: the first in
// the agent's rendezvous order, PreferredHome, which the node keeps the agent on and the
// others release it); else the peer this node last sent the agent to; else,
// for a new agent, the first peer in the agent's rendezvous order whose agent load (Peer.Agents
// plus this node's placements it does not advertise yet) is under
// ceil((1+HomeBalance)·(total+1)/peers). A placement counts until its home advertises the
// agent or ReservationTTL passes, renewed while the step is routed again.
//
// # Reservations
//
// Gossip is late. After dispatching, the node calls Reserve(now, peer, uncached prompt tokens,
// KV blocks); the reservation counts in that peer's busy check, load, free KV and predicted
// latency until Observe(peer, t) reports a record received at t ≥ dispatch + ObserveMargin,
// until ReservationTTL, or until Release. A burst of requests in the same millisecond so sees
// each earlier pick's load and spreads over idle peers.
//
// # Retry budget
//
// A RetryBudget (NewRetryBudget, from Config.RetryBudget; the Router does not read it) bounds
// the node's forwards after a failed one to MinRetries plus Ratio times its requests over the
// last Window, like Envoy's retry budget, so that failing peers cannot start a retry storm.
//
// # Policies
//
// NewPolicy builds kvmesh (the Router) or a comparison baseline: round-robin, least-load
// (fewest running+waiting requests), cache-aware (highest prefix match, by load when the best
// match is under CacheThreshold of the prompt; no busy filter, gate or reservations), random.
// Baselines apply only the model and ejection filters.
//
// docs/design/routing.md gives the reasoning behind the filters, the score and the defaults.
//
// # Concurrency
//
// A Router (and every Policy, an Ejector and a RetryBudget) is safe for concurrent use; one mutex guards
// reservations, sessions, counts and the random source; SetConfig swaps the configuration
// atomically under a running Route. Route does not allocate when dst has capacity for
// every peer and the request carries no new session. The zero Router is not usable: use New.
package route
