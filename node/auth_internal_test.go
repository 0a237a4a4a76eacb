package node

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/node/openai"
)

// tripwire is a request body that records being read.
type tripwire struct {
	r    *strings.Reader
	read atomic.Bool
}

func (b *tripwire) Read(p []byte) (int, error) {
	b.read.Store(true)
	return b.r.Read(p)
}

// TestKeyCheckedBeforeTheBody pins that every inference endpoint refuses a request without a
// valid key 401 invalid_api_key without reading its body: a client without a key learns
// nothing from it (not that the model does not exist) and costs no parsing. With a valid key
// the same body is read and judged.
func TestKeyCheckedBeforeTheBody(t *testing.T) {
	n, err := New(standalone())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Shutdown(t.Context()) })
	if err := n.adm.Keys().Replace([]admit.KeyEntry{{SHA256: admit.HashKey("sk-good"), Tenant: "acme"}}, time.Now()); err != nil {
		t.Fatal(err)
	}
	h := n.routes()
	bodies := map[string]string{
		"/v1/chat/completions": `{"model":"no-such-model","messages":[{"role":"user","content":"hi"}]}`,
		"/v1/completions":      `{"model":"no-such-model","prompt":"hi"}`,
		"/v1/embeddings":       `{"model":"no-such-model","input":"hi"}`,
		"/v1/responses":        `{"model":"no-such-model","input":"hi"}`,
	}
	for path, body := range bodies {
		for _, auth := range []string{"", "Bearer sk-wrong", "Basic sk-good"} {
			t.Run(path+" "+auth, func(t *testing.T) {
				b := &tripwire{r: strings.NewReader(body)}
				req := httptest.NewRequest(http.MethodPost, path, b)
				if auth != "" {
					req.Header.Set("Authorization", auth)
				}
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if rec.Code != http.StatusUnauthorized || rec.Header().Get(HeaderReason) != openai.CodeInvalidAPIKey {
					t.Errorf("status %d %q: %s, want 401 invalid_api_key", rec.Code, rec.Header().Get(HeaderReason), rec.Body)
				}
				if b.read.Load() {
					t.Error("the body was read before the key was checked")
				}
			})
		}
		t.Run(path+" with a valid key", func(t *testing.T) {
			b := &tripwire{r: strings.NewReader(body)}
			req := httptest.NewRequest(http.MethodPost, path, b)
			req.Header.Set("Authorization", "Bearer sk-good")
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != http.StatusNotFound || rec.Header().Get(HeaderReason) != openai.CodeModelNotFound || !b.read.Load() {
				t.Errorf("status %d %q, body read %v: %s, want the body judged: 404 model_not_found", rec.Code,
					rec.Header().Get(HeaderReason), b.read.Load(), rec.Body)
			}
		})
	}
}
