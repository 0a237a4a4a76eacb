package route

import (
	"cmp"
	"math"
	"slices"
	"time"

	"github.com/kvmesh/kvmesh/kvindex"
)

// Disaggregated prefill and decode (docs/design/disaggregation.md): a request runs whole on a
// mixed peer, or is split on a pair, its prompt's KV computed on a prefill peer p and handed
// over to a decode peer d, which generates. This file holds the pair's two searches and the
// rule that chooses between the best whole candidate and the best pair; the node runs the
// flow (node/pair.go).

// Peer roles, the values of Peer.Role (gossip's state record, node.role).
const (
	// RoleMixed (or "") runs whole requests, and either half of a split one.
	RoleMixed = "mixed"
	// RolePrefill runs the prefill half only: it answers with a handover, never with text.
	RolePrefill = "prefill"
	// RoleDecode runs the decode half, from a handover; with Config.DecodeLocalPrefill (its
	// own, Peer.HalvesOnly when off), also a whole request the split rule sends it (Decide).
	RoleDecode = "decode"
)

// IsMixed reports whether role is the mixed role ("" or "mixed").
func IsMixed(role string) bool { return role == "" || role == RoleMixed }

// RolesAllow reports whether roles (Config.Roles) let a peer of role run a whole request:
// roles is empty or names it, "" and "mixed" naming the same default role.
func RolesAllow(roles []string, role string) bool {
	return len(roles) == 0 || slices.ContainsFunc(roles, func(r string) bool { return r == role || IsMixed(r) && IsMixed(role) })
}

// IsHalf reports whether role runs only one half of a request (prefill or decode): such a
// peer is never among routing's whole candidates (a decode peer may still run a request
// whole when the split rule says so: PairSearch.Local).
func IsHalf(role string) bool { return role == RolePrefill || role == RoleDecode }

// Why Decide chose as it did.
const (
	SplitNoMixed   = "no_mixed"      // split: no mixed candidate, the pair it is
	SplitFaster    = "faster"        // split: the pair is faster, or the mixed node misses its TPOT
	WholeNoPair    = "no_pair"       // whole: no prefill/decode pair
	WholeShort     = "short"         // whole: the uncached prompt fits one step's chunk
	WholeLink      = "link"          // whole: the transfer costs over half the prefill it moves
	WholeMixedFast = "mixed_as_fast" // whole: a mixed node is as fast and keeps its TPOT

	// Whole on a decode peer (SplitInput.Local, Config.DecodeLocalPrefill): RunsLocal.
	WholeDecodeShort   = "decode_short"   // its uncached prompt there fits one step's chunk
	WholePrefillBehind = "prefill_behind" // the pair misses the TTFT target the decode peer meets, or there is no pair
)

// RunsLocal reports whether why, Decide's reason, runs the request whole on the decode peer
// SplitInput.Local.
func RunsLocal(why string) bool { return why == WholeDecodeShort || why == WholePrefillBehind }

// Pair is the best prefill and decode candidates for a request, with the pair's predictions.
type Pair struct {
	// Prefill and Decode are candidates of the two searches (Candidate.Peer indexes the
	// peers), distinct peers.
	Prefill, Decode Candidate
	// Transfer is T_xfer, the prompt's KV over the link; TTFT is TTFT_pair, the prefill on p,
	// the hop, the transfer and d's step; TPOT is d's predicted TPOT.
	Transfer, TTFT, TPOT time.Duration
}

// SplitInput is what the split rule weighs: the best whole candidate (nil: none), the best
// decode peer to run the request whole (Local, PairSearch.Local's first; nil: none) and the
// best pair (nil: none), for a request of PromptTokens, and the request's TTFT and TPOT SLOs
// (0: none).
type SplitInput struct {
	Whole            *Candidate
	Local            *Candidate
	Pair             *Pair
	PromptTokens     int
	TTFTSLO, TPOTSLO time.Duration
}

