package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestDecodeEmbeddings(t *testing.T) {
	many := `"` + strings.Repeat(`x","`, MaxEmbeddingInputs) + `x"`
	tests := []struct {
		name       string
		body       string
		wantTexts  []string
		wantTokens [][]int
		wantParam  string // "" accepts
	}{
		{"string", `{"model":"m","input":"hi"}`, []string{"hi"}, nil, ""},
		{"strings", `{"model":"m","input":["a","b"],"encoding_format":"base64","dimensions":8,"user":"u"}`, []string{"a", "b"}, nil, ""},
		{"token ids", `{"model":"m","input":[1,2,3]}`, nil, [][]int{{1, 2, 3}}, ""},
		{"token id arrays", `{"model":"m","input":[[1],[2,3]]}`, nil, [][]int{{1}, {2, 3}}, ""},
		{"vLLM field passes", `{"model":"m","input":"a","truncate_prompt_tokens":8}`, []string{"a"}, nil, ""},
		{"no model", `{"input":"a"}`, nil, nil, "model"},
		{"no input", `{"model":"m"}`, nil, nil, "input"},
		{"empty string", `{"model":"m","input":""}`, nil, nil, "input"},
		{"empty array", `{"model":"m","input":[]}`, nil, nil, "input"},
		{"empty string in array", `{"model":"m","input":["a",""]}`, nil, nil, "input"},
		{"mixed array", `{"model":"m","input":["a",1]}`, nil, nil, "input"},
		{"negative token", `{"model":"m","input":[1,-2]}`, nil, nil, "input"},
		{"empty token array", `{"model":"m","input":[[1],[]]}`, nil, nil, "input"},
		{"object input", `{"model":"m","input":{"a":1}}`, nil, nil, "input"},
		{"too many inputs", `{"model":"m","input":[` + many + `]}`, nil, nil, "input"},
		{"bad encoding", `{"model":"m","input":"a","encoding_format":"int8"}`, nil, nil, "encoding_format"},
		{"zero dimensions", `{"model":"m","input":"a","dimensions":0}`, nil, nil, "dimensions"},
		{"string dimensions", `{"model":"m","input":"a","dimensions":"8"}`, nil, nil, "dimensions"},
		{"number model", `{"model":1,"input":"a"}`, nil, nil, "model"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := DecodeEmbeddings(strings.NewReader(tt.body), 1<<20)
			if tt.wantParam != "" {
				if err == nil || err.Status != 400 || err.Param != tt.wantParam {
					t.Fatalf("got %+v, want a 400 naming %q", err, tt.wantParam)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(r.Input.Texts, tt.wantTexts) || !reflect.DeepEqual(r.Input.Tokens, tt.wantTokens) {
				t.Errorf("input %+v", r.Input)
			}
			if r.Input.Len() != max(len(tt.wantTexts), len(tt.wantTokens)) {
				t.Errorf("Len %d", r.Input.Len())
			}
		})
	}
	if _, err := DecodeEmbeddings(strings.NewReader(`{"model":"m","input":"`+strings.Repeat("a", 100)+`"}`), 64); err == nil || err.Code != CodeBodyTooLarge {
		t.Errorf("over the cap: %v", err)
	}
}

func TestEmbeddingMarshalsFloatOrBase64(t *testing.T) {
	b, _ := json.Marshal(Embedding{Object: "embedding", Index: 1, Vector: []float32{0.5, -1}})
	if string(b) != `{"object":"embedding","index":1,"embedding":[0.5,-1]}` {
		t.Errorf("float: %s", b)
	}
	b, _ = json.Marshal(Embedding{Object: "embedding", Base64: "AAAA"})
	if string(b) != `{"object":"embedding","index":0,"embedding":"AAAA"}` {
		t.Errorf("base64: %s", b)
	}
}

func TestDecodeResponses(t *testing.T) {
	tests := []struct {
		name, body, wantParam string
	}{
		{"minimal", `{"model":"m","input":"hi"}`, ""},
		{"continued", `{"model":"m","input":[{"role":"user","content":"x"}],"previous_response_id":"resp_1","stream":true,"max_output_tokens":5}`, ""},
		{"no model", `{"input":"hi"}`, "model"},
		{"empty previous", `{"model":"m","previous_response_id":""}`, "previous_response_id"},
		{"numeric previous", `{"model":"m","previous_response_id":3}`, "previous_response_id"},
		{"string stream", `{"model":"m","stream":"yes"}`, "stream"},
		{"zero output", `{"model":"m","max_output_tokens":0}`, "max_output_tokens"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := DecodeResponses(strings.NewReader(tt.body), 1<<20)
			switch {
			case tt.wantParam == "" && err != nil:
				t.Fatal(err)
			case tt.wantParam != "" && (err == nil || err.Param != tt.wantParam):
				t.Fatalf("got %+v, want a 400 naming %q", err, tt.wantParam)
			}
		})
	}
}

func FuzzDecodeEmbeddings(f *testing.F) {
	f.Add([]byte(`{"model":"m","input":"hi","encoding_format":"float"}`))
	f.Add([]byte(`{"model":"m","input":["a","b"],"dimensions":3,"encoding_format":"base64","user":"u","truncate_prompt_tokens":2}`))
	f.Add([]byte(`{"model":"m","input":[[1,2],[3]]}`))
	f.Add([]byte(`{"model":"m","input":[7,8,9]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeEmbeddings(bytes.NewReader(b), 1<<16)
		if err != nil {
			if err.Status < 400 {
				t.Fatalf("error %v is not an API error", err)
			}
			return
		}
		if r.Input == nil || r.Input.Len() == 0 || r.Input.Len() > MaxEmbeddingInputs || (r.Input.Texts != nil) == (r.Input.Tokens != nil) {
			t.Fatalf("accepted input %+v", r.Input)
		}
		roundTrip(t, r, func(b []byte) (any, error) {
			r, e := DecodeEmbeddings(bytes.NewReader(b), 1<<20)
			if e != nil {
				return nil, e
			}
			return r, nil
		})
	})
}

func FuzzDecodeResponses(f *testing.F) {
	f.Add([]byte(`{"model":"m","input":"hi"}`))
	f.Add([]byte(`{"model":"m","input":[{"role":"user","content":"x"}],"previous_response_id":"resp_a_b","stream":true,"max_output_tokens":4,"tools":[]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeResponses(bytes.NewReader(b), 1<<16)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.Status < 400 {
				t.Fatalf("error %v is not an API error", err)
			}
			return
		}
		roundTrip(t, r, func(b []byte) (any, error) {
			r, e := DecodeResponses(bytes.NewReader(b), 1<<20)
			if e != nil {
				return nil, e
			}
			return r, nil
		})
	})
}
