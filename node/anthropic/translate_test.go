package anthropic

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/node/openai"
)

// canon re-encodes a JSON text with sorted keys and no spaces.
func canon(t *testing.T, s string) string {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("%s: %v", s, err)
	}
	b, _ := json.Marshal(v)
	return string(b)
}

func TestToChatTranslatesEachMember(t *testing.T) {
	for _, c := range []struct{ name, in, want string }{
		{"plain", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`,
			`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`},
		{"system string and sampling", `{"model":"m","max_tokens":5,"system":"be brief","temperature":0.5,"top_p":0.9,"top_k":40,` +
			`"metadata":{"user_id":"u1"},"messages":[{"role":"user","content":"hi"}]}`,
			`{"model":"m","max_tokens":5,"temperature":0.5,"top_p":0.9,"top_k":40,"user":"u1",` +
				`"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]}`},
		{"system blocks", `{"model":"m","max_tokens":5,"system":[{"type":"text","text":"a","cache_control":{"type":"ephemeral"}},{"type":"text","text":"b"}],"messages":[{"role":"user","content":"hi"}]}`,
			`{"model":"m","max_tokens":5,"messages":[{"role":"system","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},{"role":"user","content":"hi"}]}`},
		{"stop sequences and stream", `{"model":"m","max_tokens":5,"stream":true,"stop_sequences":["\n\nHuman:"],"messages":[{"role":"user","content":"hi"}]}`,
			`{"model":"m","max_tokens":5,"stream":true,"stream_options":{"include_usage":true},"stop":["\n\nHuman:"],"include_stop_str_in_output":true,"messages":[{"role":"user","content":"hi"}]}`},
		{"image", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AAAA"}},{"type":"text","text":"what is it?"}]}]}`,
			`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}},{"type":"text","text":"what is it?"}]}]}`},
		{"tool use and result", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"weather?"},` +
			`{"role":"assistant","content":[{"type":"text","text":"Let me look."},{"type":"tool_use","id":"t1","name":"w","input":{ "city" : "Paris" }}]},` +
			`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"sun"},{"type":"text","text":"20C"}]},{"type":"text","text":"thanks"}]}],` +
			`"tools":[{"name":"w","description":"weather","input_schema":{"type":"object"}}],"tool_choice":{"type":"any","disable_parallel_tool_use":true}}`,
			`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"weather?"},` +
				`{"role":"assistant","content":"Let me look.","tool_calls":[{"id":"t1","type":"function","function":{"name":"w","arguments":"{\"city\":\"Paris\"}"}}]},` +
				`{"role":"tool","tool_call_id":"t1","content":"sun\n20C"},{"role":"user","content":"thanks"}],` +
				`"tools":[{"type":"function","function":{"name":"w","description":"weather","parameters":{"type":"object"}}}],"tool_choice":"required","parallel_tool_calls":false}`},
		{"tool only assistant, named tool choice", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"q"},` +
			`{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"w","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1"}]}],` +
			`"tools":[{"name":"w","input_schema":{}}],"tool_choice":{"type":"tool","name":"w"}}`,
			`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"q"},` +
				`{"role":"assistant","content":null,"tool_calls":[{"id":"t1","type":"function","function":{"name":"w","arguments":"{}"}}]},` +
				`{"role":"tool","tool_call_id":"t1","content":""}],` +
				`"tools":[{"type":"function","function":{"name":"w","parameters":{}}}],"tool_choice":{"type":"function","function":{"name":"w"}}}`},
		{"assistant prefill", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"The answer is"}]}`,
			`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"The answer is"}],` +
				`"continue_final_message":true,"add_generation_prompt":false}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, oerr := Decode([]byte(c.in), false)
			if oerr != nil {
				t.Fatal(oerr)
			}
			if got, want := canon(t, string(ToChat(r))), canon(t, c.want); got != want {
				t.Errorf("chat body\n got %s\nwant %s", got, want)
			}
			if _, oerr := openai.DecodeChat(bytes.NewReader(ToChat(r)), 1<<20); oerr != nil {
				t.Errorf("the chat decoder refuses the translation: %v", oerr)
			}
		})
	}
}

