package sim

import (
	"cmp"
	"math"
	"slices"
	"unicode/utf8"

	"github.com/kvmesh/kvmesh/kvindex"
	"github.com/kvmesh/kvmesh/node/engine"
)

// Log probabilities. Each position of a generation has a distribution over the token it holds
// and every other word of the vocabulary: the token holds the largest share (the simulator
// decodes greedily in effect, so a token is always among its position's top entries), and each
// other word trails it by a gap drawn from the position's seed, scaled by how sure the position
// is (from about 5% to about 90% for the token). Everything follows from (seed, position,
// token), so a request's logprobs repeat exactly with its seed.

// Salts that separate the logprob draws from the words' and the prompt's from the output's.
const (
	outputSalt = 0x6c6f6770726f6273 // "logprobs"
	promptSalt = 0x70726f6d70746c70 // "promptlp"
)

// unit maps h to [0, 1).
func unit(h uint64) float64 { return float64(h>>11) / (1 << 53) }

// scored is one candidate token of a position.
type scored struct {
	tok   string
	logit float64
}

// tokenLogprob scores token tok at a position whose draws come from h, listing the top
// likeliest tokens (at most len(vocab)+1).
func tokenLogprob(h uint64, tok string, top int) engine.Logprob {
	// How sure the position is: a small scale leaves the alternatives close behind.
	scale := 0.3 + 5*unit(h)
	var buf [len(vocab) + 1]scored
	cands := append(buf[:0], scored{tok: tok})
	sum := 0.0 // of exp(logit) over the alternatives; the token's logit is 0
	for j, w := range vocab {
		if w == tok {
			continue
		}
		l := -scale * (0.5 + 3*unit(splitmix64(h+uint64(j)+1)))
		cands = append(cands, scored{tok: w, logit: l})
		sum += math.Exp(l)
	}
	logZ := math.Log1p(sum)
	lp := engine.Logprob{Token: tok, Logprob: -logZ}
	if top <= 0 {
		return lp
	}
	slices.SortFunc(cands, func(a, b scored) int {
		if c := cmp.Compare(b.logit, a.logit); c != 0 {
			return c
		}
		return cmp.Compare(a.tok, b.tok)
	})
	lp.Top = make([]engine.TopLogprob, min(top, len(cands)))
	for i := range lp.Top {
		lp.Top[i] = engine.TopLogprob{Token: cands[i].tok, Logprob: cands[i].logit - logZ}
	}
	return lp
}

// outputLogprob scores output token i (text tok) of the generation seeded by seed.
func outputLogprob(seed uint64, i int, tok string, top int) engine.Logprob {
	return tokenLogprob(splitmix64((seed^outputSalt)+uint64(i)), tok, top)
}

// promptLogprobs scores an echoed prompt: its tokens are kvindex.BytesPerToken bytes each,
// stretched to end on a character boundary; the first has no probability (nothing precedes it).
func promptLogprobs(seed uint64, prompt []byte, top int) []engine.Logprob {
	out := make([]engine.Logprob, 0, kvindex.Tokens(len(prompt)))
	for start := 0; start < len(prompt); {
		end := min(start+kvindex.BytesPerToken, len(prompt))
		for end < len(prompt) && !utf8.RuneStart(prompt[end]) {
			end++
		}
		tok := string(prompt[start:end])
		if start == 0 {
			out = append(out, engine.Logprob{Token: tok, Unscored: true})
		} else {
			out = append(out, tokenLogprob(splitmix64((seed^promptSalt)+uint64(len(out))), tok, top))
		}
		start = end
	}
	return out
}
