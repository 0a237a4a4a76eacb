package node_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/admit"
	"github.com/kvmesh/kvmesh/admit/agent"
	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/internal/poll"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/testnet"
)

// agentConfig is agent admission with a fixed window of w and a short idle timeout.
func agentConfig(w int, idle time.Duration) *agent.Config {
	c := agent.DefaultConfig()
	c.Controller.MinWindow, c.Controller.MaxWindow, c.Controller.InitialWindow = 1, w, w
	c.IdleTimeout = idle
	return &c
}

// agentStep sends step k of agent id (its prompt extends the previous step's) and returns
// the response status, the node that ran it and its cached prompt tokens.
func agentStep(t *testing.T, url, id string, k int) (int, string, int) {
	t.Helper()
	resp := post(t, url, "/v1/chat/completions", chatBody(longPrompt(id, 400+300*k), 8, true), map[string]string{node.HeaderAgent: id})
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, resp.Header.Get(node.HeaderNode), 0
	}
	return resp.StatusCode, resp.Header.Get(node.HeaderNode), streamUsage(t, sseEvents(t, body)).PromptTokensDetails.CachedTokens
}

func TestAgentStepsStayOnTheirHomeAcrossIngresses(t *testing.T) {
	tn := startNet(t, 3, func(i int, cfg *node.Config) {
		cfg.Agents = agentConfig(8, time.Minute)
		cfg.AgentInterval = 20 * time.Millisecond
	})
	urls := tn.URLs()
	tests := []struct{ agent string }{{"agent-a"}, {"agent-b"}}
	registered := map[string]float64{} // per node, over the subtests so far
	for _, tt := range tests {
		t.Run(tt.agent, func(t *testing.T) {
			home := ""
			for k := range 6 {
				url := urls[k%len(urls)]
				if k > 0 {
					// The tool call between steps: long enough for gossip to tell the next
					// ingress where the agent's prefix lives.
					poll.Until(t, 5*time.Second, "the next ingress to learn the prefix", func() bool {
						return knowsPrefix(t, url, home, (400+300*(k-1))/16)
					})
				}
				status, ran, cached := agentStep(t, url, tt.agent, k)
				if status != http.StatusOK {
					t.Fatalf("step %d: status %d", k, status)
				}
				if k == 0 {
					home = ran
					continue
				}
				if ran != home {
					t.Fatalf("step %d ran on %s, want the agent's home %s", k, ran, home)
				}
				if cached < 300 {
					t.Errorf("step %d: %d cached prompt tokens, want the previous step's prefix", k, cached)
				}
			}
			// Only the home keeps the agent's window; the other ingresses just forwarded.
			registered[home]++
			for i, u := range urls {
				want := registered[testnet.Name(i)]
				if got := metric(t, u, "kvmesh_agent_registered", ""); got != want {
					t.Errorf("%s registers %v agents, want %v", testnet.Name(i), got, want)
				}
			}
		})
	}
}

