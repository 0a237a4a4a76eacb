package route

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

// loraPeer is an idle peer serving base model "m" with slots adapter slots, the adapters
// resident in a slot, and known adapters it lists (as peerOf maps a record: every adapter
// among the models).
func loraPeer(name string, slots int, resident []string, known ...string) Peer {
	p := idle(name)
	p.LoRASlots = slots
	p.LoRAFree = max(slots-len(resident), 0)
	p.ResidentAdapters = resident
	p.Models = append(append(p.Models, resident...), known...)
	p.AdaptersCut = true // it serves more adapters than it lists
	return p
}

func adapterReq(adapter string, prompt int) Request {
	r := req(prompt)
	r.Model, r.Parent = adapter, "m"
	return r
}

// TestAdapterRouting pins the adapter term: a request for an adapter prefers a peer with it
// resident, then one with a free slot (a peer with none is busy for it: seatless); a popular adapter's holder whose queue
// costs more than a load gives the request to a free slot; a base model's request has no
// adapter term.
func TestAdapterRouting(t *testing.T) {
	queued := func(p Peer, tokens int) Peer { p.QueuedPrefillTokens = tokens; return p }
	tests := []struct {
		name      string
		req       Request
		peers     []Peer
		want      []string // candidates, best first
		residency []Residency
	}{
		{"resident, then free slot; a swap waits (seatless)",
			adapterReq("a1", 512),
			[]Peer{loraPeer("swap", 2, []string{"x", "y"}), loraPeer("free", 2, []string{"x"}), loraPeer("res", 2, []string{"a1", "x"})},
			[]string{"res", "free"},
			[]Residency{ResidencyResident, ResidencyFreeSlot}},
		{"a holder a load's worth busier than a free slot gives way",
			adapterReq("a1", 512),
			[]Peer{queued(loraPeer("res", 2, []string{"a1"}), 8000), loraPeer("free", 2, nil)},
			[]string{"free", "res"},
			[]Residency{ResidencyFreeSlot, ResidencyResident}},
		{"a holder with a short queue keeps it",
			adapterReq("a1", 512),
			[]Peer{queued(loraPeer("res", 2, []string{"a1"}), 1000), loraPeer("free", 2, nil)},
			[]string{"res", "free"},
			[]Residency{ResidencyResident, ResidencyFreeSlot}},
		{"a peer whose every slot a running adapter holds comes after one with a slot",
			adapterReq("a1", 512),
			[]Peer{loraPeer("seatless", 1, []string{"x"}), queued(loraPeer("free", 1, nil), 6000)},
			[]string{"free"},
			[]Residency{ResidencyFreeSlot}},
		{"a peer of the base model without adapter slots does not run it",
			adapterReq("a1", 512),
			[]Peer{idle("noslots"), loraPeer("free", 1, nil)},
			[]string{"free"},
			[]Residency{ResidencyFreeSlot}},
		{"nor does one that lists all its adapters, and not this one",
			adapterReq("a1", 512),
			[]Peer{func() Peer { p := loraPeer("all", 2, nil, "b1"); p.AdaptersCut = false; return p }(), loraPeer("cut", 2, nil)},
			[]string{"cut"},
			[]Residency{ResidencyFreeSlot}},
		{"one that lists it runs it, its list whole",
			adapterReq("a1", 512),
			[]Peer{func() Peer { p := loraPeer("lists", 2, nil, "a1"); p.AdaptersCut = false; return p }()},
			[]string{"lists"},
			[]Residency{ResidencyFreeSlot}},
		{"a base model's request has no adapter term",
			req(512),
			[]Peer{loraPeer("res", 2, []string{"a1"}), loraPeer("free", 2, nil)},
			nil, // either: they tie
			[]Residency{ResidencyNone, ResidencyNone}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRouter(t, nil)
			got := mustRoute(t, r, t0, tt.req, tt.peers)
			if tt.want != nil && !slices.Equal(names(got), tt.want) {
				t.Fatalf("order %v, want %v (%s)", names(got), tt.want, Explain(got, len(got)))
			}
			for i, c := range got {
				if tt.want != nil && c.Terms.Residency != tt.residency[i] {
					t.Errorf("%s: residency %v, want %v", c.Name, c.Terms.Residency, tt.residency[i])
				}
				if tt.want == nil && c.Terms.Residency != ResidencyNone {
					t.Errorf("%s: residency %v for a base model's request", c.Name, c.Terms.Residency)
				}
			}
		})
	}
}

