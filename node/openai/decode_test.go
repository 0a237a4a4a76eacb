package openai

import (
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"slices"
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
					!reflect.DeepEqual(r.Stop, Stop{"\n"}) || *r.Seed != 7 || !r.Messages[1].Content.Null {
					t.Errorf("got %+v", r)
				}
				if got := extraNames(r.Extra); got != "presence_penalty frequency_penalty logit_bias response_format tools tool_choice parallel_tool_calls "+
					"metadata store service_tier reasoning_effort modalities prompt_cache_key safety_identifier verbosity" {
					t.Errorf("extra members %q", got)
				}
				if string(r.Extra[2].Value) != `{"50256":-100}` || string(r.Extra[5].Value) != `"auto"` {
					t.Errorf("extra values %s %s", r.Extra[2].Value, r.Extra[5].Value)
				}
			}},
		{name: "stop array", body: `{"model":"m","messages":[{"role":"user","content":"x"}],"stop":["a","b"]}`,
			check: func(t *testing.T, r *ChatRequest) {
				if !reflect.DeepEqual(r.Stop, Stop{"a", "b"}) {
					t.Errorf("stop = %v", r.Stop)
				}
			}},
		{name: "unknown field passes, value as sent", body: `{"model":"m","messages":[{"role":"user","content":"x"}],"bogus": [1, {"a" : 2}] }`,
			check: func(t *testing.T, r *ChatRequest) {
				if len(r.Extra) != 1 || r.Extra[0].Name != "bogus" || string(r.Extra[0].Value) != `[1, {"a" : 2}]` {
					t.Errorf("extra %+v", r.Extra)
				}
			}},
		{name: "unknown message fields and roles pass", body: `{"model":"m","messages":[{"role":"user","content":"q","name":5},
			{"role":"assistant","content":"a","reasoning_content":"because"},{"role":"critic","content":"c"}]}`,
			check: func(t *testing.T, r *ChatRequest) {
				if len(r.Messages) != 3 || r.Messages[1].Text() != "a" || r.Messages[2].Role != "critic" {
					t.Errorf("messages %+v", r.Messages)
				}
			}},
		{name: "stream options keep their other members", body: `{"model":"m","messages":[{"role":"user","content":"x"}],"stream":true,
			"stream_options":{"include_usage":true,"continuous_usage_stats":true,"include_obfuscation":false}}`,
			check: func(t *testing.T, r *ChatRequest) {
				o := r.StreamOptions
				if !o.IncludeUsage || extraNames(o.Extra) != "continuous_usage_stats include_obfuscation" || string(o.Extra[0].Value) != "true" {
					t.Errorf("stream_options %+v", o)
				}
			}},
		{name: "names are case-sensitive", body: `{"Model":"m","model":"n","messages":[{"role":"user","content":"x"}]}`,
			check: func(t *testing.T, r *ChatRequest) {
				if r.Model != "n" || extraNames(r.Extra) != "Model" {
					t.Errorf("model %q extra %+v", r.Model, r.Extra)
				}
			}},
		{name: "logprobs", body: `{"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":3}`,
			check: func(t *testing.T, r *ChatRequest) {
				if !*r.Logprobs || *r.TopLogprobs != 3 || len(r.Extra) != 0 {
					t.Errorf("got %+v", r)
				}
			}},
		{name: "wrong type", body: `{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":"5"}`,
			status: 400, code: CodeInvalidParameter, param: "max_tokens"},
		{name: "top_logprobs without logprobs", body: `{"model":"m","messages":[{"role":"user","content":"x"}],"top_logprobs":2}`,
			status: 400, code: CodeInvalidParameter, param: "top_logprobs"},
		{name: "wrong type in stream_options", body: `{"model":"m","messages":[{"role":"user","content":"x"}],"stream_options":{"x":1,"include_usage":"yes"}}`,
			status: 400, code: CodeInvalidParameter, param: "stream_options.include_usage"},
		{name: "stream_options not an object", body: `{"model":"m","messages":[{"role":"user","content":"x"}],"stream_options":[true]}`,
			status: 400, code: CodeInvalidParameter, param: "stream_options"},
		{name: "wrong nested type", body: `{"model":"m","messages":[{"role":"user","content":"x"},{"role":5,"content":"x"}]}`,
			status: 400, code: CodeInvalidParameter, param: "messages[1].role"},
		{name: "message not an object", body: `{"model":"m","messages":[{"role":"user","content":"x"},"hi"]}`,
			status: 400, code: CodeInvalidParameter, param: "messages[1]"},
		{name: "message names are exact", body: `{"model":"m","messages":[{"Role":"user","role":"user","content":"x","Content":5}]}`,
			check: func(t *testing.T, r *ChatRequest) {
				if r.Messages[0].Role != "user" || r.Messages[0].Text() != "x" {
					t.Errorf("message %+v", r.Messages[0])
				}
			}},
		{name: "non-text parts kept as sent", body: `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},` +
			`{"type":"image_url", "image_url":{"url":"x"}},{"type":"text","text":"b"},{"type":"input_audio","input_audio":{"data":"d","format":"wav"}}]}]}`,
			check: func(t *testing.T, r *ChatRequest) {
				c := r.Messages[0].Content
				if c.Text != "ab" || len(c.Parts) != 2 || string(c.Parts[0]) != `{"type":"image_url", "image_url":{"url":"x"}}` ||
					PartType(c.Parts[1]) != "input_audio" {
					t.Errorf("content %+v", c)
				}
			}},
		{name: "images and audio with their places", body: `{"model":"m","messages":[{"role":"user","content":[` +
			`{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA","detail":"low"}},{"type":"text","text":"abc"},` +
			`{"type":"file","file":{"file_id":"f"}},{"type":"input_audio","input_audio":{"data":"UklG","format":"wav"}},{"type":"text","text":"de"}]}]}`,
			check: func(t *testing.T, r *ChatRequest) {
				c := r.Messages[0].Content
				want := []Media{
					{At: 0, Type: PartImage, Source: "data:image/png;base64,AAAA", Detail: "low"},
					{At: 3, Type: PartAudio, Source: "UklG", Format: "wav"},
				}
				if c.Text != "abcde" || len(c.Parts) != 3 || !slices.Equal(c.Media, want) {
					t.Errorf("content %+v, want media %+v", c, want)
				}
			}},
		{name: "image without a url", body: `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"detail":"low"}}]}]}`,
			status: 400, code: CodeInvalidParameter, param: "messages[0].content[1].image_url"},
		{name: "image url not a string", body: `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":5}}]}]}`,
			status: 400, code: CodeInvalidParameter, param: "messages[0].content[0].image_url"},
		{name: "image_url a string", body: `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":"https://x"}]}]}`,
			status: 400, code: CodeInvalidParameter, param: "messages[0].content[0].image_url"},
		{name: "audio without data", body: `{"model":"m","messages":[{"role":"user","content":"x"},{"role":"user","content":[{"type":"input_audio","input_audio":{"format":"wav"}}]}]}`,
			status: 400, code: CodeInvalidParameter, param: "messages[1].content[0].input_audio"},
		{name: "part without a type", body: `{"model":"m","messages":[{"role":"user","content":[{"image_url":{"url":"x"}}]}]}`,
			status: 400, code: CodeInvalidParameter, param: "messages[0].content"},
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
		{name: "string prompt", body: `{"model":"m","prompt":"hello","max_tokens":3,"echo":false,"logprobs":2}`, want: "hello"},
		{name: "array prompt", body: `{"model":"m","prompt":["hello"]}`, want: "hello"},
		{name: "empty string prompt is present", body: `{"model":"m","prompt":""}`, want: ""},
		{name: "batch prompt", body: `{"model":"m","prompt":["a","b"]}`, status: 400, code: CodeInvalidParameter, param: "prompt", want: "batch"},
		{name: "token prompt", body: `{"model":"m","prompt":[1,2]}`, status: 400, code: CodeInvalidParameter, param: "prompt", want: "token ids"},
		{name: "token batch", body: `{"model":"m","prompt":[[1,2]]}`, status: 400, code: CodeInvalidParameter, param: "prompt", want: "token ids"},
		{name: "empty array prompt", body: `{"model":"m","prompt":[]}`, status: 400, code: CodeInvalidParameter, param: "prompt", want: "array of one string"},
		{name: "missing prompt", body: `{"model":"m"}`, status: 400, code: CodeInvalidParameter, param: "prompt"},
		{name: "unread fields pass", body: `{"model":"m","prompt":"x","suffix":"s","best_of":1,"top_k":4,"messages":[]}`, want: "x"},
		{name: "bad echo", body: `{"model":"m","prompt":"x","echo":"yes"}`, status: 400, code: CodeInvalidParameter, param: "echo"},
		{name: "bad logprobs", body: `{"model":"m","prompt":"x","logprobs":true}`, status: 400, code: CodeInvalidParameter, param: "logprobs"},
		{name: "null prompt", body: `{"model":"m","prompt":null}`, status: 400, code: CodeInvalidParameter, param: "prompt"},
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
			if !strings.Contains(err.Message, tt.want) {
				t.Errorf("message %q does not say %q", err.Message, tt.want)
			}
		})
	}
}

