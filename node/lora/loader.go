package lora

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Runtime is an engine's runtime adapter API: vLLM's POST /v1/load_lora_adapter and
// /v1/unload_lora_adapter, SGLang's /load_lora_adapter and /unload_lora_adapter, the
// embedded engine's own. Unloading an adapter the engine does not hold succeeds.
type Runtime interface {
	LoadAdapter(ctx context.Context, name, path string) error
	UnloadAdapter(ctx context.Context, name string) error
}

// Outcomes of a load, for OnLoad.
const (
	OutcomeLoaded  = "loaded"
	OutcomeFailed  = "failed"
	OutcomeTimeout = "timeout"
)

// Errors of Acquire, each wrapped in an *Error naming the adapter.
var (
	// ErrLoadFailed: the engine refused or failed the load (or the unload that made room).
	ErrLoadFailed = errors.New("lora: load failed")
	// ErrLoadTimeout: the load, or the wait for it, outlasted Config.Timeout.
	ErrLoadTimeout = errors.New("lora: load timed out")
	// ErrNoIdleSlot: the engine holds Config.Capacity adapters and requests hold each one
	// the loader may unload.
	ErrNoIdleSlot = errors.New("lora: every adapter slot is in use")
	// ErrNotInSource: a reload (SetSource) dropped the adapter's entry while the request
	// waited, and the engine does not hold it: there is nothing to load it from.
	ErrNotInSource = errors.New("lora: the adapter source no longer lists the adapter")
)

// Error is Acquire's failure for one adapter.
type Error struct {
	Adapter string
	Kind    error // ErrLoadFailed, ErrLoadTimeout, ErrNoIdleSlot or ErrNotInSource
	Cause   error // the engine's answer or the context's error; nil for ErrNoIdleSlot and ErrNotInSource
}

func (e *Error) Error() string {
	if e.Cause == nil {
		return fmt.Sprintf("%v: adapter %q", e.Kind, e.Adapter)
	}
	return fmt.Sprintf("%v: adapter %q: %v", e.Kind, e.Adapter, e.Cause)
}

// Unwrap returns the kind and the cause.
func (e *Error) Unwrap() []error { return []error{e.Kind, e.Cause} }

// Config configures a Loader. Source and Runtime are required.
type Config struct {
	Source  Source
	Runtime Runtime
	// Listed returns the adapters the engine lists now (nil: none), whoever loaded them.
	Listed func() []string
	// Capacity returns how many adapters the engine may hold at once (≤ 0: no bound).
	Capacity func() int
	// Timeout bounds a load, the unload before it included, and a request's wait for another
	// request's load (default 30s).
	Timeout time.Duration
	// LoadEstimate is Expected before any load was measured (default 1s).
	LoadEstimate time.Duration
	// Now is the clock loads are measured by (default time.Now).
	Now func() time.Time
	// OnLoad is told each load's outcome and duration, OnEvict each adapter unloaded to make
	// room (nil: nothing).
	OnLoad  func(adapter, outcome string, took time.Duration)
	OnEvict func(adapter string)
}

// adapter is the loader's knowledge of one source adapter.
type adapter struct {
	name string
	// known: the loader loaded or unloaded it, so its own loaded, not the engine's list
	// (which an external engine's node reads only now and then), says whether it is held.
	known, loaded bool
	refs          int
	used          uint64  // the loader's tick at its last acquire or release
	busy          *flight // a load of it, or its unload to make room, in progress
}

// flight is one load (with the unload before it, if any): its waiters block on done.
type flight struct {
	done chan struct{}
	err  error
}

// Loader loads a source's adapters on demand. See the package doc.
type Loader struct {
	cfg      Config // its Source is read and replaced under mu (SetSource)
	mu       sync.Mutex
	ads      map[string]*adapter
	tick     uint64
	estimate time.Duration
}

