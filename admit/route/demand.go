package route

import (
	"math"
	"slices"
	"sync"
	"time"
)

// Adapter demand and slot yield. A reply holds its adapter's GPU slot for its whole decode,
// so an adapter whose requests overlap (its arrival rate times its reply time well above one)
// never frees its slot once it has one: whichever adapters took the slots first keep them, and
// an adapter more popular than they, resident nowhere, finds no slot at all. A slot changes
// hands only when its adapter's requests stop coming to it. So a request of an adapter whose
// recent requests are fewer than 1/Config.AdapterYieldRatio of those of another adapter of
// the same base model that is resident on no peer yields (Request.Yield): it takes no free
// slot, and it keeps its adapter's slot on a peer only while that peer has a free slot
// besides (seatless). Its slots then drain within its longest running reply, and the more
// popular adapter takes the slot that frees. The yield lasts while the popular adapter is
// resident nowhere, so the first of the yielding adapters' slots to drain ends it.

// DemandWindow is the time constant of AdapterDemand's decaying counts: a request counts
// e^(−age/DemandWindow).
const DemandWindow = 30 * time.Second

// demandMin is the decayed count of requests below which an adapter makes none yield: a
// single request says nothing of its adapter's popularity.
const demandMin = 2

// maxDemandAdapters bounds the adapters an AdapterDemand tracks; past it the least demanded
// are forgotten.
const maxDemandAdapters = 4096

// AdapterDemand counts each LoRA adapter's recent requests at this node's ingress, decayed
// over DemandWindow. The counts of one ingress rank adapters as the mesh's do (every ingress
// sees a share of each adapter's traffic). Safe for concurrent use; the zero value is ready.
type AdapterDemand struct {
	mu sync.Mutex
	m  map[string]*demand
}

type demand struct {
	parent string
	n      float64   // decayed count at at
	at     time.Time // of the last update
}

func (d *demand) count(now time.Time) float64 {
	if age := now.Sub(d.at); age > 0 {
		return d.n * math.Exp(-age.Seconds()/DemandWindow.Seconds())
	}
	return d.n
}

// Add counts a request of adapter model (of base model parent) arriving now. A base model's
// request (parent "") counts nothing.
func (a *AdapterDemand) Add(now time.Time, model, parent string) {
	if parent == "" {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.m == nil {
		a.m = map[string]*demand{}
	}
	e, ok := a.m[model]
	if !ok {
		if len(a.m) >= maxDemandAdapters {
			a.forgetLocked(now)
		}
		e = &demand{parent: parent}
		a.m[model] = e
	}
	e.n, e.at, e.parent = e.count(now)+1, now, parent
}

// forgetLocked drops the adapters of the lowest decayed counts, half of the bound.
func (a *AdapterDemand) forgetLocked(now time.Time) {
	type kv struct {
		name string
		n    float64
	}
	all := make([]kv, 0, len(a.m))
	for name, e := range a.m {
		all = append(all, kv{name, e.count(now)})
	}
	slices.SortFunc(all, func(x, y kv) int { return cmpFloat(x.n, y.n) })
	for _, e := range all[:len(all)/2] {
		delete(a.m, e.name)
	}
}

func cmpFloat(x, y float64) int {
	switch {
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return 0
}

// Count returns adapter model's decayed count of requests now.
func (a *AdapterDemand) Count(now time.Time, model string) float64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	if e, ok := a.m[model]; ok {
		return e.count(now)
	}
	return 0
}

// Yields reports whether req's adapter yields its slots now (Request.Yield): ratio > 0 and
// another adapter of req's base model with at least demandMin and ratio times req's adapter's
// decayed count is resident on no peer of peers that serves the base model with adapter slots.
func (a *AdapterDemand) Yields(now time.Time, req *Request, peers []Peer, ratio float64) bool {
	if req.Parent == "" || ratio <= 0 {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	own := 0.0
	if e, ok := a.m[req.Model]; ok {
		own = e.count(now)
	}
	need := max(ratio*own, demandMin)
	for name, e := range a.m {
		if name == req.Model || e.parent != req.Parent || e.count(now) < need {
			continue
		}
		if !residentOnAny(name, req.Parent, peers) && slotsFor(req.Parent, peers) {
			return true
		}
	}
	return false
}

// residentOnAny reports whether adapter holds a GPU slot on a peer of peers.
func residentOnAny(adapter, parent string, peers []Peer) bool {
	for i := range peers {
		if slices.Contains(peers[i].ResidentAdapters, adapter) {
			return true
		}
	}
	return false
}

// slotsFor reports whether a peer of peers serves parent with adapter slots: only then does a
// slot that drains go to parent's adapters.
func slotsFor(parent string, peers []Peer) bool {
	for i := range peers {
		if peers[i].LoRASlots > 0 && slices.Contains(peers[i].Models, parent) {
			return true
		}
	}
	return false
}
