package admit

import (
	"strings"
	"testing"
	"time"
)

func keyedAdmitter(t *testing.T) *Admitter {
	t.Helper()
	a := newAdmitter(t, nil)
	entries := []KeyEntry{
		{SHA256: HashKey("alice-key"), Tenant: "alice", Rate: 100, Burst: 1000},
		{SHA256: HashKey("bob-key"), Tenant: "bob", Rate: 100, Burst: 1000},
		{SHA256: HashKey("free-key"), Tenant: "free"},
	}
	if err := a.Keys().Replace(entries, t0); err != nil {
		t.Fatal(err)
	}
	return a
}

func TestIdentify(t *testing.T) {
	open := newAdmitter(t, nil)
	r := baseReq()
	r.Tenant = "forged"
	if tenant, d := open.Identify(t0, r); d.Refused() || tenant != "default" {
		t.Fatalf("open mode: tenant %q, %+v", tenant, d)
	}
	a := keyedAdmitter(t)
	tests := []struct {
		name   string
		key    string
		tenant string
		code   string
	}{
		{"missing", "", "", CodeInvalidAPIKey},
		{"wrong", "mallory", "", CodeInvalidAPIKey},
		{"hash itself is not a key", HashKey("alice-key"), "", CodeInvalidAPIKey},
		{"alice", "alice-key", "alice", CodeAccepted},
		{"unlimited", "free-key", "free", CodeAccepted},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := baseReq()
			r.APIKey = tt.key
			r.Tenant = "forged"
			tenant, d := a.Identify(t0, r)
			if tenant != tt.tenant || d.Code != tt.code {
				t.Fatalf("Identify = %q, %+v; want %q %s", tenant, d, tt.tenant, tt.code)
			}
			if d.Refused() && (d.Status != 401 || d.Layer != LayerIdentity) {
				t.Errorf("refusal %+v", d)
			}
		})
	}
}

// TestRateLimitPerKey pins down that the bucket is the key's, whatever else the request says:
// tenant, priority, agent, id and SLO fields (all header-driven) do not move it, and another
// key is not charged.
func TestRateLimitPerKey(t *testing.T) {
	a := keyedAdmitter(t)
	mk := func(key string, i int) Request {
		r := baseReq()
		r.APIKey, r.PromptTokens, r.MaxTokens = key, 300, ptr(300) // cost 600 of a 1000 burst
		r.ID = strings.Repeat("x", i+1)
		r.Tenant, r.Priority, r.Agent, r.TTFTSLO = "t"+r.ID, i%3-1, "agent"+r.ID, time.Duration(i+1)*time.Second
		return r
	}
	if _, d := a.Identify(t0, mk("alice-key", 0)); d.Refused() {
		t.Fatalf("first request refused: %+v", d)
	}
	for i := 1; i < 5; i++ {
		_, d := a.Identify(t0, mk("alice-key", i))
		if d.Code != CodeRateLimited || d.Status != 429 {
			t.Fatalf("request %d with other fields not limited: %+v", i, d)
		}
		// 400 tokens left, 600 needed, 100 tokens/s: 2 s.
		if d.RetryAfter < 1900*time.Millisecond || d.RetryAfter > 2100*time.Millisecond {
			t.Errorf("RetryAfter %v, want about 2s", d.RetryAfter)
		}
	}
	if _, d := a.Identify(t0, mk("bob-key", 0)); d.Refused() {
		t.Fatalf("bob charged for alice: %+v", d)
	}
	// Refused attempts must not have consumed tokens: after 2 s alice fits again.
	if _, d := a.Identify(t0.Add(2*time.Second), mk("alice-key", 9)); d.Refused() {
		t.Fatalf("alice still limited after the advertised wait: %+v", d)
	}
	// Through Check too: the whole pipeline honours the bucket.
	r := mk("alice-key", 10)
	if d := a.Check(t0.Add(2*time.Second), r, []Option{idle()}); d.Code != CodeRateLimited {
		t.Fatalf("Check ignored the bucket: %+v", d)
	}
}

// TestGranted pins the priority a request runs at under its key's cap: what it asked for, or
// the cap when it asked for more, and then says so.
func TestGranted(t *testing.T) {
	for _, tt := range []struct {
		asked, limit, want int
		clamped            bool
	}{
		{0, 0, 0, false},
		{5, 0, 0, true},
		{-3, 0, -3, false},
		{maxPriorityValue, maxPriorityValue, maxPriorityValue, false},
		{2, 1, 1, true},
	} {
		d := granted(Decision{Action: Accept, Tenant: "t"}, tt.asked, tt.limit)
		if d.Priority != tt.want || d.PriorityClamped != tt.clamped || d.Tenant != "t" {
			t.Errorf("granted(asked %d, cap %d) = %d clamped %v, want %d clamped %v",
				tt.asked, tt.limit, d.Priority, d.PriorityClamped, tt.want, tt.clamped)
		}
	}
}
