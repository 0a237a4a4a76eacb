package admit

import "time"

// Class names a priority's class: "high" (> 0), "normal" (0), "low" (< 0, sheddable). The
// three values are the bounded "class" label of goodput metrics.
func Class(priority int) string {
	switch {
	case priority > 0:
		return "high"
	case priority < 0:
		return "low"
	default:
		return "normal"
	}
}

// SLOFor returns the TTFT and TPOT targets of req: its own (the client's hard targets), else
// its class default, the TTFT one plus the request's own prefill time (Request.OwnTTFT).
func (a *Admitter) SLOFor(req Request) (ttft, tpot time.Duration) {
	c := a.conf().SLO.Normal
	switch Class(req.Priority) {
	case "high":
		c = a.conf().SLO.High
	case "low":
		c = a.conf().SLO.Low
	}
	ttft, tpot = req.TTFTSLO, req.TPOTSLO
	if ttft == 0 {
		ttft = time.Duration(c.TTFT) + max(req.OwnTTFT, 0)
	}
	if tpot == 0 {
		tpot = time.Duration(c.TPOT)
	}
	return ttft, tpot
}

// TTL is req's queue TTL: Queue.TTL, which req.QueueTTL (X-Kvmesh-Queue-TTL) may only shorten.
// It bounds the request's wait for its first token, in the waiting room and an engine's queue.
func (a *Admitter) TTL(req Request) time.Duration {
	ttl := time.Duration(a.conf().Queue.TTL)
	if req.QueueTTL > 0 && req.QueueTTL < ttl {
		ttl = req.QueueTTL // the header may only shorten it
	}
	return ttl
}

// deadline is req's place in the room's earliest-deadline-first order: its SLO clock plus its
// TTFT target, or its arrival plus its TTL when it has no TTFT target.
func (a *Admitter) deadline(req Request) time.Time {
	ttft, _ := a.SLOFor(req)
	if ttft == 0 {
		return req.Arrived.Add(a.TTL(req))
	}
	return req.SLOClock().Add(ttft)
}

// feasible reports whether o can meet the SLOs given time waited and the wait for the room's
// queue ahead.
func feasible(o Option, ahead, waited, ttftSLO, tpotSLO time.Duration) (time.Duration, bool) {
	ttft := o.PredictedTTFT + max(waited, 0) + ahead

	if ttftSLO > 0 && ttft > ttftSLO {
		return ttft, false
	}
	if tpotSLO > 0 && o.PredictedTPOT > tpotSLO {
		return ttft, false
	}
	return ttft, true
}

// spare reports whether a request of priority with prompt tokens may start on o now.
// Sheddable work runs only on spare capacity: where a normal request arriving just behind it
// would still meet its TTFT SLO with half of it to spare, i.e. the prefill queued ahead of it
// plus its own within half of slo.normal.ttft. Otherwise its own loose SLO would let it fill
// the engine's first-come-first-served prefill queue up to the point where normal traffic
// misses its SLO (docs/design/admission.md); it waits in the room instead, behind every higher
// band. A prompt whose own prefill alone takes longer than that starts only on
// an engine with next to nothing queued ahead of it (under a tenth of the normal TTFT), so a
// long prompt is not held forever; normal traffic routes around that engine meanwhile.
func (a *Admitter) spare(priority, prompt int, o Option) bool {
	normal := time.Duration(a.conf().SLO.Normal.TTFT)
	if priority >= 0 || normal <= 0 {
		return true
	}
	ahead := o.PredictedTTFT
	if o.PrefillTokensPerSecond > 0 {
		own := float64(max(prompt-o.CachedTokens, 0)) / o.PrefillTokensPerSecond
		ahead -= time.Duration(own * float64(time.Second))
	}
	return o.PredictedTTFT <= normal/2 || ahead <= normal/10
}

// prefillTokens is the prompt less the longest prefix any option holds.
func prefillTokens(prompt int, options []Option) int {
	cached := 0
	for _, o := range options {
		cached = max(cached, o.CachedTokens)
	}
	return max(prompt-cached, 0)
}

// ownTTFT is how long prefill tokens take at the mean prefill rate of the options that report
// one (0 when none does): the part of a request's default TTFT target its own size earns.
func ownTTFT(prefill int, options []Option) time.Duration {
	rate, n := 0.0, 0
	for _, o := range options {
		if o.PrefillTokensPerSecond > 0 {
			rate += o.PrefillTokensPerSecond
			n++
		}
	}
	if prefill <= 0 || n == 0 {
		return 0
	}
	return time.Duration(float64(prefill) / (rate / float64(n)) * float64(time.Second))
}

// aheadWait is how long tokens of prefill queued in the room take at the candidates'
// combined prefill rate (0 when no candidate reports one).
func aheadWait(tokens int, options []Option) time.Duration {
	rate := 0.0
	for _, o := range options {
		rate += max(o.PrefillTokensPerSecond, 0)
	}
	if tokens <= 0 || rate <= 0 {
		return 0
	}
	return time.Duration(float64(tokens) / rate * float64(time.Second))
}

// sloLayer is layer 7: predicted TTFT (the option's estimate, the time already waited and the
// prefill the room serves first, priced at the options' combined prefill rate since the room
// drains into all of them) and TPOT against the request's SLOs. It refuses 429
// slo_unattainable when no option can meet them; otherwise it chooses the first option that
// meets them, has KV room at the admission mark and spare capacity for a sheddable request,
// unless an earlier layer made the request wait. Fallback options are neither.
func (p *pass) sloLayer() (Decision, bool) {
	ahead := aheadWait(p.aheadTokens, p.options)
	best, anyFeasible := time.Duration(-1), false
	for i, o := range p.options {
		if o.Fallback {
			continue
		}
		ttft, ok := feasible(o, ahead, p.waited, p.ttftSLO, p.tpotSLO)
		if best < 0 || ttft < best {
			best = ttft
		}
		if !ok {
			continue
		}
		anyFeasible = true
		if p.chosen < 0 && p.wait == "" && p.roomOn(i) && p.a.spare(p.req.Priority, p.req.PromptTokens, o) {
			p.chosen = i
		}
	}
	if !anyFeasible {
		return refuse(statusTooManyRequests, LayerSLO, CodeSLOUnattainable, "",
			"no candidate can meet the TTFT target of %v (best predicted %v) or the TPOT target of %v",
			p.ttftSLO, best.Round(time.Millisecond), p.tpotSLO), true
	}
	return Decision{}, false
}
