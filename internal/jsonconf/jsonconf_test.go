package jsonconf

import (
	"errors"
	"strings"
	"testing"
	"time"
)

type inner struct {
	Wait  time.Duration `json:"wait"`
	Ratio float64       `json:"ratio"`
}

type Embedded struct {
	Depth int `json:"depth"`
}

type level string

func (l level) MarshalText() ([]byte, error) { return []byte(strings.ToUpper(string(l))), nil }
func (l *level) UnmarshalText(b []byte) error {
	*l = level(strings.ToLower(string(b)))
	return nil
}

type outer struct {
	*Embedded
	Name    string                   `json:"name"`
	Timeout time.Duration            `json:"timeout"`
	Inner   inner                    `json:"inner"`
	Opt     *inner                   `json:"opt"`
	ByName  map[string]inner         `json:"by_name"`
	List    []time.Duration          `json:"list"`
	Level   level                    `json:"level"`
	Skip    func()                   `json:"-"`
	Empty   string                   `json:"empty,omitempty"`
	Nested  map[string]time.Duration `json:"nested"`
}

func base() outer {
	return outer{Embedded: &Embedded{Depth: 1}, Name: "a", Timeout: time.Second, Inner: inner{Wait: time.Minute, Ratio: 0.5}, Level: "info"}
}

func TestDecodeReadsOverTheValue(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want func(*outer)
	}{
		{"absent keys keep their values", `{}`, func(*outer) {}},
		{"duration strings", `{"timeout": "1m30s", "inner": {"wait": "250ms"}}`, func(o *outer) {
			o.Timeout, o.Inner.Wait = 90*time.Second, 250*time.Millisecond
		}},
		{"a number is seconds", `{"timeout": 1.5}`, func(o *outer) { o.Timeout = 1500 * time.Millisecond }},
		{"a nested key leaves its siblings", `{"inner": {"ratio": 0.25}}`, func(o *outer) { o.Inner.Ratio = 0.25 }},
		{"pointers, maps and slices of durations", `{"opt": {"wait": "2s"}, "by_name": {"x": {"wait": "3s"}}, "list": ["1s", 2], "nested": {"k": "1h"}}`, func(o *outer) {
			o.Opt = &inner{Wait: 2 * time.Second}
			o.ByName = map[string]inner{"x": {Wait: 3 * time.Second}}
			o.List = []time.Duration{time.Second, 2 * time.Second}
			o.Nested = map[string]time.Duration{"k": time.Hour}
		}},
		{"promoted fields of an embedded struct", `{"depth": 7}`, func(o *outer) { o.Depth = 7 }},
		{"text unmarshalers decode themselves", `{"level": "WARN"}`, func(o *outer) { o.Level = "warn" }},
		{"null leaves a struct and clears a pointer", `{"inner": null, "opt": null}`, func(*outer) {}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, want := base(), base()
			tt.want(&want)
			if err := Decode([]byte(tt.in), &got); err != nil {
				t.Fatal(err)
			}
			if g, w := mustMarshal(t, got), mustMarshal(t, want); g != w {
				t.Errorf("got\n%s\nwant\n%s", g, w)
			}
		})
	}
}

func TestDecodeLeavesSharedValuesAlone(t *testing.T) {
	orig := base()
	orig.Opt = &inner{Wait: time.Second}
	orig.ByName = map[string]inner{"a": {Ratio: 1}}
	orig.List = []time.Duration{time.Second, 2 * time.Second}
	cp := orig // shares the pointers, the map and the slice's array
	in := `{"depth": 9, "opt": {"ratio": 3}, "by_name": {"b": {"ratio": 2}}, "list": ["5s"]}`
	if err := Decode([]byte(in), &cp); err != nil {
		t.Fatal(err)
	}
	if orig.Depth != 1 || orig.Opt.Ratio != 0 || len(orig.ByName) != 1 || orig.List[0] != time.Second {
		t.Errorf("decoding into a copy changed the original: depth %d, opt %+v, by_name %v, list %v", orig.Depth, orig.Opt, orig.ByName, orig.List)
	}
	if cp.Depth != 9 || cp.Opt.Ratio != 3 || cp.Opt.Wait != time.Second || len(cp.ByName) != 2 || len(cp.List) != 1 || cp.List[0] != 5*time.Second {
		t.Errorf("copy decoded to depth %d, opt %+v, by_name %v, list %v", cp.Depth, cp.Opt, cp.ByName, cp.List)
	}
}

