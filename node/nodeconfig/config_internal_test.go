package nodeconfig

import (
	"bytes"
	"crypto/tls"
	"encoding"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/admit/agent"
	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/jsonconf"
)

func TestLoadConfigFileReadsEverySection(t *testing.T) {
	file := `{
	  "node": {"name": "gpu-7", "http_addr": ":9090", "drain_timeout": "45s", "forward_attempts": 2, "retry_after": 2,
	           "max_agent_id_bytes": 128, "tls_dir": "/etc/kvmesh/tls", "admission_mode": "none"},
	  "gossip": {"bind_port": 7000, "join": ["10.0.0.1:7946"]},
	  "route": {"busy_kv_use": 0.9, "stale_after": "2s", "gate_max_slack": 2, "weights": {"power": -1}, "stale_policy": "open"},
	  "admission": {"queue": {"ttl": "30s", "dispatch_slack": 0.25}},
	  "agents": {"interval": "250ms", "lease_intervals": 7, "idle_timeout": "1m", "controller": {"max_window": 64}},
	  "carbon": {"provider": {"kind": "static", "static_intensity": 250}, "tracker": {"fail_mode": "closed"}},
	  "sim": {"kv_blocks": 8192, "step_fixed": "4ms"}
	}`
	base := DefaultConfig()
	cfg, err := LoadConfigFile([]byte(file), base)
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name string
		ok   bool
	}{
		{"node name", cfg.Name == "gpu-7"},
		{"node http", cfg.HTTPAddr == ":9090"},
		{"node duration string", cfg.DrainTimeout == 45*time.Second},
		{"node duration seconds", cfg.RetryAfter == 2*time.Second},
		{"node forward attempts", cfg.ForwardAttempts == 2},
		{"node max agent id", cfg.MaxAgentIDBytes == 128},
		{"node tls dir", cfg.TLSDir == "/etc/kvmesh/tls"},
		{"node admission mode", cfg.Admission == AdmissionNone},
		{"node keeps what the file omits", cfg.QUICAddr == base.QUICAddr && cfg.Policy == base.Policy},
		{"gossip", cfg.Gossip.BindPort == 7000 && len(cfg.Gossip.Join) == 1 && cfg.Gossip.StaleAfter == 2*time.Second && cfg.Route.MaxAge == 2*time.Second},
		{"gossip keeps what the file omits", cfg.Gossip.BindAddr == base.Gossip.BindAddr},
		{"route", cfg.Route.BusyKVUse == 0.9 && cfg.Route.GateMaxSlack == 2*time.Second && cfg.Route.StalePolicy == route.StaleOpen},
		{"route weights", cfg.Route.Weights.Power == -1 && cfg.Route.Weights.Prefix == base.Route.Weights.Prefix},
		{"admission", time.Duration(cfg.Admit.Queue.TTL) == 30*time.Second && cfg.Admit.Queue.DispatchSlack == 0.25 &&
			cfg.Admit.Queue.MaxRequests == base.Admit.Queue.MaxRequests},
		{"agents on", cfg.Agents != nil && cfg.Agents.Controller.MaxWindow == 64 && cfg.Agents.IdleTimeout == time.Minute &&
			cfg.Agents.StepTimeout == agent.DefaultConfig().StepTimeout},
		{"agents timing", cfg.AgentInterval == 250*time.Millisecond && cfg.AgentLeaseIntervals == 7},
		{"carbon on", cfg.Carbon != nil && cfg.Carbon.Provider.StaticIntensity == 250 && cfg.Carbon.Tracker.FailMode.String() == "closed" &&
			cfg.Carbon.Tracker.Threshold == DefaultCarbonConfig().Tracker.Threshold && cfg.Carbon.FetchTimeout == DefaultCarbonConfig().FetchTimeout},
		{"sim", cfg.Sim.KVBlocks == 8192 && cfg.Sim.StepFixed == 4*time.Millisecond && cfg.Sim.MaxNumSeqs == base.Sim.MaxNumSeqs},
	}
	for _, c := range checks {
		if !c.ok {
			t.Errorf("%s: not as the file says", c.name)
		}
	}
	if base.Name != "" || base.Agents != nil || base.Carbon != nil || len(base.Gossip.Join) != 0 {
		t.Errorf("LoadConfigFile changed its base: %+v", base)
	}
}

