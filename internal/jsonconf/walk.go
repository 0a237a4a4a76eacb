package jsonconf

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"reflect"
	"slices"
	"strconv"
	"time"
)

// AdvancedKey is the object in which a struct's fields tagged "advanced" sit in the document
// (`json:"epsilon,advanced"` is read at "advanced.epsilon"): the settings no operator should
// need, kept out of the way of those one tunes. Such a field given beside the others, where it
// sat before, is still read, and Options.Moved told of it.
const AdvancedKey = "advanced"

// walker carries what rewrite reports on the way.
type walker struct{ moved func(from, to string) }

// hoistAdvanced moves the members of obj's "advanced" object into obj, where encoding/json
// reads them, and returns their keys. A member that is no advanced field is an unknown key;
// one also given beside the others, with a different value, is a conflict.
func hoistAdvanced(obj map[string]any, fields map[string]field, path string) (map[string]bool, error) {
	adv, ok := obj[AdvancedKey]
	if !ok || slices.IndexFunc(slices.Collect(maps.Values(fields)), func(f field) bool { return f.advanced }) < 0 {
		return nil, nil
	}
	delete(obj, AdvancedKey)
	if adv == nil {
		return nil, nil
	}
	a, ok := adv.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("jsonconf: %s: want an object", join(path, AdvancedKey))
	}
	in := make(map[string]bool, len(a))
	for _, k := range sortedKeys(a) {
		f, ok := fields[k]
		if !ok || !f.advanced {
			return nil, fmt.Errorf("jsonconf: %w %q", ErrUnknownKey, join(path, AdvancedKey+"."+k))
		}
		if cur, there := obj[k]; there {
			same, err := sameValue(cur, a[k], f.typ)
			if err != nil {
				return nil, fmt.Errorf("jsonconf: %s: %w", join(path, k), err)
			}
			if !same {
				return nil, fmt.Errorf("jsonconf: %w: %q and %q name one setting: give it once",
					ErrConflict, join(path, k), join(path, AdvancedKey+"."+k))
			}
		}
		obj[k], in[k] = a[k], true
	}
	return in, nil
}

// rewrite walks a decoded JSON value along the Go type it will decode into: it rejects keys
// that name no field and turns durations into the nanoseconds encoding/json reads. Along the
// way it gives v (the value decoded into, when known and settable) its own copy of every map,
// slice and pointer target the JSON writes into, so decoding over a copy of a config does not
// write through to the original.
func (w walker) rewrite(node any, t reflect.Type, v reflect.Value, path string) (any, error) {
	if !v.CanSet() {
		v = reflect.Value{}
	}
	if node == nil {
		return node, nil
	}
	if decodesItself(t) {
		if v.IsValid() && t.Kind() == reflect.Pointer && !v.IsNil() {
			ownPointer(v)
		}
		return node, nil
	}
	if t == durationType {
		d, err := parseDuration(node)
		if err != nil {
			return nil, fmt.Errorf("jsonconf: %s: %w", orTop(path), err)
		}
		return json.Number(strconv.FormatInt(int64(d), 10)), nil
	}
	switch t.Kind() {
	case reflect.Pointer:
		if v.IsValid() {
			if v.IsNil() {
				v = reflect.Value{} // encoding/json allocates a new one
			} else {
				v = ownPointer(v)
			}
		}
		return w.rewrite(node, t.Elem(), v, path)
	case reflect.Struct:
		obj, ok := node.(map[string]any)
		if !ok {
			return node, nil // encoding/json reports the type mismatch
		}
		return w.rewriteStruct(obj, t, v, path)
	case reflect.Map:
		obj, ok := node.(map[string]any)
		if !ok {
			return node, nil
		}
		return w.rewriteMap(obj, t, v, path)
	case reflect.Slice, reflect.Array:
		arr, ok := node.([]any)
		if !ok {
			return node, nil
		}
		if v.IsValid() && t.Kind() == reflect.Slice {
			v.SetZero() // encoding/json would reuse the backing array
			v = reflect.Value{}
		}
		for i := range arr {
			var ev reflect.Value
			if v.IsValid() && i < v.Len() {
				ev = v.Index(i)
			}
			e, err := w.rewrite(arr[i], t.Elem(), ev, fmt.Sprintf("%s[%d]", path, i))
			if err != nil {
				return nil, err
			}
			arr[i] = e
		}
		return arr, nil
	}
	return node, nil
}

