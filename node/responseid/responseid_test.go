package responseid

import (
	"io"
	"strings"
	"testing"
)

// TestResponseIDRoundTrip: an id the node issues gives back the node's tag and the engine's
// id, whatever the engine's id holds; ids it did not issue are not read as its own.
func TestResponseIDRoundTrip(t *testing.T) {
	tag := Tag("gpu-01")
	for _, engineID := range []string{"resp_abc", "x", "a_b_c"} {
		gotTag, gotID, ok := Parse(ID(tag, engineID))
		if !ok || gotTag != tag || gotID != engineID {
			t.Errorf("%q: %q %q %v", engineID, gotTag, gotID, ok)
		}
	}
	for _, id := range []string{"", "resp_", "resp_abc", "resp_0123456789ABCDEF_x", "resp_0123456789abcdef_", "resp_0123456789abcdefx", "msg_0123456789abcdef_x"} {
		if _, _, ok := Parse(id); ok {
			t.Errorf("%q parsed as a kvmesh response id", id)
		}
	}
}

// TestTagResponseIDs: the engine's response id is tagged in a JSON answer (pretty-printed
// or not) and everywhere in a stream once the first event named it; output item ids are not.
func TestTagResponseIDs(t *testing.T) {
	read := func(r io.Reader) string {
		b, err := io.ReadAll(r)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	obj := "{\n  \"id\": \"resp_1\",\n  \"object\": \"response\",\n  \"output\": [{\"id\": \"msg_1\"}]\n}"
	if got, want := read(Rewrite(strings.NewReader(obj), "application/json", "t")), strings.Replace(obj, `"resp_1"`, `"resp_t_resp_1"`, 1); got != want {
		t.Errorf("json: %s", got)
	}
	stream := "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\"}}\n\n" +
		"data: {\"type\":\"response.output_item.added\",\"item\":{\"id\":\"msg_1\"}}\n\n" +
		"data: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_1\"}}\n\n"
	if got, want := read(Rewrite(strings.NewReader(stream), "text/event-stream; charset=utf-8", "t")), strings.ReplaceAll(stream, `"resp_1"`, `"resp_t_resp_1"`); got != want {
		t.Errorf("stream:\n%s", got)
	}
}
