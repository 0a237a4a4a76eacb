package admit

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func newRoom(t *testing.T, mutate func(*QueueConfig)) *WaitingRoom {
	t.Helper()
	c := DefaultConfig().Queue
	if mutate != nil {
		mutate(&c)
	}
	r, err := NewWaitingRoom(c)
	if err != nil {
		t.Fatalf("NewWaitingRoom: %v", err)
	}
	return r
}

func item(id, tenant string, prio, tokens int, deadline time.Duration) *Item {
	return &Item{ID: id, Model: "m", Tenant: tenant, Priority: prio, Tokens: tokens, Arrived: t0, Deadline: t0.Add(deadline)}
}

func push(t *testing.T, r *WaitingRoom, its ...*Item) {
	t.Helper()
	for _, it := range its {
		if ev, err := r.Push(t0, it); err != nil || len(ev) > 0 {
			t.Fatalf("Push(%s): evicted %d, %v", it.ID, len(ev), err)
		}
	}
}

func drainIDs(r *WaitingRoom, n int) []string {
	var out []string
	for range n {
		it, ok := r.Next(t0, nil)
		if !ok {
			break
		}
		out = append(out, it.ID)
	}
	return out
}

func TestRoomOrder(t *testing.T) {
	tests := []struct {
		name  string
		items []*Item
		want  string
	}{
		{"edf within a tenant", []*Item{item("c", "a", 0, 10, 3*time.Second), item("a", "a", 0, 10, time.Second), item("b", "a", 0, 10, 2*time.Second)}, "a b c"},
		{"fifo on equal deadlines", []*Item{item("x", "a", 0, 10, time.Second), item("y", "a", 0, 10, time.Second), item("z", "a", 0, 10, time.Second)}, "x y z"},
		{"strict priority", []*Item{item("lo", "a", -1, 10, 0), item("mid", "b", 0, 10, time.Hour), item("hi", "c", 5, 10, 2*time.Hour)}, "hi mid lo"},
		{"fair between tenants", []*Item{
			item("a1", "a", 0, 100, 1), item("a2", "a", 0, 100, 2), item("a3", "a", 0, 100, 3), item("a4", "a", 0, 100, 4),
			item("b1", "b", 0, 100, 5), item("b2", "b", 0, 100, 6),
		}, "a1 b1 a2 b2 a3 a4"},
		{"fair in tokens, not requests", []*Item{
			item("big", "a", 0, 1000, 1), item("a2", "a", 0, 1000, 2),
			item("s1", "b", 0, 250, 3), item("s2", "b", 0, 250, 4), item("s3", "b", 0, 250, 5), item("s4", "b", 0, 250, 6), item("s5", "b", 0, 250, 7),
		}, "big s1 s2 s3 s4 a2 s5"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRoom(t, nil)
			push(t, r, tt.items...)
			if got := strings.Join(drainIDs(r, len(tt.items)+1), " "); got != tt.want {
				t.Fatalf("order %q, want %q", got, tt.want)
			}
			if r.Len() != 0 {
				t.Errorf("Len %d after draining", r.Len())
			}
		})
	}
}

// TestRoomFairnessUnderFlood pins down that a tenant flooding the room does not starve a
// light one: the light tenant's requests leave at its fair share, not after the flood.
func TestRoomFairnessUnderFlood(t *testing.T) {
	r := newRoom(t, func(c *QueueConfig) { c.MaxTokens = 1 << 30 })
	for i := range 500 {
		push(t, r, item(fmt.Sprintf("flood%d", i), "flood", 0, 200, time.Duration(i)))
	}
	for i := range 10 {
		push(t, r, item(fmt.Sprintf("light%d", i), "light", 0, 200, time.Hour+time.Duration(i)))
	}
	ids := drainIDs(r, 20)
	light := 0
	for _, id := range ids {
		if strings.HasPrefix(id, "light") {
			light++
		}
	}
	if light != 10 {
		t.Fatalf("light tenant got %d of the first 20 dispatches, want 10: %v", light, ids)
	}
}

