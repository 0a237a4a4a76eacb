package node_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/node"
)

// messagesEngine is an external engine that serves the Messages API natively: it records each
// body posted to /v1/messages and answers with nativeStream (or nativeWhole); with broken set,
// a stream stops after its first text delta with the connection cut. Chat requests, and the
// probe's empty body, are answered as a vLLM would.
type messagesEngine struct {
	url    string
	bodies chan []byte
	broken bool
}

// nativeStream is the engine's stream: its exact bytes must reach the client.
var nativeStream = []string{
	"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_native\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"" + model + "\",\"stop_reason\":null,\"usage\":{\"input_tokens\":11,\"output_tokens\":0,\"cache_read_input_tokens\":5}}}\n\n",
	"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
	"event: ping\ndata: {\"type\": \"ping\"}\n\n",
	"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"na\"}}\n\n",
	"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"tive\"}}\n\n",
	"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
	"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":2}}\n\n",
	"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
}

const nativeWhole = `{"id":"msg_native","type":"message","role":"assistant","model":"` + model + `","content":[{"type":"text","text":"native"}],` +
	`"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":11,"output_tokens":2}}`

func startMessagesEngine(t *testing.T, broken bool) *messagesEngine {
	t.Helper()
	f := &messagesEngine{bodies: make(chan []byte, 64), broken: broken}
	chat := startRecordingEngine(t) // its chat answers, for a request that is not passed through
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, `{"object":"list","data":[{"id":%q,"object":"model","max_model_len":131072}]}`, model)
	})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0\n")
	})
	mux.HandleFunc("POST /v1/messages", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if string(b) == "{}" {
			w.WriteHeader(http.StatusBadRequest) // the probe
			io.WriteString(w, `{"type":"error","error":{"type":"invalid_request_error","message":"model: Field required"}}`)
			return
		}
		f.bodies <- b
		if !strings.Contains(string(b), `"stream":true`) {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, nativeWhole)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
		for i, ev := range nativeStream {
			io.WriteString(w, ev)
			w.(http.Flusher).Flush()
			if f.broken && i == 3 {
				panic(http.ErrAbortHandler) // the connection cut mid-stream
			}
		}
	})
	mux.Handle("POST /v1/chat/completions", http.RedirectHandler(chat.url+"/v1/chat/completions", http.StatusTemporaryRedirect))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	f.url = srv.URL
	return f
}

// received is the next body f's engine was sent; the test fails when none comes.
func (f *messagesEngine) received(t *testing.T) []byte {
	t.Helper()
	select {
	case b := <-f.bodies:
		return b
	case <-time.After(5 * time.Second):
		t.Fatal("the native engine was sent no Messages request")
		return nil
	}
}

// messagesBody is a Messages request with a system prompt, a tool and a stop sequence; STREAM
// is replaced.
const messagesBody = `{"model":"` + model + `","max_tokens":64,"system":"be brief","stop_sequences":["END"],` +
	`"tools":[{"name":"get_weather","description":"the weather","input_schema":{"type":"object","properties":{"city":{"type":"string"}}}}],` +
	`"messages":[{"role":"user","content":"weather in Paris?"},` +
	`{"role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Paris"}}]},` +
	`{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"sunny"}]}],STREAM}`

