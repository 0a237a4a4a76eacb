package lora

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// fakeRuntime is an engine's runtime API in memory: it records loads and unloads, and a
// load blocks on gate when set.
type fakeRuntime struct {
	mu       sync.Mutex
	loads    []string
	paths    []string // of each load, in loads' order
	unloads  []string
	held     []string
	gate     chan struct{}
	started  chan string
	fail     error
	unloadOK bool
}

func (r *fakeRuntime) LoadAdapter(ctx context.Context, name, path string) error {
	if r.started != nil {
		r.started <- name
	}
	if r.gate != nil {
		select {
		case <-r.gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.loads = append(r.loads, name)
	r.paths = append(r.paths, path)
	if r.fail != nil {
		return r.fail
	}
	r.held = append(r.held, name)
	return nil
}

func (r *fakeRuntime) UnloadAdapter(_ context.Context, name string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.unloads = append(r.unloads, name)
	r.held = slices.DeleteFunc(r.held, func(n string) bool { return n == name })
	return nil
}

func (r *fakeRuntime) listed() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.held)
}

func newLoader(t *testing.T, rt *fakeRuntime, capacity int, names ...string) *Loader {
	t.Helper()
	src := Source{}
	for _, n := range names {
		src[n] = Entry{Path: "/lora/" + n}
	}
	l, err := New(Config{Source: src, Runtime: rt, Listed: rt.listed, Capacity: func() int { return capacity },
		Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestAcquireLoadsOnceThenHolds(t *testing.T) {
	rt := &fakeRuntime{}
	l := newLoader(t, rt, 0, "a")
	if d := l.Expected("a"); d != time.Second {
		t.Errorf("Expected before the load = %v, want the 1s estimate", d)
	}
	for range 3 {
		release, err := l.Acquire(t.Context(), "a")
		if err != nil {
			t.Fatal(err)
		}
		release()
		release() // a second call is a no-op
	}
	if !slices.Equal(rt.loads, []string{"a"}) {
		t.Errorf("loads %v, want one of a", rt.loads)
	}
	if d := l.Expected("a"); d != 0 {
		t.Errorf("Expected once loaded = %v, want 0", d)
	}
	if got := l.Loaded(); !slices.Equal(got, []string{"a"}) {
		t.Errorf("Loaded %v", got)
	}
	if release, err := l.Acquire(t.Context(), "base"); err != nil || release == nil {
		t.Errorf("a name outside the source: %v", err)
	}
	if len(rt.loads) != 1 {
		t.Errorf("a name outside the source was loaded: %v", rt.loads)
	}
}

func TestConcurrentFirstRequestsLoadOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := &fakeRuntime{gate: make(chan struct{})}
		l := newLoader(t, rt, 0, "a")
		var wg sync.WaitGroup
		errs := make(chan error, 4)
		for range 4 {
			wg.Go(func() {
				release, err := l.Acquire(context.Background(), "a")
				if err == nil {
					release()
				}
				errs <- err
			})
		}
		synctest.Wait() // one load under way, the three others waiting for it
		close(rt.gate)
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Error(err)
			}
		}
		if len(rt.loads) != 1 {
			t.Errorf("loads %v, want exactly one", rt.loads)
		}
	})
}

func TestFullSlotsUnloadTheLeastRecentlyUsedIdleAdapter(t *testing.T) {
	rt := &fakeRuntime{held: []string{"static"}} // loaded at the engine's start, not in the source
	var evicted []string
	l := newLoader(t, rt, 3, "a", "b", "c")
	l.cfg.OnEvict = func(n string) { evicted = append(evicted, n) }
	use := func(name string) {
		t.Helper()
		release, err := l.Acquire(t.Context(), name)
		if err != nil {
			t.Fatal(err)
		}
		release()
	}
	use("a")
	use("b")
	use("a") // b is now the least recently used
	use("c")
	if !slices.Equal(rt.unloads, []string{"b"}) || !slices.Equal(evicted, []string{"b"}) {
		t.Errorf("unloads %v, evictions %v; want b", rt.unloads, evicted)
	}
	if got := l.Loaded(); !slices.Equal(got, []string{"a", "c"}) {
		t.Errorf("Loaded %v, want a c", got)
	}
	use("b") // loads again, unloading a (c is more recent); static is never unloaded
	if !slices.Equal(rt.unloads, []string{"b", "a"}) {
		t.Errorf("unloads %v, want b then a", rt.unloads)
	}
}

