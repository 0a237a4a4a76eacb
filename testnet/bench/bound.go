package bench

import (
	"cmp"
	"container/heap"
	"math"
	"slices"
	"sync"

	"github.com/kvmesh/kvmesh/testnet/loadgen"
)

// ClassBound is one class's SLO attainment in a run beside the bound: the attainment an ideal
// admission could have given it with the service the mesh performed (see the package doc,
// "The bound").
//
// Bound counts, of the run's good requests (every class's), those an ideal admission could
// have spent on the class: the service is a good request's first token, and one at time t
// could have been a request of class c's instead only if that request had arrived by t and t
// fell within its TTFT target. The ideal admission serves the classes in priority order: class
// c gets M(c and the classes above it) − M(the classes above it), where M(S) is the largest
// number of S's requests that can each be given a distinct good request's first token inside
// [its arrival, its arrival + its TTFT target]. With one class, or a class whose target spans
// the run, that is BoundServed. A lower class's attainment can exceed its Bound: the ideal
// admission gives the first tokens both could have used to the higher class first.
//
// BoundServed spends every good request of the run on the classes in priority order, each
// taking as many as it sent: min(1, max(0, Good − sent by classes above c) ÷ sent by c),
// whenever its service came, the drain after the last arrival included.
//
// Both assume a good request of one class costs what one of another does, so that the mesh
// could have served any class's request in place of one it served well; where classes differ
// in cost (the mixed workloads send the long repository prompts as batch) they are
// approximate, and where a class's requests are cheaper than another's they can be exceeded.
type ClassBound struct {
	Class      string  `json:"class"`
	Sent       int     `json:"sent"`
	Good       int     `json:"good"`
	Attainment float64 `json:"slo_attainment"`
	Bound      float64 `json:"bound"`
	// Ratio is Attainment ÷ Bound, 0 when Bound is 0.
	Ratio float64 `json:"ratio"`
	// BoundServed and RatioServed are the bound over all of the run's good requests and
	// Attainment ÷ BoundServed (0 when BoundServed is 0).
	BoundServed float64 `json:"bound_served"`
	RatioServed float64 `json:"ratio_served"`
}

// Bounds returns each class of rep's attainment against its bounds (see ClassBound), in
// priority order, highest first (ties by name). recs are the run's request records; without
// them (nil) Bound is BoundServed.
func Bounds(rep *loadgen.Report, recs []loadgen.RequestRecord) []ClassBound {
	classes := byPriority(rep)
	var slots []float64
	var windows map[string][]window
	if recs != nil {
		slots, windows = boundWindows(rep, recs)
	}
	left, matched := rep.Good, 0
	var pool []window
	out := make([]ClassBound, 0, len(classes))
	for _, c := range classes {
		give := min(left, c.Sent)
		left -= give
		b := ClassBound{Class: c.Name, Sent: c.Sent, Good: c.Good, Attainment: c.Attainment, BoundServed: frac(give, c.Sent)}
		b.Bound = b.BoundServed
		if recs != nil {
			pool = append(pool, windows[c.Name]...)
			m := maxMatch(pool, slots)
			b.Bound = min(1, frac(m-matched, c.Sent))
			matched = m
		}
		b.Ratio, b.RatioServed = ratioTo(b.Attainment, b.Bound), ratioTo(b.Attainment, b.BoundServed)
		out = append(out, b)
	}
	return out
}

func ratioTo(att, bound float64) float64 {
	if bound <= 0 {
		return 0
	}
	return att / bound
}

// window is when a request could have had its first token and met its TTFT target, in seconds
// since the run's start.
type window struct{ from, to float64 }

// boundWindows returns the first tokens of recs' good requests, in order, and each class's
// requests' windows. A request's target is the one the mesh declared for it, else its class's
// TTFT SLO, else none (its window has no end); a good request's window always holds its own
// first token.
func boundWindows(rep *loadgen.Report, recs []loadgen.RequestRecord) ([]float64, map[string][]window) {
	var slots []float64
	windows := map[string][]window{}
	for _, r := range recs {
		arrival := r.EndS - r.E2ES
		target := r.TTFTTargetS
		if c := rep.Classes[r.Class]; target <= 0 && c != nil {
			target = c.TTFTSLO
		}
		w := window{arrival, math.Inf(1)}
		if target > 0 {
			w.to = arrival + target
		}
		if r.MetSLO {
			first := arrival + r.TTFTS
			slots = append(slots, first)
			w.to = max(w.to, first)
		}
		windows[r.Class] = append(windows[r.Class], w)
	}
	slices.Sort(slots)
	return slots, windows
}

// maxMatch returns the largest number of windows that can each be given a distinct slot
// inside it (slots in order). Earliest deadline first is optimal for points and intervals:
// each slot goes to the open window that closes first.
func maxMatch(windows []window, slots []float64) int {
	ws := slices.Clone(windows)
	slices.SortFunc(ws, func(a, b window) int { return cmp.Compare(a.from, b.from) })
	open := &deadlines{}
	n, next := 0, 0
	for _, t := range slots {
		for ; next < len(ws) && ws[next].from <= t; next++ {
			heap.Push(open, ws[next].to)
		}
		for open.Len() > 0 && (*open)[0] < t {
			heap.Pop(open)
		}
		if open.Len() > 0 {
			heap.Pop(open)
			n++
		}
	}
	return n
}

// deadlines is a min-heap of windows' ends.
type deadlines []float64

func (d deadlines) Len() int           { return len(d) }
func (d deadlines) Less(i, j int) bool { return d[i] < d[j] }
func (d deadlines) Swap(i, j int)      { d[i], d[j] = d[j], d[i] }
func (d *deadlines) Push(x any)        { *d = append(*d, x.(float64)) }
func (d *deadlines) Pop() any {
	old := *d
	x := old[len(old)-1]
	*d = old[:len(old)-1]
	return x
}

// recordKeeper keeps a run's request records for the bound (loadgen.Config.Observe); safe for
// concurrent use.
type recordKeeper struct {
	mu   sync.Mutex
	recs []loadgen.RequestRecord
}

func (k *recordKeeper) observe(r loadgen.RequestRecord) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.recs = append(k.recs, r)
}

// records returns the records kept so far, never nil.
func (k *recordKeeper) records() []loadgen.RequestRecord {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]loadgen.RequestRecord{}, k.recs...)
}
