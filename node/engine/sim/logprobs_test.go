package sim

import (
	"context"
	"errors"
	"io"
	"math"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/kvmesh/kvmesh/node/engine"
)

// collect reads st to the end and returns its text, every chunk's logprobs in order, and the
// final chunk.
func collect(t *testing.T, s *Sim, req *engine.Request) (string, []engine.Logprob, engine.Chunk) {
	t.Helper()
	st, err := s.Generate(context.Background(), req)
	if err != nil {
		t.Fatalf("Generate: %v", err)
	}
	defer st.Close()
	var text strings.Builder
	var lps []engine.Logprob
	var last engine.Chunk
	for {
		c, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return text.String(), lps, last
		}
		if err != nil {
			t.Fatalf("Recv: %v", err)
		}
		text.WriteString(c.Text)
		lps = append(lps, c.Logprobs...)
		last = c
	}
}

// checkScored holds one scored token to the rules: a log probability below 0, k top entries
// in descending order, the token itself first, and no more than all the probability.
func checkScored(t *testing.T, i int, lp engine.Logprob, k int) {
	t.Helper()
	if lp.Unscored || !(lp.Logprob < 0) || math.IsInf(lp.Logprob, 0) {
		t.Fatalf("token %d: logprob %v (unscored %v), want a finite value below 0", i, lp.Logprob, lp.Unscored)
	}
	if len(lp.Top) != k {
		t.Fatalf("token %d: %d top entries, want %d", i, len(lp.Top), k)
	}
	if k == 0 {
		return
	}
	if lp.Top[0].Token != lp.Token || lp.Top[0].Logprob != lp.Logprob {
		t.Errorf("token %d: top %+v does not start with the chosen token %q %v", i, lp.Top[0], lp.Token, lp.Logprob)
	}
	mass := 0.0
	seen := map[string]bool{}
	for j, e := range lp.Top {
		if j > 0 && e.Logprob > lp.Top[j-1].Logprob {
			t.Errorf("token %d: top entries not descending: %+v", i, lp.Top)
		}
		if seen[e.Token] {
			t.Errorf("token %d: %q twice in the top entries", i, e.Token)
		}
		seen[e.Token] = true
		mass += math.Exp(e.Logprob)
	}
	if mass > 1+1e-9 {
		t.Errorf("token %d: top entries hold probability %v > 1", i, mass)
	}
}

func TestLogprobs(t *testing.T) {
	s := newTestSim(t, nil)
	p := prompt("logprobs", 20)
	seed := fullSeed(t, p, 16)
	ref := gen(t, s, &engine.Request{Model: testModel, Prompt: p, MaxTokens: 16, Seed: seed}).text
	for _, k := range []int{0, 1, 5, 20} {
		req := engine.Request{Model: testModel, Prompt: p, MaxTokens: 16, Seed: seed, Logprobs: true, TopLogprobs: k}
		text, lps, last := collect(t, s, &req)
		if text != ref {
			t.Errorf("top %d: logprobs changed the text: %q, want %q", k, text, ref)
		}
		if len(lps) != last.Usage.CompletionTokens {
			t.Fatalf("top %d: %d scored tokens for %d generated", k, len(lps), last.Usage.CompletionTokens)
		}
		var toks strings.Builder
		for i, lp := range lps {
			checkScored(t, i, lp, k)
			toks.WriteString(lp.Token)
		}
		if toks.String() != text {
			t.Errorf("top %d: tokens spell %q, text is %q", k, toks.String(), text)
		}
		_, again, _ := collect(t, s, &req)
		if !reflect.DeepEqual(lps, again) {
			t.Errorf("top %d: same seed, different logprobs", k)
		}
	}
	if _, lps, _ := collect(t, s, &engine.Request{Model: testModel, Prompt: p, MaxTokens: 16, Seed: seed}); lps != nil {
		t.Errorf("logprobs nobody asked for: %+v", lps)
	}
	other := seed + 1
	for naturalLength(textSeed(other, p), 16) != 16 {
		other++
	}
	_, a, _ := collect(t, s, &engine.Request{Model: testModel, Prompt: p, MaxTokens: 16, Seed: seed, Logprobs: true})
	_, b, _ := collect(t, s, &engine.Request{Model: testModel, Prompt: p, MaxTokens: 16, Seed: other, Logprobs: true})
	if reflect.DeepEqual(a, b) {
		t.Errorf("different seeds, same logprobs")
	}
}

// TestLogprobsAtAStop: tokens whose text a possible stop string holds back are scored all the
// same, so every generated token is scored once, the stop string's included.
func TestLogprobsAtAStop(t *testing.T) {
	s := newTestSim(t, nil)
	p := prompt("stoplp", 20)
	seed := fullSeed(t, p, 20)
	ref := gen(t, s, &engine.Request{Model: testModel, Prompt: p, MaxTokens: 20, Seed: seed}).text
	stop := ref[30:37] // spans tokens 7 to 9
	text, lps, last := collect(t, s, &engine.Request{Model: testModel, Prompt: p, MaxTokens: 20, Seed: seed,
		Stop: []string{stop}, Logprobs: true, TopLogprobs: 2})
	if !strings.HasPrefix(ref, text) || last.FinishReason != engine.FinishStop {
		t.Fatalf("text %q finish %s", text, last.FinishReason)
	}
	if len(lps) != last.Usage.CompletionTokens {
		t.Fatalf("%d scored tokens for %d generated", len(lps), last.Usage.CompletionTokens)
	}
	for i, lp := range lps {
		checkScored(t, i, lp, 2)
	}
}

// TestEcho: a completion's echo puts the prompt before the output, in the first chunk (not
// before the first token exists); with logprobs its tokens come first, the first unscored.
func TestEcho(t *testing.T) {
	s := newTestSim(t, nil)
	for _, p := range [][]byte{prompt("echo", 10), []byte("naïve 日本語 🙂 prompt"), []byte("")} {
		seed := fullSeed(t, p, 6)
		ref := gen(t, s, &engine.Request{Model: testModel, Prompt: p, MaxTokens: 6, Seed: seed}).text
		text, lps, last := collect(t, s, &engine.Request{Endpoint: engine.Completion, Model: testModel, Prompt: p,
			MaxTokens: 6, Seed: seed, Echo: true, Logprobs: true, TopLogprobs: 3})
		if text != string(p)+ref {
			t.Errorf("echo: %q, want %q", text, string(p)+ref)
		}
		if last.Usage.CompletionTokens != 6 {
			t.Errorf("echo counted as completion tokens: %+v", last.Usage)
		}
		var toks strings.Builder
		for i, lp := range lps {
			toks.WriteString(lp.Token)
			if !utf8.ValidString(lp.Token) {
				t.Errorf("token %d %q splits a character", i, lp.Token)
			}
			if i == 0 && len(p) > 0 {
				if !lp.Unscored || lp.Top != nil {
					t.Errorf("first prompt token %+v, want unscored", lp)
				}
				continue
			}
			checkScored(t, i, lp, 3)
		}
		if toks.String() != text {
			t.Errorf("tokens spell %q, text is %q", toks.String(), text)
		}
		if n := len(lps) - last.Usage.CompletionTokens; len(p) > 0 && n < 1 {
			t.Errorf("%d prompt tokens scored", n)
		}
	}
}
