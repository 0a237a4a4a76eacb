package node

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/carbon"
	"github.com/kvmesh/kvmesh/internal/poll"
	"github.com/kvmesh/kvmesh/node/metrics"
	"github.com/kvmesh/kvmesh/node/nodeconfig"
)

// logBuffer collects a node's log lines; safe for the node's goroutines.
type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// lines returns the lines logged since the last call that contain every one of parts.
func (l *logBuffer) lines(parts ...string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range strings.Split(l.b.String(), "\n") {
		all := line != ""
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			out = append(out, line)
		}
	}
	return out
}

// reset forgets what was logged so far.
func (l *logBuffer) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b.Reset()
}

// writeFile puts content at path at once, as a careful operator's tools do (a file written
// beside it, then renamed): a watcher never reads it half written, which it would refuse (an
// empty key file most of all) and count as a failed reload.
func writeFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// reloadable builds a standalone node from the config file at path, read as kvmesh node reads
// it: the file over DefaultConfig, then flags, here flags(cfg) (also applied on every reload).
// Nothing is bound until the caller starts it.
func reloadable(t *testing.T, path string, flags func(*Config)) (*Node, *logBuffer) {
	t.Helper()
	cfg, _, err := nodeconfig.ReadConfigFile(path, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	cfg.Overrides = func(c *Config) error {
		c.Name, c.GPU, c.HTTPAddr = "n", "none", "127.0.0.1:0"
		if flags != nil {
			flags(c)
		}
		return nil
	}
	if err := cfg.Overrides(&cfg); err != nil {
		t.Fatal(err)
	}
	cfg.Standalone = true
	log := &logBuffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(log, nil))
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Shutdown(t.Context()) })
	return n, log
}

// sloVerdict is the owner's verdict on a normal request whose predicted TTFT is about 2s, of
// which 1s is its own prefill: accepted while the normal class's TTFT target is at least 1s.
func sloVerdict(n *Node) string {
	now := time.Now()
	maxTokens := 16
	req := admit.Request{ID: "r", Model: DefaultModel, PromptTokens: 1000, MaxTokens: &maxTokens, Arrived: now, Tenant: "default"}
	self := route.Peer{Name: "n", Models: []string{DefaultModel}, Healthy: true, KVBlocksTotal: 10000,
		QueuedPrefillTokens: 1000, PrefillTokensPerSecond: 1000, DecodeStepSeconds: 0.01}
	return n.planner.Owner(now, req, self, 16, false).Code
}

// firstRoute is the peer routing puts first of two: "cool" has little load and little free KV,
// "roomy" much of both. The default weights prefer cool; a free_kv weight of 1 prefers roomy.
func firstRoute(t *testing.T, n *Node) string {
	t.Helper()
	peers := []route.Peer{
		{Name: "cool", Models: []string{DefaultModel}, Healthy: true, KVBlocksTotal: 1000, KVBlocksUsed: 900},
		{Name: "roomy", Models: []string{DefaultModel}, Healthy: true, KVBlocksTotal: 1000, InFlightTokens: 32768},
	}
	cands, err := n.planner.Policy().Route(time.Now(), route.Request{Model: DefaultModel, PromptTokens: 100}, peers, nil)
	if err != nil {
		t.Fatal(err)
	}
	return cands[0].Name
}

func reloads(n *Node, result string) float64 {
	return testutil.ToFloat64(n.m.Reloads.WithLabelValues(result))
}

