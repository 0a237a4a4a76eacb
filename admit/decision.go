package admit

import (
	"fmt"
	"time"
)

// refuse builds the refusal of layer with an HTTP status and a stable code; param names the
// offending request field, if any.
func refuse(status int, layer, code, param, format string, args ...any) Decision {
	return Decision{Action: Refuse, Status: status, Layer: layer, Code: code, Param: param,
		Message: fmt.Sprintf(format, args...), Option: -1}
}

// Evicted is the refusal for a waiter evicted by a higher-priority newcomer, or by one of a
// tenant holding less of its band (WaitingRoom.Push).
func (a *Admitter) Evicted(now time.Time) Decision {
	d := refuse(statusTooManyRequests, LayerPriority, CodeQueueFull, "", "%s", evictedMessage)
	d.RetryAfter = a.room.RetryAfter(now)
	return d
}

// Expired is the refusal for a waiter past its queue TTL.
func (a *Admitter) Expired(now time.Time) Decision {
	d := refuse(statusTooManyRequests, LayerQueue, CodeQueueTTLExpired, "", "the request waited its whole queue TTL")
	d.RetryAfter = a.room.RetryAfter(now)
	return d
}

// pass is one run of layers 4 to 7 over a request's options (Admitter.admit): the request as
// the layers see it (OwnTTFT filled), what layer 3 admitted, and what each layer found for the
// next. A pass is used once, by one goroutine; it is a value on admit's stack, so one decision
// allocates only its per-option table.
type pass struct {
	a       *Admitter
	now     time.Time
	req     Request
	options []Option
	useRoom bool // false: the owner's re-check, which leaves the waiting room out
	// maxTokens and expected are layer 3's MaxTokens and ExpectedTokens.
	maxTokens, expected int

	prefill int    // the prompt less the longest prefix any option holds
	pool    string // the room pool the request counts in (splitPool)

	ttftSLO, tpotSLO time.Duration // SLOFor(req)
	waited           time.Duration // since req's SLO clock started

	// Layer 4: per option, the free KV blocks its room is judged on and the blocks the request
	// needs there; fit is the first option with room at the admission mark, or -1.
	kv  []optionKV
	fit int
	// Layers 5 and 6: the prefill tokens the room would serve before the request, and why it
	// must wait ("": it need not).
	aheadTokens int
	wait        string
	// Layer 7: the option chosen to run it, or -1.
	chosen int
}

// start fills in what a pass built with a, now, req, options, useRoom, maxTokens and expected
// derives from them before layer 4: the prefill, OwnTTFT when req has none, the pool, the
// SLOs and the time waited; nothing is found or chosen yet.
func (p *pass) start() {
	p.fit, p.chosen = -1, -1
	p.prefill = prefillTokens(p.req.PromptTokens, p.options)
	if p.req.OwnTTFT == 0 {
		p.req.OwnTTFT = ownTTFT(p.prefill, p.options)
	}
	p.pool = splitPool(p.req, p.options)
	p.ttftSLO, p.tpotSLO = p.a.SLOFor(p.req)
	p.waited = p.now.Sub(p.req.SLOClock())
}

// noCapacity is the refusal of a request with no candidate to run it (503 no_capacity).
func noCapacity(req Request, b Decision) Decision {
	r := refuse(statusServiceUnavailable, LayerRoute, CodeNoCapacity, "", "no node can serve model %q", clip(req.Model))
	r.Tenant, r.MaxTokens, r.ExpectedTokens = req.Tenant, b.MaxTokens, b.ExpectedTokens
	return r
}

// decide is the last step of a pass that no layer ended: Accept on the option layer 7 chose,
// else Queue, naming why the request waits (KV room, or the work of equal or higher rank
// already waiting).
func (p *pass) decide() Decision {
	if p.chosen >= 0 {
		return Decision{Action: Accept, Layer: LayerSLO, Code: CodeAccepted, Option: p.chosen, KVBlocks: p.kv[p.chosen].need}
	}
	code := p.wait
	if code == "" {
		code = CodeWaitKV // the options with room miss the SLO; the others may free up
	}
	layer := LayerKV
	if code == CodeWaitBehind {
		layer = LayerPriority
	}
	return Decision{Action: Queue, Layer: layer, Code: code, Option: -1}
}

// finish fills in what every verdict of a pass carries: the tenant, layer 3's MaxTokens and
// ExpectedTokens, the prefill tokens and OwnTTFT, the pool it counted in (the request's own
// role when accepted on a whole option), whether the chosen option is a pair, and for a 429
// without one the room's Retry-After.
func (p *pass) finish(r Decision) Decision {
	r.Tenant, r.MaxTokens, r.ExpectedTokens, r.PrefillTokens = p.req.Tenant, p.maxTokens, p.expected, p.prefill
	r.OwnTTFT, r.Role = p.req.OwnTTFT, p.pool
	if r.Option >= 0 {
		r.Split = p.options[r.Option].Split
		if !r.Split {
			r.Role = p.req.Role // accepted whole: a split request's fallback leaves the prefill pool
		}
	}
	if r.Refused() && r.Status == statusTooManyRequests && r.RetryAfter == 0 {
		r.RetryAfter = p.a.room.RetryAfter(p.now)
	}
	return r
}
