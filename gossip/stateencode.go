package gossip

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

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
	tagGossipAddr
	tagAdapter
	tagLoRASlots
	tagLoRAFree
	tagMessagesNative
	tagLast = tagMessagesNative
)

const (
	adapterTagName     = 1
	adapterTagParent   = 2
	adapterTagResident = 3
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
	if len(s.Adapters) > MaxAdapters {
		return b, fmt.Errorf("%w: %d adapters", ErrMalformed, len(s.Adapters))
	}
	start := len(b)
	e := enc{b: append(b, StateVersion)}
	e.identity(s)
	if err := e.load(s); err != nil {
		return b, err
	}
	e.hardware(s)
	if err := e.process(s); err != nil {
		return b, err
	}
	if e.err != nil {
		return b, e.err
	}
	if len(e.b)-start > MaxStateBytes {
		return b, fmt.Errorf("%w: record of %d bytes", ErrMalformed, len(e.b)-start)
	}
	return e.b, nil
}

// identity appends who the node is and what it serves.
func (e *enc) identity(s State) {
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
	for _, a := range s.Adapters {
		var ae enc
		ae.str(adapterTagName, a.Name)
		ae.str(adapterTagParent, a.Parent)
		ae.bool(adapterTagResident, a.Resident)
		e.field(tagAdapter, ae.b)
		e.err = errors.Join(e.err, ae.err)
	}
	e.int(tagLoRASlots, s.LoRASlots)
	e.int(tagLoRAFree, s.LoRAFree)
	e.str(tagRole, s.Role)
	e.str(tagEngineKind, s.EngineKind)
	e.bool(tagHalvesOnly, s.HalvesOnly)
	e.bool(tagMessagesNative, s.MessagesNative)
	e.str(tagGossipAddr, s.GossipAddr)
}

// load appends the engine's load, the keys' usage and the claims.
func (e *enc) load(s State) error {
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
			return fmt.Errorf("%w: %d key usage entries", ErrMalformed, len(s.KeyUsage))
		}
		v := make([]byte, 0, 16*len(s.KeyUsage))
		for _, u := range s.KeyUsage {
			v = binary.LittleEndian.AppendUint64(v, u.ID)
			v = binary.LittleEndian.AppendUint64(v, math.Float64bits(u.TokensPerSecond))
		}
		e.field(tagKeyUsage, v)
	}
	if len(s.Claims) > MaxClaims {
		return fmt.Errorf("%w: %d claims", ErrMalformed, len(s.Claims))
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
	return nil
}

// hardware appends the GPU, the grid's carbon and the software version.
func (e *enc) hardware(s State) {
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
}

// process appends the process's boot id and record number and its agents.
func (e *enc) process(s State) error {
	if s.BootID != 0 {
		e.field(tagBootID, binary.LittleEndian.AppendUint64(nil, s.BootID))
	}
	e.uint(tagSeq, s.Seq)
	e.int(tagAgents, s.Agents)
	if len(s.AgentKeys) > 0 {
		if err := checkAgentKeys(len(s.AgentKeys), func(i int) uint64 { return s.AgentKeys[i] }); err != nil {
			return err
		}
		v := make([]byte, 0, 8*len(s.AgentKeys))
		for _, k := range s.AgentKeys {
			v = binary.LittleEndian.AppendUint64(v, k)
		}
		e.field(tagAgentKeys, v)
	}
	return nil
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