// TestReloadAppliesLiveSettings pins that a reload changes the decisions of a running node:
// the normal class's TTFT target in admission's verdict, a routing weight in routing's order,
// and the carbon threshold in the tracker's verdict; and that it says so in its metrics.
func TestReloadAppliesLiveSettings(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kvmesh.yaml")
	writeFile(t, path, `
admission:
  slo:
    normal: {ttft: 2s}
carbon:
  provider: {kind: static, static_intensity: 250}
  tracker: {threshold: 300}
`)
	n, log := reloadable(t, path, nil)
	now := time.Now()
	n.carbon.Record(now, carbon.Reading{Intensity: 250, At: now})
	if v, r, dirty := sloVerdict(n), firstRoute(t, n), n.carbon.Dirty(now); v != admit.CodeAccepted || r != "cool" || dirty {
		t.Fatalf("before the reload: verdict %s, first %s, dirty %v; want accepted, cool, clean", v, r, dirty)
	}
	hash := n.configHash()

	changed := `
admission:
  slo:
    normal: {ttft: 500ms}
route:
  weights: {free_kv: 1}
carbon:
  provider: {kind: static, static_intensity: 250}
  tracker: {threshold: 200}
`
	writeFile(t, path, changed)
	if err := n.Reload(); err != nil {
		t.Fatal(err)
	}
	if v := sloVerdict(n); v != admit.CodeSLOUnattainable {
		t.Errorf("after slo.normal.ttft 500ms: verdict %s, want %s", v, admit.CodeSLOUnattainable)
	}
	if r := firstRoute(t, n); r != "roomy" {
		t.Errorf("after weights.free_kv 1: %s first, want roomy", r)
	}
	if !n.carbon.Dirty(now) {
		t.Error("after carbon threshold 200: a reading of 250 is still clean")
	}
	if ok, bad := reloads(n, metrics.ReloadOK), reloads(n, metrics.ReloadError); ok != 1 || bad != 0 {
		t.Errorf("reloads ok %v, error %v; want 1 and 0", ok, bad)
	}
	if h := n.configHash(); h == hash || h != nodeconfig.ContentSum([]byte(changed)) {
		t.Errorf("config hash %s after the reload (before %s), want the new file's", h, hash)
	}
	if w := log.lines("level=WARN"); len(w) != 0 {
		t.Errorf("live changes logged as needing a restart: %q", w)
	}
	if l := log.lines("level=INFO", "config file reloaded", "admission.slo.normal.ttft", "route.weights.free_kv", "carbon.tracker.threshold"); len(l) != 1 {
		t.Errorf("no INFO line naming the changed settings: %q", log.lines())
	}
}

// TestPriorityNamesInFiles pins that max_priority takes a priority's name in a YAML config
// file and in a JSON key file, on every reload, as --max-priority does.
func TestPriorityNamesInFiles(t *testing.T) {
	dir := t.TempDir()
	path, keys := filepath.Join(dir, "kvmesh.yaml"), filepath.Join(dir, "keys.json")
	writeFile(t, path, "admission:\n  keys: {max_priority: high}\n")
	keyFile := func(p string) string {
		return `[{"sha256": "` + admit.HashKey("sk-plain") + `", "tenant": "plain"},
			{"sha256": "` + admit.HashKey("sk-capped") + `", "tenant": "capped", "max_priority": "` + p + `"}]`
	}
	writeFile(t, keys, keyFile("low"))
	n, _ := reloadable(t, path, func(c *Config) { c.APIKeysFile = keys })
	if err := n.Reload(); err != nil { // reads the key file, as Start does
		t.Fatal(err)
	}
	granted := func(key string) int {
		maxTokens := 16
		_, d := n.adm.Identify(time.Now(), admit.Request{ID: "r", Model: DefaultModel, PromptTokens: 10, MaxTokens: &maxTokens,
			APIKey: key, Priority: 1000})
		return d.Priority
	}
	if p, q := granted("sk-plain"), granted("sk-capped"); p != admit.PriorityHigh || q != admit.PriorityLow {
		t.Errorf("granted %d to a key naming none and %d to a low key; want high (the config's) and low", p, q)
	}
	writeFile(t, keys, keyFile("normal"))
	if err := n.Reload(); err != nil {
		t.Fatal(err)
	}
	if q := granted("sk-capped"); q != admit.PriorityNormal {
		t.Errorf("after the reload: granted %d, want normal", q)
	}
	writeFile(t, keys, keyFile("urgent"))
	if err := n.Reload(); err == nil || !strings.Contains(err.Error(), `max_priority "urgent": want high, normal, low`) {
		t.Errorf("a key file naming no priority: Reload %v", err)
	}
}

