package plan

import (
	"time"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/admit/route"
)

// Reserve reserves req's prefill and pl.D.KVBlocks on candidate i, releasing the plan's
// earlier reservation if any (dispatch moving on to the next candidate).
func (p *Planner) Reserve(now time.Time, req admit.Request, pl *Plan, i int) {
	p.Release(pl)
	c := &pl.Cands[i]
	prefill := max(req.PromptTokens-c.Terms.PrefixTokens, 0)
	if c.Pair != nil {
		// The prefill peer computes the prompt; the decode peer will hold the request's KV,
		// from the handover on: held until then (Handover).
		pl.Res = p.policy.Reserve(now, c.Name, prefill, 0)
		pl.ResDecode, pl.decodeHeld = p.policy.Hold(now, c.Pair.Decode.Name, pl.D.KVBlocks), true
		p.held.Add(int64(pl.ResDecode.Blocks))
		pl.Reserved = true
		return
	}
	pl.Res = p.policy.Reserve(now, c.Name, prefill, pl.D.KVBlocks)
	pl.Reserved = true
}

// Release gives back the plan's reservations (its request will not run there, or ran).
func (p *Planner) Release(pl *Plan) {
	if pl.Reserved {
		p.policy.Release(pl.Res)
		p.releaseDecode(pl)
		pl.Reserved = false
	}
}

func (p *Planner) releaseDecode(pl *Plan) {
	if pl.ResDecode.Peer == "" {
		return
	}
	p.policy.Release(pl.ResDecode)
	if pl.decodeHeld {
		p.held.Add(-int64(pl.ResDecode.Blocks))
	}
	pl.ResDecode, pl.decodeHeld = route.Reservation{}, false
}

// Handover moves a split request's decode blocks, held while it prefilled, onto peer, the
// decode node its handover goes to now (the pair's, or another decode candidate), as a
// reservation there that peer's next record clears.
func (p *Planner) Handover(now time.Time, pl *Plan, peer string) {
	if !pl.Reserved || pl.ResDecode.Peer == "" {
		return
	}
	blocks := pl.ResDecode.Blocks
	p.releaseDecode(pl)
	pl.ResDecode = p.policy.Reserve(now, peer, 0, blocks)
}
