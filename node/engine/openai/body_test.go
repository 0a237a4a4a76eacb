package openai

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/kvmesh/kvmesh/node/engine"
)

// FuzzForceStreaming: for any JSON object, the engine's body is a JSON object with streaming
// and usage on and every other member as the client sent it.
func FuzzForceStreaming(f *testing.F) {
	f.Add([]byte(`{"model":"m","stream":false,"top_k":4,"guided_json":{"a":[1,2]}}`))
	f.Add([]byte(` { "stream_options" : {"include_usage":false,"x":1} , "stream":null } `))
	f.Add([]byte(`{"stream_options":3,"s\u0074ream":false}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		var in map[string]json.RawMessage
		if json.Unmarshal(body, &in) != nil || in == nil {
			return
		}
		out, err := ForceStreaming(&engine.Request{Body: body})
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		var got map[string]json.RawMessage
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("%s gave %s: %v", body, out, err)
		}
		var opts struct {
			IncludeUsage *bool `json:"include_usage"`
		}
		if string(got["stream"]) != "true" || json.Unmarshal(got["stream_options"], &opts) != nil ||
			opts.IncludeUsage == nil || !*opts.IncludeUsage {
			t.Fatalf("%s gave %s: streaming or usage not forced", body, out)
		}
		for k, v := range in {
			if k == "stream" || k == "stream_options" {
				continue
			}
			if !bytes.Equal(got[k], v) {
				t.Fatalf("%s gave %s: member %q changed from %s to %s", body, out, k, v, got[k])
			}
		}
		if len(got) != len(in)+2-boolInt(in["stream"] != nil)-boolInt(in["stream_options"] != nil) {
			t.Fatalf("%s gave %s: members added or lost", body, out)
		}
	})
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
