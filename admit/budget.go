package admit

// Budget is layer 3 alone, for a request that is not run through Admit (the Responses API's
// output cap): its max_tokens as admitted (the default, a clamp), or the refusal.
func (a *Admitter) Budget(req Request) Decision { return a.budget(req) }

// budget is layer 3: prompt + max_tokens within the model's context, the max_tokens limits of
// the tenant, then the model, then Budget. Its accept carries MaxTokens (an absent max_tokens
// filled with the default, cut to the room left in the context; a clamp when
// Budget.ClampMaxTokens) and ExpectedTokens, the output reserved for KV (the learned estimate,
// never above MaxTokens).
func (a *Admitter) budget(req Request) Decision {
	m, ok := a.model(req.Model)
	if !ok {
		return refuse(statusNotFound, LayerBudget, CodeModelNotFound, "model",
			"model %q is not served by this mesh", clip(req.Model))
	}
	def, maxMT := a.limits(m, req.Tenant)
	room := m.ContextTokens - req.PromptTokens
	var mt int
	if req.MaxTokens == nil {
		mt = max(min(def, room), 1)
	} else {
		mt = *req.MaxTokens
		if maxMT > 0 && mt > maxMT {
			if !a.conf().Budget.ClampMaxTokens {
				return refuse(statusBadRequest, LayerBudget, CodeInvalidParameter, "max_tokens",
					"max_tokens %d is above this route's limit of %d", mt, maxMT)
			}
			mt = maxMT
		}
	}
	if req.PromptTokens+mt > m.ContextTokens {
		return refuse(statusBadRequest, LayerBudget, CodeContextLengthExceeded, "max_tokens",
			"this model's context is %d tokens; the request has %d prompt tokens and max_tokens %d",
			m.ContextTokens, req.PromptTokens, mt)
	}
	return Decision{Action: Accept, Layer: LayerBudget, Code: CodeAccepted, Tenant: req.Tenant, Option: -1,
		MaxTokens: mt, ExpectedTokens: a.est.expected(req.Model, req.Tenant, mt)}
}

// limits returns the default and maximum max_tokens for req: tenant, then model, then Budget.
func (a *Admitter) limits(m ModelConfig, tenant string) (def, maxMT int) {
	def, maxMT = a.conf().Budget.DefaultMaxTokens, a.conf().Budget.MaxMaxTokens
	if m.DefaultMaxTokens > 0 {
		def = m.DefaultMaxTokens
	}
	if m.MaxMaxTokens > 0 {
		maxMT = m.MaxMaxTokens
	}
	if t, ok := a.conf().Tenants[tenant]; ok {
		if t.DefaultMaxTokens > 0 {
			def = t.DefaultMaxTokens
		}
		if t.MaxMaxTokens > 0 {
			maxMT = t.MaxMaxTokens
		}
	}
	if maxMT > 0 {
		def = min(def, maxMT)
	}
	return def, maxMT
}
