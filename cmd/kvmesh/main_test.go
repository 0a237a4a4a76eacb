package main

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kvmesh/kvmesh/admit/agent"
	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/node/nodeconfig"
	"github.com/kvmesh/kvmesh/node/transport"
	"github.com/kvmesh/kvmesh/testnet"
	"github.com/kvmesh/kvmesh/testnet/bench"
	"github.com/kvmesh/kvmesh/testnet/loadgen"
)

func TestEnvNamesFollowFlags(t *testing.T) {
	if got := env("gossip-key"); len(got) != 1 || got[0] != "KVMESH_GOSSIP_KEY" {
		t.Errorf("env(gossip-key) = %v", got)
	}
}

// parseNode runs the node command's flag parsing on args and returns the config it builds,
// with the files a running node reads loaded.
func parseNode(t *testing.T, args ...string) (node.Config, error) {
	t.Helper()
	// --insecure-dev without --dev-ca-dir creates the development CA in the user cache
	// directory: a test's own, not the user's.
	cache := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", cache)
	t.Setenv("HOME", cache)
	var cfg node.Config
	var cerr error
	cmd := nodeCommand()
	cmd.Action = func(c *cli.Context) error {
		if cfg, cerr = nodeConfig(c); cerr == nil {
			cerr = loadNodeFiles(&cfg)
		}
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
		"--policy", "least-load", "--time-scale", "8", "--join", "10.0.0.1:7946", "--carbon-provider", "static", "--carbon-static-intensity", "250",
		"--tls-cert", "api.crt", "--tls-key", "api.key", "--sim-scheduling-policy", "fcfs")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Name != "gpu-7" || cfg.HTTPAddr != "127.0.0.1:9" || strings.Join(cfg.Models, ",") != "a,b" || cfg.Policy != "least-load" ||
		cfg.Sim.TimeScale != 8 || len(cfg.Gossip.Join) != 1 || !cfg.Gossip.Insecure || cfg.TLS == nil ||
		cfg.TLSCert != "api.crt" || cfg.TLSKey != "api.key" || cfg.Sim.SchedulingPolicy != "fcfs" {
		t.Errorf("config %+v", cfg)
	}
	if cfg.Carbon == nil || cfg.Carbon.Provider.StaticIntensity != 250 {
		t.Errorf("carbon %+v", cfg.Carbon)
	}
}

// TestExternalEngineServesItsOwnModelsByDefault pins that kvmesh node next to an external
// engine configures no model unless --model is given (the node then serves the engine's
// list), and that --models-interval sets the refresh. (The embedded engine's default model is
// filled by node.New: node's TestConfigZeroRule.)
func TestExternalEngineServesItsOwnModelsByDefault(t *testing.T) {
	cfg, err := parseNode(t, "--insecure-dev", "--engine", "http://127.0.0.1:8000", "--models-interval", "5s")
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Models) != 0 || cfg.ModelsInterval != 5*time.Second {
		t.Errorf("external engine: models %v, interval %v; want none (the engine's list) and 5s", cfg.Models, cfg.ModelsInterval)
	}
	cfg, err = parseNode(t, "--insecure-dev", "--engine", "http://127.0.0.1:8000", "--model", "org/m")
	if err != nil || strings.Join(cfg.Models, ",") != "org/m" {
		t.Errorf("external engine with --model: %v %v", cfg.Models, err)
	}
}

// TestEnginePriorityIsOffUnlessAsked pins that an external engine is sent no priority by
// default (vLLM refuses one unless started with --scheduling-policy priority) and that
// --engine-priority turns it on.
func TestEnginePriorityIsOffUnlessAsked(t *testing.T) {
	for _, on := range []bool{false, true} {
		args := []string{"--insecure-dev", "--engine", "http://127.0.0.1:8000"}
		if on {
			args = append(args, "--engine-priority")
		}
		cfg, err := parseNode(t, args...)
		if err != nil || cfg.EnginePriority != on {
			t.Errorf("%v: EnginePriority %v, err %v", args, cfg.EnginePriority, err)
		}
	}
}

