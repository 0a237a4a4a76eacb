package carbon

import (
	"errors"
	"sync"
	"time"
)

// Freshness says what the tracker holds.
type Freshness int

const (
	FreshnessNone  Freshness = iota // no reading yet
	FreshnessFresh                  // a reading no older than MaxAge
	FreshnessStale                  // a reading older than MaxAge
)

func (f Freshness) String() string {
	switch f {
	case FreshnessFresh:
		return "fresh"
	case FreshnessStale:
		return "stale"
	}
	return "none"
}

// Status describes the tracker's state at a moment.
type Status struct {
	Freshness Freshness
	// FailModeActive is true when there is no fresh reading, so FailMode decides Dirty.
	FailModeActive bool
	FailMode       FailMode
	Age            time.Duration // now − reading's At (or Fetched); 0 with no reading
	Failures       int           // consecutive provider errors since the last good reading
	LastError      error         // the latest provider error, nil after a good reading
}

// Tracker holds the latest reading, the poll schedule and the fail mode. Safe for concurrent use.
type Tracker struct {
	mu       sync.Mutex
	cfg      Config
	have     bool
	reading  Reading
	next     time.Time // zero: poll now
	failures int
	lastErr  error
}

// New fills cfg's zero fields with their defaults and validates it. It does no I/O.
func New(cfg Config) (*Tracker, error) {
	cfg.fill()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Tracker{cfg: cfg}, nil
}

// Config returns the tracker's configuration.
func (t *Tracker) Config() Config {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.cfg
}

// SetConfig replaces the configuration while the tracker runs (a node's config reload): the
// threshold, staleness, fail mode and backoff apply from the next call, and the reading and
// the poll already scheduled stay. An invalid cfg is an error and changes nothing.
func (t *Tracker) SetConfig(cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	cfg.fill()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cfg = cfg
	return nil
}

// Record stores a good reading and schedules the next poll after PollInterval, or at the
// provider's NextChange when that comes sooner.
func (t *Tracker) Record(now time.Time, r Reading) {
	if r.Fetched.IsZero() {
		r.Fetched = now
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.have, t.reading = true, r
	t.failures, t.lastErr = 0, nil
	t.next = now.Add(t.cfg.PollInterval)
	if r.NextChange.After(now) && r.NextChange.Before(t.next) {
		t.next = r.NextChange
	}
}

// RecordError counts a failed poll and schedules the next one after an exponential backoff
// (BackoffMin·2^(n−1), capped at BackoffMax), or after the provider's Retry-After when a 429
// asks for longer. The last good reading is kept; MaxAge decides when it stops counting.
func (t *Tracker) RecordError(now time.Time, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.failures++
	t.lastErr = err
	delay := t.cfg.BackoffMin
	for i := 1; i < t.failures && delay < t.cfg.BackoffMax; i++ {
		delay *= 2
	}
	delay = min(delay, t.cfg.BackoffMax)
	var rl *RateLimitedError
	if errors.As(err, &rl) && rl.RetryAfter > delay {
		delay = rl.RetryAfter
	}
	t.next = now.Add(delay)
}

// NextPoll is when the node should fetch next; now itself before the first poll.
func (t *Tracker) NextPoll(now time.Time) time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.next.IsZero() {
		return now
	}
	return t.next
}

// Current returns the latest reading (zero if none) and the status at now.
func (t *Tracker) Current(now time.Time) (Reading, Status) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.reading, t.statusLocked(now)
}

func (t *Tracker) statusLocked(now time.Time) Status {
	st := Status{FailMode: t.cfg.FailMode, Failures: t.failures, LastError: t.lastErr}
	if !t.have {
		st.Freshness, st.FailModeActive = FreshnessNone, true
		return st
	}
	at := t.reading.At
	if at.IsZero() {
		at = t.reading.Fetched
	}
	st.Age = max(now.Sub(at), 0)
	if st.Age > t.cfg.MaxAge {
		st.Freshness, st.FailModeActive = FreshnessStale, true
	} else {
		st.Freshness = FreshnessFresh
	}
	return st
}

// Dirty reports whether sheddable traffic should leave this node: Config.Dirty of the latest
// reading and whether the fail mode is active at now.
func (t *Tracker) Dirty(now time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.dirtyLocked(now)
}

func (t *Tracker) dirtyLocked(now time.Time) bool {
	return t.cfg.Dirty(t.reading.Intensity, t.statusLocked(now).FailModeActive)
}

// RetryAfter is how long a deferred request should wait: until the provider's NextChange of a
// fresh reading when that is ahead, else PollInterval; never under a second.
func (t *Tracker) RetryAfter(now time.Time) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.retryAfterLocked(now)
}

func (t *Tracker) retryAfterLocked(now time.Time) time.Duration {
	d := t.cfg.PollInterval
	if !t.statusLocked(now).FailModeActive && t.reading.NextChange.After(now) {
		d = t.reading.NextChange.Sub(now)
	}
	return max(d, time.Second)
}

// Decide applies the shedding rule with this node's dirtiness at now and fills RetryAfter
// when the request is deferred.
func (t *Tracker) Decide(now time.Time, priority int, others []Option) Decision {
	t.mu.Lock()
	dirty := t.dirtyLocked(now)
	retry := t.retryAfterLocked(now)
	t.mu.Unlock()
	d := Decide(priority, dirty, others)
	if d.Action == ActionDefer {
		d.RetryAfter = retry
	}
	return d
}
