package sim

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/kvmesh/kvmesh/node/engine"
)

// LoRA adapters, modelled on vLLM's multi-LoRA serving. The engine knows a set of adapters
// (Config.LoRAModules, and those loaded at run time), each of a base model; a request whose
// model names one runs on the base model with the adapter. A batch holds at most MaxLoRAs
// distinct adapters, each in one of MaxLoRAs GPU slots. A waiting request whose adapter is not
// in the step's batch, when the batch already holds MaxLoRAs adapters, is skipped (it waits;
// requests behind it may start, as vLLM's scheduler skips it). Batching an adapter not in a
// slot takes a free slot or evicts the least recently batched adapter no running request uses,
// and adds LoRALoadTime to that step. Each distinct adapter in a step adds StepPerLoRA.
//
// The prefix cache is keyed by adapter: a request's block hashes are seeded by its model name
// (kvindex.AppendBlocks), the adapter's for an adapter request, so an adapter's requests never
// reuse another adapter's or the base model's blocks, as vLLM keys its blocks by LoRA id.

// Errors of LoadAdapter and UnloadAdapter, each wrapping engine.ErrRejected.
var (
	// ErrAdapterArgs: a load without a name or a path, or an unload without a name.
	ErrAdapterArgs = fmt.Errorf("sim: both 'lora_name' and 'lora_path' must be provided: %w", engine.ErrRejected)
	// ErrAdapterExists: a load of a name already loaded, being loaded, or a base model's.
	ErrAdapterExists = fmt.Errorf("sim: the adapter has already been loaded: %w", engine.ErrRejected)
	// ErrAdapterNotFound: an unload of a name the engine does not know.
	ErrAdapterNotFound = fmt.Errorf("sim: the adapter cannot be found: %w", engine.ErrRejected)
)

// adapter is one known LoRA adapter.
type adapter struct{ path, base string }

// loraSlot is a GPU adapter slot; used is the loraClock of the last step that batched it.
type loraSlot struct {
	name string
	used uint64
}

// loraState is the Sim's adapter bookkeeping, under Sim.mu.
type loraState struct {
	known   map[string]adapter
	loading map[string]bool // runtime loads in progress
	slots   []loraSlot      // resident adapters, at most MaxLoRAs
	clock   uint64          // steps scheduled, for the slots' LRU order
	loads   uint64          // adapters brought into a slot, for the metrics
	batch   map[string]bool // the adapters the step being scheduled holds
	load    time.Duration   // load time the step being scheduled adds
}

func newLoRAState(cfg *Config) loraState {
	l := loraState{known: map[string]adapter{}, loading: map[string]bool{}, batch: map[string]bool{}}
	for name, path := range cfg.LoRAModules {
		l.known[name] = adapter{path: path, base: cfg.Models[0].Name}
	}
	return l
}

// resolve returns the base model a request for model runs on and the adapter it names ("" for
// a base model's request).
func (s *Sim) resolve(model string) (engine.Model, string, bool) {
	if m, ok := s.models[model]; ok {
		return m, "", true
	}
	s.mu.Lock()
	a, ok := s.lora.known[model]
	s.mu.Unlock()
	if !ok {
		return engine.Model{}, "", false
	}
	return s.models[a.base], model, true
}

// Models lists the base models, then the known adapters by name, each with its Parent and
// its base model's context, as vLLM's /v1/models lists them.
func (s *Sim) Models() []engine.Model {
	out := slices.Clone(s.cfg.Models)
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, name := range slices.Sorted(maps.Keys(s.lora.known)) {
		a := s.lora.known[name]
		out = append(out, engine.Model{Name: name, ContextTokens: s.models[a.base].ContextTokens, Parent: a.base, Root: a.path})
	}
	return out
}

// LoadAdapter adds the adapter name, read from path, as an adapter of the first model, as
// vLLM's POST /v1/load_lora_adapter does: it takes LoRALoadTime (scaled by TimeScale) and
// puts the adapter in a free GPU slot if there is one. It refuses ErrAdapterArgs,
// ErrAdapterExists, ErrClosed, and ctx's error if ctx ends first (nothing is then loaded).
func (s *Sim) LoadAdapter(ctx context.Context, name, path string) error {
	if name == "" || path == "" {
		return ErrAdapterArgs
	}
	s.mu.Lock()
	_, known := s.lora.known[name]
	_, base := s.models[name]
	switch {
	case s.closed:
		s.mu.Unlock()
		return ErrClosed
	case known || base || s.lora.loading[name]:
		s.mu.Unlock()
		return fmt.Errorf("%w: %q", ErrAdapterExists, name)
	}
	s.lora.loading[name] = true
	s.mu.Unlock()

	t := time.NewTimer(time.Duration(float64(s.cfg.LoRALoadTime) / s.cfg.TimeScale))
	defer t.Stop()
	var err error
	select {
	case <-t.C:
	case <-ctx.Done():
		err = fmt.Errorf("sim: load adapter %q: %w", name, ctx.Err())
	case <-s.done:
		err = ErrClosed
	}
	s.mu.Lock()
	delete(s.lora.loading, name)
	if err == nil {
		s.lora.known[name] = adapter{path: path, base: s.cfg.Models[0].Name}
		if len(s.lora.slots) < s.cfg.MaxLoRAs {
			s.lora.slots = append(s.lora.slots, loraSlot{name: name, used: s.lora.clock})
			s.lora.loads++
		}
	}
	s.mu.Unlock()
	if err == nil {
		s.log.Info("sim: loaded LoRA adapter", "name", name, "path", path)
	}
	return err
}

