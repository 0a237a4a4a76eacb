package attempt

import "time"

// Codes the planner ends a request with.
const (
	// CodeWrongRole is an owner's refusal (503) of a request its role or engine does not run.
	// A decode node that said it is never offered the same handover again.
	CodeWrongRole = "wrong_role"
	// CodeDecodeUnavailable (503) ends a split request whose prompt was prefilled but whose
	// handover every decode node tried refused (no room).
	CodeDecodeUnavailable = "decode_unavailable"
	// CodeDecodeFailed (502) ends a split request whose handover no decode node tried could
	// take: an attempt failed (unreachable, or its engine failed before the first token).
	CodeDecodeFailed = "decode_failed"
)

// Cand is a candidate as the planner sees it.
type Cand struct {
	Name string
	Peer int  // the executor's index of the candidate's peer
	Self bool // this node
	Pair bool // a prefill node and a decode node (Whole's candidates only)
}

// Kind is what a step does.
type Kind uint8

// The kinds of step.
const (
	_          Kind = iota
	RunLocal        // run the candidate on this node's engine
	Forward         // forward the request to the candidate, a peer, and relay its answer
	RunPair         // run the candidate, a pair: its prefill half (Prefill), then its decode half (Decode)
	RunPrefill      // run the prefill half on the candidate, this node or a peer
	RunDecode       // offer the handover to the candidate, this node or a peer, to decode
	// Widen offers the waiting handover to every decode node: the executor adds them (Widen)
	// and reports Widened.
	Widen
	// WaitDecodeRoom waits Step.Wait (or until the client leaves) and reports Waited.
	WaitDecodeRoom
	Answered // the client has its answer: the journey ends
	Handed   // (Prefill) the candidate handed the prompt's KV over: the decode half is next
	Requeue  // every owner refused: the request goes back to the waiting room
	Fail     // the request ends with Step.Code
	Gone     // the client left: the request ends unanswered
	// Migrate moves a request whose owner failed mid-response to another node, as a
	// continuation of what the client was sent.
	Migrate
)

var kindNames = [...]string{"", "run_local", "forward", "run_pair", "run_prefill", "run_decode", "widen",
	"wait_decode_room", "answered", "handed", "requeue", "fail", "gone", "migrate"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "kind?"
}

// Step is what the executor does next.
type Step struct {
	Kind Kind
	// Cand is the candidate of an attempt (RunLocal, Forward, RunPair, RunPrefill, RunDecode),
	// or the one that answered (Answered, Handed), as an index into the planner's list.
	Cand int
	// Rerun: the attempt follows another of its half (RunPrefill, RunDecode) or a failure
	// (Whole): the request's first-token deadline is renewed if it has passed.
	Rerun bool
	// Budget: the attempt is a retry after a failure and must be allowed by the retry budget
	// first; when the budget says no, the executor reports BudgetSpent without running it.
	Budget bool
	// Reserve: the attempt is a fallback after the decision's choice, whose reservation it
	// takes over.
	Reserve bool
	// Stick: (Answered) the request's agent sticks to the candidate.
	Stick bool
	// Code is a Fail's code.
	Code string
	// Wait is how long WaitDecodeRoom waits.
	Wait time.Duration
}

// Outcome is how an attempt ended.
type Outcome uint8

// The outcomes of an attempt.
const (
	_           Outcome = iota
	Ran                 // the client was answered (by the candidate, or because the request is invalid)
	Refused             // the owner refused before the first byte
	Failed              // the attempt failed before the first token: Result.Code says how
	Paused              // the agent's window holds the step (its home is the candidate)
	ClientGone          // the client left
	BudgetSpent         // the retry budget allows no retry: nothing ran
	HandedOver          // (Prefill) the candidate handed the prompt's KV over
	Widened             // (Widen) the decode nodes were added
	Waited              // (WaitDecodeRoom) the wait ended
	// Broke: (RunLocal, RunDecode on this node) this node's engine failed after the client's
	// response began: what was sent stands, and the rest must run elsewhere.
	Broke
)

// Result is what became of a step.
type Result struct {
	Outcome Outcome
	// Code is a failure's code: the owner unreachable, or its engine's failure code (also
	// on Paused, when the attempt failed and an earlier refusal had paused the agent).
	Code string
	// Reason is the last reason an owner gave for not running the request (its refusal or
	// engine code), as the executor last heard it.
	Reason string
	// Late: (Ran) the owner's engine gave no first token within the request's queue TTL, so
	// the owner is no home for its agent.
	Late bool
	// Now is when the step ended (RunDecode, Widen, WaitDecodeRoom).
	Now time.Time
}

// Failures are the attempts of one request that failed (its owner unreachable, or the owner's
// engine failing before the first token) as opposed to refused, over all its dispatches.
type Failures struct {
	N        int    // failed attempts so far
	Code     string // the last one's
	Owner    string // the node it failed on
	Retrying bool   // the last attempt failed: the next one is a retry
}

// Add records a failed attempt on owner.
func (f *Failures) Add(code, owner string) {
	f.N++
	f.Code, f.Owner, f.Retrying = code, owner, true
}

// Renew is a request's first-token deadline for a rerun at now: due (the first-token deadline
// of ttl), renewed once (renewed reports it) when it has passed. A failed owner's engine had
// given the first token, or the owner went silent, so the rerun, like a migrated stream's
// continuation, has a wait of its own; once only, so that a chain of silent owners cannot hold
// the client past twice the TTL. A zero due is no deadline.
func Renew(now, due time.Time, ttl time.Duration, renewed bool) (time.Time, bool) {
	if !due.IsZero() && !renewed && !now.Before(due) {
		return now.Add(ttl), true
	}
	return due, renewed
}

// Move is the step for a request whose owner (or its engine) failed mid-response, the client's answer begun:
// Gone when the client left, Migrate while it has moved fewer than limit times, else Fail
// (the client's response ends with an error).
func Move(clientGone bool, moves, limit int) Step {
	switch {
	case clientGone:
		return Step{Kind: Gone}
	case moves < limit:
		return Step{Kind: Migrate}
	}
	return Step{Kind: Fail}
}
