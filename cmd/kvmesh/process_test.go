package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/poll"
)

// runAsKvmesh, set in a child's environment, makes the test binary run kvmesh's main instead of
// the tests: the tests below start real kvmesh processes without building the binary.
const runAsKvmesh = "KVMESH_TEST_RUN_AS_KVMESH"

func TestMain(m *testing.M) {
	if os.Getenv(runAsKvmesh) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// freePort returns a loopback port that was free a moment ago, for a child's fixed address.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return fmt.Sprint(ln.Addr().(*net.TCPAddr).Port)
}

// kvmeshProcess is a kvmesh node running in a child process.
type kvmeshProcess struct {
	cmd  *exec.Cmd
	out  *bytes.Buffer
	done chan error
}

func startKvmesh(t *testing.T, args ...string) *kvmeshProcess {
	t.Helper()
	p := &kvmeshProcess{cmd: exec.Command(os.Args[0], args...), out: new(bytes.Buffer), done: make(chan error, 1)}
	p.cmd.Env = append(os.Environ(), runAsKvmesh+"=1")
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// stop sends SIGTERM and returns the exit error (nil: status 0), killing the process if it
// has not exited within a bound.
func (p *kvmeshProcess) stop(t *testing.T) error {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.done:
		return err
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
		t.Fatalf("kvmesh did not exit within 30s of SIGTERM; output:\n%s", p.out)
		return nil
	}
}

// TestInsecureDevForwardsBetweenProcesses: two kvmesh node processes started with --insecure-dev
// on one host, each serving a model the other does not, join by gossip and forward to each
// other over QUIC under the development CA they share on disk; both stop with status 0.
func TestInsecureDevForwardsBetweenProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two processes")
	}
	caDir := filepath.Join(t.TempDir(), "dev-ca")
	gossipA, httpA, httpB := freePort(t), freePort(t), freePort(t)
	node := func(name, httpPort, gossip, model string, extra ...string) []string {
		return append([]string{"--log-level", "warn", "node", "--name", name, "--insecure-dev", "--dev-ca-dir", caDir,
			"--http", "127.0.0.1:" + httpPort, "--gossip", gossip, "--quic", "127.0.0.1:0",
			"--model", model, "--drain-delay", "-1s"}, extra...)
	}
	a := startKvmesh(t, node("a", httpA, "127.0.0.1:"+gossipA, "model-a")...)
	b := startKvmesh(t, node("b", httpB, "127.0.0.1:0", "model-b", "--join", "127.0.0.1:"+gossipA)...)
	urlB := "http://127.0.0.1:" + httpB
	client := &http.Client{Timeout: 10 * time.Second}
	poll.Until(t, 30*time.Second, "b to list a's model", func() bool {
		resp, err := client.Get(urlB + "/v1/models")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == http.StatusOK && strings.Contains(string(body), `"model-a"`)
	})
	body := `{"model":"model-a","messages":[{"role":"user","content":"hello from b"}],"max_tokens":4}`
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, urlB+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var out struct {
		Choices []struct{ Message struct{ Content string } }
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(got, &out) != nil || len(out.Choices) != 1 {
		t.Fatalf("b: %d %s\na's output:\n%s\nb's output:\n%s", resp.StatusCode, got, a.out, b.out)
	}
	if ran := resp.Header.Get("X-Kvmesh-Node"); ran != "a" {
		t.Errorf("ran on %q, want a (the only node serving model-a)", ran)
	}
	for name, p := range map[string]*kvmeshProcess{"a": a, "b": b} {
		if err := p.stop(t); err != nil {
			t.Errorf("%s exited with %v after SIGTERM; output:\n%s", name, err, p.out)
		}
	}
}

// TestSecondSignalEndsTheDrainAtOnce: the first SIGTERM starts a node's drain (here a minute of
// drain delay, /readyz at 503); a second one ends the process at once, with status 143 (128 +
// SIGTERM) and a line saying it did not wait for the drain.
func TestSecondSignalEndsTheDrainAtOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process")
	}
	httpPort := freePort(t)
	p := startKvmesh(t, "--log-level", "info", "node", "--name", "a", "--insecure-dev", "--dev-ca-dir",
		filepath.Join(t.TempDir(), "dev-ca"), "--http", "127.0.0.1:"+httpPort, "--gossip", "127.0.0.1:0",
		"--quic", "127.0.0.1:0", "--drain-delay", "1m")
	client := &http.Client{Timeout: 5 * time.Second}
	ready := func() int {
		resp, err := client.Get("http://127.0.0.1:" + httpPort + "/readyz")
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	poll.Until(t, 30*time.Second, "the node to be ready", func() bool { return ready() == http.StatusOK })
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "the drain to begin", func() bool { return ready() == http.StatusServiceUnavailable })
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 128+int(syscall.SIGTERM) {
			t.Errorf("exited with %v after the second SIGTERM, want status %d; output:\n%s", err, 128+int(syscall.SIGTERM), p.out)
		}
		if !strings.Contains(p.out.String(), "second signal") {
			t.Errorf("no line says the second signal ended the process; output:\n%s", p.out)
		}
	case <-time.After(20 * time.Second): // well before the drain delay ends
		_ = p.cmd.Process.Kill()
		<-p.done // the output is complete, and ours to read
		t.Fatalf("the second SIGTERM did not end the drain; output:\n%s", p.out)
	}
}
