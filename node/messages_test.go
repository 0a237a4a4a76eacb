package node_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/node"
)

// A conversation with a system prompt, a tool call and its result, as the Messages API sends
// it and as chat completions sends the same.
func messagesConversation(system string, stream bool, stops []string) string {
	b, _ := json.Marshal(map[string]any{
		"model": model, "max_tokens": 48, "stream": stream, "system": system,
		"stop_sequences": stops,
		"messages": []any{
			map[string]any{"role": "user", "content": "What is the weather in Paris?"},
			map[string]any{"role": "assistant", "content": []any{
				map[string]any{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": map[string]string{"city": "Paris"}},
			}},
			map[string]any{"role": "user", "content": []any{
				map[string]any{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
				map[string]any{"type": "text", "text": "And tomorrow?"},
			}},
		},
		"tools": []any{map[string]any{"name": "get_weather", "description": "today's weather",
			"input_schema": map[string]any{"type": "object", "properties": map[string]any{"city": map[string]string{"type": "string"}}}}},
		"tool_choice": map[string]string{"type": "auto"},
	})
	return string(b)
}

func chatConversation(system string) string {
	b, _ := json.Marshal(map[string]any{
		"model": model, "max_tokens": 4,
		"messages": []any{
			map[string]any{"role": "system", "content": system},
			map[string]any{"role": "user", "content": "What is the weather in Paris?"},
			map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{"id": "toolu_1", "type": "function",
				"function": map[string]string{"name": "get_weather", "arguments": `{"city":"Paris"}`}}}},
			map[string]any{"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
			map[string]any{"role": "user", "content": "And tomorrow?"},
		},
	})
	return string(b)
}

type messagesAnswer struct {
	ID         string `json:"id"`
	Type       string `json:"type"`
	Role       string `json:"role"`
	Model      string `json:"model"`
	StopReason string `json:"stop_reason"`
	StopSeq    string `json:"stop_sequence"`
	Content    []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content"`
	Usage struct {
		InputTokens  int  `json:"input_tokens"`
		OutputTokens int  `json:"output_tokens"`
		CacheRead    *int `json:"cache_read_input_tokens"`
	} `json:"usage"`
}

func messagesJSON(t *testing.T, url, body string, hdr map[string]string) (messagesAnswer, string) {
	t.Helper()
	resp := post(t, url, "/v1/messages", body, hdr)
	b := readAll(t, resp)
	if resp.StatusCode != 200 {
		t.Fatalf("POST /v1/messages: %d %s", resp.StatusCode, b)
	}
	var a messagesAnswer
	if err := json.Unmarshal(b, &a); err != nil {
		t.Fatalf("answer %s: %v", b, err)
	}
	return a, resp.Header.Get(node.HeaderNode)
}

// TestMessagesRunThroughAForwardOnTheChatPrefix pins the Messages API end to end: a
// conversation with a system prompt, a tool call, its result and a stop sequence, sent to a
// node that does not hold its prefix, runs on the node that holds the equivalent chat
// conversation's prefix (one prefix for both APIs), streamed and not, and its answer reports
// the stop sequence that ended it.
func TestMessagesRunThroughAForwardOnTheChatPrefix(t *testing.T) {
	tn := startNet(t, 3, nil)
	urls := tn.URLs()
	system := longPrompt("messages", 2000)
	o, ingress := placePrefix(t, tn, chatConversation(system))
	owner := tn.Nodes[o].Name()

	// The text without a stop sequence picks one: a word from its middle.
	plain, ran := messagesJSON(t, urls[ingress], messagesConversation(system, false, nil), nil)
	if ran != owner {
		t.Fatalf("the Messages request ran on %s, want the chat prefix's owner %s", ran, owner)
	}
	if plain.Usage.CacheRead == nil || *plain.Usage.CacheRead < 1900 {
		t.Fatalf("cache_read_input_tokens %v of input %d: the chat prefix was not reused", plain.Usage.CacheRead, plain.Usage.InputTokens)
	}
	if plain.Type != "message" || plain.Role != "assistant" || plain.Model != model || !strings.HasPrefix(plain.ID, "msg_") ||
		len(plain.Content) != 1 || plain.Content[0].Type != "text" {
		t.Fatalf("answer %+v", plain)
	}
	words := strings.Fields(plain.Content[0].Text)
	if len(words) < 3 {
		t.Fatalf("answer %q too short to pick a stop sequence from", plain.Content[0].Text)
	}
	stop := " " + words[len(words)/2]
	want := plain.Content[0].Text[:strings.Index(plain.Content[0].Text, stop)]
	stops := []string{"never-in-the-text", stop}

	a, ran := messagesJSON(t, urls[ingress], messagesConversation(system, false, stops), map[string]string{"anthropic-version": "2023-06-01"})
	if ran != owner || a.StopReason != "stop_sequence" || a.StopSeq != stop || a.Content[0].Text != want {
		t.Fatalf("with stop %q: ran on %s, stop_reason %q, stop_sequence %q, text %q; want %s, stop_sequence, %q",
			stop, ran, a.StopReason, a.StopSeq, a.Content[0].Text, owner, want)
	}

	resp := post(t, urls[ingress], "/v1/messages", messagesConversation(system, true, nil), nil)
	text, reason, _ := checkMessagesStream(t, readAll(t, resp))
	if text != plain.Content[0].Text || reason != plain.StopReason {
		t.Errorf("stream without stop sequences: %q, %s; the same request unstreamed: %q, %s", text, reason, plain.Content[0].Text, plain.StopReason)
	}

	resp = post(t, urls[ingress], "/v1/messages", messagesConversation(system, true, stops), nil)
	b := readAll(t, resp)
	if resp.StatusCode != 200 || resp.Header.Get(node.HeaderNode) != owner || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("stream: %d on %s, %s", resp.StatusCode, resp.Header.Get(node.HeaderNode), b)
	}
	var seq string
	text, reason, seq = checkMessagesStream(t, b)
	if text != want || reason != "stop_sequence" || seq != stop {
		t.Errorf("stream: text %q, stop_reason %q, stop_sequence %q; want %q, stop_sequence, %q", text, reason, seq, want, stop)
	}
	if got := metric(t, urls[ingress], "kvmesh_requests_completed_total", `endpoint="messages"`); got != 4 {
		t.Errorf("kvmesh_requests_completed_total{endpoint=\"messages\"} = %v, want 4", got)
	}
}

