package node

import "github.com/kvmesh/kvmesh/node/nodeconfig"

// The node's configuration lives in package node/nodeconfig (the Config struct, its defaults
// and checks, the config file and what a reload may apply); these names keep it reachable
// from node, where New takes it.
type (
	// Config configures one node (nodeconfig.Config).
	Config = nodeconfig.Config
	// CarbonConfig turns on the grid carbon signal (nodeconfig.CarbonConfig).
	CarbonConfig = nodeconfig.CarbonConfig
)

// Admission modes (Config.Admission).
const (
	AdmissionKvmesh   = nodeconfig.AdmissionKvmesh
	AdmissionNone     = nodeconfig.AdmissionNone
	AdmissionQueueCap = nodeconfig.AdmissionQueueCap
)

// DefaultModel is the model a node on the embedded engine serves when none is configured.
const DefaultModel = nodeconfig.DefaultModel

// DefaultConfig returns a node configuration at its defaults (nodeconfig.DefaultConfig).
func DefaultConfig() Config { return nodeconfig.DefaultConfig() }