// Decide is the split rule of docs/design/disaggregation.md ("When to split"): without a pair
// the request runs whole (on the decode peer Local when there is no mixed candidate:
// WholePrefillBehind); else it runs whole on the mixed candidate when its uncached part there
// is under SplitMinTokens, when the transfer costs over half the prefill it moves, or when the
// mixed node's TTFT is no later than the pair's and its TPOT within the SLO; failing those,
// whole on the decode peer Local when its uncached part there is under SplitMinTokens, or when
// the prefill pool is behind (prefillBehind); and it is split otherwise. A mixed candidate
// that qualifies goes before a decode peer that does. It is pure.
func Decide(cfg *Config, in SplitInput) (split bool, why string) {
	m, l, pr := in.Whole, in.Local, in.Pair
	switch {
	case pr == nil && m == nil && l != nil:
		return false, WholePrefillBehind // no prefill peer can take it: the decode peer prefills
	case pr == nil:
		return false, WholeNoPair
	}
	prompt := max(in.PromptTokens, 0)
	if m != nil {
		if prompt-m.Terms.PrefixTokens < cfg.SplitMinTokens {
			return false, WholeShort
		}
		moved := max(prompt-pr.Prefill.Terms.PrefixTokens, 0)
		if pr.Transfer > prefillTime(cfg, moved, pr.Prefill.Terms.PrefillRate)/2 {
			return false, WholeLink
		}
		if m.PredictedTTFT <= pr.TTFT && (in.TPOTSLO <= 0 || m.PredictedTPOT <= in.TPOTSLO) {
			return false, WholeMixedFast
		}
	}
	if l != nil {
		if prompt-l.Terms.PrefixTokens < cfg.SplitMinTokens {
			return false, WholeDecodeShort
		}
		if prefillBehind(cfg, in) {
			return false, WholePrefillBehind
		}
	}
	if m == nil {
		return true, SplitNoMixed
	}
	return true, SplitFaster
}

// prefillBehind is the split rule's test of the prefill pool for the decode peer in.Local:
// with a TTFT target, the pair misses it and the decode peer meets it; without one, the pair's
// TTFT is later than the decode peer's by more than the pair's own prefill of the prompt (its
// queue costs more than the prefill the decode peer would run instead). Either way the decode
// peer's TPOT is within the SLO.
func prefillBehind(cfg *Config, in SplitInput) bool {
	l, pr := in.Local, in.Pair
	switch {
	case in.TPOTSLO > 0 && l.PredictedTPOT > in.TPOTSLO:
		return false
	case in.TTFTSLO > 0:
		return pr.TTFT > in.TTFTSLO && l.PredictedTTFT <= in.TTFTSLO
	}
	moved := max(in.PromptTokens-pr.Prefill.Terms.PrefixTokens, 0)
	return pr.TTFT-l.PredictedTTFT > prefillTime(cfg, moved, pr.Prefill.Terms.PrefillRate)
}

// TransferTime is how long a prompt of tokens takes to cross the link: tokens × KVBytesPerToken
// over LinkGBps.
func TransferTime(cfg *Config, tokens int) time.Duration {
	b := float64(max(tokens, 0)) * float64(cfg.KVBytesPerToken)
	return toDuration(b / (cfg.LinkGBps * 1e9))
}

func prefillTime(cfg *Config, tokens int, rate float64) time.Duration {
	if !(rate > 0) || math.IsInf(rate, 0) {
		rate = cfg.DefaultPrefillTokensPerSecond
	}
	return toDuration(float64(tokens) / rate)
}

// PairSearch is the two searches' result: the prefill candidates and the decode candidates,
// best first, and whether a peer of either role was dropped as busy (the request should wait
// for room rather than be refused when no pair is left). Local are the decode peers that could
// run the request whole (Config.DecodeLocalPrefill; empty when it is off), best first: the
// decode candidates of role decode, bar those whose own setting is off (Peer.HalvesOnly), that
// routing's filters for a whole candidate pass (filter, with Config.Roles; the busy test; the
// power cap and thermal limit among them, dropLimited), ordered by predicted TPOT within the
// SLO first, then by predicted TTFT.
type PairSearch struct {
	Prefill, Decode, Local []Candidate
	Busy                   bool
	full                   []Candidate // decode peers busy by KV alone (pairSearch)
}

