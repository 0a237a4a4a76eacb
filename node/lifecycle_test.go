package node_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/poll"
	"github.com/kvmesh/kvmesh/node"
)

// TestShutdownServesThroughTheDrainDelay pins the drain order: first /readyz turns 503
// (draining) and the published record says the engine is unhealthy while new connections and
// requests are still served; then, once the delay is over, the node stops accepting.
func TestShutdownServesThroughTheDrainDelay(t *testing.T) {
	// The delay outlasts the test; ending Shutdown's context ends it.
	tn := startNet(t, 1, func(i int, cfg *node.Config) { cfg.DrainDelay = time.Minute })
	n, url := tn.Nodes[0], tn.URLs()[0]
	ctx, endDelay := context.WithCancel(context.Background())
	defer endDelay()
	stopped := make(chan error, 1)
	go func() { stopped <- n.Shutdown(ctx) }()

	poll.Until(t, 5*time.Second, "/readyz to turn 503", func() bool {
		status, _ := readyz(t, url)
		return status == http.StatusServiceUnavailable
	})
	var body struct{ Status, Reason string }
	if _, b := readyz(t, url); json.Unmarshal([]byte(b), &body) != nil || body.Status != node.CodeDraining || body.Reason == "" {
		t.Errorf("/readyz body %s: want status draining and a reason", b)
	}
	poll.Until(t, 5*time.Second, "the record to say the engine is unhealthy", func() bool {
		return !selfOf(peers(t, url)).EngineHealthy
	})
	// A new connection, as a client that has not yet heard, is served in full. (Not streamed:
	// its answer is sent once its handler has returned, so nothing is in flight when the delay
	// is ended below.)
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("still here", 4, false)))
	if err != nil {
		t.Fatalf("a request during the drain delay: %v", err)
	}
	var done struct {
		Choices []struct {
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
	}
	if b := readAll(t, resp); resp.StatusCode != http.StatusOK || json.Unmarshal(b, &done) != nil ||
		len(done.Choices) != 1 || done.Choices[0].FinishReason == "" {
		t.Fatalf("a request during the drain delay: status %d, body %s", resp.StatusCode, b)
	}
	select {
	case err := <-stopped:
		t.Fatalf("Shutdown returned (%v) before its drain delay ended", err)
	default:
	}

	endDelay()
	if err := <-stopped; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if _, err := client.Get(url + "/healthz"); err == nil {
		t.Errorf("the node still accepts connections after Shutdown")
	}
}

// TestShutdownAfterAFailedStartDoesNotWait pins that a node whose Start failed stops at once:
// it never served, so no load balancer is waiting to hear it is unready.
func TestShutdownAfterAFailedStartDoesNotWait(t *testing.T) {
	cfg := node.DefaultConfig()
	cfg.Name, cfg.HTTPAddr, cfg.Standalone, cfg.GPU = "n", "127.0.0.1:0", true, "none"
	cfg.APIKeysFile = filepath.Join(t.TempDir(), "missing")
	cfg.DrainDelay = time.Hour
	n, err := node.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); err == nil {
		t.Fatal("Start with a missing key file succeeded")
	}
	stopped := make(chan error, 1)
	go func() { stopped <- n.Shutdown(context.Background()) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("Shutdown after a failed Start waits out the drain delay")
	}
}

// lockedBuffer is a bytes.Buffer safe for a logger and a test to share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestShutdownSucceedsWhenTheLeaveIsNotSent pins that a departure broadcast that cannot go out
// in time (two nodes stopping together: each marks the other left and has no one to send it
// to) is a warning, not a failed shutdown that makes kvmesh node exit 1.
func TestShutdownSucceedsWhenTheLeaveIsNotSent(t *testing.T) {
	var log lockedBuffer
	tn := startNet(t, 2, func(i int, cfg *node.Config) {
		// Members learn each other by push/pull alone; nothing gossips or probes, so the
		// departure never goes out.
		g := &cfg.Gossip
		g.GossipInterval, g.ProbeInterval = time.Hour, time.Hour
		g.PushPullInterval, g.StaleAfter = 50*time.Millisecond, 5*time.Second
		g.LeaveTimeout = 20 * time.Millisecond
		if i == 0 {
			cfg.Logger = slog.New(slog.NewTextHandler(&log, nil))
		}
	})
	if err := tn.Nodes[0].Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown with an unsent departure: %v", err)
	}
	if !strings.Contains(log.String(), "level=WARN msg=\"leaving the mesh: departure not sent") {
		t.Errorf("no warning of the unsent departure in the log:\n%s", log.String())
	}
}

