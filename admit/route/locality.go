package route

import "time"

// The locality rule keeps a request where its prefix is cached for as long as that place
// serves it within its target, instead of letting load spread a tenant's requests over every
// node once all are busy (each node then recomputes every tenant's prefix, and the storing
// evicts the others' prefixes there: the cache thrashes).
//
// It applies to a request with a TTFT target (Request.TTFTTarget) that is not an agent's step
// (Request.StayHome) and may wait in the room (not Request.KeepBusy). Its prefix homes are the
// peers, busy or not, that hold its longest cached prefix, when that prefix is at least
// PrefixHomeMinTokens; several holding it equally are all homes, which is how a hot prefix
// gets a second home (below). A peer meets the target when its predicted TTFT, the recompute
// of what it does not hold included, is within PrefixHomeShare of it and its predicted TPOT
// within Request.TPOTTarget.
//
//   - A home meets it: the request stays home. Every other candidate is dropped, counted busy
//     (busy for this request, which its home serves), so that while every home is busy the
//     request waits in the room for one instead of recomputing its prefix elsewhere. Homes
//     that miss it are gated.
//   - No home meets it and another candidate does: the candidates that miss it are gated,
//     homes included, and the others keep the score's order, in which the prefix leads, so
//     the spill goes first to the peer holding most of the prefix. Once it has run there that
//     peer holds the whole prefix too and is a second home: a prefix whose demand exceeds one
//     node gets a second one, and a third only when two are not enough.
//   - No candidate meets it: the load gate, as without a target.
//
// Every candidate's Spill term is the prefix its home holds and it does not: what running
// there recomputes, and the KV of other prompts that storing it evicts. The rule counts both
// where it decides (a spill leaves home only for a peer that meets the target with the
// recompute; its eviction is why the rule spills as late as the target allows and, among
// peers that meet it, to the one holding most of the prefix first).

// heldPrefix is the best prefix holder the busy filter dropped: the most cached tokens, the
// fastest among those, and its predictions.
type heldPrefix struct {
	found      bool
	tokens     int
	ttft, tpot time.Duration
}

func (h *heldPrefix) see(c *Candidate) {
	t := c.Terms.PrefixTokens
	if !h.found || t > h.tokens || (t == h.tokens && c.PredictedTTFT < h.ttft) {
		*h = heldPrefix{found: true, tokens: t, ttft: c.PredictedTTFT, tpot: c.PredictedTPOT}
	}
}

// localityApplies reports whether the locality rule decides req, routed with agentHome (its
// agent's home, "" for none).
func localityApplies(cfg *Config, req Request, agentHome string) bool {
	return req.TTFTTarget > 0 && agentHome == "" && !req.KeepBusy && cfg.PrefixHomeMinTokens > 0
}

// meetsTarget reports whether a peer predicting ttft and tpot meets req's targets under the
// locality rule.
func meetsTarget(cfg *Config, req Request, ttft, tpot time.Duration) bool {
	limit := time.Duration(float64(req.TTFTTarget) * cfg.PrefixHomeShare)
	return ttft <= limit && (req.TPOTTarget <= 0 || tpot <= req.TPOTTarget)
}

// keepLocal applies the locality rule to the candidates dst (held: the best prefix holder the
// busy filter dropped). It returns the candidates left, in their order, and whether it gated
// them; when it did not, the load gate is to. Dropped candidates are counted busy in counts.
func keepLocal(cfg *Config, req Request, dst []Candidate, held *heldPrefix, counts *FilterCounts) ([]Candidate, bool) {
	longest := 0
	if held.found {
		longest = held.tokens
	}
	for i := range dst {
		longest = max(longest, dst[i].Terms.PrefixTokens)
	}
	if longest < cfg.PrefixHomeMinTokens {
		return dst, false
	}
	homeMeets := held.found && held.tokens == longest && meetsTarget(cfg, req, held.ttft, held.tpot)
	otherMeets := false
	for i := range dst {
		c := &dst[i]
		c.Terms.Spill = longest - c.Terms.PrefixTokens
		c.Home = c.Terms.Spill == 0
		meets := meetsTarget(cfg, req, c.PredictedTTFT, c.PredictedTPOT)
		homeMeets = homeMeets || c.Home && meets
		otherMeets = otherMeets || !c.Home && meets
	}
	if homeMeets {
		n, anyMeets := 0, false
		for i := range dst {
			if !dst[i].Home {
				counts[ReasonBusy]++
				continue
			}
			dst[i].Gated = !meetsTarget(cfg, req, dst[i].PredictedTTFT, dst[i].PredictedTPOT)
			anyMeets = anyMeets || !dst[i].Gated
			dst[n] = dst[i]
			n++
		}
		if !anyMeets { // only a busy home meets it: the others, homes too, keep the score's order
			for i := range n {
				dst[i].Gated = false
			}
		}
		return dst[:n], true
	}
	if !otherMeets {
		return dst, false
	}
	for i := range dst {
		dst[i].Gated = !meetsTarget(cfg, req, dst[i].PredictedTTFT, dst[i].PredictedTPOT)
	}
	return dst, true
}
