package loadgen

import (
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"
)

// maxSamples bounds the samples kept per latency; beyond it a uniform reservoir is kept, so a
// long trace run costs bounded memory and percentiles stay unbiased.
const maxSamples = 1 << 18

// samples is a reservoir of latency samples in seconds.
type samples struct {
	v   []float64
	n   int
	sum float64
	r   *rand.Rand
}

func (s *samples) add(d time.Duration) {
	x := d.Seconds()
	s.n++
	s.sum += x
	if len(s.v) < maxSamples {
		s.v = append(s.v, x)
		return
	}
	if s.r == nil {
		s.r = rand.New(rand.NewPCG(1, 2))
	}
	if j := s.r.IntN(s.n); j < maxSamples {
		s.v[j] = x
	}
}

// Percentiles summarises one latency, in seconds.
type Percentiles struct {
	Count int     `json:"count"`
	Mean  float64 `json:"mean_s"`
	P50   float64 `json:"p50_s"`
	P90   float64 `json:"p90_s"`
	P99   float64 `json:"p99_s"`
	Max   float64 `json:"max_s"`
}

// Percentile is the nearest-rank p-quantile (0 < p ≤ 1) of sorted.
func Percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func (s *samples) summary() Percentiles {
	if s.n == 0 {
		return Percentiles{}
	}
	p := Summary(slices.Clone(s.v))
	p.Count, p.Mean = s.n, s.sum/float64(s.n) // the reservoir keeps a sample of them
	return p
}

// Summary summarises latency samples v, in seconds (sorting v in place).
func Summary(v []float64) Percentiles {
	if len(v) == 0 {
		return Percentiles{}
	}
	slices.Sort(v)
	sum := 0.0
	for _, x := range v {
		sum += x
	}
	return Percentiles{
		Count: len(v), Mean: sum / float64(len(v)),
		P50: Percentile(v, 0.50), P90: Percentile(v, 0.90), P99: Percentile(v, 0.99), Max: v[len(v)-1],
	}
}

// group accumulates the requests of one class or one kind.
type group struct {
	class                                  Class
	sent, completed, refused, failed, good int
	promptTokens, cachedTokens             int
	ttft, tpot, e2e                        samples
}

// groupOf returns m[name], creating it.
func groupOf(m map[string]*group, name string, class Class) *group {
	g := m[name]
	if g == nil {
		g = &group{class: class}
		m[name] = g
	}
	return g
}

func (g *group) add(r *Result) {
	g.sent++
	switch r.Outcome {
	case Completed:
		g.completed++
		if r.MetSLO() {
			g.good++
		}
		g.ttft.add(r.TTFT)
		if r.OutputTokens >= 2 {
			g.tpot.add(r.TPOT())
		}
		g.e2e.add(r.E2E)
		g.promptTokens += r.PromptTokens
		g.cachedTokens += r.CachedTokens
	case Refused:
		g.refused++
	default:
		g.failed++
	}
}

func (g *group) report(window float64) GroupReport {
	return GroupReport{
		Sent: g.sent, Completed: g.completed, Refused: g.refused, Failed: g.failed, Good: g.good,
		Goodput: ratio(float64(g.good), window), Attainment: ratio(float64(g.good), float64(g.sent)),
		PromptTokens: g.promptTokens, CachedTokens: g.cachedTokens, CachedRatio: ratio(float64(g.cachedTokens), float64(g.promptTokens)),
		TTFT: g.ttft.summary(), TPOT: g.tpot.summary(), E2E: g.e2e.summary(),
	}
}

// collector accumulates Results; safe for concurrent use.
type collector struct {
	mu                                    sync.Mutex
	sent, completed, refused, failed      int
	retried, retriedCompleted, good       int
	outTokens, promptTokens, cachedTokens int
	recomputedTokens                      int
	completedInWindow, outTokensInWindow  int
	ttft, tpot, itl, e2e                  samples
	classes, kinds, entries               map[string]*group
	byStatus, byReason, failures, nodes   map[string]int
	retryAfterN                           int
	retryAfterSum                         time.Duration
}

func newCollector() *collector {
	return &collector{
		classes: map[string]*group{}, kinds: map[string]*group{}, entries: map[string]*group{}, byStatus: map[string]int{}, byReason: map[string]int{},
		failures: map[string]int{}, nodes: map[string]int{},
	}
}

