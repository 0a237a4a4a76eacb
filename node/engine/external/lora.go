package external

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/node/engine"
)

// LoRA adapter discovery. The adapters an engine has loaded come with its model list (vLLM
// lists each with "parent", its base model: served and withAdapters in models.go); which of
// them run and wait, and the engine's adapter slots, come from its metrics, for the kinds that
// export them (kindNames.loraInfo): vLLM's vllm:lora_requests_info gauge, whose labels name
// the adapters of running and waiting requests (comma-separated) and max_lora, and whose value
// is the time it was set. vLLM keeps a series for every label set it ever had, so the latest
// (largest value) is the current one.

// loraState reads the adapter state from the scrape m under the kind's info gauge name; zero
// when the engine does not export it. The running adapters are resident: an adapter runs in a
// GPU slot. vLLM says nothing of idle adapters in slots, so Resident holds no other.
func loraState(m map[string][]sample, name string) engine.LoRAState {
	var latest *sample
	for i, s := range m[name] {
		if latest == nil || s.value > latest.value {
			latest = &m[name][i]
		}
	}
	if latest == nil {
		return engine.LoRAState{}
	}
	st := engine.LoRAState{
		Running: adapterList(latest.labels["running_lora_adapters"]),
		Waiting: adapterList(latest.labels["waiting_lora_adapters"]),
	}
	if n, err := strconv.Atoi(latest.labels["max_lora"]); err == nil && n > 0 {
		st.MaxLoRAs = n
	}
	st.Resident = slices.Clone(st.Running)
	return st
}

// adapterList splits a comma-separated label into its names, sorted, without duplicates or
// empty names.
func adapterList(label string) []string {
	var out []string
	for _, n := range strings.Split(label, ",") {
		if n = strings.TrimSpace(n); n != "" {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// The runtime adapter API: LoadAdapter and UnloadAdapter send {"lora_name", "lora_path"} to
// vLLM's POST /v1/load_lora_adapter and /v1/unload_lora_adapter (served with
// VLLM_ALLOW_RUNTIME_LORA_UPDATING=True; kvmesh engine serves them too), or to SGLang's
// POST /load_lora_adapter and /unload_lora_adapter (SGLang answers JSON with "success" and
// "error_message"). A load of an adapter the engine already holds, and an unload of one it
// does not know (404), succeed.

// adapterCallTimeout bounds one runtime adapter call when ctx has no sooner deadline.
const adapterCallTimeout = 5 * time.Minute

// LoadAdapter loads the LoRA adapter name from path on the engine.
func (e *Engine) LoadAdapter(ctx context.Context, name, path string) error {
	return e.adapterCall(ctx, "load_lora_adapter", loraRequest{Name: name, Path: path})
}

// UnloadAdapter unloads the LoRA adapter name from the engine.
func (e *Engine) UnloadAdapter(ctx context.Context, name string) error {
	return e.adapterCall(ctx, "unload_lora_adapter", loraRequest{Name: name})
}

type loraRequest struct {
	Name string `json:"lora_name"`
	Path string `json:"lora_path,omitempty"`
}

// AdapterAPI names the engine's runtime load call, as a load's trace span shows it ("" for
// a nil Engine).
func (e *Engine) AdapterAPI() string {
	if e == nil {
		return ""
	}
	return http.MethodPost + " " + e.adapterPath("load_lora_adapter")
}

// adapterPath is the path of the runtime adapter call op on the engine's kind.
func (e *Engine) adapterPath(op string) string {
	if e.cfg.Kind == KindSGLang {
		return "/" + op
	}
	return "/v1/" + op
}

func (e *Engine) adapterCall(ctx context.Context, op string, r loraRequest) error {
	path := e.adapterPath(op)
	body, _ := json.Marshal(r) // two strings: cannot fail
	ctx, cancel := context.WithTimeout(ctx, adapterCallTimeout)
	defer cancel()
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, e.url(path), bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("external: building request: %w", err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := e.client.Do(hreq)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("external: %s %q: %w", op, r.Name, ctx.Err())
		}
		return fmt.Errorf("external: %s %q: %w: %w", op, r.Name, engine.ErrUnavailable, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	msg := adapterAnswer(data)
	switch {
	case resp.StatusCode == http.StatusOK && !strings.Contains(string(data), `"success":false`) &&
		!strings.Contains(string(data), `"success": false`):
		return nil
	case r.Path != "" && strings.Contains(msg, "already"): // loaded already: what was asked
		return nil
	case r.Path == "" && resp.StatusCode == http.StatusNotFound: // not loaded: what was asked
		return nil
	}
	return fmt.Errorf("external: %s %q: status %d: %s", op, r.Name, resp.StatusCode, msg)
}

// adapterAnswer is the message of an engine's answer to a runtime adapter call: SGLang's
// error_message, an OpenAI error's message, else the text itself (vLLM answers text).
func adapterAnswer(data []byte) string {
	var a struct {
		ErrorMessage string `json:"error_message"`
		Message      string `json:"message"`
		Error        struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(data, &a) == nil {
		if m := cmp.Or(a.ErrorMessage, a.Error.Message, a.Message); m != "" {
			return m
		}
	}
	return strings.TrimSpace(string(data))
}

// sglangModel is the model to name to an SGLang server for a request for model: SGLang's
// OpenAI API takes an adapter as "BASE:ADAPTER" (a bare adapter name would run on the base
// model), BASE its one served model; a base model's name is sent as it is.
func (e *Engine) sglangModel(model string) (string, bool) {
	if e.cfg.Kind != KindSGLang {
		return "", false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	base := ""
	for _, m := range e.models {
		if m.Name == model && m.Parent == "" {
			return "", false
		}
		if base == "" && m.Parent == "" {
			base = m.Name
		}
	}
	if base == "" || strings.Contains(model, ":") {
		return "", false
	}
	return base + ":" + model, true
}