// New returns a Loader for cfg, its zero fields filled with their defaults.
func New(cfg Config) (*Loader, error) {
	if cfg.Runtime == nil {
		return nil, errors.New("lora: a runtime is required")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	if cfg.LoadEstimate <= 0 {
		cfg.LoadEstimate = time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Listed == nil {
		cfg.Listed = func() []string { return nil }
	}
	if cfg.Capacity == nil {
		cfg.Capacity = func() int { return 0 }
	}
	return &Loader{cfg: cfg, ads: map[string]*adapter{}, estimate: cfg.LoadEstimate}, nil
}

// Entry returns the source's entry for name.
func (l *Loader) Entry(name string) (Entry, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.cfg.Source[name]
	return e, ok
}

// Source returns the adapters of the source (the caller must not modify it).
func (l *Loader) Source() Source {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cfg.Source
}

// SetSource replaces the source (a reload read it again; the loader keeps src, which the
// caller must not modify). A load in progress completes from the entry it started with; an
// adapter the loader loaded stays in the engine, used and evicted as before, even if src no
// longer lists it (it is then never loaded again); a new entry loads at its first request.
func (l *Loader) SetSource(src Source) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cfg.Source = src
}

// Acquire makes sure the engine holds name and holds it in use until release is called
// (once). A name outside the source needs nothing: release is a no-op and err nil. See the
// package doc for the waits, the evictions and the errors.
func (l *Loader) Acquire(ctx context.Context, name string) (release func(), err error) {
	if _, ok := l.Entry(name); !ok {
		return func() {}, nil
	}
	wait, cancel := context.WithTimeout(ctx, l.cfg.Timeout)
	defer cancel()
	tr := traceOf(ctx)
	for {
		listed := l.cfg.Listed()
		capacity := l.cfg.Capacity()
		l.mu.Lock()
		a := l.adapterLocked(name)
		switch {
		case a.busy != nil:
			f := a.busy
			l.mu.Unlock()
			if err := l.await(wait, ctx, name, f, tr); err != nil {
				return nil, err
			}
			continue // loaded (or unloaded to make room): look again
		case l.heldLocked(name, a, listed):
			a.refs++
			l.tick++
			a.used = l.tick
			l.mu.Unlock()
			return l.releaser(a), nil
		}
		e, ok := l.cfg.Source[name]
		if !ok { // a reload dropped it meanwhile: nothing to load it from
			l.mu.Unlock()
			return nil, &Error{Adapter: name, Kind: ErrNotInSource}
		}
		victim, err := l.victimLocked(name, listed, capacity)
		if err != nil {
			l.mu.Unlock()
			return nil, err
		}
		f := &flight{done: make(chan struct{})}
		a.busy = f
		if victim != nil {
			victim.busy = f
		}
		l.mu.Unlock()
		if err := l.run(ctx, name, e.Path, a, victim, f, tr); err != nil {
			return nil, err
		}
	}
}

// await waits for f, another request's load of name, within wait (bounded by Timeout) and
// ctx (the request's), and tells tr how long it waited.
func (l *Loader) await(wait, ctx context.Context, name string, f *flight, tr *Trace) error {
	start := l.cfg.Now()
	defer func() { tr.waited(l.cfg.Now().Sub(start)) }()
	select {
	case <-f.done:
		if f.err != nil {
			return f.err
		}
		return nil
	case <-wait.Done():
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return &Error{Adapter: name, Kind: ErrLoadTimeout, Cause: fmt.Errorf("waited %v for another request's load", l.cfg.Timeout)}
	}
}

// run performs the flight f: unload victim (if any), then load name from path, telling tr.
// It returns the flight's error.
func (l *Loader) run(ctx context.Context, name, path string, a, victim *adapter, f *flight, tr *Trace) error {
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.cfg.Timeout)
	defer cancel()
	start := l.cfg.Now()
	var err error
	unloaded := false
	if victim != nil {
		err = l.cfg.Runtime.UnloadAdapter(lctx, victim.name)
		tr.unloaded(victim.name, l.cfg.Now().Sub(start), err)
		if err != nil {
			err = fmt.Errorf("unloading %q to make room: %w", victim.name, err)
		}
		unloaded = err == nil
	}
	if err == nil {
		err = l.cfg.Runtime.LoadAdapter(lctx, name, path)
	}
	took := l.cfg.Now().Sub(start)
	outcome := OutcomeLoaded
	switch {
	case err != nil && lctx.Err() != nil:
		outcome, err = OutcomeTimeout, &Error{Adapter: name, Kind: ErrLoadTimeout, Cause: err}
	case err != nil:
		outcome, err = OutcomeFailed, &Error{Adapter: name, Kind: ErrLoadFailed, Cause: err}
	}
	l.mu.Lock()
	if victim != nil {
		victim.busy = nil
		if unloaded {
			victim.known, victim.loaded = true, false
		}
	}
	a.busy = nil
	if err == nil {
		a.known, a.loaded = true, true
		l.estimate = (l.estimate*7 + took*3) / 10
	}
	f.err = err
	close(f.done)
	l.mu.Unlock()
	if unloaded && l.cfg.OnEvict != nil {
		l.cfg.OnEvict(victim.name)
	}
	if l.cfg.OnLoad != nil {
		l.cfg.OnLoad(name, outcome, took)
	}
	tr.loaded(outcome, took)
	return err
}

