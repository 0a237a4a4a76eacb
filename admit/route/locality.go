package route

import (
	"math"
	"slices"
	"time"
)

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
//   - A home meets it, and the load gate would keep it against the fastest other candidate
//     (its queue costs no more than twice what its cache saves) or its decodes keep the step's
//     TPOT target beside its queue (Candidate.SharedTPOT within Request.StepTPOTTarget): the
//     request stays home. Every other candidate is gated behind the homes,
//     a fallback for a home that refuses or fails; when no home is a candidate (every one is
//     busy), the others are dropped, counted busy (busy for this request, which its home
//     serves), and the request waits in the room for a home instead of recomputing its prefix
//     elsewhere. Homes that miss it are gated.
//   - A home meets it but the gate would not keep it (the others are idle enough that
//     spreading costs little) and its queue would slow its decodes past the step's target:
//     the load gate decides, as without a target.
//   - No home meets it and another candidate does, sooner than the fastest home by more than
//     the load gate's slack (it relieves the homes: spill): every other candidate is gated,
//     homes included, and those keep the score's order, in which the prefix leads, so the
//     spill goes first to the peer holding most of the prefix. Once it has run there that
//     peer holds the whole prefix too and is a second home: a prefix whose demand exceeds its
//     home's capacity gets a second one, and a third only when two are not enough; an evenly
//     loaded mesh has no peer that relieves, so load alone adds no home.
//   - No candidate relieves the homes, and a home, busy or not, meets the whole target while
//     no other candidate meets the margin, or those that do would not relieve it: the request
//     stays home, as in the first case. The others would recompute the prefix past the
//     target or barely sooner, and admission would refuse for a predicted TTFT what the
//     home's cache serves in time.
//   - Otherwise: the load gate, as without a target.
//
// Every candidate's Spill term is the prefix its home holds and it does not: what running
// there recomputes, and the KV of other prompts that storing it evicts. The rule counts both
// where it decides (a spill leaves home only for a peer that meets the target with the
// recompute; its eviction is why the rule spills as late as the target allows and, among
// peers that meet it, to the one holding most of the prefix first).

// heldPrefix is the best prefix holder the busy filter dropped: the most cached tokens, the
// fastest among those, and its predictions.
type heldPrefix struct {
	found             bool
	tokens            int
	ttft, tpot, stpot time.Duration
	saved             time.Duration
}

func (h *heldPrefix) see(c *Candidate) {
	t := c.Terms.PrefixTokens
	if !h.found || t > h.tokens || (t == h.tokens && c.PredictedTTFT < h.ttft) {
		*h = heldPrefix{found: true, tokens: t, ttft: c.PredictedTTFT, tpot: c.PredictedTPOT, stpot: c.SharedTPOT,
			saved: c.Terms.PrefixSaved}
	}
}

// localityApplies reports whether the locality rule decides req, routed with agentHome (its
// agent's home, "" for none).
func localityApplies(cfg *Config, req Request, agentHome string) bool {
	return req.TTFTTarget > 0 && agentHome == "" && !req.KeepBusy && cfg.PrefixHomeMinTokens > 0
}

// meetsTarget reports whether a peer predicting ttft and tpot meets req's targets, its TTFT
// within share of the TTFT target.
func meetsTarget(req Request, share float64, ttft, tpot time.Duration) bool {
	limit := time.Duration(float64(req.TTFTTarget) * share)
	return ttft <= limit && (req.TPOTTarget <= 0 || tpot <= req.TPOTTarget)
}

