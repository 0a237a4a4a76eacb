package gossip

import (
	"errors"
	"time"
)

// StateVersion is the major version of the state record encoding. Fields are tagged, so a
// minor addition (a new tag) needs no bump: older nodes skip tags they do not know. A record of
// another major version is refused.
const StateVersion = 1

// Bounds on a decoded record, so a hostile peer cannot make a node allocate without limit.
const (
	MaxStateBytes  = 16 << 10
	maxModels      = 64
	maxStringBytes = 1024
	// MaxAgentKeys bounds State.AgentKeys: 64 keys of 8 bytes add 515 bytes to a record, so
	// the fullest record (under 400 bytes without them) stays well inside one 1,024-byte
	// broadcast (maxMessage) and memberlist's 1,400-byte UDP packet. A home with more agents
	// lists the most recently active: an agent's next step soon after its last is the one an
	// ingress that never routed it may see, and the ingress that did remembers the home.
	MaxAgentKeys = 64
	// MaxKeyUsage bounds State.KeyUsage: 8 entries of 16 bytes keep the fullest record, its
	// agent keys included, inside one broadcast. A node publishes its heaviest keys.
	MaxKeyUsage = 8
	// MaxClaims bounds State.Claims: one a waiting-room pool's blocked head, and a node has
	// a few pools (a model and role each); four claims on 32-byte names keep the fullest
	// record, agent keys included, inside one broadcast.
	MaxClaims = 4
	// MaxAdapters bounds State.Adapters: a node publishes its resident adapters first, then
	// the others its engine serves, by name. A record too large for one broadcast drops
	// adapters from the end (publish), as it drops claims.
	MaxAdapters = 16
)

// Adapter is a LoRA adapter a node's engine serves: Parent is its base model (one of the
// record's Models), Resident whether it holds one of the engine's GPU adapter slots.
type Adapter struct {
	Name     string `json:"name"`
	Parent   string `json:"parent"`
	Resident bool   `json:"resident"`
}

// Claim is the KV room a request waiting at a node's ingress holds on a peer (Peer, by name)
// until it fits there: Blocks, its whole need. Every other node counts it as used on Peer for
// the requests it outranks (Outranks: those that came after it), so the mesh, not only its
// ingress, stops filling the room a large request waits for, and of two claims on one peer the
// later waits for the earlier, not both for room for two.
type Claim struct {
	Peer   string `json:"peer"`
	Blocks int    `json:"blocks"`
	// Priority and Arrived (zero: unknown) rank the claiming request.
	Priority int       `json:"priority"`
	Arrived  time.Time `json:"arrived"`
}

// MaxClaimBlocks bounds Claim.Blocks, so that no sum of a record's claims overflows.
const MaxClaimBlocks = 1 << 30

// Outranks reports whether c's request goes before one of priority that arrived at arrived
// (zero: unknown): a higher priority, or the same and an earlier arrival. First come, first
// served within a band, as an engine's waiting queue is: ranked by deadline instead, a short
// request arriving after a long one (whose target counts its own prefill) would go first,
// and the long one would wait as it did without a claim.
func (c Claim) Outranks(priority int, arrived time.Time) bool {
	if c.Priority != priority {
		return c.Priority > priority
	}
	switch {
	case c.Arrived.IsZero():
		return false
	case arrived.IsZero():
		return true
	}
	return c.Arrived.Before(arrived)
}

// KeyUsage is what one rate-limited API key consumed through a node: ID, the first 8 bytes
// of the key's SHA-256, and tokens per second.
type KeyUsage struct {
	ID              uint64
	TokensPerSecond float64
}

// Decoding errors.
var (
	// ErrMalformed: truncated, trailing or duplicate fields, a wrong-sized value, an
	// out-of-range count.
	ErrMalformed = errors.New("gossip: malformed message")
	// ErrVersion: a major version this build does not speak.
	ErrVersion = errors.New("gossip: unknown message version")
)

