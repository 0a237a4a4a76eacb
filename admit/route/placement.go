package route

import (
	"math"
	"time"

	"github.com/kvmesh/kvmesh/kvindex"
)

// Cold placement. A prompt whose prefix no peer holds (never computed, or evicted
// everywhere) has no home, and the score with its tie-break puts it on whichever peer is
// least loaded at that moment. Past saturation that scatters a tenant: each eviction sends its
// prefix to another peer, two ingresses that route it before gossip tells them of the first
// placement each pick their own, and every peer ends up caching every tenant's prefix, so each
// holds a quarter of the tenants' worth of KV for four times the tenants and evicts them all
// the sooner. Placed by a hash of the prompt's head instead (rendezvous over the candidates),
// the peers hold near-disjoint sets of prefixes, every ingress agrees on where a cold prefix
// goes, and a prefix returns to the same peer after an eviction.
//
// Load bounds it as it bounds a home: the first candidate in the head's rendezvous order that
// a home would keep there (it meets the target with the margin, and the load gate keeps it
// against the fastest other candidate or its decodes keep their TPOT beside its queue) takes
// the request, the others gated behind it; a busy peer is no candidate, so its prefixes go to
// the next peer in their order. When no candidate would be kept, the load gate decides as
// without the rule.

// coldKey is the key req's cold prefix is placed by: the chained hash of the block holding
// its PrefixHomeMinTokens-th token, which names the prompt's first PrefixHomeMinTokens tokens
// (a chain hash covers every block before it), the least prefix that makes a home. ok is
// false when the prompt is shorter (its prefix would make no home) or its blocks are unknown.
func coldKey(cfg *Config, req Request) (key uint64, ok bool) {
	if len(req.Blocks) == 0 || req.PromptTokens < cfg.PrefixHomeMinTokens {
		return 0, false
	}
	bt := req.BlockTokens
	if bt <= 0 {
		bt = kvindex.DefaultBlockTokens
	}
	per := float64(bt)
	if req.TokenScale > 0 {
		per *= req.TokenScale
	}
	n := int(math.Ceil(float64(cfg.PrefixHomeMinTokens) / per))
	return req.Blocks[min(max(n, 1), len(req.Blocks))-1], true
}

// placeCold gates every candidate of dst but the first in req's cold key's rendezvous order
// that keeps it (see above), and reports whether one did; when none did it leaves dst as it
// is, for the load gate.
func placeCold(cfg *Config, req Request, dst []Candidate) bool {
	key, ok := coldKey(cfg, req)
	if !ok || len(dst) < 2 {
		return false
	}
	// The fastest and second fastest TTFTs: the fastest other candidate's for each.
	min1, min2, at := time.Duration(math.MaxInt64), time.Duration(math.MaxInt64), -1
	for i := range dst {
		if t := dst[i].PredictedTTFT; t < min1 {
			min1, min2, at = t, min1, i
		} else if t < min2 {
			min2 = t
		}
	}
	best, top := -1, uint64(0)
	for i := range dst {
		c := &dst[i]
		fastest := min1
		if i == at {
			fastest = min2
		}
		if !keepsCold(cfg, req, c, fastest) {
			continue
		}
		if h := rendezvousKey(key, c.Name); best < 0 || before(h, c.Name, top, dst[best].Name) {
			best, top = i, h
		}
	}
	if best < 0 {
		return false
	}
	for i := range dst {
		dst[i].Gated = i != best
	}
	return true
}

// keepsCold reports whether c would keep req as a home does: it meets the target with the
// margin, and the load gate keeps it against the fastest other candidate, predicting fastest
// (with no cache to save, within the gate's tolerance), or its decodes keep the step's TPOT
// beside its queue.
func keepsCold(cfg *Config, req Request, c *Candidate, fastest time.Duration) bool {
	return meetsTarget(req, cfg.PrefixHomeShare, c.PredictedTTFT, c.PredictedTPOT) &&
		(!gatedBy(cfg, c.PredictedTTFT, c.Terms.PrefixSaved, fastest) || keepsPastGate(req, c.SharedTPOT))
}
