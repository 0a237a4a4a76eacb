package node_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/poll"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/testnet"
)

// startMigrateNet starts 3 nodes at the embedded engine's real speed (about 5 ms a token):
// n1 serves another model, so it is only an ingress, and n2 and n3 are the candidates that
// own its requests. configure, when set, changes the ingress's config.
func startMigrateNet(t *testing.T, configure func(cfg *node.Config)) *testnet.Net {
	t.Helper()
	return startNet(t, 3, func(i int, cfg *node.Config) {
		cfg.Sim.TimeScale = 1
		if i == 0 {
			cfg.Models = []string{"another-model"}
			if configure != nil {
				configure(cfg)
			}
		}
	})
}

// genBody is a seeded request that runs to maxTokens, on chat or completions.
func genBody(path string, maxTokens int, stream bool) string {
	m := map[string]any{"model": model, "max_tokens": maxTokens, "seed": 7, "ignore_eos": true, "stream": stream}
	if path == "/v1/completions" {
		m["prompt"] = longPrompt("migrate completion", 300)
	} else {
		m["messages"] = []map[string]string{{"role": "user", "content": longPrompt("migrate chat", 300)}}
	}
	if stream {
		m["stream_options"] = map[string]bool{"include_usage": true}
	}
	b, _ := json.Marshal(m)
	return string(b)
}

// event is what a test reads of one streamed chunk.
type event struct {
	raw    string
	text   string
	role   string
	finish string
	usage  *usage
}

// sseReader reads a streamed response event by event.
type sseReader struct {
	t  *testing.T
	br *bufio.Reader
}

// next returns the next event's data, or "" at the end of the body.
func (r *sseReader) next() event {
	r.t.Helper()
	for {
		line, err := r.br.ReadString('\n')
		if err == io.EOF && line == "" {
			return event{}
		}
		if err != nil && err != io.EOF {
			r.t.Fatalf("reading the stream: %v", err)
		}
		data, ok := strings.CutPrefix(strings.TrimSuffix(line, "\n"), "data: ")
		if !ok {
			continue
		}
		e := event{raw: data}
		var c struct {
			Choices []struct {
				Delta struct {
					Role    string `json:"role"`
					Content string `json:"content"`
				} `json:"delta"`
				Text         string  `json:"text"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage *usage `json:"usage"`
		}
		if json.Unmarshal([]byte(data), &c) == nil {
			e.usage = c.Usage
			if len(c.Choices) > 0 {
				ch := c.Choices[0]
				e.text, e.role = ch.Delta.Content+ch.Text, ch.Delta.Role
				if ch.FinishReason != nil {
					e.finish = *ch.FinishReason
				}
			}
		}
		return e
	}
}

// stream is a streamed request's response as the client read it.
type stream struct {
	text     string
	roles    int
	finishes []string
	usage    *usage
	last     string // the last event's data
}

// readRest reads r to the end into s.
func (s *stream) readRest(r *sseReader) {
	for e := r.next(); e.raw != ""; e = r.next() {
		s.add(e)
	}
}

func (s *stream) add(e event) {
	s.text += e.text
	if e.role != "" {
		s.roles++
	}
	if e.finish != "" {
		s.finishes = append(s.finishes, e.finish)
	}
	if e.usage != nil {
		s.usage = e.usage
	}
	s.last = e.raw
}

// readText reads events into s until it has n chunks of text more.
func (s *stream) readText(t *testing.T, r *sseReader, n int) {
	t.Helper()
	for n > 0 {
		e := r.next()
		if e.raw == "" || e.finish != "" {
			t.Fatalf("the stream ended (last %q) with %d chunks of text still expected", s.last, n)
		}
		s.add(e)
		if e.text != "" {
			n--
		}
	}
}

// reference runs body unstreamed: the text, finish reason and usage an unbroken run gives.
func reference(t *testing.T, url, path, body string) (text, finish string, u usage) {
	t.Helper()
	resp := post(t, url, path, body, nil)
	b := readAll(t, resp)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("reference run: %d %s", resp.StatusCode, b)
	}
	return parseWhole(t, "reference run", b)
}

// parseWhole reads an unstreamed response's body b: its text, finish reason and usage.
func parseWhole(t *testing.T, what string, b []byte) (text, finish string, u usage) {
	t.Helper()
	var r struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
			Text         string `json:"text"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage usage `json:"usage"`
	}
	if err := json.Unmarshal(b, &r); err != nil || len(r.Choices) != 1 {
		t.Fatalf("%s: %s (%v)", what, b, err)
	}
	return r.Choices[0].Message.Content + r.Choices[0].Text, r.Choices[0].FinishReason, r.Usage
}

// streamKillingOwner streams a request of maxTokens through the ingress, kills its owner's
// transport after 20 chunks of text, as a crash would, and reads the stream to its end.
func streamKillingOwner(t *testing.T, tn *testnet.Net, path string, maxTokens int) stream {
	t.Helper()
	_, owner, r := openStream(t, context.Background(), tn, path, genBody(path, maxTokens, true))
	var got stream
	got.readText(t, r, 20)
	if err := tn.Nodes[owner].KillTransport(); err != nil {
		t.Fatal(err)
	}
	got.readRest(r)
	return got
}

// openStream posts body to the ingress and returns the response, its owner's index and a
// reader of its events.
func openStream(t *testing.T, ctx context.Context, tn *testnet.Net, path, body string) (*http.Response, int, *sseReader) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, tn.URLs()[0]+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, readAll(t, resp))
	}
	owner := indexOf(t, tn, resp.Header.Get(node.HeaderNode))
	if owner == 0 {
		t.Fatal("the ingress, which serves another model, ran the request")
	}
	return resp, owner, &sseReader{t: t, br: bufio.NewReader(resp.Body)}
}

