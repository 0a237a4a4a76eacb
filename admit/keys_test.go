package admit

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestParseKeys(t *testing.T) {
	ha, hb := HashKey("key-a"), HashKey("key-b")
	tests := []struct {
		name    string
		in      string
		want    []KeyEntry
		wantErr bool
	}{
		{"empty", "", nil, false},
		{"comments", "# nothing\n\n   \n", nil, false},
		{"text", ha + " acme\n" + hb + " beta 100 500\n", []KeyEntry{{SHA256: ha, Tenant: "acme"}, {SHA256: hb, Tenant: "beta", Rate: 100, Burst: 500}}, false},
		{"json", `[{"sha256":"` + ha + `","tenant":"acme","rate_tokens_per_second":5}]`, []KeyEntry{{SHA256: ha, Tenant: "acme", Rate: 5}}, false},
		{"three fields", ha + " acme 100\n", nil, true},
		{"short hash", "abcd acme\n", nil, true},
		{"not hex", "zz" + ha[2:] + " acme\n", nil, true},
		{"duplicate", ha + " a\n" + ha + " b\n", nil, true},
		{"negative rate", ha + " a -1 10\n", nil, true},
		{"bad json", `[{"sha256":1}]`, nil, true},
		{"json empty tenant", `[{"sha256":"` + ha + `"}]`, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseKeys([]byte(tt.in))
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if err != nil {
				if !errors.Is(err, ErrKeys) {
					t.Errorf("error %v is not ErrKeys", err)
				}
				return
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func FuzzParseKeys(f *testing.F) {
	f.Add([]byte(HashKey("k") + " t 10 20\n# c\n"))
	f.Add([]byte(`[{"sha256":"` + HashKey("k") + `","tenant":"t"}]`))
	f.Add([]byte("x y z w\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		entries, err := ParseKeys(data)
		if err != nil {
			return
		}
		// Whatever parses must load, and every entry must then be usable.
		k, err := NewKeys(entries, 0, 0, 0)
		if err != nil {
			t.Fatalf("parsed entries do not load: %v", err)
		}
		if k.Len() != len(entries) {
			t.Fatalf("Len = %d, want %d", k.Len(), len(entries))
		}
	})
}

// TestKeysReplaceKeepsBucket pins down that a hot reload does not refill an exhausted bucket.
func TestKeysReplaceKeepsBucket(t *testing.T) {
	now := time.Unix(1000, 0)
	e := []KeyEntry{{SHA256: HashKey("k"), Tenant: "t", Rate: 10, Burst: 100}}
	k, err := NewKeys(e, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	st := k.lookup("k")
	if _, ok := st.take(now, 100); !ok {
		t.Fatal("first take of a full bucket refused")
	}
	if err := k.Replace(e, now); err != nil {
		t.Fatal(err)
	}
	if _, ok := k.lookup("k").take(now, 50); ok {
		t.Fatal("a reload refilled the bucket")
	}
	if k.lookup("other") != nil {
		t.Fatal("unknown key found")
	}
	if err := k.Replace(nil, now); err != nil || k.Len() != 0 || k.lookup("k") != nil {
		t.Fatalf("Replace(nil): err %v, len %d", err, k.Len())
	}
}

// TestOversizeRequestIsChargedWhole: a request larger than the key's burst passes on a full
// bucket and is charged whole, so the key then waits out its cost at its rate; charged only
// the burst, a key of 20 tokens a second ran a 30,000-token request every 5 s.
func TestOversizeRequestIsChargedWhole(t *testing.T) {
	now := time.Unix(1000, 0)
	k, err := NewKeys([]KeyEntry{{SHA256: HashKey("k"), Tenant: "t", Rate: 20, Burst: 100}}, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	st := k.lookup("k")
	if _, ok := st.take(now, 30000); !ok {
		t.Fatal("a request over the burst refused on a full bucket")
	}
	wait, ok := st.take(now.Add(5100*time.Millisecond), 100)
	if ok || wait < 1400*time.Second {
		t.Fatalf("5.1 s after 30,000 tokens at 20/s: ok %v, wait %v; want a refusal with about 1,490 s to wait", ok, wait)
	}
	if _, ok := st.take(now.Add(5100*time.Millisecond+wait), 100); !ok {
		t.Errorf("refused after the wait it was given (%v)", wait)
	}
}

// TestKeysValidChargesNothing pins the admin paths' check: a listed key is valid, an unknown
// or empty one is not, and asking does not take from the key's bucket.
func TestKeysValidChargesNothing(t *testing.T) {
	now := time.Unix(1000, 0)
	k, err := NewKeys([]KeyEntry{{SHA256: HashKey("k"), Tenant: "t", Rate: 1, Burst: 10}}, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for range 100 {
		if !k.Valid("k") {
			t.Fatal("a listed key is not valid")
		}
	}
	if k.Valid("other") || k.Valid("") {
		t.Error("an unknown or empty key is valid")
	}
	if _, ok := k.lookup("k").take(now, 10); !ok {
		t.Error("Valid took from the key's bucket")
	}
}

func TestKeysZeroValueIsOpen(t *testing.T) {
	var k Keys
	if k.Len() != 0 || k.lookup("x") != nil {
		t.Fatal("zero Keys is not empty")
	}
}

// TestJSONKeyFileNamesPriorities pins that a JSON key file's max_priority takes the names the
// text format and --max-priority take, as well as an integer, and refuses anything else,
// naming the entry.
func TestJSONKeyFileNamesPriorities(t *testing.T) {
	entry := func(p string) []byte {
		return []byte(`[{"sha256":"` + HashKey("sk-a") + `","tenant":"a"},{"sha256":"` + HashKey("sk-b") + `","tenant":"b","max_priority":` + p + `}]`)
	}
	for in, want := range map[string]Priority{`"high"`: PriorityHigh, `"Low"`: PriorityLow, `"normal"`: PriorityNormal, `5`: 5, `-1000`: -1000} {
		got, err := ParseKeys(entry(in))
		if err != nil || got[1].MaxPriority == nil || *got[1].MaxPriority != want {
			t.Errorf("max_priority %s: %+v, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{`"urgent"`, `""`, `1.5`, `1001`, `true`} {
		_, err := ParseKeys(entry(in))
		if !errors.Is(err, ErrKeys) || !strings.Contains(err.Error(), "entry 2: ") || !strings.Contains(err.Error(), "max_priority") {
			t.Errorf("max_priority %s: %v, want an ErrKeys naming entry 2's max_priority", in, err)
		}
	}
	if _, err := ParseKeys(entry(`"urgent"`)); err == nil || !strings.Contains(err.Error(), "want high, normal, low or an integer") {
		t.Errorf("a bad word's error does not say what to write: %v", err)
	}
}

// TestKeysCapThePriority pins who may ask for what: a key's max_priority (text or JSON) caps
// X-Kvmesh-Priority, a key that names none is capped at normal (or the config's
// keys.max_priority), and an open mesh trusts the header unless keys.max_priority caps it.
// Asking for less than the cap is never raised.
func TestKeysCapThePriority(t *testing.T) {
	text := HashKey("sk-gold") + " gold 0 0 high\n" + HashKey("sk-batch") + " batch 0 0 low\n" + HashKey("sk-plain") + " plain\n"
	entries, err := ParseKeys([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	js, err := ParseKeys([]byte(`[{"sha256":"` + HashKey("sk-gold") + `","tenant":"gold","max_priority":1}]`))
	if err != nil || js[0].MaxPriority == nil || *js[0].MaxPriority != 1 {
		t.Fatalf("JSON max_priority: %+v, %v", js, err)
	}
	if _, err := ParseKeys([]byte(HashKey("k") + " t 0 0 urgent\n")); err == nil {
		t.Error("a max_priority that is no priority was accepted")
	}
	if _, err := ParseKeys([]byte(`[{"sha256":"` + HashKey("k") + `","tenant":"t","max_priority":5000}]`)); err == nil {
		t.Error("max_priority 5000 was accepted")
	}
	prio := func(v int) *int { return &v }
	tests := []struct {
		name    string
		keys    []KeyEntry
		cap     *int
		key     string
		asked   int
		want    int
		clamped bool
	}{
		{"key allowed high asks high", entries, nil, "sk-gold", 10, 10, false},
		{"key allowed high asks 1000", entries, nil, "sk-gold", 1000, 10, true},
		{"batch key asks 1000", entries, nil, "sk-batch", 1000, -10, true},
		{"batch key asks lower", entries, nil, "sk-batch", -20, -20, false},
		{"a key naming none: normal", entries, nil, "sk-plain", 1, 0, true},
		{"a key naming none: the config's cap", entries, prio(1), "sk-plain", 1, 1, false},
		{"open mesh trusts the header", nil, nil, "", 1000, 1000, false},
		{"open mesh under a cap", nil, prio(0), "", 1000, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAdmitter(t, func(c *Config) { c.Keys.MaxPriority = tt.cap })
			if err := a.Keys().Replace(tt.keys, t0); err != nil {
				t.Fatal(err)
			}
			r := baseReq()
			r.APIKey, r.Priority = tt.key, tt.asked
			_, d := a.Identify(t0, r)
			if d.Refused() || d.Priority != tt.want || d.PriorityClamped != tt.clamped {
				t.Fatalf("Identify: %+v, want priority %d clamped %v", d, tt.want, tt.clamped)
			}
		})
	}
}

// TestChargeIsWhatCanRun: a key is charged what a request will run, as layer 3 admits it, not
// what it wrote: a max_tokens past the context (refused at layer 3) costs nothing, so one
// refused request cannot lock its key out for hours; a clamped one costs the clamp.
func TestChargeIsWhatCanRun(t *testing.T) {
	now := time.Unix(1000, 0)
	cfg := DefaultConfig()
	cfg.Models = map[string]ModelConfig{"m": {ContextTokens: 8192}}
	cfg.Budget.MaxMaxTokens, cfg.Budget.ClampMaxTokens = 2000, true
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Keys().Replace([]KeyEntry{{SHA256: HashKey("k"), Tenant: "t", Rate: 1000, Burst: 4000}}, now); err != nil {
		t.Fatal(err)
	}
	identify := func(at time.Duration, maxTokens int) Decision {
		_, d := a.Identify(now.Add(at), Request{ID: "r", Model: "m", PromptTokens: 100, MaxTokens: &maxTokens, APIKey: "k"})
		return d
	}
	huge := 1<<31 - 1
	if d := identify(0, huge); d.Refused() || a.Budget(Request{Model: "m", PromptTokens: 100, MaxTokens: &huge}).MaxTokens != 2000 {
		t.Fatalf("a clamped request: %+v", d)
	}
	// Charged 2,100 (the clamp): 1,900 left, so 1,950 more does not fit; 0.1 s later it does.
	if d := identify(0, 1850); !d.Refused() {
		t.Errorf("2,100 + 1,950 tokens fit a bucket of 4,000: the clamped request was charged less than its clamp")
	}
	if d := identify(100*time.Millisecond, 1850); d.Refused() {
		t.Errorf("refused after the refill (retry after %v): the clamped request was charged more than its clamp", d.RetryAfter)
	}
	cfg.Budget.ClampMaxTokens = false
	if err := a.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	for range 10 { // refused at layer 3 (over the limit): charged nothing, however many
		if d := identify(time.Second, huge); d.Refused() {
			t.Fatalf("a request layer 3 will refuse was refused at layer 2: %+v", d)
		}
	}
	// 50 left at 0.1 s, 2,950 at 3 s: enough for 1,900 unless the refused ones were charged.
	if d := identify(3*time.Second, 1800); d.Refused() {
		t.Errorf("refused (retry after %v) after requests layer 3 refuses: they were charged", d.RetryAfter)
	}
}