// ModelInfo is one model a node serves. The JSON names are those of GET /v1/mesh/peers; the
// wire record is binary (EncodeState).
type ModelInfo struct {
	Name          string `json:"name"`
	ContextTokens int    `json:"context_tokens"`
	// BytesPerToken is the model's rendered-prompt bytes per engine token this node learned
	// from its engine (kvindex.Calibration); 0: not learned.
	BytesPerToken float64 `json:"bytes_per_token"`
}

// State is the record a node publishes about itself (docs/design/gossip.md): identity and
// addresses, the models it serves, its engine's load in the units that run out, its GPU and
// its grid's carbon intensity. Gossip sets BootID and Seq on publish.
type State struct {
	Name string
	// HTTPAddr and QUICAddr are where peers reach this node's API and forward port.
	HTTPAddr string
	QUICAddr string
	Models   []ModelInfo
	// Adapters are the LoRA adapters the engine serves, at most MaxAdapters, resident first.
	// LoRASlots is the engine's adapter slots (0: unknown or none), LoRAFree those no adapter
	// holds.
	Adapters            []Adapter
	LoRASlots, LoRAFree int
	Role                string
	EngineKind          string
	// HalvesOnly: a node in the decode role that runs decode halves only, never a request
	// whole (its route.decode_local_prefill off), so that no ingress offers it one. Records
	// without it (older nodes') say a decode node runs whole requests, as they did by default.
	HalvesOnly bool
	// MessagesNative: the node's engine serves the Anthropic Messages API natively, so an
	// ingress forwards a Messages request to it as the client sent it (EndpointMessages)
	// rather than translated to chat. Records without it (older nodes') say it does not.
	MessagesNative bool

	EngineHealthy       bool
	BlockTokens         int
	KVBlocksTotal       int
	KVBlocksUsed        int
	HitRate             float64
	Running             int
	Waiting             int
	QueuedPrefillTokens int
	// PriorityScheduling says the engine runs waiting work by priority (the embedded engine;
	// vLLM with --scheduling-policy priority): then only QueuedBeforeHigh is ahead of a high
	// request, and all but QueuedLowWaiting ahead of a normal one. Without it every queued
	// token is ahead of every request.
	PriorityScheduling                 bool
	QueuedBeforeHigh, QueuedLowWaiting int // of QueuedPrefillTokens (engine.State)
	InFlightTokens                     int
	// KeyUsage is what the heaviest rate-limited API keys consumed through this node, at most
	// MaxKeyUsage: every ingress takes the others' off its share of a key's rate.
	KeyUsage []KeyUsage
	// Claims are the KV room the blocked heads of this node's waiting room hold on peers, at
	// most MaxClaims.
	Claims                 []Claim
	PrefillTokensPerSecond float64
	DecodeStepSeconds      float64
	MaxRunning             int

	PowerWatts     float64
	PowerCapWatts  float64
	TempC          float64
	VRAMTotalBytes uint64
	VRAMUsedBytes  uint64
	Vendor         string
	GPUName        string

	// CarbonIntensity is in gCO2eq/kWh.
	CarbonIntensity  float64
	CarbonZone       string
	CarbonAgeSeconds float64
	CarbonStale      bool

	SoftwareVersion string

	// Agents is how many agents (agent-level admission) this node is home to; AgentKeys the
	// route.AgentKey of at most MaxAgentKeys of them, sorted ascending, without repeats.
	Agents    int
	AgentKeys []uint64

	// BootID is random per process, so a restart is told apart from a late message.
	BootID uint64
	// GossipAddr is the origin's gossip address (host:port) as memberlist advertises it; a
	// member's records whose GossipAddr is not the address memberlist holds for the member
	// come from another process with its name and are refused. Gossip sets it on publish;
	// empty in a record of a version before it, which is not checked.
	GossipAddr string
	// Seq increases with every record a process publishes.
	Seq uint64
}