// pairSearch runs the pair's two searches over peers with rv the reservations per peer and
// refused whether the peer's owner refused a request of req's priority lately. It is pure.
//
// Both searches run routing's filters for their half (filter), and the power cap and thermal
// limit among their survivors (dropLimited), as Route does for a whole request.
// Prefill among prefill and mixed peers: busy counting the
// uncached prompt's blocks only (a prefill node holds no output) and the queued prefill,
// scored 1.0·C/P − 0.5·L/(L+LoadHalfTokens) (the prefix and load weights), gated on the
// predicted prefill time as whole candidates are. Decode among decode and mixed peers: busy
// counting the whole prompt and max_tokens in blocks, and a free seat (running + reserved below
// MaxRunning); ordered by predicted TPOT within tpotSLO first, then by TPOT, by free KV after
// reservations, and by the smaller batch. Within each order a dedicated peer goes before a
// mixed one, all else equal. Local, with DecodeLocalPrefill: the decode peers among the decode
// candidates with a seat, not HalvesOnly, that routing's filters for a whole request pass.
func pairSearch(cfg *Config, req Request, peers []Peer, rv func(string) reserved, refused func(string) bool,
	tpotSLO time.Duration, out *PairSearch) {
	bt := req.BlockTokens
	if bt <= 0 {
		bt = kvindex.DefaultBlockTokens
	}
	need := cfg.ModelBytes[req.Model]
	vendors := cfg.ModelVendors[req.Model]
	out.Prefill, out.Decode, out.Busy = out.Prefill[:0], out.Decode[:0], false
	prompt := max(req.PromptTokens, 0)
	// A peer passes routing's filters for the half (filter), then the owner's refusals.
	eligible := func(p *Peer, pt part) bool {
		if _, ok := filter(cfg, pt, &req, p, need, vendors); !ok {
			return false
		}
		if refused(p.Name) {
			out.Busy = true
			return false
		}
		return true
	}
	var dropped FilterCounts // the power cap and the thermal limit (dropLimited), not counted: no whole candidate is dropped
	searchPrefill(cfg, req, bt, peers, rv, eligible, out, &dropped)
	// The decode half arrives after the best prefill, the hop and the transfer: a decode peer
	// is judged on its KV then, not now (decodeBusy).
	arrive := onDur(cfg.SplitHop) + TransferTime(cfg, prompt)
	if len(out.Prefill) > 0 {
		arrive += out.Prefill[0].PredictedTTFT
	}
	out.full, out.Local = out.full[:0], out.Local[:0]
	local := cfg.LocalPrefill()
	for i := range peers {
		p := &peers[i]
		if !eligible(p, partDecode) {
			continue
		}
		r := rv(p.Name)
		kv, seat := decodeBusy(cfg, req, bt, p, r, arrive)
		if kv || seat {
			out.Busy = true
		}
		if seat {
			continue
		}
		c := evaluate(cfg, req, bt, i, p, r)
		limit(cfg, &c, p)
		if local && p.Role == RoleDecode && !p.HalvesOnly && !busy(cfg, req, bt, p, r) {
			if _, ok := filter(cfg, partLocal, &req, p, need, vendors); ok {
				out.Local = append(out.Local, c) // evaluate's is the whole request's candidate
			}
		}
		c.Score = -c.PredictedTPOT.Seconds()
		if kv {
			out.full = append(out.full, c)
			continue
		}
		out.Decode = append(out.Decode, c)
	}
	out.Decode = dropLimited(out.Decode, &dropped)
	if len(out.Decode) == 0 {
		// Every decode peer is short of KV: they stay candidates, so that admission judges
		// their room at the half's arrival itself and refuses (decode_full) or queues
		// (wait_decode) the request saying so, before its prefill.
		out.Decode = append(out.Decode, dropLimited(out.full, &dropped)...)
	}
	slices.SortStableFunc(out.Decode, func(a, b Candidate) int {
		return cmp.Or(withinTPOT(tpotSLO, a, b), cmp.Compare(a.PredictedTPOT, b.PredictedTPOT), cmp.Compare(b.Terms.FreeKV, a.Terms.FreeKV),
			cmp.Compare(a.Terms.Batch, b.Terms.Batch), mixedLast(peers, a, b), cmp.Compare(a.Peer, b.Peer))
	})
	out.Local = dropLimited(out.Local, &dropped)
	slices.SortStableFunc(out.Local, func(a, b Candidate) int {
		return cmp.Or(withinTPOT(tpotSLO, a, b), cmp.Compare(a.PredictedTTFT, b.PredictedTTFT), cmp.Compare(a.Peer, b.Peer))
	})
}

