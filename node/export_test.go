package node

import (
	"context"
	"errors"
	"io"
	"time"

	"github.com/kvmesh/kvmesh/admit/agent"
	"github.com/kvmesh/kvmesh/node/transport"
)

// KillTransport closes the node's QUIC transport abruptly, as a crashed process would, while
// gossip still lists the node as alive: peers' forwards to it fail until they notice.
func (n *Node) KillTransport() error { return n.tr.Close() }

// Dial forwards an empty request to addr over the node's transport, as the ingress would to
// an owner there, and returns how it failed.
func (n *Node) Dial(ctx context.Context, addr string) error {
	_, err := n.tr.Forward(ctx, addr, transport.Header{RequestID: "dial", Hops: 1}, nil)
	return err
}

// OpenTenant is every request's tenant while no API key file is loaded.
const OpenTenant = "default"

// RegisterAgent registers agent id of OpenTenant at this node as its home, as if one step of
// it had run here: what an ingress that placed it here before gossip told it otherwise leaves
// behind.
func (n *Node) RegisterAgent(id string) error {
	var err error
	n.agents.WithHome(func(h *agent.Home) {
		now, id := time.Now(), agent.Scoped(OpenTenant, id)
		if _, err = h.Arrive(now, id, 100); err == nil {
			h.StepDone(now, id, 110, false, nil)
		}
	})
	return err
}

// RefreshMeshTokens takes the peers' published bytes per token now, as the room loop does
// once a second.
func (n *Node) RefreshMeshTokens() { n.tokens.Refresh(n.mesh) }

// HoldKV makes the node report blocks more KV blocks used than its engine holds: in its state
// record and its owner's check (gossiped), or in its owner's check alone, as a node whose room
// changed since its last record would (!gossiped). 0 ends it.
func (n *Node) HoldKV(blocks int, gossiped bool) {
	if gossiped {
		n.testKVHeld.Store(int64(blocks))
		return
	}
	n.testKVOwnerHeld.Store(int64(blocks))
}

// PeerKVUsed is the KV blocks peer's last state record, as this node holds it, says are used
// (-1: no record).
func (n *Node) PeerKVUsed(peer string) int {
	for _, m := range n.g.Members() {
		if m.Name == peer {
			return m.State.KVBlocksUsed
		}
	}
	return -1
}

// ClaimedOn is the KV room the other nodes' records claim on peer (their waiting rooms'
// blocked heads) ahead of a normal request of unknown arrival, as this node's routing counts it.
func (n *Node) ClaimedOn(peer string) int {
	m := map[string]int{}
	n.g.ClaimedAhead(m, 0, time.Time{}, "")
	return m[peer]
}

// ForwardWhole forwards body, a chat completion, to peer's owner as an ingress forwards a
// whole request (no prefill mark, no handover), and returns the owner's answer: its status
// and body, or its refusal's status and code.
func (n *Node) ForwardWhole(ctx context.Context, peer, body string) (status int, answer []byte, code string, err error) {
	addr := ""
	for _, m := range n.g.Members() {
		if m.Name == peer {
			addr = m.State.QUICAddr
		}
	}
	h := transport.Header{RequestID: "whole-" + peer, Hops: 1, Ingress: n.cfg.Name, Kind: transport.KindRequest}
	resp, err := n.tr.Forward(ctx, addr, h, []byte(body))
	if ref := (*transport.Refusal)(nil); errors.As(err, &ref) {
		return ref.Status, nil, ref.Code, nil
	}
	if err != nil {
		return 0, nil, "", err
	}
	defer resp.Body.Close()
	answer, err = io.ReadAll(resp.Body)
	return resp.Status, answer, "", err
}

// KillEngine closes the node's embedded engine, as a crash of it would: its in-flight streams
// fail and it runs nothing more, while the node lives on.
func (n *Node) KillEngine() error { return n.sim.Close() }
