package gossip

import (
	"encoding/binary"
	"fmt"
	"math"
	"time"
)

// DecodeState decodes a record that fills b exactly. Unknown tags are skipped; a known tag
// twice (other than Model, Claim and Adapter), a wrong-sized value or a different major version is an
// error. It never panics.
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
		if err := s.checkField(tag, v, &seen); err != nil {
			return err
		}
		if err := s.decodeField(tag, v); err != nil {
			return fmt.Errorf("field %d: %w", tag, err)
		}
		return nil
	})
	if err != nil {
		return State{}, err
	}
	return s, nil
}

// checkField refuses a known field seen before (other than Model and Claim), a model or claim
// past the bounds and a boot id not of 8 bytes.
func (s *State) checkField(tag uint64, v []byte, seen *[tagLast + 1]bool) error {
	if tag <= tagLast {
		if seen[tag] && tag != tagModel && tag != tagClaim && tag != tagAdapter {
			return fmt.Errorf("%w: duplicate field %d", ErrMalformed, tag)
		}
		seen[tag] = true
	}
	switch {
	case tag == tagModel && len(s.Models) == maxModels:
		return fmt.Errorf("%w: more than %d models", ErrMalformed, maxModels)
	case tag == tagClaim && len(s.Claims) == MaxClaims:
		return fmt.Errorf("%w: more than %d claims", ErrMalformed, MaxClaims)
	case tag == tagAdapter && len(s.Adapters) == MaxAdapters:
		return fmt.Errorf("%w: more than %d adapters", ErrMalformed, MaxAdapters)
	case tag == tagBootID && len(v) != 8:
		return fmt.Errorf("%w: boot id of %d bytes", ErrMalformed, len(v))
	}
	return nil
}

// decodeField decodes one field checkField let through into s: identity and process here,
// the rest in decodeLoad and decodeHardware; an unknown tag is skipped.
func (s *State) decodeField(tag uint64, v []byte) (err error) {
	switch tag {
	case tagName:
		s.Name, err = str(v)
	case tagHTTPAddr:
		s.HTTPAddr, err = str(v)
	case tagQUICAddr:
		s.QUICAddr, err = str(v)
	case tagModel:
		var m ModelInfo
		err = decodeModel(v, &m)
		s.Models = append(s.Models, m)
	case tagAdapter:
		var a Adapter
		err = decodeAdapter(v, &a)
		s.Adapters = append(s.Adapters, a)
	case tagLoRASlots:
		s.LoRASlots, err = integer(v)
	case tagLoRAFree:
		s.LoRAFree, err = integer(v)
	case tagRole:
		s.Role, err = str(v)
	case tagEngineKind:
		s.EngineKind, err = str(v)
	case tagHalvesOnly:
		s.HalvesOnly, err = boolean(v)
	case tagMessagesNative:
		s.MessagesNative, err = boolean(v)
	case tagGossipAddr:
		s.GossipAddr, err = str(v)
	case tagSoftwareVersion:
		s.SoftwareVersion, err = str(v)
	case tagBootID:
		s.BootID = binary.LittleEndian.Uint64(v)
	case tagSeq:
		s.Seq, err = unsigned(v)
	case tagAgents:
		s.Agents, err = integer(v)
	case tagAgentKeys:
		s.AgentKeys, err = agentKeys(v)
	default:
		return s.decodeLoad(tag, v)
	}
	return err
}

// decodeLoad decodes a field of the engine's load, the keys' usage or the claims.
func (s *State) decodeLoad(tag uint64, v []byte) (err error) {
	switch tag {
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
	default:
		return s.decodeHardware(tag, v)
	}
	return err
}

// decodeHardware decodes a field of the GPU or the grid's carbon; an unknown tag is skipped.
func (s *State) decodeHardware(tag uint64, v []byte) (err error) {
	switch tag {
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
	}
	return err
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

// decodeAdapter decodes one adapter's nested fields; unknown ones are skipped.
func decodeAdapter(b []byte, a *Adapter) error {
	var seen [adapterTagResident + 1]bool
	return fields(b, func(tag uint64, v []byte) (err error) {
		if tag <= adapterTagResident {
			if seen[tag] {
				return fmt.Errorf("%w: duplicate adapter field %d", ErrMalformed, tag)
			}
			seen[tag] = true
		}
		switch tag {
		case adapterTagName:
			a.Name, err = str(v)
		case adapterTagParent:
			a.Parent, err = str(v)
		case adapterTagResident:
			a.Resident, err = boolean(v)
		}
		return err
	})
}
