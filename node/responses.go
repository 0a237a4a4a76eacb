package node

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/kvindex"
	"github.com/kvmesh/kvmesh/node/openai"
	"github.com/kvmesh/kvmesh/node/transport"
)

// Response ids. The engine that ran a response keeps its state (what previous_response_id
// continues), so a continuation must reach that node, and no node keeps a table of who ran
// what: the id says it. The node that runs a response returns its engine's id E as
//
//	resp_<tag>_<E>
//
// where tag is responseTag of the node's name (16 hex digits), and restores E in the
// previous_response_id it hands its engine. An ingress finds the member whose name has the
// tag; a node that left the mesh took its responses with it (404 previous_response_not_found).
const responseIDPrefix = "resp_"

// responseTag names a node in the response ids it issues.
func responseTag(name string) string { return fmt.Sprintf("%016x", xxhash.Sum64String(name)) }

// responseID is the id the client sees for engine id engineID run on the node of tag.
func responseID(tag, engineID string) string { return responseIDPrefix + tag + "_" + engineID }

// parseResponseID splits an id responseID made into its tag and engine id.
func parseResponseID(id string) (tag, engineID string, ok bool) {
	rest, ok := strings.CutPrefix(id, responseIDPrefix)
	if !ok || len(rest) < 18 || rest[16] != '_' {
		return "", "", false
	}
	tag = rest[:16]
	for _, c := range tag {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return "", "", false
		}
	}
	return tag, rest[17:], true
}

// responseOwner finds the node whose responses carry tag: this one, or a live peer (a
// suspect one too: it may be back).
func (n *Node) responseOwner(tag string) (simpleCandidate, bool) {
	if responseTag(n.cfg.Name) == tag {
		return simpleCandidate{name: n.cfg.Name, self: true}, true
	}
	if n.g == nil {
		return simpleCandidate{}, false
	}
	for _, m := range n.g.Members() {
		if m.Self || (m.Liveness != gossip.LivenessAlive && m.Liveness != gossip.LivenessSuspect) {
			continue
		}
		if responseTag(m.Name) == tag {
			return simpleCandidate{name: m.Name, quic: m.State.QUICAddr}, true
		}
	}
	return simpleCandidate{}, false
}

func errPreviousNotFound(msg string) *openai.Error {
	return openai.NewError(http.StatusNotFound, CodePreviousResponseNotFound, msg).WithParam("previous_response_id")
}

// ingestResponses is POST /v1/responses at the ingress: a continuation goes to the node that
// ran the response it continues, a new response to the least loaded node in front of an
// external engine that serves the model.
func (n *Node) ingestResponses(ctx context.Context, w http.ResponseWriter, r *http.Request, id string, start time.Time) outcome {
	body, oerr := n.readBody(r)
	var rr *openai.ResponsesRequest
	if oerr == nil {
		rr, oerr = openai.DecodeResponses(bytes.NewReader(body), n.cfg.MaxBodyBytes)
	}
	if oerr == nil {
		oerr = n.clientKVTransfer(rr.Extra)
	}
	if oerr != nil {
		n.m.decision(admit.LayerValidation, admit.Refuse, oerr.Code)
		return refuseSimple(w, oerr, 0)
	}
	// The input's shape is the engine's to read; its size is what the key is charged for.
	q := &simpleRequest{ep: transport.EndpointResponses, id: id, body: body,
		adm: admit.Request{Model: rr.Model, PromptTokens: kvindex.Tokens(len(body))}}
	if o := n.admitSimple(w, r, q, start, rr.MaxOutputTokens); o != nil {
		return *o
	}
	local := func(w http.ResponseWriter, origin string) outcome {
		return n.serveResponses(ctx, w, rr, q.body, id, origin) // q.body: its output cap as admitted
	}
	if rr.PreviousResponseID != nil {
		prev := *rr.PreviousResponseID
		tag, _, ok := parseResponseID(prev)
		if !ok {
			return refuseSimple(w, errPreviousNotFound(fmt.Sprintf("response %q was not produced by this mesh", clipID(prev))), 0)
		}
		owner, ok := n.responseOwner(tag)
		if !ok {
			return refuseSimple(w, errPreviousNotFound(fmt.Sprintf(
				"the node that produced response %q has left the mesh, and its engine's state went with it", clipID(prev))), 0)
		}
		return n.dispatchSimple(ctx, w, q, []simpleCandidate{owner}, true, local)
	}
	if n.cfg.Standalone {
		return local(w, "local")
	}
	cands, embedded := n.simpleCandidates(rr.Model, true)
	if len(cands) == 0 && embedded {
		return refuseSimple(w, openai.NewError(http.StatusBadRequest, CodeUnsupportedEndpoint, fmt.Sprintf(
			"the nodes that serve %q run the embedded engine, which does not implement the Responses API", rr.Model)), 0)
	}
	return n.dispatchSimple(ctx, w, q, cands, false, local)
}

