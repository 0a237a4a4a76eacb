package plan

import (
	"slices"
	"time"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/admit/route"
)

// pair searches a prefill and a decode peer for req and applies the split rule against the
// whole candidates Route found (werr its error): split, the pair goes first in pl.Cands; whole
// on a decode peer (route.RunsLocal), that peer goes first and the pair, if any, next, as its
// fallback; either way the error is cleared.
func (p *Planner) pair(now time.Time, req admit.Request, rreq route.Request, v *View, pl *Plan, werr error) error {
	ttft, tpot := p.adm.SLOFor(req)
	p.policy.Pair(now, rreq, v.Peers, tpot, &pl.Search)
	var whole []route.Candidate
	if werr == nil {
		whole = pl.Cands
	}
	cfg := p.policy.Config()
	pr, split, why := route.Choose(&cfg, rreq, whole, &pl.Search, ttft, tpot)
	pl.SplitWhy = why
	local := route.RunsLocal(why)
	if !split && !local {
		return werr
	}
	if werr != nil {
		pl.Cands = pl.Cands[:0]
	}
	if pr != nil {
		pl.Cands = slices.Insert(pl.Cands, 0, pr.Candidate())
	}
	if local {
		pl.Cands = slices.Insert(pl.Cands, 0, pl.Search.Local[0])
	}
	return nil
}

// pairOption is the pair candidate c as admission's option: the pair's TTFT and TPOT, the
// prefill peer's cached prefix and rate, and the decode peer's KV, which holds the request,
// forecast for when the handover arrives there (t_a = now + TTFT_pair − step_d).
func (p *Planner) pairOption(c *route.Candidate, v *View, req admit.Request) admit.Option {
	d := &c.Pair.Decode
	peer := &v.Peers[d.Peer]
	o := OptionOf(d, peer, req.Priority, v.BlockTokens)
	o.Peer, o.PredictedTTFT, o.PredictedTPOT = c.Name, c.PredictedTTFT, c.PredictedTPOT
	o.CachedTokens, o.PrefillTokensPerSecond = c.Terms.PrefixTokens, v.Peers[c.Peer].PrefillTokensPerSecond
	o.Split = true
	o.Decode = admit.DecodeForecast{
		Node: d.Name, Total: peer.KVBlocksTotal,
		Used:     peer.KVBlocksUsed + QueuedBlocks(route.QueuedAhead(peer, req.Priority), v.BlockTokens),
		InFlight: d.Terms.ReservedBlocks + othersInFlight(v, req.Model, int(p.held.Load())),
		Step:     d.Terms.Step, Arrive: max(c.PredictedTTFT-d.Terms.Step, 0),
	}
	return o
}

// othersInFlight is one decode node's share of the split requests other ingresses sent the
// prefill pool of model: the prefill nodes' gossiped queued prefill, in blocks, less the
// blocks this node holds for its own (held), over the nodes that can decode it. Only the
// prompt's blocks are known; the output's are not counted.
func othersInFlight(v *View, model string, held int) int {
	queued, decoders := 0, 0
	for i := range v.Peers {
		peer := &v.Peers[i]
		if !peer.Healthy || !slices.Contains(peer.Models, model) {
			continue
		}
		switch {
		case peer.Role == route.RolePrefill:
			queued += QueuedBlocks(peer.QueuedPrefillTokens, v.BlockTokens)
		case !peer.WholeOnly && (peer.Role == route.RoleDecode || route.IsMixed(peer.Role)):
			decoders++
		}
	}
	if decoders == 0 {
		return 0
	}
	return max(queued-held, 0) / decoders
}
