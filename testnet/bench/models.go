package bench

import (
	"context"
	"fmt"

	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/testnet"
	"github.com/kvmesh/kvmesh/testnet/loadgen"
)

// NoDelegatePolicy is kvmesh with delegated routing off (route.delegate: false): a node that
// serves none of a request's model routes it itself, without the model's prefix summaries.
const NoDelegatePolicy = "kvmesh-no-delegate"

// MultiModelPolicies returns the policies of a multi-model benchmark (Config.Models): kvmesh,
// whose nodes hand a request for a model they do not serve to a member of its domain, then
// kvmesh without that delegation, to show what it buys.
func MultiModelPolicies() []Policy {
	km, _ := PolicyByName(KvmeshPolicy)
	nd := km
	nd.Name, nd.NoDelegate = NoDelegatePolicy, true
	return []Policy{km, nd}
}

// ModelName is the name of model k of a multi-model benchmark: node i serves ModelName(i mod
// Config.Models).
func ModelName(k int) string { return fmt.Sprintf("%s-m%d", node.DefaultModel, k) }

// modelTargets splits urls, node i's at index i, into models nodes i mod m serve (see
// ModelName); nil for one model.
func modelTargets(urls []string, m int) []loadgen.ModelTargets {
	if m <= 1 {
		return nil
	}
	out := make([]loadgen.ModelTargets, m)
	for k := range out {
		out[k].Name = ModelName(k)
	}
	for i, u := range urls {
		out[i%m].Targets = append(out[i%m].Targets, u)
	}
	return out
}

// EntryRow is one entry's part of a multi-model Row (loadgen.Report.Entries): the requests that
// entered through a node serving their model (loadgen.EntryOwn) or through one that does not
// (loadgen.EntryOther). Rates and latencies in simulated time.
type EntryRow struct {
	Sent          int     `json:"sent"`
	Good          int     `json:"good"`
	GoodputRPS    float64 `json:"goodput_rps"`
	Attainment    float64 `json:"slo_attainment"`
	CacheHitRatio float64 `json:"cache_hit_ratio"`
	P50TTFT       float64 `json:"p50_ttft_s"`
	P99TTFT       float64 `json:"p99_ttft_s"`
}

// EntryComparison sets a multi-model Row's requests entering through other models' nodes
// against those entering through their own model's.
type EntryComparison struct {
	// HitRatio and Attainment are other's cache hit ratio and SLO attainment (its goodput per
	// request sent, which does not depend on how many requests each entry took) over own's;
	// Goodput other's goodput over own's; 0 where own's is 0.
	HitRatio   float64 `json:"hit_ratio"`
	Attainment float64 `json:"attainment"`
	Goodput    float64 `json:"goodput"`
	// AddedP50TTFT is other's median TTFT minus own's, in seconds: the hop a request entering
	// through another model's node takes more, at a load where queueing does not dominate.
	AddedP50TTFT float64 `json:"added_p50_ttft_s"`
}

// entryRows summarises rep's entries in simulated time, and compares them (nil, nil without
// both entries).
func entryRows(rep *loadgen.Report, timeScale float64) (map[string]*EntryRow, *EntryComparison) {
	if len(rep.Entries) == 0 {
		return nil, nil
	}
	out := map[string]*EntryRow{}
	for name, e := range rep.Entries {
		out[name] = &EntryRow{
			Sent: e.Sent, Good: e.Good, GoodputRPS: e.Goodput / timeScale, Attainment: e.Attainment,
			CacheHitRatio: e.CachedRatio, P50TTFT: e.TTFT.P50 * timeScale, P99TTFT: e.TTFT.P99 * timeScale,
		}
	}
	own, other := out[loadgen.EntryOwn], out[loadgen.EntryOther]
	if own == nil || other == nil {
		return out, nil
	}
	q := func(a, b float64) float64 {
		if b <= 0 {
			return 0
		}
		return a / b
	}
	return out, &EntryComparison{
		HitRatio: q(other.CacheHitRatio, own.CacheHitRatio), Attainment: q(other.Attainment, own.Attainment),
		Goodput: q(other.GoodputRPS, own.GoodputRPS), AddedP50TTFT: other.P50TTFT - own.P50TTFT,
	}
}

// writeEntries writes the table of the rows' entries, with p a tabwriter's printf.
func writeEntries(rows []Row, p func(format string, a ...any)) {
	p("\npolicy\tload\tentry\tsent\tgoodput\tSLO att.\tcache hit\tp50 TTFT\tp99 TTFT\tother/own: hit\tatt.\tgoodput\tp50 TTFT added\tdelegations\n")
	p("\t×cap\t\t\treq/s\t\t\ts\ts\t\t\t\tms\t\n")
	for _, row := range rows {
		for _, name := range []string{loadgen.EntryOwn, loadgen.EntryOther} {
			e := row.Entries[name]
			if e == nil {
				continue
			}
			cmp := "\t\t\t\t"
			if c := row.OtherOverOwn; c != nil && name == loadgen.EntryOther {
				cmp = fmt.Sprintf("%.3f\t%.3f\t%.3f\t%.0f\t%s", c.HitRatio, c.Attainment, c.Goodput, 1000*c.AddedP50TTFT, counts(row.Delegated))
			}
			p("%s\t%.2g\t%s\t%d\t%.2f\t%s\t%s\t%.3f\t%.3f\t%s\n", row.Policy, row.Load, name, e.Sent, e.GoodputRPS, pct(e.Attainment),
				pct(e.CacheHitRatio), e.P50TTFT, e.P99TTFT, cmp)
		}
	}
}

// modelsLine says how a multi-model benchmark's nodes serve models, for the table's header,
// with p a tabwriter's printf.
func modelsLine(models, nodes int, p func(format string, a ...any)) {
	if models > 1 {
		p("%d models over %d nodes: node i serves %s to %s by i mod %d; a request asks for its conversation's model and enters round-robin through every node, its model's (own) or another's (other)\n",
			models, nodes, ModelName(0), ModelName(models-1), models)
	}
}

// delegatedMetric counts requests for a model their ingress does not serve, by outcome.
const delegatedMetric = "kvmesh_route_delegated_total"

// delegated reads the testnet's delegations by outcome (delegatedMetric), as counted since
// before when before is not nil; nil, with nothing read, for one model.
func (b *bencher) delegated(ctx context.Context, tn *testnet.Net, before map[string]int) (map[string]int, error) {
	if b.cfg.Models <= 1 {
		return nil, nil
	}
	return scrapeOutcomes(ctx, tn.URLs(), delegatedMetric, before)
}
