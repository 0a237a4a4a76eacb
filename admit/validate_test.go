package admit

import (
	"math"
	"testing"
)

func TestValidate(t *testing.T) {
	a := newAdmitter(t, func(c *Config) { c.Validation.MaxN = 2 })
	tests := []struct {
		name      string
		mod       func(*Request)
		status    int
		code      string
		param     string
		wantRefus bool
	}{
		{"ok", func(*Request) {}, 0, CodeAccepted, "", false},
		{"unknown model", func(r *Request) { r.Model = "gpt-9" }, 404, CodeModelNotFound, "model", true},
		{"n 2 allowed", func(r *Request) { r.N = ptr(2) }, 0, CodeAccepted, "", false},
		{"n 3", func(r *Request) { r.N = ptr(3) }, 400, CodeInvalidParameter, "n", true},
		{"n 0", func(r *Request) { r.N = ptr(0) }, 400, CodeInvalidParameter, "n", true},
		{"stop 4", func(r *Request) { r.StopCount = 4 }, 0, CodeAccepted, "", false},
		{"stop 5", func(r *Request) { r.StopCount = 5 }, 400, CodeInvalidParameter, "stop", true},
		{"max_tokens 0", func(r *Request) { r.MaxTokens = ptr(0) }, 400, CodeInvalidParameter, "max_tokens", true},
		{"temperature 2", func(r *Request) { r.Temperature = ptr(2.0) }, 0, CodeAccepted, "", false},
		{"temperature 2.1", func(r *Request) { r.Temperature = ptr(2.1) }, 400, CodeInvalidParameter, "temperature", true},
		{"temperature NaN", func(r *Request) { r.Temperature = ptr(math.NaN()) }, 400, CodeInvalidParameter, "temperature", true},
		{"temperature negative", func(r *Request) { r.Temperature = ptr(-0.1) }, 400, CodeInvalidParameter, "temperature", true},
		{"top_p 1.5", func(r *Request) { r.TopP = ptr(1.5) }, 400, CodeInvalidParameter, "top_p", true},
		{"logprobs 20", func(r *Request) { r.Logprobs = ptr(20) }, 0, CodeAccepted, "", false},
		{"logprobs 21", func(r *Request) { r.Logprobs = ptr(21) }, 400, CodeInvalidParameter, "logprobs", true},
		{"priority out of range", func(r *Request) { r.Priority = 5000 }, 400, CodeInvalidParameter, "priority", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := baseReq()
			tt.mod(&r)
			d := a.Validate(r)
			if d.Refused() != tt.wantRefus || d.Status != tt.status || d.Code != tt.code || d.Param != tt.param {
				t.Fatalf("Validate = %+v, want refused=%v status %d code %s param %q", d, tt.wantRefus, tt.status, tt.code, tt.param)
			}
			if d.Layer != LayerValidation {
				t.Errorf("layer %q", d.Layer)
			}
		})
	}
}
