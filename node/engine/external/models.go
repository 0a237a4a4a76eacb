package external

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/node/engine"
	wire "github.com/kvmesh/kvmesh/node/openai"
)

// Model discovery: the server's GET /v1/models, read at Start and every Config.ModelsInterval.
//
// With Config.Models empty the Engine serves exactly what the server lists; with Config.Models
// set it serves those of them the server lists, in the configured order. A configured model
// the server does not list is an error at Start (ErrModelNotServed) when the server answers;
// later it is logged and the model is not served until the server lists it again. A server
// that does not answer at Start leaves the Engine unhealthy, not failed: it turns healthy at
// the first good fetch (retried every ScrapeInterval while fetches fail), so a node may start
// before its engine has loaded its weights.
//
// The models are healthy, and State().Healthy may be true, while the last fetch, or one of the
// last MaxScrapeFailures, succeeded and the Engine serves at least one model. While fetches
// fail, Models keeps the last list (the configured one before any fetch succeeded).

// ErrModelNotServed: a configured model is not in the server's /v1/models list at Start.
var ErrModelNotServed = errors.New("external: configured model not served by the engine")

// modelsFetchTimeout bounds one GET /v1/models.
const modelsFetchTimeout = 10 * time.Second

// errModelsNotFetched is the models' health before the first fetch.
var errModelsNotFetched = errors.New("the engine's model list has not been fetched yet")

// fetchModels reads the server's model list. An entry's ContextTokens is its max_model_len,
// 0 when the server does not send one; Parent and Root are vLLM's parent (set for a LoRA
// adapter: its base model) and root.
func (e *Engine) fetchModels(ctx context.Context) ([]engine.Model, error) {
	ctx, cancel := context.WithTimeout(ctx, modelsFetchTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.url("/v1/models"), nil)
	if err != nil {
		return nil, fmt.Errorf("external: models request: %w", err)
	}
	resp, err := e.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("external: fetching models: %w: %w", engine.ErrUnavailable, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("external: fetching models: status %d: %w", resp.StatusCode, engine.ErrUnavailable)
	}
	var list wire.ModelList
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(&list); err != nil {
		return nil, fmt.Errorf("external: decoding models: %w", err)
	}
	ms := make([]engine.Model, 0, len(list.Data))
	for _, m := range list.Data {
		if m.ID == "" || slices.ContainsFunc(ms, func(x engine.Model) bool { return x.Name == m.ID }) {
			continue
		}
		ms = append(ms, engine.Model{Name: m.ID, ContextTokens: max(m.MaxModelLen, 0), Parent: m.Parent, Root: m.Root})
	}
	return ms, nil
}

// served picks the models this Engine serves from the server's list: all of them, or the
// configured ones it lists (missing names the others) and the adapters of those (listed with
// a Parent among them). A model's context is the server's max_model_len, else the configured
// context, else DefaultContextTokens; an adapter's is its parent's (vLLM sends none).
func (e *Engine) served(listed []engine.Model) (out []engine.Model, missing []string) {
	out, missing = e.servedBase(listed)
	return withAdapters(out, listed), missing
}

// withAdapters appends to served the adapters in listed whose parent is a served base model,
// and gives every served adapter of such a parent the parent's context.
func withAdapters(served, listed []engine.Model) []engine.Model {
	ctx := make(map[string]int, len(served))
	for _, m := range served {
		if m.Parent == "" {
			ctx[m.Name] = m.ContextTokens
		}
	}
	for _, m := range listed {
		if _, ok := ctx[m.Parent]; ok && !slices.ContainsFunc(served, func(x engine.Model) bool { return x.Name == m.Name }) {
			served = append(served, m)
		}
	}
	for i, m := range served {
		if c, ok := ctx[m.Parent]; ok && m.Parent != "" {
			served[i].ContextTokens = c
		}
	}
	return served
}

