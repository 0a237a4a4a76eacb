package route

import (
	"fmt"
	"math"
	"sync"
	"time"
)

// RetryBudgetConfig configures a RetryBudget. Zero fields take DefaultRetryBudgetConfig's
// values.
type RetryBudgetConfig struct {
	// Ratio is the share of the requests of the last Window that may be retried, on top of
	// MinRetries. Default 0.2 (Envoy's retry budget). Negative (-1) turns the budget off: every
	// retry is allowed.
	Ratio float64 `json:"ratio"`
	// MinRetries is how many retries each Window allows whatever the traffic, so that a quiet
	// node can still retry. Default 3. Negative (-1): none.
	MinRetries int `json:"min_retries"`
	// Window is how far back requests and retries count. Default 10s.
	Window time.Duration `json:"window"`
}

// DefaultRetryBudgetConfig returns the documented defaults.
func DefaultRetryBudgetConfig() RetryBudgetConfig {
	return RetryBudgetConfig{Ratio: 0.2, MinRetries: 3, Window: 10 * time.Second}
}

// fill sets zero fields to their defaults, then validates.
func (c *RetryBudgetConfig) fill() error {
	d := DefaultRetryBudgetConfig()
	if c.Ratio == 0 {
		c.Ratio = d.Ratio
	}
	if c.MinRetries == 0 {
		c.MinRetries = d.MinRetries
	}
	if c.Window == 0 {
		c.Window = d.Window
	}
	if math.IsNaN(c.Ratio) || math.IsInf(c.Ratio, 0) {
		return fmt.Errorf("route: retry budget ratio %v must be finite: %w", c.Ratio, ErrInvalidConfig)
	}
	if c.Window < 0 {
		return fmt.Errorf("route: retry budget window %v is negative: %w", c.Window, ErrInvalidConfig)
	}
	return nil
}

// retrySlots is how many slots a RetryBudget's window is counted in: requests and retries
// leave the count a tenth of a window at a time.
const retrySlots = 10

// RetryBudget bounds retries to a share of recent requests: a retry is allowed while the
// retries of the last Window, this one included, are at most MinRetries plus Ratio times the
// requests of the same window. A node whose peers fail so cannot multiply its own traffic
// onto the others (a retry storm): past the budget a failed attempt ends its request.
//
// It is pure (time is passed in) and safe for concurrent use. Use NewRetryBudget.
type RetryBudget struct {
	cfg   RetryBudgetConfig
	width time.Duration // of one slot

	mu    sync.Mutex
	slots [retrySlots]retrySlot
}

// retrySlot counts one slot's requests and retries; n is the slot's index since the epoch,
// which tells a slot of this window from one the ring reuses.
type retrySlot struct {
	n                 int64
	requests, retries int
}

// NewRetryBudget fills cfg's zero fields with defaults, validates it and returns a budget.
func NewRetryBudget(cfg RetryBudgetConfig) (*RetryBudget, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	return &RetryBudget{cfg: cfg, width: max(cfg.Window/retrySlots, 1)}, nil
}

// Request counts one request at now.
func (b *RetryBudget) Request(now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.slotLocked(now).requests++
}

// Retry reports whether a retry at now is within the budget, and counts it if it is.
func (b *RetryBudget) Retry(now time.Time) bool {
	if b.cfg.Ratio < 0 {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	cur := b.slotLocked(now)
	var requests, retries int
	for i := range b.slots {
		if s := &b.slots[i]; s.n > cur.n-retrySlots {
			requests += s.requests
			retries += s.retries
		}
	}
	if float64(retries+1) > float64(max(b.cfg.MinRetries, 0))+b.cfg.Ratio*float64(requests) {
		return false
	}
	cur.retries++
	return true
}

// slotLocked returns now's slot, emptied if it last counted an older window.
func (b *RetryBudget) slotLocked(now time.Time) *retrySlot {
	n := now.UnixNano() / int64(b.width)
	s := &b.slots[(n%retrySlots+retrySlots)%retrySlots]
	if s.n != n {
		*s = retrySlot{n: n}
	}
	return s
}