// rewriteStruct is rewrite of a JSON object decoded into the struct type t: its "advanced"
// members hoisted, each key checked against t's fields and rewritten along its field.
func (w walker) rewriteStruct(obj map[string]any, t reflect.Type, v reflect.Value, path string) (any, error) {
	fields := fieldsOf(t)
	inAdvanced, err := hoistAdvanced(obj, fields, path)
	if err != nil {
		return nil, err
	}
	for _, k := range sortedKeys(obj) {
		f, ok := fields[k]
		if !ok {
			return nil, fmt.Errorf("jsonconf: %w %q", ErrUnknownKey, join(path, k))
		}
		if f.advanced && !inAdvanced[k] && w.moved != nil {
			w.moved(join(path, k), join(path, AdvancedKey+"."+k))
		}
		var fv reflect.Value
		if v.IsValid() {
			fv = ownField(v, f.index)
		}
		e, err := w.rewrite(obj[k], f.typ, fv, join(path, k))
		if err != nil {
			return nil, err
		}
		obj[k] = e
	}
	return obj, nil
}

// rewriteMap is rewrite of a JSON object decoded into the map type t.
func (w walker) rewriteMap(obj map[string]any, t reflect.Type, v reflect.Value, path string) (any, error) {
	if v.IsValid() && !v.IsNil() {
		// encoding/json adds to an existing map: add to a copy. It decodes each value afresh.
		c := reflect.MakeMapWithSize(t, v.Len())
		for it := v.MapRange(); it.Next(); {
			c.SetMapIndex(it.Key(), it.Value())
		}
		v.Set(c)
	}
	for _, k := range sortedKeys(obj) {
		e, err := w.rewrite(obj[k], t.Elem(), reflect.Value{}, join(path, k))
		if err != nil {
			return nil, err
		}
		obj[k] = e
	}
	return obj, nil
}

// ownPointer points the settable, non-nil pointer v at a copy of its target and returns the
// copy.
func ownPointer(v reflect.Value) reflect.Value {
	c := reflect.New(v.Type().Elem())
	c.Elem().Set(v.Elem())
	v.Set(c)
	return c.Elem()
}

// ownField returns the field at index in the struct v, copying the targets of the embedded
// pointers on the way; it is invalid past a nil one (encoding/json allocates it).
func ownField(v reflect.Value, index []int) reflect.Value {
	for i, x := range index {
		if i > 0 && v.Kind() == reflect.Pointer {
			if v.IsNil() || !v.CanSet() {
				return reflect.Value{}
			}
			v = ownPointer(v)
		}
		v = v.Field(x)
	}
	return v
}

func decodesItself(t reflect.Type) bool {
	p := reflect.PointerTo(t)
	return p.Implements(jsonUnmarshalerType) || p.Implements(textUnmarshalerType)
}

// parseDuration reads a duration string, or a number of seconds.
func parseDuration(node any) (time.Duration, error) {
	switch v := node.(type) {
	case string:
		d, err := time.ParseDuration(v)
		if err != nil {
			return 0, fmt.Errorf("duration %q: want a Go duration such as \"500ms\" or \"5m\"", v)
		}
		return d, nil
	case json.Number:
		f, err := v.Float64()
		if err != nil || math.IsNaN(f) || math.Abs(f) > float64(math.MaxInt64)/float64(time.Second) {
			return 0, fmt.Errorf("duration %s out of range", v)
		}
		return time.Duration(f * float64(time.Second)), nil
	}
	return 0, fmt.Errorf("duration: want a string such as \"500ms\" or a number of seconds, not %T", node)
}
