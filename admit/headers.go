package admit

import (
	"bytes"
	"encoding/json"
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
	if strings.TrimSpace(s) == "" {
		return PriorityNormal, nil
	}
	v, err := readPriority("priority", s)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrHeader, err)
	}
	return v, nil
}

// readPriority reads a priority by name or number, as X-Kvmesh-Priority, --max-priority and
// max_priority all take it; what names the setting in the error.
func readPriority(what, s string) (int, error) {
	s = strings.TrimSpace(s)
	switch strings.ToLower(s) {
	case "normal":
		return PriorityNormal, nil
	case "high":
		return PriorityHigh, nil
	case "low":
		return PriorityLow, nil
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < -maxPriorityValue || v > maxPriorityValue {
		return 0, fmt.Errorf("%s %q: want high, normal, low or an integer in [-%d, %d]",
			what, clip(s), maxPriorityValue, maxPriorityValue)
	}
	return v, nil
}

// Priority is a max_priority in a key file or a config file: a JSON integer or a name ("high",
// "normal", "low"), as the text key file and --max-priority take it, so no format needs the
// numbers behind the names.
type Priority int

// UnmarshalJSON reads an integer in [-1000, 1000] or a priority's name.
func (p *Priority) UnmarshalJSON(b []byte) error {
	s := string(bytes.TrimSpace(b))
	if s == "null" {
		return nil
	}
	if strings.HasPrefix(s, `"`) {
		if err := json.Unmarshal(b, &s); err != nil {
			return fmt.Errorf("admit: max_priority: %w", err)
		}
	}
	v, err := readPriority("max_priority", s)
	if err != nil {
		return fmt.Errorf("admit: %w", err)
	}
	*p = Priority(v)
	return nil
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
