package jsonconf

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"
)

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
