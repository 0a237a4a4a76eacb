package loadgen

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// runner is one Run in progress.
type runner struct {
	cfg    Config
	c      client
	models []modelRoute // Config.Models
	col    *collector
	rec    *recorder
	rr     atomic.Uint64 // round-robin over targets
	sent   atomic.Int64  // requests reserved against MaxRequests
	issued atomic.Int64  // requests actually sent
	sem    chan struct{}
	start  time.Time
}

// Run plans cfg's workload, sends it and returns the measurements once every request sent has
// ended. When ctx ends early, the requests in flight are cancelled (counted as failed) and the
// partial report is returned with ctx's error.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	items, traceEnded, err := plan(cfg)
	if err != nil {
		return nil, err
	}
	hc := cfg.HTTPClient
	if hc == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = 1024
		tr.MaxConnsPerHost = connsPerTarget(len(cfg.Targets))
		tr.TLSClientConfig = cfg.TLS
		defer tr.CloseIdleConnections()
		hc = &http.Client{Transport: tr}
	}
	r := &runner{cfg: cfg, c: client{http: hc, apiKey: cfg.APIKey, fittedTTFT: cfg.FittedTTFT, naturalLengths: cfg.NaturalLengths}, col: newCollector()}
	for _, m := range cfg.Models {
		mr := modelRoute{name: m.Name, own: map[string]bool{}}
		for _, t := range m.Targets {
			mr.own[t] = true
		}
		r.models = append(r.models, mr)
	}
	if cfg.Concurrency > 0 {
		r.sem = make(chan struct{}, cfg.Concurrency)
	}
	r.start = time.Now()
	r.rec = newRecorder(cfg.Requests, cfg.Observe, cfg.RunLabel, r.start)

	stopProgress := r.progress()
	var wg sync.WaitGroup
	timer := time.NewTimer(0)
	defer timer.Stop()
	var window time.Duration
	dispatched := 0
	var sessions chan struct{} // the closed loop's running sessions
	if cfg.Sessions > 0 {
		sessions = make(chan struct{}, cfg.Sessions)
	}
dispatch:
	for i := range items {
		it := &items[i]
		if sessions != nil {
			select {
			case <-ctx.Done():
				break dispatch
			case sessions <- struct{}{}:
			}
			if r.windowClosed() {
				break
			}
		} else if wait := time.Until(r.start.Add(it.At)); wait > 0 {
			timer.Reset(wait)
			select {
			case <-ctx.Done():
				break dispatch
			case <-timer.C:
			}
		}
		if ctx.Err() != nil || !r.reserve() {
			break
		}
		window = it.At
		dispatched++
		wg.Go(func() {
			if sessions != nil {
				defer func() { <-sessions }()
			}
			r.serve(ctx, it)
		})
	}
	wg.Wait()
	elapsed := time.Since(r.start)
	stopProgress()
	if cfg.Duration > 0 && cfg.Trace == "" {
		window = cfg.Duration
	}
	rep := r.col.report(window, elapsed)
	rep.Workload, rep.Targets, rep.Seed = cfg.Workload, append([]string(nil), cfg.Targets...), cfg.Seed
	if cfg.Trace != "" {
		rep.Workload = "trace:" + cfg.Trace
		rep.TraceEnded = traceEnded && dispatched == len(items)
	}
	if err := ctx.Err(); err != nil {
		return rep, fmt.Errorf("loadgen: run stopped early: %w", err)
	}
	if err := r.rec.Err(); err != nil {
		return rep, fmt.Errorf("loadgen: writing the request records: %w", err)
	}
	return rep, nil
}

// windowClosed reports whether the arrival window (Duration) has passed.
func (r *runner) windowClosed() bool {
	return r.cfg.Duration > 0 && time.Since(r.start) >= r.cfg.Duration
}

// reserve counts one request against MaxRequests, reporting whether it may be sent.
func (r *runner) reserve() bool {
	n := r.sent.Add(1)
	return r.cfg.MaxRequests <= 0 || n <= int64(r.cfg.MaxRequests)
}

