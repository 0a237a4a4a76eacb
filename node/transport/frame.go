package transport

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"time"
)

// Version is the frame format version this package writes. It reads Version and
// PreviousVersion, and writes PreviousVersion to a peer that refuses Version (Transport.Forward).
// A peer on any other version is refused at its first header, never half-understood: see
// ErrVersion.
const Version = 3

// PreviousVersion is the frame version before Version, read and, to a peer that speaks only it,
// written for one release after Version's: the release after that drops it. Its optional
// request fields are positional, each marked by a bit of a flags byte (headerFields' flag).
const PreviousVersion = 2

// Wire limits. They bound what a reader allocates before it has judged the peer, so they are
// constants of the format rather than per-node settings that two peers could disagree on.
const (
	// MaxHeaderBytes bounds an encoded Header (room for 64Ki block hashes plus strings).
	MaxHeaderBytes = 1 << 20
	// MaxDataFrameBytes bounds one data frame; larger writes are split.
	MaxDataFrameBytes = 1 << 20
	// MaxAnswerBytes bounds an Accept, Refuse or end frame.
	MaxAnswerBytes = 256 << 10
	// MaxBlocks bounds Header.Blocks.
	MaxBlocks = 1 << 16
	// MaxAcceptHeaders bounds the headers of an Accept.
	MaxAcceptHeaders = 64
	// MaxStateBytes bounds Refusal.State.
	MaxStateBytes = 64 << 10

	maxShortString = 4 << 10
	// MaxAgentIDBytes is the longest agent id a forward carries (the ingress's scoped id).
	MaxAgentIDBytes = maxShortString
	maxHeaderKey    = 256
	maxHeaderValue  = 8 << 10
	maxHops         = 255
)

// Frame types. A stream carries, client to owner: header, body, FIN; owner to client: accept
// then data* then end, or a single refuse.
const (
	frameHeader byte = 1
	frameBody   byte = 2
	frameAccept byte = 3
	frameRefuse byte = 4
	frameData   byte = 5
	frameEnd    byte = 6
)

// maxFrameHead is a frame's type byte plus its length as a uvarint.
const maxFrameHead = 1 + binary.MaxVarintLen64

// ErrMalformed is wrapped by every decoding error but ErrVersion and ErrKind.
var ErrMalformed = errors.New("transport: malformed frame")

// ErrVersion is returned for a header of a frame version other than Version. An owner answers
// such a header with a refusal of status StatusVersion and code CodeVersion instead of running
// it, and that *Refusal is errors.Is ErrVersion on the ingress.
var ErrVersion = errors.New("transport: unsupported frame version")

// ErrKind is returned for a header of a Kind, or a request of an Endpoint, that this version
// does not know. An owner answers such a header with a refusal of status StatusKind and code
// CodeKind, and that *Refusal is errors.Is ErrKind on the ingress.
var ErrKind = errors.New("transport: unknown header kind")

// The owner's refusals of a header it cannot read. The refuse frame's layout is the same in
// every frame version so far, so the ingress can read why even when it speaks another version.
const (
	// StatusVersion and CodeVersion refuse a header of another frame version.
	StatusVersion = 505 // HTTP Version Not Supported
	CodeVersion   = "frame_version"
	// StatusKind and CodeKind refuse a header of an unknown Kind or Endpoint.
	StatusKind = 501 // Not Implemented
	CodeKind   = "unknown_kind"
)

// Kind says what a forward stream carries. The zero Kind is KindRequest.
type Kind uint8

const (
	// KindRequest is an inference request: the body is the client's JSON for Endpoint, and
	// the request fields of Header are set.
	KindRequest Kind = iota
	// KindAgentRenew renews the lease of a step of agent AgentID that the ingress keeps parked for the window
	// of the owner (the agent's home); the owner may wait up to RenewWait for the agent to be
	// let in before it accepts. The body is empty.
	KindAgentRenew
	// KindAgentGiveUp says that the ingress gave up a step of agent AgentID without running
	// it. The body is empty.
	KindAgentGiveUp

	numKinds // the number of kinds this version knows
)

// String returns the kind's name, e.g. "agent-renew".
func (k Kind) String() string {
	switch k {
	case KindRequest:
		return "request"
	case KindAgentRenew:
		return "agent-renew"
	case KindAgentGiveUp:
		return "agent-give-up"
	default:
		return fmt.Sprintf("kind(%d)", uint8(k))
	}
}

