package carbon

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Schedule gives an intensity for each hour of the day (index 0..23).
type Schedule [24]float64

// ParseSchedule reads "FROM-TO:VALUE,..." where FROM and TO are hours 0..23, inclusive, and a
// single hour "H:VALUE" is allowed. The spans must cover all 24 hours exactly once, so a typo
// cannot leave an hour silently at zero. Example: "0-6:120,7-18:450,19-23:200".
func ParseSchedule(s string) (Schedule, error) {
	var sch Schedule
	var seen [24]bool
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		span, val, ok := strings.Cut(part, ":")
		if !ok {
			return Schedule{}, fmt.Errorf("%w: schedule span %q: want FROM-TO:VALUE", ErrConfig, part)
		}
		fromS, toS, isRange := strings.Cut(span, "-")
		if !isRange {
			toS = fromS
		}
		from, err1 := strconv.Atoi(strings.TrimSpace(fromS))
		to, err2 := strconv.Atoi(strings.TrimSpace(toS))
		if err1 != nil || err2 != nil || from < 0 || to > 23 || from > to {
			return Schedule{}, fmt.Errorf("%w: schedule span %q: hours must be 0..23, FROM ≤ TO", ErrConfig, part)
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil || v < 0 || math.IsInf(v, 0) || math.IsNaN(v) {
			return Schedule{}, fmt.Errorf("%w: schedule span %q: value must be a number ≥ 0", ErrConfig, part)
		}
		for h := from; h <= to; h++ {
			if seen[h] {
				return Schedule{}, fmt.Errorf("%w: schedule: hour %d given twice", ErrConfig, h)
			}
			seen[h] = true
			sch[h] = v
		}
	}
	for h, ok := range seen {
		if !ok {
			return Schedule{}, fmt.Errorf("%w: schedule: hour %d missing", ErrConfig, h)
		}
	}
	return sch, nil
}

// Static is a provider for tests and demos: a fixed Intensity, or, when Schedule is set, a
// value by hour of day in Location (nil = UTC).
type Static struct {
	Intensity float64
	Schedule  *Schedule
	Location  *time.Location
	Zone      string // reported as Reading.Zone; "static" when empty
	Unit      string // reported as Reading.Unit; UnitGramsPerKWh when empty
}

var _ Provider = (*Static)(nil)

// Fetch returns the value for now. NextChange is the next hour at which the schedule's value
// changes, zero for a fixed value or a flat schedule.
func (s *Static) Fetch(ctx context.Context, now time.Time) (Reading, error) {
	if err := ctx.Err(); err != nil {
		return Reading{}, fmt.Errorf("carbon: static: %w", err)
	}
	r := Reading{Intensity: s.Intensity, Unit: s.Unit, Zone: s.Zone, At: now, Fetched: now}
	if r.Unit == "" {
		r.Unit = UnitGramsPerKWh
	}
	if r.Zone == "" {
		r.Zone = "static"
	}
	if s.Schedule == nil {
		return r, nil
	}
	loc := s.Location
	if loc == nil {
		loc = time.UTC
	}
	local := now.In(loc)
	h := local.Hour()
	r.Intensity = s.Schedule[h]
	hourStart := time.Date(local.Year(), local.Month(), local.Day(), h, 0, 0, 0, loc)
	for i := 1; i < 24; i++ {
		if s.Schedule[(h+i)%24] != r.Intensity {
			// Adding hours to an absolute instant stays right across DST shifts for whole-hour zones.
			r.NextChange = hourStart.Add(time.Duration(i) * time.Hour)
			break
		}
	}
	return r, nil
}
