package meshview

import (
	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/gossip"
)

// PeerOf maps a member's record into routing's view of it: the one place a field of
// gossip.State becomes a signal routing reads. TestPeerOfMapsEveryField fails for a field of
// the record that is neither mapped here nor named as read elsewhere (recordNotRouted in its test).
func PeerOf(m *gossip.Member) route.Peer {
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
