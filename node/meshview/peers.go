package meshview

import (
	"time"

	"github.com/kvmesh/kvmesh/gossip"
)

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

// Info is m as GET /v1/mesh/peers shows it.
func Info(m *gossip.Member) PeerInfo {
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

// Peers is the body of GET /v1/mesh/peers: every member gossip knows, or this node alone,
// from self, without gossip; joinFailing says why the node serves alone, if it does.
func (m Mesh) Peers(self func() gossip.State, joinFailing string, now time.Time) PeersResponse {
	resp := PeersResponse{Node: m.Self, Peers: []PeerInfo{}, JoinFailing: joinFailing}
	if m.Gossip == nil {
		me := gossip.Member{Name: m.Self, Liveness: gossip.LivenessAlive, State: self(), Self: true, Candidate: true, Updated: now}
		resp.Peers = append(resp.Peers, Info(&me))
		return resp
	}
	for _, mb := range m.Gossip.Members() {
		resp.Peers = append(resp.Peers, Info(&mb))
	}
	return resp
}
