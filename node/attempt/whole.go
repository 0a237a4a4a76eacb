package attempt

// Whole plans one dispatch of a decision: Cands from First on, at most Attempts of them.
type Whole struct {
	Cands    []Cand
	First    int       // the decision's choice
	Attempts int       // the most attempts of a dispatch, and of failures over the request
	F        *Failures // the request's failures, over all its dispatches

	i            int  // the candidate of the attempt under way
	failedBefore int  // F.N when the dispatch began
	refused      bool // an owner refused
}

// Start is the dispatch's first step.
func (d *Whole) Start() Step {
	d.i, d.failedBefore, d.refused = d.First, d.F.N, false
	return d.try()
}

// try is the step for candidate d.i, or the dispatch's end when no candidate is left.
func (d *Whole) try() Step {
	if d.i >= len(d.Cands) || d.i-d.First >= d.Attempts {
		if !d.refused && d.F.N > d.failedBefore {
			return Step{Kind: Fail, Code: d.F.Code} // no owner refused: waiting for room would not help
		}
		return Step{Kind: Requeue}
	}
	c := d.Cands[d.i]
	s := Step{Kind: Forward, Cand: d.i, Rerun: d.F.Retrying, Budget: d.F.Retrying && !c.Self, Reserve: d.i > d.First}
	switch {
	case c.Pair:
		s.Kind = RunPair
	case c.Self:
		s.Kind = RunLocal
	}
	return s
}

// Next is the step after the last one ended with r.
func (d *Whole) Next(r Result) Step {
	c := d.Cands[d.i]
	switch r.Outcome {
	case Ran:
		// An owner whose engine gave no first token in time is no home for the agent; a pair's
		// decode node was stuck to by its own plan.
		return Step{Kind: Answered, Cand: d.i, Stick: !c.Pair && (c.Self || !r.Late)}
	case Broke:
		// The candidate's engine died mid-response: the request moves on as a continuation
		// (Move decides whether it may), and a node whose engine died is no home.
		return Step{Kind: Migrate, Cand: d.i}
	case BudgetSpent:
		return Step{Kind: Fail, Cand: d.i, Code: d.F.Code}
	case ClientGone:
		return Step{Kind: Gone, Cand: d.i}
	case Paused:
		if !c.Self && r.Code == "" {
			d.F.Retrying = false // a peer's refusal: an answer, not a failure
		}
		return Step{Kind: Requeue, Cand: d.i}
	case Refused:
		d.refused, d.F.Retrying = true, false
	case Failed:
		if d.F.Add(r.Code, c.Name); d.F.N >= d.Attempts {
			return Step{Kind: Fail, Cand: d.i, Code: d.F.Code}
		}
	}
	d.i++
	return d.try()
}
