package admit

// blocks is the KV the request holds on o while it runs: its whole prompt plus expected output,
// in blocks. A cached prefix saves prefill, not room: free KV counts cached blocks no running
// request holds (they are evictable), and running the request takes them out of that pool. Only
// a prefix another running request already holds would be shared, and no state tells which.
// The prefill half, checked by its owner, holds the prompt only: the output is decoded elsewhere.
func (a *Admitter) blocks(req Request, expected int, o Option) int {
	if req.Role == RolePrefill && !o.Split {
		expected = 0
	}
	bt := o.BlockTokens
	if bt <= 0 {
		m, _ := a.model(req.Model)
		bt = m.BlockTokens
	}
	if bt <= 0 {
		bt = 16
	}
	t := max(req.PromptTokens, 0) + expected
	return (t + bt - 1) / bt
}

// fits reports whether need blocks fit on o with KV use after them ≤ thr of its total.
func fits(o Option, need int, thr float64) bool {
	free := o.FreeKVBlocks - need
	if free < 0 {
		return false
	}
	if o.TotalKVBlocks <= 0 {
		return true
	}
	return float64(o.TotalKVBlocks-free) <= thr*float64(o.TotalKVBlocks)
}

// kvRoom reports whether need blocks fit on o for a request of priority, at the mark of its
// stage (KV.QueueOn to accept, KV.QueueOff to dispatch from the room). Sheddable work stops
// lower, at KV.Sheddable: batch decodes hold their blocks for seconds, and a burst of
// interactive requests must find room. A sheddable request larger than that share on its own
// starts only where under a tenth of the pool is in use, so a long prompt is not held forever.
func (a *Admitter) kvRoom(priority int, o Option, need int, mark float64) bool {
	if o.TotalKVBlocks <= 0 {
		return fits(o, need, mark)
	}
	own := mark
	if priority < 0 {
		own = min(mark, a.conf().KV.Sheddable)
	}
	if fits(o, need, own) {
		return true
	}
	// Larger than its share on its own: it starts where next to nothing else runs, at the
	// stage's mark if it fits under it, else wherever it fits at all. A request is refused or
	// held for contention, never for its size alone.
	total := float64(o.TotalKVBlocks)
	if float64(need) <= own*total || float64(o.TotalKVBlocks-o.FreeKVBlocks) > total/10 {
		return false
	}
	return fits(o, need, mark) || (float64(need) > mark*total && need <= o.FreeKVBlocks)
}

// onlyPairs reports whether every option is a pair: no whole candidate is left to fall back on.
func onlyPairs(options []Option) bool {
	for _, o := range options {
		if !o.Split {
			return false
		}
	}
	return len(options) > 0
}

// kvLayer is layer 4: the request's KV blocks against each option's free blocks (a pair's
// decode node judged on its forecast for when the handover arrives). It refuses 400 kv_budget
// a request that fits on no option even when empty; otherwise it records each option's need
// and the first option with room at the admission mark (fit, -1 for none) and hands on.
func (p *pass) kvLayer() (Decision, bool) {
	n, expected := len(p.options), p.expected
	p.kv = make([]optionKV, n)
	neverFit := true
	for i, o := range p.options {
		p.kv[i] = optionKV{free: decodeView(o, expected).FreeKVBlocks, need: p.a.blocks(p.req, expected, o)}
		if o.TotalKVBlocks <= 0 || p.kv[i].need <= o.TotalKVBlocks {
			neverFit = false
		}
		if p.fit < 0 && !o.Fallback && p.roomOn(i) {
			p.fit = i
		}
	}
	if neverFit {
		return refuse(statusBadRequest, LayerKV, CodeKVBudget, "max_tokens",
			"the request needs %d KV blocks, more than any candidate holds; lower max_tokens", p.kv[0].need), true
	}
	return Decision{}, false
}

// roomOn reports whether option i has KV room for the request at the admission mark.
func (p *pass) roomOn(i int) bool {
	o := p.options[i]
	view := o
	view.FreeKVBlocks = p.kv[i].free
	return p.a.kvRoom(p.req.Priority, view, p.kv[i].need, p.a.mark(p.req, o, false))
}

// optionKV is layer 4's finding on one option: the free blocks its KV room is judged on (a
// pair's the decode node's forecast, decodeView) and the request's blocks there.
type optionKV struct {
	free, need int
}