// TestEmptyKeyFileKeepsAuthenticationOn: a key file holding no key (emptied, or caught
// mid-write) is refused at a reload, the previous keys staying in force, and at start; zero
// keys would have opened the API to anyone.
func TestEmptyKeyFileKeepsAuthenticationOn(t *testing.T) {
	dir := t.TempDir()
	path, keys := filepath.Join(dir, "kvmesh.yaml"), filepath.Join(dir, "keys.txt")
	writeFile(t, path, "node: {}\n")
	writeFile(t, keys, admit.HashKey("sk-a")+" acme\n")
	n, _ := reloadable(t, path, func(c *Config) { c.APIKeysFile = keys })
	if err := n.Reload(); err != nil {
		t.Fatal(err)
	}
	for _, empty := range []string{"", "# every key revoked\n"} {
		writeFile(t, keys, empty)
		if err := n.Reload(); err == nil || !strings.Contains(err.Error(), "holds no key") {
			t.Errorf("key file %q: Reload %v; want a refusal", empty, err)
		}
		if n.adm.Keys().Len() != 1 || !n.adm.Keys().Valid("sk-a") {
			t.Fatalf("key file %q: %d keys in force; want the previous one", empty, n.adm.Keys().Len())
		}
	}
	fresh, _ := reloadable(t, path, func(c *Config) { c.APIKeysFile = keys })
	if err := fresh.Start(t.Context()); err == nil || !strings.Contains(err.Error(), "holds no key") {
		t.Errorf("Start with an empty key file: %v; want a refusal", err)
	}
}

// TestReloadRejectsABadFile pins that a file that does not parse, names an unknown key or holds
// an invalid value changes nothing: one ERROR line, the error count up by one, the previous
// settings and hash in force.
func TestReloadRejectsABadFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kvmesh.json")
	writeFile(t, path, `{"admission": {"slo": {"normal": {"ttft": "2s"}}}}`)
	n, log := reloadable(t, path, nil)
	hash := n.configHash()
	for i, tt := range []struct{ name, file, want string }{
		{"not JSON", `{"admission": {"slo": `, "unexpected end of JSON"},
		{"an unknown key", `{"admission": {"slo": {"normal": {"ttft": "500ms"}}}, "route": {"weights": {"prefx": 1}}}`, `unknown key "route.weights.prefx"`},
		{"an invalid admission value", `{"admission": {"slo": {"normal": {"ttft": "500ms"}}, "kv": {"queue_on": 2}}}`, "admission:"},
		{"an invalid route value", `{"admission": {"slo": {"normal": {"ttft": "500ms"}}}, "route": {"busy_kv_use": 2}}`, "BusyKVUse"},
		{"an invalid node value", `{"admission": {"slo": {"normal": {"ttft": "500ms"}}}, "node": {"admission_mode": "maybe"}}`, "admission mode"},
		{"an empty file", ``, "unexpected end of JSON"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			log.reset()
			writeFile(t, path, tt.file)
			err := n.Reload()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Reload: %v, want an error containing %q", err, tt.want)
			}
			if l := log.lines("level=ERROR"); len(l) != 1 || !strings.Contains(l[0], "config file not reloaded") {
				t.Errorf("want one ERROR line, got %q", l)
			}
			if v := sloVerdict(n); v != admit.CodeAccepted {
				t.Errorf("the rejected file's TTFT target took effect: verdict %s", v)
			}
			if bad, ok := reloads(n, metrics.ReloadError), reloads(n, metrics.ReloadOK); bad != float64(i+1) || ok != 0 {
				t.Errorf("reloads error %v, ok %v; want %d and 0", bad, ok, i+1)
			}
			if h := n.configHash(); h != hash {
				t.Errorf("config hash %s, want the previous file's %s", h, hash)
			}
		})
	}
}

// TestReloadRejectsBadYAML pins the YAML reader's own refusals: a key given twice and a key
// that names no setting, named by its path as in JSON.
func TestReloadRejectsBadYAML(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kvmesh.yml")
	writeFile(t, path, "route:\n  busy_kv_use: 0.9\n")
	n, _ := reloadable(t, path, nil)
	for _, tt := range []struct{ file, want string }{
		{"route:\n  busy_kv_use: 0.8\nroute:\n  epsilon: 0.1\n", `"route" already set`},
		{"route:\n  weights:\n    prefx: 1\n", `unknown key "route.weights.prefx"`},
		{"route: [\n", "yaml"},
	} {
		writeFile(t, path, tt.file)
		if err := n.Reload(); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: Reload %v, want an error containing %q", tt.file, err, tt.want)
		}
	}
	if got := n.planner.Policy().Config().BusyKVUse; got != 0.9 {
		t.Errorf("busy_kv_use %v after rejected files, want the first file's 0.9", got)
	}
}

