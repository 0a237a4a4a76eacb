package carbon

import (
	"math"
	"testing"
)

func FuzzParseSchedule(f *testing.F) {
	f.Add("0-6:120,7-18:450,19-23:200")
	f.Add("0-23:1")
	f.Add("3:1,0-2:4,4-23:0")
	f.Fuzz(func(t *testing.T, s string) {
		sch, err := ParseSchedule(s)
		if err != nil {
			return
		}
		for h, v := range sch {
			if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
				t.Fatalf("hour %d accepted as %v from %q", h, v, s)
			}
		}
	})
}
