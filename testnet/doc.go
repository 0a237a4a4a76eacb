// Package testnet runs a kvmesh mesh on loopback in one process: N nodes on the embedded
// engine (or, with Config.Engines external, each in front of its own standalone simulated
// engine over HTTP, as in front of vLLM), a throwaway cluster CA for mTLS, a shared random
// gossip key. `kvmesh testnet`,
// `kvmesh bench` and the end-to-end tests use it, so they drive the real HTTP, gossip and QUIC
// paths.
//
// A Net is safe for concurrent use once Start returns; Close stops every node, then every engine. There is no
// useful zero Net: Start builds and starts one.
package testnet
