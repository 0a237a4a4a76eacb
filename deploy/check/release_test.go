package check

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// goreleaser reads .goreleaser.yaml as a generic document: goreleaser itself is not a
// dependency here (deploy/check.sh runs goreleaser check when it is installed).
func goreleaser(t *testing.T) map[string]any {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot(t), ".goreleaser.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		t.Fatalf(".goreleaser.yaml: %v", err)
	}
	return cfg
}

func list(v any) []any         { l, _ := v.([]any); return l }
func obj(v any) map[string]any { m, _ := v.(map[string]any); return m }

func strs(v any) []string {
	var s []string
	for _, x := range list(v) {
		s = append(s, fmt.Sprint(x))
	}
	return s
}

// TestGoreleaserBuildsWhatTheImageBuilds pins the release build to make build-release's:
// linux amd64 and arm64, cgo on (with a cross compiler for arm64), -trimpath, -s -w and the
// version; archives and packages of that build, with checksums.
func TestGoreleaserBuildsWhatTheImageBuilds(t *testing.T) {
	cfg := goreleaser(t)
	if v := fmt.Sprint(cfg["version"]); v != "2" {
		t.Errorf("version %s; want 2 (goreleaser v2's format)", v)
	}
	builds := list(cfg["builds"])
	if len(builds) != 1 {
		t.Fatalf("%d builds; want 1", len(builds))
	}
	b := obj(builds[0])
	if b["main"] != "./cmd/kvmesh" || b["binary"] != "kvmesh" {
		t.Errorf("build main %v binary %v", b["main"], b["binary"])
	}
	if got := strs(b["goos"]); !slices.Equal(got, []string{"linux"}) {
		t.Errorf("goos %v; want linux", got)
	}
	if got := strs(b["goarch"]); !slices.Equal(got, []string{"amd64", "arm64"}) {
		t.Errorf("goarch %v; want amd64, arm64", got)
	}
	if !slices.Contains(strs(b["env"]), "CGO_ENABLED=1") {
		t.Error("the build does not set CGO_ENABLED=1: go-nvml needs cgo")
	}
	if !slices.Contains(strs(b["flags"]), "-trimpath") {
		t.Error("the build lacks -trimpath")
	}
	ld := strings.Join(strs(b["ldflags"]), " ")
	for _, want := range []string{"-s", "-w", "-X github.com/kvmesh/kvmesh/node.Version="} {
		if !strings.Contains(ld, want) {
			t.Errorf("ldflags %q lack %q", ld, want)
		}
	}
	var crossCC bool
	for _, o := range list(b["overrides"]) {
		o := obj(o)
		if o["goarch"] == "arm64" && slices.ContainsFunc(strs(o["env"]), func(e string) bool { return strings.HasPrefix(e, "CC=aarch64-") }) {
			crossCC = true
		}
	}
	if !crossCC {
		t.Error("no arm64 override with an aarch64 CC: a cgo cross build needs one")
	}
	if a := list(cfg["archives"]); len(a) != 1 || !slices.Equal(strs(obj(a[0])["formats"]), []string{"tar.gz"}) {
		t.Errorf("archives %v; want one tar.gz archive", a)
	}
	if c := obj(cfg["checksum"]); c == nil || c["algorithm"] != "sha256" {
		t.Errorf("checksum %v; want sha256 checksums", c)
	}
	for _, a := range list(cfg["archives"]) {
		for _, f := range strs(obj(a)["files"]) {
			if _, err := os.Stat(filepath.Join(repoRoot(t), f)); err != nil {
				t.Errorf("archive file %s: %v", f, err)
			}
		}
	}
}