func extraNames(f Fields) string {
	names := make([]string, len(f))
	for i, m := range f {
		names[i] = m.Name
	}
	return strings.Join(names, " ")
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

// vLLMFields are request fields vLLM's OpenAI server takes beyond OpenAI's own, with a value
// each: kvmesh reads none of them, so they must pass.
var vLLMFields = map[string]string{
	"top_k":                      `40`,
	"min_p":                      `0.05`,
	"repetition_penalty":         `1.1`,
	"min_tokens":                 `4`,
	"ignore_eos":                 `true`,
	"chat_template_kwargs":       `{"enable_thinking": false}`,
	"guided_json":                `{"type":"object","properties":{"a":{"type":"string"}}}`,
	"skip_special_tokens":        `false`,
	"stop_token_ids":             `[128009]`,
	"include_stop_str_in_output": `true`,
	"structured_outputs":         `{"choice":["a","b"]}`,
	"priority":                   `-1`,
	"guided_decoding_backend":    `null`,
}

func TestDecodeAcceptsVLLMFields(t *testing.T) {
	for name, value := range vLLMFields {
		t.Run(name, func(t *testing.T) {
			chat := `{"model":"m","messages":[{"role":"user","content":"x"},{"role":"assistant","content":"y","reasoning_content":"z"}],"` +
				name + `":` + value + `}`
			r, err := DecodeChat(strings.NewReader(chat), 1<<20)
			if err != nil {
				t.Fatalf("chat: %v", err)
			}
			if len(r.Extra) != 1 || r.Extra[0].Name != name || string(r.Extra[0].Value) != value {
				t.Errorf("chat extra %+v, want %s: %s as sent", r.Extra, name, value)
			}
			cr, err := DecodeCompletion(strings.NewReader(`{"model":"m","prompt":"p","`+name+`":`+value+`}`), 1<<20)
			if err != nil {
				t.Fatalf("completion: %v", err)
			}
			if len(cr.Extra) != 1 || cr.Extra[0].Name != name || string(cr.Extra[0].Value) != value {
				t.Errorf("completion extra %+v", cr.Extra)
			}
		})
	}
}

// TestDecodeStillChecksTheFieldsKvmeshReads: passing unknown fields through does not loosen
// the types of the fields kvmesh acts on, even beside vLLM's.
func TestDecodeStillChecksTheFieldsKvmeshReads(t *testing.T) {
	tests := []struct{ field, value, param string }{
		{"model", `5`, "model"},
		{"messages", `{"role":"user"}`, "messages"},
		{"messages", `[{"role":["user"],"content":"x"}]`, "messages[0].role"},
		{"messages", `[{"role":"user","content":5}]`, "messages[0].content"},
		{"max_tokens", `"5"`, "max_tokens"},
		{"max_tokens", `1.5`, "max_tokens"},
		{"max_completion_tokens", `true`, "max_completion_tokens"},
		{"stream", `"yes"`, "stream"},
		{"stream_options", `{"include_usage":1}`, "stream_options.include_usage"},
		{"stop", `5`, "stop"},
		{"n", `"1"`, "n"},
		{"temperature", `"hot"`, "temperature"},
		{"top_p", `[]`, "top_p"},
		{"seed", `1.5`, "seed"},
		{"user", `5`, "user"},
		{"logprobs", `"yes"`, "logprobs"},
		{"top_logprobs", `"2"`, "top_logprobs"},
	}
	for _, tt := range tests {
		t.Run(tt.field+"="+tt.value, func(t *testing.T) {
			body := `{"model":"m","messages":[{"role":"user","content":"x"}],"top_k":40,"guided_json":{},"` + tt.field + `":` + tt.value + `}`
			_, err := DecodeChat(strings.NewReader(body), 1<<20)
			assertAPIError(t, err, 400, CodeInvalidParameter, tt.param)
		})
	}
}

// TestDecodeTakesIntegralNumbers: an integer field takes a number with a zero fraction, as
// vLLM does (3.0, 1e2), and refuses a fraction or a number out of range with a message that
// says which; a float field out of range says so too.
func TestDecodeTakesIntegralNumbers(t *testing.T) {
	const base = `{"model":"m","messages":[{"role":"user","content":"x"}],`
	r, err := DecodeChat(strings.NewReader(base+`"max_tokens":3.0,"max_completion_tokens":1e2,"n":1.00,"seed":-2.0,"logprobs":true,"top_logprobs":2E0}`), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if *r.MaxTokens != 3 || *r.MaxCompletionTokens != 100 || *r.N != 1 || *r.Seed != -2 || *r.TopLogprobs != 2 {
		t.Errorf("got max_tokens %d max_completion_tokens %d n %d seed %d top_logprobs %d",
			*r.MaxTokens, *r.MaxCompletionTokens, *r.N, *r.Seed, *r.TopLogprobs)
	}
	if cr, err := DecodeCompletion(strings.NewReader(`{"model":"m","prompt":"p","logprobs":5.0,"max_tokens":null}`), 1<<20); err != nil ||
		*cr.Logprobs != 5 || cr.MaxTokens != nil {
		t.Errorf("completion: %+v %v", cr, err)
	}
	if er, err := DecodeEmbeddings(strings.NewReader(`{"model":"m","input":"x","dimensions":64.0}`), 1<<20); err != nil || *er.Dimensions != 64 {
		t.Errorf("embeddings: %+v %v", er, err)
	}
	tests := []struct{ field, value, say string }{
		{"max_tokens", `3.5`, `must be an integer, not 3.5`},
		{"n", `1.000001`, `must be an integer`},
		{"max_tokens", `1e400`, `out of range: 1e400`},
		{"seed", `1e19`, `out of range`},
		{"max_tokens", `99999999999999999999`, `out of range`},
		{"temperature", `1e400`, `"temperature" is out of range: 1e400`},
		{"top_p", `-1e309`, `out of range`},
		{"max_tokens", `"3"`, `must be of type integer, not string`},
		{"n", `true`, `must be of type integer, not bool`},
	}
	for _, tt := range tests {
		t.Run(tt.field+"="+tt.value, func(t *testing.T) {
			_, err := DecodeChat(strings.NewReader(base+`"`+tt.field+`":`+tt.value+`}`), 1<<20)
			if err == nil {
				t.Fatal("accepted")
			}
			assertAPIError(t, err, 400, CodeInvalidParameter, tt.field)
			if !strings.Contains(err.Message, tt.say) {
				t.Errorf("message %q does not say %q", err.Message, tt.say)
			}
		})
	}
}

// TestRequestMarshalKeepsExtra: a decoded request encodes back with its unread members, in
// order, values as sent, after the members kvmesh reads (shared ones first).
func TestRequestMarshalKeepsExtra(t *testing.T) {
	body := `{"model":"m","messages":[{"role":"user","content":"x"}],"top_k":40,"stream_options":{"include_usage":true,"continuous_usage_stats":true},"guided_json":{"type":"object"}}`
	r, err := DecodeChat(strings.NewReader(body), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	b, jerr := json.Marshal(r)
	if jerr != nil {
		t.Fatal(jerr)
	}
	want := `{"model":"m","stream_options":{"include_usage":true,"continuous_usage_stats":true},"messages":[{"role":"user","content":"x"}],"top_k":40,"guided_json":{"type":"object"}}`
	if string(b) != want {
		t.Errorf("got  %s\nwant %s", b, want)
	}
}
