package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/node/openai"
)

// Outcome is how a request ended. Every request sent has exactly one.
type Outcome uint8

const (
	Completed Outcome = iota + 1 // a 200 stream that finished
	Refused                      // a non-200 status
	Failed                       // transport error, timeout, stream error or cut stream
)

func (o Outcome) String() string {
	switch o {
	case Completed:
		return "completed"
	case Refused:
		return "refused"
	case Failed:
		return "failed"
	}
	return "unknown"
}

// Failure kinds, the keys of Report.Failures.
const (
	FailTransport = "transport"
	FailTimeout   = "timeout"
	FailCanceled  = "canceled"
	FailStream    = "stream_error" // a mid-stream {"error":...} event; its code is appended
	FailTruncated = "truncated"    // the stream ended inside an event, or before a finish_reason or [DONE]
	FailDecode    = "decode"       // a chunk that is not JSON, or an oversized line
)

// Result is the measurement of one request (all attempts).
type Result struct {
	Kind    string
	Class   Class
	Outcome Outcome
	// Model is the model asked for; Entry, with Config.Models, is EntryOwn or EntryOther: how
	// the request entered the mesh.
	Model, Entry string
	// Status and Reason are set for refusals (Reason from X-Kvmesh-Reason, else the error
	// body's code, else its type).
	Status int
	Reason string
	// Failure is set for failures: one of the Fail* kinds (stream errors as "stream_error:CODE").
	Failure string
	Node    string
	// PrefillNode is the node that ran a split request's prefill half (X-Kvmesh-Prefill-Node):
	// set when Node answered as its decode node, empty for a request run whole.
	PrefillNode string
	// TTFT is from sending to the first content token; E2E to the end of the stream.
	TTFT, E2E time.Duration
	// ITL are the gaps between consecutive content chunks.
	ITL                                      []time.Duration
	OutputTokens, PromptTokens, CachedTokens int
	// RecomputedTokens, for an agent step after the first, is how much of the agent's earlier
	// context (the previous step's prompt and output) was not served from the prefix cache and
	// had to be prefilled again: the cost of thrashing.
	RecomputedTokens int
	// Retried is set when a refusal was retried after Retry-After; RetryAfter is the last
	// Retry-After seen (HasRetryAfter tells a zero value from none).
	Retried       bool
	RetryAfter    time.Duration
	HasRetryAfter bool
	// Output is the generated text (agents append it to their next prompt).
	Output string
	// TTFTTarget is the TTFT target the mesh declared for a request sent without one
	// (Config.FittedTTFT; zero otherwise).
	TTFTTarget time.Duration
}

// TPOT is (E2E − TTFT)/(OutputTokens − 1), zero for fewer than two tokens.
func (r *Result) TPOT() time.Duration {
	if r.OutputTokens < 2 {
		return 0
	}
	return (r.E2E - r.TTFT) / time.Duration(r.OutputTokens-1)
}

// MetSLO reports whether a completed request met both of its class's SLOs, its TTFT target
// being the one the mesh fitted to it when the request named none (Config.FittedTTFT).
func (r *Result) MetSLO() bool {
	ttft := r.Class.TTFT
	if r.TTFTTarget > 0 {
		ttft = r.TTFTTarget
	}
	return r.Outcome == Completed && r.TTFT <= ttft && r.TPOT() <= r.Class.TPOT
}

