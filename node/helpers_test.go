package node_test

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/testnet"
)

const model = node.DefaultModel

// startNet starts n nodes with fast gossip and a fast simulated engine and waits for the mesh
// to converge; engines, if given, is testnet.Config.Engines.
func startNet(t testing.TB, n int, configure func(i int, cfg *node.Config), engines ...string) *testnet.Net {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tn, err := testnet.Start(ctx, testnet.Config{
		Nodes:   n,
		Engines: cmp.Or(append(engines, "")...),
		Fast:    true,
		Configure: func(i int, cfg *node.Config) {
			cfg.Sim.TimeScale = 20
			cfg.Sim.KVBlocks = 4096
			cfg.DrainTimeout = 5 * time.Second
			if os.Getenv("KVMESH_TEST_LOG") != "" {
				cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
			}
			if configure != nil {
				configure(i, cfg)
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := tn.Close(); err != nil {
			t.Logf("close: %v", err)
		}
	})
	if err := tn.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	return tn
}

func chatBody(content string, maxTokens int, stream bool) string {
	b, _ := json.Marshal(map[string]any{
		"model":          model,
		"messages":       []map[string]string{{"role": "user", "content": content}},
		"max_tokens":     maxTokens,
		"stream":         stream,
		"stream_options": map[string]bool{"include_usage": stream},
	})
	if !stream {
		var m map[string]any
		_ = json.Unmarshal(b, &m)
		delete(m, "stream_options")
		b, _ = json.Marshal(m)
	}
	return string(b)
}

func post(t testing.TB, url, path, body string, hdr map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func readAll(t testing.TB, resp *http.Response) []byte {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// sseEvents splits an SSE body into its data payloads.
func sseEvents(t *testing.T, body []byte) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if d, ok := strings.CutPrefix(line, "data: "); ok {
			out = append(out, d)
		}
	}
	return out
}

type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// streamUsage returns the usage of a stream that asked for it.
func streamUsage(t *testing.T, events []string) usage {
	t.Helper()
	for _, e := range events {
		var c struct {
			Choices []json.RawMessage `json:"choices"`
			Usage   *usage            `json:"usage"`
		}
		if json.Unmarshal([]byte(e), &c) == nil && c.Usage != nil && len(c.Choices) == 0 {
			return *c.Usage
		}
	}
	t.Fatalf("no usage chunk in %d events", len(events))
	return usage{}
}

type errorBody struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    string  `json:"code"`
	} `json:"error"`
}

func decodeError(t *testing.T, b []byte) errorBody {
	t.Helper()
	var e errorBody
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("error body %q: %v", b, err)
	}
	return e
}

// scrapeKey is the API key the helpers send to the admin paths (/metrics, /v1/mesh/peers),
// which ask one while a key file is loaded: a test with a key file lists it (scrapeKeyLine).
const scrapeKey = "sk-scrape"

var scrapeKeyLine = admit.HashKey(scrapeKey) + " ops\n"

// adminGet GETs an admin path of a node with scrapeKey and fails unless the answer is 200.
func adminGet(t testing.TB, url string) []byte {
	t.Helper()
	status, b := getWithKey(t, url, scrapeKey)
	if status != http.StatusOK {
		t.Fatalf("GET %s: %d %s", url, status, b)
	}
	return b
}

// getWithKey GETs url with key as its bearer token (none when empty).
func getWithKey(t testing.TB, url, key string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, readAll(t, resp)
}

// peers fetches a node's /v1/mesh/peers.
func peers(t testing.TB, url string) node.PeersResponse {
	t.Helper()
	var pr node.PeersResponse
	if err := json.Unmarshal(adminGet(t, url+"/v1/mesh/peers"), &pr); err != nil {
		t.Fatal(err)
	}
	return pr
}

func selfOf(pr node.PeersResponse) node.PeerInfo {
	for _, p := range pr.Peers {
		if p.Self {
			return p
		}
	}
	return node.PeerInfo{}
}

// longPrompt is deterministic text of about tokens tokens (4 bytes each).
func longPrompt(seed string, tokens int) string {
	var b strings.Builder
	for b.Len() < tokens*4 {
		b.WriteString(seed)
		b.WriteString(" lorem ipsum dolor sit amet ")
	}
	return b.String()[:tokens*4]
}

// metric sums the samples of family name on a node's /metrics whose labels contain match
// (e.g. `code="queue_full"`; empty matches all). Absent families read 0.
func metric(t testing.TB, url, name, match string) float64 {
	t.Helper()
	var sum float64
	for _, line := range strings.Split(string(adminGet(t, url+"/metrics")), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 || strings.HasPrefix(line, "#") {
			continue
		}
		series, labels, _ := strings.Cut(f[0], "{")
		if series != name || !strings.Contains(labels, match) {
			continue
		}
		var v float64
		if err := json.Unmarshal([]byte(f[1]), &v); err == nil {
			sum += v
		}
	}
	return sum
}

// answer is what a client read of a request sent in the background (sendAsync).
type answer struct {
	status int
	node   string // HeaderNode
	body   []byte
	err    error
}

// sendAsync posts body to url+path in the background, with the headers hdr, and delivers the
// whole answer; chaosTimeout bounds it.
func sendAsync(url, path, body string, hdr map[string]string) <-chan answer {
	done := make(chan answer, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), chaosTimeout)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		done <- answer{resp.StatusCode, resp.Header.Get(node.HeaderNode), b, err}
	}()
	return done
}