// TestOwnerDeathMidStreamMigrates pins migration: the owner of a streamed request dies
// abruptly after 20 chunks, and the client still reads one uninterrupted stream, the very
// text an unbroken run gives, with one role chunk, one finish_reason and the unbroken run's
// usage; the ingress counts one migration completed, and every node's requests reconcile.
func TestOwnerDeathMidStreamMigrates(t *testing.T) {
	for _, path := range []string{"/v1/chat/completions", "/v1/completions"} {
		t.Run(strings.TrimPrefix(path, "/v1/"), func(t *testing.T) {
			tn := startMigrateNet(t, nil)
			urls := tn.URLs()
			const maxTokens = 120
			want, wantFinish, wantUsage := reference(t, urls[0], path, genBody(path, maxTokens, false))
			if len(want) != 4*maxTokens {
				t.Fatalf("reference text is %d bytes, want %d", len(want), 4*maxTokens)
			}
			got := streamKillingOwner(t, tn, path, maxTokens)
			if got.text != want {
				t.Errorf("client read\n%q\nwant the unbroken run's\n%q", got.text, want)
			}
			if got.last != "[DONE]" || len(got.finishes) != 1 || got.finishes[0] != wantFinish {
				t.Errorf("stream ended with %q, finish reasons %q; want [DONE] and one %q", got.last, got.finishes, wantFinish)
			}
			if path == "/v1/chat/completions" && got.roles != 1 {
				t.Errorf("%d role chunks, want 1", got.roles)
			}
			if got.usage == nil || got.usage.PromptTokens != wantUsage.PromptTokens || got.usage.CompletionTokens != wantUsage.CompletionTokens {
				t.Errorf("usage %+v, want %+v", got.usage, wantUsage)
			}
			if n := metric(t, urls[0], "kvmesh_migrations_total", `cause="owner",outcome="completed"`); n != 1 {
				t.Errorf("owner migrations completed = %v, want 1", n)
			}
			reconciles(t, urls)
		})
	}
}

// TestMigrationLimitEndsWithAnErrorEvent pins the bound: with --migrations 1, a continuation
// whose own owner dies too is not moved again; the client's stream ends with an error event,
// and the ingress counts the first move failed and the second refused.
func TestMigrationLimitEndsWithAnErrorEvent(t *testing.T) {
	tn := startMigrateNet(t, nil)
	urls := tn.URLs()
	const path = "/v1/chat/completions"
	_, owner, r := openStream(t, context.Background(), tn, path, genBody(path, 400, true))
	var got stream
	got.readText(t, r, 10)
	if err := tn.Nodes[owner].KillTransport(); err != nil {
		t.Fatal(err)
	}
	got.readText(t, r, 10) // from the continuation, on the other candidate (of nodes 1 and 2)
	if err := tn.Nodes[3-owner].KillTransport(); err != nil {
		t.Fatal(err)
	}
	got.readRest(r)
	if got.last == "[DONE]" || !strings.HasPrefix(got.last, `{"error"`) || len(got.finishes) != 0 {
		t.Errorf("stream ended with %q (finish reasons %q), want an error event", got.last, got.finishes)
	}
	for outcome, want := range map[string]float64{"completed": 0, "failed": 1, "refused": 1} {
		if n := metric(t, urls[0], "kvmesh_migrations_total", `outcome="`+outcome+`"`); n != want {
			t.Errorf("migrations %s = %v, want %v", outcome, n, want)
		}
	}
	reconciles(t, urls)
}

