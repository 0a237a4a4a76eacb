package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kvmesh/kvmesh/node/openai"
)

// Endpoint says which OpenAI API a request came in on.
type Endpoint uint8

const (
	// Chat is POST /v1/chat/completions.
	Chat Endpoint = iota
	// Completion is POST /v1/completions.
	Completion
)

// Request is one generation, decoded and validated by the node.
type Request struct {
	ID       string
	Endpoint Endpoint
	Model    string
	// Body is the client's JSON request. External engines forward it (with streaming forced
	// on); the embedded engine ignores it.
	Body []byte
	// Prompt is the rendered prompt text (kvindex.RenderChat for chat, a message's images and
	// audio as their placeholders); PromptTokens counts it under kvindex's tokenisation and
	// Blocks holds its chained block hashes.
	Prompt       []byte
	PromptTokens int
	Blocks       []uint64
	// MaxTokens is the cap on generated tokens (≥ 1).
	MaxTokens int
	// Stop sequences end the output early; the stop text itself is not returned.
	Stop []string
	// Seed makes the embedded engine's output text deterministic per request.
	Seed uint64
	// Priority is the admitted request's priority, in kvmesh's convention: higher is more
	// important, 0 normal, negative sheddable. The embedded engine schedules by it (vLLM's
	// --scheduling-policy priority); an external vLLM is sent it negated, in its priority
	// field, when the node is configured to (openai.Config.Priority).
	Priority int
	// Logprobs asks for each output token's log probability, and TopLogprobs (0..20) for that
	// many of the likeliest tokens at each position: chat's logprobs and top_logprobs,
	// completions' logprobs.
	Logprobs    bool
	TopLogprobs int
	// Echo (completions) puts the prompt before the output, and its tokens before the output's
	// in the logprobs.
	Echo bool
	// Roles are the chat messages' roles in order (nil for completions), whatever they are:
	// an external engine's chat template may know roles OpenAI's API does not.
	Roles []string
	// Extra are the body's members the node does not read, in body order with their values as
	// sent (stream_options' named "stream_options.NAME"): sampling fields, structured output,
	// tools, an engine's extensions. External engines receive them in Body, but for priority,
	// which is the node's (replaced by Priority or removed: a client's would jump the engine's
	// queue past its key's cap); the embedded engine honours, accepts as no-ops, or refuses
	// each (a *ParamError; priority other than 0 among them).
	Extra []openai.Field
	// Messages, when set, is the client's Anthropic Messages body (POST /v1/messages), for an
	// engine that serves that API natively (an external engine's ServesMessages): it is sent
	// as it is, but for a max_tokens over MaxTokens, lowered to it, and answered in
	// Chunk.Raw. Body and the fields above are the equivalent chat request's, which the node
	// routed and admitted. Nil for every other request; never set with Resume, Handover or
	// PrefillOnly.
	Messages []byte
	// Resume, when set, makes the request the continuation of a generation that another node
	// began and lost mid-response (see Resume); nil for every other request.
	Resume *Resume
	// Handover, when set, carries the KV of the request's prompt, computed by a prefill
	// engine, to the engine that decodes it (disaggregated prefill and decode,
	// docs/design/disaggregation.md); nil for every other request.
	Handover *Handover
	// PrefillOnly asks the engine for the prefill half of the request alone, as a prefill-role
	// engine runs every request: its prompt's KV, then a final chunk with FinishHandover and
	// the Handover, no token. A mixed engine honours it (a mixed node is a candidate for either
	// half of a split request); a decode engine refuses it, as it does a request with a Handover.
	PrefillOnly bool
}

// Handover is what a prefill engine hands a decode engine for one request: the prompt whose
// KV it computed, and how much KV that is. A prefill-role engine returns it in the final
// Chunk of the request; the decode engine receives it in Request.Handover with the same
// request, and decodes from that KV without prefilling the prompt.
type Handover struct {
	// Blocks are the prompt's full blocks' chained hashes (kvindex), PromptTokens the prompt
	// tokens whose KV was computed.
	Blocks       []uint64
	PromptTokens int
	// CachedTokens is how many of them the prefill engine found in its prefix cache: the
	// request's Usage.CachedTokens, reported by the decode engine.
	CachedTokens int
	// KVBytes is the size of the prompt's KV: what crosses the link.
	KVBytes int64
	// ReadyAt is when the KV was complete, in the prefill engine's clock (the embedded
	// engine's simulated time).
	ReadyAt time.Duration
	// Params are an external prefill engine's own transfer parameters, opaque to kvmesh
	// (vLLM's kv_transfer_params as its prefill server answered them, a JSON object of at
	// most MaxHandoverParams bytes): the decode engine's request carries them. Nil for the
	// embedded engine's handover.
	Params []byte
}

