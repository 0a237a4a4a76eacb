package journey

import (
	"time"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/node/console"
)

// explained keeps the explanation of p's verdict t for the console.
func (x *Executor) explained(p *Request, t *Ticket) {
	if x.console == nil {
		return
	}
	var cands [console.MaxCandidates]console.Candidate
	k := min(len(t.Cands), len(cands))
	for i := range k {
		cands[i] = consoleCandidate(&t.Cands[i])
	}
	e := console.Explanation{ID: p.Req.ID, Time: time.Now(), Model: p.Adm.Model, Class: admit.Class(p.Adm.Priority),
		Action: t.D.Action.String(), Layer: t.D.Layer, Reason: t.D.Code, Candidates: cands[:k], Total: len(t.Cands)}
	if !t.D.Refused() && t.D.Option >= 0 && t.D.Option < len(t.Cands) {
		e.Chosen = t.Cands[t.D.Option].Name
	}
	x.console.Record(e)
}

func consoleCandidate(c *route.Candidate) console.Candidate {
	out := console.Candidate{Name: c.Name, Score: c.Score, PrefixTokens: c.Terms.PrefixTokens, Load: c.Terms.Load,
		LoadTokens: c.Terms.LoadTokens, FreeKV: c.Terms.FreeKV, Power: c.Terms.Power, Thermal: c.Terms.Thermal,
		ReservedTokens: c.Terms.ReservedTokens, Spill: c.Terms.Spill, TTFTSeconds: c.PredictedTTFT.Seconds(),
		TPOTSeconds: c.PredictedTPOT.Seconds(), Home: c.Home, Gated: c.Gated, Sticky: c.Sticky}
	if c.Pair != nil {
		out.Decode = c.Pair.Decode.Name
	}
	return out
}

// forwardSent counts a forward to peer in the console's matrix.
func (x *Executor) forwardSent(peer string) {
	if x.console != nil {
		x.console.ForwardSent(peer)
	}
}
