package route

import (
	"fmt"
	"sync"
	"time"
)

// EjectConfig configures an Ejector. Zero fields take DefaultEjectConfig's values.
type EjectConfig struct {
	// Failures is how many forwards in a row must fail at the transport before the peer is
	// ejected. Default 2: one lost handshake is not a verdict, two are, and a peer whose
	// certificate is refused fails every time. Negative (-1) turns ejection off.
	Failures int `json:"failures"`
	// Backoff is the first ejection's length; each ejection after it, with no success in
	// between, lasts twice the one before, up to MaxBackoff. Defaults 1s and 30s.
	Backoff    time.Duration `json:"backoff"`
	MaxBackoff time.Duration `json:"max_backoff"`
}

// DefaultEjectConfig returns the documented defaults.
func DefaultEjectConfig() EjectConfig {
	return EjectConfig{Failures: 2, Backoff: time.Second, MaxBackoff: 30 * time.Second}
}

// fill sets zero fields to their defaults, then validates.
func (c *EjectConfig) fill() error {
	d := DefaultEjectConfig()
	if c.Failures == 0 {
		c.Failures = d.Failures
	}
	if c.Backoff == 0 {
		c.Backoff = d.Backoff
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = d.MaxBackoff
	}
	if c.Backoff < 0 || c.MaxBackoff < c.Backoff {
		return fmt.Errorf("route: eject backoff %v must be positive and at most max_backoff %v: %w", c.Backoff, c.MaxBackoff, ErrInvalidConfig)
	}
	return nil
}

// Ejector keeps peers that cannot be reached out of routing for a while: after Failures
// forwards in a row fail at the transport (handshake, certificate, timeout), the peer is
// ejected, which the node shows routing as Peer.Ejected, for Backoff, doubling with each
// ejection to MaxBackoff. A success resets the peer. When an ejection ends the peer is a
// candidate again, and its next failure ejects it again at once, for longer.
//
// It is pure (time is passed in) and safe for concurrent use. Use NewEjector.
type Ejector struct {
	cfg EjectConfig

	mu    sync.Mutex
	peers map[string]*ejectState
}

type ejectState struct {
	failures  int       // in a row, since the last success
	ejections int       // since the last success
	until     time.Time // ejected before this
	last      time.Time // the last failure
}

// NewEjector fills cfg's zero fields with defaults, validates it and returns an Ejector.
func NewEjector(cfg EjectConfig) (*Ejector, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	return &Ejector{cfg: cfg, peers: make(map[string]*ejectState)}, nil
}

// Failure records a forward to peer that failed at the transport at now. When it ejects the
// peer it returns how long for (a failure while the peer is already ejected, from a forward
// that started before, changes nothing and returns 0), so the caller logs and counts each
// ejection once.
func (e *Ejector) Failure(now time.Time, peer string) time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.peers[peer]
	if s == nil || e.forgottenLocked(now, s) {
		e.pruneLocked(now)
		s = &ejectState{}
		e.peers[peer] = s
	}
	s.last = now
	if now.Before(s.until) {
		return 0
	}
	s.failures++
	if e.cfg.Failures < 0 || s.failures < e.cfg.Failures {
		return 0
	}
	d := e.cfg.Backoff << min(s.ejections, 30)
	if d > e.cfg.MaxBackoff || d <= 0 {
		d = e.cfg.MaxBackoff
	}
	s.ejections++
	s.until = now.Add(d)
	return d
}

// Success records a forward to peer that reached it (answered, even with a refusal), which
// resets it. It reports whether the peer had been ejected since its last success.
func (e *Ejector) Success(peer string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.peers[peer]
	if s == nil {
		return false
	}
	delete(e.peers, peer)
	return s.ejections > 0
}

// Ejected reports whether peer is ejected at now.
func (e *Ejector) Ejected(now time.Time, peer string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.peers[peer]
	return s != nil && now.Before(s.until)
}

// forgottenLocked reports whether s is old enough to start over: neither ejected nor failed
// for MaxBackoff. A peer that fails once a day is not ejected for it, and a peer that left
// the mesh long ago leaves no state behind.
func (e *Ejector) forgottenLocked(now time.Time, s *ejectState) bool {
	return !now.Before(s.until.Add(e.cfg.MaxBackoff)) && !now.Before(s.last.Add(e.cfg.MaxBackoff))
}

// pruneLocked drops every forgotten peer, so that the map holds only peers that failed
// lately.
func (e *Ejector) pruneLocked(now time.Time) {
	for p, s := range e.peers {
		if e.forgottenLocked(now, s) {
			delete(e.peers, p)
		}
	}
}
