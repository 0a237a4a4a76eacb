package carbon

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

var t0 = time.Date(2026, 3, 4, 10, 20, 0, 0, time.UTC)

func mustTracker(t *testing.T, cfg Config) *Tracker {
	t.Helper()
	tr, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func TestNewValidates(t *testing.T) {
	bad := map[string]func(*Config){
		"negative threshold": func(c *Config) { c.Threshold = -1 },
		"negative poll":      func(c *Config) { c.PollInterval = -time.Second },
		"negative max age":   func(c *Config) { c.MaxAge = -time.Second },
		"negative backoff":   func(c *Config) { c.BackoffMin = -time.Second },
		"max under min":      func(c *Config) { c.BackoffMax = c.BackoffMin - 1 },
		"fail mode":          func(c *Config) { c.FailMode = 7 },
	}
	for name, mut := range bad {
		t.Run(name, func(t *testing.T) {
			cfg := DefaultConfig()
			mut(&cfg)
			if _, err := New(cfg); !errors.Is(err, ErrConfig) {
				t.Fatalf("New = %v, want ErrConfig", err)
			}
		})
	}
	if _, err := New(DefaultConfig()); err != nil {
		t.Fatalf("DefaultConfig rejected: %v", err)
	}
}

// TestZeroConfigIsTheDefault pins the zero rule: a zero field takes its default.
func TestZeroConfigIsTheDefault(t *testing.T) {
	tr := mustTracker(t, Config{})
	if tr.Config() != DefaultConfig() {
		t.Errorf("New(Config{}) filled %+v, want %+v", tr.Config(), DefaultConfig())
	}
	if got := mustTracker(t, Config{BackoffMin: time.Hour}).Config().BackoffMax; got != time.Hour {
		t.Errorf("a zero backoff max under a longer min filled to %v, want the min", got)
	}
	for _, m := range []FailMode{FailOpen, FailClosed} {
		b, err := m.MarshalText()
		var back FailMode
		if err != nil || back.UnmarshalText(b) != nil || back != m {
			t.Errorf("fail mode %v: text %q, %v, read back %v", m, b, err, back)
		}
	}
}

func TestParseFailMode(t *testing.T) {
	for in, want := range map[string]FailMode{"open": FailOpen, "closed": FailClosed, " Closed ": FailClosed} {
		if got, err := ParseFailMode(in); err != nil || got != want {
			t.Errorf("ParseFailMode(%q) = %v, %v", in, got, err)
		}
	}
	if _, err := ParseFailMode("ajar"); !errors.Is(err, ErrConfig) {
		t.Errorf("ParseFailMode(ajar) = %v, want ErrConfig", err)
	}
}

func TestStalenessAndFailModes(t *testing.T) {
	const maxAge = 10 * time.Minute
	reading := func(intensity float64) Reading { return Reading{Intensity: intensity, At: t0} }
	tests := []struct {
		name      string
		mode      FailMode
		record    *Reading
		at        time.Duration // time after t0 of the question
		fresh     Freshness
		failMode  bool
		wantDirty bool
	}{
		{"none open", FailOpen, nil, 0, FreshnessNone, true, false},
		{"none closed", FailClosed, nil, 0, FreshnessNone, true, true},
		{"fresh dirty open", FailOpen, new(reading(450)), time.Minute, FreshnessFresh, false, true},
		{"fresh clean closed", FailClosed, new(reading(120)), time.Minute, FreshnessFresh, false, false},
		{"at threshold is clean", FailClosed, new(reading(300)), 0, FreshnessFresh, false, false},
		{"edge of max age fresh", FailOpen, new(reading(450)), maxAge, FreshnessFresh, false, true},
		{"stale dirty open", FailOpen, new(reading(450)), maxAge + time.Second, FreshnessStale, true, false},
		{"stale clean closed", FailClosed, new(reading(120)), maxAge + time.Second, FreshnessStale, true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Threshold, cfg.MaxAge, cfg.FailMode = 300, maxAge, tt.mode
			tr := mustTracker(t, cfg)
			if tt.record != nil {
				tr.Record(t0, *tt.record)
			}
			now := t0.Add(tt.at)
			_, st := tr.Current(now)
			if st.Freshness != tt.fresh || st.FailModeActive != tt.failMode || st.FailMode != tt.mode {
				t.Fatalf("status = %+v, want freshness %s, fail mode active %v", st, tt.fresh, tt.failMode)
			}
			if got := tr.Dirty(now); got != tt.wantDirty {
				t.Fatalf("Dirty = %v, want %v", got, tt.wantDirty)
			}
			// A peer judges this grid from the gossiped intensity and fail-mode flag: same answer.
			r, _ := tr.Current(now)
			if got := cfg.Dirty(r.Intensity, st.FailModeActive); got != tt.wantDirty {
				t.Fatalf("Config.Dirty of the gossiped figures = %v, Tracker.Dirty = %v", got, tt.wantDirty)
			}
		})
	}
}

