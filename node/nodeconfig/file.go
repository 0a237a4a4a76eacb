package nodeconfig

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/admit/agent"
	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/jsonconf"
	"github.com/kvmesh/kvmesh/node/engine/sim"
)

// The config file (kvmesh node --config FILE) is one JSON object, or the same in YAML, with a
// section per part of the node, each read over the configuration it is given (DefaultConfig,
// for kvmesh node), so a file names only what it changes:
//
//	{
//	  "node":      {"name": "gpu-7", "http_addr": ":8080", "tls_dir": "/etc/kvmesh/tls", "forward_attempts": 2},
//	  "gossip":    {"bind_port": 7946, "join": ["10.0.0.1:7946"]},
//	  "route":     {"busy_kv_use": 0.9, "weights": {"power": -1}},
//	  "admission": {"queue": {"ttl": "30s", "advanced": {"dispatch_slack": 0.25}}},
//	  "agents":    {"interval": "250ms", "advanced": {"controller": {"max_window": 64}}},
//	  "carbon":    {"provider": {"kind": "static", "static_intensity": 250}},
//	  "sim":       {"kv_blocks": 8192}
//	}
//
// In YAML the same file is a mapping of the same sections and keys:
//
//	node:
//	  name: gpu-7
//	route:
//	  weights: {power: -1}
//
// A file whose name ends in .yaml or .yml is YAML, one ending in .json is JSON, and any other is
// told by its content: JSON starts with "{". YAML is converted to JSON (sigs.k8s.io/yaml, which
// refuses a key given twice) and read as JSON is, so a key that names no setting is an error
// naming its path in either.
//
// "node" holds Config's own fields, the others Gossip, Route, Admit (admit.Config's format),
// Agents (agent.Config plus "interval" and "lease_intervals"), Carbon and Sim. "agents" and
// "carbon" turn their feature on by being there (null turns it off). Durations are strings
// ("500ms", "5m") or numbers of seconds. A key that names no setting is an error naming it.
// Secrets have no key: the gossip key and the carbon provider's credentials come from the
// environment or flags, so MarshalConfigFile never prints them.
//
// Settings no operator should need sit in their section's "advanced" object
// (jsonconf.AdvancedKey). A key under its former name (formerKeys), or an advanced setting
// given beside the others, is read where it is now, with a WARN on the base config's Logger.
//
// A file whose top level is an admit.Config (the admission-only file of earlier versions) is
// still read, into Admit; ConfigFileIsLegacy tells it apart so the caller can say so.

// Section names of the config file, in the order MarshalConfigFile writes them.
var configSections = []string{"node", "gossip", "route", "admission", "agents", "carbon", "sim"}

// formerKeys are the keys the file still reads by their former names, each at its key now,
// with a WARN (see Keys in CHANGELOG.md): one key a concept, where two layers each had one.
var formerKeys = []jsonconf.Rename{
	{From: "route.max_age", To: "route.stale_after"},
	{From: "gossip.stale_after", To: "route.stale_after"},
	{From: "gossip.stale_policy", To: "route.stale_policy"},
	{From: "sim.link_gbps", To: "route.link_gbps"},
	{From: "sim.kv_bytes_per_token", To: "route.kv_bytes_per_token"},
	{From: "sim.role", To: "node.role"},
}

// legacyKeys are the top-level keys of an admission-only file (admit.Config).
var legacyKeys = []string{"models", "tenants", "validation", "budget", "keys", "kv", "queue", "slo"}

// agentsSection is the file's "agents": agent.Config with the node's timing of the window.
type agentsSection struct {
	agent.Config
	Interval       time.Duration `json:"interval"`
	LeaseIntervals int           `json:"lease_intervals,advanced"`
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

// configJSON returns a config file's content as JSON: as it is when it is JSON, converted
// when it is YAML (see the format above; name "" tells by the content alone).
func configJSON(name string, data []byte) ([]byte, error) {
	switch strings.ToLower(filepath.Ext(name)) {
	case ".json":
		return data, nil
	case ".yaml", ".yml":
	default:
		if t := bytes.TrimSpace(data); len(t) > 0 && t[0] == '{' {
			return data, nil
		}
	}
	j, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, fmt.Errorf("node: config file: %w", err)
	}
	return j, nil
}

// topLevel reads the file's top-level keys and tells the two formats apart.
func topLevel(data []byte) (map[string]json.RawMessage, bool, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		return nil, false, fmt.Errorf("node: config file: %w", err)
	}
	if top == nil {
		return nil, false, fmt.Errorf("node: config file: want an object (JSON) or a mapping (YAML) of sections")
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
	j, err := configJSON("", data)
	if err != nil {
		return false
	}
	_, legacy, err := topLevel(j)
	return err == nil && legacy
}

