package node

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/engine/sim"
	"github.com/kvmesh/kvmesh/node/journey"
	"github.com/kvmesh/kvmesh/node/kvconnector"
	"github.com/kvmesh/kvmesh/node/openai"
	"github.com/kvmesh/kvmesh/node/render"
)

// The KV connector flow of kvmesh engine (a prefill's handover, its side channel and its pull)
// is node/kvconnector's.

const kvPath = kvconnector.Path

func (n *Node) handleKV(w http.ResponseWriter, r *http.Request) { n.kv.ServeHTTP(w, r) }

// takeKVTransfer removes kv_transfer_params from p's extra fields, which the simulated engine
// would refuse, and decodes them (nil when absent, null, or asking for neither half).
func takeKVTransfer(p *journey.Request) (*openai.KVTransferParams, *openai.Error) {
	var raw []byte
	p.Req.Extra = slices.DeleteFunc(p.Req.Extra, func(f openai.Field) bool {
		if f.Name == "kv_transfer_params" {
			raw = f.Value
			return true
		}
		return false
	})
	kt, err := openai.DecodeKVTransferParams(raw)
	if err != nil {
		return nil, openai.NewError(http.StatusBadRequest, openai.CodeInvalidParameter, err.Error()).WithParam("kv_transfer_params")
	}
	if kt != nil && !kt.DoRemoteDecode && !kt.DoRemotePrefill {
		return nil, nil
	}
	return kt, nil
}

// serveEngine runs a request on kvmesh engine: whole, or the half its kv_transfer_params ask
// for. A prefill engine runs prefill halves only.
func (n *Node) serveEngine(ctx context.Context, w http.ResponseWriter, r *http.Request, p *journey.Request, start time.Time) journey.Outcome {
	if n.kv == nil { // not the simulated engine: its engine judges the params
		return n.x.ServeLocal(ctx, w, p, start, "local")
	}
	refuse := func(e *openai.Error) journey.Outcome {
		journey.WriteRefusal(w, e, 0)
		return journey.Outcome{Code: e.Code, Refused: e.Status < 500}
	}
	kt, oerr := takeKVTransfer(p)
	switch {
	case oerr != nil:
		return refuse(oerr)
	case kt != nil && kt.DoRemoteDecode:
		if p.Stream {
			return refuse(openai.NewError(http.StatusBadRequest, openai.CodeInvalidParameter,
				"a prefill (kv_transfer_params.do_remote_decode) is answered whole: send it with stream false").WithParam("stream"))
		}
		return n.answerPrefill(ctx, w, r, p)
	case kt != nil:
		h, e := n.kv.Pull(ctx, kt, p.Req.Blocks)
		if e != nil {
			return refuse(e)
		}
		p.Req.Handover = h
	case n.cfg.Sim.Role == sim.RolePrefill:
		return refuse(openai.NewError(http.StatusBadRequest, openai.CodeInvalidRequest,
			"this engine runs prefills only: send kv_transfer_params with do_remote_decode true").WithParam("kv_transfer_params"))
	}
	return n.x.ServeLocal(ctx, w, p, start, "local")
}

// answerPrefill prefills p, keeps its handover and answers as vLLM's prefill server does: no
// text (vLLM's one token, which the proxy drops, is not drawn), finish_reason length, the
// prompt's usage and kv_transfer_params naming the handover.
func (n *Node) answerPrefill(ctx context.Context, w http.ResponseWriter, r *http.Request, p *journey.Request) journey.Outcome {
	n.m.Served.WithLabelValues("local").Inc()
	h, err := n.x.Prefill(ctx, p)
	if err != nil {
		e := journey.EngineError(err)
		journey.WriteRefusal(w, e, 0)
		return journey.Outcome{Code: e.Code, Refused: e.Status < 500}
	}
	host, port, err := net.SplitHostPort(r.Host)
	if err != nil { // no port in Host: the listener's
		host = r.Host
		_, port, _ = net.SplitHostPort(n.HTTPAddr())
	}
	portN, _ := strconv.Atoi(port)
	kvID := n.kv.ID()
	kt := openai.KVTransferParams{DoRemotePrefill: true, RemoteEngineID: &kvID, RemoteHost: &host, RemotePort: &portN,
		RemoteRequestID: n.kv.Put(h, time.Now()), RemoteBlockIDs: make([]int, len(h.Blocks))}
	for i := range kt.RemoteBlockIDs {
		kt.RemoteBlockIDs[i] = i
	}
	u := &engine.Usage{PromptTokens: h.PromptTokens, CachedTokens: h.CachedTokens}
	body, err := json.Marshal(render.New(p.Endpoint, p.Req.ID, p.Model.Name, p.IncludeUsage, time.Now()).Complete("", engine.Chunk{FinishReason: engine.FinishLength, Usage: u}, nil))
	if err == nil {
		ktb, _ := json.Marshal(kt)
		body, err = openai.SetMember(body, "kv_transfer_params", func([]byte) []byte { return ktb })
	}
	if err != nil { // unreachable: both are plain structs
		e := openai.NewError(http.StatusInternalServerError, openai.CodeEngineError, "encoding the prefill answer: "+err.Error())
		journey.WriteRefusal(w, e, 0)
		return journey.Outcome{Code: e.Code}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set(HeaderNode, n.cfg.Name)
	_, _ = w.Write(append(body, '\n'))
	return journey.Outcome{Completed: true}
}
