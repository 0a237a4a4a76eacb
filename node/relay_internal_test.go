package node

import "testing"

// TestSSEEnded pins what a relayed stream must end with to count as complete: [DONE] or an
// error event, whole.
func TestSSEEnded(t *testing.T) {
	tests := []struct {
		tail string
		want bool
	}{
		{"data: {\"x\":1}\n\ndata: [DONE]\n\n", true},
		{"data: [DONE]\n\n", true},
		{"data: {\"x\":1}\n\ndata: {\"error\":{\"message\":\"m\"}}\n\n", true},
		{"data: {\"x\":1}\n\n", false},
		{"data: {\"x\":1}\n\ndata: [DO", false},
		{"", false},
	}
	for _, tt := range tests {
		if got := sseEnded([]byte(tt.tail)); got != tt.want {
			t.Errorf("sseEnded(%q) = %v, want %v", tt.tail, got, tt.want)
		}
	}
	long := make([]byte, 3*relayTail)
	if got := keepTail(long); len(got) != relayTail {
		t.Errorf("keepTail kept %d bytes of %d, want %d", len(got), len(long), relayTail)
	}
}
