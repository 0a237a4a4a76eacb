package admit

import "slices"

// backfillLocked returns the first of the items behind p's blocked head that canRun lets run
// beside it, or nil. Backfill keeps a pool's engines busy while a large head waits for room
// that small work behind it does not need: strictly head of line, one long prompt waiting for
// three quarters of a node would hold every request of its pool while the other nodes idle.
func (r *WaitingRoom) backfillLocked(p *pool, head *Item, canRun func(it, head *Item) bool) *Item {
	if r.cfg.Backfill <= 0 {
		return nil
	}
	for _, it := range r.behindLocked(p, head, r.cfg.Backfill) {
		if canRun(it, head) {
			return it
		}
	}
	return nil
}

// behindLocked returns up to k items of p other than head: highest band first, earliest
// deadline first inside a band.
func (r *WaitingRoom) behindLocked(p *pool, head *Item, k int) []*Item {
	var out []*Item
	for _, b := range p.bands {
		var band []*Item
		for _, f := range b.active {
			for _, it := range f.items {
				if it != head {
					band = append(band, it)
				}
			}
		}
		slices.SortFunc(band, func(a, b *Item) int {
			if edfLess(a, b) {
				return -1
			}
			return 1
		})
		out = append(out, band[:min(len(band), k-len(out))]...)
		if len(out) == k {
			break
		}
	}
	return out
}

func edfLess(a, b *Item) bool {
	if !a.Deadline.Equal(b.Deadline) {
		return a.Deadline.Before(b.Deadline)
	}
	return a.seq < b.seq
}

type edfHeap []*Item

func (h edfHeap) Len() int           { return len(h) }
func (h edfHeap) Less(i, j int) bool { return edfLess(h[i], h[j]) }
func (h edfHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i]; h[i].hidx = i; h[j].hidx = j }
func (h *edfHeap) Push(x any)        { it := x.(*Item); it.hidx = len(*h); *h = append(*h, it) }
func (h *edfHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return it
}

type expHeap []*Item

func (h expHeap) Len() int { return len(h) }
func (h expHeap) Less(i, j int) bool {
	if !h[i].Expires.Equal(h[j].Expires) {
		return h[i].Expires.Before(h[j].Expires)
	}
	return h[i].seq < h[j].seq
}
func (h expHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i]; h[i].eidx = i; h[j].eidx = j }
func (h *expHeap) Push(x any)   { it := x.(*Item); it.eidx = len(*h); *h = append(*h, it) }
func (h *expHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return it
}
