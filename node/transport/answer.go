package transport

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// Refusal is the owner's "no" before any token; it is also the error Forward returns for it.
type Refusal struct {
	// Status is the HTTP status the owner would have answered (429, 503, ...).
	Status  int
	Code    string
	Message string
	// RetryAfter is the owner's hint; zero means none.
	RetryAfter time.Duration
	// State is the owner's fresh state record, opaque to this package.
	State []byte
}

// Error implements error.
func (r *Refusal) Error() string {
	return fmt.Sprintf("transport: refused by owner: %d %s: %s", r.Status, r.Code, r.Message)
}

// Is reports whether r is the owner's refusal of a header it cannot read: ErrVersion for
// CodeVersion, ErrKind for CodeKind.
func (r *Refusal) Is(target error) bool {
	switch target {
	case ErrVersion:
		return r.Status == StatusVersion && r.Code == CodeVersion
	case ErrKind:
		return r.Status == StatusKind && r.Code == CodeKind
	}
	return false
}

func validStatus(s int) bool { return s >= 200 && s <= 599 }

func encodeAccept(status int, headers map[string]string) ([]byte, error) {
	if !validStatus(status) {
		return nil, fmt.Errorf("%w: accept status %d", ErrMalformed, status)
	}
	if len(headers) > MaxAcceptHeaders {
		return nil, fmt.Errorf("%w: %d headers (> %d)", ErrMalformed, len(headers), MaxAcceptHeaders)
	}
	e := encoder{}
	e.uvarint(uint64(status))
	e.strMap(headers)
	if _, _, err := decodeAccept(e.b); err != nil {
		return nil, err
	}
	return e.b, nil
}

func decodeAccept(p []byte) (int, map[string]string, error) {
	d := decoder{b: p}
	status := d.uvarint("status")
	if d.err == nil && !validStatus(int(min(status, 1000))) {
		d.fail("accept status %d", status)
	}
	hdr := d.strMap("headers", maxHeaderKey, maxHeaderValue)
	d.end("accept")
	if d.err != nil {
		return 0, nil, d.err
	}
	return int(status), hdr, nil
}

func encodeRefuse(r Refusal) ([]byte, error) {
	if !validStatus(r.Status) {
		return nil, fmt.Errorf("%w: refuse status %d", ErrMalformed, r.Status)
	}
	if r.RetryAfter < 0 {
		return nil, fmt.Errorf("%w: negative retry-after", ErrMalformed)
	}
	e := encoder{}
	e.uvarint(uint64(r.Status))
	e.str(r.Code)
	e.str(r.Message)
	e.uvarint(uint64(r.RetryAfter))
	e.bytes(r.State)
	if _, err := decodeRefuse(e.b); err != nil {
		return nil, err
	}
	return e.b, nil
}

func decodeRefuse(p []byte) (*Refusal, error) {
	d := decoder{b: p}
	status := d.uvarint("status")
	if d.err == nil && !validStatus(int(min(status, 1000))) {
		d.fail("refuse status %d", status)
	}
	r := &Refusal{Status: int(status)}
	r.Code = d.str("code", maxShortString)
	r.Message = d.str("message", maxShortString)
	ra := d.uvarint("retry-after")
	if ra > math.MaxInt64 {
		d.fail("retry-after out of range")
	}
	r.RetryAfter = time.Duration(ra)
	if st := d.raw("state", MaxStateBytes); len(st) > 0 {
		r.State = append([]byte(nil), st...)
	}
	d.end("refuse")
	if d.err != nil {
		return nil, d.err
	}
	return r, nil
}

// An end frame is a flag (0 clean, 1 failed) and, when failed, the owner's message.
func encodeEnd(failure string) []byte {
	if failure == "" {
		return []byte{0}
	}
	// The reader insists on valid UTF-8 within the limit; a cut rune is dropped.
	failure = strings.ToValidUTF8(failure, "?")
	if len(failure) > maxShortString {
		failure = strings.ToValidUTF8(failure[:maxShortString], "")
	}
	e := encoder{b: []byte{1}}
	e.str(failure)
	return e.b
}

// decodeEnd returns the owner's failure message, "" for a clean end.
func decodeEnd(p []byte) (string, error) {
	if len(p) == 1 && p[0] == 0 {
		return "", nil
	}
	if len(p) == 0 || p[0] != 1 {
		return "", fmt.Errorf("%w: bad end flag", ErrMalformed)
	}
	d := decoder{b: p[1:]}
	msg := d.str("end message", maxShortString)
	d.end("end")
	if d.err == nil && msg == "" {
		d.fail("empty end message")
	}
	return msg, d.err
}
