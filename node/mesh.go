package node

import (
	"cmp"
	"net/http"
	"slices"
	"time"

	"github.com/kvmesh/kvmesh/admit/plan"
	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/kvindex"
	"github.com/kvmesh/kvmesh/node/engine"
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
		HalvesOnly:             n.cfg.Role == route.RoleDecode && !n.localPrefill(),
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
		InFlightTokens:         int(n.inFlightTokens.Load()),
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
		if f, learned := n.tok.BytesPerToken(m.Name); learned {
			mi.BytesPerToken = f
		}
		s.Models = append(s.Models, mi)
	}
	fillAdapters(&s, n.withLoaded(models), st.LoRA, n.loadedAdapters())
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
func (n *Node) homeHere(v *view, agent string) {
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

// peerOf maps a member's record into routing's view of it: the one place a field of
// gossip.State becomes a signal routing reads. TestPeerOfMapsEveryField fails for a field of
// the record that is neither mapped here nor named as read elsewhere (recordNotRouted).
func peerOf(m *gossip.Member) route.Peer {
	s := &m.State
	p := route.Peer{
		Name:                   m.Name,
		Self:                   m.Self,
		Age:                    m.Age,
		Stale:                  m.Stale,
		MaxAge:                 m.MaxAge,
		Healthy:                s.EngineHealthy,
		Role:                   s.Role,
		WholeOnly:              s.EngineKind != "sim" && !route.IsHalf(s.Role), // an external engine splits only in a role
		HalvesOnly:             s.HalvesOnly,
		Vendor:                 s.Vendor,
		VRAMTotalBytes:         s.VRAMTotalBytes,
		KVBlocksTotal:          s.KVBlocksTotal,
		KVBlocksUsed:           s.KVBlocksUsed,
		HitRate:                s.HitRate,
		Running:                s.Running,
		Waiting:                s.Waiting,
		MaxRunning:             s.MaxRunning,
		QueuedPrefillTokens:    s.QueuedPrefillTokens,
		PriorityScheduling:     s.PriorityScheduling,
		QueuedBeforeHigh:       s.QueuedBeforeHigh,
		QueuedLowWaiting:       s.QueuedLowWaiting,
		InFlightTokens:         s.InFlightTokens,
		PrefillTokensPerSecond: s.PrefillTokensPerSecond,
		DecodeStepSeconds:      s.DecodeStepSeconds,
		PowerWatts:             s.PowerWatts,
		PowerCapWatts:          s.PowerCapWatts,
		TempC:                  s.TempC,
		CarbonIntensity:        s.CarbonIntensity,
		Agents:                 s.Agents,
		AgentKeys:              s.AgentKeys,
		LoRASlots:              s.LoRASlots,
		LoRAFree:               s.LoRAFree,
		AdaptersCut:            len(s.Adapters) >= gossip.MaxAdapters, // the engine may serve more
	}
	if s.VRAMTotalBytes >= s.VRAMUsedBytes {
		p.VRAMFreeBytes = s.VRAMTotalBytes - s.VRAMUsedBytes
	}
	for _, mi := range s.Models {
		p.Models = append(p.Models, mi.Name)
	}
	for _, a := range s.Adapters {
		p.Models = append(p.Models, a.Name) // the node runs an adapter's requests
		if a.Resident {
			p.ResidentAdapters = append(p.ResidentAdapters, a.Name)
		}
	}
	return p
}

// view is one routing decision's picture of the mesh: the planner's view (this node first,
// with its exact state, then the peers as gossiped) and where to reach each peer.
type view struct {
	plan.View
	quic    []string // QUIC address per peer ("" for this node)
	matches []kvindex.Match
	members []gossip.Member // scratch for gossip.MembersServing
	claimed map[string]int  // scratch for gossip.ClaimedAhead
}

// ticket is one request's pass through the planner: its view and its plan.
type ticket struct {
	v view
	plan.Plan
}

// buildView fills v for a request for model whose prompt hashes to blocks; agent, when set,
// is the request's agent; r is its rank against the other ingresses' KV claims (claims.go).
// The view holds this node and the peers serving model only (gossip's index by model), so a
// decision costs the model's peers, not the mesh's. For an adapter's request (parent set, its
// base model) the view holds its base model's nodes: every node listing the adapter serves
// it, any with adapter slots can load it, and with an adapter source every node serving the
// base loads it on demand (withSourceAdapter).
func (n *Node) buildView(v *view, model, parent string, blocks []uint64, agent string, r rank) {
	v.Reset(n.blockTokens())
	v.quic = v.quic[:0]
	self := n.localState()
	selfMember := gossip.Member{Name: n.cfg.Name, Liveness: gossip.LivenessAlive, State: self, Self: true, Candidate: true}
	v.add(&selfMember, "", n.carbonDirty(self), false)
	// Each record clears the reservations and refusals it already reflects (route.Observe);
	// this node's own state is read live.
	policy := n.planner.Policy()
	now := time.Now()
	policy.Observe(n.cfg.Name, now)
	serving := cmp.Or(parent, model)
	if n.g != nil {
		v.members = n.g.MembersServing(v.members[:0], serving)
		for i := range v.members {
			m := &v.members[i]
			if !m.Candidate && !m.Stale {
				continue
			}
			policy.Observe(m.Name, m.Updated)
			v.add(m, m.State.QUICAddr, n.carbonDirty(m.State), n.eject.Ejected(now, m.Name))
		}
		clear(v.members) // drop the records' references until the next decision
		// The room other ingresses' heads claim for requests that outrank this one is taken.
		if v.claimed == nil {
			v.claimed = make(map[string]int)
		}
		clear(v.claimed)
		n.g.ClaimedAhead(v.claimed, r.priority, r.arrived, "")
		for i := range v.Peers {
			v.Peers[i].KVBlocksUsed += v.claimed[v.Peers[i].Name]
		}
		v.matches = n.g.LongestPrefix(blocks, v.matches[:0])
		for _, mt := range v.matches {
			for i := range v.Peers {
				if v.Peers[i].Name == mt.Peer {
					v.Peers[i].PrefixBlocks = mt.Blocks
				}
			}
		}
	}
	if parent != "" && n.inSource(model) {
		n.withSourceAdapter(v, model, parent)
	}
	if agent != "" {
		n.homeHere(v, agent)
	}
}

// exclude marks the peers named in names ejected, for this view's request alone: the owners
// that failed it mid-response (migrate.go).
func (v *view) exclude(names []string) {
	for i := range v.Peers {
		if slices.Contains(names, v.Peers[i].Name) {
			v.Peers[i].Ejected = true
		}
	}
}

// add appends m; ejected marks a peer this node's forwards cannot reach lately (route.Ejector).
func (v *view) add(m *gossip.Member, quic string, dirty, ejected bool) {
	p := peerOf(m)
	p.Ejected = ejected
	v.Add(p, dirty)
	v.quic = append(v.quic, quic)
}

// selfPeer is this node as routing sees it, from its engine's exact state, holding the
// longest prefix of blocks its own index lists: what the owner's check judges a forwarded
// request against.
func (n *Node) selfPeer(blocks []uint64) route.Peer {
	self := gossip.Member{Name: n.cfg.Name, Liveness: gossip.LivenessAlive, State: n.localState(), Self: true, Candidate: true}
	p := peerOf(&self)
	p.KVBlocksUsed += int(n.testKVOwnerHeld.Load())
	if n.g != nil {
		for _, mt := range n.g.LongestPrefix(blocks, nil) {
			if mt.Peer == n.cfg.Name {
				p.PrefixBlocks = mt.Blocks
			}
		}
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
	return n.sourceAdapter(models, model)
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
	return n.meshSourceAdapter(model)
}

// servedInMesh returns model as this node's engine or some peer's record lists it.
func (n *Node) servedInMesh(model string) (engine.Model, bool) {
	if m, ok := n.localModel(model); ok {
		return m, true
	}
	if n.g == nil {
		return engine.Model{}, false
	}
	for _, m := range n.g.Members() {
		if m.Liveness != gossip.LivenessAlive {
			continue
		}
		for _, mi := range m.State.Models {
			if mi.Name == model {
				return engine.Model{Name: model, ContextTokens: mi.ContextTokens}, true
			}
		}
		if a, ok := adapterOf(&m.State, model); ok {
			return a, true
		}
	}
	return engine.Model{}, false
}

// meshModels lists the models served anywhere in the mesh this node sees.
func (n *Node) meshModels() []engine.Model {
	seen := map[string]bool{}
	var out []engine.Model
	for _, m := range n.eng.Models() {
		seen[m.Name] = true
		out = append(out, m)
	}
	if n.g != nil {
		for _, m := range n.g.Members() {
			if m.Liveness != gossip.LivenessAlive {
				continue
			}
			for _, mi := range m.State.Models {
				if !seen[mi.Name] {
					seen[mi.Name] = true
					out = append(out, engine.Model{Name: mi.Name, ContextTokens: mi.ContextTokens})
				}
			}
			for _, a := range m.State.Adapters {
				if am, ok := adapterOf(&m.State, a.Name); ok && !seen[a.Name] {
					seen[a.Name] = true
					out = append(out, am)
				}
			}
		}
	}
	return out
}

// PeerInfo is one node in GET /v1/mesh/peers.
type PeerInfo struct {
	Name         string  `json:"name"`
	Self         bool    `json:"self"`
	GossipAddr   string  `json:"gossip_addr"`
	HTTPAddr     string  `json:"http_addr"`
	QUICAddr     string  `json:"quic_addr"`
	Liveness     string  `json:"liveness"`
	AgeSeconds   float64 `json:"age_seconds"`
	Stale        bool    `json:"stale"`
	Candidate    bool    `json:"candidate"`
	Incarnation  uint32  `json:"incarnation"`
	PrefixBlocks int     `json:"prefix_blocks"`

	Models                 []gossip.ModelInfo `json:"models"`
	Role                   string             `json:"role"`
	EngineKind             string             `json:"engine_kind"`
	HalvesOnly             bool               `json:"halves_only"`
	MessagesNative         bool               `json:"messages_native"`
	EngineHealthy          bool               `json:"engine_healthy"`
	BlockTokens            int                `json:"block_tokens"`
	KVBlocksTotal          int                `json:"kv_blocks_total"`
	KVBlocksUsed           int                `json:"kv_blocks_used"`
	KVUse                  float64            `json:"kv_use"`
	HitRate                float64            `json:"hit_rate"`
	Running                int                `json:"running"`
	Waiting                int                `json:"waiting"`
	QueuedPrefillTokens    int                `json:"queued_prefill_tokens"`
	PriorityScheduling     bool               `json:"priority_scheduling"`
	QueuedBeforeHigh       int                `json:"queued_before_high"`
	QueuedLowWaiting       int                `json:"queued_low_waiting"`
	InFlightTokens         int                `json:"in_flight_tokens"`
	PrefillTokensPerSecond float64            `json:"prefill_tokens_per_second"`
	DecodeStepSeconds      float64            `json:"decode_step_seconds"`
	MaxRunning             int                `json:"max_running"`
	PowerWatts             float64            `json:"power_watts"`
	PowerCapWatts          float64            `json:"power_cap_watts"`
	TempC                  float64            `json:"temp_c"`
	VRAMTotalBytes         uint64             `json:"vram_total_bytes"`
	VRAMUsedBytes          uint64             `json:"vram_used_bytes"`
	Vendor                 string             `json:"vendor"`
	GPUName                string             `json:"gpu_name"`
	CarbonIntensity        float64            `json:"carbon_intensity"`
	CarbonZone             string             `json:"carbon_zone"`
	CarbonAgeSeconds       float64            `json:"carbon_age_seconds"`
	CarbonStale            bool               `json:"carbon_stale"`
	SoftwareVersion        string             `json:"software_version"`
	Seq                    uint64             `json:"seq"`
	// Claims are the KV room this node's waiting room holds on peers for its blocked heads.
	Claims []gossip.Claim `json:"claims,omitempty"`
	// Adapters are the LoRA adapters the node's engine serves (at most 16, resident ones
	// first), LoRASlots its adapter slots (0: unknown) and LoRAFree those no adapter holds.
	Adapters  []gossip.Adapter `json:"adapters"`
	LoRASlots int              `json:"lora_slots"`
	LoRAFree  int              `json:"lora_free"`
}

// PeersResponse is the body of GET /v1/mesh/peers.
type PeersResponse struct {
	Node  string     `json:"node"`
	Peers []PeerInfo `json:"peers"`
	// JoinFailing says why the node serves alone, while it cannot join its seeds (a wrong
	// gossip key, the seeds down); absent otherwise.
	JoinFailing string `json:"join_failing,omitempty"`
}

func peerInfo(m *gossip.Member) PeerInfo {
	s := &m.State
	pi := PeerInfo{
		Name: m.Name, Self: m.Self, GossipAddr: m.Addr, HTTPAddr: s.HTTPAddr, QUICAddr: s.QUICAddr,
		Liveness: string(m.Liveness), AgeSeconds: m.Age.Seconds(), Stale: m.Stale, Candidate: m.Candidate,
		Incarnation: m.Incarnation, PrefixBlocks: m.PrefixBlocks,
		Models: s.Models, Role: s.Role, EngineKind: s.EngineKind, HalvesOnly: s.HalvesOnly, EngineHealthy: s.EngineHealthy,
		MessagesNative: s.MessagesNative, BlockTokens: s.BlockTokens, KVBlocksTotal: s.KVBlocksTotal, KVBlocksUsed: s.KVBlocksUsed,
		HitRate: s.HitRate, Running: s.Running, Waiting: s.Waiting, QueuedPrefillTokens: s.QueuedPrefillTokens,
		PriorityScheduling: s.PriorityScheduling, QueuedBeforeHigh: s.QueuedBeforeHigh, QueuedLowWaiting: s.QueuedLowWaiting,
		InFlightTokens: s.InFlightTokens, PrefillTokensPerSecond: s.PrefillTokensPerSecond,
		DecodeStepSeconds: s.DecodeStepSeconds, MaxRunning: s.MaxRunning, PowerWatts: s.PowerWatts,
		PowerCapWatts: s.PowerCapWatts, TempC: s.TempC, VRAMTotalBytes: s.VRAMTotalBytes,
		VRAMUsedBytes: s.VRAMUsedBytes, Vendor: s.Vendor, GPUName: s.GPUName,
		CarbonIntensity: s.CarbonIntensity, CarbonZone: s.CarbonZone, CarbonAgeSeconds: s.CarbonAgeSeconds,
		CarbonStale: s.CarbonStale, SoftwareVersion: s.SoftwareVersion, Seq: s.Seq, Claims: s.Claims,
		Adapters: s.Adapters, LoRASlots: s.LoRASlots, LoRAFree: s.LoRAFree,
	}
	if pi.Adapters == nil {
		pi.Adapters = []gossip.Adapter{}
	}
	if s.KVBlocksTotal > 0 {
		pi.KVUse = float64(s.KVBlocksUsed) / float64(s.KVBlocksTotal)
	}
	if pi.Models == nil {
		pi.Models = []gossip.ModelInfo{}
	}
	return pi
}

func (n *Node) handlePeers(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, n.peers())
}

// peers is this node's view of the mesh: the body of GET /v1/mesh/peers.
func (n *Node) peers() PeersResponse {
	resp := PeersResponse{Node: n.cfg.Name, Peers: []PeerInfo{}, JoinFailing: n.joinFailing()}
	if n.g == nil {
		self := gossip.Member{Name: n.cfg.Name, Liveness: gossip.LivenessAlive, State: n.localState(), Self: true, Candidate: true, Updated: time.Now()}
		resp.Peers = append(resp.Peers, peerInfo(&self))
	} else {
		for _, m := range n.g.Members() {
			resp.Peers = append(resp.Peers, peerInfo(&m))
		}
	}
	return resp
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