func TestLoadConfigFileRejects(t *testing.T) {
	tests := []struct {
		name, file, want string
	}{
		{"unknown section", `{"nodes": {}}`, `unknown key "nodes"`},
		{"unknown node key", `{"node": {"http": ":1"}}`, `unknown key "node.http"`},
		{"a section inside node", `{"node": {"gossip": {}}}`, `unknown key "node.gossip"`},
		{"unknown nested route key", `{"route": {"weights": {"prefx": 1}}}`, `unknown key "route.weights.prefx"`},
		{"unknown agent controller key", `{"agents": {"controller": {"window": 3}}}`, `unknown key "agents.controller.window"`},
		{"unknown admission key", `{"admission": {"queue": {"ttll": "1s"}}}`, `unknown key "admission.queue.ttll"`},
		{"unknown admission key in a map's element", `{"admission": {"models": {"m": {"context_tokenz": 1}}}}`, `unknown key "admission.models.m.context_tokenz"`},
		{"a secret has no key", `{"gossip": {"key": "AAAA"}}`, `unknown key "gossip.key"`},
		{"a bad duration", `{"route": {"stale_after": "3 seconds"}}`, `route.stale_after: duration "3 seconds"`},
		{"a wrong type", `{"node": {"forward_attempts": "two"}}`, `forward_attempts`},
		{"an admission setting at the top of a new file", `{"node": {}, "queue": {}}`, `"queue" is an admission setting: put it in the "admission" section`},
		{"an admission zero that used to mean off", `{"admission": {"queue": {"backfill": 0}}}`, `admission.queue.backfill: 0 is refused, as it once turned the setting off: write -1 to turn it off, or leave the key out for the default (8)`},
		{"a bad stale policy", `{"route": {"stale_policy": "sometimes"}}`, `stale policy "sometimes"`},
		{"not an object", `[1]`, `config file`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := LoadConfigFile([]byte(tt.file), DefaultConfig())
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want one containing %s", err, tt.want)
			}
			if !strings.HasPrefix(err.Error(), "node: config file") {
				t.Errorf("error %q lacks the package prefix", err)
			}
		})
	}
	_, err := LoadConfigFile([]byte(`{"route": {"weights": {"prefx": 1}}}`), DefaultConfig())
	if !errors.Is(err, jsonconf.ErrUnknownKey) {
		t.Errorf("unknown key error %v does not wrap jsonconf.ErrUnknownKey", err)
	}
}

func TestConfigFileTurnsFeaturesOnAndOff(t *testing.T) {
	on := DefaultConfig()
	ac := agent.DefaultConfig()
	cc := DefaultCarbonConfig()
	on.Agents, on.Carbon = &ac, &cc
	tests := []struct {
		name             string
		base             Config
		file             string
		agents, carbon   bool
		wantMaxWindowSet int
	}{
		{"absent sections leave them off", DefaultConfig(), `{}`, false, false, 0},
		{"an empty section turns the feature on at its defaults", DefaultConfig(), `{"agents": {}, "carbon": {}}`, true, true, agent.DefaultControllerConfig().MaxWindow},
		{"absent sections leave them on", on, `{"node": {}}`, true, true, agent.DefaultControllerConfig().MaxWindow},
		{"null turns them off", on, `{"agents": null, "carbon": null}`, false, false, 0},
		{"a section reads over the base's", on, `{"agents": {"controller": {"max_window": 9}}}`, true, true, 9},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := LoadConfigFile([]byte(tt.file), tt.base)
			if err != nil {
				t.Fatal(err)
			}
			if (cfg.Agents != nil) != tt.agents || (cfg.Carbon != nil) != tt.carbon {
				t.Fatalf("agents %v, carbon %v; want %v, %v", cfg.Agents != nil, cfg.Carbon != nil, tt.agents, tt.carbon)
			}
			if cfg.Agents != nil && cfg.Agents.Controller.MaxWindow != tt.wantMaxWindowSet {
				t.Errorf("max window %d, want %d", cfg.Agents.Controller.MaxWindow, tt.wantMaxWindowSet)
			}
		})
	}
	if ac.Controller.MaxWindow != agent.DefaultControllerConfig().MaxWindow {
		t.Errorf("decoding changed the base's agent config")
	}
}

