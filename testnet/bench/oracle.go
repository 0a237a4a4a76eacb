package bench

import (
	"container/list"
	"fmt"

	"github.com/kvmesh/kvmesh/kvindex"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/testnet/loadgen"
)

// lruOracle is one prefix cache of capacity blocks, least recently used evicted first, over
// kvindex's chained block hashes: the reference a run's cache hit ratio is read against.
type lruOracle struct {
	capacity int
	order    *list.List // of uint64 hashes, most recently used at the front
	at       map[uint64]*list.Element
}

func newLRUOracle(capacity int) *lruOracle {
	return &lruOracle{capacity: capacity, order: list.New(), at: map[uint64]*list.Element{}}
}

// request serves a prompt of chained block hashes chain: it returns how many blocks from block 0
// were cached, then caches the whole chain. The chain is touched tail first, so that of two
// blocks of one prompt the earlier is the more recently used and a chain is evicted from its
// tail, as an engine frees a finished request's blocks (a block whose predecessor is gone can
// never match again).
func (o *lruOracle) request(chain []uint64) (hit int) {
	for hit < len(chain) && o.at[chain[hit]] != nil {
		hit++
	}
	for i := len(chain) - 1; i >= 0; i-- {
		if e := o.at[chain[i]]; e != nil {
			o.order.MoveToFront(e)
			continue
		}
		o.at[chain[i]] = o.order.PushFront(chain[i])
		for o.order.Len() > o.capacity {
			last := o.order.Back()
			delete(o.at, last.Value.(uint64))
			o.order.Remove(last)
		}
	}
	return hit
}

// serve runs items through the oracle and returns the cached and prompt tokens of their
// prompts, as kvmesh renders and counts them.
func (o *lruOracle) serve(items []loadgen.Item, blockTokens int) (cached, prompt int) {
	var buf []byte
	var chain []uint64
	for _, it := range items {
		var msgs []kvindex.Message
		for _, m := range it.Messages() {
			msgs = append(msgs, kvindex.Message{Role: m.Role, Content: m.Content})
		}
		buf = kvindex.RenderChat(buf[:0], msgs)
		chain = kvindex.AppendBlocks(chain[:0], node.DefaultModel, buf, blockTokens)
		cached += o.request(chain) * blockTokens
		prompt += kvindex.Tokens(len(buf))
	}
	return cached, prompt
}

// oracleHitRatios returns, per load of the benchmark, the cache hit ratio of the pooled-LRU
// oracle (see the package doc): one LRU cache of Nodes × KVBlocks blocks, fed every planned
// request's prompt, warm-up runs' included, in the order a policy's testnet receives them, the
// ratio counted over each measured run's requests. Nil for the agents workload, whose later
// prompts carry what the server answered, and for a multi-model mesh, whose caches are each
// model's own.
func (b *bencher) oracleHitRatios(wallCapacity float64) ([]float64, error) {
	if (b.cfg.Trace == "" && b.cfg.Workload == "agents") || b.cfg.Models > 1 {
		return nil, nil
	}
	const nowhere = "http://127.0.0.1" // Plan validates a target it never contacts
	bt := kvindex.DefaultBlockTokens   // the simulated engines'
	o := newLRUOracle(b.cfg.Nodes * b.cfg.KVBlocks)
	out := make([]float64, len(b.cfg.Loads))
	for i, l := range b.cfg.Loads {
		if wc, ok := b.warmupLoad([]string{nowhere}, i, l*wallCapacity); ok {
			items, err := loadgen.Plan(wc)
			if err != nil {
				return nil, fmt.Errorf("bench: oracle: %w", err)
			}
			o.serve(items, bt)
		}
		items, err := loadgen.Plan(b.load([]string{nowhere}, l*wallCapacity, b.cfg.Duration))
		if err != nil {
			return nil, fmt.Errorf("bench: oracle: %w", err)
		}
		cached, prompt := o.serve(items, bt)
		out[i] = frac(cached, prompt)
	}
	return out, nil
}
