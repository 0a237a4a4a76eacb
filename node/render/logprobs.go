package render

import (
	"encoding/json"
	"math"
	"slices"

	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/openai"
)

// Logprobs turns an engine's token logprobs into one request's response logprobs: chat's
// content entries, or the completions API's parallel arrays, whose text offsets it counts
// across the chunks of a stream.
type Logprobs struct {
	completion bool
	offset     int // bytes of the choice's text before the next token
}

// NewLogprobs returns the Logprobs of a request on endpoint ep.
func NewLogprobs(ep engine.Endpoint) *Logprobs {
	return &Logprobs{completion: ep == engine.Completion}
}

// minLogprob stands in for a log probability JSON cannot carry (-Inf, NaN), as OpenAI and
// vLLM do.
const minLogprob = -9999.0

func finite(v float64) float64 {
	if math.IsNaN(v) || v < minLogprob {
		return minLogprob
	}
	return v
}

// Encode returns the logprobs object of lps, nil for none.
func (l *Logprobs) Encode(lps []engine.Logprob) json.RawMessage {
	if len(lps) == 0 {
		return nil
	}
	var v any
	if l.completion {
		v = l.completionLogprobs(lps)
	} else {
		c := openai.ChatLogprobs{Content: make([]openai.TokenLogprob, len(lps))}
		for i, lp := range lps {
			top := make([]openai.TopLogprob, len(lp.Top))
			for j, e := range lp.Top {
				top[j] = openai.TopLogprob{Token: e.Token, Logprob: finite(e.Logprob), Bytes: openai.TokenBytes(e.Token)}
			}
			c.Content[i] = openai.TokenLogprob{Token: lp.Token, Logprob: finite(lp.Logprob),
				Bytes: openai.TokenBytes(lp.Token), TopLogprobs: top}
		}
		v = c
	}
	b, err := json.Marshal(v)
	if err != nil { // unreachable: strings and finite numbers only
		return nil
	}
	return b
}

// completionLogprobs builds the completions API's arrays. Each position's top entries include
// the chosen token (as OpenAI's and vLLM's do: up to logprobs+1 of them), in descending order.
func (l *Logprobs) completionLogprobs(lps []engine.Logprob) openai.CompletionLogprobs {
	c := openai.CompletionLogprobs{
		Tokens:        make([]string, len(lps)),
		TokenLogprobs: make([]*float64, len(lps)),
		TopLogprobs:   make([]openai.TopMap, len(lps)),
		TextOffset:    make([]int, len(lps)),
	}
	for i, lp := range lps {
		c.Tokens[i], c.TextOffset[i] = lp.Token, l.offset
		l.offset += len(lp.Token)
		if lp.Unscored {
			continue // null, null
		}
		v := finite(lp.Logprob)
		c.TokenLogprobs[i] = &v
		top := make(openai.TopMap, 0, len(lp.Top)+1)
		chosen := false
		for _, e := range lp.Top {
			top = append(top, openai.TopLogprob{Token: e.Token, Logprob: finite(e.Logprob)})
			chosen = chosen || e.Token == lp.Token
		}
		if !chosen {
			at, _ := slices.BinarySearchFunc(top, v, func(e openai.TopLogprob, v float64) int {
				if e.Logprob >= v {
					return -1
				}
				return 1
			})
			top = slices.Insert(top, at, openai.TopLogprob{Token: lp.Token, Logprob: v})
		}
		c.TopLogprobs[i] = top
	}
	return c
}

// WithLogprobs puts raw in the choice of v, a response or chunk built by an Encoder.
func WithLogprobs(v any, raw json.RawMessage) any {
	if raw == nil {
		return v
	}
	switch x := v.(type) {
	case openai.ChatCompletionChunk:
		if len(x.Choices) > 0 {
			x.Choices[0].Logprobs = raw
		}
		return x
	case openai.CompletionChunk:
		if len(x.Choices) > 0 {
			x.Choices[0].Logprobs = raw
		}
		return x
	case openai.ChatCompletion:
		if len(x.Choices) > 0 {
			x.Choices[0].Logprobs = raw
		}
		return x
	case openai.Completion:
		if len(x.Choices) > 0 {
			x.Choices[0].Logprobs = raw
		}
		return x
	}
	return v
}