func TestLegacyAdmissionFile(t *testing.T) {
	legacy := []byte(`{"models": {"m": {"context_tokens": 4096}}, "queue": {"ttl": "20s"}}`)
	if !ConfigFileIsLegacy(legacy) {
		t.Fatal("an admit.Config file is not recognised as legacy")
	}
	if ConfigFileIsLegacy([]byte(`{"admission": {"queue": {"ttl": "20s"}}}`)) || ConfigFileIsLegacy([]byte(`{}`)) {
		t.Fatal("a sectioned file taken for a legacy one")
	}
	cfg, err := LoadConfigFile(legacy, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	if time.Duration(cfg.Admit.Queue.TTL) != 20*time.Second || cfg.Admit.Models["m"].ContextTokens != 4096 || cfg.HTTPAddr != DefaultConfig().HTTPAddr {
		t.Errorf("legacy file loaded as %+v", cfg.Admit)
	}
	// The same settings nested under "admission" load the same.
	nested, err := LoadConfigFile([]byte(`{"admission": `+string(legacy)+`}`), DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	a, _ := MarshalConfigFile(cfg)
	b, _ := MarshalConfigFile(nested)
	if string(a) != string(b) {
		t.Errorf("legacy and nested admission files differ:\n%s\n%s", a, b)
	}
}

// TestConfigFileRoundTrip pins that MarshalConfigFile's output reads back to the same config,
// with every feature on and settings away from their defaults.
func TestConfigFileRoundTrip(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Name, cfg.TLSDir, cfg.ForwardAttempts, cfg.RetryAfter = "gpu-7", "/tls", 5, 1500*time.Millisecond
	cfg.Gossip.Join, cfg.Gossip.Key = []string{"a:1", "b:2"}, []byte("0123456789abcdef")
	cfg.Route.Weights.Power, cfg.Route.ModelBytes, cfg.Route.DisablePowerCapFilter = -1, map[string]uint64{"m": 1 << 30}, true
	cfg.Route.DecodeLocalPrefill = new(bool)
	cfg.Admit.Queue.Backfill, cfg.Admit.Tenants = -1, nil
	ac := agent.DefaultConfig()
	ac.Controller.MaxWindow, ac.Controller.InitialWindow = 32, 4
	cc := DefaultCarbonConfig()
	cc.Provider.Kind, cc.Provider.Zone, cc.Provider.Token, cc.TokenFile = "electricitymaps", "DE", "secret", "/run/token"
	cfg.Agents, cfg.Carbon, cfg.AgentInterval = &ac, &cc, 300*time.Millisecond
	cfg.Sim.TimeScale, cfg.Sim.StepPerContextToken = 20, 35*time.Nanosecond
	cfg.OTLPEndpoint, cfg.TraceSample = "http://collector:4318/v1/traces", -1

	for _, c := range []struct {
		name string
		cfg  Config
	}{{"defaults", DefaultConfig()}, {"everything set", cfg}} {
		t.Run(c.name, func(t *testing.T) {
			out, err := MarshalConfigFile(c.cfg)
			if err != nil {
				t.Fatal(err)
			}
			for _, secret := range []string{"secret", "MDEyMzQ1Njc4OWFiY2RlZg"} {
				if strings.Contains(string(out), secret) {
					t.Errorf("the printed config holds a secret (%s):\n%s", secret, out)
				}
			}
			back, err := LoadConfigFile(out, DefaultConfig())
			if err != nil {
				t.Fatalf("the printed config does not load: %v\n%s", err, out)
			}
			again, err := MarshalConfigFile(back)
			if err != nil {
				t.Fatal(err)
			}
			if string(again) != string(out) {
				t.Errorf("round trip changed the config:\n%s\nthen\n%s", out, again)
			}
			y, err := MarshalConfigFileYAML(c.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if back, err = LoadConfigFile(y, DefaultConfig()); err != nil {
				t.Fatalf("the printed YAML does not load: %v\n%s", err, y)
			}
			if again, _ := MarshalConfigFile(back); string(again) != string(out) {
				t.Errorf("the YAML round trip changed the config:\n%s\nthen\n%s", y, again)
			}
		})
	}
}

// TestPrintedConfigHasEveryKey pins that MarshalConfigFile, and so kvmesh config defaults,
// prints every key the config file accepts, found by walking the file's Go types: a key left
// out (omitempty on a nil default) would read back the same, so the round trip cannot see it.
// A section that is off prints as null; with agents and carbon on, their keys must show too.
func TestPrintedConfigHasEveryKey(t *testing.T) {
	keys := fileKeys(reflect.TypeFor[fileLayout[admit.Config]](), "")
	if len(keys) < 100 {
		t.Fatalf("found only %d keys: %q", len(keys), keys)
	}
	on := DefaultConfig()
	ac, cc := agent.DefaultConfig(), DefaultCarbonConfig()
	on.Agents, on.Carbon = &ac, &cc
	for name, cfg := range map[string]Config{"defaults": DefaultConfig(), "every section on": on} {
		out, err := MarshalConfigFile(cfg)
		if err != nil {
			t.Fatal(err)
		}
		var tree map[string]any
		if err := json.Unmarshal(out, &tree); err != nil {
			t.Fatal(err)
		}
		for _, key := range keys {
			if !printed(tree, strings.Split(key, "."), cfg.Agents == nil || cfg.Carbon == nil) {
				t.Errorf("%s: %s is not printed", name, key)
			}
		}
	}
}

// fileKeys lists the keys a value of type t accepts in a config file, as paths under prefix:
// the JSON names of its fields, those of untagged embedded structs promoted as encoding/json
// does, those tagged advanced in their struct's advanced object, down to values that are not
// structs or decode themselves (durations, policies); a map is one key.
func fileKeys(t reflect.Type, prefix string) []string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	p := reflect.PointerTo(t)
	if t.Kind() != reflect.Struct || p.Implements(reflect.TypeFor[json.Unmarshaler]()) ||
		p.Implements(reflect.TypeFor[encoding.TextUnmarshaler]()) {
		return []string{prefix}
	}
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case name == "-" || (!f.IsExported() && !f.Anonymous):
			continue
		case f.Anonymous && name == "":
			out = append(out, fileKeys(f.Type, prefix)...)
			continue
		case name == "":
			name = f.Name
		}
		if slices.Contains(strings.Split(opts, ","), "advanced") {
			name = jsonconf.AdvancedKey + "." + name
		}
		if prefix != "" {
			name = prefix + "." + name
		}
		out = append(out, fileKeys(f.Type, name)...)
	}
	return out
}

