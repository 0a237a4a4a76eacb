package node_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/poll"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/testnet"
)

// dyingEngines are external OpenAI-compatible engines of vLLM's kind, one a node, that
// generate deterministically: a request for n tokens streams "tok0 ", "tok1 ", ... one token
// a chunk, and a continuation (its prompt, or its final assistant message, ending with text
// already sent) goes on from where that text stopped, so a request moved mid-stream reads as
// one unbroken run. After arm(k), the next generation to begin is a death: its engine sends k
// tokens, then closes the connection abruptly and refuses every connection after, as a
// killed process does.
type dyingEngines struct {
	t       *testing.T
	die     atomic.Int64 // k+1: the next generation dies after k tokens; 0: none
	fail    atomic.Int64 // k+1: the next generation sends an error event after k tokens; 0: none
	engines []*dyingEngine
}

type dyingEngine struct {
	srv  *httptest.Server
	dead atomic.Bool
}

func startDyingEngines(t *testing.T, n int) *dyingEngines {
	t.Helper()
	d := &dyingEngines{t: t}
	for range n {
		e := &dyingEngine{}
		mux := http.NewServeMux()
		mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprintf(w, `{"object":"list","data":[{"id":%q,"object":"model","max_model_len":131072}]}`, model)
		})
		mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
			io.WriteString(w, "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0\n")
		})
		gen := func(w http.ResponseWriter, r *http.Request) { d.generate(e, w, r) }
		mux.HandleFunc("POST /v1/chat/completions", gen)
		mux.HandleFunc("POST /v1/completions", gen)
		e.srv = httptest.NewServer(mux)
		t.Cleanup(e.srv.Close)
		d.engines = append(d.engines, e)
	}
	return d
}

// arm makes the next generation die after k tokens.
func (d *dyingEngines) arm(k int) { d.die.Store(int64(k) + 1) }

// armError makes the next generation end with an error event after k tokens, its engine alive.
func (d *dyingEngines) armError(k int) { d.fail.Store(int64(k) + 1) }

// died is the index of the engine that died, or -1.
func (d *dyingEngines) died() int {
	for i, e := range d.engines {
		if e.dead.Load() {
			return i
		}
	}
	return -1
}

// genRequest is what the engines read of a generation's body.
type genRequest struct {
	Messages []struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	} `json:"messages"`
	Prompt               *string `json:"prompt"`
	MaxTokens            int     `json:"max_tokens"`
	ContinueFinalMessage bool    `json:"continue_final_message"`
	AddGenerationPrompt  *bool   `json:"add_generation_prompt"`
}

// promptTokens is the engines' count of a prompt's tokens: a token for 4 bytes of the
// client's text, and one for each token generated before (a continuation's).
func promptTokens(s string) int {
	if i := strings.Index(s, "tok0 "); i >= 0 {
		return i/4 + strings.Count(s[i:], "tok")
	}
	return len(s) / 4
}

func (d *dyingEngines) generate(e *dyingEngine, w http.ResponseWriter, r *http.Request) {
	var g genRequest
	if e.dead.Load() || json.NewDecoder(r.Body).Decode(&g) != nil {
		abort(w)
		return
	}
	chat := g.Prompt == nil
	from, prompt := 0, 0
	if chat {
		for _, m := range g.Messages {
			prompt += promptTokens(m.Content)
		}
		if last := g.Messages[len(g.Messages)-1]; last.Role == "assistant" {
			from = strings.Count(last.Content, "tok")
			if !g.ContinueFinalMessage || g.AddGenerationPrompt == nil || *g.AddGenerationPrompt {
				d.t.Errorf("a continuation reached a vLLM engine without continue_final_message: %+v", g)
			}
		}
	} else {
		from, prompt = strings.Count(*g.Prompt, "tok"), promptTokens(*g.Prompt)
	}
	dieAfter, failAfter := -1, -1
	if k := d.die.Swap(0); k > 0 {
		dieAfter = int(k - 1)
	}
	if k := d.fail.Swap(0); k > 0 {
		failAfter = int(k - 1)
	}
	if dieAfter == 0 {
		e.kill(w)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	send := func(ev string) {
		fmt.Fprintf(w, "data: %s\n\n", ev)
		w.(http.Flusher).Flush()
	}
	if chat {
		send(`{"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`)
	}
	for i := range g.MaxTokens {
		tok := fmt.Sprintf("tok%d ", from+i)
		finish := "null"
		if i == g.MaxTokens-1 {
			finish = `"length"`
		}
		if chat {
			send(fmt.Sprintf(`{"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":%q},"finish_reason":%s}]}`, tok, finish))
		} else {
			send(fmt.Sprintf(`{"id":"x","object":"text_completion","choices":[{"index":0,"text":%q,"finish_reason":%s}]}`, tok, finish))
		}
		if i+1 == dieAfter {
			e.kill(w)
			return
		}
		if i+1 == failAfter {
			send(`{"error":{"message":"the engine gave up on this request","type":"internal_server_error","code":500}}`)
			send("[DONE]")
			return
		}
	}
	send(fmt.Sprintf(`{"id":"x","choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}`,
		prompt, g.MaxTokens, prompt+g.MaxTokens))
	send("[DONE]")
}

// kill ends the generation w answers as the engine's death would, and refuses every
// connection after.
func (e *dyingEngine) kill(w http.ResponseWriter) {
	e.dead.Store(true)
	abort(w)
	_ = e.srv.Listener.Close()
	e.srv.CloseClientConnections()
}

// abort closes w's connection without ending its response.
func abort(w http.ResponseWriter) {
	if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
		_ = c.Close()
	}
}

