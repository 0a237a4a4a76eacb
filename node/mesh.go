package node

import (
	"cmp"
	"net/http"
	"slices"
	"time"

	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/node/api"
	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/journey"
	"github.com/kvmesh/kvmesh/node/meshview"
)

// localState is this node's state record: the engine's load, what it is forwarding, its GPU
// and its grid. Gossip publishes it on change and at least every PublishInterval.
func (n *Node) localState() gossip.State {
	st := n.eng.State()
	s := gossip.State{
		Name:                   n.cfg.Name,
		HTTPAddr:               n.advertiseHTTP,
		QUICAddr:               n.advertiseQUIC,
		Role:                   n.cfg.Role,
		EngineKind:             n.engineKind(),
		HalvesOnly:             n.cfg.Role == route.RoleDecode && !n.x.LocalPrefill(),
		MessagesNative:         n.servesMessages(),
		EngineHealthy:          st.Healthy && !n.isDraining(),
		BlockTokens:            st.BlockTokens,
		KVBlocksTotal:          st.KVBlocksTotal,
		KVBlocksUsed:           st.KVBlocksUsed + int(n.testKVHeld.Load()),
		HitRate:                st.HitRate,
		Running:                st.Running,
		Waiting:                st.Waiting,
		QueuedPrefillTokens:    st.QueuedPrefillTokens,
		PriorityScheduling:     st.PriorityScheduling,
		QueuedBeforeHigh:       st.QueuedBeforeHigh,
		QueuedLowWaiting:       st.QueuedLowWaiting,
		InFlightTokens:         int(n.x.InFlightTokens()),
		PrefillTokensPerSecond: st.PrefillTokensPerSecond,
		DecodeStepSeconds:      st.DecodeStepSeconds,
		MaxRunning:             st.MaxRunning,
		SoftwareVersion:        Version,
	}
	models := n.eng.Models()
	for _, m := range models {
		if m.Parent != "" {
			continue // fillAdapters
		}
		mi := gossip.ModelInfo{Name: m.Name, ContextTokens: m.ContextTokens}
		if f, learned := n.tokens.Learned(m.Name); learned {
			mi.BytesPerToken = f
		}
		s.Models = append(s.Models, mi)
	}
	meshview.FillAdapters(&s, n.adapters.WithLoaded(models), st.LoRA, n.adapters.Loaded())
	n.fillTelemetry(&s)
	n.fillAgents(&s)
	return s
}

// publishedState is the state record gossip publishes: localState, unhealthy from the moment
// Shutdown begins, and what the heaviest rate-limited API keys consumed through this node
// (admit/usage.go), which only peers need, so routing's own reads of localState do not pay
// for it.
func (n *Node) publishedState() gossip.State {
	s := n.localState()
	// A node shutting down still runs what reaches it, but asks peers to send it nothing new.
	s.EngineHealthy = s.EngineHealthy && !n.unready.Load()
	if c := n.claims.Load(); c != nil {
		s.Claims = *c
	}
	for _, u := range n.adm.Keys().Usage(time.Now(), gossip.MaxKeyUsage) {
		s.KeyUsage = append(s.KeyUsage, gossip.KeyUsage{ID: u.ID, TokensPerSecond: u.TokensPerSecond})
	}
	return s
}

// fillAgents advertises the agents this node is home to: their count, and the keys of the
// most recently active gossip.MaxAgentKeys, by which every ingress sends their steps here.
func (n *Node) fillAgents(s *gossip.State) {
	if n.agents == nil {
		return
	}
	count, ids := n.agents.Registry().Homed(n.cfg.Name, nil, gossip.MaxAgentKeys)
	if count == 0 {
		return
	}
	s.Agents = count
	s.AgentKeys = make([]uint64, len(ids))
	for i, id := range ids {
		s.AgentKeys[i] = route.AgentKey(id)
	}
	slices.Sort(s.AgentKeys)
	s.AgentKeys = slices.Compact(s.AgentKeys)
}

// homeHere makes this node's own peer in v (always the first) list agent when this node is its
// home: its own record lists only the most recent gossip.MaxAgentKeys, but it knows them all.
func (n *Node) homeHere(v *meshview.View, agent string) {
	if n.agents == nil || agent == "" || len(v.Peers) == 0 || !v.Peers[0].Self {
		return
	}
	if ag, ok := n.agents.Registry().Get(agent); !ok || ag.Home != n.cfg.Name {
		return
	}
	p := &v.Peers[0]
	key := route.AgentKey(agent)
	if i, found := slices.BinarySearch(p.AgentKeys, key); !found {
		p.AgentKeys = slices.Insert(slices.Clone(p.AgentKeys), i, key)
	}
}

func (n *Node) engineKind() string {
	if n.sim != nil {
		return "sim"
	}
	return n.cfg.EngineKind
}

func (n *Node) isDraining() bool { return n.draining.Load() }

// servesMessages reports whether this node's engine serves the Anthropic Messages API
// natively (gossiped as State.MessagesNative).
func (n *Node) servesMessages() bool { return n.ext != nil && n.ext.ServesMessages() }

