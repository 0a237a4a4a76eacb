// Package nodeconfig holds a node's configuration: the Config struct with its defaults
// (DefaultConfig), the zero rule that fills a zero field with its default (Fill) and the
// checks of the node's own fields (Validate); the config file, JSON or YAML, a section per
// part of the node, read over a Config (LoadConfigFile, ReadConfigFile) and written back
// (MarshalConfigFile), former key names included; and what a reload of the file may apply to
// a running node (Reread, Changes). The running node's side of a reload, applying the live
// settings and watching the files, is package node's.
//
// Each sub-config (gossip, route, admission, agents, carbon, the embedded engine) is its own
// package's Config, validated by that package when the node builds the part; nodeconfig only
// holds them in their sections. Errors keep the "node: " prefix: they are the node's
// configuration's, as the operator reads them.
//
// # Concurrency
//
// Every function is safe to call concurrently; a Config is a value, not shared state. Only
// ReadConfigFile, Config.LoadTLS and Config.LoadDevTLS do I/O (they read files, and LoadDevTLS
// may create the development CA).
package nodeconfig
