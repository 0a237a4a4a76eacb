package node

import (
	"fmt"
	"net/http"
	"time"

	"github.com/kvmesh/kvmesh/node/attempt"
	"github.com/kvmesh/kvmesh/node/journey"
	"github.com/kvmesh/kvmesh/node/metrics"
	"github.com/kvmesh/kvmesh/node/openai"
)

// CodeOwnerUnreachable is the failure (502) of a request whose last attempt could not reach
// its owner: the QUIC handshake or the stream failed before any answer.
const CodeOwnerUnreachable = "owner_unreachable"

// allowRetry asks the retry budget whether p may be forwarded to owner after a failed
// attempt, and counts the answer.
func (n *Node) allowRetry(p *journey.Request, owner string) bool {
	if n.retries.Retry(time.Now()) {
		n.m.Retries.WithLabelValues(metrics.RetryAllowed).Inc()
		return true
	}
	n.m.Retries.WithLabelValues(metrics.RetryExhausted).Inc()
	n.log.Debug("retry budget exhausted: the request ends with its failure", "id", p.Req.ID, "next", owner)
	return false
}

// endFailed answers a request whose attempts failed with a 502 carrying the last failure's
// code.
func (n *Node) endFailed(w http.ResponseWriter, f *attempt.Failures) journey.Result {
	what := "could not be reached"
	if f.Code != CodeOwnerUnreachable {
		what = "failed before the first token (" + f.Code + ")"
	}
	msg := fmt.Sprintf("no node could run the request: %d attempt(s) failed; the last, node %s, %s", f.N, f.Owner, what)
	e := openai.NewError(http.StatusBadGateway, f.Code, msg)
	writeRefusal(w, e, 0)
	return journey.Result{Outcome: journey.Outcome{Code: e.Code}}
}

// ownerBusy records an owner whose engine answered a forward with its own 429: the owner is
// marked refused for the request's priority (not a candidate again until a newer record of
// it), and the dispatch moves on to the next candidate, or the request back to the waiting
// room, as for any refusal.
func (n *Node) ownerBusy(p *journey.Request, owner string, h map[string]string, res *journey.Result) {
	n.m.Forwards.WithLabelValues("refused").Inc()
	n.engineBusy(p, owner, h[HeaderReason], res)
}

// engineBusy records owner (a peer, or this node) as refused for p's priority because its
// engine answered 429 (code) before the first token: it is not a candidate again until a
// newer record of it, and the dispatch moves on.
func (n *Node) engineBusy(p *journey.Request, owner, code string, res *journey.Result) {
	n.planner.Policy().Refused(time.Now(), owner, p.Adm.Priority)
	res.LastCode = code
	n.log.Debug("owner's engine refused", "id", p.Req.ID, "owner", owner, "code", code)
}
