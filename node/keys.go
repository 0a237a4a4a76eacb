package node

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/kvmesh/kvmesh/admit"
)

// keysReloadInterval is how often the API key file is checked for changes.
const keysReloadInterval = 2 * time.Second

// loadKeys reads the API key file into admission. A key that survives a reload keeps its
// token bucket, so editing the file never refills anyone.
func (n *Node) loadKeys(now time.Time) (time.Time, error) {
	fi, err := os.Stat(n.cfg.APIKeysFile)
	if err != nil {
		return time.Time{}, fmt.Errorf("node: api keys: %w", err)
	}
	data, err := os.ReadFile(n.cfg.APIKeysFile)
	if err != nil {
		return time.Time{}, fmt.Errorf("node: api keys: %w", err)
	}
	entries, err := admit.ParseKeys(data)
	if err != nil {
		return time.Time{}, fmt.Errorf("node: api keys %s: %w", n.cfg.APIKeysFile, err)
	}
	if err := n.adm.Keys().Replace(entries, now); err != nil {
		return time.Time{}, fmt.Errorf("node: api keys: %w", err)
	}
	return fi.ModTime(), nil
}

// watchKeys reloads the key file when its modification time changes. A broken edit is logged
// and the previous keys stay in force.
func (n *Node) watchKeys(ctx context.Context, loaded time.Time) {
	t := time.NewTicker(keysReloadInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fi, err := os.Stat(n.cfg.APIKeysFile)
		if err != nil || fi.ModTime().Equal(loaded) {
			continue
		}
		m, err := n.loadKeys(time.Now())
		if err != nil {
			n.log.Error("api keys not reloaded", "err", err)
			loaded = fi.ModTime()
			continue
		}
		loaded = m
		n.log.Info("api keys reloaded", "keys", n.adm.Keys().Len())
	}
}
