package gossip

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
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
)

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

// State is the record a node publishes about itself (DESIGN.md, Gossip): identity and
// addresses, the models it serves, its engine's load in the units that run out, its GPU and
// its grid's carbon intensity. Gossip sets BootID and Seq on publish.
type State struct {
	Name string
	// HTTPAddr and QUICAddr are where peers reach this node's API and forward port.
	HTTPAddr   string
	QUICAddr   string
	Models     []ModelInfo
	Role       string
	EngineKind string
	// HalvesOnly: a node in the decode role that runs decode halves only, never a request
	// whole (its route.decode_local_prefill off), so that no ingress offers it one. Records
	// without it (older nodes') say a decode node runs whole requests, as they did by default.
	HalvesOnly bool

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
	// Seq increases with every record a process publishes.
	Seq uint64
}

// Field tags. Never reuse a number; add new fields with new tags.
const (
	tagName = iota + 1
	tagHTTPAddr
	tagQUICAddr
	tagModel
	tagRole
	tagEngineKind
	tagEngineHealthy
	tagBlockTokens
	tagKVBlocksTotal
	tagKVBlocksUsed
	tagHitRate
	tagRunning
	tagWaiting
	tagQueuedPrefillTokens
	tagInFlightTokens
	tagPrefillTokensPerSecond
	tagDecodeStepSeconds
	tagMaxRunning
	tagPowerWatts
	tagPowerCapWatts
	tagTempC
	tagVRAMTotalBytes
	tagVRAMUsedBytes
	tagVendor
	tagGPUName
	tagCarbonIntensity
	tagCarbonZone
	tagCarbonAgeSeconds
	tagCarbonStale
	tagSoftwareVersion
	tagBootID
	tagSeq
	tagAgents
	tagAgentKeys
	tagPriorityScheduling
	tagQueuedBeforeHigh
	tagQueuedLowWaiting
	tagKeyUsage
	tagClaim
	tagHalvesOnly
	tagLast = tagHalvesOnly
)

const (
	claimTagPeer     = 1
	claimTagBlocks   = 2
	claimTagPriority = 3
	claimTagArrived  = 4 // Unix milliseconds
)

const (
	modelTagName          = 1
	modelTagCtx           = 2
	modelTagBytesPerToken = 3
)

// EncodeState returns s's encoding: the version byte, then (uvarint tag, uvarint length,
// value) per non-zero field. Strings are raw bytes, ints zigzag varints, uint64 counts
// uvarints, floats 8 little-endian IEEE bytes, bools one byte, a model a nested field list.
func EncodeState(s State) ([]byte, error) { return AppendState(make([]byte, 0, 256), s) }