// TestReloadLeavesRestartSettings pins that a setting a running node cannot change is logged,
// one WARN line naming its key on every reload that finds it still changed, whatever its
// section, and not applied, while the live settings beside it are; and that once the file
// says again what the node runs with, nothing is logged.
func TestReloadLeavesRestartSettings(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kvmesh.json")
	writeFile(t, path, `{"route": {"busy_kv_use": 0.9}}`)
	n, log := reloadable(t, path, nil)
	writeFile(t, path, `{"route": {"busy_kv_use": 0.8, "advanced": {"seed": 7, "eject": {"failures": 5}}}, "node": {"forward_attempts": 5},
		"gossip": {"bind_port": 7000, "advertise_port": 7001}, "admission": {"queue": {"advanced": {"drain_window": "30s"}}}}`)
	restart := []string{"route.advanced.seed", "route.advanced.eject.failures", "node.forward_attempts", "gossip.bind_port", "gossip.advertise_port",
		"admission.queue.advanced.drain_window"}
	for reload := 1; reload <= 2; reload++ {
		log.reset()
		if err := n.Reload(); err != nil {
			t.Fatal(err)
		}
		for _, key := range restart {
			if l := log.lines("level=WARN", "key="+key); len(l) != 1 {
				t.Errorf("reload %d: want one WARN line naming %s, got %q", reload, key, l)
			}
		}
		if w := log.lines("level=WARN"); len(w) != len(restart) {
			t.Errorf("reload %d: want %d WARN lines, got %q", reload, len(restart), w)
		}
	}
	rc := n.planner.Policy().Config()
	if rc.BusyKVUse != 0.8 {
		t.Errorf("busy_kv_use %v, want the live change to 0.8", rc.BusyKVUse)
	}
	if rc.Seed != 0 || n.cfg.ForwardAttempts != DefaultConfig().ForwardAttempts ||
		n.adm.Config().Queue.DrainWindow != DefaultConfig().Admit.Queue.DrainWindow {
		t.Errorf("a restart-only setting was applied: seed %d, forward attempts %d, drain window %v",
			rc.Seed, n.cfg.ForwardAttempts, n.adm.Config().Queue.DrainWindow)
	}
	log.reset()
	writeFile(t, path, `{"route": {"busy_kv_use": 0.8}}`)
	if err := n.Reload(); err != nil {
		t.Fatal(err)
	}
	if w := log.lines("level=WARN"); len(w) != 0 {
		t.Errorf("the file is back to what the node runs with, yet: %q", w)
	}
}

// TestReloadKeepsFlagsOverTheFile pins the precedence across a reload: a setting given by a
// flag (Overrides) wins over the reloaded file as it did at start, while the file's other
// changes apply.
func TestReloadKeepsFlagsOverTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kvmesh.json")
	writeFile(t, path, `{"admission": {"slo": {"normal": {"ttft": "3s"}}}}`)
	n, log := reloadable(t, path, func(c *Config) { c.Admit.SLO.Normal.TTFT = admit.Duration(500 * time.Millisecond) })
	if v := sloVerdict(n); v != admit.CodeSLOUnattainable {
		t.Fatalf("at start: verdict %s; the flag's 500ms target should refuse", v)
	}
	writeFile(t, path, `{"admission": {"slo": {"normal": {"ttft": "5s"}}}, "route": {"busy_kv_use": 0.7}}`)
	if err := n.Reload(); err != nil {
		t.Fatal(err)
	}
	if v := sloVerdict(n); v != admit.CodeSLOUnattainable {
		t.Errorf("after the reload: verdict %s; the flag's 500ms target should still refuse", v)
	}
	if got := n.planner.Policy().Config().BusyKVUse; got != 0.7 {
		t.Errorf("busy_kv_use %v, want the file's 0.7", got)
	}
	if w := log.lines("level=WARN"); len(w) != 0 {
		t.Errorf("reload warned: %q", w)
	}
}