func TestStaleWhileProviderFails(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxAge, cfg.FailMode = 10*time.Minute, FailClosed
	tr := mustTracker(t, cfg)
	tr.Record(t0, Reading{Intensity: 100, At: t0})
	boom := errors.New("boom")
	tr.RecordError(t0.Add(5*time.Minute), boom)
	r, st := tr.Current(t0.Add(5 * time.Minute))
	if r.Intensity != 100 || st.Freshness != FreshnessFresh || st.Failures != 1 || !errors.Is(st.LastError, boom) {
		t.Fatalf("after one error: %+v %+v; want last reading kept, fresh, 1 failure", r, st)
	}
	if !tr.Dirty(t0.Add(11 * time.Minute)) {
		t.Fatal("fail-closed tracker not dirty once the kept reading is stale")
	}
	tr.Record(t0.Add(12*time.Minute), Reading{Intensity: 100, At: t0.Add(12 * time.Minute)})
	if _, st := tr.Current(t0.Add(12 * time.Minute)); st.Failures != 0 || st.LastError != nil || st.FailModeActive {
		t.Fatalf("good reading did not reset: %+v", st)
	}
}

func TestAgeFromProviderTimestamp(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxAge = time.Hour
	tr := mustTracker(t, cfg)
	// Fetched just now, but the provider says the value is 2 hours old.
	tr.Record(t0, Reading{Intensity: 500, At: t0.Add(-2 * time.Hour), Fetched: t0})
	if _, st := tr.Current(t0); st.Freshness != FreshnessStale || st.Age != 2*time.Hour {
		t.Fatalf("status %+v: want stale by the reading's own timestamp", st)
	}
	// Without At, Fetched counts.
	tr.Record(t0, Reading{Intensity: 500})
	if _, st := tr.Current(t0.Add(time.Minute)); st.Freshness != FreshnessFresh || st.Age != time.Minute {
		t.Fatalf("status %+v: want fresh, age 1m from Fetched", st)
	}
}

func TestBackoff(t *testing.T) {
	cfg := DefaultConfig()
	cfg.BackoffMin, cfg.BackoffMax = time.Second, 10*time.Second
	tr := mustTracker(t, cfg)
	if got := tr.NextPoll(t0); !got.Equal(t0) {
		t.Fatalf("first NextPoll = %s, want now", got)
	}
	want := []time.Duration{1, 2, 4, 8, 10, 10, 10}
	for i, w := range want {
		now := t0.Add(time.Duration(i) * time.Hour)
		tr.RecordError(now, fmt.Errorf("fail %d", i))
		if got := tr.NextPoll(now).Sub(now); got != w*time.Second {
			t.Fatalf("error %d: delay %s, want %s", i+1, got, w*time.Second)
		}
	}
	// Many failures must not overflow the doubling.
	for range 100 {
		tr.RecordError(t0, errors.New("x"))
	}
	if got := tr.NextPoll(t0).Sub(t0); got != 10*time.Second {
		t.Fatalf("after 100 errors delay %s, want cap", got)
	}
	// A 429 shorter than the backoff does not shorten it; a longer one lengthens it.
	tr.RecordError(t0, &RateLimitedError{RetryAfter: 3 * time.Second})
	if got := tr.NextPoll(t0).Sub(t0); got != 10*time.Second {
		t.Fatalf("short Retry-After: delay %s, want 10s", got)
	}
	tr.RecordError(t0, fmt.Errorf("wrapped: %w", &RateLimitedError{RetryAfter: time.Hour}))
	if got := tr.NextPoll(t0).Sub(t0); got != time.Hour {
		t.Fatalf("long Retry-After: delay %s, want 1h", got)
	}
	tr.Record(t0, Reading{Intensity: 1, At: t0})
	tr.RecordError(t0, errors.New("x"))
	if got := tr.NextPoll(t0).Sub(t0); got != time.Second {
		t.Fatalf("after a good reading backoff restarts: delay %s, want 1s", got)
	}
}

