package admit

import "testing"

func TestBudget(t *testing.T) {
	a := newAdmitter(t, nil)
	clamp := newAdmitter(t, func(c *Config) { c.Budget.ClampMaxTokens = true })
	tests := []struct {
		name   string
		a      *Admitter
		mod    func(*Request)
		code   string
		maxTok int
	}{
		{"given", a, func(*Request) {}, CodeAccepted, 100},
		{"default filled", a, func(r *Request) { r.MaxTokens = nil }, CodeAccepted, 1024},
		{"default cut to context", a, func(r *Request) { r.MaxTokens, r.PromptTokens = nil, 7800 }, CodeAccepted, 392},
		{"model default", a, func(r *Request) { r.MaxTokens, r.Model = nil, "small" }, CodeAccepted, 256},
		{"tenant default", a, func(r *Request) { r.MaxTokens, r.Tenant = nil, "tight" }, CodeAccepted, 64},
		{"model max refused", a, func(r *Request) { r.Model, r.MaxTokens = "small", ptr(600) }, CodeInvalidParameter, 0},
		{"tenant max refused", a, func(r *Request) { r.Tenant, r.MaxTokens = "tight", ptr(129) }, CodeInvalidParameter, 0},
		{"tenant max clamped", clamp, func(r *Request) { r.Tenant, r.MaxTokens = "tight", ptr(1000) }, CodeAccepted, 128},
		{"context exceeded", a, func(r *Request) { r.PromptTokens, r.MaxTokens = 8000, ptr(500) }, CodeContextLengthExceeded, 0},
		{"prompt alone exceeds", a, func(r *Request) { r.PromptTokens, r.MaxTokens = 9000, nil }, CodeContextLengthExceeded, 0},
		{"exactly full", a, func(r *Request) { r.PromptTokens, r.MaxTokens = 8000, ptr(192) }, CodeAccepted, 192},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := baseReq()
			tt.mod(&r)
			d := tt.a.Admit(t0, r, []Option{idle()})
			if d.Code != tt.code {
				t.Fatalf("Admit = %+v, want %s", d, tt.code)
			}
			if d.Refused() {
				if d.Status != 400 || d.Layer != LayerBudget || d.Param != "max_tokens" {
					t.Errorf("refusal %+v", d)
				}
				return
			}
			if d.MaxTokens != tt.maxTok || d.ExpectedTokens != tt.maxTok {
				t.Errorf("MaxTokens %d Expected %d, want %d (no samples yet: worst case)", d.MaxTokens, d.ExpectedTokens, tt.maxTok)
			}
		})
	}
}

// TestOutputEstimate pins down that learned output lengths replace max_tokens in the KV
// reservation once confident, per tenant with the model as fallback.
func TestOutputEstimate(t *testing.T) {
	a := newAdmitter(t, nil)
	r := baseReq()
	r.MaxTokens = ptr(4000)
	if d := a.Admit(t0, r, []Option{idle()}); d.ExpectedTokens != 4000 {
		t.Fatalf("no samples: expected %d, want the worst case 4000", d.ExpectedTokens)
	}
	for i := range 19 {
		a.Observe("m", "t", 190+i%3*10) // 190..210
	}
	if d := a.Admit(t0, r, []Option{idle()}); d.ExpectedTokens != 4000 {
		t.Fatalf("19 samples: expected %d, want still 4000", d.ExpectedTokens)
	}
	a.Observe("m", "t", 200)
	d := a.Admit(t0, r, []Option{idle()})
	if d.ExpectedTokens < 200 || d.ExpectedTokens > 240 {
		t.Fatalf("20 samples around 200: expected %d", d.ExpectedTokens)
	}
	if d.KVBlocks != (100+d.ExpectedTokens+15)/16 {
		t.Errorf("KV blocks %d not from the estimate %d", d.KVBlocks, d.ExpectedTokens)
	}
	// Another tenant falls back to the model's series; a tiny max_tokens stays the cap.
	r.Tenant = "other"
	if d := a.Admit(t0, r, []Option{idle()}); d.ExpectedTokens > 240 {
		t.Errorf("other tenant: expected %d, want the model's estimate", d.ExpectedTokens)
	}
	r.MaxTokens = ptr(50)
	if d := a.Admit(t0, r, []Option{idle()}); d.ExpectedTokens != 50 {
		t.Errorf("expected %d above max_tokens 50", d.ExpectedTokens)
	}
}

// TestLimits pins where a request's default and maximum max_tokens come from: the tenant's,
// else the model's, else Budget's, the default never above the maximum.
func TestLimits(t *testing.T) {
	a := newAdmitter(t, nil)
	capped := newAdmitter(t, func(c *Config) { c.Budget.MaxMaxTokens = 500 })
	tests := []struct {
		name             string
		a                *Admitter
		model, tenant    string
		wantDef, wantMax int
	}{
		{"global", a, "m", "t", 1024, 0},
		{"model", a, "small", "t", 256, 512},
		{"tenant over global", a, "m", "tight", 64, 128},
		{"tenant over model", a, "small", "tight", 64, 128},
		{"default cut to the maximum", capped, "m", "t", 500, 500},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, ok := tt.a.model(tt.model)
			if !ok {
				t.Fatalf("model %q unknown", tt.model)
			}
			if def, maxMT := tt.a.limits(m, tt.tenant); def != tt.wantDef || maxMT != tt.wantMax {
				t.Fatalf("limits = %d %d, want %d %d", def, maxMT, tt.wantDef, tt.wantMax)
			}
		})
	}
}
