package admit

import "time"

// Identify is layer 2: the API key names the tenant (headers never do) and pays into its
// token bucket: prompt tokens + max_tokens as layer 3 admits it (the default, a clamp; nothing
// for a request layer 3 refuses), the whole of it even past the key's burst. With no keys
// configured access is open: tenant "default", no limit. It returns the tenant on accept.
func (a *Admitter) Identify(now time.Time, req Request) (string, Decision) {
	if a.keys.Len() == 0 {
		open := maxPriorityValue
		if a.conf().Keys.MaxPriority != nil {
			open = *a.conf().Keys.MaxPriority
		}
		return defaultTenant, granted(Decision{Action: Accept, Layer: LayerIdentity, Code: CodeAccepted, Tenant: defaultTenant, Option: -1}, req.Priority, open)
	}
	st := a.keys.lookup(req.APIKey)
	if st == nil || req.APIKey == "" {
		return "", refuse(statusUnauthorized, LayerIdentity, CodeInvalidAPIKey, "", "invalid or missing API key")
	}
	// What would run, as layer 3 will admit it (the default filled in, a clamp applied): a
	// request it will refuse (a max_tokens past the context or the limit, an unknown model)
	// runs nothing and costs nothing, where charged whole it would lock its key out for hours.
	req.Tenant = st.tenant
	cost := 0
	if bd := a.budget(req); !bd.Refused() {
		cost = max(req.PromptTokens, 0) + bd.MaxTokens
	}
	if cost > 0 {
		if wait, ok := st.take(now, cost); !ok {
			d := refuse(statusTooManyRequests, LayerIdentity, CodeRateLimited, "",
				"rate limit of %.0f tokens/s for this API key exceeded", st.rate)
			d.RetryAfter = wait
			d.Tenant = st.tenant
			return "", d
		}
	}
	return st.tenant, granted(Decision{Action: Accept, Layer: LayerIdentity, Code: CodeAccepted, Tenant: st.tenant, Option: -1}, req.Priority, st.maxPrio)
}

// granted sets the priority d grants a request that asked for asked, under the cap of its key
// (or of an open mesh): asked, or the cap when asked is higher (PriorityClamped).
func granted(d Decision, asked, limit int) Decision {
	d.Priority = min(asked, limit)
	d.PriorityClamped = asked > limit
	return d
}