// TestPausedAgentStepWaitsInsteadOfFailing pins that with a window of one held by agent a, a
// request without an agent runs at once, agent a's next steps run at once, and agent b's first
// step waits (at the home, or at the peer ingress that forwards it) instead of failing; and
// that b's step runs on the home only once the idle sweep has removed the silent agent a and
// freed its slot, never before.
func TestPausedAgentStepWaitsInsteadOfFailing(t *testing.T) {
	const idle = 400 * time.Millisecond
	tests := []struct {
		name    string
		ingress int // where agent b's step enters: the home (held locally) or a peer (polls the home)
	}{{"local", 0}, {"forwarded", 1}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tn := startNet(t, 2, func(i int, cfg *node.Config) {
				cfg.Agents = agentConfig(1, idle)
				cfg.AgentInterval = 20 * time.Millisecond
				if i == 1 {
					cfg.Models = []string{"another-model"} // an ingress only: every agent homes on n1
				}
			})
			urls := tn.URLs()
			home := urls[0]
			if status, ran, _ := agentStep(t, home, "a", 0); status != http.StatusOK || ran != testnet.Name(0) {
				t.Fatalf("agent a: status %d on %q", status, ran)
			}
			poll.Until(t, 5*time.Second, "agent a active", func() bool { return metric(t, home, "kvmesh_agent_active", "") == 1 })

			done := make(chan int, 1)
			go func() {
				resp, err := http.Post(urls[tt.ingress]+"/v1/chat/completions", "application/json",
					strings.NewReader(chatBody(longPrompt("b", 500), 8, false)))
				if err != nil {
					done <- 0
					return
				}
				resp.Body.Close()
				done <- resp.StatusCode
			}()
			// The step above has no agent header; this one is agent b's first step. As soon as
			// it has run, the goroutine snapshots the home's agent counters.
			type result struct {
				status   int
				ran      string
				counters agentCounters // the home's, taken once b's response was read
				err      error
			}
			bDone := make(chan result, 1)
			go func() {
				req, _ := http.NewRequest(http.MethodPost, urls[tt.ingress]+"/v1/chat/completions",
					strings.NewReader(chatBody(longPrompt("agent-b", 500), 8, false)))
				req.Header.Set(node.HeaderAgent, "b")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					bDone <- result{err: err}
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				counters, err := gatherAgentCounters(tn.Nodes[0])
				bDone <- result{resp.StatusCode, resp.Header.Get(node.HeaderNode), counters, err}
			}()
			if status := <-done; status != http.StatusOK {
				t.Fatalf("a request without an agent got %d: agent admission must not hold it", status)
			}
			poll.Until(t, 5*time.Second, "agent b waiting for a slot", func() bool { return metric(t, home, "kvmesh_agent_waiting", "") == 1 })

			// Agent a is active: its next steps run at once while b waits.
			for k := 1; k <= 2; k++ {
				if status, _, _ := agentStep(t, home, "a", k); status != http.StatusOK {
					t.Fatalf("agent a step %d: status %d", k, status)
				}
			}
			select {
			case r := <-bDone:
				t.Fatalf("agent b's first step finished (status %d) while the window of 1 was agent a's", r.status)
			default:
			}
			// Agent a goes silent: the sweep frees its slot and b's held step runs.
			r := await(t, bDone, "agent b's step never ran")
			if r.err != nil {
				t.Fatalf("agent b: %v", r.err)
			}
			if r.status != http.StatusOK || r.ran != testnet.Name(0) {
				t.Fatalf("agent b: status %d on %q, want 200 on the home", r.status, r.ran)
			}
			// The home counts a's sweep before it lets b in (both under the window's lock), so
			// once b's step has run the sweep counter has moved, however slow the machine. Had
			// b run while a still held the slot, moments after a's last step, it would read 0.
			// b, idle since its step, may have been swept since: swept plus registered counts
			// a and b either way.
			if r.counters.swept < 1 {
				t.Errorf("agent b's step ran with kvmesh_agent_swept_total = %v: it took the window before the sweep freed agent a's slot", r.counters.swept)
			}
			if r.counters.swept+r.counters.registered != 2 {
				t.Errorf("kvmesh_agent_swept_total = %v with %v agents registered, want agent a swept and b registered or, since its step, swept",
					r.counters.swept, r.counters.registered)
			}
			if r.counters.admitted != 2 {
				t.Errorf("kvmesh_agent_admitted_total = %v, want 2", r.counters.admitted)
			}
			requireAgentMetrics(t, home)
			// Agent a's steps ended in a sweep: its mean context is the footprint's first sample.
			if got := metric(t, home, "kvmesh_agent_footprint_tokens", ""); got <= 0 {
				t.Errorf("kvmesh_agent_footprint_tokens = %v after agent a was swept, want its mean context", got)
			}
		})
	}
}

// agentCounters are a node's agent window counters from one scrape.
type agentCounters struct {
	swept, admitted, registered float64
}

