package route

import (
	"encoding/binary"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestExplain(t *testing.T) {
	c := Candidate{Name: "n2", Score: 0.82, PredictedTTFT: 120*time.Millisecond + 300*time.Microsecond, PredictedTPOT: 20 * time.Millisecond,
		Terms: Terms{PrefixTokens: 1536, Load: 0.1, FreeKV: 0.55}}
	if got, want := c.String(), "n2 score=0.820 prefix=1536 load=0.10 kv=0.55 ttft=120ms tpot=20ms"; got != want {
		t.Fatalf("String() = %q, want %q", got, want)
	}
	g := Candidate{Name: "bad\r\nname", Gated: true, Terms: Terms{ReservedTokens: 9, Thermal: 0.5}}
	got := Explain([]Candidate{c, g, c}, 2)
	want := "n2 score=0.820 prefix=1536 load=0.10 kv=0.55 ttft=120ms tpot=20ms; bad__name score=0.000 prefix=0 load=0.00 kv=0.00 rsv=9 hot=0.50 ttft=0s tpot=0s gated"
	if got != want {
		t.Fatalf("Explain = %q, want %q", got, want)
	}
	if Explain(nil, 3) != "" {
		t.Fatal("Explain of nothing is not empty")
	}
	for r := range NumReasons + 1 {
		if s := r.String(); s == "" || strings.ContainsAny(s, " \n") {
			t.Fatalf("reason %d has label %q", r, s)
		}
	}
}

// The scoring loop must not allocate: dst is reused and reservations are looked up in place.
func TestRouteDoesNotAllocate(t *testing.T) {
	r := newRouter(t, nil)
	peers := idlePeers(64)
	for i := range peers {
		peers[i].PrefixBlocks = i % 7 * 16
		peers[i].InFlightTokens = i * 300
		if i%3 == 0 {
			r.Reserve(t0, peers[i].Name, 512, 40)
		}
	}
	dst := make([]Candidate, 0, len(peers))
	rq := req(2048)
	allocs := testing.AllocsPerRun(100, func() {
		var err error
		dst, err = r.Route(t0, rq, peers, dst)
		if err != nil || len(dst) != 64 {
			t.Fatalf("Route: %d candidates, %v", len(dst), err)
		}
	})
	if allocs != 0 {
		t.Fatalf("Route allocated %v times per call", allocs)
	}
	if c := r.Counts(); c != (FilterCounts{}) {
		t.Fatalf("unexpected drops %v", c)
	}
}

// FuzzRoute drives Route with arbitrary peer states and checks its invariants: it never
// panics, every peer is either a candidate once or counted once, and the first candidate is
// never gated while ungated candidates precede gated ones.
func FuzzRoute(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, uint16(2048))
	f.Add(make([]byte, 64), uint16(0))
	f.Fuzz(func(t *testing.T, data []byte, prompt uint16) {
		r := newRouter(t, func(c *Config) { c.ModelBytes = map[string]uint64{"m": 40 << 30} })
		var peers []Peer
		for len(data) >= 16 {
			b := data[:16]
			data = data[16:]
			p := idle(string(rune('a' + len(peers))))
			if b[0]&1 == 1 {
				p.Models = []string{"z"}
			}
			p.Stale = b[0]&2 != 0
			p.Healthy = b[0]&4 == 0
			p.Self = b[0]&8 != 0
			if b[0]&16 != 0 {
				p.VRAMTotalBytes = 24 << 30
			}
			p.KVBlocksTotal = int(b[1]) * 10
			p.KVBlocksUsed = int(b[2]) * 10
			p.QueuedPrefillTokens = int(binary.LittleEndian.Uint16(b[3:])) - 1000
			p.InFlightTokens = int(binary.LittleEndian.Uint16(b[5:]))
			p.PrefixBlocks = int(b[7]) - 10
			p.PrefillTokensPerSecond = float64(b[8]) * 100
			p.DecodeStepSeconds = float64(b[9]) / 1000
			p.Running, p.MaxRunning = int(b[10]), int(b[11])
			p.PowerWatts, p.PowerCapWatts = float64(b[12])*4, float64(b[13])*4
			p.TempC = float64(b[14])
			if b[15]&1 != 0 {
				r.Reserve(t0, p.Name, int(b[15])*50, int(b[15]))
			}
			peers = append(peers, p)
		}
		c, err := r.Route(t0, req(int(prompt)), peers, nil)
		counts := r.Counts()
		dropped := 0
		for _, n := range counts {
			dropped += n
		}
		if dropped+len(c) != len(peers) {
			t.Fatalf("%d dropped + %d candidates != %d peers", dropped, len(c), len(peers))
		}
		if err != nil {
			if _, ok := err.(*NoCandidateError); !ok || len(c) != 0 {
				t.Fatalf("error %v with %d candidates", err, len(c))
			}
			return
		}
		seen := map[int]bool{}
		for i, x := range c {
			if seen[x.Peer] || peers[x.Peer].Name != x.Name {
				t.Fatalf("candidate %d (%v) duplicated or misnamed", i, x)
			}
			seen[x.Peer] = true
			if i > 0 && c[i-1].Gated && !x.Gated {
				t.Fatalf("ungated after gated: %s", Explain(c, len(c)))
			}
		}
		if c[0].Gated {
			t.Fatalf("first candidate gated: %s", Explain(c, len(c)))
		}
	})
}