// searchPrefill is pairSearch's prefill half: out.Prefill from the peers eligible for it, best
// first, and out.Busy set for a busy one; dropped counts the limited ones dropLimited drops.
func searchPrefill(cfg *Config, req Request, bt int, peers []Peer, rv func(string) reserved,
	eligible func(*Peer, part) bool, out *PairSearch, dropped *FilterCounts) {
	prompt := max(req.PromptTokens, 0)
	for i := range peers {
		p := &peers[i]
		if !eligible(p, partPrefill) {
			continue
		}
		r := rv(p.Name)
		if prefillBusy(cfg, req, bt, p, r) {
			out.Busy = true
			continue
		}
		c := evaluate(cfg, req, bt, i, p, r)
		limit(cfg, &c, p)
		t := &c.Terms
		c.Score = on(cfg.Weights.Prefix)*t.Prefix - on(cfg.Weights.Load)*t.Load
		// The prefill half's TTFT ends with the prompt's KV: no decode step.
		c.PredictedTTFT = prefillTime(cfg, QueuedAhead(p, req.Priority)+r.prefill+prompt-t.PrefixTokens, t.PrefillRate)
		out.Prefill = append(out.Prefill, c)
	}
	out.Prefill = dropLimited(out.Prefill, dropped)
	applyGate(cfg, out.Prefill)
	slices.SortStableFunc(out.Prefill, func(a, b Candidate) int {
		switch {
		case a.Gated != b.Gated:
			if a.Gated {
				return 1
			}
			return -1
		case a.Gated:
			return cmp.Or(cmp.Compare(a.PredictedTTFT, b.PredictedTTFT), cmp.Compare(a.Peer, b.Peer))
		}
		return cmp.Or(cmp.Compare(b.Score, a.Score), cmp.Compare(a.PredictedTTFT, b.PredictedTTFT),
			mixedLast(peers, a, b), cmp.Compare(a.Peer, b.Peer))
	})
}

// withinTPOT orders a candidate whose predicted TPOT is within slo (0: none) before one over it.
func withinTPOT(slo time.Duration, a, b Candidate) int {
	ao, bo := slo > 0 && a.PredictedTPOT > slo, slo > 0 && b.PredictedTPOT > slo
	switch {
	case ao == bo:
		return 0
	case ao:
		return 1
	}
	return -1
}

// mixedLast orders a dedicated prefill or decode peer before a mixed one, all else equal: a
// mixed node's time is better kept for whole requests, which only it can run.
func mixedLast(peers []Peer, a, b Candidate) int {
	am, bm := IsMixed(peers[a.Peer].Role), IsMixed(peers[b.Peer].Role)
	switch {
	case am == bm:
		return 0
	case am:
		return 1
	}
	return -1
}

// prefillBusy is busy for the prefill half: the uncached prompt's blocks only (no output),
// the engine's waiting queue and the queued prefill, at PrefillBusyQueuedPrefillTokens on a
// prefill node.
func prefillBusy(cfg *Config, req Request, bt int, p *Peer, rv reserved) bool {
	r := req
	r.MaxTokens = 0
	if p.Role == RolePrefill {
		return busyAt(cfg, r, bt, p, rv, cfg.PrefillBusyQueuedPrefillTokens)
	}
	return busy(cfg, r, bt, p, rv)
}

// decodeBusy is busy for the decode half: by KV, the whole prompt and the output in blocks
// (the prompt arrives as KV, cached there or not) against the KV the peer will use when the
// half arrives, after arrive (its used blocks draining over a residence of max_tokens steps,
// as admission forecasts them: admit.DecodeForecast); by seat, no free seat or a waiting
// queue.
func decodeBusy(cfg *Config, req Request, bt int, p *Peer, rv reserved, arrive time.Duration) (kv, seat bool) {
	if used := p.KVBlocksUsed + rv.blocks; p.KVBlocksTotal > 0 && used > 0 {
		need := (max(req.PromptTokens, 0) + max(req.MaxTokens, 0) + bt - 1) / bt
		if life := float64(max(req.MaxTokens, 1)) * p.DecodeStepSeconds; life > 0 {
			used = rv.blocks + int(float64(p.KVBlocksUsed)*(1-min(arrive.Seconds()/life, 1)))
		}
		kv = float64(used+need)/float64(p.KVBlocksTotal) > cfg.BusyKVUse
	}
	seat = p.MaxRunning > 0 && max(p.Running, 0)+rv.requests >= p.MaxRunning ||
		cfg.BusyWaiting > 0 && p.Waiting >= cfg.BusyWaiting
	return kv, seat
}