func TestDecodeRejects(t *testing.T) {
	tests := []struct {
		name, in, want string
		unknown        bool
	}{
		{"an unknown top-level key", `{"nmae": "x"}`, `"nmae"`, true},
		{"an unknown nested key, by path", `{"inner": {"wiat": "1s"}}`, `"inner.wiat"`, true},
		{"an unknown key in a map value", `{"by_name": {"x": {"rate": 1}}}`, `"by_name.x.rate"`, true},
		{"a skipped field", `{"Skip": 1}`, `"Skip"`, true},
		{"a bad duration", `{"timeout": "soon"}`, `timeout: duration "soon"`, false},
		{"a duration of the wrong type", `{"inner": {"wait": true}}`, `inner.wait`, false},
		{"a wrong type", `{"name": 5}`, `name`, false},
		{"trailing data", `{} {}`, `after the top-level value`, false},
		{"not JSON", `{`, `jsonconf:`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := base()
			err := Decode([]byte(tt.in), &o)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want one containing %s", err, tt.want)
			}
			if errors.Is(err, ErrUnknownKey) != tt.unknown {
				t.Errorf("errors.Is(err, ErrUnknownKey) = %v, want %v", !tt.unknown, tt.unknown)
			}
		})
	}
}

// TestDecodeAtNamesTheFullPath pins that a section read alone names its keys as the whole
// document spells them, in errors of every kind.
func TestDecodeAtNamesTheFullPath(t *testing.T) {
	for in, want := range map[string]string{
		`{"inner": {"wiat": "1s"}}`:       `unknown key "sec.inner.wiat"`,
		`{"by_name": {"x": {"rate": 1}}}`: `unknown key "sec.by_name.x.rate"`,
		`{"timeout": "soon"}`:             `sec.timeout: duration "soon"`,
	} {
		o := base()
		if err := DecodeAt([]byte(in), &o, "sec"); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("DecodeAt(%s) = %v, want an error containing %s", in, err, want)
		}
	}
}

// TestDecodeWithReadsFormerNames pins that a key given by its former name is read at its name
// now and reported, and that the two names given with different values are an error naming
// both, while equal values (read as the field's type: "60s" is "1m") are not.
func TestDecodeWithReadsFormerNames(t *testing.T) {
	renames := []Rename{{"old_timeout", "timeout"}, {"inner.old_wait", "opt.wait"}, {"older_timeout", "timeout"}}
	tests := []struct {
		name, in string
		want     func(*outer)
		moved    []string
		err      string
	}{
		{"a former name alone is read and reported", `{"old_timeout": "5s", "inner": {"old_wait": "2s"}}`, func(o *outer) {
			o.Timeout, o.Opt = 5*time.Second, &inner{Wait: 2 * time.Second}
		}, []string{"sec.old_timeout>sec.timeout", "sec.inner.old_wait>sec.opt.wait"}, ""},
		{"both names, one value", `{"old_timeout": "60s", "timeout": "1m"}`, func(o *outer) { o.Timeout = time.Minute },
			[]string{"sec.old_timeout>sec.timeout"}, ""},
		{"both names, two values", `{"old_timeout": "5s", "timeout": "1m"}`, nil, nil,
			`"sec.old_timeout" and "sec.timeout" name one setting, sec.timeout`},
		{"two former names, two values", `{"old_timeout": "5s", "older_timeout": "6s"}`, nil, nil,
			`"sec.older_timeout" and "sec.old_timeout" name one setting, sec.timeout`},
		{"no former name", `{"timeout": "1m"}`, func(o *outer) { o.Timeout = time.Minute }, nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, want := base(), base()
			var moved []string
			err := DecodeWith([]byte(tt.in), &got, Options{Path: "sec", Renames: renames, Moved: func(from, to string) {
				moved = append(moved, from+">"+to)
			}})
			if tt.err != "" {
				if !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want an ErrConflict containing %s", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.want(&want)
			if g, w := mustMarshal(t, got), mustMarshal(t, want); g != w {
				t.Errorf("got\n%s\nwant\n%s", g, w)
			}
			if strings.Join(moved, " ") != strings.Join(tt.moved, " ") {
				t.Errorf("moved %q, want %q", moved, tt.moved)
			}
		})
	}
}

