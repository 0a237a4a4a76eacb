package openai

import (
	"encoding/json"
	"reflect"
	"testing"
)

// TestTopMapKeepsOrder: a completions top_logprobs entry is written in slice order (most
// likely first), read in body order, and nil is null.
func TestTopMapKeepsOrder(t *testing.T) {
	m := TopMap{{Token: "the ", Logprob: -0.25}, {Token: "and ", Logprob: -1.5}, {Token: "<a>", Logprob: -3}}
	b, err := json.Marshal([]TopMap{nil, m, {}})
	if err != nil {
		t.Fatal(err)
	}
	const want = `[null,{"the ":-0.25,"and ":-1.5,"\u003ca\u003e":-3},{}]`
	if string(b) != want {
		t.Errorf("got  %s\nwant %s", b, want)
	}
	var back []TopMap
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, []TopMap{nil, m, {}}) {
		t.Errorf("read back %+v", back)
	}
	for _, bad := range []string{`[1]`, `{"a":"b"}`, `"x"`} {
		var m TopMap
		if err := json.Unmarshal([]byte(bad), &m); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

func FuzzTopMap(f *testing.F) {
	f.Add([]byte(`{"a":-1,"b":-2}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var m TopMap
		if json.Unmarshal(b, &m) != nil {
			return
		}
		enc, err := json.Marshal(m)
		if err != nil {
			t.Fatalf("%s: re-encoding: %v", b, err)
		}
		var m2 TopMap
		if err := json.Unmarshal(enc, &m2); err != nil || !reflect.DeepEqual(m, m2) {
			t.Fatalf("%s: round trip %s gave %+v, want %+v (%v)", b, enc, m2, m, err)
		}
	})
}