func clipID(s string) string {
	if len(s) > 128 {
		return s[:128] + "..."
	}
	return s
}

// serveResponses runs a Responses API request on this node's engine: only an external one
// implements it. previous_response_id is restored to the engine's own id, and the id of the
// response the engine makes is tagged with this node's on the way back.
func (n *Node) serveResponses(ctx context.Context, w http.ResponseWriter, rr *openai.ResponsesRequest, body []byte, id, origin string) outcome {
	n.m.served.WithLabelValues(origin).Inc()
	if n.ext == nil {
		return refuseSimple(w, openai.NewError(http.StatusBadRequest, CodeUnsupportedEndpoint,
			"the embedded engine does not implement the Responses API"), 0)
	}
	tag := responseTag(n.cfg.Name)
	if rr.PreviousResponseID != nil {
		ptag, engineID, ok := parseResponseID(*rr.PreviousResponseID)
		if !ok || ptag != tag {
			return refuseSimple(w, errPreviousNotFound(fmt.Sprintf("response %q was not produced by node %s",
				clipID(*rr.PreviousResponseID), n.cfg.Name)), 0)
		}
		v, _ := json.Marshal(engineID)
		var err error
		if body, err = openai.SetMember(body, "previous_response_id", func([]byte) []byte { return v }); err != nil {
			return refuseSimple(w, openai.ErrInvalidRequest(err.Error()), 0)
		}
	}
	return n.passToEngine(ctx, w, "/v1/responses", id, body, func(r io.Reader, ct string) io.Reader { return tagResponseIDs(r, ct, tag) })
}

// maxResponseLine bounds one line of an engine's Responses answer that the node rewrites.
const maxResponseLine = 16 << 20

// tagResponseIDs rewrites the engine's response id in an answer to /v1/responses, a JSON
// object or a stream of server-sent events, into responseID(tag, id). The id is the object's
// top-level "id", or in a stream the first event's "response.id" (response.created); from
// then on every occurrence of it as a JSON string is rewritten (the final response object
// repeats it). Other bytes pass as they are. A JSON answer is read whole; a stream line by
// line, each line passed on as soon as it is read.
func tagResponseIDs(r io.Reader, contentType, tag string) io.Reader {
	if !strings.HasPrefix(contentType, "text/event-stream") {
		b, err := io.ReadAll(io.LimitReader(r, maxResponseLine+1))
		if err == nil && len(b) > maxResponseLine {
			err = fmt.Errorf("engine answer over %d bytes", maxResponseLine)
		}
		if from, to := findResponseID(b, tag); from != nil {
			b = bytes.ReplaceAll(b, from, to)
		}
		return io.MultiReader(bytes.NewReader(b), errReader{err})
	}
	return &idRewriter{br: bufio.NewReaderSize(r, 64<<10), tag: tag}
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	return 0, io.EOF
}

// idRewriter is tagResponseIDs for a stream.
type idRewriter struct {
	br       *bufio.Reader
	tag      string
	from, to []byte // the engine's id and the tagged one, quoted; nil until seen
	pending  []byte
	err      error
}

func (r *idRewriter) Read(p []byte) (int, error) {
	for len(r.pending) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		line, err := readLine(r.br)
		if r.from == nil {
			r.from, r.to = findResponseID(line, r.tag)
		}
		if r.from != nil {
			line = bytes.ReplaceAll(line, r.from, r.to)
		}
		r.pending, r.err = line, err
	}
	n := copy(p, r.pending)
	r.pending = r.pending[n:]
	return n, nil
}

// readLine reads through the next newline, at most maxResponseLine bytes.
func readLine(br *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		frag, err := br.ReadSlice('\n')
		line = append(line, frag...)
		if err != bufio.ErrBufferFull {
			return line, err
		}
		if len(line) > maxResponseLine {
			return line, fmt.Errorf("engine answer has a line over %d bytes", maxResponseLine)
		}
	}
}

// findResponseID reads the response id from one line of an answer (the whole JSON object, or
// an SSE data line) and returns it and its tagged form, quoted as JSON; nil if the line has none.
func findResponseID(line []byte, tag string) (from, to []byte) {
	data := bytes.TrimSpace(line)
	if d, ok := bytes.CutPrefix(data, []byte("data:")); ok {
		data = bytes.TrimSpace(d)
	}
	var v struct {
		ID       string `json:"id"`
		Object   string `json:"object"`
		Response *struct {
			ID string `json:"id"`
		} `json:"response"`
	}
	if len(data) == 0 || data[0] != '{' || json.Unmarshal(data, &v) != nil {
		return nil, nil
	}
	id := v.ID
	if v.Object != "response" {
		id = ""
		if v.Response != nil {
			id = v.Response.ID
		}
	}
	if id == "" {
		return nil, nil
	}
	from, _ = json.Marshal(id)
	to, _ = json.Marshal(responseID(tag, id))
	return from, to
}