// A Router is shared by every request handler of a node: Route, Reserve, Observe, Release and
// Stick run concurrently (run with -race), and the reservations balance out.
func TestConcurrentUse(t *testing.T) {
	r := newRouter(t, nil)
	peers := idlePeers(8)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			dst := make([]Candidate, 0, len(peers))
			rq := req(1024)
			rq.Session = fmt.Sprintf("s%d", g)
			for i := range 200 {
				now := t0.Add(time.Duration(i) * time.Millisecond)
				var err error
				if dst, err = r.Route(now, rq, peers, dst); err != nil {
					t.Error(err)
					return
				}
				res := r.Reserve(now, dst[0].Name, 10, 1)
				if i%2 == 0 {
					r.Release(res)
				}
				r.Observe(dst[len(dst)-1].Name, now)
				r.Stick(rq.Session, dst[0].Name)
			}
		})
	}
	wg.Wait()
	total := 0
	for _, p := range peers {
		tok, _, _ := r.Reserved(t0.Add(time.Hour), p.Name)
		total += tok
	}
	if total != 0 {
		t.Fatalf("%d tokens still reserved after the TTL", total)
	}
}

// TestSetConfig pins that a running policy takes a new config at once, keeps the seed and
// session bound it was built with, and refuses an invalid one whole.
func TestSetConfig(t *testing.T) {
	for _, name := range PolicyNames {
		p, err := NewPolicy(name, Config{Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		if err := p.SetConfig(Config{BusyKVUse: 0.8, Seed: 9, MaxSessions: 5, Weights: Weights{FreeKV: 2}}); err != nil {
			t.Fatal(err)
		}
		got := p.Config()
		if got.BusyKVUse != 0.8 || got.Weights.FreeKV != 2 || got.Weights.Prefix != DefaultConfig().Weights.Prefix {
			t.Errorf("%s: busy kv use %v, weights %+v after SetConfig", name, got.BusyKVUse, got.Weights)
		}
		if got.Seed != 1 || got.MaxSessions != DefaultConfig().MaxSessions {
			t.Errorf("%s: seed %d, max sessions %d; want the built ones", name, got.Seed, got.MaxSessions)
		}
		peer := Peer{Name: "p", Models: []string{"m"}, Healthy: true, KVBlocksTotal: 100}
		if s := p.Predict(Request{Model: "m"}, &peer).Score; s < 2 {
			t.Errorf("%s: score %v does not use the free_kv weight of 2", name, s)
		}
		if err := p.SetConfig(Config{BusyKVUse: 2}); err == nil || p.Config().BusyKVUse != 0.8 {
			t.Errorf("%s: SetConfig with busy_kv_use 2: %v, busy kv use now %v", name, err, p.Config().BusyKVUse)
		}
	}
}