// serve runs one item: a request, or an agent session step by step. A session ends at its last
// step, at its first step that does not complete, or when the arrival window has closed.
func (r *runner) serve(ctx context.Context, it *Item) {
	msgs := it.Messages()
	res, ok := r.request(ctx, it, msgs, it.Agent != nil && it.Agent.Steps == 1)
	if !ok {
		return
	}
	r.add(it, &res)
	a := it.Agent
	if a == nil {
		return
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	for step := 1; step < a.Steps && res.Outcome == Completed; step++ {
		msgs = append(msgs, Message{Role: "assistant", Content: res.Output}, Message{Role: "tool", Content: a.ToolResult(step - 1)})
		timer.Reset(a.ToolWaits[step-1])
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		if r.windowClosed() || !r.reserve() {
			return
		}
		prev := res
		if res, ok = r.request(ctx, it, msgs, step == a.Steps-1); !ok {
			return
		}
		if res.Outcome == Completed {
			res.RecomputedTokens = max(0, min(prev.PromptTokens+prev.OutputTokens, res.PromptTokens)-res.CachedTokens)
		}
		r.add(it, &res)
	}
}

// add counts the final Result of a request of it and records it.
func (r *runner) add(it *Item, res *Result) {
	r.col.add(res, !r.windowClosed())
	r.rec.write(it, res)
}

// request sends msgs, retrying a refusal that carries Retry-After up to cfg.Retries times after
// waiting as told. It is measured from the first attempt. It reports false, with nothing sent,
// when ctx ended while it waited for a concurrency slot. final marks an agent session's last
// step (X-Kvmesh-Agent-Final: 1), so the mesh can end the agent as soon as it is done.
func (r *runner) request(ctx context.Context, it *Item, msgs []Message, final bool) (Result, bool) {
	if r.sem != nil {
		select {
		case r.sem <- struct{}{}:
			defer func() { <-r.sem }()
		case <-ctx.Done():
			return Result{}, false
		}
	}
	r.issued.Add(1)
	start := time.Now()
	retried := false
	model, own := r.modelOf(it)
	for attempt := 0; ; attempt++ {
		target := r.cfg.Targets[int(r.rr.Add(1)-1)%len(r.cfg.Targets)]
		actx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
		res := r.c.attempt(actx, target, model, it, msgs, start, final)
		cancel()
		res.Model, res.Retried = model, retried
		if own != nil {
			res.Entry = EntryOther
			if own[target] {
				res.Entry = EntryOwn
			}
		}
		if res.Outcome == Failed && res.Failure == FailTimeout && ctx.Err() != nil {
			res.Failure = FailCanceled // the run ended, not this request's Timeout
		}
		if res.Outcome == Failed {
			r.cfg.Logger.Debug("loadgen: request failed", "target", target, "kind", it.Kind, "failure", res.Failure)
		}
		retryable := res.Outcome == Refused && res.HasRetryAfter &&
			(res.Status == http.StatusTooManyRequests || res.Status == http.StatusServiceUnavailable)
		if !retryable || attempt >= r.cfg.Retries {
			return res, true
		}
		wait := min(res.RetryAfter, r.cfg.MaxRetryWait)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return res, true
		case <-t.C:
		}
		retried = true
	}
}

// modelRoute is one model of Config.Models and the set of its own targets.
type modelRoute struct {
	name string
	own  map[string]bool
}

// modelOf is the model it asks for (see Config.Models) and the set of that model's own
// targets, nil without Config.Models.
func (r *runner) modelOf(it *Item) (string, map[string]bool) {
	if it.Adapter != "" {
		return it.Adapter, nil
	}
	if len(r.models) == 0 {
		return r.cfg.Model, nil
	}
	m := r.models[it.Conversation()%uint64(len(r.models))]
	return m.name, m.own
}

// progress writes a progress line to cfg.Progress every ProgressInterval until the returned
// func is called, which writes the final one. On a terminal the line is redrawn in place;
// elsewhere (a log file, a CI job) each update is a line of its own.
func (r *runner) progress() (stop func()) {
	w := r.cfg.Progress
	if w == nil {
		return func() {}
	}
	start, end := "", "\n"
	if isTerminal(w) {
		start, end = "\r", " "
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	line := func(rate float64) {
		ended, completed, good, refused, failed := r.col.counts()
		sent := int(r.issued.Load())
		el := time.Since(r.start)
		fmt.Fprintf(w, "%s[%6.1fs] rate %6.1f req/s  sent %d  in flight %d  completed %d  goodput %d (%.1f req/s)  refused %d  failed %d%s",
			start, el.Seconds(), rate, sent, sent-ended, completed, good, ratio(float64(good), el.Seconds()), refused, failed, end)
	}
	wg.Go(func() {
		t := time.NewTicker(r.cfg.ProgressInterval)
		defer t.Stop()
		last, lastAt := 0, time.Now()
		for {
			select {
			case <-done:
				return
			case now := <-t.C:
				sent := int(r.issued.Load())
				line(ratio(float64(sent-last), now.Sub(lastAt).Seconds()))
				last, lastAt = sent, now
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
		line(ratio(float64(r.issued.Load()), time.Since(r.start).Seconds()))
		if start != "" {
			fmt.Fprintln(w)
		}
	}
}

// isTerminal reports whether w is a terminal (a character device), where a line can be
// redrawn with a carriage return.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
