package admit

import (
	"cmp"
	"errors"
	"time"
)

// Sentinel errors.
var (
	// ErrConfig reports an invalid Config.
	ErrConfig = errors.New("admit: invalid config")
	// ErrQueueFull reports a Push refused by the waiting room's caps.
	ErrQueueFull = errors.New("admit: queue full")
	// ErrKeys reports an unparsable API key file.
	ErrKeys = errors.New("admit: invalid key file")
	// ErrHeader reports an unparsable request header value.
	ErrHeader = errors.New("admit: invalid header value")
)

// Request is what admission needs to know about one request. The node fills it from the
// decoded body and the X-Kvmesh-* headers.
type Request struct {
	ID    string
	Model string
	// Parent is the base model of the LoRA adapter Model names ("" for a base model's
	// request): routing runs it on the base model's nodes with adapter slots and weighs where
	// the adapter is resident (route.Request.Parent).
	Parent   string
	Role     string // pool role from routing ("prefill", "decode", "" = both)
	Endpoint string // "chat", "completions", "embeddings" or "responses"

	PromptTokens int
	// TokenScale is PromptTokens over the prompt's length in kvindex's tokens (≤ 0: 1): a
	// cached prefix of N kvindex tokens is N × TokenScale of the request's.
	TokenScale  float64
	MaxTokens   *int // nil: not given (a default is filled)
	N           *int
	StopCount   int
	Temperature *float64
	TopP        *float64
	// Logprobs is the number of top log-probabilities asked for (chat: top_logprobs when
	// logprobs is true; completions: logprobs); nil: none.
	Logprobs *int

	Priority int    // ParsePriority of X-Kvmesh-Priority; 0 when absent
	Tenant   string // trusted tenant (set by Identify; Admit uses it as given)
	APIKey   string // raw bearer key; only its SHA-256 is compared

	TTFTSLO time.Duration // 0: the priority class default, fitted to the request (OwnTTFT)
	TPOTSLO time.Duration // 0: the priority class default
	// OwnTTFT is how long the request's own uncached prompt takes to prefill at the measured
	// rate of the engines that could run it. A request that names no TTFT SLO gets its class's
	// target plus OwnTTFT (SLOFor), so a long prompt is judged on the work queued ahead of it,
	// not on its own size. The first decision fills it from its options (Decision.OwnTTFT);
	// the node keeps it for the request's later decisions.
	OwnTTFT  time.Duration
	QueueTTL time.Duration // 0: Queue.TTL; a larger value is cut to Queue.TTL
	Agent    string
	Arrived  time.Time // the queue TTL counts from here
	// SLOStart is when the TTFT SLO starts counting, for the feasibility checks and the
	// deadline order; zero means Arrived. The node sets it for an agent step that waited for
	// its agent's window (agent-level admission), to the moment the window let it in: that
	// wait is admission's own doing, bounded by the queue TTL, not service time.
	SLOStart time.Time
}

// PoolModel names the waiting room pool req waits in: its model, or for a LoRA adapter's
// request its base model, whose nodes prefill it and whose measured rate sizes the pool.
func (req *Request) PoolModel() string { return cmp.Or(req.Parent, req.Model) }

// SLOClock returns the instant r's TTFT SLO counts from: SLOStart if set, else Arrived.
func (r *Request) SLOClock() time.Time {
	if r.SLOStart.IsZero() {
		return r.Arrived
	}
	return r.SLOStart
}

// Action is what a Decision tells the node to do.
type Action uint8

// Actions.
const (
	Accept Action = iota // dispatch now to Decision.Option
	Queue                // put into the waiting room (WaitingRoom.Push)
	Refuse               // answer Status with Code now
)

func (a Action) String() string {
	switch a {
	case Accept:
		return "accept"
	case Queue:
		return "queue"
	default:
		return "refuse"
	}
}

// Layers, the bounded values of Decision.Layer (the "layer" metric label).
const (
	LayerValidation = "validation"
	LayerIdentity   = "identity"
	LayerBudget     = "budget"
	LayerRoute      = "route"
	LayerKV         = "kv"
	LayerQueue      = "queue"
	LayerPriority   = "priority"
	LayerSLO        = "slo"
)

