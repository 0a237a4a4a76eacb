package journey

import (
	"time"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/admit/plan"
	"github.com/kvmesh/kvmesh/node/attempt"
	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/meshview"
	"github.com/kvmesh/kvmesh/node/openai"
	"github.com/kvmesh/kvmesh/node/relay"
)

// Request is a decoded request ready to admit and run: the same function builds it at the
// ingress and, from the forwarded body, on the owner, so both agree on its blocks (and on its
// prompt tokens as far as their learned bytes per token agree).
type Request struct {
	Endpoint     engine.Endpoint
	Stream       bool
	IncludeUsage bool
	User         string
	Model        engine.Model
	Req          engine.Request
	Adm          admit.Request // the fields admission checks (the node adds headers and identity)
	AgentFinal   bool          // HeaderAgentFinal: the agent's last step
	Parked       Parking       // the home whose agent window parked this step, while it waits here
	// CapField is the body's name for the output cap admission calls max_tokens: chat's
	// max_completion_tokens when the client sent it, else "" (max_tokens).
	CapField string
	// Due is when the engine that runs the request must have given its first token (a prefill
	// half its handover): its queue TTL, TTL, after its arrival at the ingress (the first-token
	// bound).
	// Zero: no bound (kvmesh engine, which is an engine like vLLM; a forward from a node
	// built before the bound).
	Due time.Time
	TTL time.Duration
	// Renewed: Due was renewed once for a rerun (renewDue).
	Renewed bool
	// A request whose owner failed mid-response moves on (a migration): Origin is the client's
	// request a continuation continues (nil for the client's own), Migrations counts the
	// moves begun for the client's request, and Exclude lists the owners that failed it.
	Origin     *Request
	Migrations int
	Exclude    []string
	// PartTokens are the tokens the prompt's images and audio stand for (their placeholders'
	// share of the rendered prompt).
	PartTokens int
	// MoveBreak: the caller of a local run moves the request elsewhere when this node's
	// engine fails (Outcome.Broke), so the local run leaves that failure unwritten.
	MoveBreak bool
	// AdapterRouted: kvmesh_route_adapter_requests_total counted the request (decide).
	AdapterRouted bool
	// Native is a Messages request's body as the client sent it, for an engine that serves
	// the Messages API natively (native.go); nil for every other request.
	Native []byte
}

// Parking is the home whose agent window parked a step, kept by the ingress while the step
// waits, so that it renews the home's lease on the agent's place and tells the home when it
// gives the step up. The zero value: no window parked the step.
type Parking struct {
	Home string // the home's node name
	Addr string // its QUIC address; unused when the home is this node
}

// Outcome is how one request ended, for the reconciling counters.
type Outcome struct {
	Completed bool
	Code      string // error code when not completed
	Refused   bool   // refused before the first byte (else failed)
	// Broke is the failure of this node's engine that a local run left unwritten
	// (Request.MoveBreak): before anything reached the client (Begun false), or after the
	// response began (a stream).
	Broke *openai.Error
	Begun bool
}

// Ticket is one request's pass through the planner: its view and its plan.
type Ticket struct {
	View meshview.View
	plan.Plan
}

// Result is how a dispatch ended: an outcome written to the client, or (Requeue) the
// candidates refused before the first byte and nothing was written. While the dispatch runs
// it is the executor's scratch: the last attempt's codes and the answer's outcome.
type Result struct {
	Outcome  Outcome
	Requeue  bool
	LastCode string
	// FailCode is set by forward when its attempt failed rather than was refused: the owner
	// unreachable (node.CodeOwnerUnreachable) or its engine's failure code.
	FailCode string
	// Broke is the failure of this node's engine mid-response (attempt.Broke), and CS the
	// client's stream it broke.
	Broke *openai.Error
	CS    *relay.Stream
}

// RenewDue gives a request about to run again after a failed attempt its queue TTL afresh,
// once, when that attempt ended past its deadline (attempt.Renew): the failed owner's engine
// had given the first token (else the owner would have ended the request with 504
// engine_timeout), or the owner went silent.
func (p *Request) RenewDue(now time.Time) {
	p.Due, p.Renewed = attempt.Renew(now, p.Due, p.TTL, p.Renewed)
}
