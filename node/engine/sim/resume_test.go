package sim

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"

	"github.com/kvmesh/kvmesh/kvindex"
	"github.com/kvmesh/kvmesh/node/engine"
)

// chunks runs req and returns its chunks, the final one last.
func chunks(t *testing.T, s *Sim, req *engine.Request) []engine.Chunk {
	t.Helper()
	st, err := s.Generate(context.Background(), req)
	if err != nil {
		t.Fatalf("Generate: %v", err)
	}
	defer st.Close()
	var out []engine.Chunk
	for {
		c, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("Recv: %v", err)
		}
		out = append(out, c)
	}
}

func lpTokens(cs []engine.Chunk) []engine.Logprob {
	var lps []engine.Logprob
	for _, c := range cs {
		lps = append(lps, c.Logprobs...)
	}
	return lps
}

// TestResumeContinuesTheUnbrokenText pins the embedded engine's continuation: a request
// resuming a generation whose client received its first k chunks produces exactly the rest of
// the unbroken run (text, log probabilities, finish reason) and the unbroken run's usage,
// whatever k, with stop strings that hold text back across tokens, end the output mid-token
// or are sent, min_tokens, and a natural end.
func TestResumeContinuesTheUnbrokenText(t *testing.T) {
	s := newTestSim(t, nil)
	p := prompt("resume", 40)
	const maxTokens = 24
	full := fullSeed(t, p, maxTokens)
	ref := gen(t, s, &engine.Request{Model: testModel, Prompt: p, MaxTokens: maxTokens, Seed: full}).text
	var short uint64
	for short = 0; naturalLength(textSeed(short, p), maxTokens) > maxTokens/2; short++ {
	}
	spanning := ref[30:35] // crosses the token boundary at byte 32: the output ends mid-token
	// Stop strings that never complete but begin like the output's end: " zz" holds back each
	// word's trailing space (chunks end mid-token), the first word + "zz" holds back that word
	// whole (a token sends nothing, and the next chunk carries two).
	hold := []string{" zz", ref[:4] + "zz"}
	tests := []struct {
		name   string
		seed   uint64
		stop   []string
		ext    []string
		merged bool // some chunk carries more than one token
	}{
		{"no stop", full, nil, nil, false},
		{"natural end", short, nil, nil, false},
		{"held text", full, hold, nil, true},
		{"stop spanning tokens", full, append(hold, spanning), nil, true},
		{"stop sent", full, []string{spanning}, []string{"include_stop_str_in_output", "true"}, false},
		{"min tokens", full, []string{ref[:4]}, []string{"min_tokens", "12"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			orig := engine.Request{Model: testModel, Prompt: p, MaxTokens: maxTokens, Seed: tt.seed, Stop: tt.stop,
				Logprobs: true, TopLogprobs: 2, Extra: extra(tt.ext...)}
			unbroken := chunks(t, s, &orig)
			last := unbroken[len(unbroken)-1]
			var want strings.Builder
			for _, c := range unbroken {
				want.WriteString(c.Text)
			}
			if len(unbroken) < 3 {
				t.Fatalf("only %d chunks: nothing to break", len(unbroken))
			}
			if merged := len(unbroken) < last.Usage.CompletionTokens; merged != tt.merged {
				t.Fatalf("%d chunks for %d tokens: merged %v, want %v", len(unbroken), last.Usage.CompletionTokens, merged, tt.merged)
			}
			// The client received chunks [0, k) and lost the rest.
			for k := 1; k < len(unbroken); k++ {
				var sent strings.Builder
				for _, c := range unbroken[:k] {
					sent.WriteString(c.Text)
				}
				cont := orig
				cont.Prompt = append(append([]byte(nil), p...), sent.String()...)
				cont.Seed = tt.seed + 1 // the continuation's own seed plays no part
				cont.MaxTokens = maxTokens - k
				cont.Resume = &engine.Resume{Seed: tt.seed, PromptHash: xxhash.Sum64(p), Tokens: k, Bytes: sent.Len(),
					PromptTokens: kvindex.Tokens(len(p))}
				rest := chunks(t, s, &cont)
				var got strings.Builder
				got.WriteString(sent.String())
				for _, c := range rest {
					got.WriteString(c.Text)
				}
				end := rest[len(rest)-1]
				switch {
				case got.String() != want.String():
					t.Errorf("break after %d chunks: text\n%q\nwant\n%q", k, got.String(), want.String())
				case end.FinishReason != last.FinishReason:
					t.Errorf("break after %d chunks: finish %q, want %q", k, end.FinishReason, last.FinishReason)
				case *end.Usage != *last.Usage && (end.Usage.PromptTokens != last.Usage.PromptTokens ||
					end.Usage.CompletionTokens != last.Usage.CompletionTokens):
					t.Errorf("break after %d chunks: usage %+v, want %+v", k, *end.Usage, *last.Usage)
				}
				wantLP, gotLP := lpTokens(unbroken[k:]), lpTokens(rest)
				if len(gotLP) != len(wantLP) {
					t.Fatalf("break after %d chunks: %d logprobs, want %d", k, len(gotLP), len(wantLP))
				}
				for i := range wantLP {
					if gotLP[i].Token != wantLP[i].Token || gotLP[i].Logprob != wantLP[i].Logprob {
						t.Errorf("break after %d chunks: logprob %d = %+v, want %+v", k, i, gotLP[i], wantLP[i])
					}
				}
			}
		})
	}
}