// gatherAgentCounters reads n's agent counters from its registry. The window's collector
// takes them from one snapshot of the window, so they are consistent with each other. It
// does not use t, so it can run on another goroutine.
func gatherAgentCounters(n *node.Node) (agentCounters, error) {
	fams, err := n.Registry().Gather()
	if err != nil {
		return agentCounters{}, err
	}
	var c agentCounters
	for _, f := range fams {
		var v float64
		for _, m := range f.GetMetric() {
			v += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
		switch f.GetName() {
		case "kvmesh_agent_swept_total":
			c.swept = v
		case "kvmesh_agent_admitted_total":
			c.admitted = v
		case "kvmesh_agent_registered":
			c.registered = v
		}
	}
	return c, nil
}

// requireAgentMetrics fails unless every kvmesh_agent_* family is exported.
func requireAgentMetrics(t *testing.T, url string) {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	text := string(readAll(t, resp))
	for _, name := range []string{"window", "active", "paused", "waiting", "registered", "pauses_total",
		"resumes_total", "admitted_total", "swept_total", "finished_total", "kv_use", "kv_use_next", "hit_rate",
		"window_cap", "footprint_tokens", "recompute_avoided_tokens_total", "recomputed_tokens_total"} {
		if !strings.Contains(text, "\nkvmesh_agent_"+name+" ") {
			t.Errorf("metric kvmesh_agent_%s missing", name)
		}
	}
	if metric(t, url, "kvmesh_agent_window", "") != 1 {
		t.Errorf("kvmesh_agent_window = %v, want the configured 1", metric(t, url, "kvmesh_agent_window", ""))
	}
}

func TestAgentAdmissionConfig(t *testing.T) {
	bad := agent.DefaultConfig()
	bad.IdleTimeout = -time.Second
	tests := []struct {
		name        string
		agents      *agent.Config
		wantErr     error
		wantMetrics bool
	}{
		{"off", nil, nil, false},
		{"on", agentConfig(4, time.Minute), nil, true},
		{"invalid", &bad, agent.ErrConfig, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := node.DefaultConfig()
			cfg.Name, cfg.Standalone, cfg.GPU, cfg.Agents = "n", true, "none", tt.agents
			n, err := node.New(cfg)
			if !errors.Is(err, tt.wantErr) || (err == nil) != (tt.wantErr == nil) {
				t.Fatalf("New: %v, want %v", err, tt.wantErr)
			}
			if err != nil {
				return
			}
			t.Cleanup(func() { _ = n.Shutdown(t.Context()) })
			fams, err := n.Registry().Gather()
			if err != nil {
				t.Fatal(err)
			}
			got := false
			for _, f := range fams {
				got = got || strings.HasPrefix(f.GetName(), "kvmesh_agent_")
			}
			if got != tt.wantMetrics {
				t.Errorf("kvmesh_agent_* metrics registered: %v, want %v", got, tt.wantMetrics)
			}
		})
	}
}

// await returns the next value from ch, or fails with msg if none comes within 15 s.
func await[T any](t *testing.T, ch <-chan T, msg string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(15 * time.Second):
		t.Fatal(msg)
		panic("unreachable")
	}
}

// stepResult is how an agent step sent from a goroutine ended.
type stepResult struct {
	status int
	ran    string
	reason string
	err    error
}

// sendStep posts step k of agent id to url with extra headers and returns how it ended. It
// does not use t, so it can run on another goroutine.
func sendStep(url, id string, k int, hdr map[string]string) stepResult {
	req, err := http.NewRequest(http.MethodPost, url+"/v1/chat/completions",
		strings.NewReader(chatBody(longPrompt(id, 400+300*k), 8, false)))
	if err != nil {
		return stepResult{err: err}
	}
	req.Header.Set(node.HeaderAgent, id)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return stepResult{err: err}
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return stepResult{status: resp.StatusCode, ran: resp.Header.Get(node.HeaderNode), reason: resp.Header.Get(node.HeaderReason)}
}

// oneHome starts two nodes whose window of one agent is on n1: n2 serves another model, so it
// is an ingress only and forwards every agent step to n1.
func oneHome(t *testing.T) []string {
	t.Helper()
	tn := startNet(t, 2, func(i int, cfg *node.Config) {
		cfg.Agents = agentConfig(1, time.Minute) // only a final step or an abandon frees the slot
		cfg.AgentInterval = 20 * time.Millisecond
		// A parked step's lease outlives these tests' waits however late a loaded machine
		// renews it, so only the ingress's give-up or the step's end can drop it.
		cfg.AgentLeaseIntervals = 100
		if i == 1 {
			cfg.Models = []string{"another-model"}
		}
	})
	return tn.URLs()
}

