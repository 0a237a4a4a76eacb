package sim

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/openai"
)

func extra(kv ...string) []openai.Field {
	var f []openai.Field
	for i := 0; i+1 < len(kv); i += 2 {
		f = append(f, openai.Field{Name: kv[i], Value: []byte(kv[i+1])})
	}
	return f
}

// TestAcceptsNoOpFields: vLLM's and OpenAI's sampling knobs, template switches and bookkeeping
// run, unchanged in effect, on the simulated engine.
func TestAcceptsNoOpFields(t *testing.T) {
	s := newTestSim(t, nil)
	p := prompt("noop", 20)
	seed := fullSeed(t, p, 8)
	ref := gen(t, s, &engine.Request{Model: testModel, Prompt: p, MaxTokens: 8, Seed: seed}).text
	for _, f := range extra(
		"top_k", "40", "top_k", "-1", "min_p", "0.05", "repetition_penalty", "1.1", "presence_penalty", "0.5",
		"frequency_penalty", "-0.5", "length_penalty", "1", "logit_bias", `{"50256":-100}`, "stop_token_ids", "[128009]",
		"skip_special_tokens", "false", "spaces_between_special_tokens", "true", "chat_template_kwargs", `{"enable_thinking":false}`,
		"chat_template", `"{{x}}"`, "add_generation_prompt", "true", "tools", `[{"type":"function"}]`, "tool_choice", `"auto"`,
		"response_format", `{"type": "text"}`, "parallel_tool_calls", "false", "metadata", `{"k":"v"}`, "store", "false",
		"reasoning_effort", `"low"`, "guided_decoding_backend", `"xgrammar"`, "best_of", "1", "priority", "0", "echo", "false",
		"stream_options.include_obfuscation", "false", "guided_json", "null", "min_tokens", "0", "ignore_eos", "false",
		"include_stop_str_in_output", "false", "modalities", `["text"]`,
		"messages[0].content", `{"type":"image_url","image_url":{"url":"https://example.com/a.png"}}`,
		"messages[1].content", `{"type":"input_audio","input_audio":{"data":"AAAA","format":"wav"}}`,
	) {
		t.Run(f.Name+"="+string(f.Value), func(t *testing.T) {
			r := gen(t, s, &engine.Request{Model: testModel, Prompt: p, MaxTokens: 8, Seed: seed, Extra: []openai.Field{f}})
			if r.text != ref {
				t.Errorf("text %q, want %q as without the field", r.text, ref)
			}
		})
	}
}

