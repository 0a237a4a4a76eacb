package admit

import "time"

// Item builds the waiting-room item for a request Admit answered Queue.
func (a *Admitter) Item(req Request, d Decision) *Item {
	req.Tenant = d.Tenant
	if req.OwnTTFT == 0 {
		req.OwnTTFT = d.OwnTTFT
	}
	tokens := req.PromptTokens // a decision that does not say (or a prompt wholly cached)
	if d.PrefillTokens > 0 {
		tokens = d.PrefillTokens
	}
	role := req.Role
	if d.Role != "" {
		// A split request waits in the prefill pool. Its Req keeps the ingress's role: a whole
		// candidate that takes it later needs its whole KV, output included (blocks).
		role = d.Role
	}
	return &Item{
		ID: req.ID, Model: req.PoolModel(), Role: role, Tenant: d.Tenant, Priority: req.Priority,
		Tokens: tokens, Arrived: req.Arrived, Deadline: a.deadline(req),
		Expires: req.Arrived.Add(a.TTL(req)), Req: req, MaxTokens: d.MaxTokens, ExpectedTokens: d.ExpectedTokens,
	}
}

// Ready re-checks a queued item against fresh candidates (call it from WaitingRoom.Next's
// canRun; it does not touch the room). Accept names the first candidate with KV room at the
// lower KV.QueueOff mark (the hysteresis; KV.Sheddable for sheddable work) that meets the SLOs
// counting the time already waited, with Queue.DispatchSlack of the TTFT target to spare
// (never a Fallback option);
// Queue means not yet; Refuse (429 slo_unattainable) means its deadline can no longer be met
// anywhere: the node removes it and answers now rather than serve it late.
func (a *Admitter) Ready(now time.Time, it *Item, options []Option) Decision {
	ttftSLO, tpotSLO := a.SLOFor(it.Req)
	// A queued request is dispatched only with Queue.DispatchSlack of its TTFT target to spare:
	// the room hands out the earliest deadlines first, so under overload every request it
	// dispatches has nearly used its target up waiting, and the estimate's error would make
	// most of them late (docs/design/admission.md).
	dispatchTTFT := ttftSLO - time.Duration(float64(ttftSLO)*max(a.conf().Queue.DispatchSlack, 0))
	waited := now.Sub(it.Req.SLOClock())
	anyFeasible := false
	for i, o := range options {
		if o.Fallback {
			continue
		}
		if _, ok := feasible(o, 0, waited, dispatchTTFT, tpotSLO); !ok {
			continue
		}
		anyFeasible = true
		need := a.blocks(it.Req, it.ExpectedTokens, o)
		// The hysteresis keeps a drained candidate from flapping between queueing and
		// letting work through; on the room a head claimed, the claim keeps everything else
		// off, so it starts there at the admission mark.
		claimed := it.Claim.Publish && it.Claim.Peer == o.Peer
		if a.kvRoom(it.Priority, decodeView(o, it.ExpectedTokens), need, a.mark(it.Req, o, !claimed)) && a.spare(it.Priority, it.Req.PromptTokens, o) {
			role := it.Role // the pool the accept counts in: a split request run whole counts whole
			if !o.Split && role == RolePrefill {
				role = ""
			}
			return Decision{Action: Accept, Layer: LayerSLO, Code: CodeAccepted, Tenant: it.Tenant, Option: i,
				KVBlocks: need, MaxTokens: it.MaxTokens, ExpectedTokens: it.ExpectedTokens, Role: role, Split: o.Split}
		}
	}
	if !anyFeasible && len(options) > 0 {
		d := refuse(statusTooManyRequests, LayerSLO, CodeSLOUnattainable, "",
			"waited %v; no candidate can still meet the TTFT target of %v", waited.Round(time.Millisecond), ttftSLO)
		d.Tenant, d.MaxTokens, d.ExpectedTokens, d.Role = it.Tenant, it.MaxTokens, it.ExpectedTokens, it.Role
		d.RetryAfter = time.Duration(a.conf().Queue.MinRetryAfter)
		return d
	}
	return Decision{Action: Queue, Layer: LayerKV, Code: CodeWaitKV, Tenant: it.Tenant, Option: -1,
		MaxTokens: it.MaxTokens, ExpectedTokens: it.ExpectedTokens, Role: it.Role}
}

// Claim is the KV room a waiting-room head that cannot run yet waits for: its blocks on the
// candidate where it will fit first. Work queued behind it may run beside it only on what is
// left (WaitingRoom.Next), so backfill never delays the head's start.
type Claim struct {
	Peer   string
	Blocks int
	// Publish: the mesh is to keep off this room too (node/claims.go), and the head starts
	// there at the admission mark (Ready). Only a head on its default TTFT target, not
	// sheddable, waiting on a whole candidate and larger than the hysteresis gap claims so. A
	// request on the default target is promised service whatever its size (it is refused
	// only for the queue ahead of it); one whose client set the target asked to be refused
	// when late, and a room held for it under overload, when it is mostly refused anyway,
	// cost the others 3-5% of goodput. Sheddable work runs on spare capacity only. A pair's
	// room is the decode node's forecast. A head smaller than the gap (KV.QueueOn −
	// KV.QueueOff of the pool) gets room as the engine's running requests end, while a larger
	// one needs the pool to drain below queue_off less its size, which under load the other
	// ingresses' requests never leave time for.
	Publish bool
}

// ClaimFor returns the room the queued head waits for: its KV need on the option with the most
// free blocks among those that can still meet its SLO, or among all when none can (a step of
// an agent is decided again without its SLO); never a Fallback option. No options: the zero Claim, which claims nothing.
func (a *Admitter) ClaimFor(now time.Time, head *Item, options []Option) Claim {
	ttftSLO, tpotSLO := a.SLOFor(head.Req)
	waited := now.Sub(head.Req.SLOClock())
	best, bestFeasible := -1, false
	for i, o := range options {
		if o.Fallback {
			continue
		}
		_, feas := feasible(o, 0, waited, ttftSLO, tpotSLO)
		if best < 0 || (feas && !bestFeasible) || (feas == bestFeasible && o.FreeKVBlocks > options[best].FreeKVBlocks) {
			best, bestFeasible = i, feas
		}
	}
	if best < 0 {
		return Claim{}
	}
	o := options[best]
	c := Claim{Peer: o.Peer, Blocks: a.blocks(head.Req, head.ExpectedTokens, o)}
	kv := a.conf().KV
	gap := (kv.QueueOn - kv.QueueOff) * float64(o.TotalKVBlocks)
	c.Publish = c.Peer != "" && head.Req.TTFTSLO == 0 && head.Priority >= 0 && !o.Split && o.TotalKVBlocks > 0 &&
		float64(c.Blocks) > gap
	return c
}

// Take takes h's blocks off the free KV of its peer in options (down to below zero: while the
// head does not fit there, nothing behind it may start there).
func (h Claim) Take(options []Option) {
	for i := range options {
		if options[i].Peer == h.Peer {
			options[i].FreeKVBlocks -= h.Blocks
		}
	}
}