// TestAgentFinalStepFreesTheSlotAndWindowWaitIsNotSLOTime pins two things: a step marked
// X-Kvmesh-Agent-Final ends its agent at once (the next agent runs long before the idle
// timeout), and a new agent's first step held by the window longer than its TTFT SLO runs
// when let in instead of being refused slo_unattainable, because its SLO counts from then.
func TestAgentFinalStepFreesTheSlotAndWindowWaitIsNotSLOTime(t *testing.T) {
	const slo = 300 * time.Millisecond
	tests := []struct {
		name    string
		ingress int // where the steps enter: the home, or the peer that forwards them
	}{{"local", 0}, {"forwarded", 1}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			urls := oneHome(t)
			home, in := urls[0], urls[tt.ingress]
			if r := sendStep(in, "a", 0, nil); r.status != http.StatusOK || r.ran != testnet.Name(0) {
				t.Fatalf("agent a step 0: %+v", r)
			}
			sent := time.Now()
			bDone := make(chan stepResult, 1)
			go func() { bDone <- sendStep(in, "b", 0, map[string]string{node.HeaderTTFTSLO: slo.String()}) }()
			// b is held by the window (a holds its only slot) for longer than its TTFT SLO.
			poll.Until(t, 10*time.Second, "agent b held past its TTFT SLO", func() bool {
				return metric(t, home, "kvmesh_agent_waiting", "") == 1 && time.Since(sent) > 2*slo
			})
			select {
			case r := <-bDone:
				t.Fatalf("agent b ended (%+v) while agent a held the window of 1", r)
			default:
			}
			if r := sendStep(in, "a", 1, map[string]string{node.HeaderAgentFinal: "1"}); r.status != http.StatusOK {
				t.Fatalf("agent a's final step: %+v", r)
			}
			r := await(t, bDone, "agent b's step never ran after agent a's final step")
			if r.status != http.StatusOK || r.ran != testnet.Name(0) {
				t.Fatalf("agent b: %+v, want 200 on the home (its SLO counts from the window's admission)", r)
			}
			for name, want := range map[string]float64{
				"kvmesh_agent_finished_total": 1, // a, by its final step
				"kvmesh_agent_swept_total":    0, // nobody waited out the idle timeout
				"kvmesh_agent_admitted_total": 2,
				"kvmesh_agent_registered":     1, // b
			} {
				if got := metric(t, home, name, ""); got != want {
					t.Errorf("%s = %v, want %v", name, got, want)
				}
			}
		})
	}
}

// TestAgentStepGivenUpAtTheIngressLeavesTheHome pins that when an ingress gives up on a step
// held at a peer (here its queue TTL runs out), it says so and the home stops keeping the
// agent's place: the next agent gets the slot when it frees, instead of the abandoned one
// holding it until the idle timeout.
func TestAgentStepGivenUpAtTheIngressLeavesTheHome(t *testing.T) {
	urls := oneHome(t)
	home, in := urls[0], urls[1]
	if r := sendStep(in, "a", 0, nil); r.status != http.StatusOK {
		t.Fatalf("agent a step 0: %+v", r)
	}
	r := sendStep(in, "b", 0, map[string]string{node.HeaderQueueTTL: "300ms"})
	if r.status != http.StatusTooManyRequests || r.reason != "queue_ttl_expired" {
		t.Fatalf("agent b: %+v, want 429 queue_ttl_expired while a holds the window", r)
	}
	poll.Until(t, 5*time.Second, "the home to drop the abandoned agent b", func() bool {
		return metric(t, home, "kvmesh_agent_waiting", "") == 0 && metric(t, home, "kvmesh_agent_registered", "") == 1
	})
	if got := metric(t, home, "kvmesh_agent_abandoned_total", `reason="given_up"`); got != 1 {
		t.Errorf(`kvmesh_agent_abandoned_total{reason="given_up"} = %v, want 1: the ingress did not say it gave b up`, got)
	}
	cDone := make(chan stepResult, 1)
	go func() { cDone <- sendStep(in, "c", 0, nil) }()
	poll.Until(t, 5*time.Second, "agent c waiting", func() bool { return metric(t, home, "kvmesh_agent_waiting", "") == 1 })
	if r := sendStep(in, "a", 1, map[string]string{node.HeaderAgentFinal: "1"}); r.status != http.StatusOK {
		t.Fatalf("agent a's final step: %+v", r)
	}
	if r := await(t, cDone, "agent c never ran: the slot went to the abandoned agent b"); r.status != http.StatusOK {
		t.Fatalf("agent c: %+v", r)
	}
	if got := metric(t, home, "kvmesh_agent_admitted_total", ""); got != 2 {
		t.Errorf("kvmesh_agent_admitted_total = %v, want 2 (a and c; b never ran)", got)
	}
}