// Endpoint is the OpenAI API a request came in on. The zero Endpoint is EndpointChat.
type Endpoint uint8

const (
	// EndpointChat is POST /v1/chat/completions.
	EndpointChat Endpoint = iota
	// EndpointCompletions is POST /v1/completions.
	EndpointCompletions
	// EndpointEmbeddings is POST /v1/embeddings: the body is the client's embeddings request;
	// the ingress leaves Blocks, Deadline, Waited, TTFTSLO, TPOTSLO and AgentFinal zero.
	EndpointEmbeddings
	// EndpointResponses is POST /v1/responses, passed to the owner's external engine; the
	// request fields are unused as for EndpointEmbeddings.
	EndpointResponses
	// EndpointMessages is POST /v1/messages, for an owner whose engine serves the Anthropic
	// Messages API natively: the body is the client's Messages request, and the request fields
	// are those of its translation to chat, which the ingress routed and admitted.
	EndpointMessages

	// numEndpoints is the number of endpoints this version knows. A peer built before an
	// endpoint was added refuses its requests with StatusKind and CodeKind, so a new endpoint
	// needs no new Version: the ingress tries the next candidate.
	numEndpoints
)

// String returns the endpoint's name, e.g. "chat".
func (e Endpoint) String() string {
	switch e {
	case EndpointChat:
		return "chat"
	case EndpointCompletions:
		return "completions"
	case EndpointEmbeddings:
		return "embeddings"
	case EndpointResponses:
		return "responses"
	case EndpointMessages:
		return "messages"
	default:
		return fmt.Sprintf("endpoint(%d)", uint8(e))
	}
}

// Header is what the ingress node tells the owner about a forward, ahead of its body. The
// fields up to Ingress are common to every kind; the others belong to one kind and must be
// zero in the others.
type Header struct {
	// Version is the frame version; zero when encoding means the current Version.
	Version int
	// Kind is what the stream carries.
	Kind Kind
	// RequestID is the ingress node's id for the request (for logs on both sides).
	RequestID string
	// Hops counts forwards so far, so the owner can enforce the hop limit.
	Hops int
	// Priority is the admitted priority (negative is sheddable).
	Priority int
	Tenant   string
	// Deadline is the client's deadline; zero means none.
	Deadline time.Time
	AgentID  string
	// Blocks are the prompt's chained block hashes, computed once at the ingress.
	Blocks []uint64
	// Ingress is the name of the node the client reached.
	Ingress string

	// Endpoint is the API the request came in on (KindRequest).
	Endpoint Endpoint
	// Waited is how long the request's SLO clock has run at the ingress: since its arrival,
	// or since its agent window let it in (KindRequest).
	Waited time.Duration
	// TTFTSLO and TPOTSLO are the request's SLOs as the ingress resolved them (KindRequest).
	TTFTSLO time.Duration
	TPOTSLO time.Duration
	// AgentFinal marks an agent's last step: its home ends the agent once the step is done
	// (KindRequest).
	AgentFinal bool
	// TraceParent and TraceState are the request's W3C trace context, the values of the
	// traceparent and tracestate HTTP headers, so that the owner continues the ingress's
	// trace; empty when the request has none. TraceState goes only with a TraceParent
	// (KindRequest).
	TraceParent string
	TraceState  string
	// Resume marks a continuation: a request whose first owner failed mid-response, which the
	// ingress sends on with the text already streamed in its body; nil for every other
	// request (KindRequest).
	Resume *Resume
	// Prefill marks the prefill half of a disaggregated request: the owner computes the
	// prompt's KV and answers with its Handover (HandoverContentType, the body
	// AppendHandover's), not text (KindRequest).
	Prefill bool
	// Handover marks the decode half of a disaggregated request: the prefill owner's record of
	// the prompt's KV, which the owner decodes from instead of prefilling; nil for every other
	// request. A header has Prefill or Handover, not both (KindRequest).
	Handover *Handover
	// QueueTTL is the request's queue TTL as the ingress resolved it (its queue.ttl, shortened
	// by the client's X-Kvmesh-Queue-TTL), and QueueTTLLeft what was left of it, counted from
	// the request's arrival at the ingress, when the ingress sent the header: the owner must
	// have the request's first token (a prefill half's handover) within QueueTTLLeft of
	// reading the header, else it cancels its engine's request and answers 504
	// engine_timeout. Both zero: no bound (a forward from a node before the bound); else
	// 0 < QueueTTLLeft <= QueueTTL (KindRequest). A migrated stream's continuation carries its
	// own, counted from the migration.
	QueueTTL     time.Duration
	QueueTTLLeft time.Duration
	// Delegate asks the receiver to route the request rather than run it: the ingress serves
	// none of the request's model, so it hands the decision to a member of the model's domain,
	// which admits, routes and forwards it (or runs it) as its own ingress would, and never
	// delegates it again. Nil for every other request (KindRequest). Optional: a receiver
	// that does not know it runs the request, which it can, serving the model.
	Delegate *Delegation

	// RenewWait is how long the home may wait for the agent to be let into its window before
	// it answers (KindAgentRenew).
	RenewWait time.Duration
}

