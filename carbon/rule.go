package carbon

import "time"

// ReasonDeferred is the refusal reason (429) of a deferred sheddable request.
const ReasonDeferred = "carbon_deferred"

// Action is the shedding rule's verdict.
type Action int

const (
	// ActionAny: the rule does not apply (priority ≥ 0); route as usual.
	ActionAny Action = iota
	// ActionLocal: sheddable, and this node is clean; it may run here, or on a peer in Peers.
	ActionLocal
	// ActionRoute: sheddable on a dirty node; run it on one of Peers (clean, with room).
	ActionRoute
	// ActionDefer: sheddable, no clean node has room; refuse 429 carbon_deferred.
	ActionDefer
)

func (a Action) String() string {
	switch a {
	case ActionLocal:
		return "local"
	case ActionRoute:
		return "route"
	case ActionDefer:
		return "defer"
	}
	return "any"
}

// Option is another node as the rule sees it, from gossip.
type Option struct {
	Name    string
	Dirty   bool // its grid is over its threshold (or its fail mode says so)
	HasRoom bool // the router would admit the request there
}

// Decision is the rule's outcome.
type Decision struct {
	Action Action
	// Peers are the clean peers with room, in the order given; set for sheddable requests.
	Peers []string
	// Reason is ReasonDeferred for ActionDefer, else empty.
	Reason string
	// RetryAfter is set by Tracker.Decide for ActionDefer.
	RetryAfter time.Duration
}

// Dirty judges a grid from its figures, this node's or a peer's as gossiped: with no fresh
// reading (failModeActive: none yet, or older than MaxAge) the fail mode decides, dirty only
// under FailClosed; otherwise the grid is dirty when intensity is strictly above Threshold.
// Tracker.Dirty applies it to the tracker's own reading, so every node judges every grid,
// its own included, by the same rule.
func (c Config) Dirty(intensity float64, failModeActive bool) bool {
	if failModeActive {
		return c.FailMode == FailClosed
	}
	return intensity > c.Threshold
}

// Decide is the shedding rule: priority ≥ 0 is never affected; a sheddable request (priority
// < 0) runs on a clean node, routed to a clean peer with room when this node is dirty, and is
// deferred only when no clean node has room.
func Decide(priority int, localDirty bool, others []Option) Decision {
	if priority >= 0 {
		return Decision{Action: ActionAny}
	}
	var peers []string
	for _, o := range others {
		if !o.Dirty && o.HasRoom {
			peers = append(peers, o.Name)
		}
	}
	switch {
	case !localDirty:
		return Decision{Action: ActionLocal, Peers: peers}
	case len(peers) > 0:
		return Decision{Action: ActionRoute, Peers: peers}
	}
	return Decision{Action: ActionDefer, Reason: ReasonDeferred}
}
