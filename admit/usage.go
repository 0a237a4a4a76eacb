package admit

import (
	"cmp"
	"encoding/binary"
	"math"
	"slices"
	"sync"
	"time"
)

// A key's rate holds across the mesh, without a coordinator: every ingress measures what each
// rate-limited key consumed through it (an exponential moving rate, UseWindow), publishes the
// heaviest ones in its gossiped state record (Keys.Usage), and learns from the others' records
// what the key consumed elsewhere (Keys.SetRemote). A key's bucket on this ingress then refills
// at its rate less the rest of the mesh's consumption, never under MinShare of it, so a client
// spreading its requests over N ingresses gets about its rate in all, not N times it.
//
// The bound: remote figures are as old as gossip (a state record at least every second, plus
// UseWindow's smoothing), so a client that shifts load between ingresses faster than that gets
// up to about one window's worth of extra tokens per shift, and a key outside an ingress's top
// MaxKeyUsage is enforced on that ingress alone. A remote figure not refreshed within
// RemoteTTL is dropped (its ingress left, or the key went quiet there).
const (
	// UseWindow is the time constant of the consumption rate each ingress measures.
	UseWindow = time.Second
	// RemoteTTL is how long a remote consumption figure counts without a refresh.
	RemoteTTL = 3 * time.Second
	// MinShare is the least share of its rate a key keeps on an ingress, whatever the mesh
	// reports: a stale or wrong figure cannot lock a key out.
	MinShare = 0.05
)

// KeyUsage is one key's consumption on one ingress: ID, the first 8 bytes of the key's
// SHA-256 (never the key), and its rate in tokens per second.
type KeyUsage struct {
	ID              uint64
	TokensPerSecond float64
}

// meshUse is a key's consumption here (a decaying rate) and elsewhere (the sum of the rates
// other ingresses last reported). Safe for concurrent use.
type meshUse struct {
	mu       sync.Mutex
	local    float64 // tokens per second through this ingress, as of at
	at       time.Time
	remote   float64 // tokens per second through the other ingresses
	remoteAt time.Time
}

// decayLocked ages the local rate to now.
func (u *meshUse) decayLocked(now time.Time) {
	if !u.at.IsZero() && now.After(u.at) {
		u.local *= math.Exp(-float64(now.Sub(u.at)) / float64(UseWindow))
	}
	if now.After(u.at) {
		u.at = now
	}
}

// add records tokens consumed here at now.
func (u *meshUse) add(now time.Time, tokens int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.decayLocked(now)
	u.local += float64(tokens) / UseWindow.Seconds()
}

// share is the rate this ingress may grant a key of rate r at now.
func (u *meshUse) share(now time.Time, r float64) float64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.remoteAt.IsZero() || now.Sub(u.remoteAt) > RemoteTTL {
		return r
	}
	return max(r-u.remote, r*MinShare)
}

// rate is the local consumption rate at now.
func (u *meshUse) rate(now time.Time) float64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.decayLocked(now)
	return u.local
}

func (u *meshUse) setRemote(now time.Time, tps float64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.remote, u.remoteAt = tps, now
}

// carry takes over prev's figures (a key kept across a reload).
func (u *meshUse) carry(prev *meshUse) {
	prev.mu.Lock()
	defer prev.mu.Unlock()
	u.local, u.at, u.remote, u.remoteAt = prev.local, prev.at, prev.remote, prev.remoteAt
}

// keyID is the gossiped id of a key: the first 8 bytes of its SHA-256.
func keyID(hash [32]byte) uint64 { return binary.BigEndian.Uint64(hash[:8]) }

// Usage returns the heaviest at most max rate-limited keys consumed through this ingress, at
// least one token per second each, heaviest first: what its state record publishes.
func (k *Keys) Usage(now time.Time, max int) []KeyUsage {
	k.mu.Lock()
	keys := slices.Clone(k.keys)
	k.mu.Unlock()
	var out []KeyUsage
	for _, st := range keys {
		if st.limiter == nil {
			continue
		}
		if r := st.use.rate(now); r >= 1 {
			out = append(out, KeyUsage{ID: keyID(st.hash), TokensPerSecond: r})
		}
	}
	slices.SortFunc(out, func(a, b KeyUsage) int {
		return cmp.Or(cmp.Compare(b.TokensPerSecond, a.TokensPerSecond), cmp.Compare(a.ID, b.ID))
	})
	if len(out) > max {
		out = out[:max]
	}
	return out
}

// SetRemote records, at now, what each key consumed on the other ingresses: the sum of their
// latest published figures, by KeyUsage.ID. A key absent from remote consumed nothing there.
func (k *Keys) SetRemote(now time.Time, remote map[uint64]float64) {
	k.mu.Lock()
	keys := slices.Clone(k.keys)
	k.mu.Unlock()
	for _, st := range keys {
		if st.limiter != nil {
			st.use.setRemote(now, remote[keyID(st.hash)])
		}
	}
}