func (e *Engine) servedBase(listed []engine.Model) (out []engine.Model, missing []string) {
	ctxOf := func(m engine.Model, configured int) engine.Model {
		if m.ContextTokens <= 0 {
			m.ContextTokens = configured
		}
		if m.ContextTokens <= 0 {
			m.ContextTokens = e.cfg.DefaultContextTokens
		}
		return m
	}
	if len(e.cfg.Models) == 0 {
		for _, m := range listed {
			if m.Parent == "" { // adapters follow their parents (withAdapters)
				out = append(out, ctxOf(m, 0))
			}
		}
		return out, nil
	}
	for _, want := range e.cfg.Models {
		i := slices.IndexFunc(listed, func(m engine.Model) bool { return m.Name == want.Name })
		if i < 0 {
			missing = append(missing, want.Name)
			continue
		}
		out = append(out, ctxOf(listed[i], want.ContextTokens))
	}
	return out, missing
}

func modelNames(ms []engine.Model) string {
	names := make([]string, len(ms))
	for i, m := range ms {
		names[i] = fmt.Sprintf("%q", m.Name)
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// refreshModels fetches the server's list and updates the models served and their health.
// At Start (atStart) a configured model the server does not list is an error wrapping
// ErrModelNotServed and changes nothing; later it is logged. A failed fetch is returned and
// counted. Only Start and the loop call it, never two at once.
func (e *Engine) refreshModels(ctx context.Context, atStart bool) error {
	listed, err := e.fetchModels(ctx)
	if err != nil {
		e.mu.Lock()
		e.modelFails++
		wasHealthy := e.modelsErr == nil
		if !e.modelsKnown || e.modelFails >= e.cfg.MaxScrapeFailures {
			e.modelsErr = fmt.Errorf("engine unreachable: %w", err)
		}
		nowHealthy := e.modelsErr == nil
		e.mu.Unlock()
		if wasHealthy && !nowHealthy {
			e.log.Warn("engine model list unavailable; engine unhealthy", "engine", e.base.String(), "err", err)
		}
		return err
	}
	out, missing := e.served(listed)
	if atStart && len(missing) > 0 {
		e.mu.Lock()
		e.modelFails = 0
		e.mu.Unlock()
		return fmt.Errorf("%w: %s does not serve %s (it serves %s)", ErrModelNotServed, e.base.String(),
			strings.Join(quoteAll(missing), ", "), modelNames(listed))
	}
	var health error
	switch {
	case len(out) > 0:
	case len(e.cfg.Models) > 0:
		health = fmt.Errorf("the engine serves none of the configured models %s (it serves %s)", modelNames(e.cfg.Models), modelNames(listed))
	default:
		health = errors.New("the engine lists no models")
	}
	missingNow := strings.Join(missing, "\x00")
	e.mu.Lock()
	prev, prevErr, prevMissing := e.models, e.modelsErr, e.lastMissing
	e.models, e.modelsErr, e.modelFails, e.modelsKnown, e.lastMissing = out, health, 0, true, missingNow
	e.mu.Unlock()
	switch {
	case health != nil && (prevErr == nil || prevErr.Error() != health.Error()):
		e.log.Error("engine unhealthy", "engine", e.base.String(), "reason", health.Error())
	case !slices.Equal(prev, out) || prevErr != nil:
		e.log.Info("engine models", "engine", e.base.String(), "models", modelNames(out))
	}
	if len(missing) > 0 && missingNow != prevMissing {
		e.log.Error("engine does not serve configured models", "engine", e.base.String(),
			"missing", strings.Join(quoteAll(missing), ", "), "listed", modelNames(listed))
	}
	return nil
}

func quoteAll(names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = fmt.Sprintf("%q", n)
	}
	return out
}

// nextModelsFetch is the wait before the next fetch: ModelsInterval after a good one, the
// scrape interval (if shorter) while fetches fail.
func (e *Engine) nextModelsFetch() time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.modelFails > 0 {
		return min(e.cfg.ScrapeInterval, e.cfg.ModelsInterval)
	}
	return e.cfg.ModelsInterval
}

// Health returns nil while the engine is healthy, else why not: its model list (unreachable,
// none of the configured models served) or its metrics scrape.
func (e *Engine) Health() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.modelsErr != nil {
		return fmt.Errorf("external: %w", e.modelsErr)
	}
	if !e.state.Healthy {
		return fmt.Errorf("external: no good scrape of %s/metrics lately", e.base.String())
	}
	return nil
}
