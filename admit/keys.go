package admit

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"
)

// KeyEntry is one API key as stored: its SHA-256, never the key.
type KeyEntry struct {
	SHA256 string  `json:"sha256"` // 64 hex digits of SHA-256(key)
	Tenant string  `json:"tenant"`
	Rate   float64 `json:"rate_tokens_per_second,omitempty"` // 0: the config default
	Burst  int     `json:"burst_tokens,omitempty"`           // 0: the config default (or the rate × 1 s)
	// MaxPriority is the highest X-Kvmesh-Priority the key may ask for; a higher one is
	// clamped to it. nil: the config's Keys.MaxPriority, else normal (0).
	MaxPriority *Priority `json:"max_priority,omitempty"`
}

type keyState struct {
	hash    [sha256.Size]byte
	tenant  string
	maxPrio int
	rate    float64
	burst   int
	limiter *bucket // nil: unlimited
	use     meshUse // what it consumes here and elsewhere in the mesh (usage.go)
}

// Keys is the set of API keys, hot-replaceable. The zero value is an empty set, which means
// open access (every request is tenant "default", unlimited).
type Keys struct {
	mu         sync.Mutex
	keys       []*keyState
	byHash     map[[sha256.Size]byte]*keyState
	defRate    float64
	defBurst   int
	defMaxPrio int // the highest priority of a key that names none
}

// ParseKeys parses an API key file. Two formats, told apart by the first non-space byte:
//
// Text: one key per line, "sha256hex tenant [rate_tokens_per_s burst_tokens [max_priority]]"
// (rate 0 is the default rate; max_priority in X-Kvmesh-Priority's syntax); blank lines and
// lines starting with '#' are ignored. Example:
//
//	# sha256(key)                                                     tenant  rate  burst  max_priority
//	9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08 acme    2000  16000  high
//
// JSON: an array of KeyEntry, e.g. [{"sha256":"9f86...","tenant":"acme","rate_tokens_per_second":2000,"max_priority":"high"}]
// (max_priority a name or an integer, as in the text format).
//
// Rates are in tokens per second, where a request costs its prompt tokens plus max_tokens.
// The same hash twice is an error.
func ParseKeys(data []byte) ([]KeyEntry, error) {
	trimmed := bytes.TrimSpace(data)
	var out []KeyEntry
	if len(trimmed) > 0 && trimmed[0] == '[' {
		var raw []json.RawMessage
		if err := json.Unmarshal(trimmed, &raw); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrKeys, err)
		}
		out = make([]KeyEntry, len(raw))
		for i, r := range raw { // one by one, so that an error names its entry
			if err := json.Unmarshal(r, &out[i]); err != nil {
				return nil, fmt.Errorf("%w: entry %d: %w", ErrKeys, i+1, err)
			}
		}
	} else {
		sc := bufio.NewScanner(bytes.NewReader(data))
		sc.Buffer(make([]byte, 0, 4096), 1<<20)
		line := 0
		for sc.Scan() {
			line++
			s := strings.TrimSpace(sc.Text())
			if s == "" || s[0] == '#' {
				continue
			}
			f := strings.Fields(s)
			if len(f) != 2 && len(f) != 4 && len(f) != 5 {
				return nil, fmt.Errorf("%w: line %d: want \"sha256hex tenant [rate burst [max_priority]]\"", ErrKeys, line)
			}
			e := KeyEntry{SHA256: f[0], Tenant: f[1]}
			if len(f) == 5 {
				p, err := readPriority("max_priority", f[4])
				if err != nil {
					return nil, fmt.Errorf("%w: line %d: %w", ErrKeys, line, err)
				}
				mp := Priority(p)
				e.MaxPriority = &mp
			}
			if len(f) >= 4 {
				r, err := strconv.ParseFloat(f[2], 64)
				if err != nil {
					return nil, fmt.Errorf("%w: line %d: rate: %w", ErrKeys, line, err)
				}
				b, err := strconv.Atoi(f[3])
				if err != nil {
					return nil, fmt.Errorf("%w: line %d: burst: %w", ErrKeys, line, err)
				}
				e.Rate, e.Burst = r, b
			}
			out = append(out, e)
		}
		if err := sc.Err(); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrKeys, err)
		}
	}
	seen := make(map[string]bool, len(out))
	for i, e := range out {
		h, err := hex.DecodeString(e.SHA256)
		if err != nil || len(h) != sha256.Size {
			return nil, fmt.Errorf("%w: entry %d: sha256 must be 64 hex digits", ErrKeys, i+1)
		}
		if e.Tenant == "" || !(e.Rate >= 0) || math.IsInf(e.Rate, 0) || e.Burst < 0 {
			return nil, fmt.Errorf("%w: entry %d: empty tenant or bad rate/burst", ErrKeys, i+1)
		}
		if p := e.MaxPriority; p != nil && (*p < -maxPriorityValue || *p > maxPriorityValue) {
			return nil, fmt.Errorf("%w: entry %d: max_priority %d outside ±%d", ErrKeys, i+1, *p, maxPriorityValue)
		}
		k := strings.ToLower(e.SHA256)
		if seen[k] {
			return nil, fmt.Errorf("%w: entry %d: duplicate key hash", ErrKeys, i+1)
		}
		seen[k] = true
	}
	return out, nil
}

// HashKey returns the hex SHA-256 of a raw key, the form stored in key files.
func HashKey(key string) string {
	h := sha256.Sum256([]byte(key))
	return hex.EncodeToString(h[:])
}