// startDyingNet starts a 2-node mesh, each node in front of one of d's engines.
func startDyingNet(t *testing.T, d *dyingEngines) *testnet.Net {
	t.Helper()
	return startNet(t, 2, func(i int, cfg *node.Config) {
		cfg.Engine, cfg.EngineKind, cfg.ModelsInterval = d.engines[i].srv.URL, "vllm", 20*time.Millisecond
	})
}

// dyingBody is a request for maxTokens tokens on path, with prompt as its content.
func dyingBody(path, prompt string, maxTokens int, stream bool) string {
	m := map[string]any{"model": model, "max_tokens": maxTokens, "stream": stream}
	if path == "/v1/completions" {
		m["prompt"] = prompt
	} else {
		m["messages"] = []map[string]string{{"role": "user", "content": prompt}}
	}
	if stream {
		m["stream_options"] = map[string]bool{"include_usage": true}
	}
	b, _ := json.Marshal(m)
	return string(b)
}

// unbroken is the text a request for n tokens reads from the engines.
func unbroken(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "tok%d ", i)
	}
	return b.String()
}

// placeDeath runs prompt once on path so that its prefix has a home, and returns that home
// and the ingress of the request to come: the home itself (local), or the other node, which
// forwards to it once gossip told it where the prefix lives.
func placeDeath(t *testing.T, tn *testnet.Net, path, prompt string, local bool) (home, ingress int) {
	t.Helper()
	urls := tn.URLs()
	resp := post(t, urls[0], path, dyingBody(path, prompt, 1, false), nil)
	if b := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("warm-up: %d %s", resp.StatusCode, b)
	}
	name := resp.Header.Get(node.HeaderNode)
	home = indexOf(t, tn, name)
	if local {
		return home, home
	}
	ingress = 1 - home
	poll.Until(t, 5*time.Second, "the prefix to spread", func() bool { return knowsPrefix(t, urls[ingress], name, 100) })
	return home, ingress
}

// TestEngineDeathMidStreamMigrates pins that an engine dying mid-stream does not lose the
// request, whether it runs under the ingress or under the owner the ingress forwarded to: the
// engine of the prompt's home sends 20 tokens and dies, and the client still reads one
// unbroken stream, the very text of a run that did not break, with one role chunk, one
// finish_reason, the whole request's usage and [DONE]; the ingress counts one engine
// migration completed, and both nodes' requests reconcile. An engine that dies before its
// first token is an attempt that failed: the other node runs the stream, and nothing migrates.
func TestEngineDeathMidStreamMigrates(t *testing.T) {
	for _, where := range []string{"local", "forwarded"} {
		for _, path := range []string{"/v1/chat/completions", "/v1/completions"} {
			for _, dieAfter := range []int{20, 0} {
				t.Run(fmt.Sprintf("%s %s after %d tokens", where, strings.TrimPrefix(path, "/v1/"), dieAfter), func(t *testing.T) {
					engineDeathMidStream(t, where == "local", path, dieAfter)
				})
			}
		}
	}
}