func TestDecodeRefusesByName(t *testing.T) {
	const ok = `"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]`
	for _, c := range []struct{ name, body, param string }{
		{"not an object", `[1]`, ""},
		{"trailing data", `{` + ok + `} x`, ""},
		{"no model", `{"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`, "model"},
		{"no max_tokens", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, "max_tokens"},
		{"max_tokens 0", `{"model":"m","max_tokens":0,"messages":[{"role":"user","content":"hi"}]}`, "max_tokens"},
		{"no messages", `{"model":"m","max_tokens":5,"messages":[]}`, "messages"},
		{"system role", `{"model":"m","max_tokens":5,"messages":[{"role":"system","content":"hi"}]}`, "messages.0.role"},
		{"unknown member", `{` + ok + `,"frequency_penalty":1}`, "frequency_penalty"},
		{"thinking", `{` + ok + `,"thinking":{"type":"enabled","budget_tokens":2000}}`, "thinking"},
		{"mcp servers", `{` + ok + `,"mcp_servers":[]}`, "mcp_servers"},
		{"temperature over 1", `{` + ok + `,"temperature":1.5}`, "temperature"},
		{"temperature a string", `{` + ok + `,"temperature":"hot"}`, "temperature"},
		{"empty stop sequence", `{` + ok + `,"stop_sequences":[""]}`, "stop_sequences.0"},
		{"server tool", `{` + ok + `,"tools":[{"type":"web_search_20250305","name":"web_search"}]}`, "tools.0.type"},
		{"tool without schema", `{` + ok + `,"tools":[{"name":"w"}]}`, "tools.0.input_schema"},
		{"tool choice of no tool", `{` + ok + `,"tool_choice":{"type":"tool","name":"w"}}`, "tool_choice.name"},
		{"tool choice type", `{` + ok + `,"tool_choice":{"type":"required"}}`, "tool_choice.type"},
		{"metadata member", `{` + ok + `,"metadata":{"session":"x"}}`, "metadata"},
		{"document block", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"document","source":{}}]}]}`, "messages.0.content"},
		{"thinking block", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"q"},{"role":"assistant","content":[{"type":"thinking","thinking":"x","signature":"s"}]}]}`, "messages.1.content"},
		{"tool_use from the user", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_use","id":"t","name":"w","input":{}}]}]}`, "messages.0.content.0"},
		{"image without source", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"image"}]}]}`, "messages.0.content"},
		{"image in a tool result", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"image","source":{"type":"url","url":"u"}}]}]}]}`, "messages.0.content"},
		{"block member", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"text","text":"a","colour":"red"}]}]}`, "messages.0.content"},
		{"stream in count_tokens", `{` + ok + `,"stream":true}`, "stream"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, oerr := Decode([]byte(c.body), c.name == "stream in count_tokens")
			if oerr == nil || oerr.Status != http.StatusBadRequest || oerr.Param != c.param {
				t.Fatalf("Decode: %v (param %q), want a 400 naming %q", oerr, paramOf(oerr), c.param)
			}
		})
	}
	if _, oerr := Decode([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`), true); oerr != nil {
		t.Errorf("count_tokens without max_tokens: %v", oerr)
	}
}

func paramOf(e *openai.Error) string {
	if e == nil {
		return ""
	}
	return e.Param
}

