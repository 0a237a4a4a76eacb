package agent

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkArrive measures one step of an agent, Arrive plus StepDone, with 10k agents
// registered. "fits": every agent is in the window. "window-10pct": a window of 1000, so
// most agents are outside the window and answered Wait.
func BenchmarkArrive(b *testing.B) {
	const agents = 10000
	for _, bc := range []struct {
		name   string
		window int
	}{{"fits", agents}, {"window-10pct", agents / 10}} {
		b.Run(bc.name, func(b *testing.B) {
			a := newRegistry(b, func(c *Config) {
				c.MaxAgents = agents
				c.Controller.MaxWindow = agents
				c.Controller.InitialWindow = bc.window
			})
			ids := make([]string, agents)
			now := t0
			for i := range ids {
				ids[i] = fmt.Sprintf("agent-%05d", i)
				if _, err := a.Arrive(now, ids[i], fmt.Sprintf("n%d", i%4), 1000); err != nil {
					b.Fatal(err)
				}
				a.StepDone(now, ids[i], 1200)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				now = now.Add(time.Microsecond)
				id := ids[i%agents]
				if _, err := a.Arrive(now, id, "", 1300); err != nil {
					b.Fatal(err)
				}
				a.StepDone(now, id, 1400)
			}
			b.StopTimer()
			b.ReportMetric(float64(a.Stats().Agents), "agents")
		})
	}
}
