package gossip

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/memberlist"
)

// Name conflicts: a second process with a member's name (a cloned host, a restored backup).
// memberlist keeps the address it holds for a live member and refuses an alive message that
// claims the name from another address (NotifyConflict); gossip holds the member's records to
// the same address (State.GossipAddr, originLocked), so the process that had the name keeps it
// and its traffic. A process that finds, joining, its own name held by a live member at
// another address refuses to start (ErrNameConflict) after telling that member (msgConflict).
// Each side logs an ERROR and counts kvmesh_gossip_name_conflicts_total.

// ErrNameConflict: a live member at another address already has this node's name.
var ErrNameConflict = errors.New("gossip: name conflict")

// Sides of a conflict, the label values of kvmesh_gossip_name_conflicts_total.
const (
	conflictSelf   = "self"   // another process claims this node's name
	conflictMember = "member" // two processes claim a member's name
)

// conflictLogEvery bounds the ERROR lines of one conflict (a member and the address refused),
// which repeats with each record and push/pull of the second process.
const conflictLogEvery = time.Minute

// conflicts adapts memberlist.ConflictDelegate to Gossip.
type conflicts struct{ g *Gossip }

// NotifyConflict is memberlist refusing other, which claims existing's name from another
// address. existing is this node when other claims this node's name.
func (c conflicts) NotifyConflict(existing, other *memberlist.Node) {
	g := c.g
	g.mu.Lock()
	defer g.mu.Unlock()
	if existing.Name == g.cfg.Name {
		if g.selfConflict == nil {
			o := *other
			g.selfConflict = &o
		}
		g.conflictLocked(conflictSelf, existing.Name, existing.Address(), other.Address(), time.Now())
		return
	}
	g.conflictLocked(conflictMember, existing.Name, existing.Address(), other.Address(), time.Now())
}

// conflictLocked counts a conflict over name between the process at kept and the one at
// refused, and logs it at most once a conflictLogEvery for that pair.
func (g *Gossip) conflictLocked(side, name, kept, refused string, now time.Time) {
	g.met.conflicts.WithLabelValues(side).Inc()
	key := side + "\x00" + name + "\x00" + refused
	if at, ok := g.conflictLog[key]; ok && now.Sub(at) < conflictLogEvery {
		return
	}
	for k, at := range g.conflictLog {
		if now.Sub(at) >= conflictLogEvery {
			delete(g.conflictLog, k)
		}
	}
	g.conflictLog[key] = now
	if side == conflictSelf {
		g.log.Error("name conflict: another process claims this node's name; peers keep the process that had it",
			"member", name, "addr", kept, "other_addr", refused)
		return
	}
	g.log.Error("name conflict: two processes claim one member's name; keeping the one this node knew",
		"member", name, "addr", kept, "refused_addr", refused)
}

// refuseIfTaken runs after Start's first join: if a member at another address held this node's
// name and answers there, it is told (msgConflict) and this node refuses to start. One that
// does not answer is taken for this node's own earlier process, gone (a restart on a new
// address): memberlist gives the name over once it holds that member dead.
func (g *Gossip) refuseIfTaken(ml *memberlist.Memberlist) error {
	g.mu.Lock()
	other := g.selfConflict
	g.mu.Unlock()
	if other == nil {
		return nil
	}
	msg := appendConflict([]byte{wireVersion, msgConflict}, g.cfg.Name, g.bootID, ml.LocalNode().Address())
	if err := ml.SendReliable(other, msg); err != nil {
		g.log.Warn("a member with this node's name did not answer at its address; joining as its restart",
			"other_addr", other.Address(), "err", err)
		return nil
	}
	return fmt.Errorf("%w: a live member at %s is named %q (another process with this node's name: a cloned host or a restored backup?)",
		ErrNameConflict, other.Address(), g.cfg.Name)
}

// handleConflict is a msgConflict: a process that found this node's name taken and refused to
// start.
func (g *Gossip) handleConflict(b []byte) {
	name, boot, addr, err := decodeConflict(b)
	if err != nil {
		g.drop(dropMalformed)
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if name != g.cfg.Name || boot == g.bootID {
		g.drop(dropNameConflict)
		return
	}
	g.conflictLocked(conflictSelf, name, g.selfAddr, addr, time.Now())
}

// appendConflict appends a msgConflict body: the name, the sender's boot id and address.
func appendConflict(b []byte, name string, boot uint64, addr string) []byte {
	b = binary.AppendUvarint(b, uint64(len(name)))
	b = append(b, name...)
	b = binary.LittleEndian.AppendUint64(b, boot)
	b = binary.AppendUvarint(b, uint64(len(addr)))
	return append(b, addr...)
}

func decodeConflict(b []byte) (name string, boot uint64, addr string, err error) {
	bad := fmt.Errorf("%w: conflict notice", ErrMalformed)
	l, n := binary.Uvarint(b)
	if n <= 0 || l == 0 || l > maxNameBytes || uint64(len(b)-n) < l+8 {
		return "", 0, "", bad
	}
	name, b = string(b[n:n+int(l)]), b[n+int(l):]
	boot, b = binary.LittleEndian.Uint64(b), b[8:]
	l, n = binary.Uvarint(b)
	if n <= 0 || l > 256 || uint64(len(b)-n) != l {
		return "", 0, "", bad
	}
	return name, boot, string(b[n:]), nil
}