// BestPair is the first prefill candidate with a decode candidate on another peer, and that
// decode candidate (the first such), with the pair's predictions; nil when there is none.
func BestPair(cfg *Config, req Request, s *PairSearch) *Pair {
	for _, p := range s.Prefill {
		for _, d := range s.Decode {
			if d.Peer != p.Peer {
				return PairOf(cfg, req, p, d)
			}
		}
	}
	return nil
}

// PairOf predicts the pair (p, d) for req: TTFT_pair = p's prefill time + SplitHop + what is
// left then of the prefill queued ahead of the request on d + the transfer + d's decode step.
// An engine takes a handover from its waiting queue as it does a request, behind the prefill
// it runs and the requests of the handover's priority or higher waiting before it (a decode
// node's local prefills, a mixed node's own), and that queue drains while p prefills.
func PairOf(cfg *Config, req Request, p, d Candidate) *Pair {
	pr := &Pair{Prefill: p, Decode: d, Transfer: TransferTime(cfg, req.PromptTokens), TPOT: d.PredictedTPOT}
	ready := p.PredictedTTFT + onDur(cfg.SplitHop)
	var behind time.Duration
	if rate := d.Terms.PrefillRate; rate > 0 {
		behind = max(toDuration(float64(d.Terms.LoadTokens)/rate)-ready, 0)
	}
	pr.TTFT = ready + behind + pr.Transfer + d.Terms.Step
	return pr
}

// Pair implements Policy: the pair's two searches over peers, with this node's reservations
// and the refusals its peers' owners gave lately.
func (r *Router) Pair(now time.Time, req Request, peers []Peer, tpotSLO time.Duration, out *PairSearch) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pairSearch(r.conf(), req, peers, func(peer string) reserved { return r.reservedLocked(now, peer) },
		func(peer string) bool { return r.refusedLocked(now, peer, req.Priority) }, tpotSLO, out)
}

// Pair implements Policy: the kvmesh searches, without reservations or refusals (a baseline
// keeps neither), so that a comparison policy routes a disaggregated mesh too.
func (b *baseline) Pair(_ time.Time, req Request, peers []Peer, tpotSLO time.Duration, out *PairSearch) {
	pairSearch(b.conf(), req, peers, func(string) reserved { return reserved{} }, func(string) bool { return false }, tpotSLO, out)
}

// Candidate is the pair as one candidate of a request's list (Candidate.Pair).
func (pr *Pair) Candidate() Candidate {
	c := pr.Prefill
	c.PredictedTTFT, c.PredictedTPOT, c.Pair, c.Gated, c.Sticky = pr.TTFT, pr.TPOT, pr, false, false
	return c
}

// Disaggregated reports whether some peer of peers runs one half only: only then is a pair
// searched for, so a mesh of mixed nodes pays nothing for it.
func Disaggregated(peers []Peer) bool {
	for i := range peers {
		if IsHalf(peers[i].Role) {
			return true
		}
	}
	return false
}

// Choose weighs the best whole candidate (whole[0]; none when whole is empty) and the best
// decode peer to run the request whole (s.Local[0]; none when empty) against the best pair of
// s (BestPair) by the split rule (Decide), for a request of TTFT and TPOT targets ttftSLO and
// tpotSLO (0: none). pr is the best pair, nil when there is none; split says to run the request
// on it, RunsLocal(why) on s.Local[0].
func Choose(cfg *Config, req Request, whole []Candidate, s *PairSearch, ttftSLO, tpotSLO time.Duration) (pr *Pair, split bool, why string) {
	pr = BestPair(cfg, req, s)
	in := SplitInput{Pair: pr, PromptTokens: req.PromptTokens, TTFTSLO: ttftSLO, TPOTSLO: tpotSLO}
	if len(whole) > 0 {
		in.Whole = &whole[0]
	}
	if len(s.Local) > 0 {
		in.Local = &s.Local[0]
	}
	split, why = Decide(cfg, in)
	return pr, split, why
}
