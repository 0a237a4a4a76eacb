package node_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvmesh/kvmesh/internal/poll"
	"github.com/kvmesh/kvmesh/kvindex"
	"github.com/kvmesh/kvmesh/node"
)

// TestEngineCacheResetReachesTheMesh: a node in front of a kvmesh engine that publishes its KV
// events learns of a cache reset from the engine's AllBlocksCleared, before any request: its
// residency model, its metric and what its peer believes through gossip all drop to nothing.
func TestEngineCacheResetReachesTheMesh(t *testing.T) {
	const modelA = "model-a"
	// Both nodes also serve "model-shared", which puts them in one prefix domain; requests for
	// model-a run on A's engine alone.
	eng := startEngineNode(t, modelA, 64, func(c *node.Config) {
		c.PublishKVEvents = "tcp://127.0.0.1:0"
		c.Models = append(c.Models, "model-shared")
	})
	engineURL := "http://" + eng.HTTPAddr()
	tn := startNet(t, 2, func(i int, cfg *node.Config) {
		if i == 0 {
			cfg.Engine, cfg.Models, cfg.EngineKVEvents = engineURL, nil, eng.KVEventsAddr()
		} else {
			cfg.Models = []string{"model-shared"}
		}
	})
	a, b := tn.Nodes[0], tn.Nodes[1]
	urlA := tn.URLs()[0]
	send := func(content string) {
		t.Helper()
		resp := post(t, urlA, "/v1/chat/completions", chatFor(modelA, content), nil)
		if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
	}
	// The engine's first batches may go out before A's subscription reaches it: prompts until
	// A has read one.
	i := 0
	poll.Until(t, 10*time.Second, "A to read the engine's stored blocks", func() bool {
		i++
		send(longPrompt(fmt.Sprint("probe-", i), 40))
		return metric(t, urlA, "kvmesh_engine_kv_events_total", `type="stored"`) > 0
	})
	long := longPrompt("long", 300)
	send(long)
	lb := kvindex.AppendBlocks(nil, modelA, kvindex.RenderChat(nil, []kvindex.Message{{Role: "user", Content: long}}), kvindex.DefaultBlockTokens)
	poll.Until(t, 10*time.Second, "B to learn A's long prefix by gossip", func() bool {
		return b.PrefixOf(a.Name(), lb) == kvindex.AnchoredLen(len(lb))
	})
	if n := metric(t, urlA, "kvmesh_residency_blocks", ""); n < float64(len(lb)) {
		t.Fatalf("A's model holds %v blocks, want the long prompt's %d at least", n, len(lb))
	}

	resp, err := http.Post(engineURL+"/reset_prefix_cache", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("reset: status %d: %s", resp.StatusCode, body)
	}
	poll.Until(t, 10*time.Second, "A's model and B's view of it to empty", func() bool {
		return metric(t, urlA, "kvmesh_residency_blocks", "") == 0 && b.PrefixOf(a.Name(), lb) == 0
	})
	if c := metric(t, urlA, "kvmesh_engine_kv_events_total", `type="cleared"`); c != 1 {
		t.Errorf("%v clear events read, want 1", c)
	}
	if r := metric(t, urlA, "kvmesh_residency_resets_total", ""); r != 0 {
		t.Errorf("the reset counted as %v engine restarts", r)
	}
}

// TestGarbageKVEventsLeaveTheNodeServing: a publisher of malformed messages is counted and
// otherwise ignored; the node goes on serving and modelling its engine's cache.
func TestGarbageKVEventsLeaveTheNodeServing(t *testing.T) {
	const modelA = "model-a"
	engineURL := startKVEngine(t, modelA, 64)
	pub := zmq4.NewPub(context.Background())
	t.Cleanup(func() { pub.Close() })
	if err := pub.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	tn := startNet(t, 1, func(i int, cfg *node.Config) {
		cfg.Engine, cfg.Models, cfg.EngineKVEvents = engineURL, nil, "tcp://"+pub.Addr().String()
	})
	url := tn.URLs()[0]
	seq := make([]byte, 8)
	garbage := []zmq4.Msg{
		zmq4.NewMsgFrom([]byte("kv"), seq, []byte("not msgpack")),
		zmq4.NewMsgFrom([]byte("kv"), seq, []byte{0x92, 0x00, 0xdd, 0xff, 0xff, 0xff, 0xff}), // 4G events claimed
		zmq4.NewMsgFrom([]byte("kv"), []byte("short"), []byte{0x92, 0x00, 0x90}),
		zmq4.NewMsgFrom([]byte("one frame")),
	}
	n := uint64(0)
	poll.Until(t, 10*time.Second, "the node to count undecodable messages", func() bool {
		for _, m := range garbage {
			n++
			binary.BigEndian.PutUint64(seq, n)
			if err := pub.SendMulti(m); err != nil {
				t.Fatal(err)
			}
		}
		return metric(t, url, "kvmesh_engine_kv_event_decode_errors_total", "") >= float64(len(garbage))
	})
	resp := post(t, url, "/v1/chat/completions", chatFor(modelA, longPrompt("after-garbage", 100)), nil)
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d after garbage events: %s", resp.StatusCode, body)
	}
	if b := metric(t, url, "kvmesh_residency_blocks", ""); b == 0 {
		t.Error("the residency model holds nothing after a request")
	}
	if c := metric(t, url, "kvmesh_engine_kv_events_connected", ""); c != 1 {
		t.Errorf("connected %v, want 1: garbage does not end the subscription", c)
	}
}
