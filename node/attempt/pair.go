package attempt

import (
	"slices"
	"time"
)

// Prefill plans the prefill half of a split request: Cands[0], the pair's prefill node, then
// the others (the search's prefill candidates; the pair's own is not tried twice), at most
// Attempts tries.
type Prefill struct {
	Cands    []Cand
	Attempts int

	i        int
	tries    int
	failCode string // the last failure's code, once an attempt failed
}

// Start is the prefill's first step: the pair's prefill node.
func (p *Prefill) Start() Step {
	p.i, p.tries, p.failCode = 0, 0, ""
	return Step{Kind: RunPrefill}
}

// Tries is how many prefill attempts ran.
func (p *Prefill) Tries() int { return p.tries }

// Next is the step after the last one ended with r.
func (p *Prefill) Next(r Result) Step {
	switch r.Outcome {
	case Ran:
		return Step{Kind: Answered, Cand: p.i}
	case ClientGone:
		return Step{Kind: Gone, Cand: p.i}
	case HandedOver:
		p.tries++
		return Step{Kind: Handed, Cand: p.i}
	case Failed:
		p.tries++
		p.failCode = r.Code
	case Refused:
		p.tries++
	}
	for p.i++; p.i < len(p.Cands) && p.tries < p.Attempts; p.i++ {
		c := p.Cands[p.i]
		if c.Name == p.Cands[0].Name {
			continue
		}
		// After a failure, a peer is tried only as the retry budget allows (else skipped).
		return Step{Kind: RunPrefill, Cand: p.i, Rerun: p.tries > 0, Budget: p.failCode != "" && !c.Self}
	}
	if p.failCode != "" {
		return Step{Kind: Fail, Code: p.failCode}
	}
	return Step{Kind: Requeue} // every prefill node refused: the request waits for room
}

// Decode plans the decode half of a split request whose prompt from prefilled.
type Decode struct {
	Cands    []Cand
	Deadline time.Time     // the last moment the handover may wait for decode room
	Retry    time.Duration // how often a waiting handover is offered again

	i         int
	pass      int
	tries     int
	failCode  string
	reason    string
	wrongRole []string // decode nodes that can never take this handover
}

// NewDecode plans the decode of a handover from: the pair's decode node, then the search's,
// at most attempts of them, none of them from itself.
func NewDecode(pair Cand, search []Cand, from string, attempts int, deadline time.Time, retry time.Duration) *Decode {
	d := &Decode{Deadline: deadline, Retry: retry}
	if pair.Name != from {
		d.Cands = append(d.Cands, pair)
	}
	for _, c := range search {
		if len(d.Cands) < attempts && c.Name != pair.Name && c.Name != from {
			d.Cands = append(d.Cands, c)
		}
	}
	return d
}

// Start is the decode's first step at now.
func (d *Decode) Start(now time.Time) Step { return d.next(now) }

// Tries is how many decode attempts ran; Reason the last reason a decode node gave.
func (d *Decode) Tries() int { return d.tries }

// Reason is the last reason an owner gave for not running the request.
func (d *Decode) Reason() string { return d.reason }

// FailCode is the last failure's code ("" if no attempt failed).
func (d *Decode) FailCode() string { return d.failCode }

// Widen adds the decode nodes the executor found for a Widen step.
func (d *Decode) Widen(more []Cand) { d.Cands = append(d.Cands, more...) }

// Next is the step after the last one ended with r.
func (d *Decode) Next(r Result) Step {
	switch r.Outcome {
	case Ran:
		d.tries++
		return Step{Kind: Answered, Cand: d.i, Stick: !r.Late}
	case ClientGone:
		return Step{Kind: Gone, Cand: d.i}
	case Broke:
		// The candidate's engine died mid-response: the request moves on as a continuation,
		// as a whole one does (Whole), and the handover is spent.
		d.tries++
		return Step{Kind: Migrate, Cand: d.i}
	case Refused, Failed:
		d.tries++
		if r.Outcome == Failed {
			d.failCode = r.Code
		}
		if d.reason = r.Reason; r.Reason == CodeWrongRole {
			d.wrongRole = append(d.wrongRole, d.Cands[d.i].Name) // waiting for room will not help
		}
		d.i++
		return d.next(r.Now)
	case Widened:
		return d.wait()
	case Waited:
		d.pass, d.i = d.pass+1, 0
		return d.next(r.Now)
	}
	return d.end()
}

// next is the step after an attempt: the next decode candidate of the pass, else the end of
// the pass.
func (d *Decode) next(now time.Time) Step {
	if d.i < len(d.Cands) && (d.failCode == "" || d.pass == 0) {
		return Step{Kind: RunDecode, Cand: d.i, Rerun: d.tries > 0}
	}
	// Every decode node refusing is a room that changed while the prompt prefilled: the
	// prefill is done, so the handover waits for decode room, until the deadline.
	if d.failCode != "" || !now.Add(d.Retry).Before(d.Deadline) {
		return d.end()
	}
	if d.pass == 0 {
		return Step{Kind: Widen}
	}
	return d.wait()
}

// wait is the wait for decode room between two passes, when a decode node is left to ask.
func (d *Decode) wait() Step {
	d.Cands = slices.DeleteFunc(d.Cands, func(c Cand) bool { return slices.Contains(d.wrongRole, c.Name) })
	if len(d.Cands) == 0 {
		if len(d.wrongRole) > 0 {
			d.failCode = CodeWrongRole // every node that could decode runs another role or engine
		}
		return d.end()
	}
	return Step{Kind: WaitDecodeRoom, Wait: d.Retry}
}

func (d *Decode) end() Step {
	if d.failCode != "" {
		return Step{Kind: Fail, Code: CodeDecodeFailed}
	}
	return Step{Kind: Fail, Code: CodeDecodeUnavailable}
}
