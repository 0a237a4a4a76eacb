package round

import (
	"slices"
	"time"
)

// Bucket is the byte budget: Rate bytes a second, holding one second's worth at most. Tokens
// may be negative: a round overdraws it, and what follows waits until it is back above zero.
// The zero Bucket with a Rate starts full at its first Refill.
type Bucket struct {
	Rate   float64
	Tokens float64
	// At is the time of the last Refill (zero: none yet).
	At time.Time
}

// Refill adds the budget's bytes since the last Refill, up to one second's worth; the first
// Refill fills the bucket.
func (b *Bucket) Refill(now time.Time) {
	if b.At.IsZero() {
		b.Tokens = b.Rate
	} else {
		b.Tokens = min(b.Rate, b.Tokens+b.Rate*now.Sub(b.At).Seconds())
	}
	b.At = now
}

// MaxRound is the most one round may cost: two seconds' worth of budget.
func (b Bucket) MaxRound() float64 { return 2 * b.Rate }

// Recipients returns the members of the given domains, each once, sorted: a member in two of
// a node's domains is sent a round once.
func Recipients(domains [][]string) []string {
	var names []string
	for _, d := range domains {
		names = append(names, d...)
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// Member is one recipient of a round as the planner sees it.
type Member struct {
	// Synced: the member's current process has been sent this node's whole residency.
	Synced bool
	// RecordAt is when the member was last sent this node's record straight (zero: never).
	RecordAt time.Time
}

// Round is what a round has to plan.
type Round struct {
	Now time.Time
	// Interval is the time between two rounds.
	Interval time.Duration
	// Members are the round's recipients (Recipients), in order.
	Members []Member
	// Budget is the byte budget, refilled to Now.
	Budget Bucket
	// Record is the cost in bytes (its packet included) of this node's record sent straight to
	// one member; zero when records go by memberlist's gossip alone. A member is sent it at
	// most every RecordEvery. RecordNext is the member the records start from (Plan.RecordNext
	// of the last round).
	Record      int
	RecordEvery time.Duration
	RecordNext  int
	// Deltas is the number of pending delta messages, DeltaBytes what they cost to one member.
	Deltas     int
	DeltaBytes int
}

// Deltas is what a round does with its pending deltas.
type Deltas int

// What a round does with its pending deltas.
const (
	// DeltasNone: there were none.
	DeltasNone Deltas = iota
	// DeltasSend: sent to every member, and no longer pending.
	DeltasSend
	// DeltasDrop: too large for one round; dropped, and every member is to be sent the
	// residency again (Plan.Resync lists them all).
	DeltasDrop
	// DeltasWait: the bucket is in debt; they stay pending and keep coalescing.
	DeltasWait
)

// Plan is what a round sends, to whom.
type Plan struct {
	// Records lists the members (indexes into Round.Members) sent the record; they were sent
	// it at Round.Now. RecordNext is where the next round's records start.
	Records    []int
	RecordNext int
	Deltas     Deltas
	// Resync lists the members to be sent the residency after the deltas (PlanSync): the ones
	// not synced, or every member after DeltasDrop.
	Resync []int
	// Budget is the bucket after the records and deltas.
	Budget Bucket
}

// PlanRound plans one prefix round.
func PlanRound(r Round) Plan {
	p := Plan{RecordNext: r.RecordNext, Budget: r.Budget}
	if len(r.Members) == 0 {
		return p
	}
	if r.Record > 0 {
		p.planRecords(r)
	}
	if r.Deltas > 0 {
		cost := float64(len(r.Members) * r.DeltaBytes)
		switch {
		case p.Budget.Tokens > 0 && cost <= p.Budget.MaxRound():
			p.Deltas = DeltasSend
			p.Budget.Tokens -= cost
		case p.Budget.Tokens > 0:
			p.Deltas = DeltasDrop
		default:
			p.Deltas = DeltasWait
		}
	}
	for i, m := range r.Members {
		if !m.Synced || p.Deltas == DeltasDrop {
			p.Resync = append(p.Resync, i)
		}
	}
	return p
}

// planRecords sends the record to the synced members due one, from RecordNext round the
// members, within half the budget of a round.
func (p *Plan) planRecords(r Round) {
	budget := max(r.Record, int(r.Budget.Rate/2*r.Interval.Seconds()))
	spent, start := 0, r.RecordNext%len(r.Members)
	for k := range r.Members {
		i := (start + k) % len(r.Members)
		m := r.Members[i]
		if !m.Synced || r.Now.Sub(m.RecordAt) < r.RecordEvery {
			continue
		}
		if spent+r.Record > budget {
			break
		}
		p.Records, spent, p.RecordNext = append(p.Records, i), spent+r.Record, i+1
	}
	p.Budget.Tokens -= float64(spent)
}

// SyncPlan is how far a round's residency goes.
type SyncPlan struct {
	// Send is how many of the members, from the first, are sent the residency; they are
	// synced. TooLarge: the residency costs more than a round may, and none is sent it, yet
	// all count as synced.
	Send     int
	TooLarge bool
	// Budget is the bucket after the residency.
	Budget Bucket
}

// PlanSync plans sending the residency, cost bytes to each member, to n members in order.
func PlanSync(b Bucket, cost, n int) SyncPlan {
	if float64(cost) > b.MaxRound() {
		return SyncPlan{TooLarge: true, Budget: b}
	}
	send := 0
	for range n {
		if b.Tokens <= 0 {
			break // the rest at a later round
		}
		b.Tokens -= float64(cost)
		send++
	}
	return SyncPlan{Send: send, Budget: b}
}