// Delegation is what a delegated request's receiver needs besides the request: whether the
// client asked for the routing decision's explanation (X-Kvmesh-Explain).
type Delegation struct {
	Explain bool
}

// Resume is what the owner's engine needs to continue another owner's generation where the
// client's stream stopped (the node's engine.Resume): the original request's seed and prompt
// hash, and the chunks and bytes of text sent, and its prompt tokens, each at most MaxInt32.
type Resume struct {
	Seed, PromptHash            uint64
	Tokens, Bytes, PromptTokens int
}

// Handover is the wire form of a prefill owner's record of a request's prompt KV (the node's
// engine.Handover, docs/design/disaggregation.md): the prompt tokens whose KV was computed,
// how many of them its prefix cache held, the KV's bytes, when it was ready in the prefill
// engine's clock, and an external engine's own transfer parameters, opaque here (at most
// MaxHandoverParams bytes). The prompt's block hashes are not carried: they are the request's
// own (Header.Blocks, and what the owner computes from the body). Counts are at most
// MaxInt32.
type Handover struct {
	PromptTokens, CachedTokens int
	KVBytes                    int64
	ReadyAt                    time.Duration
	Params                     []byte
}

// MaxHandoverParams bounds Handover.Params.
const MaxHandoverParams = 64 << 10

// HandoverContentType is the content type of a prefill owner's answer: status 200 and a body
// of AppendHandover's encoding.
const HandoverContentType = "application/x-kvmesh-handover"

// AppendHandover appends h's encoding: its prompt and cached tokens (uvarints), its KV bytes
// and ready time (uvarints, the time in nanoseconds) and its params (a uvarint length and the
// bytes). It is the same in a header (the handover field, headerFields) and in a prefill owner's answer.
func AppendHandover(dst []byte, h *Handover) ([]byte, error) {
	if err := checkHandover(h); err != nil {
		return dst, err
	}
	e := encoder{b: dst}
	e.uvarint(uint64(h.PromptTokens))
	e.uvarint(uint64(h.CachedTokens))
	e.uvarint(uint64(h.KVBytes))
	e.uvarint(uint64(h.ReadyAt))
	e.bytes(h.Params)
	return e.b, nil
}

// DecodeHandover decodes a prefill owner's answer body strictly (ErrMalformed).
func DecodeHandover(p []byte) (*Handover, error) {
	d := decoder{b: p}
	h := d.handover()
	d.end("handover")
	if d.err != nil {
		return nil, d.err
	}
	return h, nil
}

func checkHandover(h *Handover) error {
	if h.PromptTokens < 0 || h.PromptTokens > maxResumeCount || h.CachedTokens < 0 || h.CachedTokens > maxResumeCount ||
		h.KVBytes < 0 || h.ReadyAt < 0 || len(h.Params) > MaxHandoverParams {
		return fmt.Errorf("%w: handover out of range", ErrMalformed)
	}
	return nil
}

// maxResumeCount bounds Resume's counts.
const maxResumeCount = math.MaxInt32