// AppendState appends s's encoding to b.
func AppendState(b []byte, s State) ([]byte, error) {
	if len(s.Models) > maxModels {
		return b, fmt.Errorf("%w: %d models", ErrMalformed, len(s.Models))
	}
	start := len(b)
	e := enc{b: append(b, StateVersion)}
	e.str(tagName, s.Name)
	e.str(tagHTTPAddr, s.HTTPAddr)
	e.str(tagQUICAddr, s.QUICAddr)
	for _, m := range s.Models {
		var me enc
		me.str(modelTagName, m.Name)
		me.int(modelTagCtx, m.ContextTokens)
		me.float(modelTagBytesPerToken, m.BytesPerToken)
		e.field(tagModel, me.b)
		e.err = errors.Join(e.err, me.err)
	}
	e.str(tagRole, s.Role)
	e.str(tagEngineKind, s.EngineKind)
	e.bool(tagHalvesOnly, s.HalvesOnly)
	e.bool(tagEngineHealthy, s.EngineHealthy)
	e.int(tagBlockTokens, s.BlockTokens)
	e.int(tagKVBlocksTotal, s.KVBlocksTotal)
	e.int(tagKVBlocksUsed, s.KVBlocksUsed)
	e.float(tagHitRate, s.HitRate)
	e.int(tagRunning, s.Running)
	e.int(tagWaiting, s.Waiting)
	e.int(tagQueuedPrefillTokens, s.QueuedPrefillTokens)
	e.bool(tagPriorityScheduling, s.PriorityScheduling)
	e.int(tagQueuedBeforeHigh, s.QueuedBeforeHigh)
	e.int(tagQueuedLowWaiting, s.QueuedLowWaiting)
	if len(s.KeyUsage) > 0 {
		if len(s.KeyUsage) > MaxKeyUsage {
			return b, fmt.Errorf("%w: %d key usage entries", ErrMalformed, len(s.KeyUsage))
		}
		v := make([]byte, 0, 16*len(s.KeyUsage))
		for _, u := range s.KeyUsage {
			v = binary.LittleEndian.AppendUint64(v, u.ID)
			v = binary.LittleEndian.AppendUint64(v, math.Float64bits(u.TokensPerSecond))
		}
		e.field(tagKeyUsage, v)
	}
	if len(s.Claims) > MaxClaims {
		return b, fmt.Errorf("%w: %d claims", ErrMalformed, len(s.Claims))
	}
	for _, c := range s.Claims {
		var ce enc
		ce.str(claimTagPeer, c.Peer)
		ce.int(claimTagBlocks, c.Blocks)
		ce.int(claimTagPriority, c.Priority)
		if !c.Arrived.IsZero() {
			ce.int(claimTagArrived, int(c.Arrived.UnixMilli()))
		}
		e.field(tagClaim, ce.b)
		e.err = errors.Join(e.err, ce.err)
	}
	e.int(tagInFlightTokens, s.InFlightTokens)
	e.float(tagPrefillTokensPerSecond, s.PrefillTokensPerSecond)
	e.float(tagDecodeStepSeconds, s.DecodeStepSeconds)
	e.int(tagMaxRunning, s.MaxRunning)
	e.float(tagPowerWatts, s.PowerWatts)
	e.float(tagPowerCapWatts, s.PowerCapWatts)
	e.float(tagTempC, s.TempC)
	e.uint(tagVRAMTotalBytes, s.VRAMTotalBytes)
	e.uint(tagVRAMUsedBytes, s.VRAMUsedBytes)
	e.str(tagVendor, s.Vendor)
	e.str(tagGPUName, s.GPUName)
	e.float(tagCarbonIntensity, s.CarbonIntensity)
	e.str(tagCarbonZone, s.CarbonZone)
	e.float(tagCarbonAgeSeconds, s.CarbonAgeSeconds)
	e.bool(tagCarbonStale, s.CarbonStale)
	e.str(tagSoftwareVersion, s.SoftwareVersion)
	if s.BootID != 0 {
		e.field(tagBootID, binary.LittleEndian.AppendUint64(nil, s.BootID))
	}
	e.uint(tagSeq, s.Seq)
	e.int(tagAgents, s.Agents)
	if len(s.AgentKeys) > 0 {
		if err := checkAgentKeys(len(s.AgentKeys), func(i int) uint64 { return s.AgentKeys[i] }); err != nil {
			return b, err
		}
		v := make([]byte, 0, 8*len(s.AgentKeys))
		for _, k := range s.AgentKeys {
			v = binary.LittleEndian.AppendUint64(v, k)
		}
		e.field(tagAgentKeys, v)
	}
	if e.err != nil {
		return b, e.err
	}
	if len(e.b)-start > MaxStateBytes {
		return b, fmt.Errorf("%w: record of %d bytes", ErrMalformed, len(e.b)-start)
	}
	return e.b, nil
}

type enc struct {
	b   []byte
	err error
}

func (e *enc) field(tag int, v []byte) {
	e.b = binary.AppendUvarint(e.b, uint64(tag))
	e.b = binary.AppendUvarint(e.b, uint64(len(v)))
	e.b = append(e.b, v...)
}

