package node

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/engine/sim"
	"github.com/kvmesh/kvmesh/node/openai"
)

// kvmesh engine speaks vLLM's KV connector flow (docs/design/disaggregation.md#external-engines),
// so that a node in front of it in a prefill or decode role runs as in front of vLLM. A request
// whose kv_transfer_params ask for a remote decode is prefilled alone: the engine keeps the
// handover under a new id for heldTTL and answers, as vLLM's prefill server does, with
// kv_transfer_params naming it (remote_engine_id this engine, remote_request_id the handover,
// remote_block_ids its blocks, remote_host and remote_port this engine's API). A request whose
// kv_transfer_params carry those is decoded from the handover, which the decode engine pulls
// from the prefill engine's GET /kvmesh/kv/{id} (vLLM's NIXL side channel, in kvmesh's form): it
// then charges the transfer, KV bytes over its link, as the embedded decode role does. A
// handover may be pulled more than once (a retried decode), until it expires.

// heldTTL is how long a prefill engine keeps a handover for a decode engine to pull; vLLM's
// prefill server likewise frees blocks no decode server read after a timeout.
const heldTTL = 2 * time.Minute

// maxHeld and maxHeldBlocks bound the handovers a prefill engine keeps, in number and in
// blocks (a million blocks, 16M tokens: far more KV than one engine holds, about 40 MB of
// records); past either the oldest go first.
const (
	maxHeld       = 1 << 16
	maxHeldBlocks = 1 << 20
)

// kvPath is the side channel's path; the handover's id follows it.
const kvPath = "/kvmesh/kv/"

// maxKVRecord bounds a side channel answer: a handover's block hashes, in hex.
const maxKVRecord = 4 << 20

// kvRecord is a held handover as the side channel serves it. Block hashes are hex strings: a
// JSON number cannot hold a uint64.
type kvRecord struct {
	EngineID     string   `json:"engine_id"`
	PromptTokens int      `json:"prompt_tokens"`
	CachedTokens int      `json:"cached_tokens"`
	KVBytes      int64    `json:"kv_bytes"`
	ReadyAtNanos int64    `json:"ready_at_ns"`
	Blocks       []string `json:"blocks"`
}

// kvStore holds a prefill engine's handovers until they expire, oldest first in order.
type kvStore struct {
	id     string       // remote_engine_id: the engine's name and a per-process nonce
	client *http.Client // a decode engine's pulls

	mu     sync.Mutex
	m      map[string]held
	order  []string // the ids in m, oldest first
	blocks int      // the blocks of the handovers in m
}

type held struct {
	rec     kvRecord
	expires time.Time
}

func newKVStore(name string) *kvStore {
	return &kvStore{id: name + "-" + randomHex(4), client: &http.Client{Timeout: 10 * time.Second}, m: map[string]held{}}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// put keeps h and returns its id.
func (s *kvStore) put(h *engine.Handover, now time.Time) string {
	rec := kvRecord{EngineID: s.id, PromptTokens: h.PromptTokens, CachedTokens: h.CachedTokens, KVBytes: h.KVBytes,
		ReadyAtNanos: int64(h.ReadyAt), Blocks: make([]string, len(h.Blocks))}
	for i, b := range h.Blocks {
		rec.Blocks[i] = strconv.FormatUint(b, 16)
	}
	id := randomHex(12)
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.order) > 0 && (len(s.order) >= maxHeld || s.blocks+len(rec.Blocks) > maxHeldBlocks || now.After(s.m[s.order[0]].expires)) {
		s.blocks -= len(s.m[s.order[0]].rec.Blocks)
		delete(s.m, s.order[0])
		s.order = s.order[1:]
	}
	s.m[id] = held{rec, now.Add(heldTTL)}
	s.order = append(s.order, id)
	s.blocks += len(rec.Blocks)
	return id
}

func (s *kvStore) get(id string, now time.Time) (kvRecord, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h, ok := s.m[id]
	return h.rec, ok && !now.After(h.expires)
}