// UnloadAdapter forgets the adapter name, as vLLM's POST /v1/unload_lora_adapter does: new
// requests for it are refused; those already queued or running finish, and its GPU slot is
// freed at once if no running request uses it, else evicted in time. ErrAdapterNotFound if
// the engine does not know it.
func (s *Sim) UnloadAdapter(name string) error {
	if name == "" {
		return ErrAdapterArgs
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.lora.known[name]; !ok {
		return fmt.Errorf("%w: %q", ErrAdapterNotFound, name)
	}
	delete(s.lora.known, name)
	if !slices.ContainsFunc(s.running, func(q *seq) bool { return q.adapter == name }) {
		s.lora.slots = slices.DeleteFunc(s.lora.slots, func(l loraSlot) bool { return l.name == name })
	}
	return nil
}

// beginLoRAStepLocked starts a step's adapter accounting: the batch holds the running
// sequences' adapters, each in a slot already.
func (s *Sim) beginLoRAStepLocked() {
	s.lora.clock++
	clear(s.lora.batch)
	s.lora.load = 0
	for _, q := range s.running {
		if q.adapter != "" {
			s.lora.batch[q.adapter] = true
		}
	}
}

// loraFitsLocked reports whether waiting q's adapter may join this step's batch.
func (s *Sim) loraFitsLocked(q *seq) bool {
	return q.adapter == "" || s.lora.batch[q.adapter] || len(s.lora.batch) < s.cfg.MaxLoRAs
}

// activateLoRALocked puts admitted q's adapter in the batch and in a slot: a free one, or the
// least recently batched one outside the batch (one exists: loraFitsLocked held, and every
// adapter of the batch has a slot), adding LoRALoadTime to the step.
func (s *Sim) activateLoRALocked(q *seq) {
	if q.adapter == "" || s.lora.batch[q.adapter] {
		return
	}
	s.lora.batch[q.adapter] = true
	if slices.ContainsFunc(s.lora.slots, func(l loraSlot) bool { return l.name == q.adapter }) {
		return
	}
	s.lora.load += s.cfg.LoRALoadTime
	s.lora.loads++
	if len(s.lora.slots) < s.cfg.MaxLoRAs {
		s.lora.slots = append(s.lora.slots, loraSlot{name: q.adapter})
		return
	}
	victim := -1
	for i, l := range s.lora.slots {
		if !s.lora.batch[l.name] && (victim < 0 || l.used < s.lora.slots[victim].used) {
			victim = i
		}
	}
	s.log.Debug("sim: LoRA adapter evicted", "evicted", s.lora.slots[victim].name, "loaded", q.adapter)
	s.lora.slots[victim] = loraSlot{name: q.adapter}
}

// loraStepCostLocked returns what the planned step's adapters add to its time, and marks
// their slots used now.
func (s *Sim) loraStepCostLocked() time.Duration {
	n := 0
	for i := range s.lora.slots {
		l := &s.lora.slots[i]
		if slices.ContainsFunc(s.plan, func(it planItem) bool { return it.q.adapter == l.name }) {
			l.used = s.lora.clock
			n++
		}
	}
	return s.lora.load + time.Duration(n)*s.cfg.StepPerLoRA
}

// seatedLocked returns whether a waiting sequence's adapter may join the batch as it runs now
// (a base model's always): not when the running sequences hold MaxLoRAs other adapters, as
// the scheduler then skips it (loraFitsLocked). State leaves such a sequence out of the queue
// it reports (engine.LoRAState.Blocked).
func (s *Sim) seatedLocked() func(*seq) bool {
	running := adaptersOf(s.running)
	full := s.cfg.MaxLoRAs > 0 && len(running) >= s.cfg.MaxLoRAs
	return func(q *seq) bool {
		if !full || q.adapter == "" {
			return true
		}
		_, ok := slices.BinarySearch(running, q.adapter)
		return ok
	}
}

// loraStateLocked is State's LoRA part, blocked the waiting sequences seatedLocked leaves out.
func (s *Sim) loraStateLocked(blocked int) engine.LoRAState {
	st := engine.LoRAState{MaxLoRAs: s.cfg.MaxLoRAs, Blocked: blocked}
	for _, l := range s.lora.slots {
		st.Resident = append(st.Resident, l.name)
	}
	st.Running = adaptersOf(s.running)
	st.Waiting = adaptersOf(s.waiting)
	slices.Sort(st.Resident)
	return st
}

// adaptersOf returns the distinct adapters of qs, sorted.
func adaptersOf(qs []*seq) []string {
	var out []string
	for _, q := range qs {
		if q.adapter != "" {
			out = append(out, q.adapter)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// AdapterLoads returns how many times an adapter was brought into a GPU slot.
func (s *Sim) AdapterLoads() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lora.loads
}
