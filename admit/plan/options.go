package plan

import (
	"time"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/admit/route"
)

// OptionOf maps a route candidate on peer into admission's view of it for a request of
// priority: routing's predicted TTFT and TPOT, and the KV free after the peer's running work,
// the queued work ahead of the request (route.QueuedAhead) and this node's reservations on it.
func OptionOf(c *route.Candidate, peer *route.Peer, priority, blockTokens int) admit.Option {
	free := peer.KVBlocksTotal - peer.KVBlocksUsed - QueuedBlocks(route.QueuedAhead(peer, priority), blockTokens) - c.Terms.ReservedBlocks
	return admit.Option{
		Peer: c.Name, PredictedTTFT: c.PredictedTTFT, PredictedTPOT: c.PredictedTPOT,
		FreeKVBlocks: max(free, 0), TotalKVBlocks: peer.KVBlocksTotal, BlockTokens: blockTokens,
		CachedTokens: c.Terms.PrefixTokens, PrefillTokensPerSecond: peer.PrefillTokensPerSecond,
	}
}

// QueuedBlocks is the KV the engine's queued prefill will take before a new request runs: its
// queue is first come first served and its head waits for blocks (as vLLM's does), so the
// blocks free now are not free for a request behind it (admit.Option.FreeKVBlocks).
func QueuedBlocks(tokens, blockTokens int) int {
	if tokens <= 0 || blockTokens <= 0 {
		return 0
	}
	return (tokens + blockTokens - 1) / blockTokens
}

// busyOptions lists the busy hosts of req's model as options, when routing found none with
// room: their free KV as it is, and the prefill queued on them as the wait. A host is one
// routing would run req on (route.Request.Serves): for a LoRA adapter, also a node serving its
// base model whose record lists fewer adapters than its engine serves, so that an adapter past
// every record's bound waits in the room like any other request instead of being refused
// no_capacity. The blocked head's claim goes where it fits first (Admitter.ClaimFor); an accept
// on a busy host never runs (decide).
func (p *Planner) busyOptions(v *View, req *route.Request, pl *Plan) {
	for i := range v.Peers {
		peer := &v.Peers[i]
		if !peer.Healthy || !req.Serves(peer) {
			continue
		}
		ahead := route.QueuedAhead(peer, req.Priority)
		var ttft time.Duration
		if peer.PrefillTokensPerSecond > 0 {
			ttft = time.Duration(float64(ahead) / peer.PrefillTokensPerSecond * float64(time.Second))
		}
		free := peer.KVBlocksTotal - peer.KVBlocksUsed - QueuedBlocks(ahead, v.BlockTokens)
		pl.Opts = append(pl.Opts, admit.Option{Peer: peer.Name, PredictedTTFT: ttft, FreeKVBlocks: max(free, 0),
			TotalKVBlocks: peer.KVBlocksTotal, BlockTokens: v.BlockTokens, PrefillTokensPerSecond: peer.PrefillTokensPerSecond})
	}
}