// rawRequest opens a connection to the node at url and writes head, the request line and
// headers of a request whose body follows.
func rawRequest(t *testing.T, url, head string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	// A bound on the test, not a timing it checks.
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, head); err != nil {
		t.Fatal(err)
	}
	return conn
}

// TestTrickledBodyIsCut pins that a body sent a byte at a time, never reaching its end within
// the body timeout, is answered 408 body_timeout, counted as a refusal, and its connection
// closed: the client cannot hold the connection and the handler for as long as it trickles.
func TestTrickledBodyIsCut(t *testing.T) {
	tn := startNet(t, 1, func(i int, cfg *node.Config) { cfg.BodyTimeout = 200 * time.Millisecond })
	url := tn.URLs()[0]
	conn := rawRequest(t, url, "POST /v1/chat/completions HTTP/1.1\r\nHost: kvmesh\r\n"+
		"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				if _, err := conn.Write([]byte(" ")); err != nil {
					return
				}
			}
		}
	}()
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer to a trickled body: %v", err)
	}
	if e := decodeError(t, readAll(t, resp)); resp.StatusCode != http.StatusRequestTimeout || e.Error.Code != "body_timeout" {
		t.Fatalf("status %d, error %+v: want 408 body_timeout", resp.StatusCode, e.Error)
	}
	// Closed: the end of the stream, or a reset for the bytes still trickling in.
	if _, err := br.ReadByte(); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("the connection stays open after the body timeout: %v", err)
	}
	if got := metric(t, url, "kvmesh_requests_refused_total", `code="body_timeout"`); got != 1 {
		t.Errorf("body_timeout refusals %v, want 1", got)
	}
}

// TestSlowHeadersAreCutAtTheBodyTimeout: a client that never ends its headers is disconnected
// at the body timeout (no answer: no request was read), not held for the server's 10 s cap.
func TestSlowHeadersAreCutAtTheBodyTimeout(t *testing.T) {
	tn := startNet(t, 1, func(i int, cfg *node.Config) { cfg.BodyTimeout = 200 * time.Millisecond })
	conn := rawRequest(t, tn.URLs()[0], "POST /v1/chat/completions HTTP/1.1\r\nHost: kvmesh\r\nX-Slow: a")
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second)) // a bound on the test, under the 10 s cap
	if _, err := bufio.NewReader(conn).ReadByte(); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("a connection whose headers never end stays open past the body timeout: %v", err)
	}
}

// TestBodyTimeoutDoesNotCutAStream pins that the body timeout bounds the body alone: a
// response that streams for longer than it runs to its end.
func TestBodyTimeoutDoesNotCutAStream(t *testing.T) {
	tn := startNet(t, 1, func(i int, cfg *node.Config) {
		cfg.BodyTimeout = 50 * time.Millisecond
		// Every step sleeps at least 20 ms, so 20 tokens stream for 400 ms or more.
		cfg.Sim.TimeScale, cfg.Sim.StepFixed = 1, 20*time.Millisecond
	})
	url := tn.URLs()[0]
	resp := post(t, url, "/v1/chat/completions", chatBody("a long answer", 20, true), nil)
	ev := sseEvents(t, readAll(t, resp))
	if resp.StatusCode != http.StatusOK || len(ev) == 0 || ev[len(ev)-1] != "[DONE]" {
		t.Fatalf("status %d, events %q: want a whole stream", resp.StatusCode, ev)
	}
	if u := streamUsage(t, ev); u.CompletionTokens != 20 {
		t.Errorf("%d tokens, want 20", u.CompletionTokens)
	}
}

// TestIdleConnectionIsClosed pins the idle timeout: a connection left open after its request
// is closed by the node.
func TestIdleConnectionIsClosed(t *testing.T) {
	tn := startNet(t, 1, func(i int, cfg *node.Config) { cfg.IdleTimeout = 100 * time.Millisecond })
	conn := rawRequest(t, tn.URLs()[0], "GET /healthz HTTP/1.1\r\nHost: kvmesh\r\n\r\n")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("/healthz: %d", resp.StatusCode)
	}
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		t.Errorf("an idle connection stays open: %v", err)
	}
}
