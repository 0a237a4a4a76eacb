package carbon

import (
	"fmt"
	"testing"
	"time"
)

// The rule runs on every sheddable request's path; these show it costs next to nothing.
func BenchmarkTrackerDecide(b *testing.B) {
	tr, err := New(DefaultConfig())
	if err != nil {
		b.Fatal(err)
	}
	tr.Record(t0, Reading{Intensity: 500, At: t0, NextChange: t0.Add(time.Hour)})
	others := make([]Option, 16)
	for i := range others {
		others[i] = Option{Name: fmt.Sprint("n", i), Dirty: i%2 == 0, HasRoom: i%3 == 0}
	}
	now := t0.Add(time.Minute)
	b.ReportAllocs()
	for b.Loop() {
		if d := tr.Decide(now, -1, others); d.Action != ActionRoute {
			b.Fatal(d)
		}
	}
}

func BenchmarkTrackerDirty(b *testing.B) {
	tr, err := New(DefaultConfig())
	if err != nil {
		b.Fatal(err)
	}
	tr.Record(t0, Reading{Intensity: 500, At: t0})
	now := t0.Add(time.Minute)
	for b.Loop() {
		if !tr.Dirty(now) {
			b.Fatal("clean")
		}
	}
}
