package console

import (
	"sync"
	"time"
)

// MaxCandidates is the most candidates an explanation keeps, best first.
const MaxCandidates = 8

// Candidate is one candidate of a decision with its score terms: the data of one entry of
// the X-Kvmesh-Explain header.
type Candidate struct {
	Name           string  `json:"name"`
	Score          float64 `json:"score"`
	PrefixTokens   int     `json:"prefix_tokens"`
	Load           float64 `json:"load"`
	LoadTokens     int     `json:"load_tokens"`
	FreeKV         float64 `json:"free_kv"`
	Power          float64 `json:"power"`
	Thermal        float64 `json:"thermal"`
	ReservedTokens int     `json:"reserved_tokens"`
	Spill          int     `json:"spill"`
	TTFTSeconds    float64 `json:"ttft_seconds"`
	TPOTSeconds    float64 `json:"tpot_seconds"`
	Home           bool    `json:"home,omitempty"`
	Gated          bool    `json:"gated,omitempty"`
	Sticky         bool    `json:"sticky,omitempty"`
	Decode         string  `json:"decode,omitempty"` // a split request's decode peer
}

// Explanation is why the node decided what it did for one request.
type Explanation struct {
	ID     string    `json:"id"`
	Time   time.Time `json:"time"`
	Model  string    `json:"model"`
	Class  string    `json:"class"`
	Action string    `json:"action"` // accept, queue or refuse
	Layer  string    `json:"layer"`
	Reason string    `json:"reason"`
	// Chosen is the candidate the request was sent to ("" when refused).
	Chosen string `json:"chosen"`
	// Candidates are the first MaxCandidates candidates, best first; Total counts them all.
	Candidates []Candidate `json:"candidates"`
	Total      int         `json:"total_candidates"`
}

// Ring holds the explanations of the last Size requests. Adding one costs no allocation once
// the ring has wrapped: its slots and their candidate slices are reused.
type Ring struct {
	mu    sync.Mutex
	slots []Explanation
	next  int
	full  bool
}

// NewRing returns a ring of size slots (at least 1).
func NewRing(size int) *Ring {
	return &Ring{slots: make([]Explanation, max(size, 1))}
}

// Add stores e, overwriting the oldest entry when full; it copies e.Candidates (at most
// MaxCandidates of them), so the caller may reuse its slice.
func (r *Ring) Add(e Explanation) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := &r.slots[r.next]
	cands := append(s.Candidates[:0], e.Candidates[:min(len(e.Candidates), MaxCandidates)]...)
	*s = e
	s.Candidates = cands
	r.next++
	if r.next == len(r.slots) {
		r.next, r.full = 0, true
	}
}

// Get returns a copy of the newest explanation of request id.
func (r *Ring) Get(id string) (Explanation, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range r.lenLocked() {
		if s := &r.slots[r.indexLocked(i)]; s.ID == id {
			e := *s
			e.Candidates = append([]Candidate(nil), s.Candidates...)
			return e, true
		}
	}
	return Explanation{}, false
}

// Recent returns the newest explanations first, without their candidates, at most n.
func (r *Ring) Recent(n int) []Explanation {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Explanation, 0, min(n, r.lenLocked()))
	for i := range min(n, r.lenLocked()) {
		e := r.slots[r.indexLocked(i)]
		e.Candidates = nil
		out = append(out, e)
	}
	return out
}

func (r *Ring) lenLocked() int {
	if r.full {
		return len(r.slots)
	}
	return r.next
}

// indexLocked is the slot of the i-th newest entry.
func (r *Ring) indexLocked(i int) int {
	return (r.next - 1 - i + len(r.slots)) % len(r.slots)
}
