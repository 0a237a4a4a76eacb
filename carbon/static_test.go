package carbon

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestParseSchedule(t *testing.T) {
	tests := []struct {
		in      string
		wantErr bool
		check   map[int]float64
	}{
		{"0-6:120,7-18:450,19-23:200", false, map[int]float64{0: 120, 6: 120, 7: 450, 18: 450, 19: 200, 23: 200}},
		{" 0-22 : 1 , 23:9.5 ", false, map[int]float64{22: 1, 23: 9.5}},
		{"0-23:0", false, map[int]float64{12: 0}},
		{"0-6:120,7-18:450", true, nil},    // hours missing
		{"0-6:120,6-23:450", true, nil},    // overlap
		{"0-24:1", true, nil},              // hour out of range
		{"5-3:1,0-23:2", true, nil},        // reversed
		{"0-23", true, nil},                // no value
		{"0-23:-4", true, nil},             // negative
		{"0-23:NaN", true, nil},            // not a number
		{"a-b:1", true, nil},               // not hours
		{"", true, nil},                    // empty
		{"0-11:1,,12-23:2", true, nil},     // empty span
		{"0-23:1e400", true, nil},          // infinite
		{"-1-23:5", true, nil},             // negative hour
		{"0-11:1,12-23:2,12:3", true, nil}, // repeat
		{"0-11:1;12-23:2", true, nil},      // wrong separator
		{"0-11:1,12-23:2", false, map[int]float64{11: 1, 12: 2}},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			s, err := ParseSchedule(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if err != nil && !errors.Is(err, ErrConfig) {
				t.Fatalf("error %v does not wrap ErrConfig", err)
			}
			for h, v := range tt.check {
				if s[h] != v {
					t.Errorf("hour %d = %v, want %v", h, s[h], v)
				}
			}
		})
	}
}

func TestStaticFetch(t *testing.T) {
	sch, err := ParseSchedule("0-6:120,7-18:450,19-23:120")
	if err != nil {
		t.Fatal(err)
	}
	flat, _ := ParseSchedule("0-23:50")
	day := func(h, m int) time.Time { return time.Date(2026, 3, 4, h, m, 0, 0, time.UTC) }
	tests := []struct {
		name       string
		s          Static
		now        time.Time
		want       float64
		nextChange time.Time
	}{
		{"fixed", Static{Intensity: 333}, day(3, 0), 333, time.Time{}},
		{"night", Static{Schedule: &sch}, day(3, 30), 120, day(7, 0)},
		{"day", Static{Schedule: &sch}, day(7, 0), 450, day(19, 0)},
		{"evening wraps to next day", Static{Schedule: &sch}, day(20, 15), 120, day(31, 0)},
		{"flat schedule", Static{Schedule: &flat}, day(9, 0), 50, time.Time{}},
		{"other zone", Static{Schedule: &sch, Location: time.FixedZone("UTC+5", 5*3600)}, day(3, 0), 450, day(14, 0)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := tt.s.Fetch(t.Context(), tt.now)
			if err != nil {
				t.Fatal(err)
			}
			if r.Intensity != tt.want || !r.NextChange.Equal(tt.nextChange) || !r.At.Equal(tt.now) || r.Unit != UnitGramsPerKWh {
				t.Fatalf("got %+v, want intensity %v next change %s", r, tt.want, tt.nextChange)
			}
		})
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := (&Static{}).Fetch(ctx, t0); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled ctx: %v", err)
	}
}
