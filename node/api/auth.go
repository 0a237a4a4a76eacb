package api

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/node/journey"
	"github.com/kvmesh/kvmesh/node/openai"
)

// KeyValid reports whether r may pass authentication: it carries a valid API key in its
// Authorization header, or no key file is loaded and always is false. It charges nothing.
func (sv *Server) KeyValid(r *http.Request, always bool) bool {
	keys := sv.adm.Keys()
	return (keys.Len() == 0 && !always) || keys.Valid(Bearer(r.Header))
}

func ErrInvalidKey() *openai.Error { return openai.ErrInvalidAPIKey("invalid or missing API key") }

// Authenticate refuses a request of an inference endpoint without a valid key before its body
// is read: a client without one must learn nothing from the answer (not whether the model
// exists) and cost nothing (a body of MaxBodyBytes takes tens of milliseconds to parse and
// hash). Admission charges the key's bucket later, once the body says what the request costs.
func (sv *Server) Authenticate(w http.ResponseWriter, r *http.Request) (journey.Outcome, bool) {
	if sv.KeyValid(r, false) {
		return journey.Outcome{}, true
	}
	e := ErrInvalidKey()
	sv.m.Decision(admit.LayerIdentity, admit.Refuse, e.Code)
	journey.WriteRefusal(w, e, 0)
	return journey.Outcome{Code: e.Code, Refused: true}, false
}

// IngestFunc is the ingress of a simple endpoint (HandleSimple).
type IngestFunc = func(context.Context, http.ResponseWriter, *http.Request, string, time.Time) journey.Outcome

// KeyFirst runs ingest on a request authenticate let through.
func (sv *Server) KeyFirst(ingest IngestFunc) IngestFunc {
	return func(ctx context.Context, w http.ResponseWriter, r *http.Request, id string, start time.Time) journey.Outcome {
		if o, ok := sv.Authenticate(w, r); !ok {
			return o
		}
		return ingest(ctx, w, r, id, start)
	}
}

// Bearer is the API key a request presents: its Authorization bearer token, else its
// X-Api-Key (the Messages API's header), so a client of either API authenticates as it does
// with its provider.
func Bearer(h http.Header) string {
	v := h.Get("Authorization")
	if len(v) > 7 && strings.EqualFold(v[:7], "bearer ") {
		return strings.TrimSpace(v[7:])
	}
	if v == "" {
		return strings.TrimSpace(h.Get(HeaderAPIKey))
	}
	return ""
}

// WriteJSON answers with status and v as JSON.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