func TestRoomEviction(t *testing.T) {
	r := newRoom(t, func(c *QueueConfig) { c.MaxRequests, c.ShedFraction = 3, 1 })
	push(t, r, item("n1", "a", 0, 10, time.Second), item("l1", "a", -1, 10, time.Second), item("l2", "a", -1, 10, 2*time.Second))
	// Equal priority cannot evict.
	if _, err := r.Push(t0, item("l3", "c", -1, 10, 0)); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("equal priority newcomer: %v", err)
	}
	ev, err := r.Push(t0, item("h1", "c", 5, 10, 0))
	if err != nil || len(ev) != 1 || ev[0].ID != "l2" {
		t.Fatalf("high newcomer: evicted %v, %v; want l2 (lowest band, latest deadline)", ev, err)
	}
	if _, ok := r.Remove("l2"); ok {
		t.Error("evicted item still queued")
	}
	if got := strings.Join(drainIDs(r, 5), " "); got != "h1 n1 l1" {
		t.Errorf("order after eviction %q", got)
	}
	// Token cap: evict as many as needed, or none at all.
	r = newRoom(t, func(c *QueueConfig) { c.MaxTokens = 100 })
	push(t, r, item("a", "a", 0, 40, 0), item("b", "a", 1, 40, 0))
	if _, err := r.Push(t0, item("c", "a", 1, 70, 0)); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("evicting a still leaves 110 > 100 tokens; want a refusal: %v", err)
	}
	if r.Len() != 2 {
		t.Fatalf("a refused push evicted something: Len %d", r.Len())
	}
	ev, err = r.Push(t0, item("d", "a", 2, 60, 0))
	if err != nil || len(ev) != 1 || ev[0].ID != "a" {
		t.Fatalf("evicted %v, %v; want a", ev, err)
	}
}

func TestRoomCaps(t *testing.T) {
	t.Run("big prompt into empty pool", func(t *testing.T) {
		r := newRoom(t, func(c *QueueConfig) { c.MaxTokens = 100 })
		push(t, r, item("huge", "a", 0, 5000, 0))
		if _, err := r.Push(t0, item("small", "a", 0, 1, 0)); !errors.Is(err, ErrQueueFull) {
			t.Fatalf("pool over its token cap accepted more: %v", err)
		}
	})
	t.Run("derived token cap", func(t *testing.T) {
		r := newRoom(t, nil) // TargetTTFT 4s
		r.SetPrefillRate("m", "", 1000)
		push(t, r, item("a", "a", 0, 3000, 0))
		if _, err := r.Push(t0, item("b", "a", 0, 1001, 0)); !errors.Is(err, ErrQueueFull) {
			t.Fatalf("4001 tokens under a 4000-token derived cap: %v", err)
		}
		push(t, r, item("c", "a", 0, 1000, 0))
		if n, tok := r.Waiting("m", ""); n != 2 || tok != 4000 {
			t.Errorf("Waiting = %d, %d", n, tok)
		}
	})
	t.Run("caps are per pool", func(t *testing.T) {
		r := newRoom(t, func(c *QueueConfig) { c.MaxRequests = 1 })
		push(t, r, item("a", "a", 0, 1, 0))
		other := item("b", "a", 0, 1, 0)
		other.Role = "prefill"
		push(t, r, other)
	})
	t.Run("total cap", func(t *testing.T) {
		r := newRoom(t, func(c *QueueConfig) { c.MaxTotal = 1 })
		push(t, r, item("a", "a", 0, 1, 0))
		other := item("b", "a", 5, 1, 0)
		other.Model = "x"
		if _, err := r.Push(t0, other); !errors.Is(err, ErrQueueFull) {
			t.Fatalf("total cap: %v", err)
		}
	})
	t.Run("duplicate and empty id", func(t *testing.T) {
		r := newRoom(t, nil)
		push(t, r, item("a", "a", 0, 1, 0))
		if _, err := r.Push(t0, item("a", "a", 0, 1, 0)); err == nil {
			t.Fatal("duplicate id accepted")
		}
		if _, err := r.Push(t0, item("", "a", 0, 1, 0)); err == nil {
			t.Fatal("empty id accepted")
		}
	})
}

// TestRoomExpire pins down that a queued request leaves at its TTL and not before, and that
// the header may only shorten the TTL (Admitter.Item).
func TestRoomExpire(t *testing.T) {
	a := newAdmitter(t, func(c *Config) { c.Queue.TTL = Duration(10 * time.Second) })
	r := a.Room()
	mk := func(id string, ttl time.Duration) *Item {
		req := baseReq()
		req.ID, req.QueueTTL = id, ttl
		return a.Item(req, Decision{Tenant: "t", MaxTokens: 100, ExpectedTokens: 100})
	}
	push(t, r, mk("default", 0), mk("short", 2*time.Second), mk("long", time.Hour))
	if got := r.Expire(t0.Add(2*time.Second - 1)); len(got) != 0 {
		t.Fatalf("expired early: %v", got)
	}
	got := r.Expire(t0.Add(2 * time.Second))
	if len(got) != 1 || got[0].ID != "short" {
		t.Fatalf("at 2s expired %v, want short", got)
	}
	got = r.Expire(t0.Add(10 * time.Second))
	if len(got) != 2 || r.Len() != 0 {
		t.Fatalf("at 10s expired %d (the 1h header must be cut to the 10s TTL), Len %d", len(got), r.Len())
	}
	d := a.Expired(t0)
	if d.Code != CodeQueueTTLExpired || d.Status != 429 || d.RetryAfter <= 0 {
		t.Errorf("Expired() = %+v", d)
	}
}

