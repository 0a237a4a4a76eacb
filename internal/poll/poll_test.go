package poll

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestWithin(t *testing.T) {
	tests := []struct {
		name    string
		holdsAt int // the call on which cond first holds; 0: never
		want    bool
	}{
		{"holds at once", 1, true},
		{"holds after a few checks", 5, true},
		{"never holds", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			calls := 0
			got := Within(50*time.Millisecond, func() bool {
				calls++
				return calls == tt.holdsAt
			})
			if got != tt.want {
				t.Fatalf("Within = %v after %d calls, want %v", got, calls, tt.want)
			}
			if tt.want && calls != tt.holdsAt {
				t.Errorf("cond called %d times, want %d: Within must stop once it holds", calls, tt.holdsAt)
			}
			if !tt.want && calls < 2 {
				t.Errorf("cond called %d times before giving up, want it checked again until the deadline", calls)
			}
		})
	}
}

// fatalTB records Until's failure instead of ending the test.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}

func (f *fatalTB) Fatalf(format string, args ...any) { f.msg = fmt.Sprintf(format, args...) }

func TestUntilNamesWhatItWaitedFor(t *testing.T) {
	var f fatalTB
	Until(&f, 10*time.Millisecond, "the sky to fall", func() bool { return false })
	if !strings.Contains(f.msg, "waiting for the sky to fall") {
		t.Errorf("Until failed with %q, want it to name what it waited for", f.msg)
	}
	f.msg = ""
	Until(&f, 10*time.Millisecond, "nothing", func() bool { return true })
	if f.msg != "" {
		t.Errorf("Until failed with %q although cond held", f.msg)
	}
}
