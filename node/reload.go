package node

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/node/metrics"
	"github.com/kvmesh/kvmesh/node/nodeconfig"
)

// noConfigFile is kvmesh_config_hash_info's hash while no config file is in force.
const noConfigFile = "none"

// Reload reads the config file (Config.ConfigFile) and the API key file again and applies what
// can change while the node runs: admission (validation bounds, budgets, tenants, the KV marks,
// the waiting room's caps and TTL, the SLO classes), routing (thresholds, weights, the gate),
// the carbon tracker's threshold, staleness and fail mode, and the keys; and it reads the adapter
// source (adapter_source) again. Every other setting
// the file changes takes effect at the next restart: each reload names each one that differs
// from what the node started with in a WARN line, so the latest reload says what is pending. The
// file is read over DefaultConfig with Config.Overrides applied after it, as at start, so a
// setting given by a flag keeps winning.
//
// Each file is all or nothing: one that does not parse, names an unknown key or holds an
// invalid value is rejected with one ERROR line, and its previous settings stay in force.
// Reload returns the rejections. It is safe to call at any time, concurrently too (reloads take
// turns); kvmesh node calls it on SIGHUP, and the node itself when a file changes (ConfigWatch).
func (n *Node) Reload() error {
	n.reloadMu.Lock()
	defer n.reloadMu.Unlock()
	var errs []error
	if n.cfg.ConfigFile != "" {
		if err := n.reloadConfigLocked(); err != nil {
			n.log.Error("config file not reloaded: its previous settings stay in force", "file", n.cfg.ConfigFile, "err", err)
			errs = append(errs, err)
		}
	}
	if n.cfg.APIKeysFile != "" {
		if err := n.loadKeysLocked(time.Now()); err != nil {
			n.log.Error("api keys not reloaded: the previous keys stay in force", "file", n.cfg.APIKeysFile, "err", err)
			errs = append(errs, err)
		} else {
			n.log.Info("api keys reloaded", "keys", n.adm.Keys().Len())
		}
	}
	if err := n.adapters.Reload(); err != nil {
		n.log.Error("adapter source not read again: the previous one stays in force", "err", err)
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		n.m.Reloads.WithLabelValues(metrics.ReloadError).Inc()
		return errors.Join(errs...)
	}
	n.m.Reloads.WithLabelValues(metrics.ReloadOK).Inc()
	n.m.Reloaded.SetToCurrentTime()
	return nil
}

// reloadConfigLocked reads the config file, checks the result whole, then applies its live
// settings. The caller holds reloadMu.
func (n *Node) reloadConfigLocked() error {
	path := n.cfg.ConfigFile
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("node: config file: %w", err)
	}
	sum := nodeconfig.ContentSum(data)
	n.configSum = sum // read, whatever comes of it: the watch waits for the next change
	// A key under its former name is a WARN at every reload.
	next, err := nodeconfig.Reread(data, n.cfg, n.log)
	if err != nil {
		return err
	}
	ac := next.Admit
	ac.ModelInfo = n.meshModelInfo
	carbonLive := n.carbon != nil && next.Carbon != nil
	if err := ac.Validate(); err != nil {
		return fmt.Errorf("node: config file: admission: %w", err)
	}
	if err := next.Route.Validate(); err != nil {
		return fmt.Errorf("node: config file: %w", err)
	}
	if carbonLive {
		if err := next.Carbon.Tracker.Validate(); err != nil {
			return fmt.Errorf("node: config file: carbon: %w", err)
		}
	}
	restart, live, err := nodeconfig.Changes(n.cfg, n.applied, next, carbonLive)
	if err != nil {
		return err
	}
	// Checked above, so none of these fails.
	if err := errors.Join(n.adm.SetConfig(ac), n.planner.Policy().SetConfig(next.Route)); err != nil {
		return fmt.Errorf("node: config file: %w", err)
	}
	if carbonLive {
		if err := n.carbon.SetConfig(next.Carbon.Tracker); err != nil {
			return fmt.Errorf("node: config file: carbon: %w", err)
		}
	}
	n.applied = next
	n.inForce.Store(&sum)
	for _, k := range restart {
		n.log.Warn("config setting changed: it takes effect when the node restarts", "key", k)
	}
	n.log.Info("config file reloaded", "file", path, "sha256", sum, "changed", live)
	return nil
}

// loadKeysLocked reads the API key file into admission. A key that survives a reload keeps its
// token bucket, so editing the file never refills anyone. The caller holds reloadMu.
func (n *Node) loadKeysLocked(now time.Time) error {
	data, err := os.ReadFile(n.cfg.APIKeysFile)
	if err != nil {
		return fmt.Errorf("node: api keys: %w", err)
	}
	n.keysSum = nodeconfig.ContentSum(data) // read, whatever comes of it: the watch waits for the next change
	entries, err := admit.ParseKeys(data)
	if err != nil {
		return fmt.Errorf("node: api keys %s: %w", n.cfg.APIKeysFile, err)
	}
	if len(entries) == 0 {
		// No keys would open the API to anyone: a file caught empty mid-write, or emptied to
		// revoke every key, must not do that. Without --api-keys the API is open by choice.
		return fmt.Errorf("node: api keys %s: the file holds no key; authentication stays on (to open the API, run without --api-keys)", n.cfg.APIKeysFile)
	}
	if err := n.adm.Keys().Replace(entries, now); err != nil {
		return fmt.Errorf("node: api keys: %w", err)
	}
	return nil
}

// watchFiles reloads (Reload) when the config file or the API key file holds new content,
// checking every interval until ctx ends.
func (n *Node) watchFiles(ctx context.Context, every time.Duration) {
	ticking(ctx, every, func() {
		if n.filesChanged() {
			_ = n.Reload() // it logs what became of each file
		}
	})
}

// filesChanged reports whether the config file or the API key file holds other content than
// the last reload read. A file that cannot be read (one being replaced) counts as unchanged; one
// that is gone is logged and counted once (missingLocked), and its settings stay in force.
func (n *Node) filesChanged() bool {
	n.reloadMu.Lock()
	defer n.reloadMu.Unlock()
	changed := false
	for _, f := range []struct{ path, sum, label string }{{n.cfg.ConfigFile, n.configSum, metrics.FileConfig}, {n.cfg.APIKeysFile, n.keysSum, metrics.FileAPIKeys}} {
		if f.path == "" {
			continue
		}
		data, err := os.ReadFile(f.path)
		n.missingLocked(f.path, f.label, errors.Is(err, fs.ErrNotExist))
		if err == nil && nodeconfig.ContentSum(data) != f.sum {
			changed = true
		}
	}
	return changed
}

// missingLocked logs and counts a watched file found gone, once until it is back: deleting the
// API key file must not pass unnoticed, though the keys read last stay in force (an empty key
// set would open the API) until the file is back or the node restarts, which then fails.
func (n *Node) missingLocked(path, label string, gone bool) {
	was := n.missing[path]
	switch {
	case gone && !was:
		if n.missing == nil {
			n.missing = make(map[string]bool)
		}
		n.missing[path] = true
		n.m.FilesMissing.WithLabelValues(label).Inc()
		n.log.Warn("a watched file is gone: the settings read from it last stay in force; a restart without it fails", "file", path, "kind", label)
	case !gone && was:
		delete(n.missing, path)
		n.log.Info("a watched file is back", "file", path, "kind", label)
	}
}

// configHash is the hex SHA-256 of the config file in force, noConfigFile without one.
func (n *Node) configHash() string { return *n.inForce.Load() }
