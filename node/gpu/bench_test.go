package gpu

import (
	"testing"
	"time"
)

// BenchmarkNVMLRead is the cost of one sample of an 8-GPU host through the go-nvml mock: the
// Go side of a read (the real driver calls add their own time).
func BenchmarkNVMLRead(b *testing.B) {
	n, err := OpenNVML(h100Host(b))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = n.Close() })
	b.ReportAllocs()
	for b.Loop() {
		if _, err := n.Read(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/8, "ns/device")
}

func BenchmarkSimRead(b *testing.B) {
	s, err := NewSim(DefaultSimConfig())
	if err != nil {
		b.Fatal(err)
	}
	now := time.Unix(0, 0)
	for b.Loop() {
		now = now.Add(time.Second)
		_ = s.ReadAt(now)
	}
}
