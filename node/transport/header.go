package transport

import (
	"encoding/binary"
	"fmt"
	"math"
	"time"
)

// headerField is one optional field of a header, and the one place that defines it: its tag,
// which kind's it is, how to tell it is set, and its value's encoding, the same in both frame
// versions. A new optional field is a new entry of headerFields (a new tag; never reuse one)
// and a test.
type headerField struct {
	// tag names the field in a Version header. An odd tag is required: a reader that does
	// not know it refuses the header as of an unknown kind (ErrKind), so the ingress tries
	// another peer; an even tag is optional: a reader that does not know it skips it, and runs
	// the request without it.
	tag uint64
	// flag is the field's bit in a PreviousVersion header's flags byte, which has its fields
	// in tag order; 0: that version cannot carry it (EncodeHeader drops it if optional and
	// refuses the header with ErrKind if required).
	flag byte
	kind Kind
	name string
	has  func(h *Header) bool
	put  func(e *encoder, h *Header)
	// get reads the value into h; it fails d for a value the encoder would not write.
	get func(d *decoder, h *Header)
}

// headerFields are the optional fields a header may carry, in ascending tag order.
var headerFields = []headerField{
	{tag: 1, flag: 1 << 0, name: "agent final", has: func(h *Header) bool { return h.AgentFinal },
		put: func(*encoder, *Header) {}, get: func(_ *decoder, h *Header) { h.AgentFinal = true }},
	{tag: 2, flag: 1 << 1, name: "trace context", has: func(h *Header) bool { return h.TraceParent != "" },
		put: func(e *encoder, h *Header) { e.str(h.TraceParent); e.str(h.TraceState) },
		get: func(d *decoder, h *Header) {
			h.TraceParent = d.str("trace parent", maxShortString)
			h.TraceState = d.str("trace state", maxShortString)
			if d.err == nil && h.TraceParent == "" {
				d.fail("empty trace parent") // the field is written only with one
			}
		}},
	{tag: 3, flag: 1 << 2, name: "resume", has: func(h *Header) bool { return h.Resume != nil },
		put: func(e *encoder, h *Header) {
			r := h.Resume
			e.b = binary.LittleEndian.AppendUint64(e.b, r.Seed)
			e.b = binary.LittleEndian.AppendUint64(e.b, r.PromptHash)
			e.uvarint(uint64(r.Tokens))
			e.uvarint(uint64(r.Bytes))
			e.uvarint(uint64(r.PromptTokens))
		},
		get: func(d *decoder, h *Header) { h.Resume = d.resume() }},
	{tag: 5, flag: 1 << 3, name: "prefill", has: func(h *Header) bool { return h.Prefill },
		put: func(*encoder, *Header) {}, get: func(_ *decoder, h *Header) { h.Prefill = true }},
	{tag: 7, flag: 1 << 4, name: "handover", has: func(h *Header) bool { return h.Handover != nil },
		put: func(e *encoder, h *Header) { e.b, _ = AppendHandover(e.b, h.Handover) }, // checked by checkHeader
		get: func(d *decoder, h *Header) {
			if h.Prefill {
				d.fail("a prefill with a handover")
			}
			h.Handover = d.handover()
		}},
	{tag: 8, flag: 1 << 5, name: "queue ttl", has: func(h *Header) bool { return h.QueueTTL != 0 },
		put: func(e *encoder, h *Header) { e.uvarint(uint64(h.QueueTTL)); e.uvarint(uint64(h.QueueTTLLeft)) },
		get: func(d *decoder, h *Header) {
			h.QueueTTL = d.duration("queue ttl")
			h.QueueTTLLeft = d.duration("queue ttl left")
			if d.err == nil && !(h.QueueTTLLeft > 0 && h.QueueTTLLeft <= h.QueueTTL) {
				d.fail("queue ttl %v with %v left", h.QueueTTL, h.QueueTTLLeft)
			}
		}},
	{tag: 10, name: "delegate", has: func(h *Header) bool { return h.Delegate != nil },
		put: func(e *encoder, h *Header) {
			var flags byte
			if h.Delegate.Explain {
				flags |= 1
			}
			e.b = append(e.b, flags)
		},
		get: func(d *decoder, h *Header) {
			if flags := d.u8("delegate flags"); d.err == nil && flags&^1 != 0 {
				d.fail("delegate flags %#x", flags)
			} else {
				h.Delegate = &Delegation{Explain: flags&1 != 0}
			}
		}},
}

// required reports whether a field of tag must be understood by its reader.
func required(tag uint64) bool { return tag&1 == 1 }

