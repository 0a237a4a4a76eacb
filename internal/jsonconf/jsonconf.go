package jsonconf

import (
	"bytes"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"reflect"
	"slices"
	"strconv"
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
	case reflect.Map:
		obj, ok := node.(map[string]any)
		if !ok {
			return node, nil
		}
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

// Marshal writes v as indented JSON: struct fields in declaration order, those tagged
// "advanced" last, in an AdvancedKey object, map keys sorted, durations as strings
// (FormatDuration).
func Marshal(v any) ([]byte, error) {
	rv := reflect.ValueOf(v)
	if rv.IsValid() {
		// An addressable copy, so that fields whose MarshalJSON has a pointer receiver use it.
		c := reflect.New(rv.Type()).Elem()
		c.Set(rv)
		rv = c
	}
	tree, err := encode(rv)
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(tree)
	if err != nil {
		return nil, fmt.Errorf("jsonconf: %w", err)
	}
	var out bytes.Buffer
	if err := json.Indent(&out, b, "", "  "); err != nil {
		return nil, fmt.Errorf("jsonconf: %w", err)
	}
	out.WriteByte('\n')
	return out.Bytes(), nil
}

// object is a JSON object that keeps its members' order.
type object []member

type member struct {
	key string
	val any
}

func (o object) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, m := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		k, _ := json.Marshal(m.key)
		b.Write(k)
		b.WriteByte(':')
		v, err := json.Marshal(m.val)
		if err != nil {
			return nil, err
		}
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

func encode(v reflect.Value) (any, error) {
	if !v.IsValid() {
		return nil, nil
	}
	t := v.Type()
	if t == durationType {
		return FormatDuration(time.Duration(v.Int())), nil
	}
	if t.Implements(jsonMarshalerType) || t.Implements(textMarshalerType) {
		if t.Kind() == reflect.Pointer && v.IsNil() {
			return nil, nil
		}
		return v.Interface(), nil
	}
	if v.CanAddr() && (reflect.PointerTo(t).Implements(jsonMarshalerType) || reflect.PointerTo(t).Implements(textMarshalerType)) {
		return v.Addr().Interface(), nil
	}
	switch t.Kind() {
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return nil, nil
		}
		return encode(v.Elem())
	case reflect.Struct:
		var o, adv object
		hasAdv := false
		for _, f := range fields(t) {
			hasAdv = hasAdv || f.advanced
			fv, ok := fieldByIndex(v, f.index)
			if !ok || (f.omitEmpty && isEmpty(fv)) {
				continue
			}
			e, err := encode(fv)
			if err != nil {
				return nil, err
			}
			if f.advanced {
				adv = append(adv, member{f.name, e})
			} else {
				o = append(o, member{f.name, e})
			}
		}
		if hasAdv {
			if adv == nil {
				adv = object{}
			}
			o = append(o, member{AdvancedKey, adv})
		}
		if o == nil {
			o = object{}
		}
		return o, nil
	case reflect.Map:
		if v.IsNil() {
			return nil, nil
		}
		if t.Key().Kind() != reflect.String {
			return v.Interface(), nil
		}
		keys := v.MapKeys()
		slices.SortFunc(keys, func(a, b reflect.Value) int { return strings.Compare(a.String(), b.String()) })
		o := object{}
		for _, k := range keys {
			e, err := encode(v.MapIndex(k))
			if err != nil {
				return nil, err
			}
			o = append(o, member{k.String(), e})
		}
		return o, nil
	case reflect.Slice:
		if v.IsNil() {
			return nil, nil
		}
		if t.Elem().Kind() == reflect.Uint8 {
			return v.Interface(), nil
		}
		fallthrough
	case reflect.Array:
		out := make([]any, v.Len())
		for i := range out {
			e, err := encode(v.Index(i))
			if err != nil {
				return nil, err
			}
			out[i] = e
		}
		return out, nil
	case reflect.Func, reflect.Chan, reflect.UnsafePointer, reflect.Complex64, reflect.Complex128:
		return nil, fmt.Errorf("jsonconf: cannot write a %s (tag the field json:\"-\")", t)
	}
	return v.Interface(), nil
}

// fieldByIndex follows index through embedded pointers; ok is false past a nil one.
func fieldByIndex(v reflect.Value, index []int) (reflect.Value, bool) {
	for i, x := range index {
		if i > 0 && v.Kind() == reflect.Pointer {
			if v.IsNil() {
				return reflect.Value{}, false
			}
			v = v.Elem()
		}
		v = v.Field(x)
	}
	return v, true
}

func isEmpty(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.Array, reflect.Map, reflect.Slice, reflect.String:
		return v.Len() == 0
	case reflect.Pointer, reflect.Interface:
		return v.IsNil()
	}
	return v.IsZero()
}
