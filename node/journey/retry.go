package journey

import (
	"fmt"
	"net/http"
	"time"

	"github.com/kvmesh/kvmesh/node/attempt"
	"github.com/kvmesh/kvmesh/node/metrics"
	"github.com/kvmesh/kvmesh/node/openai"
)

// AllowRetry asks the retry budget whether p may be forwarded to owner after a failed
// attempt, and counts the answer.
func (x *Executor) AllowRetry(p *Request, owner string) bool {
	if x.retries.Retry(time.Now()) {
		x.m.Retries.WithLabelValues(metrics.RetryAllowed).Inc()
		return true
	}
	x.m.Retries.WithLabelValues(metrics.RetryExhausted).Inc()
	x.log.Debug("retry budget exhausted: the request ends with its failure", "id", p.Req.ID, "next", owner)
	return false
}

// EndFailed answers a request whose attempts failed with a 502 carrying the last failure's
// code.
func (x *Executor) EndFailed(w http.ResponseWriter, f *attempt.Failures) Result {
	what := "could not be reached"
	if f.Code != CodeOwnerUnreachable {
		what = "failed before the first token (" + f.Code + ")"
	}
	msg := fmt.Sprintf("no node could run the request: %d attempt(s) failed; the last, node %s, %s", f.N, f.Owner, what)
	e := openai.NewError(http.StatusBadGateway, f.Code, msg)
	WriteRefusal(w, e, 0)
	return Result{Outcome: Outcome{Code: e.Code}}
}

// OwnerBusy records an owner whose engine answered a forward with its own 429: the owner is
// marked refused for the request's priority (not a candidate again until a newer record of
// it), and the dispatch moves on to the next candidate, or the request back to the waiting
// room, as for any refusal.
func (x *Executor) OwnerBusy(p *Request, owner string, h map[string]string, res *Result) {
	x.m.Forwards.WithLabelValues("refused").Inc()
	x.EngineBusy(p, owner, h[HeaderReason], res)
}

// EngineBusy records owner (a peer, or this node) as refused for p's priority because its
// engine answered 429 (code) before the first token: it is not a candidate again until a
// newer record of it, and the dispatch moves on.
func (x *Executor) EngineBusy(p *Request, owner, code string, res *Result) {
	x.planner.Policy().Refused(time.Now(), owner, p.Adm.Priority)
	res.LastCode = code
	x.log.Debug("owner's engine refused", "id", p.Req.ID, "owner", owner, "code", code)
}
