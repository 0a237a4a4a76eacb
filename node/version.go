package node

// Version is the kvmesh software version, set at build time with
// -ldflags "-X github.com/kvmesh/kvmesh/node.Version=...". It travels in the state record.
var Version = "dev"
