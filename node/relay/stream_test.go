package relay

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/iotest"
)

// TestStream pins how a relayed stream reaches the client: whole events only, however
// the owner's bytes are cut; the text and the chunks that carried it counted; the end seen
// ([DONE] or an error event); and, after Resume, a continuation's events in the same response
// without its own role chunk, its headers and status kept from the client.
func TestStream(t *testing.T) {
	rec := httptest.NewRecorder()
	cs := New(rec, true, true)
	role := `data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}` + "\n\n"
	chunk := func(s string) string {
		return `data: {"choices":[{"index":0,"delta":{"content":"` + s + `"}}]}` + "\n\n"
	}
	cs.Header().Set("X-Kvmesh-Node", "owner")
	cs.WriteHeader(200)
	first := role + chunk("the ") + chunk("") + chunk("and ")
	for _, piece := range []string{first[:10], first[10 : len(first)-5], first[len(first)-5:], chunk("for ")[:20]} {
		if _, err := cs.Write([]byte(piece)); err != nil {
			t.Fatal(err)
		}
	}
	if got := rec.Body.String(); got != first {
		t.Fatalf("client got %q, want the whole events %q", got, first)
	}
	if cs.Text() != "the and " || cs.Tokens() != 2 || cs.Ended() {
		t.Fatalf("text %q in %d chunks, ended %v", cs.Text(), cs.Tokens(), cs.Ended())
	}
	// The owner failed mid-event: the continuation takes over.
	cs.Resume()
	cs.Header().Set("X-Kvmesh-Node", "next")
	cs.WriteHeader(200)
	rest := chunk("for ") + `data: {"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}` + "\n\n" + "data: [DONE]\n\n"
	if _, err := cs.Write([]byte(role + rest)); err != nil {
		t.Fatal(err)
	}
	if got, want := rec.Body.String(), first+rest; got != want {
		t.Errorf("client got %q, want %q", got, want)
	}
	if rec.Header().Get("X-Kvmesh-Node") != "owner" || rec.Code != 200 {
		t.Errorf("client's headers %v, status %d", rec.Header(), rec.Code)
	}
	if !cs.Ended() || !cs.Done() || cs.Text() != "the and for " || cs.Tokens() != 3 {
		t.Errorf("ended %v done %v, text %q in %d chunks", cs.Ended(), cs.Done(), cs.Text(), cs.Tokens())
	}

	// A piece of a tool call passes whole and is seen.
	rec = httptest.NewRecorder()
	cs = New(rec, true, true)
	call := `data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1","function":{"name":"f","arguments":"{"}}]}}]}` + "\n\n"
	if _, err := cs.Write([]byte(role + call)); err != nil || rec.Body.String() != role+call || !cs.ToolCalls() || cs.Tokens() != 0 {
		t.Errorf("client got %q (%v); tool calls seen %v, %d text chunks", rec.Body.String(), err, cs.ToolCalls(), cs.Tokens())
	}

	// A continuation that fails before its first token sends the client nothing.
	rec = httptest.NewRecorder()
	cs = New(rec, false, true)
	_, _ = cs.Write([]byte(`data: {"choices":[{"index":0,"text":"the "}]}` + "\n\n"))
	cs.Resume()
	cs.WriteHeader(502)
	_, _ = cs.Write([]byte(`{"error":{"message":"engine failed"}}`))
	if strings.Contains(rec.Body.String(), "engine failed") || cs.Ended() || cs.Tokens() != 1 {
		t.Errorf("client got %q (ended %v, %d chunks)", rec.Body.String(), cs.Ended(), cs.Tokens())
	}
}

// failWriter is a client that went away.
type failWriter struct{ *httptest.ResponseRecorder }

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("gone") }

// TestPipe pins how an owner's stream ends for the client: whole when the stream ended, the
// owner's failure when it closed between events, ErrClientGone when the client cannot be
// written; the first bytes are reported once.
func TestPipe(t *testing.T) {
	ev := `data: {"choices":[{"index":0,"text":"a"}]}` + "\n\n"
	for _, tt := range []struct {
		name   string
		body   string
		client func() http.ResponseWriter
		want   error
		done   bool
	}{
		{"ended", ev + ev + "data: [DONE]\n\n", func() http.ResponseWriter { return httptest.NewRecorder() }, nil, true},
		{"an error event ends it", ev + `data: {"error":{"message":"x"}}` + "\n\n", func() http.ResponseWriter { return httptest.NewRecorder() }, nil, false},
		{"cut between events", ev + ev[:10], func() http.ResponseWriter { return httptest.NewRecorder() }, io.ErrUnexpectedEOF, false},
		{"client gone", ev, func() http.ResponseWriter { return failWriter{httptest.NewRecorder()} }, ErrClientGone, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := New(tt.client(), false, true)
			firsts := 0
			err := s.Pipe(iotest.OneByteReader(strings.NewReader(tt.body)), func() { firsts++ })
			if err != tt.want || s.Done() != tt.done || firsts != 1 {
				t.Errorf("err %v done %v firsts %d, want %v %v 1", err, s.Done(), firsts, tt.want, tt.done)
			}
		})
	}
}