func (e *enc) str(tag int, s string) {
	if s == "" {
		return
	}
	if len(s) > maxStringBytes {
		e.err = errors.Join(e.err, fmt.Errorf("%w: field %d is %d bytes", ErrMalformed, tag, len(s)))
		return
	}
	e.b = binary.AppendUvarint(e.b, uint64(tag))
	e.b = binary.AppendUvarint(e.b, uint64(len(s)))
	e.b = append(e.b, s...)
}

func (e *enc) int(tag, v int) {
	if v != 0 {
		e.field(tag, binary.AppendVarint(nil, int64(v)))
	}
}

func (e *enc) uint(tag int, v uint64) {
	if v != 0 {
		e.field(tag, binary.AppendUvarint(nil, v))
	}
}

func (e *enc) float(tag int, v float64) {
	if math.Float64bits(v) != 0 {
		e.field(tag, binary.LittleEndian.AppendUint64(nil, math.Float64bits(v)))
	}
}

func (e *enc) bool(tag int, v bool) {
	if v {
		e.field(tag, []byte{1})
	}
}

// DecodeState decodes a record that fills b exactly. Unknown tags are skipped; a known tag
// twice (other than Model and Claim), a wrong-sized value or a different major version is an error. It
// never panics.
func DecodeState(b []byte) (State, error) {
	var s State
	if len(b) == 0 {
		return s, fmt.Errorf("%w: empty record", ErrMalformed)
	}
	if b[0] != StateVersion {
		return s, fmt.Errorf("%w: state %d", ErrVersion, b[0])
	}
	if len(b) > MaxStateBytes {
		return s, fmt.Errorf("%w: record of %d bytes", ErrMalformed, len(b))
	}
	var seen [tagLast + 1]bool
	err := fields(b[1:], func(tag uint64, v []byte) error {
		if tag <= tagLast {
			if seen[tag] && tag != tagModel && tag != tagClaim {
				return fmt.Errorf("%w: duplicate field %d", ErrMalformed, tag)
			}
			seen[tag] = true
		}
		var err error
		switch tag {
		case tagName:
			s.Name, err = str(v)
		case tagHTTPAddr:
			s.HTTPAddr, err = str(v)
		case tagQUICAddr:
			s.QUICAddr, err = str(v)
		case tagModel:
			if len(s.Models) == maxModels {
				return fmt.Errorf("%w: more than %d models", ErrMalformed, maxModels)
			}
			var m ModelInfo
			err = decodeModel(v, &m)
			s.Models = append(s.Models, m)
		case tagRole:
			s.Role, err = str(v)
		case tagEngineKind:
			s.EngineKind, err = str(v)
		case tagHalvesOnly:
			s.HalvesOnly, err = boolean(v)
		case tagEngineHealthy:
			s.EngineHealthy, err = boolean(v)
		case tagBlockTokens:
			s.BlockTokens, err = integer(v)
		case tagKVBlocksTotal:
			s.KVBlocksTotal, err = integer(v)
		case tagKVBlocksUsed:
			s.KVBlocksUsed, err = integer(v)
		case tagHitRate:
			s.HitRate, err = float(v)
		case tagRunning:
			s.Running, err = integer(v)
		case tagWaiting:
			s.Waiting, err = integer(v)
		case tagQueuedPrefillTokens:
			s.QueuedPrefillTokens, err = integer(v)
		case tagPriorityScheduling:
			s.PriorityScheduling, err = boolean(v)
		case tagQueuedBeforeHigh:
			s.QueuedBeforeHigh, err = integer(v)
		case tagQueuedLowWaiting:
			s.QueuedLowWaiting, err = integer(v)
		case tagKeyUsage:
			s.KeyUsage, err = keyUsage(v)
		case tagClaim:
			if len(s.Claims) == MaxClaims {
				return fmt.Errorf("%w: more than %d claims", ErrMalformed, MaxClaims)
			}
			var c Claim
			err = decodeClaim(v, &c)
			s.Claims = append(s.Claims, c)
		case tagInFlightTokens:
			s.InFlightTokens, err = integer(v)
		case tagPrefillTokensPerSecond:
			s.PrefillTokensPerSecond, err = float(v)
		case tagDecodeStepSeconds:
			s.DecodeStepSeconds, err = float(v)
		case tagMaxRunning:
			s.MaxRunning, err = integer(v)
		case tagPowerWatts:
			s.PowerWatts, err = float(v)
		case tagPowerCapWatts:
			s.PowerCapWatts, err = float(v)
		case tagTempC:
			s.TempC, err = float(v)
		case tagVRAMTotalBytes:
			s.VRAMTotalBytes, err = unsigned(v)
		case tagVRAMUsedBytes:
			s.VRAMUsedBytes, err = unsigned(v)
		case tagVendor:
			s.Vendor, err = str(v)
		case tagGPUName:
			s.GPUName, err = str(v)
		case tagCarbonIntensity:
			s.CarbonIntensity, err = float(v)
		case tagCarbonZone:
			s.CarbonZone, err = str(v)
		case tagCarbonAgeSeconds:
			s.CarbonAgeSeconds, err = float(v)
		case tagCarbonStale:
			s.CarbonStale, err = boolean(v)
		case tagSoftwareVersion:
			s.SoftwareVersion, err = str(v)
		case tagBootID:
			if len(v) != 8 {
				return fmt.Errorf("%w: boot id of %d bytes", ErrMalformed, len(v))
			}
			s.BootID = binary.LittleEndian.Uint64(v)
		case tagSeq:
			s.Seq, err = unsigned(v)
		case tagAgents:
			s.Agents, err = integer(v)
		case tagAgentKeys:
			s.AgentKeys, err = agentKeys(v)
		}
		if err != nil {
			return fmt.Errorf("field %d: %w", tag, err)
		}
		return nil
	})
	if err != nil {
		return State{}, err
	}
	return s, nil
}

