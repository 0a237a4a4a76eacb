package node_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/kvmesh/kvmesh/node/engine/kvevents"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// quic-go and net/http keep-alive goroutines can outlive a test by a moment after Close.
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		// zmq4 never stops a PUB socket's writer (kvevents.Publisher.Close).
		goleak.IgnoreAnyFunction(kvevents.LeakedWriter),
	)
}