// printed reports whether tree holds the key at path, or, with offOK, a null on the way to it
// (a section that is off).
func printed(tree map[string]any, path []string, offOK bool) bool {
	v, ok := tree[path[0]]
	switch {
	case !ok:
		return false
	case len(path) == 1:
		return true
	case v == nil:
		return offOK
	}
	sub, ok := v.(map[string]any)
	return ok && printed(sub, path[1:], offOK)
}

// TestConfigFileFormats pins how a config file's format is told: YAML and JSON saying the same
// thing read the same, by content when the name says nothing, by the name when it does.
func TestConfigFileFormats(t *testing.T) {
	const (
		js = `{"node": {"forward_attempts": 2}, "route": {"weights": {"power": -1}}, "admission": {"queue": {"ttl": "30s"}}}`
		ym = "# comments are fine\nnode:\n  forward_attempts: 2\nroute:\n  weights: {power: -1}\nadmission:\n  queue:\n    ttl: 30s\n"
	)
	want, err := LoadConfigFile([]byte(js), DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	wantOut, _ := MarshalConfigFile(want)
	dir := t.TempDir()
	for _, tt := range []struct {
		name, content string
		ok            bool
	}{
		{"kvmesh.json", js, true},
		{"kvmesh.yaml", ym, true},
		{"kvmesh.yml", ym, true},
		{"kvmesh.yaml", js, true}, // JSON is YAML
		{"kvmesh.conf", ym, true},
		{"kvmesh.conf", js, true},
		{"kvmesh.json", ym, false},
	} {
		path := filepath.Join(dir, tt.name)
		if err := os.WriteFile(path, []byte(tt.content), 0o600); err != nil {
			t.Fatal(err)
		}
		got, _, err := ReadConfigFile(path, DefaultConfig())
		if !tt.ok {
			if err == nil {
				t.Errorf("%s holding YAML read without an error", tt.name)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tt.name, err)
			continue
		}
		if out, _ := MarshalConfigFile(got); string(out) != string(wantOut) {
			t.Errorf("%s read differently from the JSON:\n%s", tt.name, out)
		}
		if got.ConfigFile != path || got.fileSum != ContentSum([]byte(tt.content)) {
			t.Errorf("%s: ConfigFile %q, sum %q; want the file and its hash", tt.name, got.ConfigFile, got.fileSum)
		}
	}
	if _, err := LoadConfigFile([]byte("route:\n  max_agee: 1s\n"), DefaultConfig()); err == nil || !strings.Contains(err.Error(), `unknown key "route.max_agee"`) {
		t.Errorf("an unknown YAML key: %v", err)
	}
	if !ConfigFileIsLegacy([]byte("queue:\n  ttl: 20s\n")) {
		t.Error("an admission-only YAML file is not told legacy")
	}
}

// TestConfigZeroRule pins that Fill fills the node's zero fields, the new ones included, and
// Validate rejects negative ones.
func TestConfigZeroRule(t *testing.T) {
	c := Config{Name: "n", Standalone: true}
	c.Fill()
	d := DefaultConfig()
	if c.ForwardAttempts != 3 || c.AgentLeaseIntervals != 5 || c.RetryAfter != time.Second || c.MaxAgentIDBytes != 256 ||
		c.HTTPAddr != d.HTTPAddr || c.DrainTimeout != d.DrainTimeout || c.AgentInterval != DefaultAgentInterval || len(c.Models) != 1 ||
		c.DrainDelay != d.DrainDelay || c.BodyTimeout != d.BodyTimeout || c.IdleTimeout != d.IdleTimeout ||
		c.TraceSample != 1 {
		t.Errorf("filled %+v", c)
	}
	for name, mod := range map[string]func(*Config){
		"forward attempts":  func(c *Config) { c.ForwardAttempts = -1 },
		"lease intervals":   func(c *Config) { c.AgentLeaseIntervals = -1 },
		"retry after":       func(c *Config) { c.RetryAfter = -time.Second },
		"max agent id":      func(c *Config) { c.MaxAgentIDBytes = -1 },
		"drain timeout":     func(c *Config) { c.DrainTimeout = -time.Second },
		"body timeout":      func(c *Config) { c.BodyTimeout = -time.Second },
		"agent id too long": func(c *Config) { c.MaxAgentIDBytes = 4096 },
		"idle timeout":      func(c *Config) { c.IdleTimeout = -time.Second },
		"admission mode":    func(c *Config) { c.Admission = "maybe" },
		"no name":           func(c *Config) { c.Name = "" },
		"trace sample":      func(c *Config) { c.TraceSample = 1.5 },
		"otlp endpoint":     func(c *Config) { c.OTLPEndpoint = "collector" },
	} {
		t.Run(name, func(t *testing.T) {
			c := DefaultConfig()
			c.Name, c.Standalone = "n", true
			mod(&c)
			c.Fill()
			if err := c.Validate(); err == nil || !strings.HasPrefix(err.Error(), "node: ") {
				t.Errorf("Validate = %v, want a node error", err)
			}
		})
	}
}

// TestConfigRoles pins the node's role and its embedded engine's: one role for both (a prefill
// or decode role named on either side is both's; two different ones are an error; another
// word is a whole-request label); in front of an external engine, prefill and decode only for
// vLLM's kind; kvmesh engine in any role.
func TestConfigRoles(t *testing.T) {
	for _, tt := range []struct {
		name, role, simRole, engine string
		standalone                  bool
		ok                          bool
		wantRole, wantSim           string
	}{
		{"default", "", "", "", false, true, "", ""},
		{"mixed", "mixed", "", "", false, true, "mixed", ""},
		{"prefill node", "prefill", "", "", false, true, "prefill", "prefill"},
		{"decode node", "decode", "", "", false, true, "decode", "decode"},
		{"decode engine", "", "decode", "", false, true, "decode", "decode"},
		{"same both", "prefill", "prefill", "", false, true, "prefill", "prefill"},
		{"mixed both ways", "", "mixed", "", false, true, "", "mixed"},
		{"differ", "prefill", "decode", "", false, false, "", ""},
		{"mixed node, prefill engine", "mixed", "prefill", "", false, true, "prefill", "prefill"},
		{"prefill node, mixed engine", "prefill", "mixed", "", false, true, "prefill", "prefill"},
		{"a label", "ingress", "", "", false, true, "ingress", ""},
		{"a label and a prefill engine", "ingress", "prefill", "", false, false, "", ""},
		{"external prefill", "prefill", "", "http://127.0.0.1:8000", false, true, "prefill", ""},
		{"external mixed", "mixed", "", "http://127.0.0.1:8000", false, true, "mixed", ""},
		{"kvmesh engine mixed", "", "mixed", "", true, true, "", "mixed"},
		{"kvmesh engine prefill", "", "prefill", "", true, true, "prefill", "prefill"},
		{"kvmesh engine decode", "", "decode", "", true, true, "decode", "decode"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Name, cfg.Standalone, cfg.Role, cfg.Sim.Role = "n", tt.standalone, tt.role, tt.simRole
			if tt.engine != "" {
				cfg.Engine = tt.engine
			}
			if !tt.standalone {
				cfg.TLS = &tls.Config{}
			}
			cfg.Fill()
			err := cfg.Validate()
			if (err == nil) != tt.ok {
				t.Fatalf("Validate = %v, want ok %v", err, tt.ok)
			}
			if tt.ok && (cfg.Role != tt.wantRole || cfg.Sim.Role != tt.wantSim) {
				t.Errorf("role %q, sim.role %q; want %q and %q", cfg.Role, cfg.Sim.Role, tt.wantRole, tt.wantSim)
			}
		})
	}
	cfg := DefaultConfig()
	cfg.Name, cfg.Role, cfg.Engine, cfg.EngineKind, cfg.TLS = "n", "decode", "http://127.0.0.1:8000", "sglang", &tls.Config{}
	cfg.Fill()
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "vllm") {
		t.Errorf("a decode node in front of SGLang: %v, want an error naming vllm", err)
	}
}

