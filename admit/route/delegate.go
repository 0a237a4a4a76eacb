package route

import (
	"encoding/binary"
	"math"
	"slices"

	"github.com/cespare/xxhash/v2"
)

// DelegateKeyBlocks is how many of a prompt's first blocks key its delegate (DelegateKey):
// 256 tokens at 16 a block, so the repeats of a prompt, and the turns of a conversation whose
// first turn is that long, meet the same delegate, while prompts that differ within their
// first 256 tokens (distinct system prompts) spread over the domain.
const DelegateKeyBlocks = 16

// delegateLoadTokens is the token load at which a member's weight as a delegate halves: the
// score's own saturation point (Weights.Load's L + 16384).
const delegateLoadTokens = 16384

// DelegateKey is the key that picks a request's delegate: the chain hash of its prompt's
// first DelegateKeyBlocks blocks (all of them when fewer), which stands for that whole
// prefix; fallback for a prompt shorter than a block.
func DelegateKey(blocks []uint64, fallback uint64) uint64 {
	if len(blocks) == 0 {
		return fallback
	}
	return blocks[min(len(blocks), DelegateKeyBlocks)-1]
}

// Delegate returns the index in peers of the member of model's domain that a node serving
// none of model should hand the routing of a request keyed by key (DelegateKey) to, or -1
// when none is eligible. Eligible are the peers that serve model, other than this node,
// healthy, fresh (not Stale) and not ejected. Among them the choice is weighted rendezvous
// hashing: each scores w / −ln(u), u its hash of key and name in (0, 1) and w its weight,
// 1 / (1 + L/16384) with L its token load (queued prefill and tokens in flight), and the
// highest score wins. Every ingress so picks the same delegate for the same key while loads
// stay the same, and a key moves off a member in proportion to how much its weight falls,
// so a loaded member routes fewer prompts without reshuffling the others.
func Delegate(key uint64, model string, peers []Peer) int {
	best, top := -1, 0.0
	var buf [8]byte
	binary.LittleEndian.PutUint64(buf[:], key)
	for i := range peers {
		p := &peers[i]
		if p.Self || !p.Healthy || p.Stale || p.Ejected || !slices.Contains(p.Models, model) {
			continue
		}
		d := xxhash.New()
		_, _ = d.Write(buf[:])
		_, _ = d.WriteString(p.Name)
		u := (float64(d.Sum64()>>11) + 0.5) / (1 << 53)
		load := float64(max(p.QueuedPrefillTokens, 0) + max(p.InFlightTokens, 0))
		s := 1 / (1 + load/delegateLoadTokens) / -math.Log(u)
		if best < 0 || s > top || s == top && p.Name < peers[best].Name {
			best, top = i, s
		}
	}
	return best
}
