package transport

import (
	"encoding/binary"
	"fmt"
	"math"
	"time"
	"unicode/utf8"
)

type encoder struct{ b []byte }

func (e *encoder) uvarint(v uint64) { e.b = binary.AppendUvarint(e.b, v) }
func (e *encoder) varint(v int64)   { e.b = binary.AppendVarint(e.b, v) }
func (e *encoder) str(s string)     { e.uvarint(uint64(len(s))); e.b = append(e.b, s...) }
func (e *encoder) bytes(p []byte)   { e.uvarint(uint64(len(p))); e.b = append(e.b, p...) }
func (e *encoder) strMap(m map[string]string) {
	e.uvarint(uint64(len(m)))
	for k, v := range m {
		e.str(k)
		e.str(v)
	}
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
	}
}

func (d *decoder) uvarint(what string) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("bad varint for %s", what)
		return 0
	}
	if n > 1 && d.b[n-1] == 0 {
		// An encoding has one spelling, so what decodes re-encodes to the same bytes.
		d.fail("overlong varint for %s", what)
		return 0
	}
	d.b = d.b[n:]
	return v
}

// varint is a zigzag-encoded uvarint, as encoding/binary spells a signed varint.
func (d *decoder) varint(what string) int64 {
	u := d.uvarint(what)
	return int64(u>>1) ^ -int64(u&1)
}

func (d *decoder) raw(what string, limit int) []byte {
	n := d.uvarint(what)
	if d.err != nil {
		return nil
	}
	if n > uint64(limit) {
		d.fail("%s too long (%d > %d)", what, n, limit)
		return nil
	}
	if n > uint64(len(d.b)) {
		d.fail("%s truncated", what)
		return nil
	}
	p := d.b[:n:n]
	d.b = d.b[n:]
	return p
}

func (d *decoder) u8(what string) byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) == 0 {
		d.fail("%s truncated", what)
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

// duration reads non-negative nanoseconds.
func (d *decoder) duration(what string) time.Duration {
	v := d.uvarint(what)
	if v > math.MaxInt64 {
		d.fail("%s out of range", what)
		return 0
	}
	return time.Duration(v)
}

// resume reads a Resume's fields (see EncodeHeader).
func (d *decoder) resume() *Resume {
	if d.err == nil && len(d.b) < 16 {
		d.fail("resume truncated")
	}
	if d.err != nil {
		return nil
	}
	r := &Resume{Seed: binary.LittleEndian.Uint64(d.b), PromptHash: binary.LittleEndian.Uint64(d.b[8:])}
	d.b = d.b[16:]
	for _, f := range []struct {
		what string
		v    *int
	}{{"resume tokens", &r.Tokens}, {"resume bytes", &r.Bytes}, {"resume prompt tokens", &r.PromptTokens}} {
		v := d.uvarint(f.what)
		if v > maxResumeCount {
			d.fail("%s out of range", f.what)
		}
		*f.v = int(v)
	}
	return r
}

// handover reads a Handover (see AppendHandover).
func (d *decoder) handover() *Handover {
	h := &Handover{}
	for _, f := range []struct {
		what string
		v    *int
	}{{"handover prompt tokens", &h.PromptTokens}, {"handover cached tokens", &h.CachedTokens}} {
		v := d.uvarint(f.what)
		if v > maxResumeCount {
			d.fail("%s out of range", f.what)
		}
		*f.v = int(v)
	}
	kv := d.uvarint("handover kv bytes")
	if kv > math.MaxInt64 {
		d.fail("handover kv bytes out of range")
	}
	h.KVBytes = int64(kv)
	h.ReadyAt = d.duration("handover ready at")
	if p := d.raw("handover params", MaxHandoverParams); len(p) > 0 {
		h.Params = append([]byte(nil), p...)
	}
	if d.err != nil {
		return nil
	}
	return h
}

func (d *decoder) str(what string, limit int) string {
	p := d.raw(what, limit)
	if d.err == nil && !utf8.Valid(p) {
		d.fail("%s is not utf-8", what)
	}
	return string(p)
}

func (d *decoder) strMap(what string, maxKey, maxValue int) map[string]string {
	n := d.uvarint(what)
	if d.err != nil || n == 0 {
		return nil
	}
	if n > MaxAcceptHeaders {
		d.fail("%s has %d entries (> %d)", what, n, MaxAcceptHeaders)
		return nil
	}
	m := make(map[string]string, n)
	for range n {
		k := d.str(what+" key", maxKey)
		v := d.str(what+" value", maxValue)
		if d.err != nil {
			return nil
		}
		if _, dup := m[k]; dup {
			d.fail("%s repeats key %q", what, k)
			return nil
		}
		m[k] = v
	}
	return m
}

func (d *decoder) end(what string) {
	if d.err == nil && len(d.b) != 0 {
		d.fail("%d trailing bytes after %s", len(d.b), what)
	}
}