// releaser returns the release of one hold on a.
func (l *Loader) releaser(a *adapter) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			a.refs--
			l.tick++
			a.used = l.tick
			l.mu.Unlock()
		})
	}
}

func (l *Loader) adapterLocked(name string) *adapter {
	a := l.ads[name]
	if a == nil {
		a = &adapter{name: name}
		l.ads[name] = a
	}
	return a
}

// heldLocked reports whether the engine holds name (a, the loader's record of it, may be
// nil): as the loader left it, or, for one the loader never touched, as the engine lists it.
func (l *Loader) heldLocked(name string, a *adapter, listed []string) bool {
	if a != nil && a.known {
		return a.loaded
	}
	return slices.Contains(listed, name)
}

// victimLocked returns the adapter to unload before name loads: nil when the engine holds
// fewer than capacity adapters (those it holds, and those being loaded), else the least
// recently used adapter it holds that no request holds and that the source lists or the
// loader loaded, or ErrNoIdleSlot.
func (l *Loader) victimLocked(name string, listed []string, capacity int) (*adapter, error) {
	if capacity <= 0 {
		return nil, nil
	}
	names := slices.Clone(listed)
	for n := range l.ads {
		if !slices.Contains(listed, n) {
			names = append(names, n)
		}
	}
	held := 0
	var victim *adapter
	for _, n := range names {
		a := l.ads[n]
		if (a == nil || a.busy == nil) && !l.heldLocked(n, a, listed) {
			continue
		}
		held++
		_, listedInSource := l.cfg.Source[n]
		ours := listedInSource || a != nil && a.known // one a reload dropped, the loader may still evict
		if !ours || n == name || (a != nil && (a.busy != nil || a.refs > 0)) {
			continue
		}
		if a == nil {
			a = l.adapterLocked(n) // listed by the engine, untouched: used never
		}
		if victim == nil || a.used < victim.used {
			victim = a
		}
	}
	if held < capacity {
		return nil, nil
	}
	if victim == nil {
		return nil, &Error{Adapter: name, Kind: ErrNoIdleSlot}
	}
	return victim, nil
}

// Expected is the load time a request for name should count before its first token: zero
// for a name outside the source or one the engine holds, else the mean of recent loads.
func (l *Loader) Expected(name string) time.Duration {
	if _, ok := l.Entry(name); !ok {
		return 0
	}
	listed := l.cfg.Listed()
	l.mu.Lock()
	defer l.mu.Unlock()
	if a := l.ads[name]; (a == nil || a.busy == nil) && l.heldLocked(name, a, listed) {
		return 0
	}
	return l.estimate
}

// Loaded returns the source adapters the loader loaded and the engine still holds, sorted.
func (l *Loader) Loaded() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for n, a := range l.ads {
		if a.known && a.loaded {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// Estimate is the load time of an adapter the engine does not hold: the mean of recent
// loads, Config.LoadEstimate before the first.
func (l *Loader) Estimate() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.estimate
}
