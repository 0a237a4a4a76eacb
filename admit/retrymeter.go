package admit

import (
	"math"
	"time"
)

// RetryAfter estimates when a refused client should retry: the queued prefill tokens divided
// by the measured drain rate (tokens dispatched per second over QueueConfig.DrainWindow),
// clamped to [MinRetryAfter, MaxRetryAfter]. With nothing dispatched in the window but work
// queued, the room is not draining and the answer is MaxRetryAfter.
func (r *WaitingRoom) RetryAfter(now time.Time) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	lo, hi := time.Duration(r.cfg.MinRetryAfter), time.Duration(r.cfg.MaxRetryAfter)
	queued := 0
	for _, p := range r.order {
		queued += p.tokens
	}
	if len(r.byID) == 0 {
		return lo
	}
	tps, rps := r.drain.rate(now)
	var d time.Duration
	switch {
	case tps > 0 && queued > 0:
		d = time.Duration(float64(queued) / tps * float64(time.Second))
	case rps > 0:
		d = time.Duration(float64(len(r.byID)) / rps * float64(time.Second))
	default:
		return hi
	}
	return min(max(d, lo), hi)
}

// drainMeter counts dispatches in ten buckets spanning the window.
type drainMeter struct {
	window  time.Duration
	buckets [10]struct {
		idx              int64
		tokens, requests int
	}
	first time.Time
	last  int64 // bucket index of the last add, for undo
}

func (m *drainMeter) width() int64 { return max(int64(m.window)/int64(len(m.buckets)), 1) }

func (m *drainMeter) add(now time.Time, tokens, requests int) {
	if m.first.IsZero() || now.Before(m.first) {
		m.first = now
	}
	idx := now.UnixNano() / m.width()
	b := &m.buckets[idx%int64(len(m.buckets))]
	if b.idx != idx {
		b.idx, b.tokens, b.requests = idx, 0, 0
	}
	b.tokens += tokens
	b.requests += requests
	m.last = idx
}

func (m *drainMeter) undo(tokens, requests int) {
	b := &m.buckets[m.last%int64(len(m.buckets))]
	if b.idx == m.last {
		b.tokens = max(b.tokens-tokens, 0)
		b.requests = max(b.requests-requests, 0)
	}
}

// rate returns tokens and requests per second over the window, or over the time since the
// first dispatch when that is shorter (at least one bucket), so a fresh node is not read as
// slow.
func (m *drainMeter) rate(now time.Time) (tps, rps float64) {
	if m.first.IsZero() {
		return 0, 0
	}
	idx := now.UnixNano() / m.width()
	var tok, req int
	for _, b := range m.buckets {
		if b.idx > idx-int64(len(m.buckets)) && b.idx <= idx {
			tok += b.tokens
			req += b.requests
		}
	}
	span := min(m.window, max(now.Sub(m.first), time.Duration(m.width())))
	s := span.Seconds()
	if s <= 0 || math.IsNaN(s) {
		return 0, 0
	}
	return float64(tok) / s, float64(req) / s
}