// TestNoMigrationForAClientThatLeft pins that a request whose client is gone does not move:
// the owner's stream breaks because the client left, or its owner dies after, and no
// continuation runs anywhere.
func TestNoMigrationForAClientThatLeft(t *testing.T) {
	tn := startMigrateNet(t, nil)
	urls := tn.URLs()
	const path = "/v1/chat/completions"
	ctx, cancel := context.WithCancel(context.Background())
	resp, owner, r := openStream(t, ctx, tn, path, genBody(path, 400, true))
	var got stream
	got.readText(t, r, 10)
	cancel()
	resp.Body.Close()
	if err := tn.Nodes[owner].KillTransport(); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "the ingress to count the request failed", func() bool {
		return metric(t, urls[0], "kvmesh_requests_failed_total", `code="client_closed"`) == 1
	})
	text := string(adminGet(t, urls[0]+"/metrics"))
	for _, outcome := range []string{"completed", "failed", "refused"} {
		for _, cause := range []string{"engine", "owner"} {
			if s := `kvmesh_migrations_total{cause="` + cause + `",outcome="` + outcome + `"} 0`; !strings.Contains(text, "\n"+s+"\n") {
				t.Errorf("the ingress's /metrics lacks %s", s)
			}
		}
	}
	if n := metric(t, urls[3-owner], "kvmesh_engine_requests_total", `origin="peer"`); n != 0 {
		t.Errorf("the other candidate ran %v requests, want none", n)
	}
	reconciles(t, urls)
}

// TestOwnerDeathMidGenerationRunsAWholeResponseAgain is the unstreamed counterpart of
// TestOwnerDeathMidStreamMigrates: the owner of a request the client did not ask to stream
// dies abruptly while it generates. It answers only once its text is complete, so the ingress
// has had no answer yet: the attempt fails as unreachable and the request runs again on the
// other candidate, and the client gets one complete response, the very one an unbroken run
// gives, without a hang or an error; every node's requests reconcile.
func TestOwnerDeathMidGenerationRunsAWholeResponseAgain(t *testing.T) {
	for _, path := range []string{"/v1/chat/completions", "/v1/completions"} {
		t.Run(strings.TrimPrefix(path, "/v1/"), func(t *testing.T) {
			tn := startMigrateNet(t, nil)
			urls := tn.URLs()
			const maxTokens = 300 // about 1.5 s at the engine's real speed
			body := genBody(path, maxTokens, false)
			want, wantFinish, wantUsage := reference(t, urls[0], path, body)
			poll.Until(t, 10*time.Second, "the reference run to leave its engine", func() bool {
				return selfOf(peers(t, urls[1])).Running == 0 && selfOf(peers(t, urls[2])).Running == 0
			})
			done := sendAsync(urls[0], path, body, nil)
			owner := 0
			poll.Until(t, 10*time.Second, "a candidate to run the request", func() bool {
				for i := 1; i <= 2; i++ {
					if selfOf(peers(t, urls[i])).Running > 0 {
						owner = i
						return true
					}
				}
				return false
			})
			if err := tn.Nodes[owner].KillTransport(); err != nil {
				t.Fatal(err)
			}
			a := <-done
			if a.err != nil || a.status != http.StatusOK {
				t.Fatalf("the client got %d %s (%v) after its owner died; want a complete response", a.status, a.body, a.err)
			}
			if other := tn.Nodes[3-owner].Name(); a.node != other {
				t.Errorf("answered by %q, want the other candidate %q", a.node, other)
			}
			text, finish, u := parseWhole(t, "after the owner died", a.body)
			if text != want || finish != wantFinish {
				t.Errorf("client read %q (finish %q)\nwant the unbroken run's %q (finish %q)", text, finish, want, wantFinish)
			}
			if u.PromptTokens != wantUsage.PromptTokens || u.CompletionTokens != wantUsage.CompletionTokens {
				t.Errorf("usage %+v, want %+v", u, wantUsage)
			}
			if n := metric(t, urls[0], "kvmesh_forward_attempts_total", `result="unreachable"`); n != 1 {
				t.Errorf("unreachable forward attempts = %v, want 1: the one to the owner that died", n)
			}
			reconciles(t, urls)
		})
	}
}
