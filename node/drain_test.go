package node_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/node"
)

// heldEngine is an external OpenAI-compatible engine whose streams send their role chunk and
// a first token at once and the rest only when release is closed.
type heldEngine struct {
	url     string
	release chan struct{}
}

func startHeldEngine(t *testing.T) *heldEngine {
	t.Helper()
	f := &heldEngine{release: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, `{"object":"list","data":[{"id":%q,"object":"model","max_model_len":131072}]}`, model)
	})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0\n")
	})
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "data: %s\n\n", `{"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`)
		fmt.Fprintf(w, "data: %s\n\n", `{"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"held"},"finish_reason":null}]}`)
		http.NewResponseController(w).Flush()
		select {
		case <-f.release:
		case <-r.Context().Done():
			return
		}
		for _, e := range []string{
			`{"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"done"},"finish_reason":"stop"}]}`,
			`{"id":"x","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10}}`,
			"[DONE]",
		} {
			fmt.Fprintf(w, "data: %s\n\n", e)
		}
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	t.Cleanup(func() {
		select {
		case <-f.release:
		default:
			close(f.release)
		}
	})
	f.url = srv.URL
	return f
}

// signalLog closes seen at the first record whose message starts with prefix.
type signalLog struct {
	prefix string
	seen   chan struct{}
}

func (h *signalLog) Enabled(context.Context, slog.Level) bool { return true }
func (h *signalLog) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *signalLog) WithGroup(string) slog.Handler            { return h }

func (h *signalLog) Handle(_ context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, h.prefix) {
		select {
		case <-h.seen:
		default:
			close(h.seen)
		}
	}
	return nil
}

// TestDrainSucceedsWhenAForwardedStreamCompletesInTheGrace pins the drain's result on an
// owner: a forwarded stream still running when the drain timeout passes runs on (it is not
// cut: its ingress would move it), and when it then completes, the drain completed every
// request and Shutdown returns nil; the client reads the whole stream.
func TestDrainSucceedsWhenAForwardedStreamCompletesInTheGrace(t *testing.T) {
	eng := startHeldEngine(t)
	timedOut := &signalLog{prefix: "drain timeout passed", seen: make(chan struct{})}
	tn := startNet(t, 2, func(i int, cfg *node.Config) {
		if i == 0 {
			cfg.Models = []string{"another-model"} // the ingress, which forwards
			return
		}
		cfg.Engine, cfg.EngineKind = eng.url, "vllm"
		cfg.DrainTimeout = 100 * time.Millisecond
		cfg.Logger = slog.New(timedOut)
	})
	resp := post(t, tn.URLs()[0], "/v1/chat/completions", chatBody("hold me", 8, true), nil)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get(node.HeaderNode) != tn.Nodes[1].Name() {
		t.Fatalf("status %d from %q: want 200 from the owner %s", resp.StatusCode, resp.Header.Get(node.HeaderNode), tn.Nodes[1].Name())
	}
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("the stream ended (%v) before its first token", err)
		}
		if strings.Contains(line, `"content":"held"`) {
			break
		}
	}

	stopped := make(chan error, 1)
	go func() { stopped <- tn.Nodes[1].Shutdown(context.Background()) }()
	select {
	case <-timedOut.seen:
	case err := <-stopped:
		t.Fatalf("Shutdown returned (%v) with the stream held", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the drain timeout did not pass")
	}
	close(eng.release)
	rest, err := io.ReadAll(br)
	if err != nil || !strings.Contains(string(rest), `"finish_reason":"stop"`) ||
		!strings.HasSuffix(strings.TrimSpace(string(rest)), "data: [DONE]") || strings.Contains(string(rest), `"error"`) {
		t.Errorf("the stream's rest (%v):\n%s\nwant it completed", err, rest)
	}
	if err := <-stopped; err != nil {
		t.Errorf("Shutdown after the stream completed: %v", err)
	}
}
