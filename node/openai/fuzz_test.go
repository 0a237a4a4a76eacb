package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"testing"
)

func FuzzDecodeChat(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"stop":"x","max_tokens":3}`))
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"}]}],"tools":[{"type":"function"}],"logit_bias":{"1":2}}`))
	f.Add([]byte(`{"model":"m","messages":[{"role":"assistant","content":null}],"stream":true,"stream_options":{"include_usage":true}}`))
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"a"}]}]}`))
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AA==","detail":"low"}},` +
		`{"type":"input_audio","input_audio":{"data":"UklGRg==","format":"wav"}},{"type":"input_audio","input_audio":{"format":"mp3"}}]}]}`))
	f.Add([]byte(`{"model":"m","messages":[{"role":"assistant","content":"a","reasoning_content":"r"},{"role":"critic","content":"c"}],"top_k":40,"min_p":0.1,` +
		`"repetition_penalty":1.1,"min_tokens":2,"ignore_eos":true,"chat_template_kwargs":{"enable_thinking":false},"guided_json":{"type":"object"},` +
		`"skip_special_tokens":false,"logprobs":true,"top_logprobs":3,"stream_options":{"include_usage":true,"continuous_usage_stats":true}}`))
	f.Add([]byte(`{"model":"m","Model":"n","messages":[{"role":"user","content":"x"}],"x":1,"x":[2],"stream_options":null}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeChat(bytes.NewReader(b), 1<<16)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.Status < 400 {
				t.Fatalf("error %v is not an API error", err)
			}
			return
		}
		roundTrip(t, r, func(b []byte) (any, error) {
			r, e := DecodeChat(bytes.NewReader(b), 1<<20)
			if e != nil {
				return nil, e
			}
			return r, nil
		})
	})
}

func FuzzDecodeCompletion(f *testing.F) {
	f.Add([]byte(`{"model":"m","prompt":"hi","echo":true,"suffix":"s"}`))
	f.Add([]byte(`{"model":"m","prompt":"hi","max_tokens":3.0,"logprobs":1e0,"n":null,"seed":-1.5}`))
	f.Add([]byte(`{"model":"m","prompt":["hi"],"stop":["a"]}`))
	f.Add([]byte(`{"model":"m","prompt":"p","logprobs":5,"echo":true,"top_k":-1,"min_tokens":3,"guided_regex":"a+","stream_options":{"x":{}}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeCompletion(bytes.NewReader(b), 1<<16)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.Status < 400 {
				t.Fatalf("error %v is not an API error", err)
			}
			return
		}
		roundTrip(t, r, func(b []byte) (any, error) {
			r, e := DecodeCompletion(bytes.NewReader(b), 1<<20)
			if e != nil {
				return nil, e
			}
			return r, nil
		})
	})
}

// roundTrip checks an accepted request re-encodes into a body that decodes to an equal value
// (raw JSON fields compared after the first encoding normalised their whitespace).
func roundTrip(t *testing.T, v any, decode func([]byte) (any, error)) {
	t.Helper()
	enc1, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("re-encoding: %v", err)
	}
	v2, err := decode(enc1)
	if err != nil {
		t.Fatalf("re-decoding %s: %v", enc1, err)
	}
	enc2, err := json.Marshal(v2)
	if err != nil {
		t.Fatal(err)
	}
	v3, err := decode(enc2)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(enc1, enc2) || !reflect.DeepEqual(v2, v3) {
		t.Fatalf("round trip changed the request:\n%s\n%s", enc1, enc2)
	}
}

func FuzzSSEReader(f *testing.F) {
	f.Add([]byte("data: a\n\ndata: [DONE]\n\n"))
	f.Add([]byte(": c\r\ndata: x\r\ndata: y\r\n\r\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		r := NewSSEReader(bytes.NewReader(b))
		r.SetMaxEventBytes(1 << 10)
		for i := 0; ; i++ {
			d, err := r.Next()
			if err != nil {
				if _, err2 := r.Next(); err2 == nil {
					t.Fatal("Next returned data after an error")
				}
				return
			}
			if len(d) > 1<<10 || i > len(b) {
				t.Fatalf("event of %d bytes, %d events from %d input bytes", len(d), i, len(b))
			}
		}
	})
}

func FuzzDecodeKVTransferParams(f *testing.F) {
	f.Add([]byte(PrefillTransferParams))
	f.Add([]byte(`{"do_remote_prefill":true,"remote_engine_id":"e","remote_request_id":"r","remote_block_ids":[0,1],"remote_host":"h","remote_port":80}`))
	f.Add([]byte(`{"do_remote_prefill":true,"remote_block_ids":[[0]],"remote_port":1e9}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := DecodeKVTransferParams(b)
		switch {
		case err != nil && !errors.Is(err, ErrKVTransferParams):
			t.Fatalf("error %v does not wrap ErrKVTransferParams", err)
		case err == nil && p != nil && p.DoRemotePrefill && (p.RemoteHost == nil || p.RemotePort == nil || p.RemoteEngineID == nil):
			t.Fatalf("accepted %s without the remote's address", b)
		}
	})
}