func TestRoomRequeueAndRemove(t *testing.T) {
	r := newRoom(t, nil)
	push(t, r, item("a", "x", 0, 10, time.Second), item("b", "x", 0, 10, 2*time.Second), item("c", "y", 0, 10, 3*time.Second))
	it, _ := r.Next(t0, nil)
	if it.ID != "a" {
		t.Fatalf("first %s", it.ID)
	}
	r.Requeue(it)
	r.Requeue(it) // twice is harmless
	if r.Len() != 3 {
		t.Fatalf("Len %d after requeue", r.Len())
	}
	if got := strings.Join(drainIDs(r, 1), " "); got != "a" {
		t.Fatalf("requeued item lost its place: %q first", got)
	}
	if _, ok := r.Remove("c"); !ok {
		t.Fatal("Remove(c) not found")
	}
	if _, ok := r.Remove("c"); ok {
		t.Fatal("Remove twice found it")
	}
	if got := strings.Join(drainIDs(r, 5), " "); got != "b" {
		t.Fatalf("after remove: %q", got)
	}
}

// TestRoomCanRun pins down that a head that cannot run blocks its own pool only, and that
// what waits behind it runs only when backfill is on and canRun lets it run beside the head.
func TestRoomCanRun(t *testing.T) {
	tests := []struct {
		name     string
		backfill int
		beside   bool // canRun's answer for an item offered behind the blocked head
		want     string
	}{
		{"strictly head of line", -1, true, "o1"},
		{"backfill beside the head", 8, true, "small o1"},
		{"backfill would take the head's room", 8, false, "o1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRoom(t, func(c *QueueConfig) { c.Backfill = tt.backfill })
			other := item("o1", "a", 0, 10, 0)
			other.Model = "other"
			push(t, r, item("big", "a", 5, 10, 0), item("small", "a", 0, 10, 0), other)
			canRun := func(it, head *Item) bool {
				switch {
				case it.ID == "big":
					return false
				case it.ID == "small" && head == nil:
					t.Error("small was asked as the head of its pool")
				case it.ID == "small" && head.ID != "big":
					t.Errorf("small was offered behind %s, want big", head.ID)
				case it.ID == "small":
					return tt.beside
				}
				return true
			}
			var got []string
			for {
				it, ok := r.Next(t0, canRun)
				if !ok {
					break
				}
				got = append(got, it.ID)
			}
			if strings.Join(got, " ") != tt.want {
				t.Fatalf("dispatched %q, want %q (big blocks pool m)", strings.Join(got, " "), tt.want)
			}
			want := "big small"
			if strings.Contains(tt.want, "small") {
				want = "big"
			}
			if rest := strings.Join(drainIDs(r, 3), " "); rest != want {
				t.Fatalf("after unblocking: %q, want %q", rest, want)
			}
		})
	}
}

// TestRoomBackfillOrder pins the order and the bound of the items offered behind a blocked
// head: higher priority first, earliest deadline first inside a band, across tenants, at most
// QueueConfig.Backfill of them.
func TestRoomBackfillOrder(t *testing.T) {
	r := newRoom(t, func(c *QueueConfig) { c.Backfill = 4 })
	push(t, r,
		item("head", "a", 1, 10, 0),
		item("lo1", "a", -1, 10, time.Second),
		item("n3", "b", 0, 10, 3*time.Second),
		item("n1", "a", 0, 10, time.Second),
		item("hi", "c", 1, 10, 5*time.Second),
		item("n2", "c", 0, 10, 2*time.Second),
		item("n4", "b", 0, 10, 4*time.Second),
	)
	var offered []string
	if _, ok := r.Next(t0, func(it, head *Item) bool {
		if head != nil {
			offered = append(offered, it.ID)
		}
		return false
	}); ok {
		t.Fatal("dispatched although canRun refused everything")
	}
	if got := strings.Join(offered, " "); got != "hi n1 n2 n3" {
		t.Fatalf("offered behind the head: %q, want %q", got, "hi n1 n2 n3")
	}
}

