package node_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/node/openai"
)

// recordingEngine is an external OpenAI-compatible engine that records every generation body it is
// sent, and its traceparent and tracestate headers, and answers each with one scored token. Its
// /metrics are an idle vLLM's.
type recordingEngine struct {
	url    string
	bodies chan []byte
	traces chan [2]string // traceparent, tracestate
}

func startRecordingEngine(t *testing.T) *recordingEngine {
	t.Helper()
	f := &recordingEngine{bodies: make(chan []byte, 64), traces: make(chan [2]string, 64)}
	gen := func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		select {
		case f.bodies <- b:
		default:
			t.Errorf("fake engine: body not collected")
		}
		select { // tests that do not read them leave them
		case f.traces <- [2]string{r.Header.Get("traceparent"), r.Header.Get("tracestate")}:
		default:
		}
		w.Header().Set("Content-Type", "text/event-stream")
		events := []string{
			`{"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`,
			`{"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"ok"},"logprobs":{"content":[` +
				`{"token":"ok","logprob":-0.5,"bytes":[111,107],"top_logprobs":[{"token":"ok","logprob":-0.5,"bytes":[111,107]},{"token":"no","logprob":-1.25,"bytes":[110,111]}]}]},"finish_reason":"stop"}]}`,
		}
		if r.URL.Path == "/v1/completions" {
			events = []string{`{"id":"x","object":"text_completion","choices":[{"index":0,"text":"ok","logprobs":{"tokens":["ok"],` +
				`"token_logprobs":[-0.5],"top_logprobs":[{"ok":-0.5,"no":-1.25}],"text_offset":[0]},"finish_reason":"stop"}]}`}
		}
		events = append(events, `{"id":"x","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10}}`, "[DONE]")
		for _, e := range events {
			fmt.Fprintf(w, "data: %s\n\n", e)
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, `{"object":"list","data":[{"id":%q,"object":"model","max_model_len":131072}]}`, model)
	})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) { // for --engine-kind vllm
		io.WriteString(w, "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0\n")
	})
	mux.HandleFunc("POST /v1/chat/completions", gen)
	mux.HandleFunc("POST /v1/completions", gen)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	f.url = srv.URL
	return f
}

// vLLMChat is a chat body full of what a vLLM client sends, with a role OpenAI's API does not
// have and an assistant turn carrying vLLM's reasoning_content; STREAM is replaced.
const vLLMChat = `{"model":"` + model + `", "messages":[{"role":"system","content":"be brief"},` +
	`{"role":"user","content":"hi <there> & \u00e9"},{"role":"assistant","content":"hello","reasoning_content":"greet back"},` +
	`{"role":"critic","content":"too short"},{"role":"user","content":"again"}],` +
	`"max_tokens":8,"top_k":40,"min_p":0.05,"repetition_penalty":1.10,"min_tokens":2,"ignore_eos":true,` +
	`"chat_template_kwargs":{"enable_thinking":false},"guided_json":{"type":"object","properties":{"a":{"type":"string"}}},` +
	`"skip_special_tokens":false,"logprobs":true,"top_logprobs":2,STREAM}`

