package loadgen

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

// FuzzConsumeStream feeds arbitrary server bytes to the SSE reader: it must not panic and its
// counts must agree with each other.
func FuzzConsumeStream(f *testing.F) {
	f.Add([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"a\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n"))
	f.Add([]byte("data: {\"error\":{\"code\":7}}\n\n"))
	f.Add([]byte("data: {\"usage\":{\"prompt_tokens\":1,\"prompt_tokens_details\":null}}\ndata: x\n\n:c\r\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		now := time.Unix(0, 0)
		st := consumeStream(bytes.NewReader(b), func() time.Time { now = now.Add(time.Millisecond); return now })
		if len(st.itl) != max(0, st.chunks-1) {
			t.Fatalf("%d gaps for %d chunks", len(st.itl), st.chunks)
		}
		if st.chunks > 0 && st.output.Len() == 0 {
			t.Fatal("content chunks without output")
		}
		_ = consumeJSON(bytes.NewReader(b), time.Now)
	})
}

// FuzzReadMooncake: arbitrary trace bytes parse or fail with ErrTrace, never panic, and what
// parses is valid.
func FuzzReadMooncake(f *testing.F) {
	f.Add(`{"timestamp": 5, "input_length": 600, "output_length": 2, "hash_ids": [0, 1]}` + "\n")
	f.Add("{\"timestamp\": 1e3}\n\n{")
	f.Fuzz(func(t *testing.T, s string) {
		recs, err := ReadMooncake(strings.NewReader(s))
		if err != nil {
			if !errors.Is(err, ErrTrace) {
				t.Fatalf("error %v does not wrap ErrTrace", err)
			}
			return
		}
		for i, r := range recs {
			if r.InputTokens < 0 || r.OutputTokens < 0 || r.InputTokens > maxTraceTokens || r.OutputTokens > maxTraceTokens || r.At < 0 || (i > 0 && r.At < recs[i-1].At) {
				t.Fatalf("invalid record %+v", r)
			}
		}
		cfg := planCfg("", 1, 0, 1)
		cfg.Scale = 0.01
		for _, it := range TraceItems(cfg, recs[:min(len(recs), 3)]) {
			if got := len(it.Messages()[0].Content); got != it.PromptTokens*bytesPerToken {
				t.Fatalf("prompt of %d bytes for %d tokens", got, it.PromptTokens)
			}
		}
	})
}

// FuzzReadCSV: arbitrary CSV parses or fails with ErrTrace, never panics.
func FuzzReadCSV(f *testing.F) {
	f.Add("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n")
	f.Add("1.5,2,3\n\"x\n")
	f.Add("ContextTokens,TIMESTAMP,GeneratedTokens,x\n1,2\n")
	f.Add("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n5,ChatGPT,472,18,490,Conversation log\n")
	f.Fuzz(func(t *testing.T, s string) {
		recs, err := ReadCSV(strings.NewReader(s))
		if err != nil {
			if !errors.Is(err, ErrTrace) {
				t.Fatalf("error %v does not wrap ErrTrace", err)
			}
			return
		}
		for i, r := range recs {
			if r.InputTokens < 0 || r.OutputTokens < 0 || r.InputTokens > maxTraceTokens || r.OutputTokens > maxTraceTokens || (i > 0 && r.At < recs[i-1].At) {
				t.Fatalf("invalid record %+v", r)
			}
		}
	})
}
