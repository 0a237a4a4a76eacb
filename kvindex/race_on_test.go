//go:build race

package kvindex

// raceEnabled: the race detector makes sync.Pool drop a random share of what is put back, so
// allocation counts that rely on a pool are looser under it.
const raceEnabled = true
