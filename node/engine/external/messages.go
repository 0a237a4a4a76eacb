package external

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/node/anthropic"
	"github.com/kvmesh/kvmesh/node/engine"
)

// Values of Config.Messages.
const (
	MessagesAuto = "auto"
	MessagesOn   = "on"
	MessagesOff  = "off"
)

// What the server said of /v1/messages (Engine.messages).
const (
	messagesUnknown int32 = iota
	messagesServed
	messagesNotServed
)

// messagesPath is the Messages API's path on the server.
const messagesPath = "/v1/messages"

func checkMessages(mode string) error {
	switch mode {
	case "", MessagesAuto, MessagesOn, MessagesOff:
		return nil
	}
	return fmt.Errorf("external: messages %q must be %s, %s or %s", mode, MessagesAuto, MessagesOn, MessagesOff)
}

// ServesMessages reports whether the server takes the Anthropic Messages API natively, so a
// Messages request is sent to it as it is (engine.Request.Messages) rather than translated to
// chat: Config.Messages on, or auto once the server answered the probe as a server of the API.
func (e *Engine) ServesMessages() bool {
	switch e.cfg.Messages {
	case MessagesOn:
		return true
	case MessagesOff:
		return false
	}
	return e.messages.Load() == messagesServed
}

// probeMessages asks the server, with MessagesAuto and until it has answered once, whether it
// serves POST /v1/messages: it posts an empty object, which no server runs. A server without
// the route answers 404 or 405 (501); one with it refuses the body with a 4xx of its own
// (vLLM, SGLang and llama.cpp a 400 or 422). No answer, a 5xx, or the server refusing the
// node's credentials (401, 403, 407) leave the question open for the next model refresh.
func (e *Engine) probeMessages(ctx context.Context) {
	if (e.cfg.Messages != "" && e.cfg.Messages != MessagesAuto) || e.messages.Load() != messagesUnknown {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, max(e.cfg.ScrapeTimeout, time.Second))
	defer cancel()
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, e.url(messagesPath), strings.NewReader("{}"))
	if err != nil {
		return
	}
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := e.client.Do(hreq)
	if err != nil {
		e.log.Debug("messages probe: no answer", "engine", e.base.String(), "err", err)
		return
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	switch s := resp.StatusCode; {
	case s == http.StatusNotFound || s == http.StatusMethodNotAllowed || s == http.StatusNotImplemented:
		e.messages.Store(messagesNotServed)
		e.log.Info("engine does not serve the Messages API: Messages requests are translated to chat", "engine", e.base.String(),
			"status", s)
	case s == http.StatusUnauthorized || s == http.StatusForbidden || s == http.StatusProxyAuthRequired || s >= 500:
		e.log.Debug("messages probe: no verdict", "engine", e.base.String(), "status", s)
	default:
		e.messages.Store(messagesServed)
		e.log.Info("engine serves the Messages API: Messages requests are passed to it as sent", "engine", e.base.String(),
			"status", s)
	}
}

// generateMessages posts req.Messages to the server's /v1/messages: the client's body, its
// max_tokens lowered to the admitted req.MaxTokens when over it, every other byte as sent.
// The answer's bytes come back in the chunks' Raw as the server sent them.
func (e *Engine) generateMessages(ctx context.Context, req *engine.Request) (engine.Stream, error) {
	if req.Resume != nil || req.Handover != nil || req.PrefillOnly {
		return nil, fmt.Errorf("external: %w: a Messages request is run whole and from its start", engine.ErrUnavailable)
	}
	body := req.Messages
	if req.MaxTokens > 0 {
		var err error
		if body, err = edit(body, outputCap(req.MaxTokens, false)[0]); err != nil {
			return nil, err
		}
	}
	c, err := e.call(ctx, messagesPath, body, req, true)
	if err != nil {
		return nil, err
	}
	e.inflight.Add(1)
	s := &messagesStream{ctx: c.ctx, body: c.resp.Body, onClose: func() {
		c.end()
		e.inflight.Add(-1)
	}}
	if strings.HasPrefix(c.resp.Header.Get("Content-Type"), "text/event-stream") {
		s.events = anthropic.NewEventReader(c.resp.Body)
	}
	return s, nil
}

// messagesStream turns a server's Messages answer into engine.Chunks, its bytes kept in Raw.
// A stream's chunk ends at each text or tool-input delta and at message_stop, which carries
// the finish reason and the usage; an error event is relayed in a chunk of its own, and the
// next Recv returns ErrStream. A whole answer is one chunk.
type messagesStream struct {
	ctx     context.Context
	body    io.Reader
	events  *anthropic.EventReader // nil: a whole answer
	onClose func()
	once    sync.Once

	tally  anthropic.Tally
	failed error // an error event was relayed: Recv's next answer
	done   bool
}

func (s *messagesStream) Recv() (engine.Chunk, error) {
	switch {
	case s.done:
		return engine.Chunk{}, io.EOF
	case s.failed != nil:
		s.finish()
		return engine.Chunk{}, s.failed
	case s.events == nil:
		return s.whole()
	}
	var c engine.Chunk
	for {
		ev, err := s.events.Next()
		if err != nil {
			s.finish()
			return engine.Chunk{}, s.readError(err)
		}
		c.Raw = append(c.Raw, ev.Raw...)
		c.Text += s.tally.Add(ev)
		switch {
		case s.tally.Failed:
			s.failed = fmt.Errorf("%w: %s", ErrStream, s.tally.Error)
			return c, nil
		case s.tally.Stopped:
			s.finish()
			c.FinishReason, c.Usage = anthropic.FinishOf(s.tally.StopReason), s.usage()
			return c, nil
		case ev.Type == anthropic.EventContentBlockDelta:
			return c, nil
		}
	}
}

// whole reads a non-streamed answer as one chunk.
func (s *messagesStream) whole() (engine.Chunk, error) {
	defer s.finish()
	b, err := io.ReadAll(io.LimitReader(s.body, anthropic.MaxEventBytes+1))
	if err != nil {
		return engine.Chunk{}, s.readError(err)
	}
	text, err := s.tally.Whole(b)
	if err != nil {
		return engine.Chunk{}, fmt.Errorf("external: %w", err)
	}
	return engine.Chunk{Raw: b, Text: text, FinishReason: anthropic.FinishOf(s.tally.StopReason), Usage: s.usage()}, nil
}

// usage is the answer's usage in the node's terms: the prompt is the engine's input tokens
// and those it read from its cache.
func (s *messagesStream) usage() *engine.Usage {
	t := &s.tally
	return &engine.Usage{PromptTokens: t.InputTokens + t.CachedTokens, CompletionTokens: t.OutputTokens, CachedTokens: t.CachedTokens}
}

// readError is the error of a stream that ended before message_stop.
func (s *messagesStream) readError(err error) error {
	switch {
	case s.ctx.Err() != nil:
		return fmt.Errorf("external: request cancelled: %w", s.ctx.Err())
	case errors.Is(err, io.EOF):
		return ErrTruncated
	}
	return fmt.Errorf("external: reading the engine's Messages answer: %w", err)
}

func (s *messagesStream) finish() {
	s.done = true
	s.once.Do(s.onClose)
}

// Close cancels the server's request; safe twice and after io.EOF.
func (s *messagesStream) Close() error {
	s.once.Do(s.onClose)
	return nil
}