// buildView fills v for a request for model whose prompt hashes to blocks; agent, when set,
// is the request's agent; r is its rank against the other ingresses' KV claims (claims.go).
// The view holds this node, with its exact state, and the peers serving model
// (meshview.Mesh.AddPeers). For an adapter's request (parent set, its base model) the view
// holds its base model's nodes: every node listing the adapter serves it, any with adapter
// slots can load it, and with an adapter source every node serving the base loads it on
// demand (adapters.Set.WithSource).
func (n *Node) buildView(v *meshview.View, model, parent string, blocks []uint64, agent string, r meshview.Rank) {
	v.Reset(journey.BlockTokens(n.eng))
	v.Blocks = blocks
	v.QUIC = v.QUIC[:0]
	self := n.localState()
	selfMember := gossip.Member{Name: n.cfg.Name, Liveness: gossip.LivenessAlive, State: self, Self: true, Candidate: true}
	v.AddMember(&selfMember, "", n.carbonDirty(self), false)
	// Each record clears the reservations and refusals it already reflects (route.Observe);
	// this node's own state is read live.
	now := time.Now()
	n.planner.Policy().Observe(n.cfg.Name, now)
	n.mesh.AddPeers(v, cmp.Or(parent, model), blocks, r, now)
	if parent != "" && n.adapters.InSource(model) {
		n.adapters.WithSource(v, model, parent)
	}
	if agent != "" {
		n.homeHere(v, agent)
	}
}

// meshView is what this node's views are built from; New sets n.mesh to it once the parts
// are built.
func (n *Node) meshView() meshview.Mesh {
	return meshview.Mesh{Self: n.cfg.Name, Gossip: n.g, Policy: n.planner.Policy(), Eject: n.eject, Dirty: n.carbonDirty}
}

// selfPeer is this node as routing sees it, from its engine's exact state, holding the
// longest prefix of blocks its own index lists: what the owner's check judges a forwarded
// request against.
func (n *Node) selfPeer(blocks []uint64) route.Peer {
	self := gossip.Member{Name: n.cfg.Name, Liveness: gossip.LivenessAlive, State: n.localState(), Self: true, Candidate: true}
	p := meshview.PeerOf(&self)
	p.KVBlocksUsed += int(n.testKVOwnerHeld.Load())
	if b := n.mesh.SelfPrefix(blocks); b > 0 {
		p.PrefixBlocks = b
	}
	return p
}

// localModel reports whether this node's engine serves model now (an external engine's list
// changes as the engine's does).
func (n *Node) localModel(model string) (engine.Model, bool) {
	models := n.eng.Models()
	for _, m := range models {
		if m.Name == model {
			return m, true
		}
	}
	return n.adapters.Source(models, model)
}

// meshModelInfo reports whether some node in the mesh serves model, and its context size:
// one that lists it, or, for an adapter of the source, one that serves its base model.
func (n *Node) meshModelInfo(model string) (int, bool) {
	m, ok := n.meshModel(model)
	return m.ContextTokens, ok
}

// meshModel returns model as some node serves it: as this node's engine or a peer's record
// lists it, else as an adapter of the source on a served base model; for an adapter, with its
// parent.
func (n *Node) meshModel(model string) (engine.Model, bool) {
	if m, ok := n.servedInMesh(model); ok {
		return m, true
	}
	return n.adapters.MeshSource(model)
}

// servedInMesh returns model as this node's engine or some peer's record lists it.
func (n *Node) servedInMesh(model string) (engine.Model, bool) {
	if m, ok := n.localModel(model); ok {
		return m, true
	}
	return n.mesh.Served(model)
}

// meshModels lists the models served anywhere in the mesh this node sees.
func (n *Node) meshModels() []engine.Model { return n.mesh.Models(n.eng.Models()) }

// PeerInfo is one node in GET /v1/mesh/peers.
type PeerInfo = meshview.PeerInfo

// PeersResponse is the body of GET /v1/mesh/peers.
type PeersResponse = meshview.PeersResponse

func (n *Node) handlePeers(w http.ResponseWriter, r *http.Request) {
	api.WriteJSON(w, http.StatusOK, n.peers())
}

// peers is this node's view of the mesh: the body of GET /v1/mesh/peers.
func (n *Node) peers() PeersResponse {
	return n.mesh.Peers(n.localState, n.joinFailing(), time.Now())
}

// GossipAddr is the bound gossip address ("" in Standalone).
func (n *Node) GossipAddr() string {
	if n.g == nil {
		return ""
	}
	return n.g.LocalAddr()
}

// Gossip is this node's gossip member (nil in Standalone): for testnet and benchmarks, which
// drive and read prefix residency without an engine.
func (n *Node) Gossip() *gossip.Gossip { return n.g }

// Members is this node's view of the mesh (nil in Standalone).
func (n *Node) Members() []gossip.Member {
	if n.g == nil {
		return nil
	}
	return n.g.Members()
}

// joinFailing says why this node serves alone while it cannot join its seeds, or "".
func (n *Node) joinFailing() string {
	if n.g == nil {
		return ""
	}
	if err := n.g.JoinFailing(); err != nil {
		return "serving alone: cannot join the seeds: " + err.Error()
	}
	return ""
}