// MaxHandoverParams bounds Handover.Params (the forward header's limit).
const MaxHandoverParams = 64 << 10

// Resume describes the generation a request continues: one whose node failed after it had
// sent part of its output. The node builds the continuation: its prompt already ends with the
// text sent (for chat, as a final assistant message to continue, not a new turn), and its
// MaxTokens is what is left of the original's. The engine generates what follows that text,
// and its Usage counts the whole generation, as if it had never broken: PromptTokens the
// original prompt's, CompletionTokens those sent before as well as its own.
type Resume struct {
	// Seed is the original request's Seed and PromptHash the xxhash (cespare/xxhash, Sum64)
	// of its Prompt: the embedded engine draws its words from them, so a continuation draws
	// those the unbroken generation would have.
	Seed, PromptHash uint64
	// Tokens counts the chunks of text sent before (at most the tokens generated: a chunk
	// carries one token or more), Bytes the bytes of that text.
	Tokens, Bytes int
	// PromptTokens is the original prompt's token count as the node counted it (kvindex's
	// tokens, the embedded engine's own).
	PromptTokens int
}

// ParamError is an engine's refusal, before any output, of one request field: a value it
// cannot honour (Unsupported) or a malformed one. It wraps ErrRejected; the node answers 400
// unsupported_parameter or invalid_parameter, naming Param.
type ParamError struct {
	// Param is the field as the client named it: "guided_json", "messages[2].role".
	Param       string
	Unsupported bool
	// Reason says why, for the client.
	Reason string
}

func (e *ParamError) Error() string { return fmt.Sprintf("engine: %s: %s", e.Param, e.Reason) }

// Unwrap returns ErrRejected.
func (e *ParamError) Unwrap() error { return ErrRejected }

// Finish reasons, as in the OpenAI API.
const (
	FinishStop   = "stop"
	FinishLength = "length"
	// FinishToolCalls ends a generation whose output is tool calls (Chunk.ToolCalls).
	FinishToolCalls = "tool_calls"
	// FinishHandover ends a prefill-role engine's request: its prompt's KV is computed and
	// the final Chunk carries the Handover. A client never sees it.
	FinishHandover = "handover"
)

// Usage counts a finished request's tokens.
type Usage struct {
	PromptTokens     int
	CompletionTokens int
	// CachedTokens is how many prompt tokens were served from the prefix cache.
	CachedTokens int
}

// Chunk is one piece of a generation. The last chunk of a stream has FinishReason set and
// carries the request's Usage; Recv returns io.EOF after it.
type Chunk struct {
	Text         string
	FinishReason string
	Usage        *Usage
	// Logprobs are those of the tokens generated since the previous chunk, in order, when the
	// request asked for them (a token's text may be held back to a later chunk, as at a
	// possible stop sequence). An echoed prompt's tokens come first in the first chunk.
	Logprobs []Logprob
	// Handover is set on the final chunk of a prefill-role engine's request (FinishHandover).
	Handover *Handover
	// ToolCalls are pieces of the tool calls generated since the previous chunk, in the
	// streamed shape of chat completions: a call's first piece has its ID and Name, and each
	// piece adds to its Arguments (a JSON text, whole once the generation finishes
	// FinishToolCalls). Nil for every chunk of a text answer.
	ToolCalls []ToolCall
	// Raw, for a Request.Messages, is the engine's answer since the previous chunk as it sent
	// it: whole server-sent events of a stream, or the whole JSON answer. Text, FinishReason
	// and Usage are read from it.
	Raw []byte
}

// ToolCall is a piece of one tool call: Index says which call of the generation (0 for the
// first) it belongs to; ID and Name are set on the call's first piece, Arguments is the next
// fragment of its JSON arguments.
type ToolCall struct {
	Index     int
	ID        string
	Name      string
	Arguments string
}

// Logprob is one token's log probability and the likeliest tokens at its position.
type Logprob struct {
	Token   string
	Logprob float64
	// Unscored marks a token without a probability: the first token of an echoed prompt.
	Unscored bool
	// Top are the likeliest tokens at the position, most likely first: Request.TopLogprobs of
	// them (an engine may send fewer).
	Top []TopLogprob
}

