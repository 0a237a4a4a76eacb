package openai

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
)

type recorder struct {
	h       http.Header
	code    int
	buf     bytes.Buffer
	flushes int
}

func newRecorder() *recorder             { return &recorder{h: http.Header{}} }
func (r *recorder) Header() http.Header  { return r.h }
func (r *recorder) WriteHeader(code int) { r.code = code }
func (r *recorder) Flush()               { r.flushes++ }
func (r *recorder) Write(b []byte) (int, error) {
	if r.code == 0 {
		r.code = 200
	}
	return r.buf.Write(b)
}

func TestSSEWriterFormat(t *testing.T) {
	rec := newRecorder()
	w := NewSSEWriter(rec)
	stop := "stop"
	chunks := []any{
		ChatCompletionChunk{ID: "c", Object: ObjectChatCompletionChunk, Model: "m", IncludeUsage: true,
			Choices: []ChunkChoice{{Delta: Delta{Role: RoleAssistant, Content: StringPtr("")}}}},
		ChatCompletionChunk{ID: "c", Object: ObjectChatCompletionChunk, Model: "m", IncludeUsage: true,
			Choices: []ChunkChoice{{Delta: Delta{}, FinishReason: &stop}}},
		ChatCompletionChunk{ID: "c", Object: ObjectChatCompletionChunk, Model: "m", IncludeUsage: true, Usage: NewUsage(3, 2, 1)},
	}
	for _, c := range chunks {
		if err := w.WriteData(c); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.WriteError(ErrEngine("died")); err != nil {
		t.Fatal(err)
	}
	if err := w.WriteDone(); err != nil {
		t.Fatal(err)
	}
	want := `data: {"id":"c","object":"chat.completion.chunk","created":0,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"usage":null}

data: {"id":"c","object":"chat.completion.chunk","created":0,"model":"m","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}],"usage":null}

data: {"id":"c","object":"chat.completion.chunk","created":0,"model":"m","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5,"prompt_tokens_details":{"cached_tokens":1}}}

data: {"error":{"message":"died","type":"server_error","param":null,"code":"engine_error"}}

data: [DONE]

`
	if got := rec.buf.String(); got != want {
		t.Errorf("stream:\n%s\nwant:\n%s", got, want)
	}
	if rec.flushes != 5 || rec.h.Get("Content-Type") != "text/event-stream" || rec.h.Get("Cache-Control") != "no-cache" {
		t.Errorf("flushes %d headers %v", rec.flushes, rec.h)
	}
}

func TestChunkWithoutIncludeUsageOmitsUsage(t *testing.T) {
	tests := []struct {
		name string
		v    any
		want string
	}{
		{"chat", ChatCompletionChunk{Object: ObjectChatCompletionChunk, Choices: []ChunkChoice{{Delta: Delta{Content: StringPtr("x")}}}},
			`{"id":"","object":"chat.completion.chunk","created":0,"model":"","choices":[{"index":0,"delta":{"content":"x"},"logprobs":null,"finish_reason":null}]}`},
		{"completion", CompletionChunk{Object: ObjectTextCompletion, Choices: []CompletionChoice{{Text: "x"}}},
			`{"id":"","object":"text_completion","created":0,"model":"","choices":[{"text":"x","index":0,"logprobs":null,"finish_reason":null}]}`},
		{"completion include_usage", CompletionChunk{Object: ObjectTextCompletion, IncludeUsage: true},
			`{"id":"","object":"text_completion","created":0,"model":"","choices":[],"usage":null}`},
		{"models", ModelList{Object: ObjectList, Data: []Model{{ID: "m", Object: ObjectModel, Created: 1, OwnedBy: "kvmesh"}}},
			`{"object":"list","data":[{"id":"m","object":"model","created":1,"owned_by":"kvmesh"}]}`},
		{"chat completion", ChatCompletion{Object: ObjectChatCompletion, Choices: []ChatChoice{{Message: ResponseMessage{Role: RoleAssistant, Content: StringPtr("hi")}, FinishReason: "length"}}, Usage: NewUsage(1, 1, 0)},
			`{"id":"","object":"chat.completion","created":0,"model":"","choices":[{"index":0,"message":{"role":"assistant","content":"hi","refusal":null},"logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2,"prompt_tokens_details":{"cached_tokens":0}}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := newRecorder()
			if err := NewSSEWriter(rec).WriteData(tt.v); err != nil {
				t.Fatal(err)
			}
			if got := strings.TrimSuffix(strings.TrimPrefix(rec.buf.String(), "data: "), "\n\n"); got != tt.want {
				t.Errorf("got  %s\nwant %s", got, tt.want)
			}
		})
	}
}

func TestSSEReader(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    []string
		wantErr error
		sawDone bool
	}{
		{"done", "data: a\n\ndata: b\n\ndata: [DONE]\n\ndata: c\n\n", []string{"a", "b"}, io.EOF, true},
		{"crlf, comments, fields", ": ping\r\nevent: x\r\nid: 1\r\ndata:a\r\n\r\n\r\n", []string{"a"}, io.EOF, false},
		{"multiline", "data: a\ndata: b\n\n", []string{"a\nb"}, io.EOF, false},
		{"end without done", "data: a\n\n", []string{"a"}, io.EOF, false},
		{"cut mid event", "data: a\n\ndata: b\n", []string{"a"}, io.ErrUnexpectedEOF, false},
		{"cut mid line", "data: a\n\ndata: b", []string{"a"}, io.ErrUnexpectedEOF, false},
		{"too large", "data: " + strings.Repeat("x", 100) + "\n\n", nil, ErrEventTooLarge, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := NewSSEReader(strings.NewReader(tt.in))
			r.SetMaxEventBytes(64)
			var got []string
			var err error
			for {
				var d []byte
				d, err = r.Next()
				if err != nil {
					break
				}
				got = append(got, string(d))
			}
			if !errors.Is(err, tt.wantErr) || strings.Join(got, "|") != strings.Join(tt.want, "|") {
				t.Errorf("got %q, %v; want %q, %v", got, err, tt.want, tt.wantErr)
			}
			if _, err2 := r.Next(); err2 != io.EOF {
				t.Errorf("Next after end = %v, want io.EOF", err2)
			}
			if r.SawDone() != tt.sawDone {
				t.Errorf("SawDone = %v, want %v", r.SawDone(), tt.sawDone)
			}
		})
	}
}
