// Package jsonconf reads and writes kvmesh's JSON configuration with encoding/json, plus two
// things encoding/json does not do: time.Duration fields are strings ("500ms", "5m"; a number
// is seconds), and a key that names no field is an error that gives its path ("route.weights.prefx").
//
// Decode reads over a value, so keys a file omits keep what the value held (its defaults).
// Marshal writes struct fields in declaration order, durations as strings, so its output reads
// back with Decode to the same value.
//
// Field names come from the json struct tags, as with encoding/json; fields tagged "-" are
// neither read nor written. Types that implement json.Unmarshaler or encoding.TextUnmarshaler
// decode themselves. The functions keep no state and are safe for concurrent use.
package jsonconf
