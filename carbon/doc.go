// Package carbon reads the carbon intensity of the grid under a node and decides, with the
// shedding rule, where sheddable (priority < 0) requests may run.
//
// It is a pure library with one edge: the HTTP providers (ElectricityMaps, WattTime) use
// net/http behind the Provider interface. It starts no goroutines; the node runs the poll loop:
//
//	for {
//		wait until tracker.NextPoll(now)
//		r, err := provider.Fetch(ctx, now)   // ctx carries the request timeout
//		if err != nil { tracker.RecordError(now, err) } else { tracker.Record(now, r) }
//	}
//
// # Providers
//
// Static returns a fixed value, or a value by hour of day from ParseSchedule. ElectricityMaps
// returns gCO2eq/kWh (Unit "gCO2eq/kWh"). WattTime returns its signal index, a 0–100 percentile
// of the region's recent marginal emissions (Unit "percentile"): with WattTime the threshold is
// a percentile, not gCO2eq/kWh. Provider errors are typed: *RateLimitedError for a 429 (with the
// provider's Retry-After), *HTTPError for other non-2xx statuses (errors.Is(err,
// ErrUnauthorized) for 401 and 403), ErrMalformed for bodies that do not parse or lack the
// value. A malformed body is never turned into a zero reading.
//
// # Tracker
//
// Tracker keeps the latest reading and the poll schedule. A reading is fresh while
// now − At ≤ MaxAge (At is the provider's own timestamp, so a provider that keeps serving an
// old value goes stale too). Before the first reading and once the reading is stale, the fail
// mode decides: FailOpen (the default) treats the node as clean, FailClosed as dirty. Status
// reports which applies so the node can export it as a metric. Errors back off exponentially
// from BackoffMin, doubling per consecutive failure up to BackoffMax, with no jitter; a 429's
// Retry-After is honoured when it asks for longer.
//
// # Shedding rule
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
// # Concurrency
//
// Tracker and WattTime are safe for concurrent use. Static and ElectricityMaps are read-only
// after construction. The zero Tracker is not usable: build one with New.
package carbon