func TestNextPollAfterReading(t *testing.T) {
	cfg := DefaultConfig()
	cfg.PollInterval = 5 * time.Minute
	tr := mustTracker(t, cfg)
	tests := []struct {
		name       string
		nextChange time.Time
		want       time.Time
	}{
		{"unknown", time.Time{}, t0.Add(5 * time.Minute)},
		{"sooner change", t0.Add(2 * time.Minute), t0.Add(2 * time.Minute)},
		{"later change", t0.Add(time.Hour), t0.Add(5 * time.Minute)},
		{"past change", t0.Add(-time.Minute), t0.Add(5 * time.Minute)},
	}
	for _, tt := range tests {
		tr.Record(t0, Reading{Intensity: 1, At: t0, NextChange: tt.nextChange})
		if got := tr.NextPoll(t0); !got.Equal(tt.want) {
			t.Errorf("%s: NextPoll = %s, want %s", tt.name, got, tt.want)
		}
	}
}

func TestTrackerDecideRetryAfter(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Threshold, cfg.PollInterval, cfg.FailMode = 300, 5*time.Minute, FailClosed
	tests := []struct {
		name   string
		record *Reading
		now    time.Time
		want   time.Duration
	}{
		{"next change known", &Reading{Intensity: 500, At: t0, NextChange: t0.Add(40 * time.Minute)}, t0.Add(10 * time.Minute), 30 * time.Minute},
		{"next change passed", &Reading{Intensity: 500, At: t0, NextChange: t0.Add(time.Minute)}, t0.Add(10 * time.Minute), 5 * time.Minute},
		{"no reading, closed", nil, t0, 5 * time.Minute},
		{"sub-second rounds up", &Reading{Intensity: 500, At: t0, NextChange: t0.Add(time.Millisecond)}, t0, time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := mustTracker(t, cfg)
			if tt.record != nil {
				tr.Record(t0, *tt.record)
			}
			d := tr.Decide(tt.now, -1, []Option{{Name: "b", Dirty: true, HasRoom: true}})
			if d.Action != ActionDefer || d.Reason != ReasonDeferred || d.RetryAfter != tt.want {
				t.Fatalf("Decide = %+v, want defer with RetryAfter %s", d, tt.want)
			}
			if d := tr.Decide(tt.now, 0, nil); d.Action != ActionAny || d.RetryAfter != 0 {
				t.Fatalf("normal priority affected: %+v", d)
			}
		})
	}
}

// TestSetConfig pins that a running tracker judges its reading by a new threshold at once and
// refuses an invalid config whole.
func TestSetConfig(t *testing.T) {
	tr := mustTracker(t, Config{Threshold: 300})
	tr.Record(t0, Reading{Intensity: 250, At: t0})
	if tr.Dirty(t0) {
		t.Fatal("250 is dirty under 300")
	}
	if err := tr.SetConfig(Config{Threshold: 200}); err != nil {
		t.Fatal(err)
	}
	if !tr.Dirty(t0) || tr.Config().MaxAge != DefaultConfig().MaxAge {
		t.Errorf("after threshold 200: dirty %v, max age %v", tr.Dirty(t0), tr.Config().MaxAge)
	}
	if err := tr.SetConfig(Config{Threshold: -1}); !errors.Is(err, ErrConfig) || tr.Config().Threshold != 200 {
		t.Errorf("threshold -1: %v, threshold now %v", err, tr.Config().Threshold)
	}
}
