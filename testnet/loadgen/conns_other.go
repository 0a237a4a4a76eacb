//go:build !unix

package loadgen

// connsPerTarget is unbounded where the descriptor limit cannot be read.
func connsPerTarget(int) int { return 0 }
