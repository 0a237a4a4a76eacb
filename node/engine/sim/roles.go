package sim

import (
	"fmt"
	"slices"
	"time"

	"github.com/kvmesh/kvmesh/node/engine"
)

// Roles, Config.Role: the engine's part in disaggregated prefill and decode
// (docs/design/disaggregation.md).
//
//   - RoleMixed runs a request whole, as an engine without roles does, and decodes a request
//     that comes with a handover.
//   - RolePrefill computes a request's prompt KV and ends the request there, without a token:
//     its final chunk (FinishHandover) carries the engine.Handover. It refuses a handover.
//   - RoleDecode decodes requests that come with a handover, and runs a request without one
//     whole, as a mixed engine does (a vLLM decode server runs a request without
//     kv_transfer_params as a normal one; the node decides whether to send it such a request,
//     route.decode_local_prefill). It refuses a prefill half alone.
//
// A handover is admitted from the head of the waiting queue as a request is, when the blocks
// for its whole prompt can be had (it waits for them; it preempts nothing): it takes its seat
// and its blocks on admission, as a decode engine allocates the blocks the KV is written
// into, and it may decode once the KV has crossed the link, Handover.KVBytes / LinkGBps
// after admission. Its first decode step computes the prompt's last token again, for the
// logits of the first output token (the prefill engine's token is not handed over), so its
// first token costs one step of one token over the prompt's context, and its text is the
// text a mixed engine would produce for the same request. Preempted before its KV arrived,
// it is admitted again as a handover; preempted after, its context is recomputed here, as any
// preempted request's.
const (
	RoleMixed   = "mixed"
	RolePrefill = "prefill"
	RoleDecode  = "decode"
)

// checkRole refuses a request the engine's role does not take: a handover on a prefill
// engine, a prefill half alone on a decode engine, and a handover that is not of this
// request's prompt of p tokens.
func (s *Sim) checkRole(req *engine.Request, p int) error {
	h := req.Handover
	switch {
	case s.cfg.Role == RolePrefill && h != nil:
		return fmt.Errorf("sim: a prefill engine does not decode a handover: %w", engine.ErrRejected)
	case req.PrefillOnly && h != nil:
		return fmt.Errorf("sim: a request cannot be both prefilled alone and decoded from a handover: %w", engine.ErrRejected)
	case s.cfg.Role == RoleDecode && req.PrefillOnly:
		return fmt.Errorf("sim: a decode engine does not prefill for another engine: %w", engine.ErrRejected)
	case h != nil && (h.PromptTokens != p || h.KVBytes < 0 || h.CachedTokens < 0):
		return fmt.Errorf("sim: handover of %d prompt tokens, %d KV bytes, for a %d-token prompt: %w",
			h.PromptTokens, h.KVBytes, p, engine.ErrRejected)
	}
	return nil
}

// transferTime is how long a handover's KV takes to cross the link: its KVBytes (the prompt's
// tokens × KVBytesPerToken when the record does not say) over LinkGBps.
func (s *Sim) transferTime(h *engine.Handover) time.Duration {
	b := h.KVBytes
	if b == 0 {
		b = int64(h.PromptTokens) * s.cfg.KVBytesPerToken
	}
	return time.Duration(float64(b) / s.cfg.LinkGBps) // bytes / (GB/s) = ns
}

// receiveLocked admits the waiting q at index i, a handover whose KV has not arrived: it takes the
// blocks of q's whole prompt and starts the transfer. It reports false, changing nothing,
// when the blocks cannot be had: q waits at the head, as a request does.
func (s *Sim) receiveLocked(q *seq, i int) bool {
	bt := s.cfg.BlockTokens
	need := (q.promptTokens + bt - 1) / bt
	if !s.cache.allocate(need, &s.delta) {
		return false
	}
	q.shared, q.own, q.computed = 0, need, q.promptTokens-1
	q.transferring, q.xferEnd = true, s.simNow+q.xfer
	s.takeWaitingLocked(i)
	q.state = running
	s.insertRunningLocked(q)
	if !q.scheduled {
		s.firstScheduledLocked(q)
	}
	return true
}

// transferWaitLocked returns how long until the first running handover's KV arrives, for a
// step with nothing to compute; false if no handover is in transfer.
func (s *Sim) transferWaitLocked() (time.Duration, bool) {
	var d time.Duration
	found := false
	for _, q := range s.running {
		if q.transferring && (!found || q.xferEnd-s.simNow < d) {
			d, found = q.xferEnd-s.simNow, true
		}
	}
	return max(d, 0), found
}

// handOverLocked ends q, a prefill engine's request whose prompt KV is computed, with the
// handover in its final chunk, and takes it out of the engine (its prompt blocks stay cached).
func (s *Sim) handOverLocked(q *seq, now time.Time) {
	st := q.stream
	st.mu.Lock()
	st.timing.E2E = s.simNow - q.arrivalSim
	st.mu.Unlock()
	s.met.e2e.Observe(now.Sub(q.arrivalWall).Seconds())
	cached := min(q.cached, q.promptTokens)
	st.push(engine.Chunk{
		FinishReason: engine.FinishHandover,
		Usage:        &engine.Usage{PromptTokens: q.usagePrompt, CachedTokens: min(q.cached, q.usagePrompt)},
		Handover: &engine.Handover{
			Blocks:       slices.Clone(q.blocks),
			PromptTokens: q.promptTokens,
			CachedTokens: cached,
			KVBytes:      int64(q.promptTokens) * s.cfg.KVBytesPerToken,
			ReadyAt:      s.simNow,
		},
	})
	s.dropLocked(q)
}
