package check

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/linter"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/buildkit/frontend/dockerfile/shell"
	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"
)

// parseDockerfile parses the Dockerfile as BuildKit does, failing on any syntax error or
// lint warning, and returns its stages with each base image's ARG defaults substituted.
func parseDockerfile(t *testing.T) []instructions.Stage {
	t.Helper()
	f, err := os.Open(filepath.Join(repoRoot(t), "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	res, err := parser.Parse(f)
	if err != nil {
		t.Fatalf("Dockerfile: %v", err)
	}
	for _, w := range res.Warnings {
		t.Errorf("Dockerfile: %s", w.Short)
	}
	lint := linter.New(&linter.Config{Warn: func(rule, _, _, msg string, loc []parser.Range) {
		t.Errorf("Dockerfile: %s: %s (line %v)", rule, msg, loc)
	}})
	stages, metaArgs, err := instructions.Parse(res.AST, lint)
	if err != nil {
		t.Fatalf("Dockerfile: %v", err)
	}
	env := map[string]string{}
	for _, a := range metaArgs {
		for _, kv := range a.Args {
			if kv.Value != nil {
				env[kv.Key] = *kv.Value
			}
		}
	}
	lex := shell.NewLex('\\')
	for i := range stages {
		res, err := lex.ProcessWordWithMatches(stages[i].BaseName, shell.EnvsFromSlice(envSlice(env)))
		if err != nil {
			t.Fatalf("Dockerfile: FROM %s: %v", stages[i].BaseName, err)
		}
		stages[i].BaseName = res.Result
	}
	return stages
}

func envSlice(m map[string]string) []string {
	var s []string
	for k, v := range m {
		s = append(s, k+"="+v)
	}
	return s
}

// TestDockerfileBuildsWithCgoOnBookwormAndRunsSlim pins the image's two stages: the build on
// golang:1.26-bookworm through make build-release (cgo, -trimpath, -s -w, the version), the
// runtime on debian:bookworm-slim, the same glibc.
func TestDockerfileBuildsWithCgoOnBookwormAndRunsSlim(t *testing.T) {
	stages := parseDockerfile(t)
	if len(stages) != 2 {
		t.Fatalf("Dockerfile has %d stages, want 2 (build, runtime)", len(stages))
	}
	build, rt := stages[0], stages[1]
	if build.Name != "build" || build.BaseName != "golang:1.26-bookworm" {
		t.Errorf("build stage: %q FROM %q; want \"build\" FROM golang:1.26-bookworm", build.Name, build.BaseName)
	}
	if rt.BaseName != "debian:bookworm-slim" {
		t.Errorf("runtime stage FROM %q; want debian:bookworm-slim (the build stage's glibc)", rt.BaseName)
	}
	var makes bool
	for _, c := range build.Commands {
		if r, ok := c.(*instructions.RunCommand); ok && strings.Contains(strings.Join(r.CmdLine, " "), "make build-release") {
			makes = true
		}
	}
	if !makes {
		t.Error("build stage does not RUN make build-release, the target deploy/check.sh builds and runs")
	}
}

// TestDockerfileRuntimeStage pins what operators and the Helm chart rely on in the final
// image: a numeric non-root user, the ports, the health check through kvmesh health, and
// kvmesh node as the default command.
func TestDockerfileRuntimeStage(t *testing.T) {
	stages := parseDockerfile(t)
	rt := stages[len(stages)-1]
	var user string
	var ports, entry, cmd, health []string
	var copiesBinary bool
	for _, c := range rt.Commands {
		switch c := c.(type) {
		case *instructions.UserCommand:
			user = c.User
		case *instructions.ExposeCommand:
			ports = append(ports, c.Ports...)
		case *instructions.EntrypointCommand:
			entry = c.CmdLine
		case *instructions.CmdCommand:
			cmd = c.CmdLine
		case *instructions.HealthCheckCommand:
			health = c.Health.Test
		case *instructions.CopyCommand:
			if c.From == "build" && slices.Contains(c.SourcePaths, "/out/kvmesh") && c.DestPath == "/usr/local/bin/kvmesh" {
				copiesBinary = true
			}
		}
	}
	if u, _, _ := strings.Cut(user, ":"); u == "" || u == "0" || u == "root" || strings.Trim(u, "0123456789") != "" {
		t.Errorf("USER %q: want a numeric non-root uid (Kubernetes' runAsNonRoot checks it)", user)
	}
	for _, p := range []string{"8080/tcp", "7946/tcp", "7946/udp", "7443/udp"} {
		if !slices.Contains(ports, p) {
			t.Errorf("EXPOSE lacks %s (has %v)", p, ports)
		}
	}
	if !copiesBinary {
		t.Error("runtime stage does not COPY --from=build /out/kvmesh to /usr/local/bin/kvmesh")
	}
	if want := []string{"/usr/local/bin/kvmesh"}; !slices.Equal(entry, want) {
		t.Errorf("ENTRYPOINT %q, want %q", entry, want)
	}
	if want := []string{"node"}; !slices.Equal(cmd, want) {
		t.Errorf("CMD %q, want %q", cmd, want)
	}
	if want := []string{"CMD", "/usr/local/bin/kvmesh", "health"}; !slices.Equal(health, want) {
		t.Errorf("HEALTHCHECK %q, want %q", health, want)
	}
}

// TestDockerignoreKeepsTheBuildInputs fails for a file the build stage needs (every source
// file of kvmesh's packages, go.mod, go.sum, the Makefile, deploy/version.sh) that
// .dockerignore leaves out of the context, and for bulk it should leave out but does not.
func TestDockerignoreKeepsTheBuildInputs(t *testing.T) {
	root := repoRoot(t)
	f, err := os.Open(filepath.Join(root, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	patterns, err := ignorefile.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	pm, err := patternmatcher.New(patterns)
	if err != nil {
		t.Fatal(err)
	}
	excluded := func(rel string) bool {
		t.Helper()
		m, err := pm.MatchesOrParentMatches(filepath.ToSlash(rel))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	need := []string{"go.mod", "go.sum", "Makefile", "deploy/version.sh"}
	out := run(t, root, "go", "list", "-deps", "-json=Dir,Module,GoFiles,CgoFiles,HFiles,CFiles,EmbedFiles", "./cmd/kvmesh")
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p struct {
			Dir                                           string
			Module                                        *struct{ Path string }
			GoFiles, CgoFiles, HFiles, CFiles, EmbedFiles []string
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		if p.Module == nil || p.Module.Path != "github.com/kvmesh/kvmesh" {
			continue
		}
		rel, err := filepath.Rel(root, p.Dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, list := range [][]string{p.GoFiles, p.CgoFiles, p.HFiles, p.CFiles, p.EmbedFiles} {
			for _, f := range list {
				need = append(need, filepath.Join(rel, f))
			}
		}
	}
	if len(need) < 20 {
		t.Fatalf("go list found only %d build inputs", len(need))
	}
	for _, f := range need {
		if excluded(f) {
			t.Errorf(".dockerignore leaves out %s, which the build needs", f)
		}
	}
	for _, f := range []string{".git", "bin/kvmesh", "deploy/helm/kvmesh/values.yaml", "docs/operating.md"} {
		if !excluded(f) {
			t.Errorf(".dockerignore sends %s to the build context", f)
		}
	}
}
