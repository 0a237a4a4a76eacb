package sim

import (
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/node/engine"
)

// Timing is a request's latency in simulated engine time: the sum of the modelled step times
// (unscaled by TimeScale) between its arrival and each event. It does not depend on how fast
// the host machine runs. Arrival is taken at the start of the step in progress, so a request
// that arrives mid-step counts that whole step as queueing.
type Timing struct {
	// Queue is arrival to first scheduling.
	Queue time.Duration
	// TTFT is arrival to the end of the step that emitted the first token.
	TTFT time.Duration
	// E2E is arrival to the end of the step that finished the request.
	E2E time.Duration
}

// Stream is one generation's output. The step loop appends to an unbounded (but at most
// MaxTokens chunks long) buffer so a slow reader never stalls the engine.
type Stream struct {
	sim *Sim
	seq *seq

	// echo is the prompt to put before the first chunk (completions' echo); the reader's
	// goroutine does it, so scoring a long prompt never holds up the step loop.
	echo *echo

	mu     sync.Mutex
	buf    []engine.Chunk
	err    error // delivered after buf drains: io.EOF or a failure
	timing Timing
	notify chan struct{} // capacity 1: something was appended
	closed chan struct{}
	once   sync.Once
}

var _ engine.Stream = (*Stream)(nil)

func newStream(s *Sim) *Stream {
	return &Stream{sim: s, notify: make(chan struct{}, 1), closed: make(chan struct{})}
}

func (st *Stream) push(c engine.Chunk) {
	st.mu.Lock()
	st.buf = append(st.buf, c)
	st.mu.Unlock()
	st.wake()
}

// end records the terminal error (io.EOF for a normal finish); later ends are ignored.
func (st *Stream) end(err error) {
	st.mu.Lock()
	if st.err == nil {
		st.err = err
	}
	st.mu.Unlock()
	st.wake()
}

func (st *Stream) wake() {
	select {
	case st.notify <- struct{}{}:
	default:
	}
}

// echo is an echoed prompt waiting for the first chunk.
type echo struct {
	prompt   []byte
	logprobs bool
	top      int
	seed     uint64
}

// Recv returns the next chunk, blocking until the engine produces one. After the final chunk
// (FinishReason set, Usage filled) it returns io.EOF; if the engine closed or the request's
// context ended first it returns that error. An echoed prompt rides in the first chunk, with
// the first output token, so it is not sent before the engine has run the request.
func (st *Stream) Recv() (engine.Chunk, error) {
	for {
		st.mu.Lock()
		if len(st.buf) > 0 {
			c := st.buf[0]
			st.buf[0] = engine.Chunk{}
			st.buf = st.buf[1:]
			st.mu.Unlock()
			if e := st.echo; e != nil {
				st.echo = nil
				c.Text = string(e.prompt) + c.Text
				if e.logprobs {
					c.Logprobs = append(promptLogprobs(e.seed, e.prompt, e.top), c.Logprobs...)
				}
			}
			return c, nil
		}
		err := st.err
		st.mu.Unlock()
		if err != nil {
			return engine.Chunk{}, err
		}
		select {
		case <-st.notify:
		case <-st.closed:
			return engine.Chunk{}, ErrStreamClosed
		}
	}
}

// Close cancels the generation: the sequence leaves the engine, its blocks are freed (prompt
// blocks stay cached). Safe to call more than once and after io.EOF.
func (st *Stream) Close() error {
	st.once.Do(func() {
		close(st.closed)
		st.sim.cancel(st.seq, ErrStreamClosed)
	})
	return nil
}

// Timing returns the request's simulated latencies so far (zero for events not reached yet).
func (st *Stream) Timing() Timing {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.timing
}
