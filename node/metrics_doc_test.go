package node

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/admit/agent"
	"github.com/kvmesh/kvmesh/carbon"
	"github.com/kvmesh/kvmesh/carbon/provider"
	"github.com/kvmesh/kvmesh/node/transport"
)

var update = flag.Bool("update", false, "rewrite testdata/metrics.golden from the node's registry")

const (
	metricsGolden = "testdata/metrics.golden"
	operatingDoc  = "../docs/operating.md"
)

// metricFamily is one exported family as the golden file lists it.
type metricFamily struct{ name, typ, help string }

func (f metricFamily) String() string { return f.name + " " + f.typ + " " + f.help }

// TestMetricsGolden pins every kvmesh_* family a node can export and the vllm:* ones of kvmesh
// engine (name, type, help) to testdata/metrics.golden. Regenerate with: go test ./node -run TestMetricsGolden -update
func TestMetricsGolden(t *testing.T) {
	var b strings.Builder
	for _, f := range exportedFamilies(t) {
		b.WriteString(f.String())
		b.WriteByte('\n')
	}
	got := b.String()
	if *update {
		if err := os.MkdirAll(filepath.Dir(metricsGolden), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(metricsGolden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	data, err := os.ReadFile(metricsGolden)
	if err != nil {
		t.Fatalf("%v (create it with: go test ./node -run TestMetricsGolden -update)", err)
	}
	want := string(data)
	if got == want {
		return
	}
	gotLines, wantLines := strings.Split(got, "\n"), strings.Split(want, "\n")
	for _, l := range gotLines {
		if l != "" && !slices.Contains(wantLines, l) {
			t.Errorf("exported, not in %s: %s", metricsGolden, l)
		}
	}
	for _, l := range wantLines {
		if l != "" && !slices.Contains(gotLines, l) {
			t.Errorf("in %s, not exported: %s", metricsGolden, l)
		}
	}
	t.Log("if the change is meant, regenerate with: go test ./node -run TestMetricsGolden -update, and update docs/operating.md")
}

// TestOperatingDocListsEveryMetric fails for each exported family that docs/operating.md does
// not name in backticks.
func TestOperatingDocListsEveryMetric(t *testing.T) {
	data, err := os.ReadFile(operatingDoc)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	fams := exportedFamilies(t)
	if len(fams) == 0 {
		t.Fatal("no metric families found")
	}
	for _, f := range fams {
		if !strings.Contains(doc, "`"+f.name+"`") {
			t.Errorf("%s does not document metric `%s` (%s: %s)", operatingDoc, f.name, f.typ, f.help)
		}
	}
}

// exportedFamilies builds three nodes that between them register every family a node exports
// (one on the embedded engine with agent admission, carbon and the sim GPU on; one in front of
// an external engine; one standalone, as kvmesh engine runs it) and lists their kvmesh_* and
// vllm:* families, sorted by name. The list comes from the registries' descriptors, so a
// vector with no series yet is listed too.
func exportedFamilies(t *testing.T) []metricFamily {
	t.Helper()
	dir := t.TempDir()
	if err := transport.NewDevCA(dir, "golden-sim", "golden-ext", "golden-engine"); err != nil {
		t.Fatal(err)
	}
	build := func(name string, configure func(*Config)) *Node {
		t.Helper()
		tlsCfg, err := transport.LoadTLS(dir, name)
		if err != nil {
			t.Fatal(err)
		}
		cfg := DefaultConfig()
		cfg.Name, cfg.TLS, cfg.GPU = name, tlsCfg, "sim"
		cfg.HTTPAddr, cfg.QUICAddr = "127.0.0.1:0", "127.0.0.1:0"
		cfg.Gossip.BindAddr, cfg.Gossip.BindPort, cfg.Gossip.Insecure = "127.0.0.1", 0, true
		configure(&cfg)
		n, err := New(cfg) // New binds nothing and starts no goroutine
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = n.Shutdown(t.Context()) })
		return n
	}
	sim := build("golden-sim", func(cfg *Config) {
		ac := agent.DefaultConfig()
		cfg.Agents = &ac
		cfg.Carbon = &CarbonConfig{
			Provider: provider.Config{Kind: provider.KindStatic, StaticIntensity: 100},
			Tracker:  carbon.DefaultConfig(),
		}
	})
	ext := build("golden-ext", func(cfg *Config) { cfg.Engine, cfg.EngineKVEvents = "http://127.0.0.1:1", "tcp://127.0.0.1:1" })
	engine := build("golden-engine", func(cfg *Config) {
		cfg.Standalone = true
		cfg.Sim.LoRAModules = map[string]string{"golden-adapter": "/lora"} // vllm:lora_requests_info
	})

	for _, n := range []*Node{sim, ext, engine} {
		n.adm.Room().SetPrefillRate("m", "", 1000) // a pool, as the room loop sets once a second
	}
	byName := map[string]metricFamily{}
	for _, reg := range []*prometheus.Registry{sim.Registry(), ext.Registry(), engine.Registry()} {
		for _, f := range registryFamilies(t, reg) {
			if prev, ok := byName[f.name]; ok && prev != f {
				t.Errorf("two nodes export %s differently: %q and %q", f.name, prev, f)
			}
			byName[f.name] = f
		}
	}
	out := make([]metricFamily, 0, len(byName))
	for _, f := range byName {
		out = append(out, f)
	}
	slices.SortFunc(out, func(a, b metricFamily) int { return strings.Compare(a.name, b.name) })
	return out
}

func documentedFamily(name string) bool {
	return strings.HasPrefix(name, "kvmesh_") || strings.HasPrefix(name, "vllm:")
}

var descRE = regexp.MustCompile(`^Desc\{fqName: ("(?:[^"\\]|\\.)*"), help: ("(?:[^"\\]|\\.)*"),`)

// registryFamilies lists reg's kvmesh_* and vllm:* families. Names and help come from Describe;
// the type from a gathered sample, or, for a vector without series, from the registered vector
// itself (found by registering a collector with the same descriptor, which the registry
// answers with the collector it already holds).
func registryFamilies(t *testing.T, reg *prometheus.Registry) []metricFamily {
	t.Helper()
	ch := make(chan *prometheus.Desc)
	go func() {
		reg.Describe(ch)
		close(ch)
	}()
	descs := map[string]*prometheus.Desc{}
	fams := map[string]metricFamily{}
	for d := range ch {
		m := descRE.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("cannot read descriptor %s", d)
		}
		name, err1 := strconv.Unquote(m[1])
		help, err2 := strconv.Unquote(m[2])
		if err := errors.Join(err1, err2); err != nil {
			t.Fatalf("descriptor %s: %v", d, err)
		}
		if documentedFamily(name) {
			descs[name] = d
			fams[name] = metricFamily{name: name, help: help}
		}
	}
	gathered, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range gathered {
		if !documentedFamily(mf.GetName()) {
			continue
		}
		f, ok := fams[mf.GetName()]
		if !ok {
			f = metricFamily{name: mf.GetName(), help: mf.GetHelp()}
		}
		f.typ = strings.ToLower(mf.GetType().String())
		fams[f.name] = f
	}
	out := make([]metricFamily, 0, len(fams))
	for name, f := range fams {
		if f.typ == "" {
			f.typ = vectorType(reg, descs[name])
		}
		if f.typ == "" {
			t.Errorf("%s has no series and is not a plain vector: give it a series in exportedFamilies so its type shows", name)
			continue
		}
		out = append(out, f)
	}
	return out
}

// descProbe is a collector that describes one existing descriptor and collects nothing.
type descProbe struct{ d *prometheus.Desc }

func (p descProbe) Describe(ch chan<- *prometheus.Desc) { ch <- p.d }
func (p descProbe) Collect(chan<- prometheus.Metric)    {}

// vectorType returns the type of the vector registered in reg under descriptor d, or "" when
// d belongs to some other collector.
func vectorType(reg *prometheus.Registry, d *prometheus.Desc) string {
	err := reg.Register(descProbe{d})
	if err == nil {
		reg.Unregister(descProbe{d})
		return ""
	}
	var are prometheus.AlreadyRegisteredError
	if !errors.As(err, &are) {
		return ""
	}
	switch are.ExistingCollector.(type) {
	case *prometheus.CounterVec:
		return "counter"
	case *prometheus.GaugeVec:
		return "gauge"
	case *prometheus.HistogramVec:
		return "histogram"
	case *prometheus.SummaryVec:
		return "summary"
	}
	return ""
}
