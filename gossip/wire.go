package gossip

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/kvmesh/kvmesh/kvindex"
)

// Wire envelope of every kvmesh gossip message: version byte, kind byte, body.
const (
	wireVersion = 1
	msgState    = 1
	msgDelta    = 2
	msgPushPull = 3
	msgRecord   = 4 // a state record sent straight to a domain member, not relayed
	msgConflict = 5 // a process that found its name taken, to the member that has it

	// maxMessage keeps every broadcast well inside one memberlist UDP packet (1400 bytes less
	// compound, label and encryption overhead); a larger broadcast would never be sent.
	maxMessage   = 1024
	maxNameBytes = 128
)

// Drop reasons, the label values of kvmesh_gossip_dropped_messages_total.
const (
	dropVersion       = "version"
	dropMalformed     = "malformed"
	dropType          = "unknown_type"
	dropUnknownMember = "unknown_member"
	dropDeadMember    = "dead_member"
	dropStaleBoot     = "stale_boot"
	dropBandwidth     = "bandwidth"
	dropOtherModel    = "other_model"
	dropNameConflict  = "name_conflict"
)

var dropReasons = []string{dropVersion, dropMalformed, dropType, dropUnknownMember, dropDeadMember, dropStaleBoot, dropBandwidth, dropOtherModel, dropNameConflict}

// packetOverhead is what a message sent on its own (each direct message goes in a packet of
// its own) costs besides its bytes: memberlist's message type and AES-GCM's version, nonce and
// tag. The budget counts it.
const packetOverhead = 2 + 29

// bytesOf is what msgs cost the budget sent to one member, their packets included.
func bytesOf(msgs [][]byte) int {
	n := 0
	for _, m := range msgs {
		n += len(m) + packetOverhead
	}
	return n
}

func deltaHeader(name string, boot uint64) []byte {
	b := []byte{wireVersion, msgDelta}
	b = binary.AppendUvarint(b, uint64(len(name)))
	b = append(b, name...)
	return binary.LittleEndian.AppendUint64(b, boot)
}

// decodeDelta parses a delta body (after the envelope): origin, boot id, summary.
func decodeDelta(b []byte) (string, uint64, kvindex.Summary, error) {
	l, n := binary.Uvarint(b)
	if n <= 0 || l == 0 || l > maxNameBytes || uint64(len(b)-n) < l+8 {
		return "", 0, kvindex.Summary{}, fmt.Errorf("%w: delta header", ErrMalformed)
	}
	name := string(b[n : n+int(l)])
	b = b[n+int(l):]
	boot := binary.LittleEndian.Uint64(b)
	s, err := kvindex.DecodeSummary(b[8:])
	if err != nil {
		return "", 0, s, err
	}
	if s.Snapshot || s.Seq == 0 || boot == 0 {
		return "", 0, s, fmt.Errorf("%w: delta fields", ErrMalformed)
	}
	return name, boot, s, nil
}

func reasonOf(err error) string {
	if errors.Is(err, ErrVersion) || errors.Is(err, kvindex.ErrVersion) {
		return dropVersion
	}
	return dropMalformed
}

// appendPushPull appends a push/pull body to b: the record's length and the record, then the
// snapshot.
func appendPushPull(b, rec []byte, snapshot kvindex.Summary) ([]byte, error) {
	b = binary.AppendUvarint(b, uint64(len(rec)))
	b = append(b, rec...)
	return snapshot.AppendBinary(b)
}

// decodePushPull parses a push/pull body (after the envelope): the record, then a snapshot.
func decodePushPull(b []byte) (State, kvindex.Summary, error) {
	l, n := binary.Uvarint(b)
	if n <= 0 || l > uint64(len(b)-n) {
		return State{}, kvindex.Summary{}, fmt.Errorf("%w: push/pull header", ErrMalformed)
	}
	rest := b[n:]
	st, err := DecodeState(rest[:l])
	if err != nil {
		return st, kvindex.Summary{}, err
	}
	s, err := kvindex.DecodeSummary(rest[l:])
	if err == nil && !s.Snapshot {
		err = fmt.Errorf("%w: push/pull without snapshot", ErrMalformed)
	}
	return st, s, err
}
