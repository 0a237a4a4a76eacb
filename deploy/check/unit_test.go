package check

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSystemdUnitReloadsWithSIGHUP: systemctl reload kvmesh, which README.md and
// docs/operating.md promise, needs an ExecReload= that sends the node SIGHUP; without one
// systemd refuses the reload.
func TestSystemdUnitReloadsWithSIGHUP(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "systemd", "kvmesh.service"))
	if err != nil {
		t.Fatal(err)
	}
	const want = "ExecReload=/bin/kill -HUP $MAINPID"
	section := ""
	var reloads []string
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "["):
			section = line
		case section == "[Service]" && strings.HasPrefix(line, "ExecReload="):
			reloads = append(reloads, line)
		}
	}
	if len(reloads) != 1 || reloads[0] != want {
		t.Errorf("kvmesh.service [Service] ExecReload lines %q; want exactly %q", reloads, want)
	}
}
