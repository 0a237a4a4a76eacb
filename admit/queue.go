package admit

// queueLayer is layers 5 and 6 for a request that has to wait: because no option has KV room
// (wait_kv; wait_decode for a split request, refused 429 decode_full now when its decode room
// cannot come within its TTFT target), or because work of equal or higher rank already waits
// for the same (model, role) (wait_behind). Such a request is refused 429 queue_full when the
// room would not take it: shed (layer 6) for a sheddable request while the pool is busy, or at
// the pool's caps (layer 5). It also prices the work the room would serve first (aheadTokens)
// for layer 7. The owner's re-check (useRoom false) neither consults nor fills the room.
func (p *pass) queueLayer() (Decision, bool) {
	req, room := p.req, p.a.room
	aheadN := 0
	if p.useRoom {
		aheadN, p.aheadTokens = room.ahead(req.PoolModel(), p.pool, req.Tenant, req.Priority, p.a.deadline(req))
	}
	switch {
	case p.fit < 0 && onlyPairs(p.options):
		if r, full := p.a.decodeFull(p.options[0], p.kv[0].need, p.expected, p.waited, p.ttftSLO); full {
			return r, true
		}
		p.wait = CodeWaitDecode
	case p.fit < 0:
		p.wait = CodeWaitKV
	case aheadN > 0:
		p.wait = CodeWaitBehind
	}
	if p.wait == "" || !p.useRoom {
		return Decision{}, false
	}
	ok, shed := room.canQueue(req.PoolModel(), p.pool, req.Tenant, req.Priority, p.prefill)
	switch {
	case shed:
		return refuse(statusTooManyRequests, LayerPriority, CodeQueueFull, "", "%s", shedMessage), true
	case !ok:
		n, t := room.Waiting(req.PoolModel(), p.pool)
		return refuse(statusTooManyRequests, LayerQueue, CodeQueueFull, "",
			"%d requests and %d prefill tokens are already waiting for this model", n, t), true
	}
	return Decision{}, false
}
