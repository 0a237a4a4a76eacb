package plan

import "fmt"

// Mode is how much of admission a node runs.
type Mode uint8

// Modes. ModeNone and ModeQueueCap exist to compare kvmesh with a plain router.
const (
	// ModeKvmesh runs every layer and the waiting room.
	ModeKvmesh Mode = iota
	// ModeNone validates and budgets only: everything else runs at once on the first
	// candidate and queues inside the engine.
	ModeNone
	// ModeQueueCap is ModeNone that refuses (429 queue_full) once the chosen engine has
	// Config.QueueCap requests waiting, as an engine's fixed queue limit does.
	ModeQueueCap
)

// Mode names, as the node's configuration spells them.
const (
	ModeNameKvmesh   = "kvmesh"
	ModeNameNone     = "none"
	ModeNameQueueCap = "queue-cap"
)

func (m Mode) String() string {
	switch m {
	case ModeNone:
		return ModeNameNone
	case ModeQueueCap:
		return ModeNameQueueCap
	}
	return ModeNameKvmesh
}

// ParseMode parses a Mode name; "" is ModeKvmesh.
func ParseMode(s string) (Mode, error) {
	switch s {
	case "", ModeNameKvmesh:
		return ModeKvmesh, nil
	case ModeNameNone:
		return ModeNone, nil
	case ModeNameQueueCap:
		return ModeQueueCap, nil
	}
	return 0, fmt.Errorf("plan: admission mode %q: want %s, %s or %s: %w", s, ModeNameKvmesh, ModeNameNone, ModeNameQueueCap, ErrConfig)
}
