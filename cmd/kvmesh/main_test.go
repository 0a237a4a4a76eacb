package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/kvmesh/kvmesh/node"
)

func TestEnvNamesFollowFlags(t *testing.T) {
	if got := env("gossip-key"); len(got) != 1 || got[0] != "KVMESH_GOSSIP_KEY" {
		t.Errorf("env(gossip-key) = %v", got)
	}
}

// parseNode runs the node command's flag parsing on args and returns the config it builds.
func parseNode(t *testing.T, args ...string) (node.Config, error) {
	t.Helper()
	var cfg node.Config
	var cerr error
	cmd := nodeCommand()
	cmd.Action = func(c *cli.Context) error {
		cfg, cerr = nodeConfig(c)
		return nil
	}
	app := &cli.App{Flags: []cli.Flag{&cli.StringFlag{Name: "log-level", Value: "info"}, &cli.StringFlag{Name: "log-format", Value: "text"}},
		Commands: []*cli.Command{cmd}}
	if err := app.Run(append([]string{"kvmesh", "node"}, args...)); err != nil {
		t.Fatal(err)
	}
	return cfg, cerr
}

func TestNodeFlagsMapToConfig(t *testing.T) {
	cfg, err := parseNode(t, "--name", "gpu-7", "--http", "127.0.0.1:9", "--insecure-dev", "--model", "a", "--model", "b",
		"--policy", "least-load", "--time-scale", "8", "--join", "10.0.0.1:7946", "--carbon-provider", "static", "--carbon-static-intensity", "250")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Name != "gpu-7" || cfg.HTTPAddr != "127.0.0.1:9" || strings.Join(cfg.Models, ",") != "a,b" || cfg.Policy != "least-load" ||
		cfg.Sim.TimeScale != 8 || len(cfg.Gossip.Join) != 1 || !cfg.Gossip.Insecure || cfg.TLS == nil {
		t.Errorf("config %+v", cfg)
	}
	if cfg.Carbon == nil || cfg.Carbon.Provider.StaticIntensity != 250 {
		t.Errorf("carbon %+v", cfg.Carbon)
	}
}

func TestNodeRefusesToRunWithoutAGossipKeyOrTLS(t *testing.T) {
	if _, err := parseNode(t, "--name", "x"); err == nil || !strings.Contains(err.Error(), "--gossip-key") {
		t.Errorf("no key: err %v", err)
	}
	if _, err := parseNode(t, "--name", "x", "--gossip-key", "AAAAAAAAAAAAAAAAAAAAAA=="); err == nil || !strings.Contains(err.Error(), "--tls-dir") {
		t.Errorf("no TLS: err %v", err)
	}
	if _, err := parseNode(t, "--name", "x", "--gossip-key", "not base64!", "--insecure-dev"); err == nil {
		t.Errorf("a key that is not base64 was accepted")
	}
}

func TestStatusTableHasARowPerNode(t *testing.T) {
	var buf bytes.Buffer
	pr := node.PeersResponse{Node: "n1", Peers: []node.PeerInfo{
		{Name: "n1", Self: true, Liveness: "alive", KVUse: 0.5, PowerWatts: 300, PowerCapWatts: 700, TempC: 61},
		{Name: "n2", Liveness: "dead", CarbonIntensity: 420, CarbonZone: "DE"},
	}}
	if err := writeStatus(&buf, pr); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{"n1 *", "50%", "300/700W", "61°C", "n2", "dead", "420 DE"} {
		if !strings.Contains(out, want) {
			t.Errorf("status table lacks %q:\n%s", want, out)
		}
	}
}
