package adapters

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/node/lora"
	"github.com/kvmesh/kvmesh/node/openai"
)

// TestLoadFailuresAnswerPrecisely: each of the loader's failures is the client's answer with
// its own status and code naming the adapter and the node, and its own outcome in the load's
// span; an adapter a reload dropped while
// its request waited is the 404 model_not_found an adapter of no source gets.
func TestLoadFailuresAnswerPrecisely(t *testing.T) {
	for _, c := range []struct {
		kind, cause   error
		status        int
		code, outcome string
	}{
		{lora.ErrLoadFailed, errors.New("no adapter found"), http.StatusBadGateway, CodeAdapterLoadFailed, "failed"},
		{lora.ErrLoadTimeout, errors.New("deadline"), http.StatusGatewayTimeout, CodeAdapterLoadTimeout, "timeout"},
		{lora.ErrNoIdleSlot, nil, http.StatusServiceUnavailable, CodeAdapterSlotsBusy, "slots_busy"},
		{lora.ErrNotInSource, nil, http.StatusNotFound, openai.CodeModelNotFound, "not_in_source"},
	} {
		t.Run(c.code, func(t *testing.T) {
			e := (&adapterError{err: &lora.Error{Adapter: "sql", Kind: c.kind, Cause: c.cause}, node: "gpu-3"}).APIError()
			if e.Status != c.status || e.Code != c.code || !strings.Contains(e.Message, "sql") || !strings.Contains(e.Message, "gpu-3") {
				t.Errorf("%d %s %q, want %d %s naming the adapter and the node", e.Status, e.Code, e.Message, c.status, c.code)
			}
			if got := failureOutcome(&lora.Error{Adapter: "sql", Kind: c.kind}); got != c.outcome {
				t.Errorf("the span's outcome %q, want %q", got, c.outcome)
			}
		})
	}
}
