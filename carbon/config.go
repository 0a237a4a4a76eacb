package carbon

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// FailMode says how a node behaves with no fresh reading.
type FailMode int

const (
	// FailOpen treats the node as clean: nothing is shed for want of data.
	FailOpen FailMode = iota
	// FailClosed treats the node as dirty: sheddable traffic goes elsewhere or is deferred.
	FailClosed
)

func (m FailMode) String() string {
	if m == FailClosed {
		return "closed"
	}
	return "open"
}

// ParseFailMode reads "open" or "closed".
func ParseFailMode(s string) (FailMode, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "open":
		return FailOpen, nil
	case "closed":
		return FailClosed, nil
	}
	return 0, fmt.Errorf("%w: fail mode %q: want open or closed", ErrConfig, s)
}

// MarshalText writes "open" or "closed".
func (m FailMode) MarshalText() ([]byte, error) {
	if m != FailOpen && m != FailClosed {
		return nil, fmt.Errorf("%w: unknown fail mode %d", ErrConfig, int(m))
	}
	return []byte(m.String()), nil
}

// UnmarshalText reads "open" or "closed".
func (m *FailMode) UnmarshalText(b []byte) error {
	v, err := ParseFailMode(string(b))
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// Config configures a Tracker. The zero rule, as in every kvmesh config: a zero field means its
// default (DefaultConfig's value), which New fills in, so Config{} is DefaultConfig(). The JSON
// names are the config file's (kvmesh node --config, section "carbon", "tracker").
type Config struct {
	// Threshold: intensities strictly above it are dirty. In the provider's unit
	// (gCO2eq/kWh, or a 0–100 percentile with WattTime); positive.
	Threshold    float64       `json:"threshold"`
	PollInterval time.Duration `json:"poll_interval,advanced"` // between good polls
	MaxAge       time.Duration `json:"max_age"`                // a reading older than this (by its own At) is stale
	FailMode     FailMode      `json:"fail_mode"`              // applies before the first reading and once stale
	BackoffMin   time.Duration `json:"backoff_min,advanced"`   // delay after the first consecutive error
	BackoffMax   time.Duration `json:"backoff_max,advanced"`   // cap of the doubling backoff (a 429's Retry-After may exceed it)
}

// DefaultConfig polls every 5 minutes, treats readings older than 2 hours as stale (Electricity
// Maps values are hourly and stamped at the start of their hour), fails open, and backs off
// from 10 s to 10 minutes. The threshold is 300 gCO2eq/kWh.
func DefaultConfig() Config {
	return Config{
		Threshold:    300,
		PollInterval: 5 * time.Minute,
		MaxAge:       2 * time.Hour,
		FailMode:     FailOpen,
		BackoffMin:   10 * time.Second,
		BackoffMax:   10 * time.Minute,
	}
}

// fill sets every zero field to its default (the zero rule).
func (c *Config) fill() {
	d := DefaultConfig()
	if c.Threshold == 0 {
		c.Threshold = d.Threshold
	}
	for _, f := range []struct{ v, def *time.Duration }{
		{&c.PollInterval, &d.PollInterval}, {&c.MaxAge, &d.MaxAge}, {&c.BackoffMin, &d.BackoffMin},
	} {
		if *f.v == 0 {
			*f.v = *f.def
		}
	}
	if c.BackoffMax == 0 {
		c.BackoffMax = max(d.BackoffMax, c.BackoffMin)
	}
}

// Validate reports whether c is a valid Config once its zero fields are filled, as New and
// Tracker.SetConfig would find it.
func (c Config) Validate() error {
	c.fill()
	return c.validate()
}

func (c *Config) validate() error {
	switch {
	case c.Threshold <= 0 || math.IsNaN(c.Threshold) || math.IsInf(c.Threshold, 0):
		return fmt.Errorf("%w: threshold %v must be a finite number > 0", ErrConfig, c.Threshold)
	case c.PollInterval <= 0:
		return fmt.Errorf("%w: poll interval must be > 0", ErrConfig)
	case c.MaxAge <= 0:
		return fmt.Errorf("%w: max age must be > 0", ErrConfig)
	case c.BackoffMin <= 0 || c.BackoffMax < c.BackoffMin:
		return fmt.Errorf("%w: backoff needs 0 < min ≤ max", ErrConfig)
	case c.FailMode != FailOpen && c.FailMode != FailClosed:
		return fmt.Errorf("%w: unknown fail mode %d", ErrConfig, c.FailMode)
	}
	return nil
}
