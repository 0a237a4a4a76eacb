package jsonconf

import (
	"bytes"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"
	"time"
)

var (
	durationType        = reflect.TypeFor[time.Duration]()
	jsonUnmarshalerType = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()
	jsonMarshalerType   = reflect.TypeFor[json.Marshaler]()
	textMarshalerType   = reflect.TypeFor[encoding.TextMarshaler]()
)

// ErrUnknownKey is wrapped by the error Decode returns for a key that names no field.
var ErrUnknownKey = errors.New("unknown key")

// Decode reads the JSON object in data over v, a non-nil pointer. A key that names no field
// is an error wrapping ErrUnknownKey that names the key's path; a duration is a string that
// time.ParseDuration reads, or a number of seconds. Maps merge, as with encoding/json, but
// into a copy: Decode writes through no map, slice or pointer that *v shares with another
// value, so decoding over a shallow copy of defaults leaves the defaults alone.
func Decode(data []byte, v any) error { return DecodeWith(data, v, Options{}) }

// DecodeAt is Decode for data that sits at path in a larger document (a section of it,
// "admission"): every path its errors name starts with path, so they name the key as the whole
// document spells it ("admission.queue.ttll").
func DecodeAt(data []byte, v any, path string) error {
	return DecodeWith(data, v, Options{Path: path})
}

// ErrConflict is wrapped by the error DecodeWith returns when a key and its former name are
// both given, with different values.
var ErrConflict = errors.New("a key and its former name disagree")

// A Rename is a key's former path and its path now, both from data's top (Options.Path not
// included).
type Rename struct{ From, To string }

// Options are DecodeWith's: where data sits, and the keys it may still give by former names.
type Options struct {
	// Path is where data sits in a larger document (see DecodeAt).
	Path string
	// Renames are read before anything else, in order: a key found at From is read at To,
	// and Moved is told of it. From and To both given, with values that differ once read as
	// To's type, are an error wrapping ErrConflict that names both; with equal values, To's
	// stands.
	Renames []Rename
	// Moved, when set, is called once for each key data gives at a former path, with both full
	// paths, so that the caller can warn.
	Moved func(from, to string)
}

// DecodeWith is Decode with Options.
func DecodeWith(data []byte, v any, o Options) error {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return fmt.Errorf("jsonconf: decode into %T: want a non-nil pointer", v)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var tree any
	if err := dec.Decode(&tree); err != nil {
		return fmt.Errorf("jsonconf: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("jsonconf: data after the top-level value")
	}
	if err := applyRenames(tree, rv.Type().Elem(), o); err != nil {
		return err
	}
	w := walker{moved: o.Moved}
	tree, err := w.rewrite(tree, rv.Type().Elem(), rv.Elem(), o.Path)
	if err != nil {
		return err
	}
	b, err := json.Marshal(tree)
	if err != nil {
		return fmt.Errorf("jsonconf: %w", err)
	}
	dec = json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("jsonconf: %w", err)
	}
	return nil
}

// applyRenames moves every key tree gives at a former path to its path now (Options.Renames).
func applyRenames(tree any, t reflect.Type, o Options) error {
	origin := map[string]string{} // a moved key's path now → the path the data gave it at
	for _, r := range o.Renames {
		from, to := strings.Split(r.From, "."), strings.Split(r.To, ".")
		parent, ok := lookup(tree, from[:len(from)-1])
		if !ok {
			continue
		}
		val, ok := parent[from[len(from)-1]]
		if !ok {
			continue
		}
		delete(parent, from[len(from)-1])
		src := join(o.Path, r.From)
		dst, ok := makeParents(tree, to[:len(to)-1])
		if !ok {
			return fmt.Errorf("jsonconf: %s: %q is not an object", src, join(o.Path, strings.Join(to[:len(to)-1], ".")))
		}
		if cur, there := dst[to[len(to)-1]]; there {
			same, err := sameValue(cur, val, typeAt(t, to))
			if err != nil {
				return fmt.Errorf("jsonconf: %s: %w", src, err)
			}
			if !same {
				now := join(o.Path, r.To)
				given := now
				if g, moved := origin[now]; moved {
					given = g
				}
				return fmt.Errorf("jsonconf: %w: %q and %q name one setting, %s: give it once",
					ErrConflict, src, given, now)
			}
		} else {
			dst[to[len(to)-1]] = val
			origin[join(o.Path, r.To)] = src
		}
		if o.Moved != nil {
			o.Moved(src, join(o.Path, r.To))
		}
	}
	return nil
}