// TestSeatlessPeerIsBusy pins that a peer whose every adapter slot holds a running request's
// adapter is busy for another adapter's request (the engine would skip it until a slot
// drains, and count it as queued for everyone there): with no slot anywhere the request waits
// (a busy NoCandidateError); it stays a candidate for a resident adapter and a base model's
// request, and for policies that keep busy peers.
func TestSeatlessPeerIsBusy(t *testing.T) {
	full := loraPeer("full", 2, []string{"x", "y"}) // LoRAFree 0: x and y running
	tests := []struct {
		name string
		req  Request
		keep bool
		want []string // nil: every host busy
	}{
		{"another adapter waits", adapterReq("a1", 512), false, nil},
		{"a resident adapter runs", adapterReq("x", 512), false, []string{"full"}},
		{"a base model's request runs", req(512), false, []string{"full"}},
		{"a policy that keeps busy peers sends it", adapterReq("a1", 512), true, []string{"full"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rq := tt.req
			rq.KeepBusy = tt.keep
			got, err := newRouter(t, nil).Route(t0, rq, []Peer{full}, nil)
			if tt.want == nil {
				var nc *NoCandidateError
				if !errors.As(err, &nc) || !nc.Busy() {
					t.Fatalf("got %v, %v: want every host busy", names(got), err)
				}
				return
			}
			if err != nil || !slices.Equal(names(got), tt.want) {
				t.Fatalf("got %v, %v: want %v", names(got), err, tt.want)
			}
		})
	}
}

// TestSheddableLeavesTheLastSlots pins that a sheddable request of an adapter not resident on
// a peer finds it busy while Config.AdapterSheddableSlots or fewer slots are free there (the
// slot it would take stays its adapter's for its whole reply, shutting the other classes'
// adapters out); the other classes and a resident adapter take any free slot.
func TestSheddableLeavesTheLastSlots(t *testing.T) {
	withFree := func(free int, resident ...string) Peer {
		p := loraPeer("p", 8, resident)
		p.LoRAFree = free
		return p
	}
	batch := func(r Request) Request { r.Priority = -1; return r }
	tests := []struct {
		name     string
		req      Request
		peer     Peer
		headroom int // Config.AdapterSheddableSlots; 0: the default
		busy     bool
	}{
		{"sheddable, one slot free: left to the others", batch(adapterReq("a1", 512)), withFree(1), 0, true},
		{"sheddable, two slots free: takes one", batch(adapterReq("a1", 512)), withFree(2), 0, false},
		{"interactive, one slot free: takes it", adapterReq("a1", 512), withFree(1), 0, false},
		{"sheddable, its adapter resident", batch(adapterReq("a1", 512)), withFree(0, "a1"), 0, false},
		{"sheddable, no headroom configured", batch(adapterReq("a1", 512)), withFree(1), -1, false},
		{"sheddable, headroom of 2", batch(adapterReq("a1", 512)), withFree(2), 2, true},
		{"a base model's sheddable request", batch(req(512)), withFree(0, "x"), 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRouter(t, func(c *Config) {
				if tt.headroom != 0 {
					c.AdapterSheddableSlots = tt.headroom
				}
			})
			got, err := r.Route(t0, tt.req, []Peer{tt.peer}, nil)
			var nc *NoCandidateError
			if busy := errors.As(err, &nc) && nc.Busy(); busy != tt.busy {
				t.Fatalf("got %v, %v: want busy %v", names(got), err, tt.busy)
			}
		})
	}
}