// keyUsage decodes 16 bytes an entry (id, then tokens per second as float64 bits, little
// endian), at most MaxKeyUsage, each rate finite and not negative.
func keyUsage(v []byte) ([]KeyUsage, error) {
	if len(v)%16 != 0 || len(v)/16 > MaxKeyUsage || len(v) == 0 {
		return nil, fmt.Errorf("%w: key usage of %d bytes", ErrMalformed, len(v))
	}
	out := make([]KeyUsage, len(v)/16)
	for i := range out {
		out[i].ID = binary.LittleEndian.Uint64(v[16*i:])
		out[i].TokensPerSecond = math.Float64frombits(binary.LittleEndian.Uint64(v[16*i+8:]))
		if r := out[i].TokensPerSecond; !(r >= 0) || math.IsInf(r, 0) {
			return nil, fmt.Errorf("%w: key usage rate %v", ErrMalformed, r)
		}
	}
	return out, nil
}

// checkAgentKeys checks n keys for the bound and strictly ascending order.
func checkAgentKeys(n int, key func(int) uint64) error {
	if n > MaxAgentKeys {
		return fmt.Errorf("%w: %d agent keys", ErrMalformed, n)
	}
	for i := 1; i < n; i++ {
		if key(i) <= key(i-1) {
			return fmt.Errorf("%w: agent keys not ascending", ErrMalformed)
		}
	}
	return nil
}

// agentKeys decodes 8 little-endian bytes per key, at most MaxAgentKeys, strictly ascending.
func agentKeys(v []byte) ([]uint64, error) {
	if len(v) == 0 || len(v)%8 != 0 {
		return nil, fmt.Errorf("%w: agent keys of %d bytes", ErrMalformed, len(v))
	}
	key := func(i int) uint64 { return binary.LittleEndian.Uint64(v[8*i:]) }
	if err := checkAgentKeys(len(v)/8, key); err != nil {
		return nil, err
	}
	out := make([]uint64, len(v)/8)
	for i := range out {
		out[i] = key(i)
	}
	return out, nil
}

