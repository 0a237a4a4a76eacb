package anthropic

import (
	"bytes"
	"net/http"
	"testing"

	"github.com/kvmesh/kvmesh/node/openai"
)

// FuzzDecode pins that any body is a request or a 400, and that every request translates into
// a chat body the chat decoder takes.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`))
	f.Add([]byte(`{"model":"m","max_tokens":5,"system":[{"type":"text","text":"s"}],"stop_sequences":["x"],"stream":true,` +
		`"messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"u"}},{"type":"text","text":"a"}]},` +
		`{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"w","input":{"a":1}}]},` +
		`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"r","is_error":true}]}],` +
		`"tools":[{"name":"w","input_schema":{"type":"object"}}],"tool_choice":{"type":"tool","name":"w"},"metadata":{"user_id":"u"}}`))
	f.Add([]byte(`{"model":"m","messages":[{"role":"assistant","content":[]}],"thinking":{}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, count := range []bool{false, true} {
			r, oerr := Decode(b, count)
			if oerr != nil {
				if oerr.Status != http.StatusBadRequest {
					t.Fatalf("error %v is not a 400", oerr)
				}
				continue
			}
			if _, oerr := openai.DecodeChat(bytes.NewReader(ToChat(r)), 1<<30); oerr != nil {
				t.Fatalf("translation of %s refused by the chat decoder: %v", b, oerr)
			}
		}
	})
}