// NewKeys builds a key set; defRate/defBurst apply to entries that name no rate and
// defMaxPrio to entries that name no maximum priority.
func NewKeys(entries []KeyEntry, defRate float64, defBurst, defMaxPrio int) (*Keys, error) {
	k := &Keys{defRate: defRate, defBurst: defBurst, defMaxPrio: defMaxPrio}
	if err := k.Replace(entries, time.Time{}); err != nil {
		return nil, err
	}
	return k, nil
}

// Replace swaps in a new key set (hot reload). A key present before and after keeps its
// bucket, so reloading the file never refills anyone's budget; its rate and burst are
// updated at now.
func (k *Keys) Replace(entries []KeyEntry, now time.Time) error {
	next := make([]*keyState, 0, len(entries))
	for i, e := range entries {
		h, err := hex.DecodeString(e.SHA256)
		if err != nil || len(h) != sha256.Size {
			return fmt.Errorf("%w: entry %d: sha256 must be 64 hex digits", ErrKeys, i+1)
		}
		st := &keyState{tenant: e.Tenant, rate: e.Rate, burst: e.Burst, maxPrio: k.defMaxPrio}
		if e.MaxPriority != nil {
			st.maxPrio = int(*e.MaxPriority)
		}
		copy(st.hash[:], h)
		if st.rate == 0 {
			st.rate, st.burst = k.defRate, k.defBurst
		}
		if st.rate > 0 && st.burst == 0 {
			st.burst = int(math.Ceil(st.rate)) // one second's worth
		}
		next = append(next, st)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	old := make(map[[sha256.Size]byte]*keyState, len(k.keys))
	for _, st := range k.keys {
		old[st.hash] = st
	}
	for _, st := range next {
		if st.rate <= 0 {
			continue
		}
		if prev, ok := old[st.hash]; ok && prev.limiter != nil {
			st.use.carry(&prev.use)
			st.limiter = prev.limiter
			st.limiter.set(now, st.rate, st.burst)
			continue
		}
		st.limiter = &bucket{rate: st.rate, burst: float64(st.burst), tokens: float64(st.burst)}
	}
	k.keys = next
	k.byHash = make(map[[sha256.Size]byte]*keyState, len(next))
	for _, st := range next {
		k.byHash[st.hash] = st
	}
	return nil
}

// Len returns the number of keys; 0 means open access.
func (k *Keys) Len() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.keys)
}

// Valid reports whether raw is one of the keys; the empty string never is. It charges nothing:
// the node asks it for the admin paths (/metrics, /v1/mesh/peers), which any key may read.
func (k *Keys) Valid(raw string) bool { return raw != "" && k.lookup(raw) != nil }

// lookup finds the key. Only SHA-256 digests are ever compared, never the key itself: the map
// finds the candidate by digest and the final comparison is constant-time, so timing can at
// most reveal bytes of a digest, which does not help anyone guess a key.
func (k *Keys) lookup(raw string) *keyState {
	h := sha256.Sum256([]byte(raw))
	k.mu.Lock()
	defer k.mu.Unlock()
	st := k.byHash[h]
	if st == nil || subtle.ConstantTimeCompare(st.hash[:], h[:]) != 1 {
		return nil
	}
	return st
}

// take charges tokens to the key's bucket at now; it returns the wait before the request
// would fit when it does not. A request larger than the burst is let through on a full bucket
// and charged whole, so the key then waits out all of it.
func (st *keyState) take(now time.Time, tokens int) (time.Duration, bool) {
	if st.limiter == nil {
		return 0, true
	}
	n := max(tokens, 1)
	// The key's rate holds across the mesh: what it consumed on other ingresses lately comes
	// off this ingress's share (usage.go).
	wait, ok := st.limiter.take(now, n, st.use.share(now, st.rate))
	if ok {
		st.use.add(now, n)
	}
	return wait, ok
}

// bucket is a key's token bucket: rate tokens a second, up to burst. A request takes its whole
// cost: one larger than the burst passes on a full bucket and leaves it that far below empty,
// which the next requests wait out (charging it only the burst let a key with 100k-token
// requests run at many times its rate).
type bucket struct {
	mu     sync.Mutex
	rate   float64
	burst  float64
	tokens float64
	last   time.Time
}

// refillLocked adds what the rate gave since the last call, up to the burst.
func (b *bucket) refillLocked(now time.Time) {
	if now.After(b.last) {
		if !b.last.IsZero() {
			b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
		}
		b.last = now
	}
}

// set changes the rate and burst at now (a reload), keeping what the bucket holds.
func (b *bucket) set(now time.Time, rate float64, burst int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refillLocked(now)
	b.rate, b.burst = rate, float64(burst)
	b.tokens = min(b.tokens, b.burst)
}

// take charges n tokens at now at the given rate: it passes when the bucket holds n, or all of
// its burst for a larger n; else it returns the wait until it would.
func (b *bucket) take(now time.Time, n int, rate float64) (time.Duration, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refillLocked(now)
	b.rate = rate
	need := min(float64(n), b.burst)
	if b.tokens >= need {
		b.tokens -= float64(n)
		return 0, true
	}
	if !(b.rate > 0) {
		return time.Second, false
	}
	return time.Duration(math.Ceil((need - b.tokens) / b.rate * float64(time.Second))), false
}