func TestFromChatMapsTheFinish(t *testing.T) {
	const usage = `"usage":{"prompt_tokens":100,"completion_tokens":7,"total_tokens":107,"prompt_tokens_details":{"cached_tokens":64}}`
	for _, c := range []struct{ name, chat, want string }{
		{"end turn", `{"id":"chatcmpl-abc","model":"m","choices":[{"message":{"role":"assistant","content":"Hello there"},"finish_reason":"stop"}],` + usage + `}`,
			`{"id":"msg_abc","type":"message","role":"assistant","model":"m","content":[{"type":"text","text":"Hello there"}],"stop_reason":"end_turn","stop_sequence":null,` +
				`"usage":{"input_tokens":36,"output_tokens":7,"cache_read_input_tokens":64}}`},
		{"stop sequence", `{"id":"chatcmpl-abc","model":"m","choices":[{"message":{"content":"Hello END"},"finish_reason":"stop"}]}`,
			`{"id":"msg_abc","type":"message","role":"assistant","model":"m","content":[{"type":"text","text":"Hello"}],"stop_reason":"stop_sequence","stop_sequence":" END",` +
				`"usage":{"input_tokens":0,"output_tokens":0}}`},
		{"max tokens keeps a stop sequence's text", `{"id":"x","model":"m","choices":[{"message":{"content":"Hello END"},"finish_reason":"length"}]}`,
			`{"id":"msg_x","type":"message","role":"assistant","model":"m","content":[{"type":"text","text":"Hello END"}],"stop_reason":"max_tokens","stop_sequence":null,` +
				`"usage":{"input_tokens":0,"output_tokens":0}}`},
		{"tool use", `{"id":"x","model":"m","choices":[{"message":{"content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"w","arguments":"{\"city\":\"Paris\"}"}}]},"finish_reason":"tool_calls"}]}`,
			`{"id":"msg_x","type":"message","role":"assistant","model":"m","content":[{"type":"tool_use","id":"call_1","name":"w","input":{"city":"Paris"}}],"stop_reason":"tool_use","stop_sequence":null,` +
				`"usage":{"input_tokens":0,"output_tokens":0}}`},
		{"empty", `{"id":"x","model":"m","choices":[{"message":{"content":""},"finish_reason":"content_filter"}]}`,
			`{"id":"msg_x","type":"message","role":"assistant","model":"m","content":[{"type":"text","text":""}],"stop_reason":"refusal","stop_sequence":null,` +
				`"usage":{"input_tokens":0,"output_tokens":0}}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, err := FromChat([]byte(c.chat), []string{"never", " END"})
			if err != nil {
				t.Fatal(err)
			}
			b, _ := json.Marshal(r)
			if got, want := canon(t, string(b)), canon(t, c.want); got != want {
				t.Errorf("\n got %s\nwant %s", got, want)
			}
		})
	}
}

func TestErrorOfMapsStatuses(t *testing.T) {
	for _, c := range []struct {
		status int
		code   string
		want   int
		typ    string
	}{
		{400, "invalid_parameter", 400, ErrInvalidRequest},
		{401, "invalid_api_key", 401, ErrAuthentication},
		{403, "", 403, ErrPermission},
		{404, "model_not_found", 404, ErrNotFound},
		{405, "method_not_allowed", 405, ErrInvalidRequest},
		{413, "body_too_large", 413, ErrTooLarge},
		{429, "rate_limited", 429, ErrRateLimit},
		{429, "queue_full", 529, ErrOverloaded},
		{429, "slo_unattainable", 529, ErrOverloaded},
		{503, "no_capacity", 529, ErrOverloaded},
		{503, "draining", 529, ErrOverloaded},
		{502, "engine_error", 500, ErrAPI},
		{504, "engine_timeout", 504, ErrTimeout},
	} {
		if st, typ := ErrorOf(c.status, c.code); st != c.want || typ != c.typ {
			t.Errorf("ErrorOf(%d, %s) = %d %s, want %d %s", c.status, c.code, st, typ, c.want, c.typ)
		}
	}
}

// TestWriterTranslatesAnErrorAndKeepsItsHeaders pins that a refusal keeps Retry-After and
// X-Kvmesh-Reason and gets the Messages error body.
func TestWriterTranslatesAnErrorAndKeepsItsHeaders(t *testing.T) {
	rec := httptest.NewRecorder()
	rw := NewResponseWriter(rec)
	rw.Header().Set("Retry-After", "2")
	openai.WriteError(rw, openai.ErrQueueFull("the waiting room is full"))
	if rec.Body.Len() != 0 {
		t.Fatalf("an error went out before Finish: %s", rec.Body)
	}
	rw.Finish()
	if rec.Code != 529 || rec.Header().Get("Retry-After") != "2" ||
		canon(t, rec.Body.String()) != canon(t, `{"type":"error","error":{"type":"overloaded_error","message":"the waiting room is full"}}`) {
		t.Fatalf("%d %v %s", rec.Code, rec.Header(), rec.Body)
	}
}

// chatStream is a chat stream as kvmesh writes it: the role chunk, text, the finish, usage.
const chatStream = `data: {"id":"chatcmpl-r1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}],"usage":null}

data: {"id":"chatcmpl-r1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"Hé llo"},"finish_reason":null}],"usage":null}

data: {"id":"chatcmpl-r1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":" wor"},"finish_reason":null}],"usage":null}

data: {"id":"chatcmpl-r1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"ld STOP"},"finish_reason":"stop"}],"usage":null}

data: {"id":"chatcmpl-r1","object":"chat.completion.chunk","model":"m","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":4,"total_tokens":14,"prompt_tokens_details":{"cached_tokens":0}}}

data: [DONE]

`

// TestStreamTranslatesEventByEvent pins the Messages events of a chat stream written in
// pieces that split events, lines and a multi-byte character, with a stop sequence that
// arrives across two deltas and is held back from the client.
func TestStreamTranslatesEventByEvent(t *testing.T) {
	rec := httptest.NewRecorder()
	rw := NewResponseWriter(rec)
	rw.SetStopSequences([]string{" STOP"})
	rw.Header().Set("Content-Type", "text/event-stream")
	b := []byte(chatStream)
	for len(b) > 0 {
		n := min(len(b), 37)
		if _, err := rw.Write(b[:n]); err != nil {
			t.Fatal(err)
		}
		b = b[n:]
	}
	rw.Finish()
	want := []string{
		`message_start {"type":"message_start","message":{"id":"msg_r1","type":"message","role":"assistant","model":"m","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":0,"output_tokens":0}}}`,
		`content_block_start {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
		`ping {"type":"ping"}`,
		`content_block_delta {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"H"}}`,
		`content_block_delta {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"é ll"}}`,
		`content_block_delta {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"o world"}}`,
		`content_block_stop {"type":"content_block_stop","index":0}`,
		`message_delta {"type":"message_delta","delta":{"stop_reason":"stop_sequence","stop_sequence":" STOP"},"usage":{"input_tokens":10,"output_tokens":4,"cache_read_input_tokens":0}}`,
		`message_stop {"type":"message_stop"}`,
	}
	for i, w := range want {
		name, data, _ := strings.Cut(w, " ")
		want[i] = name + " " + canon(t, data)
	}
	got := events(t, rec.Body.String())
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("events\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// events reads "event data" pairs, data canonical.
func events(t *testing.T, body string) []string {
	t.Helper()
	var out []string
	for ev := range strings.SplitSeq(strings.TrimSpace(body), "\n\n") {
		name, data, ok := strings.Cut(ev, "\ndata: ")
		name, ok2 := strings.CutPrefix(name, "event: ")
		if !ok || !ok2 {
			t.Fatalf("malformed event %q", ev)
		}
		out = append(out, name+" "+canon(t, data))
	}
	return out
}

// TestStreamToolCallsAndErrors pins a tool call's block (input_json_delta) and an error event
// that ends a stream.
func TestStreamToolCallsAndErrors(t *testing.T) {
	var got []string
	s := newStreamer(func(ev string, v any) error {
		b, _ := json.Marshal(v)
		got = append(got, ev+" "+canon(t, string(b)))
		return nil
	}, nil)
	for _, d := range []string{
		`{"id":"chatcmpl-r2","model":"m","choices":[{"delta":{"content":"Checking."}}]}`,
		`{"id":"chatcmpl-r2","model":"m","choices":[{"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"w","arguments":""}}]}}]}`,
		`{"id":"chatcmpl-r2","model":"m","choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":"}}]}}]}`,
		`{"id":"chatcmpl-r2","model":"m","choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"Paris\"}"}}]},"finish_reason":"tool_calls"}]}`,
		`[DONE]`,
	} {
		if err := s.data([]byte(d)); err != nil {
			t.Fatal(err)
		}
	}
	for i, w := range map[int]string{
		1: `content_block_start {"content_block":{"text":"","type":"text"},"index":0,"type":"content_block_start"}`,
		4: `content_block_stop {"index":0,"type":"content_block_stop"}`,
		5: `content_block_start {"content_block":{"id":"call_1","input":{},"name":"w","type":"tool_use"},"index":1,"type":"content_block_start"}`,
		6: `content_block_delta {"delta":{"partial_json":"{\"city\":","type":"input_json_delta"},"index":1,"type":"content_block_delta"}`,
		9: `message_delta {"delta":{"stop_reason":"tool_use","stop_sequence":null},"type":"message_delta","usage":{"input_tokens":0,"output_tokens":0}}`,
	} {
		if i >= len(got) || got[i] != w {
			t.Errorf("event %d: got %q, want %q (all: %q)", i, at(got, i), w, got)
		}
	}

	got = nil
	s = newStreamer(func(ev string, v any) error {
		b, _ := json.Marshal(v)
		got = append(got, ev+" "+canon(t, string(b)))
		return nil
	}, nil)
	_ = s.data([]byte(`{"id":"x","model":"m","choices":[{"delta":{"content":"a"}}]}`))
	_ = s.data([]byte(`{"error":{"message":"generation failed mid-stream","type":"server_error","param":null,"code":"engine_error"}}`))
	_ = s.data([]byte(`[DONE]`))
	if last := got[len(got)-1]; last != `error {"error":{"message":"generation failed mid-stream","type":"api_error"},"type":"error"}` {
		t.Errorf("the stream ends with %q, want the error event", last)
	}
}

func at(s []string, i int) string {
	if i < len(s) {
		return s[i]
	}
	return ""
}