func TestNoIdleSlot(t *testing.T) {
	rt := &fakeRuntime{}
	l := newLoader(t, rt, 1, "a", "b")
	release, err := l.Acquire(t.Context(), "a")
	if err != nil {
		t.Fatal(err)
	}
	_, err = l.Acquire(t.Context(), "b")
	var le *Error
	if !errors.Is(err, ErrNoIdleSlot) || !errors.As(err, &le) || le.Adapter != "b" {
		t.Fatalf("err %v, want ErrNoIdleSlot naming b", err)
	}
	release()
	if _, err := l.Acquire(t.Context(), "b"); err != nil {
		t.Errorf("after a's release: %v", err)
	}
	if !slices.Equal(rt.unloads, []string{"a"}) {
		t.Errorf("unloads %v, want a", rt.unloads)
	}
}

func TestFailedLoadNamesTheAdapterForEveryWaiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := &fakeRuntime{fail: errors.New("engine: no adapter at /lora/a"), gate: make(chan struct{})}
		l := newLoader(t, rt, 0, "a")
		var outcomes []string
		l.cfg.OnLoad = func(_, outcome string, _ time.Duration) { outcomes = append(outcomes, outcome) }
		errs := make(chan error, 2)
		var wg sync.WaitGroup
		for range 2 {
			wg.Go(func() {
				_, err := l.Acquire(context.Background(), "a")
				errs <- err
			})
		}
		synctest.Wait()
		close(rt.gate)
		wg.Wait()
		close(errs)
		for err := range errs {
			var le *Error
			if !errors.Is(err, ErrLoadFailed) || !errors.As(err, &le) || le.Adapter != "a" || !errors.Is(err, rt.fail) {
				t.Errorf("err %v, want ErrLoadFailed naming a with the engine's answer", err)
			}
		}
		if !slices.Equal(outcomes, []string{OutcomeFailed}) {
			t.Errorf("outcomes %v, want one failed load", outcomes)
		}
	})
}

func TestLoadTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := &fakeRuntime{gate: make(chan struct{})} // never opens
		l := newLoader(t, rt, 0, "a")
		var outcomes []string
		l.cfg.OnLoad = func(_, outcome string, _ time.Duration) { outcomes = append(outcomes, outcome) }
		_, err := l.Acquire(context.Background(), "a")
		if !errors.Is(err, ErrLoadTimeout) {
			t.Fatalf("err %v, want ErrLoadTimeout", err)
		}
		if !slices.Equal(outcomes, []string{OutcomeTimeout}) {
			t.Errorf("outcomes %v", outcomes)
		}
		rt.gate = nil
		if _, err := l.Acquire(context.Background(), "a"); err != nil {
			t.Errorf("a later request loads again: %v", err)
		}
	})
}

func TestWaiterBoundedByItsContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := &fakeRuntime{gate: make(chan struct{}), started: make(chan string, 1)}
		l := newLoader(t, rt, 0, "a")
		go func() { _, _ = l.Acquire(context.Background(), "a") }()
		<-rt.started
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		if _, err := l.Acquire(ctx, "a"); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("err %v, want the waiter's deadline", err)
		}
		close(rt.gate)
	})
}

func TestListedAdaptersCountAndUntouchedOnesEvict(t *testing.T) {
	rt := &fakeRuntime{held: []string{"a"}} // a source adapter the engine holds already
	l := newLoader(t, rt, 1, "a", "b")
	if d := l.Expected("a"); d != 0 {
		t.Errorf("Expected of a listed adapter = %v", d)
	}
	release, err := l.Acquire(t.Context(), "b")
	if err != nil {
		t.Fatal(err)
	}
	release()
	if !slices.Equal(rt.unloads, []string{"a"}) || !slices.Equal(rt.loads, []string{"b"}) {
		t.Errorf("unloads %v loads %v", rt.unloads, rt.loads)
	}
	if d := l.Expected("a"); d == 0 {
		t.Error("a unloaded still expected resident")
	}
}

