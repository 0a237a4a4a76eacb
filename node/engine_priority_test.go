package node_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/poll"
	"github.com/kvmesh/kvmesh/node"
)

// TestExternalEngineReceivesPriority: with EnginePriority a node in front of vLLM sends it each
// request's admitted priority negated in vLLM's priority field, in place of the client's own,
// whether the client came to that node or to a peer that forwarded the request; and the mesh
// learns that the node's engine schedules by priority.
func TestExternalEngineReceivesPriority(t *testing.T) {
	f := startRecordingEngine(t)
	tn := startNet(t, 2, func(i int, cfg *node.Config) {
		if i == 0 {
			cfg.Engine, cfg.EngineKind, cfg.EnginePriority = f.url, "vllm", true
			return
		}
		cfg.Models = []string{"another-model"} // the ingress that must forward
	})
	for i := range tn.Nodes {
		poll.Until(t, 10*time.Second, fmt.Sprintf("n%d sees n1 scheduling by priority", i+1), func() bool {
			for _, m := range tn.Nodes[i].Members() {
				if m.Name == "n1" {
					return m.State.PriorityScheduling && m.State.EngineHealthy
				}
			}
			return false
		})
	}
	const client = `{"model":"` + model + `","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"priority":-1000,"stream":false}`
	for _, tt := range []struct {
		header string
		want   int
	}{{"high", -10}, {"", 0}, {"low", 10}, {"-3", 3}} {
		for i, url := range tn.URLs() {
			t.Run(fmt.Sprintf("priority %q via n%d", tt.header, i+1), func(t *testing.T) {
				resp := post(t, url, "/v1/chat/completions", client, map[string]string{node.HeaderPriority: tt.header})
				body := readAll(t, resp)
				if resp.StatusCode != http.StatusOK || resp.Header.Get(node.HeaderNode) != "n1" {
					t.Fatalf("status %d node %q: %s", resp.StatusCode, resp.Header.Get(node.HeaderNode), body)
				}
				want := strings.Replace(client, `"priority":-1000,"stream":false}`,
					fmt.Sprintf(`"priority":%d,"stream":true,"stream_options":{"include_usage":true}}`, tt.want), 1)
				if got := <-f.bodies; string(got) != want {
					t.Errorf("the engine got\n%s\nwant\n%s", got, want)
				}
			})
		}
	}
}
