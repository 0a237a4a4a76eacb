package external

import (
	"slices"
	"strconv"
	"strings"

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
