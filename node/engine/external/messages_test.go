package external

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/node/engine"
)

// TestProbeMessages: with messages auto, a server answering the probe with its own 4xx serves
// the Messages API, one answering 404 or 405 does not, and a 5xx leaves it unknown (asked
// again); on and off are taken as said, without a probe.
func TestProbeMessages(t *testing.T) {
	tests := []struct {
		mode   string
		status int
		want   bool
		asked  bool
	}{
		{MessagesAuto, http.StatusBadRequest, true, true},
		{"", http.StatusUnprocessableEntity, true, true},
		{MessagesAuto, http.StatusNotFound, false, true},
		{MessagesAuto, http.StatusMethodNotAllowed, false, true},
		{MessagesAuto, http.StatusServiceUnavailable, false, true},
		{MessagesOn, http.StatusNotFound, true, false},
		{MessagesOff, http.StatusBadRequest, false, false},
	}
	for _, tt := range tests {
		asked := false
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == messagesPath {
				b, _ := io.ReadAll(r.Body)
				asked = string(b) == "{}"
			}
			w.WriteHeader(tt.status)
		}))
		e, err := New(Config{BaseURL: srv.URL, Kind: KindOpenAI, Messages: tt.mode})
		if err != nil {
			t.Fatal(err)
		}
		e.probeMessages(context.Background())
		srv.Close()
		if e.ServesMessages() != tt.want || asked != tt.asked {
			t.Errorf("mode %q, probe answered %d: serves %v (asked %v), want %v (asked %v)", tt.mode, tt.status,
				e.ServesMessages(), asked, tt.want, tt.asked)
		}
		if tt.status == http.StatusServiceUnavailable && e.messages.Load() != messagesUnknown {
			t.Errorf("a 5xx settled the question")
		}
	}
	if _, err := New(Config{BaseURL: "http://127.0.0.1:1", Messages: "yes"}); err == nil {
		t.Error("messages yes accepted")
	}
}

// TestGenerateMessages: a Messages request is posted to /v1/messages as the client sent it
// (its max_tokens lowered to the admitted cap when over it), and its answer comes back in the
// chunks' Raw, byte for byte, with the text, the stop reason and the usage read from it; an
// error event is relayed, then reported as ErrStream.
func TestGenerateMessages(t *testing.T) {
	events := "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":7,\"output_tokens\":0,\"cache_read_input_tokens\":3}}}\n\n" +
		": a comment\n\n" +
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\n" +
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\"},\"usage\":{\"output_tokens\":4}}\n\n" +
		"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
	failing := "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":7}}}\n\n" +
		"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"busy\"}}\n\n"
	whole := `{"type":"message","content":[{"type":"text","text":"a"},{"type":"tool_use","id":"t","name":"f","input":{}},{"type":"text","text":"b"}],` +
		`"stop_reason":"tool_use","usage":{"input_tokens":9,"output_tokens":5}}`
	var got []byte
	var answer string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != messagesPath {
			http.NotFound(w, r)
			return
		}
		got, _ = io.ReadAll(r.Body)
		if answer == whole {
			w.Header().Set("Content-Type", "application/json")
		} else {
			w.Header().Set("Content-Type", "text/event-stream")
		}
		io.WriteString(w, answer)
	}))
	defer srv.Close()
	e, err := New(Config{BaseURL: srv.URL, Kind: KindOpenAI, Messages: MessagesOn})
	if err != nil {
		t.Fatal(err)
	}
	body := `{"model":"m", "max_tokens":100,"stream":true,"messages":[{"role":"user","content":"q"}]}`
	run := func(ans string, maxTokens int) ([]engine.Chunk, error) {
		answer = ans
		st, err := e.Generate(context.Background(), &engine.Request{Messages: []byte(body), MaxTokens: maxTokens, Body: []byte(`{}`)})
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		var out []engine.Chunk
		for {
			c, err := st.Recv()
			if err != nil {
				return out, err
			}
			out = append(out, c)
		}
	}
	chunks, err := run(events, 100)
	if err != io.EOF || string(got) != body {
		t.Fatalf("err %v; the engine got %s, want the client's body", err, got)
	}
	var raw, text string
	for _, c := range chunks {
		raw, text = raw+string(c.Raw), text+c.Text
	}
	last := chunks[len(chunks)-1]
	if raw != events || text != "hi" || last.FinishReason != engine.FinishLength ||
		*last.Usage != (engine.Usage{PromptTokens: 10, CompletionTokens: 4, CachedTokens: 3}) {
		t.Errorf("raw %q text %q finish %q usage %+v", raw, text, last.FinishReason, last.Usage)
	}
	if len(chunks) != 2 {
		t.Errorf("%d chunks, want one to the first text and one to the end", len(chunks))
	}
	chunks, err = run(failing, 20)
	if !errors.Is(err, ErrStream) || len(chunks) != 1 || string(chunks[0].Raw) != failing {
		t.Errorf("error event: chunks %+v, err %v", chunks, err)
	}
	if want := strings.Replace(body, `"max_tokens":100`, `"max_tokens":20`, 1); string(got) != want {
		t.Errorf("the engine got %s, want %s", got, want)
	}
	chunks, err = run(whole, 0)
	if err != io.EOF || len(chunks) != 1 || string(chunks[0].Raw) != whole || chunks[0].Text != "ab" ||
		chunks[0].FinishReason != engine.FinishToolCalls || chunks[0].Usage.CompletionTokens != 5 {
		t.Errorf("whole answer: %+v, %v", chunks, err)
	}
}