// handleKV is the side channel: a held handover's record, 404 for an unknown or expired id.
func (n *Node) handleKV(w http.ResponseWriter, r *http.Request) {
	rec, ok := n.kv.get(strings.TrimPrefix(r.URL.Path, kvPath), time.Now())
	if !ok {
		openai.WriteError(w, openai.NewError(http.StatusNotFound, "handover_not_found",
			fmt.Sprintf("engine %s holds no handover %q (unknown, or expired after %v)", n.kv.id, strings.TrimPrefix(r.URL.Path, kvPath), heldTTL)))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(rec)
}

// takeKVTransfer removes kv_transfer_params from p's extra fields, which the simulated engine
// would refuse, and decodes them (nil when absent, null, or asking for neither half).
func takeKVTransfer(p *prepared) (*openai.KVTransferParams, *openai.Error) {
	var raw []byte
	p.req.Extra = slices.DeleteFunc(p.req.Extra, func(f openai.Field) bool {
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
func (n *Node) serveEngine(ctx context.Context, w http.ResponseWriter, r *http.Request, p *prepared, start time.Time) outcome {
	if n.kv == nil { // not the simulated engine: its engine judges the params
		return n.serveLocal(ctx, w, p, start, "local")
	}
	refuse := func(e *openai.Error) outcome {
		writeRefusal(w, e, 0)
		return outcome{code: e.Code, refused: e.Status < 500}
	}
	kt, oerr := takeKVTransfer(p)
	switch {
	case oerr != nil:
		return refuse(oerr)
	case kt != nil && kt.DoRemoteDecode:
		if p.stream {
			return refuse(openai.NewError(http.StatusBadRequest, openai.CodeInvalidParameter,
				"a prefill (kv_transfer_params.do_remote_decode) is answered whole: send it with stream false").WithParam("stream"))
		}
		return n.answerPrefill(ctx, w, r, p)
	case kt != nil:
		h, e := n.pullKV(ctx, kt, p)
		if e != nil {
			return refuse(e)
		}
		p.req.Handover = h
	case n.cfg.Sim.Role == sim.RolePrefill:
		return refuse(openai.NewError(http.StatusBadRequest, openai.CodeInvalidRequest,
			"this engine runs prefills only: send kv_transfer_params with do_remote_decode true").WithParam("kv_transfer_params"))
	}
	return n.serveLocal(ctx, w, p, start, "local")
}

// answerPrefill prefills p, keeps its handover and answers as vLLM's prefill server does: no
// text (vLLM's one token, which the proxy drops, is not drawn), finish_reason length, the
// prompt's usage and kv_transfer_params naming the handover.
func (n *Node) answerPrefill(ctx context.Context, w http.ResponseWriter, r *http.Request, p *prepared) outcome {
	n.m.served.WithLabelValues("local").Inc()
	h, err := n.prefill(ctx, p)
	if err != nil {
		e := engineError(err)
		writeRefusal(w, e, 0)
		return outcome{code: e.Code, refused: e.Status < 500}
	}
	host, port, err := net.SplitHostPort(r.Host)
	if err != nil { // no port in Host: the listener's
		host = r.Host
		_, port, _ = net.SplitHostPort(n.HTTPAddr())
	}
	portN, _ := strconv.Atoi(port)
	kt := openai.KVTransferParams{DoRemotePrefill: true, RemoteEngineID: &n.kv.id, RemoteHost: &host, RemotePort: &portN,
		RemoteRequestID: n.kv.put(h, time.Now()), RemoteBlockIDs: make([]int, len(h.Blocks))}
	for i := range kt.RemoteBlockIDs {
		kt.RemoteBlockIDs[i] = i
	}
	u := &engine.Usage{PromptTokens: h.PromptTokens, CachedTokens: h.CachedTokens}
	body, err := json.Marshal(newEncoder(p, time.Now()).complete("", engine.Chunk{FinishReason: engine.FinishLength, Usage: u}, nil))
	if err == nil {
		ktb, _ := json.Marshal(kt)
		body, err = openai.SetMember(body, "kv_transfer_params", func([]byte) []byte { return ktb })
	}
	if err != nil { // unreachable: both are plain structs
		e := openai.NewError(http.StatusInternalServerError, openai.CodeEngineError, "encoding the prefill answer: "+err.Error())
		writeRefusal(w, e, 0)
		return outcome{code: e.Code}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set(HeaderNode, n.cfg.Name)
	_, _ = w.Write(append(body, '\n'))
	return outcome{completed: true}
}

// pullKV fetches the handover kt names from its prefill engine and checks it is of p's prompt.
// An unknown handover, or one of another engine or prompt, is the client's 400; a prefill
// engine that cannot be reached or answers garbage is a 502.
func (n *Node) pullKV(ctx context.Context, kt *openai.KVTransferParams, p *prepared) (*engine.Handover, *openai.Error) {
	bad := func(format string, a ...any) *openai.Error {
		return openai.NewError(http.StatusBadRequest, openai.CodeInvalidParameter, fmt.Sprintf(format, a...)).WithParam("kv_transfer_params")
	}
	addr := net.JoinHostPort(*kt.RemoteHost, strconv.Itoa(*kt.RemotePort))
	failed := func(err error) *openai.Error {
		return openai.NewError(http.StatusBadGateway, openai.CodeEngineError,
			fmt.Sprintf("cannot pull the KV of handover %q from the prefill engine at %s: %v", kt.RemoteRequestID, addr, err))
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+kvPath+url.PathEscape(kt.RemoteRequestID), nil)
	if err != nil {
		return nil, bad("remote_host %q: %v", *kt.RemoteHost, err)
	}
	resp, err := n.kv.client.Do(req)
	if err != nil {
		return nil, failed(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxKVRecord))
	switch {
	case err != nil:
		return nil, failed(err)
	case resp.StatusCode == http.StatusNotFound:
		return nil, bad("the prefill engine at %s holds no handover %q (unknown, or expired after %v)", addr, kt.RemoteRequestID, heldTTL)
	case resp.StatusCode != http.StatusOK:
		return nil, failed(fmt.Errorf("status %d", resp.StatusCode))
	}
	var rec kvRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		return nil, failed(fmt.Errorf("not a handover record: %w", err))
	}
	if rec.EngineID != *kt.RemoteEngineID {
		return nil, bad("remote_engine_id %q is not the engine at %s (%s)", *kt.RemoteEngineID, addr, rec.EngineID)
	}
	if len(kt.RemoteBlockIDs) != len(rec.Blocks) {
		return nil, bad("remote_block_ids names %d blocks; handover %q holds %d", len(kt.RemoteBlockIDs), kt.RemoteRequestID, len(rec.Blocks))
	}
	blocks := p.req.Blocks
	if len(rec.Blocks) != len(blocks) {
		return nil, bad("handover %q holds %d blocks of a prompt of %d", kt.RemoteRequestID, len(rec.Blocks), len(blocks))
	}
	for i, s := range rec.Blocks {
		if v, err := strconv.ParseUint(s, 16, 64); err != nil || i >= len(blocks) || v != blocks[i] {
			return nil, bad("handover %q holds the KV of another prompt", kt.RemoteRequestID)
		}
	}
	if rec.PromptTokens < 0 || rec.CachedTokens < 0 || rec.KVBytes < 0 || rec.ReadyAtNanos < 0 {
		return nil, failed(fmt.Errorf("a negative count in the handover record"))
	}
	return &engine.Handover{Blocks: blocks, PromptTokens: rec.PromptTokens, CachedTokens: rec.CachedTokens,
		KVBytes: rec.KVBytes, ReadyAt: time.Duration(rec.ReadyAtNanos)}, nil
}