func TestMarshalRoundTrips(t *testing.T) {
	o := base()
	o.Opt = &inner{Wait: 1500 * time.Millisecond}
	o.ByName = map[string]inner{"b": {Ratio: 1}, "a": {Wait: time.Hour}}
	o.List = []time.Duration{5 * time.Minute}
	out := mustMarshal(t, o)
	for _, want := range []string{`"timeout": "1s"`, `"wait": "1m"`, `"wait": "1h"`, `"5m"`, `"level": "INFO"`, `"depth": 1`} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %s:\n%s", want, out)
		}
	}
	if strings.Index(out, `"depth"`) > strings.Index(out, `"name"`) || strings.Index(out, `"name"`) > strings.Index(out, `"timeout"`) {
		t.Errorf("fields out of declaration order:\n%s", out)
	}
	if strings.Contains(out, "empty") || strings.Contains(out, "Skip") {
		t.Errorf("omitempty or json:\"-\" field written:\n%s", out)
	}
	back := outer{Embedded: &Embedded{}}
	if err := Decode([]byte(out), &back); err != nil {
		t.Fatal(err)
	}
	if again := mustMarshal(t, back); again != out {
		t.Errorf("round trip changed the output:\n%s\nthen\n%s", out, again)
	}
}

func TestFormatDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0: "0s", 500 * time.Millisecond: "500ms", time.Minute: "1m", 90 * time.Second: "1m30s",
		time.Hour: "1h", time.Hour + time.Minute: "1h1m", time.Hour + time.Second: "1h0m1s",
	} {
		if got := FormatDuration(d); got != want {
			t.Errorf("FormatDuration(%v) = %q, want %q", d, got, want)
		}
		if back, err := time.ParseDuration(FormatDuration(d)); err != nil || back != d {
			t.Errorf("FormatDuration(%v) = %q does not parse back: %v, %v", d, FormatDuration(d), back, err)
		}
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(`{"timeout": "1s", "inner": {"wait": 2}, "by_name": {"x": {}}}`)
	f.Add(`{"list": ["1s", null], "opt": null}`)
	f.Fuzz(func(t *testing.T, in string) {
		o := base()
		if Decode([]byte(in), &o) != nil {
			return
		}
		out := mustMarshal(t, o)
		back := base()
		if err := Decode([]byte(out), &back); err != nil {
			t.Fatalf("Marshal's output %s does not decode: %v", out, err)
		}
	})
}

func mustMarshal(t *testing.T, v any) string {
	t.Helper()
	b, err := Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

type tuned struct {
	Rate   int           `json:"rate"`
	Gain   float64       `json:"gain,advanced"`
	Window time.Duration `json:"window,advanced"`
}

// TestAdvancedFields pins where a field tagged advanced sits: in the struct's "advanced"
// object, which Marshal writes last and Decode reads; beside the others, its former place, it
// is read and reported; given in both places with two values, or an "advanced" key that is
// no advanced field, it is refused by full path.
func TestAdvancedFields(t *testing.T) {
	b, err := Marshal(tuned{Rate: 1, Gain: 0.5, Window: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if want := "{\n  \"rate\": 1,\n  \"advanced\": {\n    \"gain\": 0.5,\n    \"window\": \"1s\"\n  }\n}\n"; string(b) != want {
		t.Errorf("Marshal = %s, want %s", b, want)
	}
	for _, tt := range []struct {
		name, in string
		want     tuned
		moved    string
		err      string
	}{
		{"in advanced", `{"advanced": {"gain": 2, "window": "2s"}}`, tuned{Gain: 2, Window: 2 * time.Second}, "", ""},
		{"beside the others", `{"gain": 2}`, tuned{Gain: 2}, "s.gain>s.advanced.gain", ""},
		{"both places, one value", `{"window": 1, "advanced": {"window": "1s"}}`, tuned{Window: time.Second}, "", ""},
		{"both places, two values", `{"gain": 1, "advanced": {"gain": 2}}`, tuned{}, "", `"s.gain" and "s.advanced.gain" name one setting`},
		{"not an advanced field", `{"advanced": {"rate": 2}}`, tuned{}, "", `unknown key "s.advanced.rate"`},
		{"unknown in advanced", `{"advanced": {"gian": 2}}`, tuned{}, "", `unknown key "s.advanced.gian"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var got tuned
			var moved []string
			err := DecodeWith([]byte(tt.in), &got, Options{Path: "s", Moved: func(from, to string) { moved = append(moved, from+">"+to) }})
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want one containing %s", err, tt.err)
				}
				return
			}
			if err != nil || got != tt.want || strings.Join(moved, " ") != tt.moved {
				t.Errorf("got %+v, %v, moved %q; want %+v, moved %q", got, err, moved, tt.want, tt.moved)
			}
		})
	}
	var back tuned
	if err := Decode(b, &back); err != nil || back != (tuned{Rate: 1, Gain: 0.5, Window: time.Second}) {
		t.Errorf("round trip: %+v, %v", back, err)
	}
}
