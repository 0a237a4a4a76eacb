package carbon

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Units reported in Reading.Unit.
const (
	UnitGramsPerKWh = "gCO2eq/kWh"
	UnitPercentile  = "percentile"
)

// Reading is one carbon-intensity value for a zone.
type Reading struct {
	Intensity  float64   // gCO2eq/kWh, or the provider's index (see Unit)
	Unit       string    // UnitGramsPerKWh or UnitPercentile
	Zone       string    // the provider's zone or region
	At         time.Time // the reading's own timestamp, as the provider gives it
	Fetched    time.Time // when kvmesh fetched it
	NextChange time.Time // when the provider expects a new value; zero if unknown
	Estimated  bool      // the provider says the value is an estimate
}

// Provider fetches the current carbon intensity. Implementations honour ctx's deadline and
// report failures with the errors below: a *RateLimitedError lets the Tracker honour the
// provider's Retry-After. Static is the one implementation here; the network ones live in
// carbon/provider.
type Provider interface {
	Fetch(ctx context.Context, now time.Time) (Reading, error)
}

// The errors providers return. They name no transport, so the Tracker can read them without
// importing one.
var (
	// ErrUnauthorized is matched (errors.Is) by an *HTTPError with status 401 or 403.
	ErrUnauthorized = errors.New("carbon: unauthorized")
	// ErrMalformed means the provider's body did not parse or lacked a usable value.
	ErrMalformed = errors.New("carbon: malformed response")
	// ErrConfig means a provider or tracker was configured wrongly.
	ErrConfig = errors.New("carbon: invalid config")
)

// RateLimitedError is a 429 from a provider. RetryAfter is the provider's Retry-After, zero
// when it sent none (the Tracker then uses its own backoff).
type RateLimitedError struct {
	Provider   string
	RetryAfter time.Duration
}

func (e *RateLimitedError) Error() string {
	return fmt.Sprintf("carbon: %s: rate limited, retry after %s", e.Provider, e.RetryAfter)
}

// HTTPError is a non-2xx status other than 429.
type HTTPError struct {
	Provider   string
	StatusCode int
	Body       string // the start of the body, for the log
}

func (e *HTTPError) Error() string {
	return fmt.Sprintf("carbon: %s: http status %d: %q", e.Provider, e.StatusCode, e.Body)
}

// Unwrap lets errors.Is(err, ErrUnauthorized) match 401 and 403.
func (e *HTTPError) Unwrap() error {
	if e.StatusCode == 401 || e.StatusCode == 403 {
		return ErrUnauthorized
	}
	return nil
}
