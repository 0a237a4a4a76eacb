package plan

import (
	"slices"
	"time"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/carbon"
)

// shed applies the carbon rule to the candidates of a request of priority: a sheddable
// request runs only where the grid is clean, so dirty candidates are dropped, and with none
// left it is refused carbon_deferred. It reports whether to go on.
func (p *Planner) shed(now time.Time, priority int, v *View, pl *Plan) bool {
	if p.grid == nil || priority >= 0 || len(pl.Cands) == 0 {
		return true
	}
	self := ""
	var others []carbon.Option
	for _, c := range pl.Cands {
		if v.Peers[c.Peer].Self {
			self = c.Name
			continue
		}
		others = append(others, carbon.Option{Name: c.Name, Dirty: v.Dirty[c.Peer], HasRoom: true})
	}
	// This node may run it only as a candidate; its own grid is the tracker's.
	d := p.grid.Decide(now, priority, others)
	if d.Action == carbon.ActionLocal && self == "" {
		d.Action = carbon.ActionRoute
	}
	if d.Action == carbon.ActionAny {
		return true
	}
	kept := pl.Cands[:0]
	for _, c := range pl.Cands {
		if (d.Action == carbon.ActionLocal && c.Name == self) || slices.Contains(d.Peers, c.Name) {
			kept = append(kept, c)
		}
	}
	pl.CarbonRouted = len(kept) > 0 && len(kept) < len(pl.Cands)
	pl.Cands = kept
	if len(kept) == 0 {
		retry := d.RetryAfter
		if retry <= 0 {
			retry = p.grid.RetryAfter(now)
		}
		pl.D = carbonDeferred("sheddable request deferred: every grid with room is over the carbon threshold", retry)
		return false
	}
	return true
}

func carbonDeferred(msg string, retry time.Duration) admit.Decision {
	return admit.Decision{Action: admit.Refuse, Status: statusTooManyRequests, Layer: LayerCarbon,
		Code: CodeCarbonDeferred, Message: msg, RetryAfter: retry, Option: -1}
}
