package lora

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"unicode"
)

// Entry is one adapter of a source: where the engine loads it from (a path on the engine's
// host, or a URI the engine resolves, such as a Hugging Face repository id), and its base
// model ("": the first base model the engine serves).
type Entry struct {
	Path string `json:"path"`
	Base string `json:"base"`
}

// Source is a set of adapters by name.
type Source map[string]Entry

// MaxSourceBytes bounds a JSON source file.
const MaxSourceBytes = 4 << 20

// ErrSource is the error of a source that cannot be read or is malformed.
var ErrSource = errors.New("lora: adapter source")

// ReadSource reads the adapter source at path:
//
//   - a directory: each subdirectory is an adapter named for it, loaded from its absolute
//     path (files and hidden entries are skipped);
//   - a file: a JSON object of adapter name to its path or URI (a string), or to an object
//     {"path": ..., "base": ...} naming its base model too.
//
// A name must be non-empty, at most 256 bytes, without spaces, commas or control characters
// (engines list adapters comma-separated); a path must be non-empty. Errors wrap ErrSource.
func ReadSource(path string) (Source, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSource, err)
	}
	if fi.IsDir() {
		return readDir(path)
	}
	if fi.Size() > MaxSourceBytes {
		return nil, fmt.Errorf("%w: %s is %d bytes, more than %d", ErrSource, path, fi.Size(), MaxSourceBytes)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSource, err)
	}
	src, err := ParseSource(data)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrSource, path, err)
	}
	return src, nil
}

func readDir(dir string) (Source, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSource, err)
	}
	ents, err := os.ReadDir(abs)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSource, err)
	}
	src := Source{}
	for _, e := range ents {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if err := checkName(e.Name()); err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrSource, filepath.Join(abs, e.Name()), err)
		}
		src[e.Name()] = Entry{Path: filepath.Join(abs, e.Name())}
	}
	return src, nil
}

// ParseSource decodes a JSON source (see ReadSource).
func ParseSource(data []byte) (Source, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("not a JSON object of adapter name to path: %w", err)
	}
	src := make(Source, len(raw))
	for name, v := range raw {
		if cerr := checkName(name); cerr != nil {
			return nil, cerr
		}
		var e Entry
		var err error
		if v = bytes.TrimSpace(v); len(v) > 0 && v[0] == '"' {
			err = json.Unmarshal(v, &e.Path)
		} else {
			dec := json.NewDecoder(bytes.NewReader(v))
			dec.DisallowUnknownFields()
			err = dec.Decode(&e)
		}
		if err != nil {
			return nil, fmt.Errorf("adapter %q: want a path or {\"path\", \"base\"}: %w", name, err)
		}
		if e.Path == "" {
			return nil, fmt.Errorf("adapter %q: empty path", name)
		}
		src[name] = e
	}
	return src, nil
}

func checkName(name string) error {
	if name == "" || len(name) > 256 {
		return fmt.Errorf("adapter name %q: want 1 to 256 bytes", name)
	}
	if strings.ContainsFunc(name, func(r rune) bool { return r == ',' || unicode.IsSpace(r) || unicode.IsControl(r) }) {
		return fmt.Errorf("adapter name %q: no spaces, commas or control characters", name)
	}
	return nil
}
