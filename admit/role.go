package admit

import (
	"math"
	"time"
)

// Admission per role in a disaggregated mesh (docs/design/disaggregation.md, "Admission per
// role"). A split request's prefill half is counted in the (model, RolePrefill) pool of the
// waiting room, in queued prefill tokens; its decode half against the decode node's KV as it
// is forecast for when the handover arrives (DecodeForecast), at the KV.DecodeQueueOn and
// DecodeQueueOff marks; a whole request stays in the (model, "") pool.

// Roles of Request.Role and Item.Role: the pool a request is counted in.
const (
	RolePrefill = "prefill" // a split request, or the prefill half an owner checks
	RoleDecode  = "decode"  // the decode half an owner checks at the handover
)

// Pools, the bounded "pool" label of the per-pool decision metric (Decision.Pools).
const (
	PoolWhole   = "whole"
	PoolPrefill = "prefill"
	PoolDecode  = "decode"
)

// Codes of the decode pool.
const (
	// CodeDecodeFull (429) refuses a split request before its prefill: its decode node is
	// forecast to lack room when the handover would arrive, and waiting for room would miss
	// its TTFT target.
	CodeDecodeFull = "decode_full"
	// CodeWaitDecode queues a split request whose decode node is forecast to lack room now but
	// to drain in time.
	CodeWaitDecode = "wait_decode"
)

// DecodeForecast is what the forecast of a decode node's free KV needs: its state now and
// when the decode half would arrive there.
type DecodeForecast struct {
	Node  string
	Total int // KV blocks of the node (0: unknown, nothing is forecast)
	// Used are the blocks its running and queued work holds now, by its last state record.
	Used int
	// InFlight are the blocks of split requests admitted to the node and not yet in its record:
	// this node's reservations there (exact), and its share of the prefill pool's queued work
	// that other nodes sent (known only through gossip).
	InFlight int
	// Step is the node's decode step; Arrive is t_a − now, when the handover would arrive
	// (TTFT_pair − Step).
	Step, Arrive time.Duration
}

// Free is F(t_a), the blocks forecast free when the handover arrives for a request that
// holds its blocks for output tokens (E[out]):
//
//	F(t_a) = (Total − Used) + Used · min(1, Arrive / (output · Step)) − InFlight
//
// The used blocks drain at the rate a mean request's residence, output steps, releases them;
// the halves in flight take theirs. It judges the decode room on when the request gets
// there, not now, which keeps the prefill and decode pools out of anti-phase.
func (f DecodeForecast) Free(output int) int {
	used := max(f.Used, 0)
	free := float64(f.Total-used) + float64(used)*f.drained(output) - float64(max(f.InFlight, 0))
	return int(math.Floor(free))
}

// drained is the share of the used blocks released by Arrive.
func (f DecodeForecast) drained(output int) float64 {
	life := float64(max(output, 1)) * f.Step.Seconds()
	if life <= 0 {
		return 1 // no step known: a request's residence is unknown, taken as past
	}
	return min(max(f.Arrive.Seconds(), 0)/life, 1)
}

// Wait is how long after t_a the node takes to free missing more blocks: its load then, the
// used blocks and the halves in flight, releases (Used + InFlight) blocks per residence of
// output steps. ok false when nothing would drain (no load, or no step known).
func (f DecodeForecast) Wait(missing, output int) (time.Duration, bool) {
	if missing <= 0 {
		return 0, true
	}
	life := float64(max(output, 1)) * f.Step.Seconds()
	load := max(f.Used, 0) + max(f.InFlight, 0)
	if load <= 0 || life <= 0 {
		return 0, false
	}
	s := float64(missing) / (float64(load) / life)
	if s >= float64(math.MaxInt64/int64(time.Second)) {
		return 0, false
	}
	return time.Duration(s * float64(time.Second)), true
}

// Pools names the budgets d counted against, for the per-pool metric: a split request's
// accept both its pools; a verdict on the decode room the decode pool; an owner's check of a
// half its half's pool; anything else the whole requests'.
func (d Decision) Pools() []string {
	switch {
	case d.Code == CodeDecodeFull || d.Code == CodeWaitDecode || d.Role == RoleDecode:
		return poolsDecode
	case d.Split && d.Action == Accept:
		return poolsBoth
	case d.Role == RolePrefill:
		return poolsPrefill
	}
	return poolsWhole
}

var (
	poolsWhole   = []string{PoolWhole}
	poolsPrefill = []string{PoolPrefill}
	poolsDecode  = []string{PoolDecode}
	poolsBoth    = []string{PoolPrefill, PoolDecode}
)

// splitPool is the room pool of a request over options: the prefill pool when its preferred
// option is a pair, else its own role's.
func splitPool(req Request, options []Option) string {
	if len(options) > 0 && options[0].Split {
		return RolePrefill
	}
	return req.Role
}

// decodeView is o with FreeKVBlocks the forecast F(t_a) for a pair (o.Split), else o.
func decodeView(o Option, output int) Option {
	if o.Split && o.Decode.Total > 0 {
		o.FreeKVBlocks = o.Decode.Free(output)
	}
	return o
}

// mark is the KV mark a request is held to on o: the decode pool's for a pair or a decode
// half, the whole request's otherwise; queued selects the lower, dispatch mark.
func (a *Admitter) mark(req Request, o Option, queued bool) float64 {
	kv := a.conf().KV
	if o.Split || req.Role == RoleDecode {
		if queued {
			return kv.DecodeQueueOff
		}
		return kv.DecodeQueueOn
	}
	if queued {
		return kv.QueueOff
	}
	return kv.QueueOn
}

// decodeFull reports whether the pair o (first of the options, no room for need blocks) can
// get its decode room within the TTFT target: its forecast drains the missing blocks after
// t_a, and the request then still prefills in time. Not: the 429 decode_full refusal, with a
// Retry-After of that drain. ok false means wait.
func (a *Admitter) decodeFull(o Option, need, output int, waited, ttftSLO time.Duration) (Decision, bool) {
	f := o.Decode
	mark := a.conf().KV.DecodeQueueOn
	free := f.Free(output)
	missing := need - free + int(math.Ceil((1-mark)*float64(f.Total)))
	w, drains := f.Wait(missing, output)
	if drains && (ttftSLO <= 0 || waited+w+o.PredictedTTFT <= ttftSLO) {
		return Decision{}, false
	}
	d := refuse(statusTooManyRequests, LayerKV, CodeDecodeFull, "",
		"the decode node %s is forecast to have %d free KV blocks of %d when this request's prompt is prefilled (in %v); it needs %d, and waiting for them would miss the TTFT target of %v",
		f.Node, max(free, 0), f.Total, f.Arrive.Round(time.Millisecond), need, ttftSLO)
	q := a.conf().Queue
	if !drains {
		w = time.Duration(q.MaxRetryAfter)
	}
	d.RetryAfter = min(max(w, time.Duration(q.MinRetryAfter)), time.Duration(q.MaxRetryAfter))
	return d, true
}