// checkMessagesStream checks a Messages stream's events, their order and their names, and
// returns its text, stop reason and stop sequence.
func checkMessagesStream(t *testing.T, body []byte) (text, reason, seq string) {
	t.Helper()
	var kinds []string
	sc := bufio.NewScanner(bytes.NewReader(body))
	var event string
	for sc.Scan() {
		line := sc.Text()
		if e, ok := strings.CutPrefix(line, "event: "); ok {
			event = e
			continue
		}
		d, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		var ev struct {
			Type  string `json:"type"`
			Index int    `json:"index"`
			Delta struct {
				Type         string  `json:"type"`
				Text         string  `json:"text"`
				StopReason   string  `json:"stop_reason"`
				StopSequence *string `json:"stop_sequence"`
			} `json:"delta"`
			Usage struct {
				OutputTokens int `json:"output_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(d), &ev); err != nil || ev.Type != event {
			t.Fatalf("event %q with data %s (%v)", event, d, err)
		}
		if len(kinds) == 0 || kinds[len(kinds)-1] != ev.Type || ev.Type != "content_block_delta" {
			kinds = append(kinds, ev.Type)
		}
		switch ev.Type {
		case "content_block_delta":
			if ev.Index != 0 || ev.Delta.Type != "text_delta" {
				t.Fatalf("delta %s", d)
			}
			text += ev.Delta.Text
		case "message_delta":
			reason = ev.Delta.StopReason
			if ev.Delta.StopSequence != nil {
				seq = *ev.Delta.StopSequence
			}
			if ev.Usage.OutputTokens < 1 {
				t.Errorf("message_delta without output tokens: %s", d)
			}
		}
	}
	want := []string{"message_start", "content_block_start", "ping", "content_block_delta", "content_block_stop", "message_delta", "message_stop"}
	if !slices.Equal(kinds, want) {
		t.Fatalf("events %v, want %v", kinds, want)
	}
	return text, reason, seq
}

type messagesError struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

// TestMessagesErrorsHaveTheMessagesShape pins the Messages API's error body and status for
// kvmesh's refusals, and its keys: x-api-key as well as Authorization.
func TestMessagesErrorsHaveTheMessagesShape(t *testing.T) {
	keys := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(keys, []byte(admit.HashKey("sk-alpha")+" alpha 1 100000\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tn := startNet(t, 1, func(i int, cfg *node.Config) { cfg.APIKeysFile = keys })
	url := tn.URLs()[0]
	key := map[string]string{"x-api-key": "sk-alpha", "anthropic-version": "2023-06-01"}
	good := `{"model":"` + model + `","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`
	for _, c := range []struct {
		name, path, body string
		hdr              map[string]string
		status           int
		typ, mentions    string
	}{
		{"no key", "/v1/messages", good, nil, 401, "authentication_error", "API key"},
		{"wrong key", "/v1/messages", good, map[string]string{"x-api-key": "sk-wrong"}, 401, "authentication_error", "API key"},
		{"malformed JSON", "/v1/messages", `{"model":`, key, 400, "invalid_request_error", "JSON"},
		{"no max_tokens", "/v1/messages", `{"model":"` + model + `","messages":[{"role":"user","content":"hi"}]}`, key, 400, "invalid_request_error", "max_tokens"},
		{"unknown model", "/v1/messages", strings.Replace(good, model, "no-such-model", 1), key, 404, "not_found_error", "no-such-model"},
		{"thinking", "/v1/messages", strings.Replace(good, `"max_tokens":4`, `"max_tokens":4,"thinking":{"type":"enabled","budget_tokens":1024}`, 1), key, 400, "invalid_request_error", "thinking"},
		{"document block", "/v1/messages", strings.Replace(good, `"content":"hi"`, `"content":[{"type":"document","source":{}}]`, 1), key, 400, "invalid_request_error", "messages.0.content.0.type"},
		{"count_tokens, unknown model", "/v1/messages/count_tokens", strings.Replace(good, model, "no-such-model", 1), key, 404, "not_found_error", "no-such-model"},
		{"count_tokens, no key", "/v1/messages/count_tokens", good, nil, 401, "authentication_error", "API key"},
	} {
		t.Run(c.name, func(t *testing.T) {
			resp := post(t, url, c.path, c.body, c.hdr)
			b := readAll(t, resp)
			var e messagesError
			if err := json.Unmarshal(b, &e); err != nil || resp.StatusCode != c.status || e.Type != "error" || e.Error.Type != c.typ ||
				!strings.Contains(e.Error.Message, c.mentions) {
				t.Fatalf("%d %s; want %d, type error, error.type %s mentioning %q", resp.StatusCode, b, c.status, c.typ, c.mentions)
			}
		})
	}
	a, _ := messagesJSON(t, url, good, key)
	if a.StopReason == "" || a.Usage.OutputTokens < 1 {
		t.Fatalf("with x-api-key: %+v", a)
	}
	_, _ = messagesJSON(t, url, good, map[string]string{"Authorization": "Bearer sk-alpha"})
}

// TestMessagesCountTokens pins count_tokens: the prompt tokens admission counts, more for a
// longer conversation, and as many as the equivalent chat request's prompt.
func TestMessagesCountTokens(t *testing.T) {
	tn := startNet(t, 1, nil)
	url := tn.URLs()[0]
	count := func(system string) int {
		var m map[string]any
		_ = json.Unmarshal([]byte(messagesConversation(system, false, nil)), &m)
		delete(m, "max_tokens")
		delete(m, "stream")
		b, _ := json.Marshal(m)
		resp := post(t, url, "/v1/messages/count_tokens", string(b), nil)
		body := readAll(t, resp)
		var c struct {
			InputTokens int `json:"input_tokens"`
		}
		if err := json.Unmarshal(body, &c); err != nil || resp.StatusCode != 200 {
			t.Fatalf("count_tokens: %d %s", resp.StatusCode, body)
		}
		return c.InputTokens
	}
	short, long := count("be brief"), count(longPrompt("count", 500))
	if short < 10 || long < short+400 {
		t.Fatalf("count_tokens: %d for a short system prompt, %d for a 500-token one", short, long)
	}
	resp := post(t, url, "/v1/chat/completions", chatConversation(longPrompt("count", 500)), nil)
	var u struct {
		Usage usage `json:"usage"`
	}
	if err := json.Unmarshal(readAll(t, resp), &u); err != nil || u.Usage.PromptTokens != long {
		t.Errorf("count_tokens %d, the chat request's prompt_tokens %d", long, u.Usage.PromptTokens)
	}
}

// TestMessagesReachAnExternalEngineAsChat pins a Messages request in front of an external
// engine, sent to its node and through a forward: the engine gets the translated chat request
// (image as a data URL, the tool call and its result, the stop sequence kept in the output) and
// the client the Messages answer of the engine's.
func TestMessagesReachAnExternalEngineAsChat(t *testing.T) {
	f := startRecordingEngine(t)
	tn := startNet(t, 2, func(i int, cfg *node.Config) {
		if i == 0 {
			cfg.Engine, cfg.EngineKind = f.url, "openai"
			return
		}
		cfg.Models = []string{"another-model"} // the ingress that must forward
	})
	var m map[string]any
	_ = json.Unmarshal([]byte(messagesConversation("be brief", false, []string{"END"})), &m)
	msgs := m["messages"].([]any)
	msgs[0] = map[string]any{"role": "user", "content": []any{
		map[string]any{"type": "image", "source": map[string]string{"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
		map[string]any{"type": "text", "text": "What is the weather here?"},
	}}
	body, _ := json.Marshal(m)
	for i, url := range tn.URLs() {
		a, ran := messagesJSON(t, url, string(body), nil)
		if ran != "n1" || a.StopReason != "end_turn" || len(a.Content) != 1 || a.Content[0].Text != "ok" ||
			a.Usage.InputTokens != 9 || a.Usage.OutputTokens != 1 {
			t.Fatalf("via n%d: ran on %s, answer %+v", i+1, ran, a)
		}
		var chat struct {
			Messages []struct {
				Role       string          `json:"role"`
				Content    json.RawMessage `json:"content"`
				ToolCalls  json.RawMessage `json:"tool_calls"`
				ToolCallID string          `json:"tool_call_id"`
			} `json:"messages"`
			Stop           []string `json:"stop"`
			IncludeStopStr bool     `json:"include_stop_str_in_output"`
			Tools          []any    `json:"tools"`
			ToolChoice     string   `json:"tool_choice"`
		}
		got := <-f.bodies
		if err := json.Unmarshal(got, &chat); err != nil || len(chat.Messages) != 5 || chat.Messages[0].Role != "system" ||
			!strings.Contains(string(chat.Messages[1].Content), `"url":"data:image/png;base64,iVBORw0KGgo="`) ||
			!strings.Contains(string(chat.Messages[2].ToolCalls), `"arguments":"{\"city\":\"Paris\"}"`) ||
			chat.Messages[3].Role != "tool" || chat.Messages[3].ToolCallID != "toolu_1" ||
			!slices.Equal(chat.Stop, []string{"END"}) || !chat.IncludeStopStr || len(chat.Tools) != 1 || chat.ToolChoice != "auto" {
			t.Fatalf("via n%d the engine got %s", i+1, got)
		}
	}
}