func TestRoomRetryAfter(t *testing.T) {
	r := newRoom(t, nil) // window 10s, clamp [1s, 60s]
	if got := r.RetryAfter(t0); got != time.Second {
		t.Fatalf("empty room: %v", got)
	}
	for i := range 20 {
		push(t, r, item(fmt.Sprint(i), "a", 0, 1000, time.Duration(i)))
	}
	if got := r.RetryAfter(t0); got != 60*time.Second {
		t.Fatalf("not draining: %v, want the 60s maximum", got)
	}
	// Dispatch 10 items (10000 tokens) over 10 s: 1000 tokens/s; 10000 tokens remain: 10 s.
	for i := range 10 {
		if _, ok := r.Next(t0.Add(time.Duration(i+1)*time.Second), nil); !ok {
			t.Fatal("Next failed")
		}
	}
	got := r.RetryAfter(t0.Add(10 * time.Second))
	if got < 9*time.Second || got > 12*time.Second {
		t.Fatalf("RetryAfter %v, want about 10s from the drain rate", got)
	}
	// Long after, the window is empty again: not draining.
	if got := r.RetryAfter(t0.Add(time.Hour)); got != 60*time.Second {
		t.Fatalf("stale window: %v", got)
	}
}

func TestRoomGauges(t *testing.T) {
	r := newRoom(t, nil)
	push(t, r, item("a", "a", 0, 10, 0), item("b", "b", 0, 20, 0), item("c", "a", -1, 5, 0))
	tok, req := r.QueuedTokens(), r.QueuedRequests()
	if tok[0] != 30 || tok[-1] != 5 || req[0] != 2 || req[-1] != 1 || len(tok) != 2 {
		t.Fatalf("QueuedTokens %v QueuedRequests %v", tok, req)
	}
}

// TestOverloadHighServedLowShed drives Check and the room together through an overload: the
// candidate's KV is full, every class arrives, and as room frees the high-priority requests
// are dispatched first while sheddable ones are refused or evicted, never run ahead.
func TestOverloadHighServedLowShed(t *testing.T) {
	a := newAdmitter(t, func(c *Config) { c.Queue.MaxRequests = 20 })
	full := Option{Peer: "n1", PredictedTTFT: 100 * time.Millisecond, FreeKVBlocks: 0, TotalKVBlocks: 1000, PrefillTokensPerSecond: 1e6}
	counts := map[string]map[string]int{}
	count := func(class, what string) {
		if counts[class] == nil {
			counts[class] = map[string]int{}
		}
		counts[class][what]++
	}
	prios := []int{-10, 0, 10}
	for i := range 60 {
		req := baseReq()
		req.ID = fmt.Sprint("r", i)
		req.Priority = prios[i%3]
		req.TTFTSLO = time.Minute
		req.Arrived = t0.Add(time.Duration(i) * time.Millisecond)
		d := a.Check(req.Arrived, req, []Option{full})
		class := Class(req.Priority)
		switch d.Action {
		case Refuse:
			count(class, "refused")
		case Queue:
			ev, err := a.Room().Push(req.Arrived, a.Item(req, d))
			if err != nil {
				count(class, "refused")
			} else {
				count(class, "queued")
			}
			for _, e := range ev {
				count(Class(e.Priority), "evicted")
			}
		default:
			t.Fatalf("accepted with full KV: %+v", d)
		}
	}
	if d := a.Evicted(t0); d.Code != CodeQueueFull || d.Status != 429 || d.Message != evictedMessage || d.Layer != LayerPriority {
		t.Errorf("Evicted() = %+v", d)
	}
	if counts["high"]["queued"] != 20 || counts["high"]["refused"] != 0 {
		t.Fatalf("high: %v", counts["high"])
	}
	if counts["low"]["refused"] == 0 || counts["low"]["evicted"]+counts["low"]["refused"] < 20 {
		t.Fatalf("low not shed: %v", counts["low"])
	}
	// Room frees: dispatch order must put every high first.
	roomy := full
	roomy.FreeKVBlocks = 1000
	now := t0.Add(time.Second)
	var order []string
	for {
		it, ok := a.Room().Next(now, func(it, _ *Item) bool { return a.Ready(now, it, []Option{roomy}).Action == Accept })
		if !ok {
			break
		}
		order = append(order, Class(it.Priority))
	}
	if len(order) != 20 {
		t.Fatalf("dispatched %d, want the 20 queued", len(order))
	}
	for i, c := range order {
		if c != "high" {
			t.Fatalf("dispatch %d was %s: %v", i, c, order)
		}
	}
}