// TopLogprob is one of the likeliest tokens at a position.
type TopLogprob struct {
	Token   string
	Logprob float64
}

// Stream is a generation in progress. Recv blocks for the next chunk; Close cancels the
// generation (freeing its engine work) and is safe to call more than once and after io.EOF.
type Stream interface {
	Recv() (Chunk, error)
	Close() error
}

// Model describes one model an engine serves.
type Model struct {
	Name string
	// ContextTokens is the model's context window (prompt + output), in tokens.
	ContextTokens int
	// Parent, for a LoRA adapter, is the base model it runs on (vLLM's /v1/models "parent");
	// "" for a base model. A request naming an adapter runs on its parent with the adapter.
	Parent string
	// Root is where the engine loaded the model or adapter from (vLLM's "root"); "" unknown.
	Root string
}

// State is a snapshot of an engine's load and capacity, in the units that run out.
type State struct {
	Healthy bool
	// KV cache, in blocks of BlockTokens tokens.
	BlockTokens   int
	KVBlocksTotal int
	KVBlocksUsed  int
	// HitRate is the prefix cache hit rate over recent prompt tokens, 0..1.
	HitRate float64
	// Requests running in the batch and waiting to start. An engine that knows which waiting
	// requests it skips because their LoRA adapter cannot join the batch (every slot holds a
	// running request's adapter) leaves them out of Waiting and of the queued prefill below,
	// and counts them in LoRA.Blocked: they are ahead of no request that can run, and a
	// request that cannot waits for a slot however short the queue.
	Running int
	Waiting int
	// QueuedPrefillTokens are prompt tokens admitted but not yet prefilled.
	QueuedPrefillTokens int
	// PriorityScheduling says the engine runs waiting requests by Request.Priority. Then of
	// QueuedPrefillTokens only QueuedBeforeHigh is ahead of a new high request (priority > 0):
	// the prefill of every running request, whose chunks take each step's budget before a
	// waiting request is admitted, and the waiting high requests'; and all but
	// QueuedLowWaiting (the waiting sheddable requests' prefill, priority < 0) is ahead of a
	// normal one. An engine that does not schedule by priority leaves all three zero, and all
	// of QueuedPrefillTokens is ahead of every request.
	PriorityScheduling bool
	QueuedBeforeHigh   int
	QueuedLowWaiting   int
	// PrefillTokensPerSecond is the engine's measured (or modelled) prefill throughput and
	// DecodeStepSeconds its current decode step time; admission predicts TTFT and TPOT from them.
	PrefillTokensPerSecond float64
	DecodeStepSeconds      float64
	// MaxRunning is the cap on running sequences (max_num_seqs).
	MaxRunning int
	// LoRA is the engine's adapter state; zero when it serves no adapter or does not say.
	LoRA LoRAState
}

// LoRAState is an engine's LoRA adapter state: its GPU slots and which adapters hold them.
type LoRAState struct {
	// MaxLoRAs is the number of adapters one batch may hold (vLLM --max-loras); 0 unknown.
	MaxLoRAs int
	// Resident are the adapters in GPU slots (at most MaxLoRAs), Running those of requests in
	// the batch and Waiting those of requests waiting to start; each sorted, no duplicates.
	// An engine that reports only running and waiting adapters (vLLM's
	// vllm:lora_requests_info) leaves Resident nil.
	Resident, Running, Waiting []string
	// Blocked is the waiting requests the engine skips now because their adapter cannot join
	// the batch, left out of State.Waiting and the queued prefill; 0 from an engine that does
	// not tell them apart (vLLM's metrics do not), whose queue then counts them.
	Blocked int
}

// Engine is what a node runs requests on: the embedded simulator or an external server.
// Implementations are safe for concurrent use.
type Engine interface {
	// Generate starts a generation. It returns before the first token; errors returned here
	// happened before any output (the node answers 502). ctx cancels the generation.
	Generate(ctx context.Context, req *Request) (Stream, error)
	// State returns the current load snapshot.
	State() State
	// Models lists the models served.
	Models() []Model
}

// Errors engines return from Generate.
var (
	// ErrUnavailable: the engine cannot take work now (down, restarting, draining).
	ErrUnavailable = errors.New("engine: unavailable")
	// ErrRejected: the engine refused the request (its own validation or capacity).
	ErrRejected = errors.New("engine: request rejected")
)
