package node_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/kvmesh/kvmesh/node/engine/kvevents"
)

// leakOptions are the goroutines the leak checks let outlive a test.
var leakOptions = []goleak.Option{
	// quic-go and net/http keep-alive goroutines can outlive a test by a moment after Close.
	goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
	goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
	// zmq4 never stops a PUB socket's writer (kvevents.Publisher.Close).
	goleak.IgnoreAnyFunction(kvevents.LeakedWriter),
}

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, leakOptions...)
}

// noLeaks checks, once the test and every cleanup registered after this call are done, that
// the test left no goroutine behind that was not running when it called noLeaks.
func noLeaks(t *testing.T) {
	t.Helper()
	opts := append([]goleak.Option{goleak.IgnoreCurrent()}, leakOptions...)
	t.Cleanup(func() { goleak.VerifyNone(t, opts...) })
}
