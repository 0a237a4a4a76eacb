package admit

// Validate is layer 1: parameter bounds and a model the mesh serves. It is pure and cheap.
func (a *Admitter) Validate(req Request) Decision {
	v := a.conf().Validation
	bad := func(param, format string, args ...any) Decision {
		return refuse(statusBadRequest, LayerValidation, CodeInvalidParameter, param, format, args...)
	}
	switch {
	case req.PromptTokens < 0:
		return bad("prompt", "prompt token count is negative")
	case req.N != nil && (*req.N < 1 || *req.N > v.MaxN):
		if v.MaxN == 1 {
			return bad("n", "n must be 1")
		}
		return bad("n", "n must be between 1 and %d", v.MaxN)
	case req.StopCount < 0 || req.StopCount > v.MaxStop:
		return bad("stop", "at most %d stop sequences are allowed", v.MaxStop)
	case req.MaxTokens != nil && *req.MaxTokens < 1:
		return bad("max_tokens", "max_tokens must be at least 1")
	case req.Temperature != nil && !(*req.Temperature >= 0 && *req.Temperature <= 2):
		return bad("temperature", "temperature must be between 0 and 2")
	case req.TopP != nil && !(*req.TopP >= 0 && *req.TopP <= 1):
		return bad("top_p", "top_p must be between 0 and 1")
	case req.Logprobs != nil && (*req.Logprobs < 0 || *req.Logprobs > v.MaxLogprobs):
		return bad("logprobs", "logprobs must be between 0 and %d", v.MaxLogprobs)
	case req.Priority < -maxPriorityValue || req.Priority > maxPriorityValue:
		return bad("priority", "priority must be between -%d and %d", maxPriorityValue, maxPriorityValue)
	case req.TTFTSLO < 0 || req.TPOTSLO < 0 || req.QueueTTL < 0:
		return bad("slo", "durations must not be negative")
	}
	if _, ok := a.model(req.Model); !ok {
		return refuse(statusNotFound, LayerValidation, CodeModelNotFound, "model",
			"model %q is not served by this mesh", clip(req.Model))
	}
	return Decision{Action: Accept, Layer: LayerValidation, Code: CodeAccepted, Option: -1}
}

func (a *Admitter) model(name string) (ModelConfig, bool) {
	if a.conf().ModelInfo != nil {
		ctx, ok := a.conf().ModelInfo(name)
		if !ok {
			return ModelConfig{}, false
		}
		m := a.conf().Models[name]
		m.ContextTokens = ctx
		return m, true
	}
	m, ok := a.conf().Models[name]
	return m, ok
}