// TestEngineKVEventsIsOffUnlessAsked pins that a node reads no KV events by default and that
// --engine-kv-events names the publisher, to dial or to bind for.
func TestEngineKVEventsIsOffUnlessAsked(t *testing.T) {
	for _, ep := range []string{"", "tcp://127.0.0.1:5557", "bind:tcp://*:5557"} {
		args := []string{"--insecure-dev", "--engine", "http://127.0.0.1:8000"}
		if ep != "" {
			args = append(args, "--engine-kv-events", ep)
		}
		cfg, err := parseNode(t, args...)
		if err != nil || cfg.EngineKVEvents != ep {
			t.Errorf("%v: EngineKVEvents %q, err %v", args, cfg.EngineKVEvents, err)
		}
	}
}

// TestStalePolicyReachesTheRouter pins that --stale-policy open keeps stale peers at both
// layers: gossip's candidate marking and the router's own freshness filter.
func TestStalePolicyReachesTheRouter(t *testing.T) {
	for _, tt := range []struct {
		flag   string
		gossip gossip.StalePolicy
		route  route.StalePolicy
	}{{"open", gossip.FailOpen, route.StaleOpen}, {"closed", gossip.FailClosed, route.StaleClosed}} {
		cfg, err := parseNode(t, "--insecure-dev", "--stale-policy", tt.flag)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Gossip.StalePolicy != tt.gossip || cfg.Route.StalePolicy != tt.route {
			t.Errorf("--stale-policy %s: gossip %v, route %v", tt.flag, cfg.Gossip.StalePolicy, cfg.Route.StalePolicy)
		}
	}
	if _, err := parseNode(t, "--insecure-dev", "--stale-policy", "ajar"); err == nil {
		t.Error("--stale-policy ajar accepted")
	}
}

// TestInsecureDevNodesOfOneHostTrustEachOther: two --insecure-dev nodes configured apart, as
// two processes are, share the development CA in --dev-ca-dir, so each trusts the other's
// certificate; a node given another directory is under another CA.
func TestInsecureDevNodesOfOneHostTrustEachOther(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "dev-ca")
	leafAndRoots := func(args ...string) (*x509.Certificate, *x509.CertPool) {
		t.Helper()
		cfg, err := parseNode(t, append([]string{"--insecure-dev"}, args...)...)
		if err != nil {
			t.Fatal(err)
		}
		leaf, err := x509.ParseCertificate(cfg.TLS.Certificates[0].Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return leaf, cfg.TLS.RootCAs
	}
	a, aRoots := leafAndRoots("--name", "a", "--dev-ca-dir", dir)
	b, bRoots := leafAndRoots("--name", "b", "--dev-ca-dir", dir)
	c, _ := leafAndRoots("--name", "c", "--dev-ca-dir", filepath.Join(t.TempDir(), "other"))
	verify := func(leaf *x509.Certificate, roots *x509.CertPool) error {
		_, err := leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: transport.PeerServerName, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
		return err
	}
	if err := verify(a, bRoots); err != nil {
		t.Errorf("b does not trust a: %v", err)
	}
	if err := verify(b, aRoots); err != nil {
		t.Errorf("a does not trust b: %v", err)
	}
	if verify(c, aRoots) == nil {
		t.Error("a trusts a node of another development CA")
	}
}

// TestCAIssueKeepsTheCAKeyOffTheNode: kvmesh ca issue writes the node's directory with its
// pair and ca.crt only, NAME inside the CA's directory by default, and refuses to write a
// node's files beside ca.key.
func TestCAIssueKeepsTheCAKeyOffTheNode(t *testing.T) {
	ca := filepath.Join(t.TempDir(), "ca")
	if _, err := run(t, "ca", "init", "--dir", ca); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, "ca", "issue", "--dir", ca, "--node", "gpu-01", "--host", "10.0.0.11"); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "tls-gpu-02")
	if _, err := run(t, "ca", "issue", "--dir", ca, "--node", "gpu-02", "--out", out); err != nil {
		t.Fatal(err)
	}
	for dir, name := range map[string]string{filepath.Join(ca, "gpu-01"): "gpu-01", out: "gpu-02"} {
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, e := range entries {
			got = append(got, e.Name())
		}
		if want := []string{"ca.crt", name + ".crt", name + ".key"}; !slices.Equal(got, want) {
			t.Errorf("%s holds %v, want %v", dir, got, want)
		}
	}
	if _, err := run(t, "ca", "issue", "--dir", ca, "--node", "gpu-03", "--out", ca); !errors.Is(err, transport.ErrCAKeyBeside) {
		t.Errorf("issue into the CA's own directory: %v, want ErrCAKeyBeside", err)
	}
}