// TestRefusesWhatItCannotHonour: a value the simulator cannot keep, a field it does not know,
// a malformed value and a role outside OpenAI's are refused before the request runs, naming
// the field.
func TestRefusesWhatItCannotHonour(t *testing.T) {
	s := newTestSim(t, nil)
	tests := []struct {
		name        string
		req         engine.Request
		param       string
		unsupported bool
	}{
		{"guided_json", engine.Request{Extra: extra("top_k", "5", "guided_json", `{"type":"object"}`)}, "guided_json", true},
		{"json schema", engine.Request{Extra: extra("response_format", `{"type":"json_schema","json_schema":{}}`)}, "response_format", true},
		{"json object", engine.Request{Extra: extra("response_format", `{"type":"json_object"}`)}, "response_format", true},
		{"structured_outputs", engine.Request{Extra: extra("structured_outputs", `{"regex":"a+"}`)}, "structured_outputs", true},
		{"forced tool without tools", engine.Request{Extra: extra("tool_choice", `"required"`)}, "tool_choice", false},
		{"named tool not offered", engine.Request{Extra: extra("tools", `[{"type":"function","function":{"name":"g"}}]`,
			"tool_choice", `{"type":"function","function":{"name":"f"}}`)}, "tool_choice", false},
		{"custom tool forced", engine.Request{Extra: extra("tool_choice", `{"type":"custom","custom":{"name":"f"}}`)}, "tool_choice", true},
		{"function_call forced", engine.Request{Extra: extra("function_call", `{"name":"f"}`)}, "function_call", true},
		{"best_of", engine.Request{Extra: extra("best_of", "3")}, "best_of", true},
		{"beam search", engine.Request{Extra: extra("use_beam_search", "true")}, "use_beam_search", true},
		{"chat echo", engine.Request{Extra: extra("echo", "true")}, "echo", true},
		{"suffix", engine.Request{Extra: extra("suffix", `"end"`)}, "suffix", true},
		{"priority", engine.Request{Extra: extra("priority", "-5")}, "priority", true},
		{"continuous usage", engine.Request{Extra: extra("stream_options.continuous_usage_stats", "true")}, "stream_options.continuous_usage_stats", true},
		{"unknown field", engine.Request{Extra: extra("frobnicate", "1")}, "frobnicate", true},
		{"unknown role", engine.Request{Roles: []string{"system", "user", "critic"}}, "messages[2].role", true},
		{"file part", engine.Request{Extra: extra("messages[1].content", `{"type":"file","file":{"file_id":"f"}}`)}, "messages[1].content", true},
		{"video part", engine.Request{Extra: extra("messages[0].content", `{"type":"video_url","video_url":{"url":"x"}}`)}, "messages[0].content", true},
		{"top_k not an integer", engine.Request{Extra: extra("top_k", "4.5")}, "top_k", false},
		{"min_p a string", engine.Request{Extra: extra("min_p", `"0.1"`)}, "min_p", false},
		{"ignore_eos a number", engine.Request{Extra: extra("ignore_eos", "1")}, "ignore_eos", false},
		{"min_tokens negative", engine.Request{Extra: extra("min_tokens", "-1")}, "min_tokens", false},
		{"min_tokens over max_tokens", engine.Request{Extra: extra("min_tokens", "20")}, "min_tokens", false},
		{"tool_choice a number", engine.Request{Extra: extra("tool_choice", "5")}, "tool_choice", false},
		{"tool_choice unknown", engine.Request{Extra: extra("tool_choice", `"bogus"`)}, "tool_choice", false},
		{"tool_choice without a type", engine.Request{Extra: extra("tool_choice", `{"function":{"name":"f"}}`)}, "tool_choice", false},
		{"function_call unknown", engine.Request{Extra: extra("function_call", `"required"`)}, "function_call", false},
		{"response_format empty", engine.Request{Extra: extra("response_format", `{}`)}, "response_format", false},
		{"response_format unknown", engine.Request{Extra: extra("response_format", `{"type":"bogus"}`)}, "response_format", false},
		{"best_of zero", engine.Request{Extra: extra("best_of", "0")}, "best_of", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := tt.req
			req.Model, req.Prompt, req.MaxTokens = testModel, prompt("refuse", 8), 10
			_, err := s.Generate(context.Background(), &req)
			var pe *engine.ParamError
			if !errors.As(err, &pe) || !errors.Is(err, engine.ErrRejected) {
				t.Fatalf("Generate = %v, want a ParamError wrapping ErrRejected", err)
			}
			if pe.Param != tt.param || pe.Unsupported != tt.unsupported || !strings.Contains(err.Error(), tt.param) {
				t.Errorf("got %+v (%v), want param %q unsupported %v", pe, err, tt.param, tt.unsupported)
			}
		})
	}
	if st := s.State(); st.Waiting+st.Running != 0 {
		t.Errorf("refused requests were queued: %+v", st)
	}
}

// TestHonoursOutputLengthFields: min_tokens holds off the natural end and stop strings,
// ignore_eos runs to max_tokens, include_stop_str_in_output keeps the stop string.
func TestHonoursOutputLengthFields(t *testing.T) {
	s := newTestSim(t, nil)
	p := prompt("length", 20)
	var short uint64
	for naturalLength(textSeed(short, p), 30) > 3 {
		short++
	}
	run := func(seed uint64, stop []string, kv ...string) result {
		return gen(t, s, &engine.Request{Model: testModel, Prompt: p, MaxTokens: 30, Seed: seed, Stop: stop, Extra: extra(kv...)})
	}
	if r := run(short, nil); r.last.Usage.CompletionTokens > 3 || r.last.FinishReason != engine.FinishStop {
		t.Fatalf("reference: %d tokens, %s", r.last.Usage.CompletionTokens, r.last.FinishReason)
	}
	if r := run(short, nil, "ignore_eos", "true"); r.last.Usage.CompletionTokens != 30 || r.last.FinishReason != engine.FinishLength {
		t.Errorf("ignore_eos: %d tokens, %s; want 30, length", r.last.Usage.CompletionTokens, r.last.FinishReason)
	}
	if r := run(short, nil, "min_tokens", "12"); r.last.Usage.CompletionTokens != 12 {
		t.Errorf("min_tokens 12: %d tokens", r.last.Usage.CompletionTokens)
	}
	full := fullSeed(t, p, 30)
	ref := run(full, nil).text
	stop := ref[4:8] // the second word: found at token 2 unless min_tokens holds it off
	if r := run(full, []string{stop}); r.text != ref[:strings.Index(ref, stop)] {
		t.Errorf("stop: %q", r.text)
	}
	if r := run(full, []string{stop}, "include_stop_str_in_output", "true"); r.text != ref[:strings.Index(ref, stop)+4] {
		t.Errorf("include_stop_str_in_output: %q, want %q", r.text, ref[:strings.Index(ref, stop)+4])
	}
	r := run(full, []string{stop}, "min_tokens", "10")
	if r.last.Usage.CompletionTokens < 10 || !strings.HasPrefix(ref, r.text) || len(r.text) < 36 {
		t.Errorf("min_tokens 10 with a stop string: %d tokens, %q", r.last.Usage.CompletionTokens, r.text)
	}
}