// add counts one request's final Result; inWindow tells whether it ended within the arrival
// window.
func (c *collector) add(r *Result, inWindow bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	groupOf(c.classes, r.Class.Name, r.Class).add(r)
	groupOf(c.kinds, r.Kind, r.Class).add(r)
	if r.Entry != "" {
		groupOf(c.entries, r.Entry, r.Class).add(r)
	}
	c.sent++
	if r.Retried {
		c.retried++
	}
	if r.HasRetryAfter {
		c.retryAfterN++
		c.retryAfterSum += r.RetryAfter
	}
	switch r.Outcome {
	case Completed:
		c.completed++
		if inWindow {
			c.completedInWindow++
			c.outTokensInWindow += r.OutputTokens
		}
		if r.Retried {
			c.retriedCompleted++
		}
		if r.MetSLO() {
			c.good++
		}
		c.ttft.add(r.TTFT)
		if r.OutputTokens >= 2 {
			c.tpot.add(r.TPOT())
		}
		for _, d := range r.ITL {
			c.itl.add(d)
		}
		c.e2e.add(r.E2E)
		c.outTokens += r.OutputTokens
		c.promptTokens += r.PromptTokens
		c.cachedTokens += r.CachedTokens
		c.recomputedTokens += r.RecomputedTokens
		if r.Node != "" {
			c.nodes[r.Node]++
		}
	case Refused:
		c.refused++
		c.byStatus[strconv.Itoa(r.Status)]++
		c.byReason[r.Reason]++
	default:
		c.failed++
		c.failures[r.Failure]++
	}
}

// counts returns the running totals for the progress line.
func (c *collector) counts() (sent, completed, good, refused, failed int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sent, c.completed, c.good, c.refused, c.failed
}

// GroupReport summarises the requests of one class or one kind.
type GroupReport struct {
	Sent      int `json:"sent"`
	Completed int `json:"completed"`
	Refused   int `json:"refused"`
	Failed    int `json:"failed"`
	Good      int `json:"good"`
	// Goodput is Good per second of Report.Window; Attainment is Good/Sent.
	Goodput    float64 `json:"goodput_rps"`
	Attainment float64 `json:"slo_attainment"`
	// Tokens of the completed requests; CachedRatio is CachedTokens/PromptTokens.
	PromptTokens int         `json:"prompt_tokens"`
	CachedTokens int         `json:"cached_tokens"`
	CachedRatio  float64     `json:"cached_ratio"`
	TTFT         Percentiles `json:"ttft"`
	TPOT         Percentiles `json:"tpot"`
	E2E          Percentiles `json:"e2e"`
}

// ClassReport is one priority class's part of a Report.
type ClassReport struct {
	Name     string  `json:"name"`
	Priority int     `json:"priority"`
	TTFTSLO  float64 `json:"ttft_slo_s"`
	TPOTSLO  float64 `json:"tpot_slo_s"`
	GroupReport
}