func decodeModel(b []byte, m *ModelInfo) error {
	var seen [4]bool
	return fields(b, func(tag uint64, v []byte) error {
		if tag < uint64(len(seen)) {
			if seen[tag] {
				return fmt.Errorf("%w: duplicate model field %d", ErrMalformed, tag)
			}
			seen[tag] = true
		}
		var err error
		switch tag {
		case modelTagName:
			m.Name, err = str(v)
		case modelTagCtx:
			m.ContextTokens, err = integer(v)
		case modelTagBytesPerToken:
			if m.BytesPerToken, err = float(v); err == nil && !(m.BytesPerToken >= 0 && m.BytesPerToken <= 64) {
				err = fmt.Errorf("%w: bytes per token %v", ErrMalformed, m.BytesPerToken)
			}
		}
		return err
	})
}

// decodeClaim decodes one claim: a peer's name, a block count in 1..MaxClaimBlocks, a
// priority and an arrival.
func decodeClaim(b []byte, c *Claim) error {
	var seen [5]bool
	err := fields(b, func(tag uint64, v []byte) error {
		if tag < uint64(len(seen)) {
			if seen[tag] {
				return fmt.Errorf("%w: duplicate claim field %d", ErrMalformed, tag)
			}
			seen[tag] = true
		}
		var err error
		switch tag {
		case claimTagPeer:
			c.Peer, err = str(v)
		case claimTagBlocks:
			c.Blocks, err = integer(v)
		case claimTagPriority:
			c.Priority, err = integer(v)
		case claimTagArrived:
			var ms int
			if ms, err = integer(v); err == nil {
				c.Arrived = time.UnixMilli(int64(ms))
			}
		}
		return err
	})
	if err == nil && (c.Peer == "" || c.Blocks <= 0 || c.Blocks > MaxClaimBlocks) {
		err = fmt.Errorf("%w: claim of %d blocks on %q", ErrMalformed, c.Blocks, c.Peer)
	}
	return err
}

// fields walks a tag-length-value list that must end exactly at the end of b.
func fields(b []byte, f func(tag uint64, v []byte) error) error {
	for len(b) > 0 {
		tag, n := binary.Uvarint(b)
		if n <= 0 || tag == 0 {
			return fmt.Errorf("%w: bad tag", ErrMalformed)
		}
		b = b[n:]
		l, n := binary.Uvarint(b)
		if n <= 0 || l > uint64(len(b)-n) {
			return fmt.Errorf("%w: field %d length", ErrMalformed, tag)
		}
		b = b[n:]
		if err := f(tag, b[:l]); err != nil {
			return err
		}
		b = b[l:]
	}
	return nil
}

func str(v []byte) (string, error) {
	if len(v) > maxStringBytes {
		return "", fmt.Errorf("%w: string of %d bytes", ErrMalformed, len(v))
	}
	return string(v), nil
}

func integer(v []byte) (int, error) {
	x, n := binary.Varint(v)
	if n <= 0 || n != len(v) || x > math.MaxInt || x < math.MinInt {
		return 0, fmt.Errorf("%w: integer", ErrMalformed)
	}
	return int(x), nil
}

func unsigned(v []byte) (uint64, error) {
	x, n := binary.Uvarint(v)
	if n <= 0 || n != len(v) {
		return 0, fmt.Errorf("%w: unsigned", ErrMalformed)
	}
	return x, nil
}

func float(v []byte) (float64, error) {
	if len(v) != 8 {
		return 0, fmt.Errorf("%w: float of %d bytes", ErrMalformed, len(v))
	}
	return math.Float64frombits(binary.LittleEndian.Uint64(v)), nil
}

func boolean(v []byte) (bool, error) {
	if len(v) != 1 || v[0] > 1 {
		return false, fmt.Errorf("%w: bool", ErrMalformed)
	}
	return v[0] == 1, nil
}
