package node

import (
	"context"
	"github.com/kvmesh/kvmesh/node/journey"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestDrainCutHandlerThatWroteNothingGets503: a handler the drain timeout ended that wrote
// nothing (it took the cancellation for its client's leaving) answers 503 draining, not an
// empty 200; one that answered keeps its answer, and a client that left gets nothing more.
func TestDrainCutHandlerThatWroteNothingGets503(t *testing.T) {
	n := &Node{cfg: Config{Name: "n", DrainTimeout: time.Second}}
	for _, tc := range []struct {
		name   string
		cause  error
		write  bool
		status int
	}{
		{"drained, silent", journey.ErrDrainTimeout, false, http.StatusServiceUnavailable},
		{"drained, answered", journey.ErrDrainTimeout, true, http.StatusTeapot},
		{"client left", context.Canceled, false, http.StatusOK}, // nothing written: nobody to read it
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancelCause(context.Background())
			cancel(tc.cause)
			h := n.counted(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tc.write {
					w.WriteHeader(http.StatusTeapot)
				}
			}))
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil).WithContext(ctx))
			if rec.Code != tc.status || (tc.status == http.StatusServiceUnavailable && !strings.Contains(rec.Body.String(), `"code":"draining"`)) {
				t.Errorf("status %d, body %s; want %d", rec.Code, rec.Body, tc.status)
			}
		})
	}
}