// EncodeHeader appends h's encoding to dst, in frame version h.Version (zero: Version). It
// rejects what DecodeHeader would reject, so a sender learns about an oversized header before
// the owner does.
//
// The encoding is the version byte, the kind byte, the common fields (request id, hops,
// priority, tenant, deadline, agent id, blocks, ingress), then the kind's own fixed fields: for
// KindRequest the endpoint byte, then Waited, TTFTSLO and TPOTSLO; for KindAgentRenew
// RenewWait; nothing for KindAgentGiveUp. Then come the optional fields that are set
// (headerFields), to the header's end, in ascending tag order: each a uvarint tag, a uvarint
// length and its value. Strings are a uvarint length and UTF-8 bytes, blocks a uvarint count
// and little-endian uint64s, durations uvarint nanoseconds, the deadline varint Unix
// nanoseconds (0: none).
//
// In PreviousVersion a request's endpoint byte is followed by a flags byte, a bit per optional
// field set (headerField.flag), then the SLOs, then the values of the fields set, in tag order,
// without tag or length; that version has no optional fields in other kinds.
func EncodeHeader(dst []byte, h Header) ([]byte, error) { return encodeHeader(dst, h, headerFields) }

func encodeHeader(dst []byte, h Header, fields []headerField) ([]byte, error) {
	v := h.Version
	if v == 0 {
		v = Version
	}
	if err := checkHeader(v, h); err != nil {
		return dst, err
	}
	start := len(dst)
	e := encoder{b: dst}
	e.b = append(e.b, byte(v), byte(h.Kind))
	e.str(h.RequestID)
	e.uvarint(uint64(h.Hops))
	e.varint(int64(h.Priority))
	e.str(h.Tenant)
	var dl int64
	if !h.Deadline.IsZero() {
		dl = h.Deadline.UnixNano()
	}
	e.varint(dl)
	e.str(h.AgentID)
	e.uvarint(uint64(len(h.Blocks)))
	for _, b := range h.Blocks {
		e.b = binary.LittleEndian.AppendUint64(e.b, b)
	}
	e.str(h.Ingress)
	if v == PreviousVersion {
		if err := encodePrevious(&e, &h, fields); err != nil {
			return dst, err
		}
	} else {
		switch h.Kind {
		case KindRequest:
			e.b = append(e.b, byte(h.Endpoint))
			e.uvarint(uint64(h.Waited))
			e.uvarint(uint64(h.TTFTSLO))
			e.uvarint(uint64(h.TPOTSLO))
		case KindAgentRenew:
			e.uvarint(uint64(h.RenewWait))
		}
		var val encoder
		for i := range fields {
			if f := &fields[i]; f.kind == h.Kind && f.has(&h) {
				val.b = val.b[:0]
				f.put(&val, &h)
				e.uvarint(f.tag)
				e.bytes(val.b)
			}
		}
	}
	if len(e.b)-start > MaxHeaderBytes {
		return dst, fmt.Errorf("%w: header of %d bytes (> %d)", ErrMalformed, len(e.b)-start, MaxHeaderBytes)
	}
	// Decoding our own output catches strings that are too long or not UTF-8 at the sender.
	if _, err := decodeHeader(e.b[start:], fields); err != nil {
		return dst, err
	}
	return e.b, nil
}

// encodePrevious appends the kind's part of h in PreviousVersion.
func encodePrevious(e *encoder, h *Header, fields []headerField) error {
	var flags byte
	for i := range fields {
		f := &fields[i]
		switch {
		case f.kind != h.Kind || !f.has(h):
		case f.flag != 0 && h.Kind == KindRequest:
			flags |= f.flag
		case required(f.tag):
			return fmt.Errorf("%w: frame version %d cannot carry a %s", ErrKind, PreviousVersion, f.name)
		}
	}
	switch h.Kind {
	case KindRequest:
		e.b = append(e.b, byte(h.Endpoint), flags)
		e.uvarint(uint64(h.Waited))
		e.uvarint(uint64(h.TTFTSLO))
		e.uvarint(uint64(h.TPOTSLO))
		for i := range fields {
			if f := &fields[i]; flags&f.flag != 0 {
				f.put(e, h)
			}
		}
	case KindAgentRenew:
		e.uvarint(uint64(h.RenewWait))
	}
	return nil
}

// DecodeHeader decodes a header of Version or PreviousVersion strictly. Another version is
// ErrVersion and an unknown kind ErrKind, both judged before anything else is read; a request
// of an unknown endpoint, or a header with a required field (an odd tag) this build does not
// know, is ErrKind too. An optional field it does not know is skipped. Out-of-range numbers,
// oversized or non-UTF-8 strings, overlong varints, fields out of tag order or repeated, unknown
// flags of PreviousVersion and trailing bytes are ErrMalformed.
func DecodeHeader(p []byte) (Header, error) { return decodeHeader(p, headerFields) }

