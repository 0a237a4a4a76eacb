package admit

import (
	"testing"
	"time"
)

// TestDecide pins the last step of a pass no layer ended: Accept on the chosen option with its
// KV need, else Queue naming why the request waits and at which layer.
func TestDecide(t *testing.T) {
	for _, tt := range []struct {
		name   string
		chosen int
		wait   string
		want   Decision
	}{
		{"chosen", 1, "", Decision{Action: Accept, Layer: LayerSLO, Code: CodeAccepted, Option: 1, KVBlocks: 7}},
		{"room misses the SLO", -1, "", Decision{Action: Queue, Layer: LayerKV, Code: CodeWaitKV, Option: -1}},
		{"no KV room", -1, CodeWaitKV, Decision{Action: Queue, Layer: LayerKV, Code: CodeWaitKV, Option: -1}},
		{"decode room", -1, CodeWaitDecode, Decision{Action: Queue, Layer: LayerKV, Code: CodeWaitDecode, Option: -1}},
		{"behind equal rank", -1, CodeWaitBehind, Decision{Action: Queue, Layer: LayerPriority, Code: CodeWaitBehind, Option: -1}},
	} {
		p := &pass{chosen: tt.chosen, wait: tt.wait, kv: []optionKV{{need: 5}, {need: 7}}}
		if got := p.decide(); got != tt.want {
			t.Errorf("%s: decide = %+v, want %+v", tt.name, got, tt.want)
		}
	}
}

// TestFinish pins what every verdict of a pass carries: the tenant, layer 3's token counts,
// the prefill and OwnTTFT, the pool it counted in (the request's own role when accepted on a
// whole option, though its first option was a pair), and the room's Retry-After on a 429
// that names none.
func TestFinish(t *testing.T) {
	a := newAdmitter(t, nil)
	r := baseReq() // 100 prompt tokens, tenant "t"
	pair, whole := idle(), idle()
	pair.Split, pair.CachedTokens, whole.CachedTokens = true, 40, 60
	p := pass{a: a, now: t0, req: r, options: []Option{pair, whole}, useRoom: true, maxTokens: 100, expected: 80}
	p.start()
	own := 4 * time.Millisecond // 40 uncached tokens at 10000/s
	for _, tt := range []struct {
		name       string
		in         Decision
		role       string
		split      bool
		retryAfter time.Duration
	}{
		{"accepted on the pair", Decision{Action: Accept, Option: 0}, RolePrefill, true, 0},
		{"accepted whole", Decision{Action: Accept, Option: 1}, "", false, 0},
		{"queued", Decision{Action: Queue, Option: -1}, RolePrefill, false, 0},
		{"429 gets the room's Retry-After", Decision{Action: Refuse, Status: 429, Option: -1}, RolePrefill, false, time.Second},
		{"429 keeps its own", Decision{Action: Refuse, Status: 429, Option: -1, RetryAfter: 5 * time.Second}, RolePrefill, false, 5 * time.Second},
		{"400 has none", Decision{Action: Refuse, Status: 400, Option: -1}, RolePrefill, false, 0},
	} {
		d := p.finish(tt.in)
		if d.Tenant != "t" || d.MaxTokens != 100 || d.ExpectedTokens != 80 || d.PrefillTokens != 40 || d.OwnTTFT != own {
			t.Errorf("%s: carried %+v, want tenant t, 100 and 80 tokens, 40 prefill, OwnTTFT %v", tt.name, d, own)
		}
		if d.Role != tt.role || d.Split != tt.split || d.RetryAfter != tt.retryAfter {
			t.Errorf("%s: role %q split %v retry %v, want %q %v %v", tt.name, d.Role, d.Split, d.RetryAfter, tt.role, tt.split, tt.retryAfter)
		}
	}
}