// TestConfigFileFormerKeys pins one key a concept: a key under its former name (staleness in
// gossip, the KV link, KV size and role in sim) is read at its name now, for every layer, with
// a WARN naming both; the two names given different values are an error naming both paths.
func TestConfigFileFormerKeys(t *testing.T) {
	for _, tt := range []struct {
		name, file string
		ok         func(Config) bool
		warn, err  string
	}{
		{"route.max_age", `{"route": {"max_age": "5s"}}`, func(c Config) bool {
			return c.Route.MaxAge == 5*time.Second && c.Gossip.StaleAfter == 5*time.Second
		}, "key=route.max_age now=route.stale_after", ""},
		{"gossip.stale_after", `{"gossip": {"stale_after": "4s"}}`, func(c Config) bool {
			return c.Route.MaxAge == 4*time.Second && c.Gossip.StaleAfter == 4*time.Second
		}, "key=gossip.stale_after now=route.stale_after", ""},
		{"gossip.stale_policy", `{"gossip": {"stale_policy": "open"}}`, func(c Config) bool {
			return c.Route.StalePolicy == route.StaleOpen && c.Gossip.StalePolicy == gossip.FailOpen
		}, "key=gossip.stale_policy now=route.stale_policy", ""},
		{"sim.link_gbps", `{"sim": {"link_gbps": 10}}`, func(c Config) bool { return c.Route.LinkGBps == 10 && c.Sim.LinkGBps == 10 },
			"key=sim.link_gbps now=route.link_gbps", ""},
		{"sim.kv_bytes_per_token", `{"sim": {"kv_bytes_per_token": 65536}}`, func(c Config) bool {
			return c.Route.KVBytesPerToken == 65536 && c.Sim.KVBytesPerToken == 65536
		}, "key=sim.kv_bytes_per_token now=route.kv_bytes_per_token", ""},
		{"sim.role", `{"sim": {"role": "prefill"}}`, func(c Config) bool { return c.Role == "prefill" },
			"key=sim.role now=node.role", ""},
		{"both names, one value", `{"route": {"stale_after": "3s"}, "gossip": {"stale_after": 3}}`, func(c Config) bool {
			return c.Route.MaxAge == 3*time.Second
		}, "key=gossip.stale_after", ""},
		{"staleness twice", `{"route": {"stale_after": "3s"}, "gossip": {"stale_after": "5s"}}`, nil, "",
			`"gossip.stale_after" and "route.stale_after" name one setting`},
		{"stale policy twice", `{"route": {"stale_policy": "closed"}, "gossip": {"stale_policy": "open"}}`, nil, "",
			`"gossip.stale_policy" and "route.stale_policy" name one setting`},
		{"link twice", `{"route": {"link_gbps": 25}, "sim": {"link_gbps": 10}}`, nil, "",
			`"sim.link_gbps" and "route.link_gbps" name one setting`},
		{"KV size twice", `{"route": {"kv_bytes_per_token": 1024}, "sim": {"kv_bytes_per_token": 2048}}`, nil, "",
			`"sim.kv_bytes_per_token" and "route.kv_bytes_per_token" name one setting`},
		{"role twice", `{"node": {"role": "decode"}, "sim": {"role": "prefill"}}`, nil, "",
			`"sim.role" and "node.role" name one setting`},
		{"two former names", `{"route": {"max_age": "3s"}, "gossip": {"stale_after": "5s"}}`, nil, "",
			`"gossip.stale_after" and "route.max_age" name one setting`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var log bytes.Buffer
			base := DefaultConfig()
			base.Logger = slog.New(slog.NewTextHandler(&log, nil))
			cfg, err := LoadConfigFile([]byte(tt.file), base)
			if tt.err != "" {
				if !errors.Is(err, jsonconf.ErrConflict) || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want a jsonconf.ErrConflict containing %s", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tt.ok(cfg) {
				t.Errorf("not read at the key now: %+v", cfg)
			}
			if !strings.Contains(log.String(), "level=WARN") || !strings.Contains(log.String(), tt.warn) {
				t.Errorf("log %q: want a WARN with %s", log.String(), tt.warn)
			}
		})
	}
}
