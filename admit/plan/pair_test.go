package plan

import (
	"slices"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/admit/route"
)

// pairView is a disaggregated view: an idle prefill node p1, a prefill node p2 with queued
// work other ingresses sent, and a decode node d of total blocks using used.
func pairView(queuedP2, total, used int) *View {
	v := &View{BlockTokens: 16}
	v.Add(peer("p1", func(p *route.Peer) { p.Role = route.RolePrefill }), false)
	v.Add(peer("p2", func(p *route.Peer) { p.Role = route.RolePrefill; p.QueuedPrefillTokens = queuedP2 }), false)
	v.Add(peer("d", func(p *route.Peer) { p.Role = route.RoleDecode; p.KVBlocksTotal, p.KVBlocksUsed = total, used }), false)
	return v
}

// TestPairDecodeRoomAtArrival pins the ingress's decode check on a pair, F(t_a): a decode node
// busy now but draining before the handover arrives takes the request (anti-phase); an idle
// one that the prefill pool's queued halves will fill does not, and the request waits in the
// prefill pool. The accept holds its decode blocks until the handover, whatever the decode
// node's records say, then reserves them on the node that takes it.
func TestPairDecodeRoomAtArrival(t *testing.T) {
	p := newPlanner(t, Config{}, nil)
	r := p.Policy().(*route.Router)
	req := request(8000, nil) // 8,000 + 100 tokens: 507 blocks; 0.8 s of prefill on p1

	// d: 80% used now (400 free, under the 507 needed); its 20 ms step and 100-token
	// residence (2 s) release about 40% of that by t_a.
	var pl Plan
	p.Ingress(t0, req, pairView(0, 2000, 1600), &pl)
	if pl.D.Action != admit.Accept || !pl.D.Split || pl.D.Role != admit.RolePrefill {
		t.Fatalf("busy decode draining by the arrival: %v %s split %v role %q (%s)", pl.D.Action, pl.D.Code, pl.D.Split, pl.D.Role, pl.D.Message)
	}
	if pl.Res.Peer != "p1" || pl.ResDecode.Peer != "d" || pl.ResDecode.Blocks != 507 {
		t.Fatalf("reservations %+v and %+v", pl.Res, pl.ResDecode)
	}
	r.Observe("d", t0.Add(time.Second))
	if _, blocks, _ := r.Reserved(t0.Add(time.Second), "d"); blocks != 507 {
		t.Errorf("a record of d cleared the decode hold: %d blocks", blocks)
	}
	if got := p.held.Load(); got != 507 {
		t.Errorf("held %d, want 507", got)
	}
	p.Handover(t0.Add(time.Second), &pl, "d")
	if got := p.held.Load(); got != 0 {
		t.Errorf("held after the handover %d, want 0", got)
	}
	r.Observe("d", t0.Add(2*time.Second))
	if _, blocks, _ := r.Reserved(t0.Add(2*time.Second), "d"); blocks != 0 {
		t.Errorf("a record after the handover kept %d blocks", blocks)
	}
	p.Release(&pl)

	// d idle, but p2 queues 24,000 tokens (1,500 blocks) of other ingresses' halves for it:
	// 500 blocks forecast free, under the 507 + 10% it needs; they drain in time, so it waits.
	pl = Plan{}
	p.Ingress(t0, req, pairView(24000, 2000, 0), &pl)
	if pl.D.Action != admit.Queue || pl.D.Code != admit.CodeWaitDecode || pl.D.Role != admit.RolePrefill || pl.Reserved {
		t.Fatalf("idle decode the prefill pool will fill: %v %s role %q reserved %v (%s)", pl.D.Action, pl.D.Code, pl.D.Role, pl.Reserved, pl.D.Message)
	}
	// The same with a TTFT target the wait would miss: refused before the prefill.
	hard := request(8000, func(r *admit.Request) { r.TTFTSLO = time.Second })
	p.Ingress(t0, hard, pairView(24000, 2000, 0), &pl)
	if pl.D.Action != admit.Refuse || pl.D.Code != admit.CodeDecodeFull || pl.D.RetryAfter <= 0 {
		t.Fatalf("with a 1 s target: %v %s after %v (%s)", pl.D.Action, pl.D.Code, pl.D.RetryAfter, pl.D.Message)
	}
}

// TestDecodeLocalPrefillPlan pins a request the split rule runs whole on a decode node: the
// prefill node's queue makes the pair miss the 2 s TTFT target (3.26 s) that the idle decode
// node meets (0.82 s), so the decode node goes first, the pair next as its fallback, and the
// accept is the whole pool's, reserved on the decode node. With route.decode_local_prefill off
// the pair is all there is, and it cannot meet the target.
func TestDecodeLocalPrefillPlan(t *testing.T) {
	p := newPlanner(t, Config{}, nil)
	v := &View{BlockTokens: 16}
	v.Add(peer("p", func(p *route.Peer) { p.Role = route.RolePrefill; p.QueuedPrefillTokens = 24000 }), false)
	v.Add(peer("d", func(p *route.Peer) { p.Role = route.RoleDecode }), false)
	req := request(8000, func(r *admit.Request) { r.TTFTSLO = 2 * time.Second })

	var pl Plan
	p.Ingress(t0, req, v, &pl)
	if pl.SplitWhy != route.WholePrefillBehind || len(pl.Cands) != 2 || pl.Cands[0].Name != "d" || pl.Cands[0].Pair != nil ||
		pl.Cands[1].Pair == nil {
		t.Fatalf("why %q, candidates %s; want %q, d whole then the pair", pl.SplitWhy, route.Explain(pl.Cands, 3), route.WholePrefillBehind)
	}
	if pl.D.Action != admit.Accept || pl.D.Option != 0 || pl.D.Split || pl.D.Role != "" ||
		!slices.Equal(pl.D.Pools(), []string{admit.PoolWhole}) {
		t.Fatalf("decision %v %s option %d split %v role %q pools %v (%s), want accepted whole on d", pl.D.Action, pl.D.Code,
			pl.D.Option, pl.D.Split, pl.D.Role, pl.D.Pools(), pl.D.Message)
	}
	if pl.Res.Peer != "d" || pl.ResDecode.Peer != "" {
		t.Errorf("reservations %+v and %+v, want the whole request's on d", pl.Res, pl.ResDecode)
	}
	p.Release(&pl)

	cfg := p.Policy().Config()
	cfg.DecodeLocalPrefill = new(bool)
	if err := p.Policy().SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	pl = Plan{}
	p.Ingress(t0, req, v, &pl)
	if pl.SplitWhy != route.SplitNoMixed || pl.D.Action != admit.Refuse || pl.D.Code != admit.CodeSLOUnattainable {
		t.Fatalf("off: why %q, %v %s (%s); want split and refused %s", pl.SplitWhy, pl.D.Action, pl.D.Code, pl.D.Message, admit.CodeSLOUnattainable)
	}
}