// TestSheddableWaitsForResidency pins Config.AdapterSheddableSlack: a sheddable request of
// an adapter not resident on a peer finds the peer busy while more than the slack bound is
// left of its own target (it waits in the room for a peer its adapter is resident on), and
// takes a free slot once its slack runs low; an interactive request, a resident adapter, an
// unknown slack (a plain router's request) and a negative bound take the slot at once.
func TestSheddableWaitsForResidency(t *testing.T) {
	withFree := func(free int, resident ...string) Peer {
		p := loraPeer("p", 8, resident)
		p.LoRAFree = free
		return p
	}
	sheddable := func(r Request, slack time.Duration) Request { r.Priority, r.Slack = -1, slack; return r }
	a1 := adapterReq("a1", 512)
	tests := []struct {
		name  string
		req   Request
		peer  Peer
		bound time.Duration // Config.AdapterSheddableSlack; 0: the default (10 s)
		busy  bool
	}{
		{"sheddable, 20s of slack: waits for its adapter", sheddable(a1, 20*time.Second), withFree(6), 0, true},
		{"sheddable, 10s of slack: takes a free slot", sheddable(a1, 10*time.Second), withFree(6), 0, false},
		{"sheddable, 4s of slack: takes a free slot", sheddable(a1, 4*time.Second), withFree(6), 0, false},
		{"sheddable, its adapter resident: runs at once", sheddable(a1, 20*time.Second), withFree(6, "a1"), 0, false},
		{"sheddable, slack unknown: takes a free slot", sheddable(a1, 0), withFree(6), 0, false},
		{"sheddable, a bound of 25s", sheddable(a1, 20*time.Second), withFree(6), 25 * time.Second, false},
		{"sheddable, no bound configured", sheddable(a1, 20*time.Second), withFree(6), -1, false},
		{"interactive, 20s of slack: takes a free slot", func() Request { r := a1; r.Slack = 20 * time.Second; return r }(), withFree(6), 0, false},
		{"a base model's sheddable request", sheddable(req(512), 20*time.Second), withFree(6), 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRouter(t, func(c *Config) {
				if tt.bound != 0 {
					c.AdapterSheddableSlack = tt.bound
				}
			})
			got, err := r.Route(t0, tt.req, []Peer{tt.peer}, nil)
			var nc *NoCandidateError
			if busy := errors.As(err, &nc) && nc.Busy(); busy != tt.busy {
				t.Fatalf("got %v, %v: want busy %v", names(got), err, tt.busy)
			}
		})
	}
}

// TestAdapterLoadPriced pins the predicted TTFT of a peer the adapter is not resident on: it
// carries Config.AdapterLoadTime, and the explain header names the residency.
func TestAdapterLoadPriced(t *testing.T) {
	r := newRouter(t, func(c *Config) { c.AdapterLoadTime = 300 * time.Millisecond })
	res, free := loraPeer("res", 2, []string{"a1"}), loraPeer("free", 2, nil)
	cr, cf := r.Predict(adapterReq("a1", 512), &res), r.Predict(adapterReq("a1", 512), &free)
	if d := cf.PredictedTTFT - cr.PredictedTTFT; d != 300*time.Millisecond {
		t.Errorf("free slot predicts %v more than resident, want the 300ms load", d)
	}
	if !strings.Contains(cr.String(), " lora=resident ") || !strings.Contains(cf.String(), " lora=free_slot ") {
		t.Errorf("explain %q, %q: want lora=resident and lora=free_slot", cr, cf)
	}
	if base := r.Predict(req(512), &res); strings.Contains(base.String(), "lora=") {
		t.Errorf("a base model's explain %q names a residency", base)
	}
}

// TestAdapterNoHost pins that an adapter's request with no peer serving its base model with
// slots is a model miss (503 no_capacity), not a busy mesh.
func TestAdapterNoHost(t *testing.T) {
	r := newRouter(t, nil)
	_, err := r.Route(t0, adapterReq("a1", 100), []Peer{idle("n1")}, nil)
	var nc *NoCandidateError
	if !errors.As(err, &nc) || !nc.NoHost() {
		t.Fatalf("err %v: want a NoCandidateError with no host", err)
	}
}

