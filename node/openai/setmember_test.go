package openai

import "testing"

// TestSetMemberKeepsEveryOtherByte: a top-level member's value is replaced and nothing else,
// not a nested member of the same name; a missing member is added before the closing brace;
// what is not one JSON object is refused.
func TestSetMemberKeepsEveryOtherByte(t *testing.T) {
	x := func([]byte) []byte { return []byte(`"x"`) }
	in := `{"input":[{"previous_response_id":"inner"}], "previous_response_id" : "resp_t_x" ,"model":"m"}`
	got, err := SetMember([]byte(in), "previous_response_id", x)
	if want := `{"input":[{"previous_response_id":"inner"}], "previous_response_id" : "x" ,"model":"m"}`; err != nil || string(got) != want {
		t.Errorf("got %s, %v; want %s", got, err, want)
	}
	if got, err := SetMember([]byte(`{"model":"m"}`), "priority", x); err != nil || string(got) != `{"model":"m","priority":"x"}` {
		t.Errorf("a missing member: got %s, %v", got, err)
	}
	for _, bad := range []string{`[1]`, `{"a":1} {}`, `{"a":`} {
		if _, err := SetMember([]byte(bad), "a", x); err == nil {
			t.Errorf("%s was taken for an object", bad)
		}
	}
}
