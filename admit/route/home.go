package route

import (
	"math"
	"slices"
	"time"

	"github.com/cespare/xxhash/v2"
)

// AgentKey is the key under which a home advertises an agent (Peer.AgentKeys): the 64-bit
// xxhash of its id. With 64 bits, two agents of a mesh sharing a key is out of the question
// (a mesh advertising a million keys collides with odds of 1 in 30 million).
func AgentKey(id string) uint64 { return xxhash.Sum64String(id) }

// placement is a new agent this node placed on peer at (or last routed there) that the peer
// does not advertise yet: it counts in the peer's agent load until the peer advertises it or
// ReservationTTL passes.
type placement struct {
	peer string
	at   time.Time
}

// homeLocked is the home of a StayHome request (see Request.StayHome), or "". Among the
// healthy peers serving the model that are not ejected (eligible):
//
//  1. an eligible peer that advertises the agent (Peer.AgentKeys) is its home; if several do
//     (two ingresses placed the agent before gossip told either), the first of them in the
//     agent's rendezvous order (PreferredHome), which is also the one that keeps the agent:
//     the others release it once idle, and no ingress sends them its steps meanwhile;
//  2. else the eligible peer this node last sent the agent to (the session LRU), so a step
//     this node routes again before the home's record lists the agent, or an agent its home
//     does not list (past MaxAgentKeys), stays where it is;
//  3. else, a new agent: the first eligible peer in the agent's rendezvous order whose load
//     (Peer.Agents plus this node's placements the peer does not advertise yet) is under
//     ceil((1+HomeBalance)·(total+1)/eligible), total being the sum of the loads: consistent
//     hashing with bounded loads. The placement is remembered.
func (r *Router) homeLocked(now time.Time, req Request, peers []Peer) string {
	if !req.StayHome || req.Session == "" {
		return ""
	}
	key := AgentKey(req.Session)
	eligible := func(p *Peer) bool { return p.Healthy && !p.Ejected && req.Serves(p) }

	// 1. Advertised.
	home, top, n := "", uint64(0), 0
	for i := range peers {
		p := &peers[i]
		if !eligible(p) {
			continue
		}
		n++
		if _, ok := slices.BinarySearch(p.AgentKeys, key); !ok {
			continue
		}
		if h := rendezvous(req.Session, p.Name); home == "" || before(h, p.Name, top, home) {
			home, top = p.Name, h
		}
	}
	if home != "" {
		delete(r.placed, key)
		return home
	}
	if n == 0 {
		return ""
	}

	// 2. Remembered.
	if name, ok := r.sess.get(req.Session); ok {
		for i := range peers {
			if p := &peers[i]; p.Name == name && eligible(p) {
				if pl, ok := r.placed[key]; ok && pl.peer == name {
					r.placed[key] = placement{peer: name, at: now} // still on its way there
				}
				return name
			}
		}
	}

	// 3. New: bounded-load rendezvous.
	loads := r.agentLoadsLocked(now, peers, eligible)
	total := 0
	for _, l := range loads {
		total += l
	}
	bound := int(math.Ceil((1 + r.conf().HomeBalance) * float64(total+1) / float64(n)))
	order := r.order[:0]
	for i := range peers {
		if eligible(&peers[i]) {
			order = append(order, ranked{h: rendezvous(req.Session, peers[i].Name), name: peers[i].Name, i: i})
		}
	}
	slices.SortFunc(order, func(a, b ranked) int {
		switch {
		case before(a.h, a.name, b.h, b.name):
			return -1
		case before(b.h, b.name, a.h, a.name):
			return 1
		}
		return 0
	})
	r.order = order
	home = order[0].name // unreachable fallback: some load is always under the bound
	for _, o := range order {
		if loads[o.i] < bound {
			home = o.name
			break
		}
	}
	if len(r.placed) < r.conf().MaxSessions {
		r.placed[key] = placement{peer: home, at: now}
	}
	return home
}

// PreferredHome returns the first of peers in agent id's rendezvous order ("" for none): of
// several peers advertising the agent, the home every ingress sends its steps to, and so the
// one that keeps it when each of the others, holding it idle, asks whether to let it go.
func PreferredHome(id string, peers []string) string {
	home, top := "", uint64(0)
	for _, p := range peers {
		if h := rendezvous(id, p); home == "" || before(h, p, top, home) {
			home, top = p, h
		}
	}
	return home
}

// before reports whether the peer named a with rendezvous hash ha goes before the peer named
// b with hash hb in an agent's rendezvous order.
func before(ha uint64, a string, hb uint64, b string) bool {
	return ha > hb || ha == hb && a < b
}

// ranked is an eligible peer in an agent's rendezvous order: higher hash first, the lower
// name on a tie, so the order is total.
type ranked struct {
	h    uint64
	name string
	i    int // index into peers
}

// agentLoadsLocked returns, indexed like peers, each eligible peer's agent load: the agents it
// advertises being home to, plus this node's live placements on it that it does not advertise
// yet. It drops placements that are advertised or older than ReservationTTL.
func (r *Router) agentLoadsLocked(now time.Time, peers []Peer, eligible func(*Peer) bool) []int {
	loads := r.loads[:0]
	for i := range peers {
		p := &peers[i]
		l := 0
		if eligible(p) {
			l = max(p.Agents, len(p.AgentKeys))
		}
		loads = append(loads, l)
	}
	r.loads = loads
	for key, pl := range r.placed {
		if !now.Before(pl.at.Add(r.conf().ReservationTTL)) {
			delete(r.placed, key)
			continue
		}
		for i := range peers {
			p := &peers[i]
			if p.Name != pl.peer || !eligible(p) {
				continue
			}
			if _, ok := slices.BinarySearch(p.AgentKeys, key); ok {
				delete(r.placed, key)
			} else {
				loads[i]++
			}
			break
		}
	}
	return loads
}

// rendezvous is FNV-1a of session, a separator and peer, through the splitmix64 finalizer
// (FNV alone orders peers whose names differ in the last byte the same way for most sessions).
func rendezvous(session, peer string) uint64 {
	return mix(fnv(fnv(fnv(fnvOffset, session), "\x00"), peer))
}

// rendezvousKey is rendezvous for a 64-bit key (a prefix's, coldKey): FNV-1a of its eight
// bytes, little-endian, a separator and peer, through the finalizer. It does not allocate.
func rendezvousKey(key uint64, peer string) uint64 {
	h := uint64(fnvOffset)
	for i := 0; i < 8; i++ {
		h ^= key >> (8 * i) & 0xff
		h *= fnvPrime
	}
	return mix(fnv(fnv(h, "\x00"), peer))
}

const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// fnv continues an FNV-1a hash h over s.
func fnv(h uint64, s string) uint64 {
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= fnvPrime
	}
	return h
}

// mix is the splitmix64 finalizer.
func mix(h uint64) uint64 {
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	return h ^ h>>31
}