// nfpmConfig turns .goreleaser.yaml's nfpms entry into nfpm's own configuration for one
// architecture, with bin as the binary. A key it does not know fails the test, so that the
// packages built here stay the ones goreleaser builds.
func nfpmConfig(t *testing.T, n map[string]any, arch, version, bin string) map[string]any {
	t.Helper()
	out := map[string]any{"arch": arch, "platform": "linux", "version": version}
	contents := []any{map[string]any{"src": bin, "dst": fmt.Sprint(n["bindir"]) + "/kvmesh", "file_info": map[string]any{"mode": 0o755}}}
	for k, v := range n {
		switch k {
		case "id", "ids", "file_name_template", "formats", "bindir":
		case "package_name":
			out["name"] = v
		case "vendor", "homepage", "maintainer", "description", "license", "section", "priority", "scripts", "rpm", "deb":
			out[k] = v
		case "contents":
			contents = append(contents, list(v)...)
		default:
			t.Fatalf(".goreleaser.yaml nfpms has %q, which this test does not map to nfpm", k)
		}
	}
	out["contents"] = contents
	return out
}

// TestPackagesInstallTheUnitAndTheEnvFile builds the .deb and .rpm from .goreleaser.yaml's
// nfpms entry with nfpm and checks the .deb: the binary, the systemd unit, the sysusers
// file, the env file as a 0600 conffile, the maintainer scripts.
func TestPackagesInstallTheUnitAndTheEnvFile(t *testing.T) {
	nfpm := tool(t, "nfpm", "NFPM")
	dpkgDeb := tool(t, "dpkg-deb", "DPKG_DEB")
	root := repoRoot(t)
	cfg := goreleaser(t)
	n := obj(list(cfg["nfpms"])[0])
	if got := strs(n["formats"]); !slices.Equal(got, []string{"deb", "rpm"}) {
		t.Errorf("nfpm formats %v; want deb, rpm", got)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "kvmesh")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho kvmesh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	data, err := yaml.Marshal(nfpmConfig(t, n, "amd64", "0.1.0", bin))
	if err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "nfpm.yaml")
	if err := os.WriteFile(conf, data, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, format := range strs(n["formats"]) {
		run(t, root, nfpm, "package", "--config", conf, "--packager", format, "--target", dir)
	}
	debs, _ := filepath.Glob(filepath.Join(dir, "*.deb"))
	rpms, _ := filepath.Glob(filepath.Join(dir, "*.rpm"))
	if len(debs) != 1 || len(rpms) != 1 {
		t.Fatalf("nfpm made %v and %v; want one .deb and one .rpm", debs, rpms)
	}

	listing := string(run(t, dir, dpkgDeb, "--contents", debs[0]))
	for _, want := range []struct{ mode, path string }{
		{"-rwxr-xr-x", "./usr/bin/kvmesh"},
		{"-rw-r--r--", "./usr/lib/systemd/system/kvmesh.service"},
		{"-rw-r--r--", "./usr/lib/sysusers.d/kvmesh.conf"},
		{"-rw-------", "./etc/kvmesh/kvmesh.env"},
	} {
		if !slices.ContainsFunc(strings.Split(listing, "\n"), func(l string) bool {
			return strings.HasPrefix(l, want.mode) && strings.HasSuffix(l, " "+want.path)
		}) {
			t.Errorf("the .deb lacks %s %s:\n%s", want.mode, want.path, listing)
		}
	}
	ctrl := filepath.Join(dir, "control")
	run(t, dir, dpkgDeb, "--control", debs[0], ctrl)
	conffiles, err := os.ReadFile(filepath.Join(ctrl, "conffiles"))
	if err != nil || !strings.Contains(string(conffiles), "/etc/kvmesh/kvmesh.env") {
		t.Errorf("conffiles %q (%v); want /etc/kvmesh/kvmesh.env, so upgrades keep the operator's settings", conffiles, err)
	}
	for _, script := range []string{"postinst", "prerm", "postrm"} {
		if _, err := os.Stat(filepath.Join(ctrl, script)); err != nil {
			t.Errorf("the .deb has no %s: %v", script, err)
		}
	}
	if fields := string(run(t, dir, dpkgDeb, "--field", debs[0], "Package", "Version", "Architecture")); fields != "Package: kvmesh\nVersion: 0.1.0\nArchitecture: amd64\n" {
		t.Errorf("control fields:\n%s", fields)
	}
}
