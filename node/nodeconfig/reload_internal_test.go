package nodeconfig

import (
	"slices"
	"testing"
	"time"
)

// TestChanges pins which changed settings a reload applies and which wait for a restart:
// admission and route settings are live, except those whose state is built once (the
// router's seed); node settings need a restart; carbon's tracker is live only while carbon
// runs and stays on. Restarts count against the settings the node started with, live changes
// against those last loaded.
func TestChanges(t *testing.T) {
	started := DefaultConfig()
	cc := DefaultCarbonConfig()
	started.Carbon = &cc
	next := started
	next.HTTPAddr = ":9090"
	next.Route.BusyKVUse = 0.5
	next.Route.Seed = 7
	next.Admit.Queue.MaxRequests = 5
	ncc := cc
	ncc.Tracker.Threshold = 123
	next.Carbon = &ncc
	for _, tt := range []struct {
		name          string
		last          Config
		carbonLive    bool
		restart, live []string
	}{
		{"carbon running", started, true,
			[]string{"node.http_addr", "route.advanced.seed"},
			[]string{"admission.queue.max_requests", "carbon.tracker.threshold", "route.busy_kv_use"}},
		{"carbon not running", started, false,
			[]string{"carbon.tracker.threshold", "node.http_addr", "route.advanced.seed"},
			[]string{"admission.queue.max_requests", "route.busy_kv_use"}},
		{"live settings already loaded", next, true,
			[]string{"node.http_addr", "route.advanced.seed"}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			restart, live, err := Changes(started, tt.last, next, tt.carbonLive)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(restart, tt.restart) || !slices.Equal(live, tt.live) {
				t.Errorf("restart %q, live %q; want %q, %q", restart, live, tt.restart, tt.live)
			}
		})
	}
}

// TestReread pins a reload's reading of the file: over the defaults, not over the running
// settings, keeping the node's name, TLS and standalone mode, with the overrides applied after
// the file, and validated.
func TestReread(t *testing.T) {
	running := DefaultConfig()
	running.Name, running.Standalone, running.RetryAfter = "n", true, 9*time.Second
	running.Overrides = func(c *Config) error { c.ForwardAttempts = 7; return nil }
	next, err := Reread([]byte(`{"node": {"forward_attempts": 2, "drain_timeout": "1m"}}`), running, nil)
	if err != nil {
		t.Fatal(err)
	}
	if next.Name != "n" || !next.Standalone || next.ForwardAttempts != 7 || next.DrainTimeout != time.Minute ||
		next.RetryAfter != DefaultConfig().RetryAfter {
		t.Errorf("reread %+v", next)
	}
	if _, err := Reread([]byte(`{"node": {"admission_mode": "maybe"}}`), running, nil); err == nil {
		t.Error("an invalid file reread without an error")
	}
}
