package nodeconfig

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
)

// Reread reads a config file's content data again for a node running with running's
// settings: over DefaultConfig, keeping the node's Name, with running.Overrides applied after
// it as at start (so a setting given by a flag keeps winning), filled and validated. A key
// under its former name is a WARN on log. TLS and Standalone, which are not settings of the
// file, are running's. The sub-configs are not validated: their packages check them as they
// take them.
func Reread(data []byte, running Config, log *slog.Logger) (Config, error) {
	base := DefaultConfig()
	base.Name = running.Name // the node's identity: a file that names none keeps it
	base.Logger = log
	next, _, err := decodeConfigFile(running.ConfigFile, data, base)
	if err != nil {
		return Config{}, err
	}
	if running.Overrides != nil {
		if err := running.Overrides(&next); err != nil {
			return Config{}, fmt.Errorf("node: config file: %w", err)
		}
	}
	next.Fill()
	next.TLS, next.Standalone = running.TLS, running.Standalone
	if err := next.Validate(); err != nil {
		return Config{}, err
	}
	return next, nil
}

// Changes lists the settings next changes that need a restart, against started, the settings
// the node started with (which those keep until then), and those a reload applies, against
// last, the settings last loaded; carbonLive is whether the carbon tracker runs and stays on.
func Changes(started, last, next Config, carbonLive bool) (restart, live []string, err error) {
	s, err1 := settingsOf(started)
	l, err2 := settingsOf(last)
	now, err3 := settingsOf(next)
	if err := errors.Join(err1, err2, err3); err != nil {
		return nil, nil, err
	}
	for _, k := range changed(s, now) {
		if !liveSetting(k, carbonLive) {
			restart = append(restart, k)
		}
	}
	for _, k := range changed(l, now) {
		if liveSetting(k, carbonLive) {
			live = append(live, k)
		}
	}
	return restart, live, nil
}

// Settings a reload applies, by their config file keys: these sections and prefixes, less the
// exceptions, whose state is built once (the key set's default buckets, the output-length
// estimator, the dispatch-rate meter, the router's random source and session table, the retry
// budget, the peer ejector; a model's context_tokens sizes an external engine's model list).
var (
	liveSettings    = []string{"admission.", "route.", "carbon.tracker."}
	restartSettings = []string{"admission.keys.", "admission.budget.advanced.estimate_", "admission.queue.advanced.drain_window", "route.advanced.seed",
		"route.advanced.max_sessions", "route.advanced.retry_budget.", "route.advanced.eject."}
)

// liveSetting reports whether a reload applies the setting at key; carbonLive is whether the
// carbon tracker runs and stays on.
func liveSetting(key string, carbonLive bool) bool {
	switch {
	case strings.HasPrefix(key, "carbon.") && !carbonLive,
		strings.HasPrefix(key, "admission.models.") && strings.HasSuffix(key, ".context_tokens"),
		slices.ContainsFunc(restartSettings, func(p string) bool { return strings.HasPrefix(key, p) }):
		return false
	}
	return slices.ContainsFunc(liveSettings, func(p string) bool { return strings.HasPrefix(key, p) })
}

// settingsOf flattens cfg's config file into its keys ("route.weights.prefix") and their values
// in JSON. An empty object or a null is a value of its own.
func settingsOf(cfg Config) (map[string]string, error) {
	b, err := MarshalConfigFile(cfg)
	if err != nil {
		return nil, err
	}
	var tree any
	if err := json.Unmarshal(b, &tree); err != nil {
		return nil, fmt.Errorf("node: config file: %w", err)
	}
	out := map[string]string{}
	var walk func(key string, v any)
	walk = func(key string, v any) {
		if obj, ok := v.(map[string]any); ok && len(obj) > 0 {
			for k, e := range obj {
				walk(strings.TrimPrefix(key+"."+k, "."), e)
			}
			return
		}
		j, _ := json.Marshal(v)
		out[key] = string(j)
	}
	walk("", tree)
	return out, nil
}

// changed lists, sorted, the keys whose values differ between a and b, or that one lacks.
func changed(a, b map[string]string) []string {
	var out []string
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			out = append(out, k)
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}
