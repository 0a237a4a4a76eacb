package poll

import (
	"testing"
	"time"
)

// The backoff between checks: it starts short, so a condition that holds soon is seen soon,
// and doubles up to a cap, so a condition that takes seconds (and may itself scrape a node
// over HTTP) is not checked in a busy loop.
const (
	minWait = time.Millisecond
	maxWait = 10 * time.Millisecond
)

// Until calls cond until it returns true. If it has not after timeout, Until fails t with
// t.Fatalf, naming what it was waiting for ("the prefix to spread": the message reads
// "timed out after 5s waiting for the prefix to spread").
func Until(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Within(timeout, cond) {
		t.Fatalf("timed out after %v waiting for %s", timeout, what)
	}
}

// Within calls cond until it returns true and reports whether it did before timeout passed.
// cond is called at least once, and once more at the deadline. For a caller that reports the
// failure itself, with what it saw.
func Within(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for wait := minWait; ; wait = min(2*wait, maxWait) {
		if cond() {
			return true
		}
		left := time.Until(deadline)
		if left <= 0 {
			return false
		}
		time.Sleep(min(wait, left)) // the backoff between checks, not a wait for the condition
	}
}
