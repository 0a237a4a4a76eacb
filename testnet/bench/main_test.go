package bench

import (
	"testing"

	"go.uber.org/goleak"
)

// Run starts testnets and load generators; none of their goroutines may outlive it.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