// Codes, the bounded values of Decision.Code (the "reason" label and the OpenAI error code).
const (
	CodeInvalidParameter      = "invalid_parameter"
	CodeModelNotFound         = "model_not_found"
	CodeInvalidAPIKey         = "invalid_api_key"
	CodeRateLimited           = "rate_limited"
	CodeContextLengthExceeded = "context_length_exceeded"
	CodeNoCapacity            = "no_capacity"
	CodeKVBudget              = "kv_budget"
	CodeQueueFull             = "queue_full"
	CodeQueueTTLExpired       = "queue_ttl_expired"
	CodeSLOUnattainable       = "slo_unattainable"

	// Codes of non-refusals, for metrics.
	CodeAccepted     = "accepted"
	CodeWaitKV       = "wait_kv"     // queued: no candidate has KV room now
	CodeWaitBehind   = "wait_behind" // queued: equal or higher rank is already waiting
	CodeEvicted      = "evicted"     // message of a queue_full sent to an evicted waiter
	evictedMessage   = "evicted for higher-priority work, or for a tenant within its share of the queue"
	shedMessage      = "sheddable request shed: the queue for this model is busy"
	defaultTenant    = "default"
	maxPriorityValue = 1000
)

// Decision is one stage's verdict.
type Decision struct {
	Action     Action
	Status     int    // HTTP status of a refusal (0 otherwise)
	Code       string // stable reason (Code* constants)
	Message    string // human-readable, for the error body
	Param      string // the offending request field, if any
	RetryAfter time.Duration
	Layer      string // Layer* constant

	// Filled as the stages run.
	Tenant         string // tenant identified (Identify) or given (Admit)
	MaxTokens      int    // effective max_tokens after defaults (budget)
	ExpectedTokens int    // output tokens reserved for KV (≤ MaxTokens)
	Option         int    // index into options of the chosen candidate; -1 when none
	KVBlocks       int    // predicted KV blocks on the chosen candidate
	// PrefillTokens is the prompt less the longest prefix any candidate holds: the prefill
	// work the request brings, which the waiting room's token caps and fairness count.
	PrefillTokens int
	// OwnTTFT is Request.OwnTTFT as this decision used it (computed if the request had none).
	OwnTTFT time.Duration
	// Role is the room pool the decision counted in: RolePrefill for a request whose first
	// option was a pair, the request's own Role otherwise. Split: the chosen option is a pair.
	Role  string
	Split bool
	// Priority is the priority Identify grants: the one asked for, or its key's maximum when
	// it asked for more (PriorityClamped). The node runs the request at Priority.
	Priority        int
	PriorityClamped bool
}

// Refused reports whether d is a refusal.
func (d Decision) Refused() bool { return d.Action == Refuse }

// Option is one routing candidate as admission sees it, in routing's preference order.
type Option struct {
	Peer          string
	PredictedTTFT time.Duration // routing's estimate on this peer, cached prefix deducted
	PredictedTPOT time.Duration // routing's estimate of the peer's batch step time; 0: unknown
	// FreeKVBlocks are free after the peer's running and queued work and after this node's own
	// reservations on it since the peer's last state record.
	FreeKVBlocks  int
	TotalKVBlocks int // 0: unknown (then only FreeKVBlocks is checked)
	BlockTokens   int // ≤ 0: the model's block size
	CachedTokens  int // prompt tokens the peer already holds (longest cached prefix)
	// PrefillTokensPerSecond is the peer's measured prefill rate; summed over the options, it
	// prices the tokens queued ahead in the waiting room. 0: unknown (left out of the sum).
	PrefillTokensPerSecond float64
	// Split marks a split request's pair (docs/design/disaggregation.md): Peer is the prefill
	// node, and the request's KV is judged on Decode, the decode node's room forecast for when
	// the handover arrives (role.go), at the decode pool's marks. A request whose first option
	// is a pair waits in the prefill pool.
	Split  bool
	Decode DecodeForecast
	// Fallback marks an option routing keeps only for dispatch to move on to when the options
	// before it refuse or fail (a prefix home's fallbacks): admission neither chooses it nor
	// judges the request feasible on it, though its prefill rate still prices the room's queue.
	Fallback bool
}

// RetryAfterSeconds renders d for the Retry-After header: whole seconds, rounded up, at least 1.
func RetryAfterSeconds(d time.Duration) int {
	s := int((d + time.Second - 1) / time.Second)
	return max(s, 1)
}