// keepsPastGate reports whether a home whose decodes would run at stpot beside its queue (its
// Candidate.SharedTPOT) keeps req although the load gate would move it: its queue then costs
// the decodes it runs no SLO, so concentrating the prefix's requests there costs only the wait
// the TTFT target allows.
func keepsPastGate(req Request, stpot time.Duration) bool {
	return req.StepTPOTTarget > 0 && stpot <= req.StepTPOTTarget
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
		return dst, placeCold(cfg, req, dst) // no home: the cold prefix's place (placement.go)
	}
	for i := range dst {
		dst[i].Terms.Spill = longest - dst[i].Terms.PrefixTokens
		dst[i].Home = dst[i].Terms.Spill == 0
	}
	fastest := time.Duration(math.MaxInt64) // the fastest other candidate's TTFT
	for i := range dst {
		if !dst[i].Home {
			fastest = min(fastest, dst[i].PredictedTTFT)
		}
	}
	// meet reports whether a home, and whether another candidate, meets the target at share;
	// with gate, a home counts only if the load gate would keep it against the others or its
	// decodes keep their TPOT beside its queue (keepsPastGate).
	meet := func(share float64, gate bool) (home, other bool) {
		ok := func(ttft, tpot, stpot, saved time.Duration) bool {
			return meetsTarget(req, share, ttft, tpot) &&
				(!gate || !gatedBy(cfg, ttft, saved, fastest) || keepsPastGate(req, stpot))
		}
		home = held.found && held.tokens == longest && ok(held.ttft, held.tpot, held.stpot, held.saved)
		for i := range dst {
			c := &dst[i]
			home = home || c.Home && ok(c.PredictedTTFT, c.PredictedTPOT, c.SharedTPOT, c.Terms.PrefixSaved)
			other = other || !c.Home && meetsTarget(req, share, c.PredictedTTFT, c.PredictedTPOT)
		}
		return home, other
	}
	homeKeeps, _ := meet(cfg.PrefixHomeShare, true)
	if homeKeeps {
		return onlyHomes(req, cfg.PrefixHomeShare, dst, counts), true
	}
	homeMeets, otherMeets := meet(cfg.PrefixHomeShare, false)
	if homeMeets {
		return dst, false // a home meets it, but the others are idle enough for the gate to spread
	}
	if otherMeets && spill(cfg, req, dst, held, longest) {
		return dst, true
	}
	// Nobody relieves the homes. A home that meets the whole target still keeps the request
	// when nobody else meets it with the margin, or when those who do would not relieve it:
	// the candidates left would recompute the prefix past the target, or as late as the home
	// serves it, and admission would refuse for a predicted TTFT what the home's cache serves
	// in time.
	if h, o := meet(1, false); h && (!o || otherMeets) {
		return onlyHomes(req, 1, dst, counts), true
	}
	return dst, false
}

// spill gates, when no home meets req's target with the margin, every candidate but those
// that would relieve the homes (relieves), and reports whether any would. Those keep the
// score's order, in which the prefix leads. The first to take a spill holds the whole prefix
// after it and is a second home: a prefix gets one more home only when its homes' queues are
// past the target's margin and another peer serves it within the margin sooner than they do
// by more than the prefix's cache saves them (the load gate's slack), which is demand beyond
// the homes' capacity. A mesh loaded evenly has no such peer, so at saturation a prefix keeps
// its homes instead of spreading to every node and evicting other prefixes there.
func spill(cfg *Config, req Request, dst []Candidate, held *heldPrefix, longest int) bool {
	home := time.Duration(math.MaxInt64) // the fastest home's TTFT and what its cache saves
	var saved time.Duration
	if held.found && held.tokens == longest {
		home, saved = held.ttft, held.saved
	}
	for i := range dst {
		if c := &dst[i]; c.Home && c.PredictedTTFT < home {
			home, saved = c.PredictedTTFT, c.Terms.PrefixSaved
		}
	}
	relieves := func(c *Candidate) bool {
		return !c.Home && meetsTarget(req, cfg.PrefixHomeShare, c.PredictedTTFT, c.PredictedTPOT) &&
			(home == time.Duration(math.MaxInt64) || gatedBy(cfg, home, saved, c.PredictedTTFT))
	}
	if !slices.ContainsFunc(dst, func(c Candidate) bool { return relieves(&c) }) {
		return false
	}
	for i := range dst {
		dst[i].Gated = !relieves(&dst[i])
	}
	return true
}

// onlyHomes keeps the request at its homes. When some home is a candidate, the others stay
// behind it, gated, as fallbacks for a home that refuses or fails (dispatch's next candidates);
// the homes that miss the target at share are gated too when another home meets it. When no
// home is a candidate (every one busy), the others are dropped, counted busy: the result is
// empty and the request waits in the room for a home.
func onlyHomes(req Request, share float64, dst []Candidate, counts *FilterCounts) []Candidate {
	homes, anyMeets := 0, false
	for i := range dst {
		if dst[i].Home {
			homes++
			anyMeets = anyMeets || meetsTarget(req, share, dst[i].PredictedTTFT, dst[i].PredictedTPOT)
		}
	}
	if homes == 0 {
		counts[ReasonBusy] += len(dst)
		return dst[:0]
	}
	for i := range dst {
		c := &dst[i]
		c.Gated = !c.Home || anyMeets && !meetsTarget(req, share, c.PredictedTTFT, c.PredictedTPOT)
	}
	return dst
}

// gatedBy reports whether the load gate moves a candidate predicting ttft, whose cached prefix
// saves saved, behind another predicting fastest (applyGate's rule).
func gatedBy(cfg *Config, ttft, saved, fastest time.Duration) bool {
	slack := min(toDuration(cfg.GateSlackFactor*saved.Seconds()), cfg.GateMaxSlack) + onDur(cfg.GateTolerance)
	return ttft-fastest > slack
}