// TestSetSourceReload pins a reload of the source: an entry it adds loads at its first request
// (from its path), an adapter the loader loaded that it drops stays in the engine and is still
// evicted when room is needed, and a dropped entry is no longer loaded.
func TestSetSourceReload(t *testing.T) {
	rt := &fakeRuntime{}
	l := newLoader(t, rt, 1, "a")
	release, err := l.Acquire(t.Context(), "a")
	if err != nil {
		t.Fatal(err)
	}
	release()
	if _, ok := l.Entry("b"); ok {
		t.Fatal("b in the source before the reload")
	}
	l.SetSource(Source{"b": {Path: "/new/b"}})
	if d := l.Expected("b"); d == 0 {
		t.Error("Expected of a new entry the engine does not hold = 0")
	}
	release, err = l.Acquire(t.Context(), "b")
	if err != nil {
		t.Fatal(err)
	}
	release()
	if !slices.Equal(rt.loads, []string{"a", "b"}) || rt.paths[1] != "/new/b" {
		t.Errorf("loads %v from %v: want b loaded from /new/b", rt.loads, rt.paths)
	}
	if !slices.Equal(rt.unloads, []string{"a"}) {
		t.Errorf("unloads %v: want a, which the loader loaded, evicted for b", rt.unloads)
	}
	release, err = l.Acquire(t.Context(), "a") // outside the source now: nothing to load
	if err != nil {
		t.Fatal(err)
	}
	release()
	if len(rt.loads) != 2 {
		t.Errorf("loads %v: a dropped entry was loaded again", rt.loads)
	}
}

// TestSetSourceConcurrent runs SetSource beside Acquire and Expected (for -race).
func TestSetSourceConcurrent(t *testing.T) {
	rt := &fakeRuntime{}
	l := newLoader(t, rt, 0, "a")
	var wg sync.WaitGroup
	wg.Go(func() {
		for range 100 {
			l.SetSource(Source{"a": {Path: "/lora/a"}, "b": {Path: "/lora/b"}})
		}
	})
	for range 100 {
		if release, err := l.Acquire(t.Context(), "a"); err == nil {
			release()
		}
		l.Expected("b")
	}
	wg.Wait()
}

// TestReloadDropsAnAdapterAWaiterWanted: a request for x waits for the flight that unloads x
// to make room for y; a reload drops x's entry meanwhile. The waiter fails with ErrNotInSource
// naming x (the engine no longer holds x and nothing can load it), never returns as if x were
// loaded.
func TestReloadDropsAnAdapterAWaiterWanted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := &fakeRuntime{}
		l := newLoader(t, rt, 1, "x", "y")
		release, err := l.Acquire(t.Context(), "x")
		if err != nil {
			t.Fatal(err)
		}
		release()
		rt.gate = make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() { // y's load: x, idle, is unloaded first
			if release, err := l.Acquire(context.Background(), "y"); err != nil {
				t.Errorf("y: %v", err)
			} else {
				release()
			}
		})
		synctest.Wait() // x unloaded, y's load blocked on the gate
		var xErr error
		var xRelease func()
		wg.Go(func() { xRelease, xErr = l.Acquire(context.Background(), "x") })
		synctest.Wait() // the request for x waits for that flight
		l.SetSource(Source{"y": {Path: "/lora/y"}})
		close(rt.gate)
		wg.Wait()
		var le *Error
		if !errors.Is(xErr, ErrNotInSource) || !errors.As(xErr, &le) || le.Adapter != "x" || xRelease != nil {
			t.Fatalf("Acquire(x) = release %v, err %v; want ErrNotInSource naming x", xRelease != nil, xErr)
		}
		if !slices.Equal(rt.loads, []string{"x", "y"}) || !slices.Equal(rt.unloads, []string{"x"}) {
			t.Errorf("loads %v unloads %v, want x then y loaded and x unloaded", rt.loads, rt.unloads)
		}
	})
}
