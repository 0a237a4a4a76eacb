package kvconnector

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
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/openai"
)

// HeldTTL is how long a prefill engine keeps a handover for a decode engine to pull; vLLM's
// prefill server likewise frees blocks no decode server read after a timeout.
const HeldTTL = 2 * time.Minute

// maxHeld and maxHeldBlocks bound the handovers a prefill engine keeps, in number and in
// blocks (a million blocks, 16M tokens: far more KV than one engine holds, about 40 MB of
// records); past either the oldest go first.
const (
	maxHeld       = 1 << 16
	maxHeldBlocks = 1 << 20
)

// Path is the side channel's path; the handover's id follows it.
const Path = "/kvmesh/kv/"

// maxKVRecord bounds a side channel answer: a handover's block hashes, in hex.
const maxKVRecord = 4 << 20

// Record is a held handover as the side channel serves it. Block hashes are hex strings: a
// JSON number cannot hold a uint64.
type Record struct {
	EngineID     string   `json:"engine_id"`
	PromptTokens int      `json:"prompt_tokens"`
	CachedTokens int      `json:"cached_tokens"`
	KVBytes      int64    `json:"kv_bytes"`
	ReadyAtNanos int64    `json:"ready_at_ns"`
	Blocks       []string `json:"blocks"`
}

// Store holds a prefill engine's handovers until they expire, oldest first in order.
type Store struct {
	id     string       // remote_engine_id: the engine's name and a per-process nonce
	client *http.Client // a decode engine's pulls

	mu     sync.Mutex
	m      map[string]held
	order  []string // the ids in m, oldest first
	blocks int      // the blocks of the handovers in m
}

type held struct {
	rec     Record
	expires time.Time
}

// New returns the Store of the engine of node name, whose id carries a per-process nonce.
func New(name string) *Store {
	return &Store{id: name + "-" + randomHex(4), client: &http.Client{Timeout: 10 * time.Second}, m: map[string]held{}}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Put keeps h and returns its id.
func (s *Store) Put(h *engine.Handover, now time.Time) string {
	rec := Record{EngineID: s.id, PromptTokens: h.PromptTokens, CachedTokens: h.CachedTokens, KVBytes: h.KVBytes,
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
	s.m[id] = held{rec, now.Add(HeldTTL)}
	s.order = append(s.order, id)
	s.blocks += len(rec.Blocks)
	return id
}

// Get returns the record of handover id while it is held.
func (s *Store) Get(id string, now time.Time) (Record, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h, ok := s.m[id]
	return h.rec, ok && !now.After(h.expires)
}

// ID is the engine's remote_engine_id.
func (s *Store) ID() string { return s.id }

// ServeHTTP is the side channel, GET Path{id}: a held handover's record, 404 for an unknown or
// expired id.
func (s *Store) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec, ok := s.Get(strings.TrimPrefix(r.URL.Path, Path), time.Now())
	if !ok {
		openai.WriteError(w, openai.NewError(http.StatusNotFound, "handover_not_found",
			fmt.Sprintf("engine %s holds no handover %q (unknown, or expired after %v)", s.id, strings.TrimPrefix(r.URL.Path, Path), HeldTTL)))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(rec)
}

// Pull fetches the handover kt names from its prefill engine and checks it is of the prompt
// of blocks.
// An unknown handover, or one of another engine or prompt, is the client's 400; a prefill
// engine that cannot be reached or answers garbage is a 502.
func (s *Store) Pull(ctx context.Context, kt *openai.KVTransferParams, blocks []uint64) (*engine.Handover, *openai.Error) {
	bad := func(format string, a ...any) *openai.Error {
		return openai.NewError(http.StatusBadRequest, openai.CodeInvalidParameter, fmt.Sprintf(format, a...)).WithParam("kv_transfer_params")
	}
	addr := net.JoinHostPort(*kt.RemoteHost, strconv.Itoa(*kt.RemotePort))
	failed := func(err error) *openai.Error {
		return openai.NewError(http.StatusBadGateway, openai.CodeEngineError,
			fmt.Sprintf("cannot pull the KV of handover %q from the prefill engine at %s: %v", kt.RemoteRequestID, addr, err))
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+Path+url.PathEscape(kt.RemoteRequestID), nil)
	if err != nil {
		return nil, bad("remote_host %q: %v", *kt.RemoteHost, err)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, failed(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxKVRecord))
	switch {
	case err != nil:
		return nil, failed(err)
	case resp.StatusCode == http.StatusNotFound:
		return nil, bad("the prefill engine at %s holds no handover %q (unknown, or expired after %v)", addr, kt.RemoteRequestID, HeldTTL)
	case resp.StatusCode != http.StatusOK:
		return nil, failed(fmt.Errorf("status %d", resp.StatusCode))
	}
	var rec Record
	if err := json.Unmarshal(b, &rec); err != nil {
		return nil, failed(fmt.Errorf("not a handover record: %w", err))
	}
	if rec.EngineID != *kt.RemoteEngineID {
		return nil, bad("remote_engine_id %q is not the engine at %s (%s)", *kt.RemoteEngineID, addr, rec.EngineID)
	}
	if len(kt.RemoteBlockIDs) != len(rec.Blocks) {
		return nil, bad("remote_block_ids names %d blocks; handover %q holds %d", len(kt.RemoteBlockIDs), kt.RemoteRequestID, len(rec.Blocks))
	}
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
