package testnet_test

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/testnet"
	"github.com/kvmesh/kvmesh/testnet/loadgen"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
	)
}

func start(t *testing.T, n int) *testnet.Net {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tn, err := testnet.Start(ctx, testnet.Config{Nodes: n, Fast: true, Configure: func(i int, cfg *node.Config) {
		cfg.Sim.TimeScale = 50
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tn.Close() })
	if err := tn.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	return tn
}

// counter sums a family's samples on a node's /metrics.
func counter(t *testing.T, url, name string) int {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	sum := 0.0
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && (f[0] == name || strings.HasPrefix(f[0], name+"{")) {
			v, _ := strconv.ParseFloat(f[1], 64)
			sum += v
		}
	}
	return int(sum)
}

func TestEveryNodeSeesTheWholeMesh(t *testing.T) {
	tn := start(t, 3)
	for _, n := range tn.Nodes {
		if got := len(n.Members()); got != 3 {
			t.Errorf("%s sees %d members", n.Name(), got)
		}
	}
}

func TestLoadRunReconcilesWithTheNodesCounters(t *testing.T) {
	tn := start(t, 1)
	cfg := loadgen.DefaultConfig()
	cfg.Targets = tn.URLs()
	cfg.Model = node.DefaultModel
	cfg.Workload = "chat"
	cfg.Rate = 40
	cfg.Duration = 500 * time.Millisecond
	rep, err := loadgen.Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Sent < 5 || rep.Sent != rep.Completed+rep.Refused+rep.Failed {
		t.Fatalf("sent %d = completed %d + refused %d + failed %d?", rep.Sent, rep.Completed, rep.Refused, rep.Failed)
	}
	url := tn.URLs()[0]
	if got := counter(t, url, "kvmesh_requests_received_total"); got != rep.Sent {
		t.Errorf("node received %d, load generator sent %d", got, rep.Sent)
	}
	if got := counter(t, url, "kvmesh_requests_completed_total"); got != rep.Completed {
		t.Errorf("node completed %d, load generator saw %d", got, rep.Completed)
	}
	if rep.Nodes["n1"] != rep.Completed {
		t.Errorf("served-by counts %v, completed %d", rep.Nodes, rep.Completed)
	}
}

// TestLightNetAddsANode pins that a light testnet converges, that its nodes run light (no
// GPU telemetry in their records), and that Add starts a node that joins the mesh.
func TestLightNetAddsANode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tn, err := testnet.Start(ctx, testnet.Config{Nodes: 2, Fast: true, Light: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tn.Close() })
	if err := tn.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	added, err := tn.Add(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if added.Name() != testnet.Name(2) || len(tn.Nodes) != 3 {
		t.Fatalf("added %s, %d nodes", added.Name(), len(tn.Nodes))
	}
	if err := tn.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	for _, m := range tn.Nodes[0].Members() {
		if m.State.Vendor != "" {
			t.Errorf("%s reports GPU vendor %q: not a light node", m.Name, m.State.Vendor)
		}
	}
}
