package route

import (
	"errors"
	"math"
	"testing"
	"time"
)

// TestRetryBudget drives one budget through requests and retries and checks each retry's
// verdict: retries of the last window stay within MinRetries plus Ratio times its requests.
func TestRetryBudget(t *testing.T) {
	type step struct {
		at       time.Duration // since t0
		requests int           // counted first
		retry    bool          // then one retry, whose verdict is want
		want     bool
	}
	ms := time.Millisecond
	cfg := RetryBudgetConfig{Ratio: 0.2, MinRetries: 1, Window: time.Second}
	tests := []struct {
		name  string
		cfg   RetryBudgetConfig
		steps []step
	}{
		{"the floor allows retries with no traffic", cfg, []step{
			{retry: true, want: true}, {retry: true, want: false},
		}},
		{"a share of the requests on top of the floor", cfg, []step{
			{requests: 10, retry: true, want: true}, {retry: true, want: true}, {retry: true, want: true},
			{retry: true, want: false},
		}},
		{"a refused retry is not counted", cfg, []step{
			{retry: true, want: true}, {retry: true, want: false}, {requests: 5, retry: true, want: true},
		}},
		{"retries leave the window", cfg, []step{
			{retry: true, want: true}, {at: 500 * ms, retry: true, want: false},
			{at: 1000 * ms, retry: true, want: true}, {at: 1050 * ms, retry: true, want: false},
		}},
		{"requests leave the window too", cfg, []step{
			{requests: 5, retry: true, want: true}, {retry: true, want: true},
			{at: 1000 * ms, retry: true, want: true}, {at: 1000 * ms, retry: true, want: false},
		}},
		{"a slot reused a whole window later starts empty", cfg, []step{
			{requests: 100}, {at: 3000 * ms, retry: true, want: true}, {at: 3000 * ms, retry: true, want: false},
		}},
		{"no floor: nothing without traffic", RetryBudgetConfig{Ratio: 0.5, MinRetries: -1}, []step{
			{retry: true, want: false}, {requests: 2, retry: true, want: true}, {retry: true, want: false},
		}},
		{"a negative ratio turns the budget off", RetryBudgetConfig{Ratio: -1, MinRetries: -1}, []step{
			{retry: true, want: true}, {retry: true, want: true}, {retry: true, want: true},
		}},
		{"defaults: three a window, plus a fifth of its requests", RetryBudgetConfig{}, []step{
			{retry: true, want: true}, {retry: true, want: true}, {retry: true, want: true}, {retry: true, want: false},
			{at: 9 * time.Second, requests: 10, retry: true, want: true}, {at: 9 * time.Second, retry: true, want: true},
			{at: 9 * time.Second, retry: true, want: false},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := NewRetryBudget(tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range tt.steps {
				now := t0.Add(s.at)
				for range s.requests {
					b.Request(now)
				}
				if !s.retry {
					continue
				}
				if got := b.Retry(now); got != s.want {
					t.Fatalf("step %d (at %v): retry allowed %v, want %v", i, s.at, got, s.want)
				}
			}
		})
	}
}

func TestRetryBudgetConfig(t *testing.T) {
	for _, tt := range []struct {
		name string
		cfg  RetryBudgetConfig
		ok   bool
	}{
		{"zero is the defaults", RetryBudgetConfig{}, true},
		{"off", RetryBudgetConfig{Ratio: -1}, true},
		{"negative window", RetryBudgetConfig{Window: -time.Second}, false},
		{"infinite ratio", RetryBudgetConfig{Ratio: math.Inf(1)}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewRetryBudget(tt.cfg)
			if (err == nil) != tt.ok || err != nil && !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("NewRetryBudget(%+v) = %v, want ok %v", tt.cfg, err, tt.ok)
			}
		})
	}
	if got := DefaultConfig().RetryBudget; got != DefaultRetryBudgetConfig() {
		t.Errorf("route defaults carry retry budget %+v, want %+v", got, DefaultRetryBudgetConfig())
	}
}
