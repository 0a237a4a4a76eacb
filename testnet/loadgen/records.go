package loadgen

import (
	"encoding/json"
	"io"
	"sync"
	"time"
)

// RequestRecord is one request's outcome as written to Config.Requests, one JSON object per
// line: what a Report aggregates, kept per request so that a run's misses can be told apart
// (which prompt and output lengths, which node, which SLO). Times are seconds.
type RequestRecord struct {
	Run     string  `json:"run,omitempty"` // Config.RunLabel
	EndS    float64 `json:"end_s"`         // when it ended, since the run started
	Kind    string  `json:"kind"`
	Class   string  `json:"class"`
	Model   string  `json:"model,omitempty"`
	Entry   string  `json:"entry,omitempty"` // Result.Entry
	Outcome string  `json:"outcome"`         // completed, refused or failed
	Status  int     `json:"status,omitempty"`
	Reason  string  `json:"reason,omitempty"`
	Failure string  `json:"failure,omitempty"`
	Node    string  `json:"node,omitempty"`
	// PrefillNode is the node that ran a split request's prefill half (Result.PrefillNode).
	PrefillNode string `json:"prefill_node,omitempty"`
	// Tenant is a shared-prefix or adapters request's tenant (Item.Tenant), nil for other
	// workloads: which node served which tenant is what tells cache locality apart.
	Tenant *int `json:"tenant,omitempty"`
	// PlannedPromptTokens and MaxTokens are what the workload asked for (the planned prompt
	// of a request that is not an agent step, whose prompt grows), known also for a request
	// refused before the engine counted its prompt (PromptTokens 0).
	PlannedPromptTokens int     `json:"planned_prompt_tokens,omitempty"`
	MaxTokens           int     `json:"max_tokens"`
	PromptTokens        int     `json:"prompt_tokens"`
	CachedTokens        int     `json:"cached_tokens"`
	OutputTokens        int     `json:"output_tokens"`
	TTFTS               float64 `json:"ttft_s"`
	TPOTS               float64 `json:"tpot_s"`
	MaxITLS             float64 `json:"max_itl_s"` // the longest gap between two chunks
	E2ES                float64 `json:"e2e_s"`
	Retried             bool    `json:"retried,omitempty"`
	MetSLO              bool    `json:"met_slo"`
	// TTFTTargetS is the TTFT target the mesh declared (Config.FittedTTFT).
	TTFTTargetS float64 `json:"ttft_target_s,omitempty"`
}

// recorder writes RequestRecords to a Config.Requests writer, one line each, and hands them to
// Config.Observe; it keeps the first write error. A nil recorder records nothing.
type recorder struct {
	mu      sync.Mutex
	enc     *json.Encoder // nil without a writer
	observe func(RequestRecord)
	run     string
	start   time.Time
	err     error
}

func newRecorder(w io.Writer, observe func(RequestRecord), run string, start time.Time) *recorder {
	if w == nil && observe == nil {
		return nil
	}
	rc := &recorder{observe: observe, run: run, start: start}
	if w != nil {
		rc.enc = json.NewEncoder(w)
	}
	return rc
}

func (rc *recorder) write(it *Item, r *Result) {
	if rc == nil {
		return
	}
	planned := it.PromptTokens
	if it.Agent != nil {
		planned = 0
	}
	var maxITL time.Duration
	for _, g := range r.ITL {
		maxITL = max(maxITL, g)
	}
	rec := RequestRecord{Run: rc.run, EndS: time.Since(rc.start).Seconds(), Kind: r.Kind, Class: r.Class.Name, Model: r.Model, Entry: r.Entry,
		Outcome: r.Outcome.String(), Status: r.Status, Reason: r.Reason, Failure: r.Failure, Node: r.Node, PrefillNode: r.PrefillNode,
		PlannedPromptTokens: planned, MaxTokens: it.MaxTokens,
		PromptTokens: r.PromptTokens, CachedTokens: r.CachedTokens, OutputTokens: r.OutputTokens,
		TTFTS: r.TTFT.Seconds(), TPOTS: r.TPOT().Seconds(), MaxITLS: maxITL.Seconds(), E2ES: r.E2E.Seconds(),
		Retried: r.Retried, MetSLO: r.MetSLO(), TTFTTargetS: r.TTFTTarget.Seconds()}
	if it.Kind == KindShared || it.Kind == KindFollowUp {
		t := it.Tenant
		rec.Tenant = &t
	}
	if rc.observe != nil {
		rc.observe(rec)
	}
	if rc.enc == nil {
		return
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if err := rc.enc.Encode(rec); err != nil && rc.err == nil {
		rc.err = err
	}
}

// Err returns the first write error.
func (rc *recorder) Err() error {
	if rc == nil {
		return nil
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.err
}
