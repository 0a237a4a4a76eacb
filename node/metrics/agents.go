package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/node/agentgate"
)

// AgentCollector exports the agent window's state at scrape time (kvmesh_agent_*): g's
// registry and leases, seen from the home named home.
type AgentCollector struct {
	g                                           *agentgate.Gate
	home                                        string
	window, active, paused, waiting, agents     *prometheus.Desc
	pauses, resumes, admitted, swept, finished  *prometheus.Desc
	released, abandoned                         *prometheus.Desc
	kvUse, kvNext, hitRate, avoided, recomputed *prometheus.Desc
	windowCap, footprint                        *prometheus.Desc
}

// NewAgentCollector returns the collector of g's window as the home named home.
func NewAgentCollector(g *agentgate.Gate, home string) *AgentCollector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("kvmesh_agent_"+name, help, nil, nil)
	}
	return &AgentCollector{
		g:        g,
		home:     home,
		window:   d("window", "Agents this node's window lets be active at once."),
		active:   d("active", "Agents in the window."),
		paused:   d("paused", "Agents taken out of the window at a step boundary."),
		waiting:  d("waiting", "New agents whose first step waits for a window slot."),
		agents:   d("registered", "Agents this node remembers."),
		pauses:   d("pauses_total", "Agents paused because the window shrank."),
		resumes:  d("resumes_total", "Paused agents put back in the window."),
		admitted: d("admitted_total", "Agents that entered the window for the first time."),
		swept:    d("swept_total", "Agents removed after going silent past the idle timeout."),
		finished: d("finished_total", "Agents whose last step (X-Kvmesh-Agent-Final) ended."),
		released: d("released_total", "Agents let go because a peer registered them too and keeps them."),
		abandoned: prometheus.NewDesc("kvmesh_agent_abandoned_total",
			"Agents removed because the step held for them ended without running: given_up (its ingress said so) or lease (its ingress stopped renewing the hold).",
			[]string{"reason"}, nil),
		kvUse:      d("kv_use", "KV use (0..1) the window controller last saw: running sequences plus the active agents' idle prefixes."),
		kvNext:     d("kv_use_next", "KV use the window controller last predicted for the active agents' next steps: kv_use plus each one's growth (above 1: the pool overflows)."),
		windowCap:  d("window_cap", "The most agents the window may grow to: as many as the controller's HighU share of the KV pool holds at footprint_tokens each (its largest window while no agent has ended)."),
		footprint:  d("footprint_tokens", "An agent's mean context at the ends of its steps, averaged over agents that ended: what sets window_cap."),
		hitRate:    d("hit_rate", "Hit rate (0..1) on the agents' earlier context the window controller last saw."),
		avoided:    d("recompute_avoided_tokens_total", "Tokens of agents' earlier context served from cache instead of recomputed."),
		recomputed: d("recomputed_tokens_total", "Tokens of agents' earlier context that had to be recomputed."),
	}
}

func (c *AgentCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.window, c.active, c.paused, c.waiting, c.agents, c.pauses, c.resumes,
		c.admitted, c.swept, c.finished, c.released, c.abandoned, c.kvUse, c.kvNext, c.hitRate, c.avoided, c.recomputed, c.windowCap, c.footprint} {
		ch <- d
	}
}

func (c *AgentCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.g.Registry().Stats()
	u, next, h, wcap := 0.0, 0.0, 0.0, 0.0
	for _, hs := range s.Homes {
		if hs.Home == c.home {
			u, next, h, wcap = hs.Controller.U, hs.Controller.Next, hs.Controller.H, float64(hs.Controller.Cap)
		}
	}
	gauge := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	counter := func(d *prometheus.Desc, v uint64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
	}
	gauge(c.window, float64(c.g.Registry().Window(c.home)))
	gauge(c.active, float64(s.Active))
	gauge(c.paused, float64(s.Paused))
	gauge(c.waiting, float64(s.Waiting))
	gauge(c.agents, float64(s.Agents))
	gauge(c.kvUse, u)
	gauge(c.kvNext, next)
	gauge(c.hitRate, h)
	gauge(c.windowCap, wcap)
	gauge(c.footprint, s.FootprintTokens)
	counter(c.pauses, s.PausesTotal)
	counter(c.resumes, s.ResumesTotal)
	counter(c.admitted, s.AdmittedTotal)
	counter(c.swept, s.SweptTotal)
	counter(c.finished, s.FinishedTotal)
	counter(c.released, s.ReleasedTotal)
	ls := c.g.LeaseStats()
	ch <- prometheus.MustNewConstMetric(c.abandoned, prometheus.CounterValue, float64(ls.GivenUp), "given_up")
	ch <- prometheus.MustNewConstMetric(c.abandoned, prometheus.CounterValue, float64(ls.LeaseExpired), "lease")
	counter(c.avoided, s.RecomputeAvoidedTokens)
	counter(c.recomputed, s.RecomputedTokens)
}
