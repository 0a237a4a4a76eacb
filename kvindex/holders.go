package kvindex

import (
	"slices"
	"time"
)

type specHolder struct {
	id      uint32
	expires time.Time
}

// holderSet is who holds one block: confirmed holders as ids or bits, speculative ones apart
// because they need an expiry check.
type holderSet struct {
	ids  []uint32
	bits []uint64
	spec []specHolder
}

// intersect sets keep = active ∩ holders (speculative ones only if unexpired at now) and
// reports whether keep is non-empty.
func (hs *holderSet) intersect(active, keep []uint64, now time.Time) bool {
	clear(keep)
	if hs.bits != nil {
		for w := range keep {
			if w < len(hs.bits) {
				keep[w] = active[w] & hs.bits[w]
			}
		}
	} else {
		for _, id := range hs.ids {
			w, b := id/64, uint64(1)<<(id%64)
			keep[w] |= active[w] & b
		}
	}
	for _, s := range hs.spec {
		if s.expires.After(now) {
			w, b := s.id/64, uint64(1)<<(s.id%64)
			keep[w] |= active[w] & b
		}
	}
	var or uint64
	for _, k := range keep {
		or |= k
	}
	return or != 0
}

func (x *Index) holderAdd(h uint64, id uint32) {
	hs := x.holders[h]
	if hs == nil {
		hs = &holderSet{}
		x.holders[h] = hs
	}
	if hs.bits == nil && len(hs.ids) < smallSet {
		hs.ids = append(hs.ids, id)
		return
	}
	if hs.bits == nil {
		for _, o := range hs.ids {
			hs.setBit(o)
		}
		hs.ids = nil
	}
	hs.setBit(id)
}

func (hs *holderSet) setBit(id uint32) {
	w := int(id / 64)
	if w >= len(hs.bits) {
		hs.bits = append(hs.bits, make([]uint64, w+1-len(hs.bits))...)
	}
	hs.bits[w] |= 1 << (id % 64)
}

func (hs *holderSet) empty() bool {
	if len(hs.spec) > 0 || len(hs.ids) > 0 {
		return false
	}
	for _, b := range hs.bits {
		if b != 0 {
			return false
		}
	}
	return true
}

func (x *Index) holderRemove(h uint64, id uint32) {
	hs := x.holders[h]
	if hs == nil {
		return
	}
	if hs.bits != nil {
		if w := int(id / 64); w < len(hs.bits) {
			hs.bits[w] &^= 1 << (id % 64)
		}
	} else if i := slices.Index(hs.ids, id); i >= 0 {
		hs.ids[i] = hs.ids[len(hs.ids)-1]
		hs.ids = hs.ids[:len(hs.ids)-1]
	}
	if hs.empty() {
		delete(x.holders, h)
	}
}

func (x *Index) holderRemoveSpec(h uint64, id uint32) {
	hs := x.holders[h]
	if hs == nil {
		return
	}
	for i, s := range hs.spec {
		if s.id == id {
			hs.spec[i] = hs.spec[len(hs.spec)-1]
			hs.spec = hs.spec[:len(hs.spec)-1]
			break
		}
	}
	if hs.empty() {
		delete(x.holders, h)
	}
}
