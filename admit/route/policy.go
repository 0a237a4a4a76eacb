package route

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/kvindex"
)

// Policy names for NewPolicy.
const (
	PolicyKvmesh     = "kvmesh"
	PolicyRoundRobin = "round-robin"
	PolicyLeastLoad  = "least-load"
	PolicyCacheAware = "cache-aware"
	PolicyRandom     = "random"
	// PolicyLoRAAffinity routes an adapter's request as LoRA-affinity schedulers do: to a peer
	// with the adapter resident, else one with a free adapter slot, else any, the least loaded
	// within each tier; prefixes and SLOs play no part. A base model's request goes to the
	// least loaded peer.
	PolicyLoRAAffinity = "lora-affinity"
)

// PolicyNames lists the policies NewPolicy knows, kvmesh first.
var PolicyNames = []string{PolicyKvmesh, PolicyRoundRobin, PolicyLeastLoad, PolicyCacheAware, PolicyRandom, PolicyLoRAAffinity}

// Policy picks where a request runs. Every policy filters on the model and drops ejected
// peers (Peer.Ejected); only kvmesh applies the other filters, the gate, reservations, refusal marks and session stickiness (the
// others' Reserve, Observe, Release, Refused and Stick do nothing and their Counts stay zero,
// so the node calls them whatever the policy). Implementations are safe for concurrent use.
type Policy interface {
	Name() string
	// Route filters peers, scores the survivors and returns them best first in dst.
	Route(now time.Time, req Request, peers []Peer, dst []Candidate) ([]Candidate, error)
	// Reserve counts a dispatched request's load on peer until a newer record reflects it.
	Reserve(now time.Time, peer string, prefillTokens, blocks int) Reservation
	// Hold counts a split request's decode blocks on peer until Release: they arrive there
	// only with the handover, so no record reflects them before.
	Hold(now time.Time, peer string, blocks int) Reservation
	// Observe clears the reservations and refusals a record of peer received at received reflects.
	Observe(peer string, received time.Time)
	// Release drops a reservation; it reports whether it was still counting.
	Release(r Reservation) bool
	// Refused marks peer busy for requests of priority and below: its owner just said no.
	Refused(now time.Time, peer string, priority int)
	// Stick records that session's last request went to peer.
	Stick(session, peer string)
	// Counts returns how many peers each filter has dropped since the policy was made.
	Counts() FilterCounts
	// Predict scores p for req as Route would with no reservation on it and no filter: the
	// owner's check of a forwarded request uses it on its own exact state, so that the owner
	// and the ingress predict TTFT, TPOT and cached tokens the same way.
	Predict(req Request, p *Peer) Candidate
	// Pair runs the two searches of a split request's pair into out (pair.go): prefill
	// candidates among prefill and mixed peers, decode candidates among decode and mixed
	// peers, each best first.
	Pair(now time.Time, req Request, peers []Peer, tpotSLO time.Duration, out *PairSearch)
	// Config returns the configuration in use, defaults filled; SetConfig replaces it while
	// the policy runs (a node's config reload), keeping Seed and MaxSessions.
	Config() Config
	SetConfig(cfg Config) error
}

var (
	_ Policy = (*Router)(nil)
	_ Policy = (*baseline)(nil)
)

// CacheThreshold is the cache-aware policy's match fraction below which it balances by load
// (SGLang router's cache_threshold).
const CacheThreshold = 0.3

// NewPolicy returns the named policy configured by cfg (Seed for random; the scoring config
// fills the candidates' terms and predicted latencies for explain and admission).
func NewPolicy(name string, cfg Config) (Policy, error) {
	if name == PolicyKvmesh {
		return New(cfg)
	}
	if !slices.Contains(PolicyNames, name) {
		return nil, fmt.Errorf("route: unknown policy %q (want one of %v): %w", name, PolicyNames, ErrInvalidConfig)
	}
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	b := &baseline{
		name: name,
		rng:  rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
	}
	b.init(cfg)
	return b, nil
}

// baseline is a comparison policy: model and ejection filters only, then one ordering rule. Each
// candidate's Score is that rule's key (higher first): round-robin and random 0, least-load
// −(running+waiting), cache-aware the prefix fraction when it leads, else −(running+waiting),
// lora-affinity the adapter's tier (loraTier) less 1e-9×(running+waiting).
type baseline struct {
	liveConfig
	name string

	mu   sync.Mutex
	next int
	rng  *rand.Rand
}

