package openai

import (
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

func TestDecodeChat(t *testing.T) {
	tests := []struct {
		name   string
		body   string
		limit  int64
		status int
		code   string
		param  string
		check  func(t *testing.T, r *ChatRequest)
	}{
		{name: "minimal", body: `{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
			check: func(t *testing.T, r *ChatRequest) {
				if r.Model != "m" || r.Messages[0].Content.Text != "hi" || r.MaxTokens != nil || r.Stream {
					t.Errorf("got %+v", r)
				}
			}},
		{name: "parts flattened", body: `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}`,
			check: func(t *testing.T, r *ChatRequest) {
				if got := r.Messages[0].Text(); got != "ab" {
					t.Errorf("content = %q, want ab", got)
				}
			}},
		{name: "full sdk body", body: `{"model":"m","messages":[{"role":"system","content":"s"},{"role":"assistant","content":null,"tool_calls":[{"id":"x"}]},{"role":"tool","content":"r","tool_call_id":"x"}],
			"max_tokens":5,"max_completion_tokens":6,"stream":true,"stream_options":{"include_usage":true},"stop":"\n","temperature":0.5,"top_p":1,"n":1,"seed":7,
			"user":"u","presence_penalty":0,"frequency_penalty":0,"logprobs":false,"top_logprobs":0,"logit_bias":{"50256":-100},"response_format":{"type":"text"},
			"tools":[],"tool_choice":"auto","parallel_tool_calls":true,"metadata":{"k":"v"},"store":false,"service_tier":"auto","reasoning_effort":"low",
			"modalities":["text"],"prompt_cache_key":"p","safety_identifier":"s","verbosity":"low"}`,
			check: func(t *testing.T, r *ChatRequest) {
				if *r.MaxTokens != 5 || *r.MaxCompletionTokens != 6 || !r.StreamOptions.IncludeUsage ||
					!reflect.DeepEqual(r.Stop, Stop{"\n"}) || *r.Seed != 7 || !r.Messages[1].Content.Null ||
					r.LogitBias["50256"] != -100 || string(r.ToolChoice) != `"auto"` {
					t.Errorf("got %+v", r)
				}
			}},
		{name: "stop array", body: `{"model":"m","messages":[{"role":"user","content":"x"}],"stop":["a","b"]}`,
			check: func(t *testing.T, r *ChatRequest) {
				if !reflect.DeepEqual(r.Stop, Stop{"a", "b"}) {
					t.Errorf("stop = %v", r.Stop)
				}
			}},
		{name: "unknown field", body: `{"model":"m","messages":[{"role":"user","content":"x"}],"bogus":1}`,
			status: 400, code: CodeInvalidParameter, param: "bogus"},
		{name: "wrong type", body: `{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":"5"}`,
			status: 400, code: CodeInvalidParameter, param: "max_tokens"},
		{name: "wrong nested type", body: `{"model":"m","messages":[{"role":5,"content":"x"}]}`,
			status: 400, code: CodeInvalidParameter, param: "messages.role"},
		{name: "image part", body: `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`,
			status: 400, code: CodeInvalidParameter, param: "messages.content"},
		{name: "bad stop", body: `{"model":"m","messages":[{"role":"user","content":"x"}],"stop":5}`,
			status: 400, code: CodeInvalidParameter, param: "stop"},
		{name: "trailing data", body: `{"model":"m","messages":[{"role":"user","content":"x"}]} {}`, status: 400, code: CodeInvalidRequest},
		{name: "empty", body: "  \n", status: 400, code: CodeInvalidRequest},
		{name: "array body", body: `[1]`, status: 400, code: CodeInvalidRequest},
		{name: "syntax", body: `{"model":`, status: 400, code: CodeInvalidRequest},
		{name: "no model", body: `{"messages":[{"role":"user","content":"x"}]}`, status: 400, code: CodeInvalidParameter, param: "model"},
		{name: "no messages", body: `{"model":"m","messages":[]}`, status: 400, code: CodeInvalidParameter, param: "messages"},
		{name: "no role", body: `{"model":"m","messages":[{"content":"x"}]}`, status: 400, code: CodeInvalidParameter, param: "messages[0].role"},
		{name: "too large", body: `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 100) + `"}]}`, limit: 64,
			status: 413, code: CodeBodyTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			limit := tt.limit
			if limit == 0 {
				limit = 1 << 20
			}
			r, err := DecodeChat(strings.NewReader(tt.body), limit)
			if tt.status == 0 {
				if err != nil {
					t.Fatalf("DecodeChat: %v", err)
				}
				tt.check(t, r)
				return
			}
			assertAPIError(t, err, tt.status, tt.code, tt.param)
		})
	}
}

