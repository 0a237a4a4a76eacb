package loadgen

import (
	"math/rand/v2"
	"strings"
)

// words is the vocabulary of generated text. Plain ASCII, so bytes and characters agree and
// kvmesh's 4-bytes-per-token rule gives exact token counts.
var words = strings.Fields(`the a of to and in is for on with that as by at from this be are it
an or was not which cache block token prefix node mesh queue route model request stream engine
batch prompt decode prefill memory latency budget peer shard index vector layer tensor weight
kernel update value state table graph server client window score limit shed admit forward`)

// mix is splitmix64's finaliser: it spreads structured keys (ids, counters) over all 64 bits.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// Text returns exactly n bytes of deterministic word text for key: the same key always gives
// the same text, and the text for n is a prefix of the text for any larger n.
func Text(key uint64, n int) string {
	if n <= 0 {
		return ""
	}
	var b strings.Builder
	b.Grow(n + 16)
	r := rand.New(rand.NewPCG(mix(key), 0x6b766d657368))
	for b.Len() < n {
		b.WriteString(words[r.IntN(len(words))])
		b.WriteByte(' ')
	}
	return b.String()[:n]
}

// MooncakeBlockTokens is the block size of Mooncake trace hash ids.
const MooncakeBlockTokens = 512

// BlockText is the text of Mooncake hash id id cut to tokens tokens (4 bytes each): equal ids
// give equal text, so requests share text exactly where the trace says they share KV blocks.
func BlockText(id int64, tokens int) string {
	return Text(uint64(id)^0x6d6f6f6e63616b65, tokens*bytesPerToken)
}

// bytesPerToken is kvmesh's tokenisation rule (kvindex.BytesPerToken).
const bytesPerToken = 4
