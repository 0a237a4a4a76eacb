package openai

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"
)

// BenchmarkDecodeChat measures the decode step of every chat request (about 4 KiB of prompt).
func BenchmarkDecodeChat(b *testing.B) {
	body := []byte(`{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":128,"temperature":0.7,` +
		`"messages":[{"role":"system","content":"` + strings.Repeat("s", 1024) + `"},{"role":"user","content":"` + strings.Repeat("u", 3072) + `"}]}`)
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, err := DecodeChat(bytes.NewReader(body), DefaultBodyLimit); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSSEWrite measures writing one streamed token chunk.
func BenchmarkSSEWrite(b *testing.B) {
	w := NewSSEWriter(&discardWriter{h: http.Header{}})
	c := ChatCompletionChunk{ID: "chatcmpl-1", Object: ObjectChatCompletionChunk, Model: "m", IncludeUsage: true,
		Choices: []ChunkChoice{{Delta: Delta{Content: StringPtr("tok ")}}}}
	for b.Loop() {
		if err := w.WriteData(c); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/chunk")
}

type discardWriter struct{ h http.Header }

func (d *discardWriter) Header() http.Header         { return d.h }
func (d *discardWriter) Write(p []byte) (int, error) { return io.Discard.Write(p) }
func (d *discardWriter) WriteHeader(int)             {}