func TestAgentFinalHeaderValidated(t *testing.T) {
	urls := oneHome(t)
	r := sendStep(urls[0], "a", 0, map[string]string{node.HeaderAgentFinal: "yes"})
	if r.status != http.StatusBadRequest || r.reason != "invalid_parameter" {
		t.Fatalf("X-Kvmesh-Agent-Final: yes gave %+v, want 400 invalid_parameter", r)
	}
}

// TestAgentStepIsNotRefusedForItsSLO pins that with agent admission on, an agent's steps are
// admitted by its home's window and not refused slo_unattainable per request, at the ingress
// or at the home (a refused step would send its client away while its slot sat idle); the
// same request without an agent is refused.
func TestAgentStepIsNotRefusedForItsSLO(t *testing.T) {
	tests := []struct {
		name    string
		ingress int // where the steps enter: the home, or the peer that forwards them
	}{{"local", 0}, {"forwarded", 1}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			urls := oneHome(t)
			in := urls[tt.ingress]
			step := func(agent string, tokens int) (*http.Response, []byte) {
				hdr := map[string]string{node.HeaderTTFTSLO: "1ms"}
				if agent != "" {
					hdr[node.HeaderAgent] = agent
				}
				resp := post(t, in, "/v1/chat/completions", chatBody(longPrompt("slo", tokens), 8, false), hdr)
				return resp, readAll(t, resp)
			}
			if resp, b := step("", 3000); resp.StatusCode != http.StatusTooManyRequests || decodeError(t, b).Error.Code != "slo_unattainable" {
				t.Fatalf("a request without an agent: status %d: %s, want slo_unattainable", resp.StatusCode, b)
			}
			for k, tokens := range []int{3000, 3500} { // a new agent's first step, then an active agent's next
				if resp, b := step("a", tokens); resp.StatusCode != http.StatusOK || resp.Header.Get(node.HeaderNode) != testnet.Name(0) {
					t.Fatalf("agent step %d: status %d on %q: %s, want 200 on the home", k, resp.StatusCode, resp.Header.Get(node.HeaderNode), b)
				}
			}
		})
	}
}

// rendezvousFirst returns count agent ids whose plain rendezvous home among names (what
// route gives a new agent on an idle mesh) is names[0].
func rendezvousFirst(t *testing.T, count int, names ...string) []string {
	t.Helper()
	var peers []route.Peer
	for _, n := range names {
		peers = append(peers, route.Peer{Name: n, Models: []string{model}, Healthy: true})
	}
	var out []string
	for i := 0; len(out) < count; i++ {
		id := fmt.Sprintf("balanced-%d", i)
		r, err := route.New(route.DefaultConfig())
		if err != nil {
			t.Fatal(err)
		}
		c, err := r.Route(time.Now(), route.Request{Model: model, Session: agent.Scoped(node.OpenTenant, id), StayHome: true}, peers, nil)
		if err != nil {
			t.Fatal(err)
		}
		if c[0].Name == names[0] {
			out = append(out, id)
		}
	}
	return out
}

// advertises reports whether node i's view of the mesh has home listing agent id.
func advertises(tn *testnet.Net, i int, home, id string) bool {
	for _, m := range tn.Nodes[i].Members() {
		if m.Name == home {
			_, ok := slices.BinarySearch(m.State.AgentKeys, route.AgentKey(agent.Scoped(node.OpenTenant, id)))
			return ok
		}
	}
	return false
}

func TestNewAgentsHomeByLoadAndEveryIngressFollows(t *testing.T) {
	tn := startNet(t, 2, func(i int, cfg *node.Config) {
		cfg.Agents = agentConfig(8, time.Minute)
		cfg.AgentInterval = 20 * time.Millisecond
	})
	urls := tn.URLs()
	// Six new agents that the plain hash would all home on n1, through n1's ingress: bounded
	// loads put 3 of them on each node.
	ids := rendezvousFirst(t, 6, testnet.Name(0), testnet.Name(1))
	homes := map[string]string{}
	count := map[string]int{}
	for _, id := range ids {
		status, ran, _ := agentStep(t, urls[0], id, 0)
		if status != http.StatusOK {
			t.Fatalf("%s step 0: status %d", id, status)
		}
		homes[id] = ran
		count[ran]++
	}
	if count[testnet.Name(0)] != 3 || count[testnet.Name(1)] != 3 {
		t.Fatalf("homes of 6 new agents hashed to %s: %v, want 3 on each node", testnet.Name(0), count)
	}
	// Their next steps enter at the other ingress, once its view lists each agent at its home:
	// every one runs where its first did.
	for _, id := range ids {
		poll.Until(t, 5*time.Second, "n2 to learn "+id+"'s home", func() bool { return advertises(tn, 1, homes[id], id) })
		status, ran, cached := agentStep(t, urls[1], id, 1)
		if status != http.StatusOK || ran != homes[id] {
			t.Fatalf("%s step 1: status %d on %s, want its home %s", id, status, ran, homes[id])
		}
		if cached < 300 {
			t.Errorf("%s step 1: %d cached prompt tokens, want the previous step's prefix", id, cached)
		}
	}
	for i, u := range urls {
		if got, want := metric(t, u, "kvmesh_agent_registered", ""), float64(count[testnet.Name(i)]); got != want {
			t.Errorf("%s registers %v agents, want %v", testnet.Name(i), got, want)
		}
	}
}

