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
	"sync"
	"testing"

	"github.com/kvmesh/kvmesh/node"
)

// call is a tool call as a client puts it together.
type call struct{ ID, Name, Args string }

// weatherTool is a chat request's tools and a tool_choice that forces get_weather.
const weatherTool = `"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",` +
	`"properties":{"city":{"type":"string"},"days":{"type":"integer"}}}}}],` +
	`"tool_choice":{"type":"function","function":{"name":"get_weather"}}`

func toolChat(stream bool) string {
	return fmt.Sprintf(`{"model":%q,"max_tokens":64,"stream":%t,"messages":[{"role":"user","content":"The weather in Paris?"}],%s}`,
		model, stream, weatherTool)
}

func toolMessages(stream bool) string {
	return fmt.Sprintf(`{"model":%q,"max_tokens":64,"stream":%t,"messages":[{"role":"user","content":"The weather in Paris?"}],`+
		`"tools":[{"name":"get_weather","input_schema":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}}}}],`+
		`"tool_choice":{"type":"tool","name":"get_weather"}}`, model, stream)
}

// chatCall posts a chat request and returns its one tool call, finish reason and node.
func chatCall(t *testing.T, url, body string) (call, string, string) {
	t.Helper()
	resp := post(t, url, "/v1/chat/completions", body, nil)
	b := readAll(t, resp)
	if resp.StatusCode != 200 {
		t.Fatalf("chat: %d %s", resp.StatusCode, b)
	}
	ran := resp.Header.Get(node.HeaderNode)
	if !strings.Contains(body, `"stream":true`) {
		var c struct {
			Choices []struct {
				Message struct {
					Content   *string `json:"content"`
					ToolCalls []struct {
						ID       string `json:"id"`
						Type     string `json:"type"`
						Function struct{ Name, Arguments string }
					} `json:"tool_calls"`
				} `json:"message"`
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(b, &c); err != nil || len(c.Choices) != 1 || len(c.Choices[0].Message.ToolCalls) != 1 ||
			c.Choices[0].Message.Content != nil || c.Choices[0].Message.ToolCalls[0].Type != "function" {
			t.Fatalf("chat answer %s (%v): want one tool call and null content", b, err)
		}
		tc := c.Choices[0].Message.ToolCalls[0]
		return call{tc.ID, tc.Function.Name, tc.Function.Arguments}, c.Choices[0].FinishReason, ran
	}
	var got call
	var finish string
	pieces := 0
	for _, e := range sseEvents(t, b) {
		if e == "[DONE]" {
			continue
		}
		var c struct {
			Choices []struct {
				Delta struct {
					Content   *string `json:"content"`
					ToolCalls []struct {
						Index    *int   `json:"index"`
						ID       string `json:"id"`
						Function struct{ Name, Arguments string }
					} `json:"tool_calls"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(e), &c); err != nil {
			t.Fatalf("event %s: %v", e, err)
		}
		for _, ch := range c.Choices {
			if ch.Delta.Content != nil && *ch.Delta.Content != "" {
				t.Fatalf("text %q in a tool call's stream", *ch.Delta.Content)
			}
			for _, tc := range ch.Delta.ToolCalls {
				if tc.Index == nil || *tc.Index != 0 {
					t.Fatalf("tool call piece without index 0: %s", e)
				}
				got.ID += tc.ID
				got.Name += tc.Function.Name
				got.Args += tc.Function.Arguments
				pieces++
			}
			if ch.FinishReason != nil {
				finish = *ch.FinishReason
			}
		}
	}
	if pieces < 2 {
		t.Fatalf("the call came in %d pieces: %s", pieces, b)
	}
	return got, finish, ran
}

// messagesCall posts a Messages request and returns its one tool_use block, stop reason and
// node; for a stream, the input put together from its input_json_delta events, and
// message_start's input_tokens.
func messagesCall(t *testing.T, url, body string) (c call, reason, ran string, startInput int) {
	t.Helper()
	resp := post(t, url, "/v1/messages", body, nil)
	b := readAll(t, resp)
	if resp.StatusCode != 200 {
		t.Fatalf("messages: %d %s", resp.StatusCode, b)
	}
	ran = resp.Header.Get(node.HeaderNode)
	if !strings.Contains(body, `"stream":true`) {
		var a struct {
			StopReason string `json:"stop_reason"`
			Content    []struct {
				Type  string          `json:"type"`
				ID    string          `json:"id"`
				Name  string          `json:"name"`
				Input json.RawMessage `json:"input"`
			} `json:"content"`
		}
		if err := json.Unmarshal(b, &a); err != nil || len(a.Content) != 1 || a.Content[0].Type != "tool_use" {
			t.Fatalf("messages answer %s (%v): want one tool_use block", b, err)
		}
		return call{a.Content[0].ID, a.Content[0].Name, string(a.Content[0].Input)}, a.StopReason, ran, 0
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		d, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var ev struct {
			Type    string `json:"type"`
			Message struct {
				Usage struct {
					InputTokens int `json:"input_tokens"`
				} `json:"usage"`
			} `json:"message"`
			ContentBlock struct {
				Type, ID, Name string
			} `json:"content_block"`
			Delta struct {
				Type        string `json:"type"`
				PartialJSON string `json:"partial_json"`
				StopReason  string `json:"stop_reason"`
			} `json:"delta"`
		}
		if err := json.Unmarshal([]byte(d), &ev); err != nil {
			t.Fatalf("event %s: %v", d, err)
		}
		switch ev.Type {
		case "message_start":
			startInput = ev.Message.Usage.InputTokens
		case "content_block_start":
			if ev.ContentBlock.Type != "tool_use" {
				t.Fatalf("block %s, want tool_use only", d)
			}
			c.ID, c.Name = ev.ContentBlock.ID, ev.ContentBlock.Name
		case "content_block_delta":
			if ev.Delta.Type != "input_json_delta" {
				t.Fatalf("delta %s, want input_json_delta", d)
			}
			c.Args += ev.Delta.PartialJSON
		case "message_delta":
			reason = ev.Delta.StopReason
		}
	}
	return c, reason, ran, startInput
}

// compactJSON is s compacted, to compare JSON texts.
func compactJSON(t *testing.T, s string) string {
	t.Helper()
	var b bytes.Buffer
	if err := json.Compact(&b, []byte(s)); err != nil {
		t.Fatalf("not JSON: %q: %v", s, err)
	}
	return b.String()
}

// checkToolCalls sends the four requests (chat and Messages, streamed and not; one prompt) to
// url and checks each answer is want (Args compared as JSON), run on owner: finish_reason
// tool_calls, stop_reason tool_use.
func checkToolCalls(t *testing.T, url, owner string, want call) {
	t.Helper()
	for _, stream := range []bool{false, true} {
		c, finish, ran := chatCall(t, url, toolChat(stream))
		if ran != owner || finish != "tool_calls" || c.ID != want.ID || c.Name != want.Name || compactJSON(t, c.Args) != compactJSON(t, want.Args) {
			t.Errorf("chat, stream %t: %+v, finish %q, on %s; want %+v, tool_calls, on %s", stream, c, finish, ran, want, owner)
		}
		m, reason, ran, input := messagesCall(t, url, toolMessages(stream))
		if ran != owner || reason != "tool_use" || m.Name != want.Name || m.ID != want.ID || compactJSON(t, m.Args) != compactJSON(t, want.Args) {
			t.Errorf("messages, stream %t: %+v, stop_reason %q, on %s; want %+v, tool_use, on %s", stream, m, reason, ran, want, owner)
		}
		if stream && input < 5 {
			t.Errorf("message_start input_tokens %d: want the ingress's count of the prompt", input)
		}
	}
}

// TestToolCallsOfTheEmbeddedEngineReachTheClientThroughAForward pins tool calls end to end on
// the embedded engine: a request forcing a tool, sent to a node that must forward it, comes
// back as the call (chat: tool_calls, streamed in pieces, finish_reason tool_calls; Messages:
// a tool_use block, its input streamed as input_json_delta, stop_reason tool_use).
func TestToolCallsOfTheEmbeddedEngineReachTheClientThroughAForward(t *testing.T) {
	tn := startNet(t, 2, func(i int, cfg *node.Config) {
		if i == 1 {
			cfg.Models = []string{"another-model"} // the ingress that must forward
		}
	})
	url := tn.URLs()[1]
	want, _, _ := chatCall(t, tn.URLs()[0], toolChat(false))
	var args struct {
		City string `json:"city"`
		Days *int   `json:"days"`
	}
	if err := json.Unmarshal([]byte(want.Args), &args); err != nil || want.Name != "get_weather" || args.City == "" || args.Days == nil {
		t.Fatalf("the engine's call %+v (%v)", want, err)
	}
	checkToolCalls(t, url, tn.Nodes[0].Name(), want)
}

// TestToolCallsOfAnExternalEngineReachTheClientThroughAForward pins an external engine's tool
// calls, streamed in fragments, end to end through a forward, for chat and Messages, streamed
// and not.
func TestToolCallsOfAnExternalEngineReachTheClientThroughAForward(t *testing.T) {
	url := startToolEngine(t)
	tn := startNet(t, 2, func(i int, cfg *node.Config) {
		if i == 0 {
			cfg.Engine, cfg.EngineKind = url, "openai"
			return
		}
		cfg.Models = []string{"another-model"}
	})
	checkToolCalls(t, tn.URLs()[1], tn.Nodes[0].Name(), call{"call_w1", "get_weather", `{"city": "Paris", "days": 2}`})
}

// startToolEngine is an OpenAI-compatible engine that answers every chat request with a call
// to get_weather, its arguments in three fragments, as vLLM streams them.
func startToolEngine(t *testing.T) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, `{"object":"list","data":[{"id":%q,"object":"model","max_model_len":131072}]}`, model)
	})
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for _, e := range []string{
			`{"id":"x","choices":[{"index":0,"delta":{"role":"assistant","content":null},"finish_reason":null}]}`,
			`{"id":"x","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_w1","type":"function","function":{"name":"get_weather","arguments":""}}]},"finish_reason":null}]}`,
			`{"id":"x","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\": "}}]},"finish_reason":null}]}`,
			`{"id":"x","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"Paris\", "}}]},"finish_reason":null}]}`,
			`{"id":"x","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"days\": 2}"}}]},"finish_reason":"tool_calls"}]}`,
			`{"id":"x","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":9,"total_tokens":21}}`,
			"[DONE]",
		} {
			fmt.Fprintf(w, "data: %s\n\n", e)
		}
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestAStreamThatSentAToolCallDoesNotMove pins the resume rule for tool calls: when the engine
// breaks after a piece of a tool call reached the client, the request is not continued
// elsewhere (a continuation continues text, not half a call's arguments): the client's stream
// ends with an error event and the move counts refused. The engine both nodes share breaks
// its first answer after the call's first piece and answers every later request in text.
func TestAStreamThatSentAToolCallDoesNotMove(t *testing.T) {
	var mu sync.Mutex
	answered := 0
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, `{"object":"list","data":[{"id":%q,"object":"model","max_model_len":131072}]}`, model)
	})
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		answered++
		first := answered == 1
		mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		if !first {
			fmt.Fprint(w, `data: {"id":"x","choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":"stop"}]}`+"\n\n"+
				`data: {"id":"x","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":1,"total_tokens":13}}`+"\n\ndata: [DONE]\n\n")
			return
		}
		fmt.Fprint(w, `data: {"id":"x","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_w1","type":"function",`+
			`"function":{"name":"get_weather","arguments":"{\"ci"}}]},"finish_reason":null}]}`+"\n\n")
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // the engine dies mid-call
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	tn := startNet(t, 2, func(i int, cfg *node.Config) { cfg.Engine, cfg.EngineKind = srv.URL, "openai" })
	url := tn.URLs()[0]
	resp := post(t, url, "/v1/chat/completions", toolChat(true), nil)
	events := sseEvents(t, readAll(t, resp))
	if len(events) == 0 || !strings.Contains(events[len(events)-1], `"error"`) || !strings.Contains(strings.Join(events, "\n"), `"call_w1"`) {
		t.Fatalf("stream %q: want the call's piece, then an error event", events)
	}
	for _, e := range events {
		if strings.Contains(e, `"content":"ok"`) || e == "[DONE]" {
			t.Fatalf("stream %q: a continuation ran after the tool call's piece", events)
		}
	}
	if n := metric(t, url, "kvmesh_migrations_total", `cause="engine",outcome="refused"`); n != 1 {
		t.Errorf("engine migrations refused = %v, want 1", n)
	}
}

// TestMessagesRouteErrorsAndStopSequenceBound pins the Messages API's shape for a path or
// method it does not serve under /v1/messages, and the refusal of too many stop_sequences,
// named as the Messages API names them.
func TestMessagesRouteErrorsAndStopSequenceBound(t *testing.T) {
	tn := startNet(t, 1, nil)
	url := tn.URLs()[0]
	for _, c := range []struct {
		name, method, path, body string
		status                   int
		typ, mentions            string
	}{
		{"unknown path", http.MethodPost, "/v1/messages/batches", `{}`, 404, "not_found_error", "/v1/messages/batches"},
		{"GET messages", http.MethodGet, "/v1/messages", "", 405, "invalid_request_error", "POST"},
		{"GET count_tokens", http.MethodGet, "/v1/messages/count_tokens", "", 405, "invalid_request_error", "POST"},
		{"five stop sequences", http.MethodPost, "/v1/messages", `{"model":"` + model + `","max_tokens":4,` +
			`"stop_sequences":["a","b","c","d","e"],"messages":[{"role":"user","content":"hi"}]}`, 400, "invalid_request_error", "stop_sequences"},
	} {
		t.Run(c.name, func(t *testing.T) {
			req, _ := http.NewRequest(c.method, url+c.path, strings.NewReader(c.body))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b := readAll(t, resp)
			var e messagesError
			if err := json.Unmarshal(b, &e); err != nil || resp.StatusCode != c.status || e.Type != "error" || e.Error.Type != c.typ ||
				!strings.Contains(e.Error.Message, c.mentions) {
				t.Fatalf("%d %s; want %d, type error, error.type %s mentioning %q", resp.StatusCode, b, c.status, c.typ, c.mentions)
			}
			if c.status == 405 && resp.Header.Get("Allow") != "POST" {
				t.Errorf("Allow %q", resp.Header.Get("Allow"))
			}
		})
	}
	resp := post(t, url, "/v1/chat/completions", `{"model":"`+model+`","max_tokens":4,"stop":["a","b","c","d","e"],"messages":[{"role":"user","content":"hi"}]}`, nil)
	if b := readAll(t, resp); resp.StatusCode != 400 || !strings.Contains(string(b), `"param":"stop"`) {
		t.Errorf("chat with five stops: %d %s; want 400 naming stop", resp.StatusCode, b)
	}
}