// lookup returns the object at path in tree.
func lookup(tree any, path []string) (map[string]any, bool) {
	obj, ok := tree.(map[string]any)
	for _, k := range path {
		if !ok {
			return nil, false
		}
		obj, ok = obj[k].(map[string]any)
	}
	return obj, ok
}

// makeParents returns the object at path in tree, making the missing ones (null counts as
// missing); false if a value on the way is not an object.
func makeParents(tree any, path []string) (map[string]any, bool) {
	obj, ok := tree.(map[string]any)
	if !ok {
		return nil, false
	}
	for _, k := range path {
		if obj[k] == nil {
			obj[k] = map[string]any{}
		}
		if obj, ok = obj[k].(map[string]any); !ok {
			return nil, false
		}
	}
	return obj, true
}

// typeAt is the Go type at path in t (nil when path leads nowhere).
func typeAt(t reflect.Type, path []string) reflect.Type {
	for _, k := range path {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		switch t.Kind() {
		case reflect.Struct:
			f, ok := fieldsOf(t)[k]
			if !ok {
				return nil
			}
			t = f.typ
		case reflect.Map:
			t = t.Elem()
		default:
			return nil
		}
	}
	return t
}

// sameValue reports whether a and b read as the same value of type t (durations by their
// length: "1s" is 1); without a type, whether their JSON is the same.
func sameValue(a, b any, t reflect.Type) (bool, error) {
	read := func(n any) ([]byte, error) {
		if t != nil {
			b, err := json.Marshal(n)
			if err != nil {
				return nil, err
			}
			p := reflect.New(t)
			if err := Decode(b, p.Interface()); err != nil {
				return nil, err
			}
			return json.Marshal(p.Interface())
		}
		return json.Marshal(n)
	}
	x, err := read(a)
	if err != nil {
		return false, err
	}
	y, err := read(b)
	if err != nil {
		return false, err
	}
	return bytes.Equal(x, y), nil
}

// FormatDuration writes d as time.Duration.String does, less its zero tails: "5m", not "5m0s".
func FormatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

type field struct {
	name      string
	index     []int
	typ       reflect.Type
	omitEmpty bool
	advanced  bool // sits in the struct's AdvancedKey object
}

// fields lists t's JSON fields in declaration order, the fields of untagged embedded structs
// in their place, as encoding/json promotes them.
func fields(t reflect.Type) []field {
	var out []field
	for i := range t.NumField() {
		sf := t.Field(i)
		tag := sf.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		ft := sf.Type
		if sf.Anonymous && name == "" {
			et := ft
			if et.Kind() == reflect.Pointer {
				et = et.Elem()
			}
			if et.Kind() == reflect.Struct {
				for _, f := range fields(et) {
					f.index = append([]int{i}, f.index...)
					out = append(out, f)
				}
				continue
			}
		}
		if !sf.IsExported() {
			continue
		}
		if name == "" {
			name = sf.Name
		}
		o := strings.Split(opts, ",")
		out = append(out, field{name: name, index: []int{i}, typ: ft, omitEmpty: slices.Contains(o, "omitempty"), advanced: slices.Contains(o, "advanced")})
	}
	return out
}

func fieldsOf(t reflect.Type) map[string]field {
	m := make(map[string]field)
	for _, f := range fields(t) {
		m[f.name] = f
	}
	return m
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func orTop(path string) string {
	if path == "" {
		return "value"
	}
	return path
}