// nativeMesh is n1, in front of an engine that serves the Messages API natively, and n2, in
// front of one that does not (a chat-only engine), both serving the model; the node that is
// not to run the request holds its whole KV, so every request runs on run (0 or 1).
func nativeMesh(t *testing.T, broken bool, run int) (*messagesEngine, *recordingEngine, []string) {
	t.Helper()
	native, chat := startMessagesEngine(t, broken), startRecordingEngine(t)
	tn := startNet(t, 2, func(i int, cfg *node.Config) {
		cfg.EngineKind = "vllm"
		cfg.Engine = native.url
		if i == 1 {
			cfg.Engine = chat.url
		}
	})
	tn.Nodes[1-run].HoldKV(4096, true)
	urls := tn.URLs()
	deadline := time.Now().Add(10 * time.Second)
	for { // n2 must know n1 takes Messages as sent
		if p := peers(t, urls[1]); len(p.Peers) == 2 && p.Peers[0].MessagesNative && !p.Peers[1].MessagesNative {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("n1's record does not say messages_native: %+v", peers(t, urls[1]).Peers)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return native, chat, urls
}

// TestMessagesPassedThroughToNativeEngine: a Messages request, streamed and not, that runs on
// a node whose engine serves the API natively reaches the engine as the client sent it, at
// /v1/messages, whether the client came to that node or to a peer that forwarded it; the
// engine's answer reaches the client byte for byte, and its usage is counted where it ran.
func TestMessagesPassedThroughToNativeEngine(t *testing.T) {
	native, _, urls := nativeMesh(t, false, 0)
	for _, stream := range []bool{true, false} {
		body := strings.Replace(messagesBody, "STREAM", fmt.Sprintf(`"stream":%v`, stream), 1)
		want := nativeWhole
		if stream {
			want = strings.Join(nativeStream, "")
		}
		for i, url := range urls {
			t.Run(fmt.Sprintf("stream %v via n%d", stream, i+1), func(t *testing.T) {
				before := metric(t, urls[0], "kvmesh_slo_requests_total", "")
				resp := post(t, url, "/v1/messages", body, nil)
				got := readAll(t, resp)
				if resp.StatusCode != http.StatusOK || resp.Header.Get(node.HeaderNode) != "n1" || resp.Header.Get(node.HeaderNative) != "messages" {
					t.Fatalf("status %d node %q native %q: %s", resp.StatusCode, resp.Header.Get(node.HeaderNode),
						resp.Header.Get(node.HeaderNative), got)
				}
				if sent := native.received(t); string(sent) != body {
					t.Errorf("the engine got\n%s\nwant the client's body\n%s", sent, body)
				}
				if string(got) != want {
					t.Errorf("the client got\n%q\nwant the engine's answer\n%q", got, want)
				}
				if after := metric(t, urls[0], "kvmesh_slo_requests_total", ""); after != before+1 {
					t.Errorf("n1 counted %v completed requests, want %v: the native answer's usage was not read", after-before, 1)
				}
			})
		}
	}
}

// TestMessagesTranslatedBesideNativeEngine: in the same mesh, a Messages request that runs on
// the node whose engine does not serve the API is translated to chat for it, and its answer
// back, whichever node the client came to.
func TestMessagesTranslatedBesideNativeEngine(t *testing.T) {
	_, chat, urls := nativeMesh(t, false, 1)
	body := strings.Replace(messagesBody, "STREAM", `"stream":true`, 1)
	for i, url := range urls {
		t.Run(fmt.Sprintf("via n%d", i+1), func(t *testing.T) {
			resp := post(t, url, "/v1/messages", body, nil)
			got := string(readAll(t, resp))
			if resp.StatusCode != http.StatusOK || resp.Header.Get(node.HeaderNode) != "n2" || resp.Header.Get(node.HeaderNative) != "" {
				t.Fatalf("status %d node %q native %q: %s", resp.StatusCode, resp.Header.Get(node.HeaderNode), resp.Header.Get(node.HeaderNative), got)
			}
			var sent string
			select {
			case b := <-chat.bodies:
				sent = string(b)
			case <-time.After(5 * time.Second):
				t.Fatal("the chat engine was sent nothing")
			}
			if !strings.Contains(sent, `"role":"system"`) || !strings.Contains(sent, `"tool_calls"`) {
				t.Errorf("the chat engine got no chat translation: %s", sent)
			}
			if !strings.Contains(got, "event: message_start") || !strings.Contains(got, "event: message_stop") {
				t.Errorf("the client got no Messages stream: %s", got)
			}
		})
	}
}

// TestNativeMessagesStreamBreakEndsWithError: a native stream whose engine connection breaks
// after its first text does not end silently, nor move: the client reads what the engine sent
// and then an error event, locally and through a forward.
func TestNativeMessagesStreamBreakEndsWithError(t *testing.T) {
	native, _, urls := nativeMesh(t, true, 0)
	body := strings.Replace(messagesBody, "STREAM", `"stream":true`, 1)
	sent := strings.Join(nativeStream[:4], "")
	for i, url := range urls {
		t.Run(fmt.Sprintf("via n%d", i+1), func(t *testing.T) {
			resp := post(t, url, "/v1/messages", body, nil)
			got := string(readAll(t, resp))
			native.received(t)
			if resp.StatusCode != http.StatusOK || !strings.HasPrefix(got, sent) {
				t.Fatalf("status %d; the client got\n%q\nwant it to begin with what the engine sent\n%q", resp.StatusCode, got, sent)
			}
			rest := strings.TrimPrefix(got, sent)
			if !strings.HasPrefix(rest, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\"") ||
				strings.Count(rest, "event:") != 1 {
				t.Errorf("after the engine's events the client got %q, want one error event", rest)
			}
		})
	}
}