// TestLoRAAffinityPolicy pins the baseline: resident first however loaded and whatever
// prefix another peer holds, then a free slot, then the least loaded.
func TestLoRAAffinityPolicy(t *testing.T) {
	p, err := NewPolicy(PolicyLoRAAffinity, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	res := loraPeer("res", 2, []string{"a1"})
	res.Waiting, res.Running = 40, 200
	free := loraPeer("free", 2, []string{"x"})
	free.PrefixBlocks = 30
	swapBusy := loraPeer("swapbusy", 1, []string{"y"})
	swapBusy.Running = 5
	swapIdle := loraPeer("swapidle", 1, []string{"z"})
	got := mustRoute(t, p, t0, adapterReq("a1", 512), []Peer{swapBusy, free, swapIdle, res})
	if want := []string{"res", "free", "swapidle", "swapbusy"}; !slices.Equal(names(got), want) {
		t.Errorf("order %v, want %v", names(got), want)
	}
}

// sourcePeer is a peer serving base model "m" whose node can load any adapter of an adapter
// source, as the node's view makes it for a request for adapter a1: its record lists its
// adapters whole (resident ones among them), and, when it does not list a1, a1 is added to its
// models with the node's load estimate (0: none yet).
func sourcePeer(name string, slots int, resident []string, estimate time.Duration) Peer {
	p := idle(name)
	p.LoRASlots = slots
	p.LoRAFree = max(slots-len(resident), 0)
	p.ResidentAdapters = resident
	p.Models = append(p.Models, resident...)
	if !slices.Contains(p.Models, "a1") {
		p.Models = append(p.Models, "a1")
		p.AdapterLoad = estimate
	}
	return p
}

// TestSourceAdapterResidency pins the residency of peers that load adapters from a source:
// each serving the base model is a candidate, the one with the adapter resident first, then a
// free slot, then one of unknown slots (which swaps); one whose every slot a running adapter
// holds waits (seatless); a peer's load estimate, not
// adapter_load_time, is what a non-resident peer's predicted TTFT carries, so a holder
// keeps a queue shorter than the estimate and gives way past it.
func TestSourceAdapterResidency(t *testing.T) {
	queued := func(p Peer, tokens int) Peer { p.QueuedPrefillTokens = tokens; return p }
	tests := []struct {
		name      string
		peers     []Peer
		want      []string
		residency []Residency
	}{
		{"resident, then free slot, then unknown slots; a swap waits (seatless)",
			[]Peer{queued(sourcePeer("unknown", 0, nil, 0), 500), sourcePeer("swap", 2, []string{"x", "y"}, 0),
				sourcePeer("free", 2, []string{"x"}, 0), sourcePeer("res", 2, []string{"a1", "x"}, 0)},
			[]string{"res", "free", "unknown"},
			[]Residency{ResidencyResident, ResidencyFreeSlot, ResidencySwap}},
		{"a holder whose queue costs less than the estimated load keeps it",
			[]Peer{queued(sourcePeer("res", 2, []string{"a1"}, 0), 8000), sourcePeer("free", 2, nil, 2*time.Second)},
			[]string{"res", "free"},
			[]Residency{ResidencyResident, ResidencyFreeSlot}},
		{"one whose queue costs more gives way",
			[]Peer{queued(sourcePeer("res", 2, []string{"a1"}, 0), 8000), sourcePeer("free", 2, nil, 50*time.Millisecond)},
			[]string{"free", "res"},
			[]Residency{ResidencyFreeSlot, ResidencyResident}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRouter(t, nil)
			got := mustRoute(t, r, t0, adapterReq("a1", 512), tt.peers)
			if !slices.Equal(names(got), tt.want) {
				t.Fatalf("order %v, want %v (%s)", names(got), tt.want, Explain(got, len(got)))
			}
			for i, c := range got {
				if c.Terms.Residency != tt.residency[i] {
					t.Errorf("%s: residency %v, want %v", c.Name, c.Terms.Residency, tt.residency[i])
				}
			}
		})
	}
	r := newRouter(t, nil)
	res, free := sourcePeer("res", 2, []string{"a1"}, time.Second), sourcePeer("free", 2, nil, 700*time.Millisecond)
	if d := r.Predict(adapterReq("a1", 512), &free).PredictedTTFT - r.Predict(adapterReq("a1", 512), &res).PredictedTTFT; d.Round(time.Millisecond) != 700*time.Millisecond {
		t.Errorf("a free slot predicts %v more than the holder, want its 700ms estimate", d)
	}
}