func TestDecodeCompletion(t *testing.T) {
	tests := []struct {
		name   string
		body   string
		status int
		code   string
		param  string
		want   string
	}{
		{name: "string prompt", body: `{"model":"m","prompt":"hello","max_tokens":3,"echo":false,"logprobs":2,"suffix":"s","best_of":1}`, want: "hello"},
		{name: "array prompt", body: `{"model":"m","prompt":["hello"]}`, want: "hello"},
		{name: "empty string prompt is present", body: `{"model":"m","prompt":""}`, want: ""},
		{name: "batch prompt", body: `{"model":"m","prompt":["a","b"]}`, status: 400, code: CodeInvalidParameter, param: "prompt"},
		{name: "token prompt", body: `{"model":"m","prompt":[1,2]}`, status: 400, code: CodeInvalidParameter, param: "prompt"},
		{name: "missing prompt", body: `{"model":"m"}`, status: 400, code: CodeInvalidParameter, param: "prompt"},
		{name: "messages is unknown here", body: `{"model":"m","prompt":"x","messages":[]}`, status: 400, code: CodeInvalidParameter, param: "messages"},
		{name: "bad echo", body: `{"model":"m","prompt":"x","echo":"yes"}`, status: 400, code: CodeInvalidParameter, param: "echo"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := DecodeCompletion(strings.NewReader(tt.body), 1<<20)
			if tt.status == 0 {
				if err != nil {
					t.Fatalf("DecodeCompletion: %v", err)
				}
				if r.PromptText() != tt.want {
					t.Errorf("prompt = %q, want %q", r.PromptText(), tt.want)
				}
				return
			}
			assertAPIError(t, err, tt.status, tt.code, tt.param)
		})
	}
}

func assertAPIError(t *testing.T, err error, status int, code, param string) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("err = %v (%T), want *Error", err, err)
	}
	if e.Status != status || e.Code != code || e.Param != param {
		t.Errorf("got status %d code %q param %q (%s), want %d %q %q", e.Status, e.Code, e.Param, e.Message, status, code, param)
	}
	if param != "" && !strings.Contains(e.Message, strings.TrimSuffix(strings.Split(param, "[")[0], ".role")) {
		t.Errorf("message %q does not name %q", e.Message, param)
	}
}

func TestWriteError(t *testing.T) {
	tests := []struct {
		err      *Error
		typ      string
		param    any
		wantCode int
	}{
		{ErrInvalidParameter("n", "bad n"), TypeInvalidRequest, "n", 400},
		{ErrBodyTooLarge("big"), TypeInvalidRequest, nil, 413},
		{ErrModelNotFound("x"), TypeInvalidRequest, "model", 404},
		{ErrInvalidAPIKey("no"), TypeAuthentication, nil, 401},
		{ErrRateLimited("slow"), TypeRateLimit, nil, 429},
		{ErrQueueFull("full"), TypeRateLimit, nil, 429},
		{ErrNoCapacity("none"), TypeServer, nil, 503},
		{ErrEngine("boom"), TypeServer, nil, 502},
		{ErrEngineTimeout("late"), TypeServer, nil, 504},
		{ErrContextLengthExceeded("long"), TypeInvalidRequest, "messages", 400},
	}
	for _, tt := range tests {
		t.Run(tt.err.Code, func(t *testing.T) {
			rec := newRecorder()
			WriteError(rec, tt.err)
			if rec.code != tt.wantCode || rec.h.Get("Content-Type") != "application/json" {
				t.Fatalf("status %d ct %q", rec.code, rec.h.Get("Content-Type"))
			}
			var body struct {
				Error map[string]any `json:"error"`
			}
			if err := json.Unmarshal(rec.buf.Bytes(), &body); err != nil {
				t.Fatal(err)
			}
			p, ok := body.Error["param"]
			if !ok || p != tt.param || body.Error["type"] != tt.typ || body.Error["code"] != tt.err.Code || body.Error["message"] != tt.err.Message {
				t.Errorf("body %s", rec.buf.String())
			}
		})
	}
	if got := NewError(http.StatusForbidden, "x", "y").Type; got != TypePermission {
		t.Errorf("403 type = %q", got)
	}
}
