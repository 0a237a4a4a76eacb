package admit

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Named priorities of X-Kvmesh-Priority. Negative priorities are sheddable.
const (
	PriorityHigh   = 10
	PriorityNormal = 0
	PriorityLow    = -10
)

// MaxHeaderDuration bounds durations given in headers.
const MaxHeaderDuration = 24 * time.Hour

// ParsePriority parses X-Kvmesh-Priority: "high", "normal", "low" (any case) or an integer in
// [-1000, 1000]. The empty string is the default, normal (0).
func ParsePriority(s string) (int, error) {
	s = strings.TrimSpace(s)
	switch strings.ToLower(s) {
	case "", "normal":
		return PriorityNormal, nil
	case "high":
		return PriorityHigh, nil
	case "low":
		return PriorityLow, nil
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < -maxPriorityValue || v > maxPriorityValue {
		return 0, fmt.Errorf("%w: priority %q: want high, normal, low or an integer in [-%d, %d]",
			ErrHeader, clip(s), maxPriorityValue, maxPriorityValue)
	}
	return v, nil
}

// ParseDuration parses X-Kvmesh-Queue-TTL, X-Kvmesh-TTFT-SLO and X-Kvmesh-TPOT-SLO: a Go
// duration ("250ms", "1.5s") or a plain number of seconds ("2", "0.5"). The result is > 0 and
// ≤ MaxHeaderDuration.
func ParseDuration(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	var d time.Duration
	if f, err := strconv.ParseFloat(s, 64); err == nil && isPlainNumber(s) {
		if math.IsNaN(f) || f <= 0 || f > MaxHeaderDuration.Seconds() {
			return 0, fmt.Errorf("%w: duration %q out of range", ErrHeader, clip(s))
		}
		d = time.Duration(f * float64(time.Second))
	} else {
		v, err := time.ParseDuration(s)
		if err != nil {
			return 0, fmt.Errorf("%w: duration %q: want a Go duration or seconds", ErrHeader, clip(s))
		}
		d = v
	}
	if d <= 0 || d > MaxHeaderDuration {
		return 0, fmt.Errorf("%w: duration %q out of range", ErrHeader, clip(s))
	}
	return d, nil
}

// isPlainNumber rejects ParseFloat's extras (hex, "inf", "nan", underscores, exponents) so
// only decimal seconds count as seconds.
func isPlainNumber(s string) bool {
	dot := false
	for i, c := range s {
		switch {
		case c >= '0' && c <= '9':
		case c == '.' && !dot:
			dot = true
		case c == '+' && i == 0:
		default:
			return false
		}
	}
	return s != "" && s != "." && s != "+"
}

// clip keeps error messages short when a header is long or hostile.
func clip(s string) string {
	if len(s) > 32 {
		return s[:32] + "..."
	}
	return s
}
