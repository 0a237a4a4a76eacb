package node

import (
	"net/http"
	"time"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/node/api"
	"github.com/kvmesh/kvmesh/node/console"
	"github.com/kvmesh/kvmesh/node/journey"
)

// buildConsole makes the console unless Config.NoConsole turns it off.
func (n *Node) buildConsole() error {
	if n.cfg.NoConsole {
		return nil
	}
	c, err := console.New(console.Config{Node: n.cfg.Name, Peers: func() any { return n.peers() }, Gatherer: n.reg})
	n.console = c
	return err
}

// consoleRoutes are the console's paths, for the listener that serves them: the admin
// listener when there is one, else the API listener behind the API key (keyed).
func (n *Node) consoleRoutes(keyed bool) []api.Endpoint {
	if n.console == nil || keyed == (n.cfg.AdminAddr != "") {
		return nil
	}
	var rs []api.Endpoint
	for path, h := range n.console.Handlers() {
		var hh http.Handler = h
		if keyed {
			hh = n.consoleKey(h)
		}
		rs = append(rs, api.Endpoint{Pattern: path, Methods: map[string]http.Handler{http.MethodGet: hh}})
	}
	return rs
}

// consoleKey asks the console's requests on the API listener for an API key while keys are
// on, as the other admin paths do. A browser cannot send a bearer token when it opens a page,
// so the key may also come as the password of HTTP Basic authentication, which the 401 asks
// for; the browser then sends it with each poll.
func (n *Node) consoleKey(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, pw, ok := r.BasicAuth(); ok {
			r = r.Clone(r.Context())
			r.Header.Set("Authorization", "Bearer "+pw)
		}
		if !n.api.KeyValid(r, false) {
			w.Header().Set("WWW-Authenticate", `Basic realm="kvmesh console", charset="UTF-8"`)
			journey.WriteRefusal(w, api.ErrInvalidKey(), 0)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// explained keeps the explanation of p's verdict t for the console.
func (n *Node) explained(p *journey.Request, t *journey.Ticket) {
	if n.console == nil {
		return
	}
	var cands [console.MaxCandidates]console.Candidate
	k := min(len(t.Cands), len(cands))
	for i := range k {
		cands[i] = consoleCandidate(&t.Cands[i])
	}
	e := console.Explanation{ID: p.Req.ID, Time: time.Now(), Model: p.Adm.Model, Class: admit.Class(p.Adm.Priority),
		Action: t.D.Action.String(), Layer: t.D.Layer, Reason: t.D.Code, Candidates: cands[:k], Total: len(t.Cands)}
	if !t.D.Refused() && t.D.Option >= 0 && t.D.Option < len(t.Cands) {
		e.Chosen = t.Cands[t.D.Option].Name
	}
	n.console.Record(e)
}

func consoleCandidate(c *route.Candidate) console.Candidate {
	out := console.Candidate{Name: c.Name, Score: c.Score, PrefixTokens: c.Terms.PrefixTokens, Load: c.Terms.Load,
		LoadTokens: c.Terms.LoadTokens, FreeKV: c.Terms.FreeKV, Power: c.Terms.Power, Thermal: c.Terms.Thermal,
		ReservedTokens: c.Terms.ReservedTokens, Spill: c.Terms.Spill, TTFTSeconds: c.PredictedTTFT.Seconds(),
		TPOTSeconds: c.PredictedTPOT.Seconds(), Home: c.Home, Gated: c.Gated, Sticky: c.Sticky}
	if c.Pair != nil {
		out.Decode = c.Pair.Decode.Name
	}
	return out
}

// forwardSent and forwardReceived count a forward to or from peer in the console's matrix.
func (n *Node) forwardSent(peer string) {
	if n.console != nil {
		n.console.ForwardSent(peer)
	}
}

func (n *Node) forwardReceived(peer string) {
	if n.console != nil {
		n.console.ForwardReceived(peer)
	}
}
