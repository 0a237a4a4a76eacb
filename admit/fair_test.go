package admit

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// TestAheadFollowsFairQueueing pins the work priced ahead of a new request: its own tenant's
// earlier deadlines, and of another tenant's backlog only what fair queueing serves before it.
// A flooding tenant's next request sees its whole backlog; a polite tenant's sees one item.
func TestAheadFollowsFairQueueing(t *testing.T) {
	r := newRoom(t, nil)
	for i := range 10 {
		push(t, r, item(fmt.Sprint("a", i), "flood", 0, 5000, time.Duration(i)*time.Millisecond))
	}
	push(t, r, item("hi", "x", 5, 700, time.Second)) // a higher band is always ahead
	late := time.Minute
	if n, tokens := r.ahead("m", "", "flood", 0, t0.Add(late)); n != 11 || tokens != 50700 {
		t.Errorf("flooding tenant: %d requests and %d tokens ahead, want 11 and 50700", n, tokens)
	}
	if n, tokens := r.ahead("m", "", "polite", 0, t0.Add(late)); n != 2 || tokens != 5700 {
		t.Errorf("polite tenant: %d requests and %d tokens ahead, want 2 and 5700", n, tokens)
	}
	// With one tenant the order is earliest deadline first.
	if n, tokens := r.ahead("m", "", "flood", 0, t0.Add(4500*time.Microsecond)); n != 6 || tokens != 25700 {
		t.Errorf("flooding tenant, early deadline: %d requests and %d tokens ahead, want 6 and 25700", n, tokens)
	}
}

// TestFullRoomRefusesTheTenantOverItsShare: with the room at its cap, a request of a tenant
// holding less of its band than another takes the room of that tenant's latest work; the
// heaviest tenant's own next request is refused; nothing of a higher band is touched.
func TestFullRoomRefusesTheTenantOverItsShare(t *testing.T) {
	r := newRoom(t, func(c *QueueConfig) { c.MaxRequests = 4 })
	for i := range 4 {
		push(t, r, item(fmt.Sprint("a", i), "flood", 0, 100, time.Duration(i)*time.Millisecond))
	}
	if ok, _ := r.canQueue("m", "", "polite", 0, 100); !ok {
		t.Fatal("canQueue refused the polite tenant")
	}
	ev, err := r.Push(t0, item("p0", "polite", 0, 100, time.Second))
	if err != nil || len(ev) != 1 || ev[0].ID != "a3" {
		t.Fatalf("polite push: evicted %v, %v; want the flood's latest, a3", ids(ev), err)
	}
	if ok, _ := r.canQueue("m", "", "flood", 0, 100); ok {
		t.Error("canQueue let the flooding tenant back in")
	}
	if _, err := r.Push(t0, item("a4", "flood", 0, 100, time.Second)); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("flood push: %v, want ErrQueueFull", err)
	}
	// Two tenants at an even share: the third request of either is refused, not traded.
	if _, err := r.Push(t0, item("p1", "polite", 0, 100, time.Second)); err != nil {
		t.Fatalf("polite's second push: %v", err)
	}
	if _, err := r.Push(t0, item("p2", "polite", 0, 100, time.Second)); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("polite's third push at an even share: %v, want ErrQueueFull", err)
	}
	// A full room of one band does not evict a higher band for fairness.
	hr := newRoom(t, func(c *QueueConfig) { c.MaxRequests = 2 })
	push(t, hr, item("h0", "flood", 5, 100, 0), item("h1", "flood", 5, 100, time.Millisecond))
	if _, err := hr.Push(t0, item("p", "polite", 0, 100, time.Second)); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("push below a full higher band: %v, want ErrQueueFull", err)
	}
}

func ids(its []*Item) []string {
	var out []string
	for _, it := range its {
		out = append(out, it.ID)
	}
	return out
}

// TestAPoliteTenantIsNotRefusedForAFlood: the same pool and candidates; a tenant whose 20
// queued requests make its own next one late is refused slo_unattainable, while a tenant with
// nothing queued is queued behind the one item fair queueing serves first.
func TestAPoliteTenantIsNotRefusedForAFlood(t *testing.T) {
	a := newAdmitter(t, nil)
	for i := range 20 {
		it := item(fmt.Sprint("a", i), "flood", 0, 2000, time.Duration(i)*time.Millisecond)
		if _, err := a.Room().Push(t0, it); err != nil {
			t.Fatal(err)
		}
	}
	opt := idle()
	opt.PredictedTTFT = 500 * time.Millisecond // 10k tokens/s: the flood's 40k tokens are 4 s
	flood := baseReq()
	flood.Tenant, flood.Arrived = "flood", t0.Add(time.Second)
	if d := a.Admit(t0.Add(time.Second), flood, []Option{opt}); d.Code != CodeSLOUnattainable {
		t.Errorf("flooding tenant: %v %s, want slo_unattainable", d.Action, d.Code)
	}
	polite := flood
	polite.Tenant = "polite"
	if d := a.Admit(t0.Add(time.Second), polite, []Option{opt}); d.Action != Queue || d.Code != CodeWaitBehind {
		t.Errorf("polite tenant: %v %s (%s), want queued behind", d.Action, d.Code, d.Message)
	}
}
