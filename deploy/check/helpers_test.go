package check

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// repoRoot is the kvmesh checkout this module sits in (deploy/check/../..).
func repoRoot(t *testing.T) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("no caller information")
	}
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// tool returns the path of a command-line tool the test needs, from $ENV (HELM, NFPM) or
// PATH; without it the test is skipped, or fails under KVMESH_DEPLOY_CHECK_STRICT=1.
func tool(t *testing.T, name, envVar string) string {
	t.Helper()
	if p := os.Getenv(envVar); p != "" {
		return p
	}
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	if os.Getenv("KVMESH_DEPLOY_CHECK_STRICT") == "1" {
		t.Fatalf("%s is not on PATH (nor in $%s), and KVMESH_DEPLOY_CHECK_STRICT=1", name, envVar)
	}
	t.Skipf("%s is not on PATH (nor in $%s): deploy/check.sh installs it", name, envVar)
	return ""
}

// run runs a command in dir and returns its stdout; a failure ends the test with its stderr.
func run(t *testing.T, dir string, name string, args ...string) []byte {
	t.Helper()
	out, err := runErr(dir, name, args...)
	if err != nil {
		t.Fatalf("%s %v: %v", name, args, err)
	}
	return out
}

type cmdError struct {
	err    error
	stderr string
}

func (e *cmdError) Error() string { return e.err.Error() + ": " + e.stderr }

func runErr(dir string, name string, args ...string) ([]byte, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, &cmdError{err: err, stderr: stderr.String()}
	}
	return out, nil
}
