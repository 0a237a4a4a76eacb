package openai

import (
	"bytes"
	"encoding/json"
	"errors"
)

// ErrNotObject is SetMember's error for a body that is not one JSON object.
var ErrNotObject = errors.New("not a JSON object")

// SetMember returns a copy of the JSON object obj in which the value of every top-level member
// named key is replaced by value(old), or, when there is none, a member key: value(nil) is
// added before the closing brace. Every other byte of obj is kept.
func SetMember(obj []byte, key string, value func(old []byte) []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(obj))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, ErrNotObject
	}
	out := make([]byte, 0, len(obj)+48)
	copied, members := 0, 0
	found := false
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, err
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, err
		}
		members++
		if t != key {
			continue
		}
		end := int(dec.InputOffset())
		start := end - len(raw)
		out = append(out, obj[copied:start]...)
		out = append(out, value(raw)...)
		copied, found = end, true
	}
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	closing := int(dec.InputOffset()) - 1
	if rest := bytes.TrimSpace(obj[closing+1:]); len(rest) > 0 {
		return nil, ErrNotObject
	}
	if !found {
		out = append(out, obj[copied:closing]...)
		if members > 0 {
			out = append(out, ',')
		}
		k, _ := json.Marshal(key)
		out = append(out, k...)
		out = append(out, ':')
		out = append(out, value(nil)...)
		copied = closing
	}
	return append(out, obj[copied:]...), nil
}
