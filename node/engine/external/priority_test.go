package external

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/poll"
	"github.com/kvmesh/kvmesh/node/engine"
)

// TestSetPriority: the engine gets vLLM's priority, kvmesh's negated, in place of the client's
// own and with every other byte as sent.
func TestSetPriority(t *testing.T) {
	tests := []struct {
		name, body string
		priority   int
		want       string
	}{
		{"high is a low vLLM value", `{"model":"m","stream":true}`, 10, `{"model":"m","stream":true,"priority":-10}`},
		{"low is a high vLLM value", `{"model":"m"}`, -10, `{"model":"m","priority":10}`},
		{"normal is vLLM's default, sent", `{"model":"m"}`, 0, `{"model":"m","priority":0}`},
		{"the client's value is replaced where it stands", `{ "priority" : -1000 , "top_k":4, "priority":"x"}`, 5,
			`{ "priority" : -5 , "top_k":4, "priority":-5}`},
		{"spacing and escapes untouched", " {\"prompt\":\"\\u00e9 <a>\",\n \"min_p\":0.050 }\n", 1,
			"{\"prompt\":\"\\u00e9 <a>\",\n \"min_p\":0.050 ,\"priority\":-1}"},
		{"empty object", `{}`, 3, `{"priority":-3}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := SetPriority([]byte(tt.body), tt.priority)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tt.want {
				t.Errorf("got  %s\nwant %s", got, tt.want)
			}
			if !json.Valid(got) {
				t.Errorf("not JSON: %s", got)
			}
		})
	}
	for _, bad := range []string{`[1]`, `{"a":1} {}`, `{"a":`, ``} {
		if _, err := SetPriority([]byte(bad), 1); !errors.Is(err, engine.ErrRejected) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

// FuzzSetPriority: for any JSON object and priority, the body has "priority": -p and every
// other member as the client sent it.
func FuzzSetPriority(f *testing.F) {
	f.Add([]byte(`{"model":"m","priority":3,"top_k":4}`), 10)
	f.Add([]byte(` { "stream" : true , "priority":null, "priority":{"a":1} } `), -10)
	f.Add([]byte(`{"pr\u0069ority":1}`), 0)
	f.Fuzz(func(t *testing.T, body []byte, p int) {
		var in map[string]json.RawMessage
		if json.Unmarshal(body, &in) != nil || in == nil {
			return
		}
		p %= 1001 // kvmesh's priorities are in [-1000, 1000]
		out, err := SetPriority(body, p)
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		var got map[string]json.RawMessage
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("%s gave %s: %v", body, out, err)
		}
		if string(got["priority"]) != strconv.Itoa(-p) {
			t.Fatalf("%s gave %s: priority %s, want %d", body, out, got["priority"], -p)
		}
		for k, v := range in {
			if k != "priority" && !bytes.Equal(got[k], v) {
				t.Fatalf("%s gave %s: member %q changed from %s to %s", body, out, k, v, got[k])
			}
		}
		if len(got) != len(in)+1-boolInt(in["priority"] != nil) {
			t.Fatalf("%s gave %s: members added or lost", body, out)
		}
	})
}

// TestPriorityOnlyForVLLM: the priority field is vLLM's; another kind with it is a config
// error.
func TestPriorityOnlyForVLLM(t *testing.T) {
	for _, kind := range []string{KindSGLang, KindLlamaCpp, KindTGI, KindOpenAI} {
		cfg := DefaultConfig()
		cfg.Kind, cfg.Priority = kind, true
		if _, err := New(cfg); err == nil {
			t.Errorf("kind %s with Priority: no error", kind)
		}
	}
	cfg := DefaultConfig()
	cfg.Priority = true
	if _, err := New(cfg); err != nil {
		t.Errorf("vllm with Priority: %v", err)
	}
}

// TestGenerateSendsPriority: with Priority the engine's body carries the request's priority
// negated, the client's own replaced; without, the client's priority is removed (the node's
// is the only one), the rest sent as ForceStreaming makes it, and State does not claim
// priority scheduling.
func TestGenerateSendsPriority(t *testing.T) {
	const client = `{"model":"a","messages":[{"role":"user","content":"x"}],"priority":7,"stream":true,"stream_options":{"include_usage":true}}`
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("priority %v", on), func(t *testing.T) {
			f := newFake(t)
			f.set(vllmCache(100, ""))
			f.setGen(reply(10, -1))
			e := newEngine(t, f, KindVLLM, func(c *Config) { c.Priority = on })
			req := &engine.Request{ID: "r", Endpoint: engine.Chat, Model: "a", Body: []byte(client), Priority: 10, PromptTokens: 10}
			st, err := e.Generate(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			drain(t, st)
			want := `{"model":"a","messages":[{"role":"user","content":"x"}],"stream":true,"stream_options":{"include_usage":true}}`
			if on {
				want = `{"model":"a","messages":[{"role":"user","content":"x"}],"priority":-10,"stream":true,"stream_options":{"include_usage":true}}`
			}
			if got := <-f.bodies; string(got) != want {
				t.Errorf("the engine got\n%s\nwant\n%s", got, want)
			}
			// The header carries it either way, for a kvmesh engine, which schedules by it.
			if got := <-f.priorities; got != "10" {
				t.Errorf("%s = %q, want 10", PriorityHeader, got)
			}
			if st := e.State(); st.PriorityScheduling != on {
				t.Errorf("PriorityScheduling %v", st.PriorityScheduling)
			}
		})
	}
}

// TestQueuedPrefillSplitByPriority: of the prefill dispatched and not yet started, a high
// request waits behind the high requests' and the one the engine is taken to be prefilling
// (the earliest dispatched), and a normal request before the other sheddable ones; each
// first token takes its request out, and the next earliest becomes the running one.
func TestQueuedPrefillSplitByPriority(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("priority %v", on), func(t *testing.T) {
			testQueuedPrefillSplit(t, on)
		})
	}
}

func testQueuedPrefillSplit(t *testing.T, on bool) {
	f := newFake(t)
	f.set(vllmCache(1000, ""))
	release := map[string]chan struct{}{}
	reqs := []struct {
		id       string
		priority int
		blocks   []uint64 // uncached: distinct chains on an empty cache
	}{
		{"low-1", -10, chain(100, 2)}, // 34 tokens, the earliest
		{"normal", 0, chain(200, 3)},  // 50
		{"high", 10, chain(300, 4)},   // 66
		{"low-2", -10, chain(400, 5)}, // 82
	}
	for _, r := range reqs {
		release[r.id] = make(chan struct{})
	}
	f.setGen(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release[r.Header.Get("X-Request-Id")]:
		case <-r.Context().Done():
			return
		}
		reply(10, -1)(w, r)
	})
	e := newEngine(t, f, KindVLLM, func(c *Config) { c.Priority = on })
	type result struct {
		st  engine.Stream
		err error
	}
	results := map[string]chan result{}
	total := 0
	for _, r := range reqs {
		req := request(r.blocks)
		req.ID, req.Priority = r.id, r.priority
		done := make(chan result, 1)
		results[r.id] = done
		go func() {
			st, err := e.Generate(context.Background(), req)
			done <- result{st, err}
		}()
		total += req.PromptTokens
		// One at a time, so the dispatch order is the slice's.
		poll.Until(t, 5*time.Second, fmt.Sprintf("%s dispatched", r.id), func() bool {
			return e.State().QueuedPrefillTokens == total
		})
	}
	check := func(step string, total, beforeHigh, lowWaiting int) {
		t.Helper()
		st := e.State()
		if !on {
			beforeHigh, lowWaiting = 0, 0
		}
		if st.PriorityScheduling != on || st.QueuedPrefillTokens != total || st.QueuedBeforeHigh != beforeHigh ||
			st.QueuedLowWaiting != lowWaiting {
			t.Errorf("%s: priority %v queued %d before high %d low waiting %d, want %v %d %d %d", step,
				st.PriorityScheduling, st.QueuedPrefillTokens, st.QueuedBeforeHigh, st.QueuedLowWaiting,
				on, total, beforeHigh, lowWaiting)
		}
	}
	check("all queued", 232, 66+34, 82)
	steps := []struct {
		id                            string
		total, beforeHigh, lowWaiting int
	}{
		{"low-1", 198, 66 + 50, 82}, // normal is the earliest now
		{"normal", 148, 66, 82},     // high is
		{"high", 82, 82, 0},         // the last sheddable one is, ahead of everything
		{"low-2", 0, 0, 0},
	}
	for _, s := range steps {
		close(release[s.id])
		res := <-results[s.id]
		if res.err != nil {
			t.Fatal(res.err)
		}
		if _, err := res.st.Recv(); err != nil {
			t.Fatal(err)
		}
		check(s.id+" started", s.total, s.beforeHigh, s.lowWaiting)
		drain(t, res.st)
	}
}
