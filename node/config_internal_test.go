package node

import (
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/admit/agent"
	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/node/nodeconfig"
)

// standalone is a node config New accepts without TLS: the engine alone, no GPU telemetry.
func standalone() Config {
	c := DefaultConfig()
	c.Name, c.Standalone, c.GPU = "n", true, "none"
	return c
}

// TestConfigFileSettingsReachTheNode pins that what a file says is what New builds with: a
// route setting in the router, an agent setting in the agent window.
func TestConfigFileSettingsReachTheNode(t *testing.T) {
	cfg, err := nodeconfig.LoadConfigFile([]byte(`{"route": {"busy_kv_use": 0.9, "epsilon": -1},
		"agents": {"max_agents": 100, "controller": {"max_window": 64, "slow_start_steps": -1}}}`), standalone())
	if err != nil {
		t.Fatal(err)
	}
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Shutdown(t.Context()) })
	rc := n.planner.Policy().(*route.Router).Config()
	if rc.BusyKVUse != 0.9 || rc.Epsilon != -1 || rc.MaxAge != route.DefaultConfig().MaxAge {
		t.Errorf("router config: busy kv use %v, epsilon %v, max age %v", rc.BusyKVUse, rc.Epsilon, rc.MaxAge)
	}
	if n.agents == nil {
		t.Fatal("agent admission off although the file has an agents section")
	}
	ac := n.agents.Registry().Config()
	if ac.MaxAgents != 100 || ac.Controller.MaxWindow != 64 || ac.Controller.SlowStartSteps != -1 || ac.Controller.Beta != agent.DefaultControllerConfig().Beta {
		t.Errorf("agent config: %+v", ac)
	}
}

// TestKVEventsSettings: the config file's engine_kv_events reaches the external engine, and
// the KV event settings a node cannot use are refused by New with an error naming them.
func TestKVEventsSettings(t *testing.T) {
	cfg, err := nodeconfig.LoadConfigFile([]byte(`{"node": {"engine": "http://127.0.0.1:1", "engine_kv_events": "tcp://127.0.0.1:5557"}}`), standalone())
	if err != nil {
		t.Fatal(err)
	}
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Shutdown(t.Context()) })
	if n.ext == nil || cfg.EngineKVEvents != "tcp://127.0.0.1:5557" {
		t.Fatalf("engine_kv_events %q did not reach an external engine", cfg.EngineKVEvents)
	}
	tests := []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"an endpoint that is not tcp://host:port", func(c *Config) { c.Engine, c.EngineKVEvents = "http://127.0.0.1:1", "127.0.0.1:5557" }, "tcp://host:port"},
		{"vLLM's bind-all endpoint", func(c *Config) { c.Engine, c.EngineKVEvents = "http://127.0.0.1:1", "tcp://*:5557" }, "name the engine's host"},
		{"events of the embedded engine", func(c *Config) { c.EngineKVEvents = "tcp://127.0.0.1:5557" }, "engine_kv_events"},
		{"publishing from an external engine", func(c *Config) { c.Engine, c.PublishKVEvents = "http://127.0.0.1:1", "tcp://127.0.0.1:0" }, "only the embedded engine"},
		{"publishing on a bad endpoint", func(c *Config) { c.PublishKVEvents = "udp://127.0.0.1:0" }, "tcp://host:port"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := standalone()
			tt.mod(&c)
			n, err := New(c)
			if err == nil {
				_ = n.Shutdown(t.Context())
				t.Fatal("New accepted it")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err %q does not say %q", err, tt.want)
			}
		})
	}
}