// TestConfigWatchReloadsChangedFiles pins that a running node reloads the config file and the
// API key file when their content changes, with no signal.
func TestConfigWatchReloadsChangedFiles(t *testing.T) {
	dir := t.TempDir()
	path, keys := filepath.Join(dir, "kvmesh.json"), filepath.Join(dir, "keys")
	writeFile(t, path, `{"admission": {"slo": {"normal": {"ttft": "2s"}}}}`)
	writeFile(t, keys, admit.HashKey("sk-old")+" acme\n")
	n, _ := reloadable(t, path, func(c *Config) { c.APIKeysFile, c.ConfigWatch = keys, 10*time.Millisecond })
	if err := n.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	writeFile(t, path, `{"admission": {"slo": {"normal": {"ttft": "500ms"}}}}`)
	poll.Until(t, 5*time.Second, "the changed TTFT target in force", func() bool { return sloVerdict(n) == admit.CodeSLOUnattainable })
	writeFile(t, keys, admit.HashKey("sk-new")+" acme\n")
	poll.Until(t, 5*time.Second, "the new key in force", func() bool { return n.adm.Keys().Valid("sk-new") })
	if bad := reloads(n, metrics.ReloadError); bad != 0 {
		t.Errorf("%v reloads failed", bad)
	}
}

// TestReloadIsRaceFree runs decisions, scrapes and reloads at once, for the race detector.
func TestReloadIsRaceFree(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kvmesh.json")
	files := []string{
		`{"admission": {"slo": {"normal": {"ttft": "2s"}}, "queue": {"max_requests": 10}}, "route": {"weights": {"free_kv": 1}}}`,
		`{"admission": {"slo": {"normal": {"ttft": "1s"}}, "queue": {"max_requests": 20}}, "route": {"weights": {"free_kv": 0.5}}}`,
	}
	writeFile(t, path, files[0])
	n, _ := reloadable(t, path, nil)
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				sloVerdict(n)
				_, _ = n.planner.Policy().Route(time.Now(), route.Request{Model: DefaultModel, PromptTokens: 100},
					[]route.Peer{{Name: "p", Models: []string{DefaultModel}, Healthy: true}}, nil)
				if _, err := n.reg.Gather(); err != nil {
					t.Error(err)
				}
			}
		})
	}
	for i := range 20 {
		writeFile(t, path, files[i%2])
		if err := n.Reload(); err != nil {
			t.Error(err)
		}
	}
	close(done)
	wg.Wait()
}

// TestDeletedKeyFileIsLoudAndKeepsTheKeys pins that the watch does not pass over a deleted API
// key file in silence: one WARN and one count of kvmesh_config_files_missing_total while it
// stays gone, the keys read last still in force (no key at all would open the API), and the
// file's return read as a change.
func TestDeletedKeyFileIsLoudAndKeepsTheKeys(t *testing.T) {
	dir := t.TempDir()
	path, keys := filepath.Join(dir, "kvmesh.json"), filepath.Join(dir, "keys")
	writeFile(t, path, `{}`)
	writeFile(t, keys, admit.HashKey("sk-old")+" acme\n")
	n, log := reloadable(t, path, func(c *Config) { c.APIKeysFile, c.ConfigWatch = keys, 10*time.Millisecond })
	if err := n.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	missing := func() float64 { return testutil.ToFloat64(n.m.FilesMissing.WithLabelValues(metrics.FileAPIKeys)) }
	if err := os.Remove(keys); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 5*time.Second, "the deleted key file counted", func() bool { return missing() == 1 })
	// More rounds of the watch: still one line and one count, and no reload.
	for range 3 {
		if n.filesChanged() {
			t.Error("a deleted file read as changed")
		}
	}
	if w := log.lines("a watched file is gone"); len(w) != 1 || !strings.Contains(w[0], "level=WARN") {
		t.Errorf("log lines on the deletion: %q, want one WARN", w)
	}
	if got := missing(); got != 1 {
		t.Errorf("kvmesh_config_files_missing_total{file=\"api_keys\"} = %v, want 1", got)
	}
	if !n.adm.Keys().Valid("sk-old") {
		t.Error("the deleted file's keys are no longer in force")
	}
	writeFile(t, keys, admit.HashKey("sk-new")+" acme\n")
	poll.Until(t, 5*time.Second, "the returned file's key in force", func() bool { return n.adm.Keys().Valid("sk-new") })
	if w := log.lines("a watched file is back"); len(w) != 1 {
		t.Errorf("log lines on the return: %q, want one", w)
	}
}