func engineDeathMidStream(t *testing.T, local bool, path string, dieAfter int) {
	d := startDyingEngines(t, 2)
	tn := startDyingNet(t, d)
	urls := tn.URLs()
	prompt := longPrompt(fmt.Sprintf("dying %v %s %d", local, path, dieAfter), 2000)
	home, ingress := placeDeath(t, tn, path, prompt, local)
	const maxTokens = 60
	d.arm(dieAfter)
	resp := post(t, urls[ingress], path, dyingBody(path, prompt, maxTokens, true), nil)
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	if d.died() != home {
		t.Fatalf("engine %d died, want the home's, %d", d.died(), home)
	}
	var got stream
	got.readRest(&sseReader{t: t, br: bufio.NewReader(bytes.NewReader(body))})
	if want := unbroken(maxTokens); got.text != want {
		t.Errorf("client read\n%q\nwant\n%q", got.text, want)
	}
	if got.last != "[DONE]" || len(got.finishes) != 1 || got.finishes[0] != "length" {
		t.Errorf("stream ended with %q, finish reasons %q; want [DONE] and one length", got.last, got.finishes)
	}
	if path == "/v1/chat/completions" && got.roles != 1 {
		t.Errorf("%d role chunks, want 1", got.roles)
	}
	if want := promptTokens(prompt); got.usage == nil || got.usage.PromptTokens != want || got.usage.CompletionTokens != maxTokens {
		t.Errorf("usage %+v, want %d prompt and %d completion tokens", got.usage, want, maxTokens)
	}
	want := 0.0
	if dieAfter > 0 {
		want = 1
	}
	if n := metric(t, urls[ingress], "kvmesh_migrations_total", `cause="engine",outcome="completed"`); n != want {
		t.Errorf("engine migrations completed = %v, want %v", n, want)
	}
	if n := metric(t, urls[ingress], "kvmesh_migrations_total", ""); n != want {
		t.Errorf("migrations = %v, want %v", n, want)
	}
	reconciles(t, urls)
}

// TestEngineDeathRunsAWholeResponseAgain is the unstreamed counterpart: the engine dies mid-
// generation (after 20 tokens) or before its first token, under the ingress or under the
// owner it forwarded to. The client was sent nothing yet, so the request runs again on the
// other node, and the client gets one complete response, without an error.
func TestEngineDeathRunsAWholeResponseAgain(t *testing.T) {
	for _, where := range []string{"local", "forwarded"} {
		for _, dieAfter := range []int{20, 0} {
			t.Run(fmt.Sprintf("%s after %d tokens", where, dieAfter), func(t *testing.T) {
				d := startDyingEngines(t, 2)
				tn := startDyingNet(t, d)
				urls := tn.URLs()
				prompt := longPrompt(fmt.Sprintf("whole %s %d", where, dieAfter), 2000)
				home, ingress := placeDeath(t, tn, "/v1/chat/completions", prompt, where == "local")
				const maxTokens = 60
				d.arm(dieAfter)
				resp := post(t, urls[ingress], "/v1/chat/completions", dyingBody("/v1/chat/completions", prompt, maxTokens, false), nil)
				body := readAll(t, resp)
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("status %d: %s", resp.StatusCode, body)
				}
				if d.died() != home {
					t.Fatalf("engine %d died, want the home's, %d", d.died(), home)
				}
				if other := tn.Nodes[1-home].Name(); resp.Header.Get(node.HeaderNode) != other {
					t.Errorf("answered by %q, want the other node %q", resp.Header.Get(node.HeaderNode), other)
				}
				text, finish, u := parseWhole(t, "after the engine died", body)
				if text != unbroken(maxTokens) || finish != "length" {
					t.Errorf("client read %q (finish %q)", text, finish)
				}
				if u.PromptTokens != promptTokens(prompt) || u.CompletionTokens != maxTokens {
					t.Errorf("usage %+v", u)
				}
				reconciles(t, urls)
			})
		}
	}
}

// TestEngineErrorEventMidStreamIsAnswered pins the other side of migration: an engine that
// answers a stream with its own error event mid-stream is alive and has answered, under the
// ingress or under the owner it forwarded to; the client reads that error, and nothing moves.
func TestEngineErrorEventMidStreamIsAnswered(t *testing.T) {
	d := startDyingEngines(t, 2)
	tn := startDyingNet(t, d)
	urls := tn.URLs()
	const path = "/v1/chat/completions"
	prompt := longPrompt("error event", 2000)
	home, other := placeDeath(t, tn, path, prompt, false)
	for _, ingress := range []int{home, other} {
		d.armError(10)
		resp := post(t, urls[ingress], path, dyingBody(path, prompt, 60, true), nil)
		body := readAll(t, resp)
		var got stream
		got.readRest(&sseReader{t: t, br: bufio.NewReader(bytes.NewReader(body))})
		if resp.StatusCode != http.StatusOK || got.text != unbroken(10) || !strings.Contains(got.last, "the engine gave up") {
			t.Errorf("via n%d: status %d, text %q, last event %q; want the engine's 10 tokens and its error", ingress+1,
				resp.StatusCode, got.text, got.last)
		}
		if n := metric(t, urls[ingress], "kvmesh_migrations_total", ""); n != 0 {
			t.Errorf("via n%d: %v migrations, want none", ingress+1, n)
		}
	}
	if d.died() >= 0 {
		t.Errorf("engine %d died", d.died())
	}
	reconciles(t, urls)
}