// TestAgentHomedTwiceIsKeptByOne pins what happens when two nodes both register an agent (its
// next step reached another ingress before gossip said where it lives): once each sees the
// other advertise it, the one that is not route.PreferredHome releases it, the preferred one
// keeps it, and every ingress sends its next step there.
func TestAgentHomedTwiceIsKeptByOne(t *testing.T) {
	names := []string{testnet.Name(0), testnet.Name(1)}
	for keep := range names {
		t.Run("kept by "+names[keep], func(t *testing.T) {
			id := ""
			for i := 0; id == ""; i++ {
				if c := fmt.Sprintf("twice-%d", i); route.PreferredHome(agent.Scoped(node.OpenTenant, c), names) == names[keep] {
					id = c
				}
			}
			tn := startNet(t, 2, func(i int, cfg *node.Config) {
				cfg.Agents = agentConfig(8, time.Minute)
				cfg.AgentInterval = 20 * time.Millisecond
			})
			urls := tn.URLs()
			for _, n := range tn.Nodes {
				if err := n.RegisterAgent(id); err != nil {
					t.Fatal(err)
				}
			}
			other := 1 - keep
			poll.Until(t, 5*time.Second, names[other]+" to release "+id, func() bool {
				return metric(t, urls[other], "kvmesh_agent_registered", "") == 0
			})
			for i, want := range map[int]float64{keep: 1, other: 0} {
				if got := metric(t, urls[i], "kvmesh_agent_registered", ""); got != want {
					t.Errorf("%s registers %v agents, want %v", names[i], got, want)
				}
				if got := metric(t, urls[i], "kvmesh_agent_released_total", ""); got != 1-want {
					t.Errorf("%s released %v agents, want %v", names[i], got, 1-want)
				}
			}
			for i := range urls { // the next step, through either ingress
				if status, ran, _ := agentStep(t, urls[i], id, 1); status != http.StatusOK || ran != names[keep] {
					t.Fatalf("step through %s: status %d on %s, want the keeper %s", names[i], status, ran, names[keep])
				}
			}
			if got := metric(t, urls[other], "kvmesh_agent_registered", ""); got != 0 {
				t.Errorf("%s registers %v agents after the steps, want 0", names[other], got)
			}
		})
	}
}