// TestEngineReceivesVLLMFieldsUnchanged: a node in front of an external engine hands it the
// client's body byte for byte, vLLM's fields, unknown roles and image and audio parts (for a
// vision or audio model) included, whether the client came to that node or to a peer that
// forwarded the request; only stream and stream_options.include_usage are forced. The
// engine's logprobs come back to the client.
func TestEngineReceivesVLLMFieldsUnchanged(t *testing.T) {
	f := startRecordingEngine(t)
	tn := startNet(t, 2, func(i int, cfg *node.Config) {
		if i == 0 {
			cfg.Engine, cfg.EngineKind = f.url, "openai"
			return
		}
		cfg.Models = []string{"another-model"} // the ingress that must forward
	})
	streamed := strings.Replace(vLLMChat, "STREAM", `"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":false}`, 1)
	plain := strings.Replace(vLLMChat, "STREAM", `"stream":false`, 1)
	completion := `{"model":"` + model + `","prompt":"p","max_tokens":3,"top_k":-1,"min_p":0.1,"guided_regex":"[a-z]+","logprobs":1,"echo":false}`
	parts := `{"model":"` + model + `","messages":[{"role":"system","content":"describe"},{"role":"user","content":[` +
		`{"type":"text","text":"what is this?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo=","detail":"low"}},` +
		`{"type":"input_audio","input_audio":{"data":"UklGRg==","format":"wav"}}]}],"max_tokens":4,"stream":true,"stream_options":{"include_usage":true}}`
	tests := []struct {
		name, path, body, want string
		stream                 bool
	}{
		{"streamed chat", "/v1/chat/completions", streamed, streamed, true},
		{"non-streamed chat", "/v1/chat/completions", plain,
			strings.Replace(vLLMChat, "STREAM", `"stream":true,"stream_options":{"include_usage":true}`, 1), false},
		{"image and audio parts", "/v1/chat/completions", parts, parts, true},
		{"completion", "/v1/completions", completion,
			strings.TrimSuffix(completion, "}") + `,"stream":true,"stream_options":{"include_usage":true}}`, false},
	}
	for _, tt := range tests {
		for i, url := range tn.URLs() {
			t.Run(fmt.Sprintf("%s via n%d", tt.name, i+1), func(t *testing.T) {
				resp := post(t, url, tt.path, tt.body, nil)
				body := readAll(t, resp)
				if resp.StatusCode != http.StatusOK || resp.Header.Get(node.HeaderNode) != "n1" {
					t.Fatalf("status %d node %q: %s", resp.StatusCode, resp.Header.Get(node.HeaderNode), body)
				}
				if got := <-f.bodies; string(got) != tt.want {
					t.Errorf("the engine got\n%s\nwant\n%s", got, tt.want)
				}
				if tt.stream {
					body = []byte(strings.Join(sseEvents(t, body), "\n"))
				}
				if !bytes.Contains(body, []byte(`"logprob":-0.5`)) && !bytes.Contains(body, []byte(`"token_logprobs":[-0.5]`)) {
					t.Errorf("the engine's logprobs did not reach the client: %s", body)
				}
			})
		}
	}
}

