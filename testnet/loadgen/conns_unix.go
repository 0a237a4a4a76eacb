//go:build unix

package loadgen

import "syscall"

// connsPerTarget bounds each target's open connections so that an open-loop run past
// saturation stays inside the process's descriptor limit. A policy without admission holds
// thousands of requests open; past the limit the dials fail, and the run would measure the
// load generator rather than the policy. A request over the bound waits for a connection, its
// latency clock running, as it would wait in an engine's queue. A third of the limit is spent,
// because in kvmesh bench the nodes share the process and hold the other end of each
// connection. 0 means no bound.
func connsPerTarget(targets int) int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || targets <= 0 {
		return 0
	}
	if lim.Cur > 1<<30 { // unlimited, in effect
		return 0
	}
	return max(int(lim.Cur/3)/targets, 16)
}
