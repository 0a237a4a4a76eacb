// Package carbon holds the grid carbon-intensity signal's pure parts: the Reading and Provider
// types, the Tracker that keeps the latest reading and the poll schedule, and the shedding rule
// that decides where sheddable (priority < 0) requests may run.
//
// It is a pure library: the standard library without sockets, no goroutines, time passed in.
// The network providers (Electricity Maps, WattTime) and the constructor that maps the node's
// flags to a provider are in carbon/provider, which imports carbon; admission code can apply
// the rule without reaching net/http. The node runs the poll loop:
//
//	for {
//		wait until tracker.NextPoll(now)
//		r, err := p.Fetch(ctx, now)   // ctx carries the request timeout
//		if err != nil { tracker.RecordError(now, err) } else { tracker.Record(now, r) }
//	}
//
// # Providers
//
// Provider is the interface a source of readings implements. Static, here, returns a fixed
// value, or a value by hour of day from ParseSchedule. Provider errors are typed, whatever
// the transport: *RateLimitedError for a 429 (with the provider's Retry-After, which the
// Tracker honours), *HTTPError for other non-2xx statuses (errors.Is(err, ErrUnauthorized)
// for 401 and 403), ErrMalformed for bodies that do not parse or lack the value. A malformed
// body is never turned into a zero reading. Reading.Unit says whether a value is gCO2eq/kWh
// or a 0–100 percentile (WattTime): the threshold is in the provider's unit.
//
// # Tracker
//
// Tracker keeps the latest reading and the poll schedule. A reading is fresh while
// now − At ≤ MaxAge (At is the provider's own timestamp, so a provider that keeps serving an
// old value goes stale too). Before the first reading and once the reading is stale, the fail
// mode decides: FailOpen (the default) treats the node as clean, FailClosed as dirty. Status
// reports which applies (FailModeActive) so the node can export it as a metric and gossip it.
// Errors back off exponentially from BackoffMin, doubling per consecutive failure up to
// BackoffMax, with no jitter; a 429's Retry-After is honoured when it asks for longer.
//
// # Shedding rule
//
// Config.Dirty judges a grid from two figures, its intensity and whether its fail mode is
// active: with the fail mode active, dirty only under FailClosed; else dirty when the
// intensity is strictly above Threshold. Tracker.Dirty applies it to this node's reading, and
// the node applies it to each peer's gossiped figures, so the judgement is written once.
//
// Decide applies the rule:
//
//   - priority ≥ 0 (normal, high): never affected (ActionAny).
//   - priority < 0 on a clean node: may run here (ActionLocal).
//   - priority < 0 on a dirty node: route to a clean peer with room (ActionRoute, Peers lists
//     them in the order given, for the router to score), else refuse with 429 carbon_deferred
//     (ActionDefer) and a Retry-After from the provider's next expected change, or the poll
//     interval when that is unknown (Tracker.Decide fills it in).
//
// The owner of a forwarded request applies the rule again with no others, so a peer that has
// turned dirty since its last gossip refuses and the ingress tries the next candidate.
//
// docs/design/carbon.md gives the reasoning behind the rule and the fail modes.
//
// # Concurrency and zero values
//
// Tracker is safe for concurrent use, SetConfig (a node's config reload) included; the zero
// Tracker is not usable: build one with New, which validates a Config (start from
// DefaultConfig). Config, Decide and Config.Dirty are
// plain values and functions, safe anywhere; the zero Config fails open and calls any
// positive intensity dirty. Static is read-only after construction; the zero Static reports
// intensity 0 in gCO2eq/kWh for zone "static".
package carbon