func decodeHeader(p []byte, fields []headerField) (Header, error) {
	if len(p) > MaxHeaderBytes {
		return Header{}, fmt.Errorf("%w: header of %d bytes (> %d)", ErrMalformed, len(p), MaxHeaderBytes)
	}
	if len(p) == 0 {
		return Header{}, fmt.Errorf("%w: empty header", ErrMalformed)
	}
	if p[0] != Version && p[0] != PreviousVersion {
		return Header{}, fmt.Errorf("%w %d (this node speaks %d and %d)", ErrVersion, p[0], Version, PreviousVersion)
	}
	if len(p) == 1 {
		return Header{}, fmt.Errorf("%w: header without a kind", ErrMalformed)
	}
	h := Header{Version: int(p[0]), Kind: Kind(p[1])}
	if h.Kind >= numKinds {
		return Header{}, fmt.Errorf("%w %d", ErrKind, p[1])
	}
	d := decoder{b: p[2:]}
	h.RequestID = d.str("request id", maxShortString)
	hops := d.uvarint("hops")
	if hops > maxHops {
		d.fail("hops %d out of range", hops)
	}
	h.Hops = int(hops)
	prio := d.varint("priority")
	if prio < math.MinInt32 || prio > math.MaxInt32 {
		d.fail("priority %d out of range", prio)
	}
	h.Priority = int(prio)
	h.Tenant = d.str("tenant", maxShortString)
	if dl := d.varint("deadline"); dl != 0 {
		h.Deadline = time.Unix(0, dl)
	}
	h.AgentID = d.str("agent id", maxShortString)
	nb := d.uvarint("blocks")
	switch {
	case d.err != nil:
	case nb > MaxBlocks:
		d.fail("%d blocks (> %d)", nb, MaxBlocks)
	case nb*8 > uint64(len(d.b)):
		d.fail("blocks truncated")
	case nb > 0:
		h.Blocks = make([]uint64, nb)
		for i := range h.Blocks {
			h.Blocks[i] = binary.LittleEndian.Uint64(d.b[i*8:])
		}
		d.b = d.b[nb*8:]
	}
	h.Ingress = d.str("ingress", maxShortString)
	switch h.Kind {
	case KindRequest:
		h.Endpoint = Endpoint(d.u8("endpoint"))
		if d.err == nil && h.Endpoint >= numEndpoints {
			return Header{}, fmt.Errorf("%w: request endpoint %d", ErrKind, h.Endpoint)
		}
		var flags byte
		if h.Version == PreviousVersion {
			flags = d.u8("flags")
		}
		h.Waited = d.duration("waited")
		h.TTFTSLO = d.duration("ttft slo")
		h.TPOTSLO = d.duration("tpot slo")
		if h.Version == PreviousVersion {
			d.previousFields(&h, flags, fields)
		}
	case KindAgentRenew:
		h.RenewWait = d.duration("renew wait")
	}
	if h.Version == Version {
		if err := d.fields(&h, fields); err != nil {
			return Header{}, err
		}
	}
	d.end("header")
	if d.err != nil {
		return Header{}, d.err
	}
	return h, nil
}

// previousFields reads a PreviousVersion request's optional fields that flags marks.
func (d *decoder) previousFields(h *Header, flags byte, fields []headerField) {
	var known byte
	for i := range fields {
		if f := &fields[i]; f.kind == KindRequest {
			known |= f.flag
		}
	}
	if flags&^known != 0 {
		d.fail("unknown request flags %#x", flags)
		return
	}
	for i := range fields {
		if f := &fields[i]; f.flag&flags != 0 && d.err == nil {
			f.get(d, h)
		}
	}
}

// fields reads a Version header's optional fields, to its end. It returns ErrKind for a
// required field this build does not know; an optional one it skips.
func (d *decoder) fields(h *Header, fields []headerField) error {
	var last uint64
	for i := 0; d.err == nil && len(d.b) > 0; {
		tag := d.uvarint("field tag")
		val := d.raw("field value", MaxHeaderBytes)
		switch {
		case d.err != nil:
			return nil
		case tag <= last:
			d.fail("field %d after field %d", tag, last)
			return nil
		}
		last = tag
		for i < len(fields) && fields[i].tag < tag {
			i++
		}
		if i == len(fields) || fields[i].tag != tag {
			if required(tag) {
				return fmt.Errorf("%w: required header field %d", ErrKind, tag)
			}
			continue
		}
		f := &fields[i]
		if f.kind != h.Kind {
			d.fail("%s field in a %v header", f.name, h.Kind)
			return nil
		}
		vd := decoder{b: val}
		f.get(&vd, h)
		vd.end(f.name)
		if vd.err != nil {
			d.err = vd.err
		}
	}
	return nil
}