// wire shapes of the OpenAI chat API, the few fields loadgen needs.
type chatRequest struct {
	Model         string    `json:"model"`
	Messages      []Message `json:"messages"`
	MaxTokens     int       `json:"max_tokens"`
	IgnoreEOS     bool      `json:"ignore_eos,omitempty"`
	Stream        bool      `json:"stream"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

type apiError struct {
	Message string          `json:"message"`
	Type    string          `json:"type"`
	Code    json.RawMessage `json:"code"`
}

// reason returns the error's code (a string or a number), else its type.
func (e *apiError) reason() string {
	var s string
	if json.Unmarshal(e.Code, &s) == nil && s != "" {
		return s
	}
	if c := strings.TrimSpace(string(e.Code)); c != "" && c != "null" && !strings.HasPrefix(c, "\"") {
		return c
	}
	return e.Type
}

type chunk struct {
	Choices []struct {
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
		Message *struct {
			Content string `json:"content"`
		} `json:"message"`
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *usage          `json:"usage"`
	Error json.RawMessage `json:"error"`
}

// errorReason names a stream's error event: its code or type when it is an OpenAI error
// object, "unknown" for anything else (servers also send bare strings), cut to a bounded
// length because it becomes a report key.
func errorReason(raw json.RawMessage) string {
	var e apiError
	r := ""
	if json.Unmarshal(raw, &e) == nil {
		r = e.reason()
	}
	if r == "" {
		return "unknown"
	}
	if len(r) > 64 {
		r = r[:64]
	}
	return r
}

// maxSSELine bounds one SSE event (or non-streamed body) from the server.
const maxSSELine = 1 << 20

// streamStats is what one SSE response stream said.
type streamStats struct {
	first, last time.Time // first and last content chunk
	itl         []time.Duration
	chunks      int
	finished    bool // a finish_reason or [DONE] was seen
	usage       *usage
	errReason   string // set by a mid-stream error event
	decodeErr   error
	output      strings.Builder
}

// consumeStream reads an SSE chat stream, timing content chunks with now.
func consumeStream(body io.Reader, now func() time.Time) *streamStats {
	st := &streamStats{}
	r := openai.NewSSEReader(body)
	r.SetMaxEventBytes(maxSSELine)
	for {
		data, err := r.Next()
		if err == io.EOF {
			st.finished = st.finished || r.SawDone()
			return st
		}
		if err != nil {
			st.decodeErr = err
			return st
		}
		var c chunk
		if err := json.Unmarshal(data, &c); err != nil {
			st.decodeErr = err
			return st
		}
		if len(c.Error) > 0 && string(c.Error) != "null" {
			st.errReason = errorReason(c.Error)
			return st
		}
		if c.Usage != nil {
			st.usage = c.Usage
		}
		for _, ch := range c.Choices {
			text := ch.Delta.Content + ch.Text
			if ch.Message != nil {
				text += ch.Message.Content
			}
			if text != "" {
				t := now()
				if st.chunks == 0 {
					st.first = t
				} else {
					st.itl = append(st.itl, t.Sub(st.last))
				}
				st.last = t
				st.chunks++
				st.output.WriteString(text)
			}
			if ch.FinishReason != nil && *ch.FinishReason != "" {
				st.finished = true
			}
		}
	}
}

// consumeJSON reads a non-streamed chat completion: one body that is both first and last token.
func consumeJSON(body io.Reader, now func() time.Time) *streamStats {
	st := &streamStats{}
	b, err := io.ReadAll(io.LimitReader(body, maxSSELine))
	if err != nil {
		st.decodeErr = err
		return st
	}
	var c chunk
	if err := json.Unmarshal(b, &c); err != nil {
		st.decodeErr = err
		return st
	}
	if len(c.Error) > 0 && string(c.Error) != "null" {
		st.errReason = errorReason(c.Error)
		return st
	}
	st.usage, st.finished = c.Usage, true
	for _, ch := range c.Choices {
		if ch.Message != nil {
			st.output.WriteString(ch.Message.Content)
		}
		st.output.WriteString(ch.Text)
	}
	if st.output.Len() > 0 {
		st.first, st.last, st.chunks = now(), now(), 1
	}
	return st
}

// parseRetryAfter reads Retry-After (seconds or an HTTP date) or retry-after-ms.
func parseRetryAfter(h http.Header, now time.Time) (time.Duration, bool) {
	if v := h.Get("Retry-After-Ms"); v != "" {
		if ms, err := strconv.ParseFloat(v, 64); err == nil && ms >= 0 {
			return time.Duration(ms * float64(time.Millisecond)), true
		}
	}
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0, false
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil && s >= 0 {
		return time.Duration(s * float64(time.Second)), true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(0, t.Sub(now)), true
	}
	return 0, false
}

// client sends requests.
type client struct {
	http       *http.Client
	apiKey     string
	fittedTTFT bool
	// naturalLengths lets the engine end a reply before max_tokens (Config.NaturalLengths).
	naturalLengths bool
}

// attempt sends one request for model to target and measures it from start. A context error
// ends it as a failure.
func (c *client) attempt(ctx context.Context, target, model string, it *Item, msgs []Message, start time.Time, final bool) Result {
	res := Result{Kind: it.Kind, Class: it.Class}
	fail := func(kind string) Result {
		res.Outcome, res.Failure = Failed, kind
		res.E2E = time.Since(start)
		return res
	}
	req := chatRequest{Model: model, Messages: msgs, MaxTokens: it.MaxTokens, IgnoreEOS: !c.naturalLengths, Stream: true}
	req.StreamOptions.IncludeUsage = true
	body, err := json.Marshal(req)
	if err != nil {
		return fail(FailDecode)
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(target, "/")+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return fail(FailTransport)
	}
	h := hreq.Header
	h.Set("Content-Type", "application/json")
	h.Set("Accept", "text/event-stream")
	if c.apiKey != "" {
		h.Set("Authorization", "Bearer "+c.apiKey)
	}
	prio := "normal"
	if it.Class.Priority != 0 {
		prio = strconv.Itoa(it.Class.Priority)
	}
	h.Set("X-Kvmesh-Priority", prio)
	if it.Class.TTFT > 0 && !c.fittedTTFT {
		h.Set("X-Kvmesh-TTFT-SLO", it.Class.TTFT.String())
	}
	if it.Class.TPOT > 0 {
		h.Set("X-Kvmesh-TPOT-SLO", it.Class.TPOT.String())
	}
	if it.Agent != nil {
		h.Set("X-Kvmesh-Agent", it.Agent.ID)
		if final {
			h.Set("X-Kvmesh-Agent-Final", "1")
		}
	}
	resp, err := c.http.Do(hreq)
	if err != nil {
		return fail(ctxFailure(ctx, FailTransport))
	}
	defer func() {
		// Drain a little so the connection can be reused; a long stream is just closed.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
	}()
	res.Node, res.PrefillNode = resp.Header.Get("X-Kvmesh-Node"), resp.Header.Get("X-Kvmesh-Prefill-Node")
	if c.fittedTTFT {
		res.TTFTTarget = headerDuration(resp.Header, "X-Kvmesh-TTFT-Target")
	}
	if resp.StatusCode != http.StatusOK {
		res.Outcome, res.Status = Refused, resp.StatusCode
		res.RetryAfter, res.HasRetryAfter = parseRetryAfter(resp.Header, time.Now())
		res.Reason = resp.Header.Get("X-Kvmesh-Reason")
		if res.Reason == "" {
			var eb struct {
				Error *apiError `json:"error"`
			}
			if b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10)); err == nil && json.Unmarshal(b, &eb) == nil && eb.Error != nil {
				res.Reason = eb.Error.reason()
			}
		}
		if res.Reason == "" {
			res.Reason = "unknown"
		}
		res.E2E = time.Since(start)
		return res
	}
	var st *streamStats
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		// A server that ignores stream: the whole answer is one chunk.
		st = consumeJSON(resp.Body, time.Now)
	} else {
		st = consumeStream(resp.Body, time.Now)
	}
	end := time.Now()
	res.E2E = end.Sub(start)
	res.Output = st.output.String()
	switch {
	case ctx.Err() != nil:
		return fail(ctxFailure(ctx, FailTransport))
	case st.errReason != "":
		return fail(FailStream + ":" + st.errReason)
	case st.decodeErr != nil:
		switch {
		case errors.Is(st.decodeErr, openai.ErrEventTooLarge) || isJSONError(st.decodeErr):
			return fail(FailDecode)
		case errors.Is(st.decodeErr, io.ErrUnexpectedEOF): // the body ended inside an event
			return fail(FailTruncated)
		}
		return fail(FailTransport)
	case !st.finished:
		return fail(FailTruncated)
	}
	res.Outcome = Completed
	res.TTFT = res.E2E
	if st.chunks > 0 {
		res.TTFT = st.first.Sub(start)
	}
	res.ITL = st.itl
	res.OutputTokens = st.chunks
	if u := st.usage; u != nil {
		res.OutputTokens = u.CompletionTokens
		res.PromptTokens = u.PromptTokens
		if u.PromptTokensDetails != nil {
			res.CachedTokens = u.PromptTokensDetails.CachedTokens
		}
	}
	return res
}

func isJSONError(err error) bool {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	return errors.As(err, &se) || errors.As(err, &te)
}

// ctxFailure names a failure caused by ctx, else returns def.
func ctxFailure(ctx context.Context, def string) string {
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return FailTimeout
	case ctx.Err() != nil:
		return FailCanceled
	}
	return def
}

// headerDuration parses a Go duration header; absent or malformed is 0 (the class's target).
func headerDuration(h http.Header, name string) time.Duration {
	d, err := time.ParseDuration(h.Get(name))
	if err != nil || d < 0 {
		return 0
	}
	return d
}
