package sim

// What the engine reports: its cache's deltas, its load snapshot, its prefix cache's blocks.

import (
	"time"

	"github.com/kvmesh/kvmesh/kvindex"
	"github.com/kvmesh/kvmesh/node/engine"
)

func (s *Sim) report(d kvindex.CacheDelta) {
	if s.cfg.OnPrefix != nil && !d.Empty() {
		s.cfg.OnPrefix(d)
	}
}

// State returns the engine's load snapshot.
func (s *Sim) State() engine.State {
	s.mu.Lock()
	defer s.mu.Unlock()
	var waiting [3]int // by priorityClass
	seated, blocked := s.seatedLocked(), 0
	for _, q := range s.waiting {
		if !seated(q) {
			blocked++ // skipped until its adapter has a slot: ahead of no request that has one
			continue
		}
		waiting[priorityClass(q.priority)] += max(0, q.promptTokens+q.gen-q.estHit)
	}
	var ctx, running int
	for _, q := range s.running {
		if r := q.promptTokens + q.gen - q.computed; r > 1 {
			running += r // ahead of every waiting request, whatever its class
		}
		ctx += q.promptTokens + q.gen
	}
	hit := 0.0
	if s.hitTok > 0 {
		hit = float64(s.hitOK) / float64(s.hitTok)
	}
	c := &s.cfg
	byPriority := c.SchedulingPolicy == SchedulingPriority
	beforeHigh, lowWaiting := running+waiting[0], waiting[2]
	if !byPriority {
		// Every sequence has priority 0 (schedPriority): nothing is ahead of a class alone.
		beforeHigh, lowWaiting = 0, 0
	}
	full := c.StepFixed + time.Duration(c.MaxNumBatchedTokens)*(c.StepPerToken+c.StepPerContextToken)
	decode := c.StepFixed + time.Duration(max(1, len(s.running)))*c.StepPerToken + time.Duration(ctx)*c.StepPerContextToken
	return engine.State{
		Healthy:                !s.closed,
		BlockTokens:            c.BlockTokens,
		KVBlocksTotal:          s.kvBlocks,
		KVBlocksUsed:           s.cache.used(),
		HitRate:                hit,
		Running:                len(s.running),
		Waiting:                len(s.waiting) - blocked,
		QueuedPrefillTokens:    running + waiting[0] + waiting[1] + waiting[2],
		PriorityScheduling:     byPriority,
		QueuedBeforeHigh:       beforeHigh,
		QueuedLowWaiting:       lowWaiting,
		PrefillTokensPerSecond: float64(c.MaxNumBatchedTokens) / full.Seconds() * c.TimeScale,
		DecodeStepSeconds:      decode.Seconds() / c.TimeScale,
		MaxRunning:             c.MaxNumSeqs,
		LoRA:                   s.loraStateLocked(blocked),
	}
}

// CachedBlocks returns how many blocks the prefix cache holds (shared by running sequences
// or resident and evictable).
func (s *Sim) CachedBlocks() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.cache.entries)
}

// ResidentBlocks returns a snapshot of every cached block hash, in no particular order.
func (s *Sim) ResidentBlocks() []uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cache.resident(make([]uint64, 0, len(s.cache.entries)), false)
}

// ResidentAnchors returns a snapshot of the cached blocks that are anchors of their chains
// (kvindex.Anchor), in no particular order: the residency gossip carries.
func (s *Sim) ResidentAnchors() []uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cache.resident(nil, true)
}

// ResetPrefixCache empties the prefix cache, as vLLM's POST /reset_prefix_cache does, and
// returns the hashes it held. Like vLLM it refuses (ErrCacheInUse) while any request runs or
// waits, whose blocks it could not drop. It does not call OnPrefix: the caller reports the
// reset.
func (s *Sim) ResetPrefixCache() ([]uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.running) > 0 || len(s.waiting) > 0 {
		return nil, ErrCacheInUse
	}
	held := s.cache.resident(make([]uint64, 0, len(s.cache.entries)), false)
	s.cache = newBlockCache(s.cache.total)
	return held, nil
}

// SimTime returns the simulated engine time elapsed: the sum of modelled step durations.
func (s *Sim) SimTime() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.simNow
}

// Demote marks the cached blocks among blocks as the first to evict, the last block first: a
// prefix whose owner is done with it (an agent that finished, or one its window paused) goes
// before prefixes still in use, which LRU alone would evict first because they were used
// longer ago. Blocks held by a running sequence are left alone, and the caller must
// leave out blocks other prefixes share that it wants kept (a common system prompt). It
// returns how many blocks it demoted.
func (s *Sim) Demote(blocks []uint64) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cache.demote(blocks)
}