// checkHeader rejects the numbers of h that its encoding could not carry, and fields of
// another kind than h's, which its encoding would drop.
func checkHeader(v int, h Header) error {
	switch {
	case v != Version && v != PreviousVersion:
		return fmt.Errorf("%w %d (this node speaks %d and %d)", ErrVersion, v, Version, PreviousVersion)
	case h.Kind >= numKinds:
		return fmt.Errorf("%w %d", ErrKind, h.Kind)
	case h.Kind == KindRequest && h.Endpoint >= numEndpoints:
		return fmt.Errorf("%w: request endpoint %d", ErrKind, h.Endpoint)
	case h.Hops < 0 || h.Hops > maxHops:
		return fmt.Errorf("%w: hops %d out of range", ErrMalformed, h.Hops)
	case h.Priority < math.MinInt32 || h.Priority > math.MaxInt32:
		return fmt.Errorf("%w: priority %d out of range", ErrMalformed, h.Priority)
	case len(h.Blocks) > MaxBlocks:
		return fmt.Errorf("%w: %d blocks (> %d)", ErrMalformed, len(h.Blocks), MaxBlocks)
	case h.Waited < 0 || h.TTFTSLO < 0 || h.TPOTSLO < 0 || h.RenewWait < 0:
		return fmt.Errorf("%w: negative duration", ErrMalformed)
	case h.Kind != KindRequest && (h.Endpoint != 0 || h.Waited != 0 || h.TTFTSLO != 0 || h.TPOTSLO != 0 || h.AgentFinal ||
		h.TraceParent != "" || h.TraceState != "" || h.Resume != nil || h.Prefill || h.Handover != nil || h.QueueTTL != 0 || h.QueueTTLLeft != 0 ||
		h.Delegate != nil):
		return fmt.Errorf("%w: request fields in a %v header", ErrMalformed, h.Kind)
	case h.TraceState != "" && h.TraceParent == "":
		return fmt.Errorf("%w: a trace state without a trace parent", ErrMalformed)
	case h.Kind != KindAgentRenew && h.RenewWait != 0:
		return fmt.Errorf("%w: renew wait in a %v header", ErrMalformed, h.Kind)
	case h.Resume != nil && !resumeCountsOK(h.Resume):
		return fmt.Errorf("%w: resume counts out of range", ErrMalformed)
	case h.Prefill && h.Handover != nil:
		return fmt.Errorf("%w: a prefill with a handover", ErrMalformed)
	case (h.QueueTTL != 0 || h.QueueTTLLeft != 0) && !(h.QueueTTLLeft > 0 && h.QueueTTLLeft <= h.QueueTTL):
		return fmt.Errorf("%w: queue TTL %v with %v left", ErrMalformed, h.QueueTTL, h.QueueTTLLeft)
	case h.Handover != nil:
		return checkHandover(h.Handover)
	}
	return nil
}

func resumeCountsOK(r *Resume) bool {
	for _, n := range []int{r.Tokens, r.Bytes, r.PromptTokens} {
		if n < 0 || n > maxResumeCount {
			return false
		}
	}
	return true
}

// appendFrameHead appends a frame's type and payload length.
func appendFrameHead(dst []byte, typ byte, n int) []byte {
	return binary.AppendUvarint(append(dst, typ), uint64(n))
}

// readFrameHead reads a frame's type and length; limit is checked per type so a peer cannot
// make the reader allocate more than the format allows.
func readFrameHead(r *bufio.Reader) (byte, int, error) {
	typ, err := r.ReadByte()
	if err != nil {
		return 0, 0, err
	}
	n, err := binary.ReadUvarint(r)
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return 0, 0, fmt.Errorf("%w: frame length: %w", ErrMalformed, err)
	}
	var limit uint64
	switch typ {
	case frameHeader:
		limit = MaxHeaderBytes
	case frameBody:
		limit = math.MaxInt32
	case frameAccept, frameRefuse, frameEnd:
		limit = MaxAnswerBytes
	case frameData:
		limit = MaxDataFrameBytes
	default:
		return 0, 0, fmt.Errorf("%w: unknown frame type %d", ErrMalformed, typ)
	}
	if n > limit {
		return 0, 0, fmt.Errorf("%w: frame type %d of %d bytes (> %d)", ErrMalformed, typ, n, limit)
	}
	return typ, int(n), nil
}

// readFrame reads a whole frame of at most limit payload bytes. io.EOF means the stream ended
// cleanly before the frame started; a frame cut short is io.ErrUnexpectedEOF.
func readFrame(r *bufio.Reader, limit int) (byte, []byte, error) {
	typ, n, err := readFrameHead(r)
	if err != nil {
		return 0, nil, err
	}
	if n > limit {
		return 0, nil, fmt.Errorf("%w: frame type %d of %d bytes (> %d)", ErrMalformed, typ, n, limit)
	}
	// Memory grows with the bytes that actually arrive, not with what the length claims.
	buf := bytes.NewBuffer(make([]byte, 0, min(n, 64<<10)))
	if m, err := io.CopyN(buf, r, int64(n)); err != nil {
		if errors.Is(err, io.EOF) && m < int64(n) {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	return typ, buf.Bytes(), nil
}