// TestCAIssueAnyName: a certificate kvmesh ca issue --any-name wrote loads under any node
// name; one issued for gpu-01 only as gpu-01.
func TestCAIssueAnyName(t *testing.T) {
	ca := filepath.Join(t.TempDir(), "ca")
	if _, err := run(t, "ca", "init", "--dir", ca); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"--node", "gpu-01"}, {"--node", "kvmesh", "--any-name"}} {
		if _, err := run(t, append([]string{"ca", "issue", "--dir", ca}, args...)...); err != nil {
			t.Fatal(err)
		}
	}
	for issued, wantAny := range map[string]bool{"gpu-01": false, "kvmesh": true} {
		dir := filepath.Join(ca, issued)
		for _, ext := range []string{".crt", ".key"} {
			data, err := os.ReadFile(filepath.Join(dir, issued+ext))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "pod-1"+ext), data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := transport.LoadTLS(dir, "pod-1"); (err == nil) != wantAny {
			t.Errorf("%s's certificate loaded as pod-1: %v, want loaded %v", issued, err, wantAny)
		}
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

// TestAdvertiseTakesAHost: --advertise names a host, advertised with each bound port; a
// host:port is refused rather than half-applied.
func TestAdvertiseTakesAHost(t *testing.T) {
	base := []string{"--name", "x", "--insecure-dev", "--gossip", "127.0.0.1:29946"}
	cfg, err := parseNode(t, append(base, "--advertise", "10.0.0.11")...)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.AdvertiseHost != "10.0.0.11" || cfg.Gossip.AdvertiseAddr != "10.0.0.11" || cfg.Gossip.BindPort != 29946 {
		t.Errorf("--advertise 10.0.0.11: host %q, gossip %q port %d", cfg.AdvertiseHost, cfg.Gossip.AdvertiseAddr, cfg.Gossip.BindPort)
	}
	for _, a := range []string{"10.0.0.11:7946", "[::1]:7946"} {
		if _, err := parseNode(t, append(base, "--advertise", a)...); err == nil || !strings.Contains(err.Error(), "without a port") {
			t.Errorf("--advertise %s: err %v; want a refusal of the port", a, err)
		}
	}
	if _, err := parseNode(t, append(base, "--advertise", "::1")...); err != nil {
		t.Errorf("--advertise ::1: %v", err)
	}
}

func TestStatusTableHasARowPerNode(t *testing.T) {
	var buf bytes.Buffer
	pr := node.PeersResponse{Node: "n1", Peers: []node.PeerInfo{
		{Name: "n1", Self: true, Liveness: "alive", KVUse: 0.5, PowerWatts: 300, PowerCapWatts: 700, TempC: 61},
		{Name: "n2", Liveness: "dead", CarbonIntensity: 420, CarbonZone: "DE"},
	}}
	if err := writeStatus(&buf, pr, nil); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{"n1 *", "50%", "300/700W", "61°C", "n2", "dead", "420 DE"} {
		if !strings.Contains(out, want) {
			t.Errorf("status table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "WARNING") {
		t.Errorf("status warns of nothing wrong:\n%s", out)
	}
}

// TestStatusWarnsOfAFailingJoin: a node alone with seeds it cannot join says so above its table.
func TestStatusWarnsOfAFailingJoin(t *testing.T) {
	var buf bytes.Buffer
	pr := node.PeersResponse{Node: "n1", JoinFailing: "serving alone: cannot join the seeds: no installed keys could decrypt the message",
		Peers: []node.PeerInfo{{Name: "n1", Self: true, Liveness: "alive"}}}
	if err := writeStatus(&buf, pr, nil); err != nil {
		t.Fatal(err)
	}
	if want := "WARNING: serving alone: cannot join the seeds: no installed keys"; !strings.Contains(buf.String(), want) {
		t.Errorf("status lacks %q:\n%s", want, buf.String())
	}
}

// TestStatusTakesAHostPortAndShowsReadiness pins that --node without a scheme is reached over
// http, and that a live node's READY is what its /readyz said, reason included, or its
// gossiped health when it does not answer.
func TestStatusTakesAHostPortAndShowsReadiness(t *testing.T) {
	peer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprint(w, `{"status":"engine unhealthy","reason":"engine unreachable"}`)
	}))
	t.Cleanup(peer.Close)
	pr := node.PeersResponse{Node: "n1", Peers: []node.PeerInfo{
		{Name: "n1", Self: true, Liveness: "alive", EngineHealthy: true},
		{Name: "n2", Liveness: "alive", HTTPAddr: peer.Listener.Addr().String()},
		{Name: "n3", Liveness: "alive"},
	}}
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/mesh/peers", func(w http.ResponseWriter, r *http.Request) { _ = json.NewEncoder(w).Encode(pr) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, `{"status":"ready"}`) })
	self := httptest.NewServer(mux)
	t.Cleanup(self.Close)

	out, err := run(t, "status", "--node", strings.TrimPrefix(self.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"n1 *": "ready", "n2": "engine unhealthy: engine unreachable", "n3": "not ready (gossip)"}
	for _, line := range strings.Split(out, "\n") {
		for name, ready := range want {
			if strings.HasPrefix(line, name+" ") && strings.HasSuffix(line, "  "+ready) {
				delete(want, name)
			}
		}
	}
	if len(want) > 0 {
		t.Errorf("status lacks the readiness %v:\n%s", want, out)
	}
}

// TestLoadTakesAnAPIKey pins that kvmesh load sends --api-key, or KVMESH_LOAD_API_KEY, as the
// bearer token of every request.
func TestLoadTakesAnAPIKey(t *testing.T) {
	parse := func(args ...string) loadgen.Config {
		var cfg loadgen.Config
		cmd := loadCommand()
		cmd.Action = func(c *cli.Context) error { cfg = loadConfig(c); return nil }
		if err := (&cli.App{Commands: []*cli.Command{cmd}}).Run(append([]string{"kvmesh", "load"}, args...)); err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	if cfg := parse("--api-key", "sk-flag"); cfg.APIKey != "sk-flag" {
		t.Errorf("--api-key: APIKey %q", cfg.APIKey)
	}
	t.Setenv("KVMESH_LOAD_API_KEY", "sk-env")
	if cfg := parse(); cfg.APIKey != "sk-env" {
		t.Errorf("KVMESH_LOAD_API_KEY: APIKey %q", cfg.APIKey)
	}
}

// TestBenchBaselineScheduling pins kvmesh bench's --baseline-scheduling and its variable:
// priority unless set, as the figures in docs/performance.md were measured.
func TestBenchBaselineScheduling(t *testing.T) {
	parse := func(args ...string) bench.Config { return parseBench(t, args...) }
	if cfg := parse(); cfg.BaselineScheduling != "priority" {
		t.Errorf("default: BaselineScheduling %q", cfg.BaselineScheduling)
	}
	if cfg := parse("--baseline-scheduling", "fcfs"); cfg.BaselineScheduling != "fcfs" {
		t.Errorf("--baseline-scheduling: BaselineScheduling %q", cfg.BaselineScheduling)
	}
	t.Setenv("KVMESH_BENCH_BASELINE_SCHEDULING", "fcfs")
	if cfg := parse(); cfg.BaselineScheduling != "fcfs" {
		t.Errorf("KVMESH_BENCH_BASELINE_SCHEDULING: BaselineScheduling %q", cfg.BaselineScheduling)
	}
}

// parseBench returns the bench.Config kvmesh bench builds from args.
func parseBench(t *testing.T, args ...string) bench.Config {
	t.Helper()
	var cfg bench.Config
	cmd := benchCommand()
	cmd.Action = func(c *cli.Context) (err error) { cfg, err = benchConfig(c); return err }
	app := &cli.App{Commands: []*cli.Command{cmd}, Flags: []cli.Flag{
		&cli.StringFlag{Name: "log-level", Value: "info"}, &cli.StringFlag{Name: "log-format", Value: "text"},
	}}
	if err := app.Run(append([]string{"kvmesh", "bench"}, args...)); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestBenchDisaggregated pins --disaggregated and --disagg-link-gbps: the roles, the node count
// and the policies left to the bench (kvmesh beside kvmesh-disagg) unless given, the sim's
// 25 GB/s link unless set.
func TestBenchDisaggregated(t *testing.T) {
	if cfg := parseBench(t); cfg.Disaggregated != nil || cfg.LinkGBps != 25 || cfg.Nodes != 4 || len(cfg.Policies) != 5 {
		t.Errorf("default: roles %v, link %v, %d nodes, %d policies", cfg.Disaggregated, cfg.LinkGBps, cfg.Nodes, len(cfg.Policies))
	}
	cfg := parseBench(t, "--disaggregated", "prefill, prefill,decode,decode", "--disagg-link-gbps", "1.25")
	if fmt.Sprint(cfg.Disaggregated) != "[prefill prefill decode decode]" || cfg.LinkGBps != 1.25 || cfg.Nodes != 0 || cfg.Policies != nil {
		t.Errorf("--disaggregated: roles %q, link %v, %d nodes, policies %v", cfg.Disaggregated, cfg.LinkGBps, cfg.Nodes, cfg.Policies)
	}
	t.Setenv("KVMESH_BENCH_DISAGGREGATED", "prefill,decode")
	if cfg := parseBench(t, "--policies", "round-robin"); len(cfg.Disaggregated) != 2 || len(cfg.Policies) != 1 {
		t.Errorf("KVMESH_BENCH_DISAGGREGATED with --policies: roles %v, policies %v", cfg.Disaggregated, cfg.Policies)
	}
}

// TestBenchClassSLOs pins --ttft-slo and --tpot-slo: the interactive class's targets, the
// bench's defaults unless set, the batch class's untouched.
func TestBenchClassSLOs(t *testing.T) {
	d := bench.DefaultConfig()
	if cfg := parseBench(t); cfg.Interactive != d.Interactive || cfg.Batch != d.Batch {
		t.Errorf("default: %+v, %+v", cfg.Interactive, cfg.Batch)
	}
	cfg := parseBench(t, "--tpot-slo", "50ms", "--ttft-slo", "3s")
	if cfg.Interactive.TPOT != 50*time.Millisecond || cfg.Interactive.TTFT != 3*time.Second || cfg.Batch != d.Batch {
		t.Errorf("--tpot-slo 50ms --ttft-slo 3s: %+v, batch %+v", cfg.Interactive, cfg.Batch)
	}
}

// TestBenchModels pins --models: the multi-model policies (kvmesh beside kvmesh-no-delegate)
// unless --policies names others, and kvmesh-no-delegate is a policy --policies takes.
func TestBenchModels(t *testing.T) {
	if cfg := parseBench(t); cfg.Models != 0 || len(cfg.Policies) != 5 {
		t.Errorf("default: %d models, %d policies", cfg.Models, len(cfg.Policies))
	}
	if cfg := parseBench(t, "--models", "2"); cfg.Models != 2 || cfg.Policies != nil {
		t.Errorf("--models 2: %d models, policies %v; want the bench's multi-model policies", cfg.Models, cfg.Policies)
	}
	cfg := parseBench(t, "--models", "2", "--policies", "kvmesh-no-delegate")
	if len(cfg.Policies) != 1 || !cfg.Policies[0].NoDelegate {
		t.Errorf("--policies kvmesh-no-delegate: %+v", cfg.Policies)
	}
}

// TestSharedPrefixFlags pins the shared-prefix workload's flags of load and bench, and bench's
// --warmup: loadgen's and bench's defaults unless set.
func TestSharedPrefixFlags(t *testing.T) {
	cfg := parseBench(t)
	if cfg.SharedPrefix != loadgen.DefaultSharedPrefix() || cfg.Warmup != bench.DefaultWarmup {
		t.Errorf("default: %+v, warm-up %s", cfg.SharedPrefix, cfg.Warmup)
	}
	args := []string{"--tenants", "200", "--system-tokens", "4000", "--question-tokens", "150", "--reply-tokens", "500",
		"--tenant-zipf", "1.1", "--follow-ups", "0.2"}
	want := loadgen.SharedPrefix{Tenants: 200, SystemTokens: 4000, QuestionTokens: 150, ReplyTokens: 500, TenantZipf: 1.1, FollowUps: 0.2}
	if cfg := parseBench(t, append(args, "--warmup", "3s")...); cfg.SharedPrefix != want || cfg.Warmup != 3*time.Second {
		t.Errorf("bench: %+v, warm-up %s; want %+v, 3s", cfg.SharedPrefix, cfg.Warmup, want)
	}
	var lc loadgen.Config
	cmd := loadCommand()
	cmd.Action = func(c *cli.Context) error { lc = loadConfig(c); return nil }
	if err := (&cli.App{Commands: []*cli.Command{cmd}}).Run(append([]string{"kvmesh", "load"}, args...)); err != nil {
		t.Fatal(err)
	}
	if lc.SharedPrefix != want {
		t.Errorf("load: %+v, want %+v", lc.SharedPrefix, want)
	}
}

// TestCompletionScripts pins that kvmesh completion prints a script for each shell it names:
// bash and zsh asking the binary for its words, fish listing them.
func TestCompletionScripts(t *testing.T) {
	if !newApp().EnableBashCompletion {
		t.Fatal("the app does not answer --generate-bash-completion, which the bash and zsh scripts call")
	}
	for shell, want := range map[string]string{
		"bash": "complete -o bashdefault -o default -F _kvmesh_complete kvmesh",
		"zsh":  "compdef _kvmesh kvmesh",
		"fish": "complete -c kvmesh -n '__fish_seen_subcommand_from node' -f -l drain-delay",
	} {
		out, err := run(t, "completion", shell)
		if err != nil || !strings.Contains(out, want) {
			t.Errorf("completion %s: %v, script lacks %q:\n%s", shell, err, want, out)
		}
	}
	if _, err := run(t, "completion", "ksh"); err == nil {
		t.Errorf("completion ksh: no error")
	}
}

// TestHelpShowsOneDefaultPerFlag fails for a flag whose help line shows two defaults, one
// written into its Usage and urfave/cli's own (use DefaultText for the first).
func TestHelpShowsOneDefaultPerFlag(t *testing.T) {
	eachFlag(func(cmd string, f cli.Flag) {
		if n := strings.Count(f.String(), "(default:"); n > 1 {
			t.Errorf("%s: %d defaults in %q", cmd, n, f.String())
		}
	})
	help, err := run(t, "testnet", "--help")
	if err != nil || !strings.Contains(help, fmt.Sprintf("(default: on above %d nodes)", testnet.LightAbove)) {
		t.Errorf("kvmesh testnet --help does not give --light's default: %v\n%s", err, help)
	}
}

// TestEveryFlagHasAVariable pins operating.md's rule that every flag of every command has an
// environment variable, but --print-config, which only a command line asks for.
func TestEveryFlagHasAVariable(t *testing.T) {
	eachFlag(func(cmd string, f cli.Flag) {
		ev, ok := f.(interface{ GetEnvVars() []string })
		if f.Names()[0] != "print-config" && (!ok || len(ev.GetEnvVars()) == 0) {
			t.Errorf("%s --%s has no environment variable", cmd, f.Names()[0])
		}
	})
	t.Setenv("KVMESH_CONFIG_FORMAT", "yaml")
	if out, err := run(t, "config", "defaults"); err != nil || !strings.Contains(out, "admission:\n") {
		t.Errorf("KVMESH_CONFIG_FORMAT=yaml: %v\n%s", err, out)
	}
}

// eachFlag calls fn with every flag of every command and subcommand, and the command's path
// ("kvmesh config defaults").
func eachFlag(fn func(cmd string, f cli.Flag)) {
	var walk func(path string, cmds []*cli.Command)
	walk = func(path string, cmds []*cli.Command) {
		for _, c := range cmds {
			for _, f := range c.Flags {
				fn(path+" "+c.Name, f)
			}
			walk(path+" "+c.Name, c.Subcommands)
		}
	}
	walk("kvmesh", newApp().Commands)
}

// run runs the kvmesh app on args and returns what it printed.
func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	app := newApp()
	app.Writer = &out
	err := app.Run(append([]string{"kvmesh", "--log-level", "error"}, args...))
	return out.String(), err
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "kvmesh.json")
	if err := os.WriteFile(f, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestFlagDefaultsAreTheConfigDefaults pins that no flag's default repeats (and drifts from)
// DefaultConfig: setting every flag to the default it shows builds the default config.
func TestFlagDefaultsAreTheConfigDefaults(t *testing.T) {
	skip := map[string]bool{"name": true, "config": true, "gossip-key": true, "carbon-provider": true, "agent-window": true}
	args := []string{"--name", "n", "--insecure-dev", "--carbon-provider", "static",
		"--agent-window", strconv.Itoa(agent.DefaultControllerConfig().MaxWindow)}
	for _, f := range nodeFlags() {
		df, ok := f.(cli.DocGenerationFlag)
		name := f.Names()[0]
		if !ok || !df.TakesValue() || skip[name] || df.GetValue() == "" {
			continue
		}
		args = append(args, "--"+name, strings.Trim(df.GetValue(), `"`))
	}
	cfg, err := parseNode(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	want := node.DefaultConfig()
	want.Name, want.Gossip.Insecure = "n", true
	ac := agent.DefaultConfig()
	cc := nodeconfig.DefaultCarbonConfig()
	cc.Provider.Kind = "static"
	want.Agents, want.Carbon = &ac, &cc
	got, _ := nodeconfig.MarshalConfigFile(cfg)
	exp, _ := nodeconfig.MarshalConfigFile(want)
	if string(got) != string(exp) {
		t.Errorf("flags at their shown defaults (%s) build\n%s\nwant DefaultConfig\n%s", strings.Join(args, " "), got, exp)
	}
}

// TestConfigFileUnderFlags pins the precedence: DefaultConfig < --config file < flags and
// environment variables that are set.
func TestConfigFileUnderFlags(t *testing.T) {
	file := writeFile(t, `{
	  "node": {"name": "from-file", "http_addr": ":9000", "forward_attempts": 5, "drain_timeout": "10s"},
	  "gossip": {"join": ["10.0.0.9:7946"]},
	  "route": {"busy_kv_use": 0.8, "gate_tolerance": "10ms"},
	  "admission": {"queue": {"dispatch_slack": 0.3}},
	  "agents": {"interval": "250ms", "controller": {"max_window": 40, "initial_window": 4}}
	}`)
	t.Setenv("KVMESH_FORWARD_ATTEMPTS", "2")
	t.Setenv("KVMESH_HTTP", ":9300")
	cfg, err := parseNode(t, "--config", file, "--insecure-dev", "--http", ":9100", "--agent-window", "20")
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name string
		ok   bool
	}{
		{"file: name", cfg.Name == "from-file"},
		{"flag over environment and file: http", cfg.HTTPAddr == ":9100"},
		{"env over file: forward attempts", cfg.ForwardAttempts == 2},
		{"file: drain timeout", cfg.DrainTimeout == 10*time.Second},
		{"file: join", len(cfg.Gossip.Join) == 1 && cfg.Gossip.Join[0] == "10.0.0.9:7946"},
		{"file: route", cfg.Route.BusyKVUse == 0.8 && cfg.Route.GateTolerance == 10*time.Millisecond},
		{"file: admission", cfg.Admit.Queue.DispatchSlack == 0.3},
		{"flag over file: agent window", cfg.Agents != nil && cfg.Agents.Controller.MaxWindow == 20 && cfg.Agents.Controller.InitialWindow == 4},
		{"file: agent interval", cfg.AgentInterval == 250*time.Millisecond},
		{"default: what neither says", cfg.QUICAddr == node.DefaultConfig().QUICAddr && cfg.Policy == node.DefaultConfig().Policy},
	}
	for _, c := range checks {
		if !c.ok {
			t.Errorf("%s: not as expected", c.name)
		}
	}
	if cfg, err := parseNode(t, "--config", file, "--insecure-dev", "--agent-window", "0"); err != nil || cfg.Agents != nil {
		t.Errorf("--agent-window 0 left the file's agent admission on (%v)", err)
	}
	if _, err := parseNode(t, "--config", writeFile(t, `{"route": {"max_agee": "1s"}}`), "--insecure-dev"); err == nil ||
		!strings.Contains(err.Error(), `unknown key "route.max_agee"`) {
		t.Errorf("unknown key: err %v", err)
	}
	legacy, err := parseNode(t, "--config", writeFile(t, `{"models": {"m": {"context_tokens": 4096}}, "queue": {"ttl": "20s"}}`), "--insecure-dev")
	if err != nil || legacy.Admit.Models["m"].ContextTokens != 4096 {
		t.Errorf("legacy admission file: %v, %+v", err, legacy.Admit.Models)
	}
}

// TestPrintConfigLoadsBack pins that what kvmesh node --print-config and kvmesh config defaults
// print is a config file that reads back to the same configuration.
func TestPrintConfigLoadsBack(t *testing.T) {
	file := writeFile(t, `{"node": {"name": "gpu-7"}, "route": {"weights": {"power": -1}}, "agents": {}}`)
	first, err := run(t, "node", "--config", file, "--http", ":9200", "--carbon-provider", "static", "--print-config")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"name": "gpu-7"`, `"http_addr": ":9200"`, `"power": -1`, `"max_window": 512`, `"kind": "static"`} {
		if !strings.Contains(first, want) {
			t.Errorf("printed config lacks %s:\n%s", want, first)
		}
	}
	second, err := run(t, "node", "--config", writeFile(t, first), "--print-config")
	if err != nil {
		t.Fatal(err)
	}
	if second != first {
		t.Errorf("the printed config does not load back unchanged:\n%s\nthen\n%s", first, second)
	}
	defaults, err := run(t, "config", "defaults")
	if err != nil {
		t.Fatal(err)
	}
	back, err := nodeconfig.LoadConfigFile([]byte(defaults), node.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := nodeconfig.MarshalConfigFile(back); string(again) != defaults {
		t.Errorf("kvmesh config defaults does not load back unchanged:\n%s\nthen\n%s", defaults, again)
	}
	yaml, err := run(t, "config", "defaults", "--format", "yaml")
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasPrefix(strings.TrimSpace(yaml), "{") || !strings.Contains(yaml, "admission:\n") {
		t.Errorf("kvmesh config defaults --format yaml is not YAML:\n%s", yaml)
	}
	if back, err = nodeconfig.LoadConfigFile([]byte(yaml), node.DefaultConfig()); err != nil {
		t.Fatal(err)
	}
	if again, _ := nodeconfig.MarshalConfigFile(back); string(again) != defaults {
		t.Errorf("kvmesh config defaults --format yaml does not load back to the defaults:\n%s\nthen\n%s", yaml, again)
	}
	if _, err := run(t, "config", "defaults", "--format", "toml"); err == nil {
		t.Error("--format toml accepted")
	}
}

// TestReloadKeepsFlagsOverTheFile pins that the flags and environment variables set at start
// still win over the config file when the node reads it again (node.Config.Overrides), while
// the file's new values stand where nothing else is set; and that --config-watch 0 turns the
// watch off.
func TestReloadKeepsFlagsOverTheFile(t *testing.T) {
	file := writeFile(t, `{"admission": {"queue": {"dispatch_slack": 0.1}}, "route": {"busy_kv_use": 0.8}}`)
	t.Setenv("KVMESH_FORWARD_ATTEMPTS", "2")
	cfg, err := parseNode(t, "--config", file, "--insecure-dev", "--dispatch-slack", "0.3", "--config-watch", "0")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ConfigFile != file || cfg.Overrides == nil || cfg.ConfigWatch >= 0 {
		t.Fatalf("config file %q, overrides set %v, watch %v; want the file, overrides, and the watch off",
			cfg.ConfigFile, cfg.Overrides != nil, cfg.ConfigWatch)
	}
	if err := os.WriteFile(file, []byte(`{"admission": {"queue": {"dispatch_slack": 0.5}}, "route": {"busy_kv_use": 0.7},
		"node": {"forward_attempts": 5, "retry_after": "3s"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	next, _, err := nodeconfig.ReadConfigFile(file, node.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Overrides(&next); err != nil {
		t.Fatal(err)
	}
	if next.Admit.Queue.DispatchSlack != 0.3 || next.ForwardAttempts != 2 {
		t.Errorf("reloaded: dispatch slack %v, forward attempts %d; want the flag's 0.3 and the variable's 2",
			next.Admit.Queue.DispatchSlack, next.ForwardAttempts)
	}
	if next.Route.BusyKVUse != 0.7 || next.RetryAfter != 3*time.Second {
		t.Errorf("reloaded: busy kv use %v, retry after %v; want the file's 0.7 and 3s", next.Route.BusyKVUse, next.RetryAfter)
	}
	if cfg, err = parseNode(t, "--insecure-dev"); err != nil || cfg.ConfigWatch != node.DefaultConfig().ConfigWatch {
		t.Errorf("default --config-watch: %v (%v), want %v", cfg.ConfigWatch, err, node.DefaultConfig().ConfigWatch)
	}
}

// TestSecondSignalForcesTheExit pins stopOnSignals: the first signal cancels the command's
// context and nothing more; the second calls force with it, which exits 128 + its number.
func TestSecondSignalForcesTheExit(t *testing.T) {
	sigs := make(chan os.Signal, 2)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	forced := make(chan os.Signal, 1)
	go stopOnSignals(sigs, cancel, func(s os.Signal) { forced <- s })
	sigs <- os.Interrupt
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the first signal did not cancel the context")
	}
	select {
	case s := <-forced:
		t.Fatalf("the first signal forced an exit (%v)", s)
	default:
	}
	sigs <- syscall.SIGTERM
	select {
	case s := <-forced:
		if s != syscall.SIGTERM {
			t.Errorf("forced by %v, want SIGTERM", s)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the second signal did not force an exit")
	}
	for s, want := range map[os.Signal]int{os.Interrupt: 130, syscall.SIGTERM: 143} {
		if got := exitCode(s); got != want {
			t.Errorf("exitCode(%v) = %d, want %d", s, got, want)
		}
	}
}