// TestAgentHeldAtAPeerKeepsItsPlaceWhileTheHomeIsFull pins that the steps of new agents held at
// a peer ingress for their home's window keep their places while the home's KV is full: the
// ingress keeps asking the home for them, so the home's lease on their places does not run out
// and drop them (to be registered again at the back of the queue when KV frees). A
// non-agent request fills the home's KV while agent a holds the window of one and agents b and
// c wait for it.
func TestAgentHeldAtAPeerKeepsItsPlaceWhileTheHomeIsFull(t *testing.T) {
	const interval = 100 * time.Millisecond // a lease of 500 ms
	tn := startNet(t, 2, func(i int, cfg *node.Config) {
		cfg.Agents = agentConfig(1, time.Minute)
		cfg.AgentInterval = interval
		cfg.Sim.KVBlocks = 256 // 4,096 tokens
		cfg.Sim.TimeScale = 0.5
		if i == 1 {
			cfg.Models = []string{"another-model"}
		}
	})
	urls := tn.URLs()
	home, in := urls[0], urls[1]
	if r := sendStep(in, "a", 0, nil); r.status != http.StatusOK {
		t.Fatalf("agent a step 0: %+v", r)
	}
	final := map[string]string{node.HeaderAgentFinal: "1"}
	done := make(chan stepResult, 2)
	for _, id := range []string{"b", "c"} {
		go func() { done <- sendStep(in, id, 0, final) }()
	}
	poll.Until(t, 10*time.Second, "agents b and c waiting at the home", func() bool {
		return metric(t, home, "kvmesh_agent_waiting", "") == 2
	})
	// The blocker's 3,500-token prompt (219 of the 256 blocks) leaves, for as long as it runs,
	// fewer blocks under admission's KV threshold (95%) than a new step of 400 tokens needs.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	blocked := make(chan error, 1)
	go func() {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, home+"/v1/chat/completions",
			strings.NewReader(chatBody(longPrompt("blocker", 3500), 300, true)))
		if err == nil {
			req.Header.Set(node.HeaderTTFTSLO, "1m")
			var resp *http.Response
			if resp, err = http.DefaultClient.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
			}
		}
		blocked <- err
	}()
	var full time.Time
	poll.Until(t, 10*time.Second, "the home's KV full for many leases", func() bool {
		if metric(t, home, "kvmesh_engine_kv_use_ratio", "") < 0.85 {
			full = time.Time{}
			return false
		}
		if full.IsZero() {
			full = time.Now()
		}
		return time.Since(full) > 15*interval
	})
	select {
	case err := <-blocked:
		t.Fatalf("the blocking request ended (%v) before the check", err)
	default:
	}
	if reg, wait := metric(t, home, "kvmesh_agent_registered", ""), metric(t, home, "kvmesh_agent_waiting", ""); reg != 3 || wait != 2 {
		t.Fatalf("home registered %v agents, %v waiting, want 3 and 2: the held steps of b and c lost their places", reg, wait)
	}
	if got := metric(t, home, "kvmesh_agent_abandoned_total", ""); got != 0 {
		t.Errorf("kvmesh_agent_abandoned_total = %v, want 0", got)
	}
	cancel()
	<-blocked
	if r := sendStep(in, "a", 1, final); r.status != http.StatusOK {
		t.Fatalf("agent a's final step: %+v", r)
	}
	for range 2 {
		if r := await(t, done, "agents b and c never ran"); r.status != http.StatusOK {
			t.Fatalf("agent step: %+v", r)
		}
	}
}

// TestAgentIDsAreScopedByTenant pins that two tenants naming the same X-Kvmesh-Agent run two
// agents: with a window of one held by tenant a's agent "shared", tenant b's step of "shared",
// marked final, neither runs in a's slot nor ends a's agent; it waits for a slot of its own.
func TestAgentIDsAreScopedByTenant(t *testing.T) {
	keys := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(keys, []byte(scrapeKeyLine+admit.HashKey("sk-a")+" tenant-a\n"+admit.HashKey("sk-b")+" tenant-b\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tn := startNet(t, 1, func(i int, cfg *node.Config) {
		cfg.APIKeysFile = keys
		cfg.Agents = agentConfig(1, time.Minute)
		cfg.AgentInterval = 20 * time.Millisecond
	})
	url := tn.URLs()[0]
	if r := sendStep(url, "shared", 0, map[string]string{"Authorization": "Bearer sk-a"}); r.status != http.StatusOK {
		t.Fatalf("tenant a's step: %+v", r)
	}
	r := sendStep(url, "shared", 1, map[string]string{"Authorization": "Bearer sk-b", node.HeaderAgentFinal: "1", node.HeaderQueueTTL: "300ms"})
	if r.status != http.StatusTooManyRequests || r.reason != "queue_ttl_expired" {
		t.Errorf("tenant b's step of the same id: %+v, want 429 queue_ttl_expired: a new agent waiting for the window a holds", r)
	}
	for name, want := range map[string]float64{"kvmesh_agent_active": 1, "kvmesh_agent_finished_total": 0, "kvmesh_agent_admitted_total": 1} {
		if got := metric(t, url, name, ""); got != want {
			t.Errorf("%s = %v, want %v: tenant a's agent must be untouched", name, got, want)
		}
	}
	if r := sendStep(url, "shared", 1, map[string]string{"Authorization": "Bearer sk-a", node.HeaderAgentFinal: "1"}); r.status != http.StatusOK {
		t.Errorf("tenant a's next step: %+v", r)
	}
}
