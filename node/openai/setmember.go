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
	return EditObject(obj, Edit{Name: key, Value: value, Add: true})
}

// Edit is what EditObject does with the top-level members named Name: each takes the value
// Value(old), or is left out when Value is nil; with Add, when there is none, one is added
// with the value Value(nil).
type Edit struct {
	Name  string
	Value func(old []byte) []byte
	Add   bool
}

// EditObject returns a copy of the JSON object obj with edits made in one pass over it (a body
// may hold a long prompt), the members added before the closing brace in the order of edits.
// Every other byte of obj is kept.
func EditObject(obj []byte, edits ...Edit) ([]byte, error) {
	seen := make([]bool, len(edits))
	out, err := RewriteMembers(obj, func(key string, old []byte) ([]byte, bool) {
		for i := range edits {
			if edits[i].Name == key {
				seen[i] = true
				if edits[i].Value == nil {
					return nil, false
				}
				return edits[i].Value(old), true
			}
		}
		return old, true
	})
	if err != nil {
		return nil, err
	}
	// Only spacing follows the closing brace (RewriteMembers checked).
	closing := bytes.LastIndexByte(out, '}')
	members := len(bytes.TrimSpace(out[bytes.IndexByte(out, '{')+1:closing])) > 0
	var added []byte
	for i, e := range edits {
		if !e.Add || seen[i] || e.Value == nil {
			continue
		}
		if members || len(added) > 0 {
			added = append(added, ',')
		}
		k, _ := json.Marshal(e.Name)
		added = append(append(append(added, k...), ':'), e.Value(nil)...)
	}
	if len(added) == 0 {
		return out, nil
	}
	res := make([]byte, 0, len(out)+len(added))
	res = append(append(res, out[:closing]...), added...)
	return append(res, out[closing:]...), nil
}

// RewriteMembers returns a copy of the JSON object obj in which each top-level member has the
// value edit gives it, or is left out when edit says not to keep it; the bytes around the
// values kept (spacing, the keys as escaped) are obj's. It edits several members in one pass,
// and removes; SetMember edits one name and adds it when missing.
func RewriteMembers(obj []byte, edit func(key string, old []byte) (v []byte, keep bool)) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(obj))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, ErrNotObject
	}
	from := int(dec.InputOffset()) // the end of what is copied or left out
	out := append(make([]byte, 0, len(obj)), obj[:from]...)
	kept := false
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, err
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, err
		}
		end := int(dec.InputOffset())
		v, keep := edit(t.(string), raw)
		if keep {
			// The comma before it, its key and colon; its comma goes when the members before
			// it were all left out.
			lead := obj[from : end-len(raw)]
			if !kept {
				if i := bytes.IndexByte(lead[:bytes.IndexByte(lead, '"')], ','); i >= 0 {
					out = append(out, lead[:i]...)
					lead = lead[i+1:]
				}
			}
			out = append(append(out, lead...), v...)
			kept = true
		}
		from = end
	}
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	if rest := bytes.TrimSpace(obj[dec.InputOffset():]); len(rest) > 0 {
		return nil, ErrNotObject
	}
	return append(out, obj[from:]...), nil
}