func (b *baseline) Name() string { return b.name }

func (b *baseline) Reserve(now time.Time, peer string, prefillTokens, blocks int) Reservation {
	return Reservation{Peer: peer, At: now, PrefillTokens: max(prefillTokens, 0), Blocks: max(blocks, 0)}
}

func (b *baseline) Hold(now time.Time, peer string, blocks int) Reservation {
	return b.Reserve(now, peer, 0, blocks)
}

func (b *baseline) Observe(string, time.Time) {}

func (b *baseline) Release(Reservation) bool { return false }

func (b *baseline) Refused(time.Time, string, int) {}

func (b *baseline) Stick(string, string) {}

func (b *baseline) Counts() FilterCounts { return FilterCounts{} }

func (b *baseline) Predict(req Request, p *Peer) Candidate { return predict(b.conf(), req, p) }

// predict is evaluate for a lone peer with nothing reserved on it.
func predict(cfg *Config, req Request, p *Peer) Candidate {
	bt := req.BlockTokens
	if bt <= 0 {
		bt = kvindex.DefaultBlockTokens
	}
	return evaluate(cfg, req, bt, 0, p, reserved{})
}

func requests(p *Peer) int { return max(p.Running, 0) + max(p.Waiting, 0) }

func (b *baseline) Route(now time.Time, req Request, peers []Peer, dst []Candidate) ([]Candidate, error) {
	dst = dst[:0]
	bt := req.BlockTokens
	if bt <= 0 {
		bt = kvindex.DefaultBlockTokens
	}
	var counts FilterCounts
	cfg := b.conf()
	for i := range peers {
		switch {
		case !req.Serves(&peers[i]):
			counts[ReasonModel]++
		case peers[i].Ejected:
			counts[ReasonEjected]++
		default:
			dst = append(dst, evaluate(cfg, req, bt, i, &peers[i], reserved{}))
		}
	}
	if len(dst) == 0 {
		return dst, &NoCandidateError{Model: req.Model, Peers: len(peers), Counts: counts}
	}
	switch b.name {
	case PolicyRoundRobin:
		b.mu.Lock()
		k := b.next % len(dst)
		b.next++
		b.mu.Unlock()
		for i := range dst {
			dst[i].Score = 0
		}
		slices.Reverse(dst[:k])
		slices.Reverse(dst[k:])
		slices.Reverse(dst)
	case PolicyRandom:
		b.mu.Lock()
		b.rng.Shuffle(len(dst), func(i, j int) { dst[i], dst[j] = dst[j], dst[i] })
		b.mu.Unlock()
		for i := range dst {
			dst[i].Score = 0
		}
	case PolicyLeastLoad:
		for i := range dst {
			dst[i].Score = -float64(requests(&peers[dst[i].Peer]))
		}
		slices.SortStableFunc(dst, byScore)
	case PolicyCacheAware:
		best := 0.0
		for i := range dst {
			best = max(best, dst[i].Terms.Prefix)
		}
		for i := range dst {
			if best >= CacheThreshold {
				// Prefix first; load only among equal matches.
				dst[i].Score = dst[i].Terms.Prefix - 1e-9*float64(requests(&peers[dst[i].Peer]))
			} else {
				dst[i].Score = -float64(requests(&peers[dst[i].Peer]))
			}
		}
		slices.SortStableFunc(dst, byScore)
	case PolicyLoRAAffinity:
		for i := range dst {
			dst[i].Score = loraTier(dst[i].Terms.Residency) - 1e-9*float64(requests(&peers[dst[i].Peer]))
		}
		slices.SortStableFunc(dst, byScore)
	}
	return dst, nil
}

// loraTier is the lora-affinity policy's rank of a residency: resident 2, a free slot 1, a
// swap (or a base model's request) 0.
func loraTier(r Residency) float64 {
	switch r {
	case ResidencyResident:
		return 2
	case ResidencyFreeSlot:
		return 1
	}
	return 0
}

func byScore(a, b Candidate) int {
	switch {
	case a.Score > b.Score:
		return -1
	case a.Score < b.Score:
		return 1
	}
	return 0
}
