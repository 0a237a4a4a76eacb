package node

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/admit/agent"
	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/jsonconf"
	"github.com/kvmesh/kvmesh/node/engine/sim"
)

// The config file (kvmesh node --config FILE) is one JSON object with a section per part of
// the node, each read over the configuration it is given (DefaultConfig, for kvmesh node), so
// a file names only what it changes:
//
//	{
//	  "node":      {"name": "gpu-7", "http_addr": ":8080", "tls_dir": "/etc/kvmesh/tls", "forward_attempts": 2},
//	  "gossip":    {"bind_port": 7946, "join": ["10.0.0.1:7946"]},
//	  "route":     {"busy_kv_use": 0.9, "weights": {"power": -1}},
//	  "admission": {"queue": {"ttl": "30s", "dispatch_slack": 0.25}},
//	  "agents":    {"interval": "250ms", "controller": {"max_window": 64}},
//	  "carbon":    {"provider": {"kind": "static", "static_intensity": 250}},
//	  "sim":       {"kv_blocks": 8192}
//	}
//
// "node" holds Config's own fields, the others Gossip, Route, Admit (admit.Config's format),
// Agents (agent.Config plus "interval" and "lease_intervals"), Carbon and Sim. "agents" and
// "carbon" turn their feature on by being there (null turns it off). Durations are strings
// ("500ms", "5m") or numbers of seconds. A key that names no setting is an error naming it.
// Secrets have no key: the gossip key and the carbon provider's credentials come from the
// environment or flags, so MarshalConfigFile never prints them.
//
// A file whose top level is an admit.Config (the admission-only file of earlier versions) is
// still read, into Admit; ConfigFileIsLegacy tells it apart so the caller can say so.

// Section names of the config file, in the order MarshalConfigFile writes them.
var configSections = []string{"node", "gossip", "route", "admission", "agents", "carbon", "sim"}

// legacyKeys are the top-level keys of an admission-only file (admit.Config).
var legacyKeys = []string{"models", "tenants", "validation", "budget", "keys", "kv", "queue", "slo"}

// agentsSection is the file's "agents": agent.Config with the node's timing of the window.
type agentsSection struct {
	agent.Config
	Interval       time.Duration `json:"interval"`
	LeaseIntervals int           `json:"lease_intervals"`
}

// fileLayout is the config file; A is admit.Config to write and json.RawMessage to read, so
// the admission section is read by admit.DecodeConfig.
type fileLayout[A any] struct {
	Node      Config         `json:"node"`
	Gossip    gossip.Config  `json:"gossip"`
	Route     route.Config   `json:"route"`
	Admission A              `json:"admission"`
	Agents    *agentsSection `json:"agents"`
	Carbon    *CarbonConfig  `json:"carbon"`
	Sim       sim.Config     `json:"sim"`
}

// topLevel reads the file's top-level keys and tells the two formats apart.
func topLevel(data []byte) (map[string]json.RawMessage, bool, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		return nil, false, fmt.Errorf("node: config file: %w", err)
	}
	if top == nil {
		return nil, false, fmt.Errorf("node: config file: want a JSON object")
	}
	sections, legacy := 0, 0
	for k := range top {
		switch {
		case slices.Contains(configSections, k):
			sections++
		case slices.Contains(legacyKeys, k):
			legacy++
		default:
			return nil, false, fmt.Errorf("node: config file: unknown key %q (sections: %s)", k, strings.Join(configSections, ", "))
		}
	}
	if legacy > 0 && sections > 0 {
		for _, k := range legacyKeys {
			if _, ok := top[k]; ok {
				return nil, false, fmt.Errorf("node: config file: %q is an admission setting: put it in the \"admission\" section", k)
			}
		}
	}
	return top, legacy > 0, nil
}

// ConfigFileIsLegacy reports whether data is an admission-only config file (a top-level
// admit.Config, the format of earlier versions), which LoadConfigFile reads into Admit.
func ConfigFileIsLegacy(data []byte) bool {
	_, legacy, err := topLevel(data)
	return err == nil && legacy
}

// LoadConfigFile reads a config file over base and returns the result; base is not changed.
// Unknown keys, and admission settings whose zero meant "off" before zero meant "the
// default", are errors (see admit.DecodeConfig). The result is not validated: New does that.
func LoadConfigFile(data []byte, base Config) (Config, error) {
	top, legacy, err := topLevel(data)
	if err != nil {
		return base, err
	}
	cfg := base
	if legacy {
		if cfg.Admit, err = admit.DecodeConfig(data, base.Admit); err != nil {
			return base, fmt.Errorf("node: config file: %w", err)
		}
		return cfg, nil
	}
	l := fileLayout[json.RawMessage]{Node: base, Gossip: base.Gossip, Route: base.Route, Sim: base.Sim,
		Agents: agentsOf(base), Carbon: base.Carbon}
	if _, on := top["agents"]; on && l.Agents == nil {
		l.Agents = &agentsSection{Config: agent.DefaultConfig(), Interval: base.AgentInterval, LeaseIntervals: base.AgentLeaseIntervals}
	}
	if _, on := top["carbon"]; on && l.Carbon == nil {
		cc := DefaultCarbonConfig()
		l.Carbon = &cc
	}
	if err := jsonconf.Decode(data, &l); err != nil {
		return base, fmt.Errorf("node: config file: %w", err)
	}
	cfg = l.Node
	cfg.Gossip, cfg.Route, cfg.Sim, cfg.Carbon = l.Gossip, l.Route, l.Sim, l.Carbon
	cfg.Agents = nil
	if a := l.Agents; a != nil {
		ac := a.Config
		cfg.Agents, cfg.AgentInterval, cfg.AgentLeaseIntervals = &ac, a.Interval, a.LeaseIntervals
	}
	if raw := l.Admission; raw != nil && !bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		if cfg.Admit, err = admit.DecodeConfig(raw, base.Admit); err != nil {
			return base, fmt.Errorf("node: config file: admission: %w", err)
		}
	}
	return cfg, nil
}

func agentsOf(c Config) *agentsSection {
	if c.Agents == nil {
		return nil
	}
	return &agentsSection{Config: *c.Agents, Interval: c.AgentInterval, LeaseIntervals: c.AgentLeaseIntervals}
}

// MarshalConfigFile writes cfg as a config file that LoadConfigFile reads back to cfg: every
// setting, the admission section with its zero fields filled, agents and carbon null when off,
// and no secrets.
func MarshalConfigFile(cfg Config) ([]byte, error) {
	l := fileLayout[admit.Config]{Node: cfg, Gossip: cfg.Gossip, Route: cfg.Route, Admission: cfg.Admit.WithDefaults(),
		Agents: agentsOf(cfg), Carbon: cfg.Carbon, Sim: cfg.Sim}
	b, err := jsonconf.Marshal(l)
	if err != nil {
		return nil, fmt.Errorf("node: config file: %w", err)
	}
	return b, nil
}