// ReadConfigFile reads the config file at path over base, as LoadConfigFile does, telling JSON
// from YAML by the file's name or content. The result names the file (ConfigFile) and
// remembers the content's hash, so that the node's reload knows what is in force; legacy
// reports an admission-only file (ConfigFileIsLegacy).
func ReadConfigFile(path string, base Config) (cfg Config, legacy bool, err error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return base, false, fmt.Errorf("node: config file: %w", err)
	}
	cfg, legacy, err = decodeConfigFile(path, data, base)
	if err != nil {
		return base, false, err
	}
	cfg.ConfigFile, cfg.fileSum = path, ContentSum(data)
	return cfg, legacy, nil
}

// FileSum is the hex SHA-256 of ConfigFile's content as ReadConfigFile read it, "" when the
// settings were not read from a file.
func (c *Config) FileSum() string { return c.fileSum }

// ContentSum is the hex SHA-256 of a file's content, as sha256sum prints it.
func ContentSum(data []byte) string {
	s := sha256.Sum256(data)
	return hex.EncodeToString(s[:])
}

// LoadConfigFile reads a config file, JSON or YAML (told by its content), over base and
// returns the result; base is not changed. A key under its former name (formerKeys) is read at
// its name now, with a WARN on base.Logger (nil: none); given under both names with different
// values, it is an error naming both. Unknown keys, and admission settings whose zero
// meant "off" before zero meant "the default", are errors (see admit.DecodeConfig). The result
// is not validated: New does that.
func LoadConfigFile(data []byte, base Config) (Config, error) {
	cfg, _, err := decodeConfigFile("", data, base)
	return cfg, err
}

// decodeConfigFile is LoadConfigFile for a file named name ("": told by its content); legacy
// reports an admission-only file.
func decodeConfigFile(name string, data []byte, base Config) (cfg Config, legacy bool, err error) {
	if data, err = configJSON(name, data); err != nil {
		return base, false, err
	}
	top, legacy, err := topLevel(data)
	if err != nil {
		return base, false, err
	}
	cfg = base
	if legacy {
		if cfg.Admit, err = admit.DecodeConfig(data, base.Admit); err != nil {
			return base, false, fmt.Errorf("node: config file: %w", err)
		}
		return cfg, true, nil
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
	moved := func(from, to string) {
		if base.Logger != nil {
			base.Logger.Warn("config file: a key under its former name: it is read this release, then refused; write the new one", "key", from, "now", to)
		}
	}
	if err := jsonconf.DecodeWith(data, &l, jsonconf.Options{Renames: formerKeys, Moved: moved}); err != nil {
		return base, false, fmt.Errorf("node: config file: %w", err)
	}
	sameConcepts(&l)
	cfg = l.Node
	cfg.Gossip, cfg.Route, cfg.Sim, cfg.Carbon = l.Gossip, l.Route, l.Sim, l.Carbon
	cfg.Agents = nil
	if a := l.Agents; a != nil {
		ac := a.Config
		cfg.Agents, cfg.AgentInterval, cfg.AgentLeaseIntervals = &ac, a.Interval, a.LeaseIntervals
	}
	if raw := l.Admission; raw != nil && !bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		if cfg.Admit, err = admit.DecodeConfigAt(raw, base.Admit, "admission", moved); err != nil {
			return base, false, fmt.Errorf("node: config file: %w", err)
		}
	}
	return cfg, false, nil
}

// sameConcepts gives each layer the file's one key for what both read: staleness (route's to
// gossip) and the KV link and size (route's to the embedded engine).
func sameConcepts[A any](l *fileLayout[A]) {
	l.Gossip.StaleAfter, l.Gossip.StalePolicy = l.Route.MaxAge, gossip.StalePolicy(l.Route.StalePolicy.String())
	l.Sim.LinkGBps, l.Sim.KVBytesPerToken = l.Route.LinkGBps, l.Route.KVBytesPerToken
}

func agentsOf(c Config) *agentsSection {
	if c.Agents == nil {
		return nil
	}
	return &agentsSection{Config: *c.Agents, Interval: c.AgentInterval, LeaseIntervals: c.AgentLeaseIntervals}
}

// MarshalConfigFile writes cfg as a JSON config file that LoadConfigFile reads back to cfg:
// every setting, the admission section with its zero fields filled, agents and carbon null
// when off, and no secrets.
func MarshalConfigFile(cfg Config) ([]byte, error) {
	l := fileLayout[admit.Config]{Node: cfg, Gossip: cfg.Gossip, Route: cfg.Route, Admission: cfg.Admit.WithDefaults(),
		Agents: agentsOf(cfg), Carbon: cfg.Carbon, Sim: cfg.Sim}
	b, err := jsonconf.Marshal(l)
	if err != nil {
		return nil, fmt.Errorf("node: config file: %w", err)
	}
	return b, nil
}

// MarshalConfigFileYAML is MarshalConfigFile in YAML (keys in alphabetical order).
func MarshalConfigFileYAML(cfg Config) ([]byte, error) {
	j, err := MarshalConfigFile(cfg)
	if err != nil {
		return nil, err
	}
	b, err := yaml.JSONToYAML(j)
	if err != nil {
		return nil, fmt.Errorf("node: config file: %w", err)
	}
	return b, nil
}