// TestEmbeddedEngineRunsVLLMSamplingFields: the embedded engine takes vLLM's sampling knobs as
// no-ops and honours what changes the output's length (ignore_eos here).
func TestEmbeddedEngineRunsVLLMSamplingFields(t *testing.T) {
	tn := startNet(t, 1, nil)
	body := `{"model":"` + model + `","messages":[{"role":"user","content":"q"},{"role":"assistant","content":"a","reasoning_content":"r"},` +
		`{"role":"user","content":"q2"}],"max_tokens":12,"top_k":40,"min_p":0.05,"repetition_penalty":1.1,"min_tokens":2,"ignore_eos":true,` +
		`"chat_template_kwargs":{"enable_thinking":false},"skip_special_tokens":false,"stop_token_ids":[128009],"seed":1}`
	resp := post(t, tn.URLs()[0], "/v1/chat/completions", body, nil)
	b := readAll(t, resp)
	var c struct {
		Choices []struct {
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage usage `json:"usage"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &c) != nil {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	if c.Usage.CompletionTokens != 12 || c.Choices[0].FinishReason != "length" {
		t.Errorf("ignore_eos not honoured: %s", b)
	}
}

// TestEmbeddedEngineRefusesWhatItCannotHonour: what the simulator cannot keep, a field it does
// not know and a role it does not know are 400s naming the field, from the node that runs the
// request (its engine is what cannot), relayed as they are by a forwarding ingress.
func TestEmbeddedEngineRefusesWhatItCannotHonour(t *testing.T) {
	tn := startNet(t, 2, func(i int, cfg *node.Config) {
		if i == 1 {
			cfg.Models = []string{"another-model"}
		}
	})
	base := `{"model":"` + model + `","messages":[{"role":"user","content":"x"}],"max_tokens":4`
	tests := []struct {
		name, body, code, param string
	}{
		{"guided_json", base + `,"top_k":5,"guided_json":{"type":"object"}}`, openai.CodeUnsupportedParameter, "guided_json"},
		{"json schema", base + `,"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{}}}}`, openai.CodeUnsupportedParameter, "response_format"},
		{"forced function_call", base + `,"functions":[{"name":"f"}],"function_call":{"name":"f"}}`, openai.CodeUnsupportedParameter, "function_call"},
		{"unknown field", base + `,"frobnicate":true}`, openai.CodeUnsupportedParameter, "frobnicate"},
		{"continuous usage", base + `,"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}}`,
			openai.CodeUnsupportedParameter, "stream_options.continuous_usage_stats"},
		{"unknown role", `{"model":"` + model + `","messages":[{"role":"user","content":"x"},{"role":"critic","content":"y"}]}`,
			openai.CodeUnsupportedParameter, "messages[1].role"},
		{"wrong type of a no-op", base + `,"top_k":"many"}`, openai.CodeInvalidParameter, "top_k"},
		{"malformed tool_choice", base + `,"tool_choice":"bogus"}`, openai.CodeInvalidParameter, "tool_choice"},
		{"malformed response_format", base + `,"response_format":{}}`, openai.CodeInvalidParameter, "response_format"},
		{"video part", `{"model":"` + model + `","messages":[{"role":"user","content":"x"},{"role":"user","content":[` +
			`{"type":"text","text":"y"},{"type":"video_url","video_url":{"url":"http://x/y.mp4"}}]}]}`,
			openai.CodeUnsupportedParameter, "messages[1].content"},
	}
	for _, tt := range tests {
		for i, url := range tn.URLs() {
			t.Run(fmt.Sprintf("%s via n%d", tt.name, i+1), func(t *testing.T) {
				resp := post(t, url, "/v1/chat/completions", tt.body, nil)
				b := readAll(t, resp)
				if resp.StatusCode != http.StatusBadRequest || resp.Header.Get(node.HeaderReason) != tt.code {
					t.Fatalf("status %d reason %q: %s", resp.StatusCode, resp.Header.Get(node.HeaderReason), b)
				}
				e := decodeError(t, b)
				if e.Error.Code != tt.code || e.Error.Param == nil || *e.Error.Param != tt.param || !strings.Contains(e.Error.Message, tt.param) {
					t.Errorf("error %+v, want code %s naming %s", e.Error, tt.code, tt.param)
				}
				if strings.Contains(tt.body, "video_url") && !strings.Contains(e.Error.Message, `"video_url"`) {
					t.Errorf("message %q does not name the part's type", e.Error.Message)
				}
			})
		}
	}
	for i, url := range tn.URLs() {
		if got := metric(t, url, "kvmesh_requests_refused_total", `code="unsupported_parameter"`); got != 7 {
			t.Errorf("n%d counted %v unsupported_parameter refusals, want 7", i+1, got)
		}
	}
}

// chatLogprobs is the shape of a chat choice's logprobs.
type chatLogprobs struct {
	Content []struct {
		Token       string  `json:"token"`
		Logprob     float64 `json:"logprob"`
		Bytes       []int   `json:"bytes"`
		TopLogprobs []struct {
			Token   string  `json:"token"`
			Logprob float64 `json:"logprob"`
			Bytes   []int   `json:"bytes"`
		} `json:"top_logprobs"`
	} `json:"content"`
}

// TestChatLogprobs: the embedded engine's chat logprobs have OpenAI's shape, streamed or not,
// the same for the same seed: one entry per output token spelling the text, each with its
// bytes, a log probability ≤ 0 and top_logprobs entries in descending order that include it.
func TestChatLogprobs(t *testing.T) {
	tn := startNet(t, 1, nil)
	url := tn.URLs()[0]
	req := func(stream bool, top int) string {
		return fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"score me"}],"max_tokens":10,"seed":7,`+
			`"logprobs":true,"top_logprobs":%d,"stream":%v}`, model, top, stream)
	}
	for _, top := range []int{0, 3} {
		resp := post(t, url, "/v1/chat/completions", req(false, top), nil)
		b := readAll(t, resp)
		var c struct {
			Choices []struct {
				Message  struct{ Content string } `json:"message"`
				Logprobs *chatLogprobs            `json:"logprobs"`
			} `json:"choices"`
			Usage usage `json:"usage"`
		}
		if resp.StatusCode != 200 || json.Unmarshal(b, &c) != nil || c.Choices[0].Logprobs == nil {
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
		whole := c.Choices[0].Logprobs
		if len(whole.Content) != c.Usage.CompletionTokens {
			t.Fatalf("%d entries for %d tokens", len(whole.Content), c.Usage.CompletionTokens)
		}
		var text strings.Builder
		for i, e := range whole.Content {
			text.WriteString(e.Token)
			if !(e.Logprob <= 0) || fmt.Sprint(e.Bytes) != fmt.Sprint(openai.TokenBytes(e.Token)) || len(e.TopLogprobs) != top {
				t.Errorf("entry %d: %+v", i, e)
			}
			found := top == 0
			for j, tl := range e.TopLogprobs {
				if j > 0 && tl.Logprob > e.TopLogprobs[j-1].Logprob {
					t.Errorf("entry %d: top_logprobs not descending: %+v", i, e.TopLogprobs)
				}
				found = found || (tl.Token == e.Token && tl.Logprob == e.Logprob)
			}
			if !found {
				t.Errorf("entry %d: the chosen token is not among its top_logprobs: %+v", i, e)
			}
		}
		if text.String() != c.Choices[0].Message.Content {
			t.Errorf("tokens spell %q, content is %q", text.String(), c.Choices[0].Message.Content)
		}

		resp = post(t, url, "/v1/chat/completions", req(true, top), nil)
		var streamed chatLogprobs
		for i, ev := range sseEvents(t, readAll(t, resp)) {
			var ch struct {
				Choices []struct {
					Logprobs *chatLogprobs `json:"logprobs"`
				} `json:"choices"`
			}
			if ev == "[DONE]" || json.Unmarshal([]byte(ev), &ch) != nil || len(ch.Choices) == 0 {
				continue
			}
			if lp := ch.Choices[0].Logprobs; lp != nil {
				if i == 0 {
					t.Errorf("the role chunk has logprobs: %s", ev)
				}
				streamed.Content = append(streamed.Content, lp.Content...)
			}
		}
		if fmt.Sprint(streamed) != fmt.Sprint(*whole) {
			t.Errorf("top %d: streamed logprobs differ:\n%+v\n%+v", top, streamed, *whole)
		}
	}
	resp := post(t, url, "/v1/chat/completions", chatBody("no scores", 4, false), nil)
	if b := readAll(t, resp); !bytes.Contains(b, []byte(`"logprobs":null`)) {
		t.Errorf("logprobs nobody asked for: %s", b)
	}
}

// completionLogprobs is the shape of a completion choice's logprobs.
type completionLogprobs struct {
	Tokens        []string        `json:"tokens"`
	TokenLogprobs []*float64      `json:"token_logprobs"`
	TopLogprobs   []openai.TopMap `json:"top_logprobs"`
	TextOffset    []int           `json:"text_offset"`
}

// TestCompletionLogprobsAndEcho: completions logprobs are parallel arrays over the text (the
// echoed prompt first, its first token unscored), with offsets into it and top entries that
// include the chosen token, in descending order; streamed or not, the same for the same seed.
func TestCompletionLogprobsAndEcho(t *testing.T) {
	tn := startNet(t, 1, nil)
	url := tn.URLs()[0]
	const prompt = "once upon a time"
	for _, echo := range []bool{false, true} {
		req := func(stream bool) string {
			return fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":6,"seed":3,"logprobs":2,"echo":%v,"stream":%v}`, model, prompt, echo, stream)
		}
		resp := post(t, url, "/v1/completions", req(false), nil)
		b := readAll(t, resp)
		var c struct {
			Choices []struct {
				Text     string              `json:"text"`
				Logprobs *completionLogprobs `json:"logprobs"`
			} `json:"choices"`
		}
		if resp.StatusCode != 200 || json.Unmarshal(b, &c) != nil || c.Choices[0].Logprobs == nil {
			t.Fatalf("echo %v: status %d: %s", echo, resp.StatusCode, b)
		}
		text, lp := c.Choices[0].Text, c.Choices[0].Logprobs
		if echo != strings.HasPrefix(text, prompt) {
			t.Errorf("echo %v: text %q", echo, text)
		}
		n := len(lp.Tokens)
		if len(lp.TokenLogprobs) != n || len(lp.TopLogprobs) != n || len(lp.TextOffset) != n {
			t.Fatalf("echo %v: arrays of different lengths: %s", echo, b)
		}
		offset := 0
		for i, tok := range lp.Tokens {
			if lp.TextOffset[i] != offset || !strings.HasPrefix(text[offset:], tok) {
				t.Errorf("echo %v: token %d %q at offset %d, text %q", echo, i, tok, lp.TextOffset[i], text)
			}
			offset += len(tok)
			if echo && i == 0 {
				if lp.TokenLogprobs[0] != nil || lp.TopLogprobs[0] != nil {
					t.Errorf("the echoed prompt's first token is scored: %s", b)
				}
				continue
			}
			v, top := lp.TokenLogprobs[i], lp.TopLogprobs[i]
			if v == nil || !(*v <= 0) || math.IsInf(*v, 0) || len(top) < 2 || len(top) > 3 {
				t.Fatalf("echo %v: token %d: logprob %v top %v", echo, i, v, top)
			}
			found := false
			for j, e := range top {
				if j > 0 && e.Logprob > top[j-1].Logprob {
					t.Errorf("echo %v: token %d: top_logprobs not descending: %v", echo, i, top)
				}
				found = found || (e.Token == tok && e.Logprob == *v)
			}
			if !found {
				t.Errorf("echo %v: token %d: %q not among its top_logprobs %v", echo, i, tok, top)
			}
		}
		if offset != len(text) {
			t.Errorf("echo %v: tokens cover %d of %d bytes", echo, offset, len(text))
		}

		resp = post(t, url, "/v1/completions", req(true), nil)
		var streamed completionLogprobs
		var streamedText strings.Builder
		for _, ev := range sseEvents(t, readAll(t, resp)) {
			var ch struct {
				Choices []struct {
					Text     string              `json:"text"`
					Logprobs *completionLogprobs `json:"logprobs"`
				} `json:"choices"`
			}
			if ev == "[DONE]" || json.Unmarshal([]byte(ev), &ch) != nil || len(ch.Choices) == 0 {
				continue
			}
			streamedText.WriteString(ch.Choices[0].Text)
			if l := ch.Choices[0].Logprobs; l != nil {
				streamed.Tokens = append(streamed.Tokens, l.Tokens...)
				streamed.TokenLogprobs = append(streamed.TokenLogprobs, l.TokenLogprobs...)
				streamed.TopLogprobs = append(streamed.TopLogprobs, l.TopLogprobs...)
				streamed.TextOffset = append(streamed.TextOffset, l.TextOffset...)
			}
		}
		if streamedText.String() != text {
			t.Errorf("echo %v: streamed text %q, want %q", echo, streamedText.String(), text)
		}
		a, _ := json.Marshal(streamed)
		w, _ := json.Marshal(lp)
		if !bytes.Equal(a, w) {
			t.Errorf("echo %v: streamed logprobs differ:\n%s\n%s", echo, a, w)
		}
	}
}