// Report is the outcome of a run. Its JSON field names are stable.
type Report struct {
	Workload string   `json:"workload"`
	Targets  []string `json:"targets"`
	Seed     int64    `json:"seed"`
	// Window is the arrival window (first to last planned send); Elapsed runs from the start
	// to the last request's end. OfferedRate is Sent/Window.
	Window      float64 `json:"window_s"`
	Elapsed     float64 `json:"elapsed_s"`
	OfferedRate float64 `json:"offered_rps"`
	// TraceEnded is set when a trace ran out of requests before the run's Duration: its Window
	// is then shorter than the Duration asked for.
	TraceEnded bool `json:"trace_ended,omitempty"`
	// Sent = Completed + Refused + Failed. Retried counts requests retried after Retry-After
	// (whatever their final outcome); RetriedCompleted those of them that completed.
	Sent             int `json:"sent"`
	Completed        int `json:"completed"`
	Refused          int `json:"refused"`
	Failed           int `json:"failed"`
	Retried          int `json:"retried"`
	RetriedCompleted int `json:"retried_completed"`
	// Good is the completed requests that met both SLOs of their class; Goodput is Good per
	// second of Window (of Elapsed when Window is 0): the same offered work divides every
	// policy's count, so a policy that serves sheddable work late but within its SLO is not
	// charged for the drain. Attainment is Good/Sent.
	Good       int     `json:"good"`
	Goodput    float64 `json:"goodput_rps"`
	Attainment float64 `json:"slo_attainment"`
	// Tokens of completed requests, from their usage chunks (output tokens fall back to the
	// number of content chunks). CachedRatio is CachedTokens/PromptTokens.
	OutputTokens       int     `json:"output_tokens"`
	OutputTokensPerSec float64 `json:"output_tokens_per_s"`
	PromptTokens       int     `json:"prompt_tokens"`
	CachedTokens       int     `json:"cached_tokens"`
	CachedRatio        float64 `json:"cached_ratio"`
	// RecomputedTokens sums Result.RecomputedTokens: agents' earlier context prefilled again.
	RecomputedTokens int `json:"recomputed_tokens"`
	// The requests that completed, and their output tokens, by the end of a run's Duration:
	// a closed loop's (Config.Sessions) sustained throughput, without the drain after it.
	// Without a Duration every completion counts.
	CompletedInWindow    int         `json:"completed_in_window"`
	OutputTokensInWindow int         `json:"output_tokens_in_window"`
	TTFT                 Percentiles `json:"ttft"`
	TPOT                 Percentiles `json:"tpot"`
	ITL                  Percentiles `json:"itl"`
	E2E                  Percentiles `json:"e2e"`
	// Classes by name; Kinds by request kind (chat, rag, repo, agent, trace), whose costs
	// differ by orders of magnitude.
	Classes map[string]*ClassReport `json:"classes"`
	Kinds   map[string]*GroupReport `json:"kinds"`
	// Entries, with Config.Models, by how requests entered the mesh: EntryOwn through a node
	// serving their model, EntryOther through one that does not.
	Entries map[string]*GroupReport `json:"entries,omitempty"`
	// RefusalsByStatus is keyed by HTTP status, RefusalsByReason by reason; Failures by kind;
	// Nodes counts completed requests by X-Kvmesh-Node.
	RefusalsByStatus map[string]int `json:"refusals_by_status"`
	RefusalsByReason map[string]int `json:"refusals_by_reason"`
	Failures         map[string]int `json:"failures"`
	Nodes            map[string]int `json:"nodes"`
	// RetryAfterSeen counts final results that carried Retry-After; RetryAfterMean is its mean.
	RetryAfterSeen int     `json:"retry_after_seen"`
	RetryAfterMean float64 `json:"retry_after_mean_s"`
}

func ratio(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return a / b
}

// report builds the Report of what was collected over elapsed, with arrivals over window.
func (c *collector) report(window, elapsed time.Duration) *Report {
	c.mu.Lock()
	defer c.mu.Unlock()
	el := elapsed.Seconds()
	per := window.Seconds() // goodput's denominator
	if per <= 0 {
		per = el
	}
	r := &Report{
		Window: window.Seconds(), Elapsed: el, OfferedRate: ratio(float64(c.sent), window.Seconds()),
		Sent: c.sent, Completed: c.completed, Refused: c.refused, Failed: c.failed,
		Retried: c.retried, RetriedCompleted: c.retriedCompleted,
		Good: c.good, Goodput: ratio(float64(c.good), per), Attainment: ratio(float64(c.good), float64(c.sent)),
		OutputTokens: c.outTokens, OutputTokensPerSec: ratio(float64(c.outTokens), el),
		PromptTokens: c.promptTokens, CachedTokens: c.cachedTokens,
		CachedRatio: ratio(float64(c.cachedTokens), float64(c.promptTokens)), RecomputedTokens: c.recomputedTokens,
		CompletedInWindow: c.completedInWindow, OutputTokensInWindow: c.outTokensInWindow,
		TTFT: c.ttft.summary(), TPOT: c.tpot.summary(), ITL: c.itl.summary(), E2E: c.e2e.summary(),
		Classes: map[string]*ClassReport{}, Kinds: map[string]*GroupReport{},
		RefusalsByStatus: cloneMap(c.byStatus), RefusalsByReason: cloneMap(c.byReason),
		Failures: cloneMap(c.failures), Nodes: cloneMap(c.nodes),
		RetryAfterSeen: c.retryAfterN,
	}
	if c.retryAfterN > 0 {
		r.RetryAfterMean = (c.retryAfterSum / time.Duration(c.retryAfterN)).Seconds()
	}
	for name, g := range c.classes {
		r.Classes[name] = &ClassReport{
			Name: name, Priority: g.class.Priority, TTFTSLO: g.class.TTFT.Seconds(), TPOTSLO: g.class.TPOT.Seconds(),
			GroupReport: g.report(per),
		}
	}
	for name, g := range c.kinds {
		gr := g.report(per)
		r.Kinds[name] = &gr
	}
	for name, g := range c.entries {
		if r.Entries == nil {
			r.Entries = map[string]*GroupReport{}
		}
		gr := g.report(per)
		r.Entries[name] = &gr
	}
	return r
}

func cloneMap(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
