package route

import "slices"

// LoRA adapters. A request whose Model names an adapter carries its base model in
// Request.Parent. A peer runs it when it lists the adapter among its models, or when it serves
// the base model with adapter slots (Peer.LoRASlots) and more adapters than its record lists
// (Peer.AdaptersCut): the adapter may be among those past the record's bound, and the
// engine then answers for it as for any other. Where the adapter stands on a peer is its
// Residency: resident (in a GPU slot, it runs at once), a free slot (a slot no running
// request's adapter holds, empty or holding an idle adapter the engine evicts: it loads the
// adapter and runs the request) or a swap (every slot holds a running request's adapter: the
// engine makes the request wait until one drains, so the peer is busy for it, see seatless).
// The score's adapter term is 1, 0.5 or 0 for the three, blended with the load terms;
// the predicted TTFT of a peer the adapter is not resident on carries Config.AdapterLoadTime,
// so the load gate moves a popular adapter's requests to a second holder, or a free slot,
// once its holder's queue costs more than a load.
//
// The prefix term needs nothing of its own: a request's blocks are hashed from its model
// name (kvindex), so an adapter's requests match only blocks cached by the same adapter's
// requests, never the base model's or another adapter's, as engines key their prefix caches
// by adapter.

// Residency is where a request's adapter stands on a candidate (Terms.Residency).
type Residency uint8

// Residencies, in order of preference.
const (
	ResidencyNone     Residency = iota // not an adapter request
	ResidencyResident                  // the adapter holds a GPU slot on the peer
	ResidencyFreeSlot                  // it does not, and a slot is free
	ResidencySwap                      // every slot is taken: it replaces another adapter
	NumResidencies
)

var residencyNames = [NumResidencies]string{"", "resident", "free_slot", "swap"}

// String is the residency's metric label value ("" for ResidencyNone).
func (r Residency) String() string {
	if r < NumResidencies {
		return residencyNames[r]
	}
	return "unknown"
}

// Serves reports whether p runs req's model: it lists it, or req names an adapter whose base
// model p serves with adapter slots and more adapters than it lists.
func (req *Request) Serves(p *Peer) bool {
	return slices.Contains(p.Models, req.Model) ||
		req.Parent != "" && p.AdaptersCut && p.LoRASlots > 0 && slices.Contains(p.Models, req.Parent)
}

// residency is where req's adapter stands on p.
func residency(req *Request, p *Peer) Residency {
	switch {
	case req.Parent == "":
		return ResidencyNone
	case slices.Contains(p.ResidentAdapters, req.Model):
		return ResidencyResident
	case p.LoRAFree > 0:
		return ResidencyFreeSlot
	}
	return ResidencySwap
}

// seatless reports that req's adapter has no slot on p now: every slot holds the adapter of a
// running request, and req's is not among them. An engine batches at most its slots' worth of
// adapters and skips such a request until one of them drains, which takes as long as that
// adapter's longest running reply, and meanwhile counts it among its waiting requests and
// queued prefill, which every other request's predicted TTFT there then prices although it is
// not ahead of them. So the peer is busy for req (busyAt): it waits in the waiting room, where
// its deadline orders it, for a slot anywhere.
//
// A sheddable request finds no slot either where Config.AdapterSheddableSlots or fewer are
// free, nor, while more than Config.AdapterSheddableSlack of its slack is left, where its
// adapter is not resident: the slot it would take stays its adapter's for its whole reply,
// while an interactive request of an adapter resident nowhere has a fraction of a second to
// find one. Its long target lets it wait in the room for a peer its adapter is resident on
// (brought there by the adapter's next interactive request, which it then runs beside) and
// take a free slot only once its slack runs low.
func seatless(cfg *Config, req *Request, p *Peer) bool {
	if req.Parent == "" || p.LoRASlots <= 0 {
		return false
	}
	switch residency(req, p) {
	case ResidencySwap:
		return true
	case ResidencyFreeSlot:
		return req.Priority < 0 && (p.LoRAFree <= cfg.AdapterSheddableSlots ||
			cfg.AdapterSheddableSlack > 0 && req.Slack > cfg.AdapterSheddableSlack)
	}
	return false
}

// adapterTerm is the score's adapter term of a residency, in [0,1].
func adapterTerm(r Residency) float64 {
	switch r {
	case ResidencyResident:
		return 1
	case ResidencyFreeSlot:
		return 0.5
	}
	return 0
}

// adapterLoad is the time the engine spends bringing req's adapter into a slot on a peer
// where it stands at r.
func adapterLoad(cfg *Config, p *Peer, r Residency) float64 {
	if p.AdapterLoad > 0 {
		return p.AdapterLoad.Seconds()
	}
	if r == ResidencyFreeSlot || r == ResidencySwap {
		return cfg.AdapterLoadTime.Seconds()
	}
	return 0
}
