package relay

import (
	"net/http/httptest"
	"strings"
	"testing"
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
