// Package adapters is a node's side of LoRA adapters loaded on demand (the node's
// adapter_source, loads and unloads through package node/lora): every adapter of the source
// is a model of the node while it serves the adapter's base model (Set.Source), routing
// counts the adapter on every peer serving that base (Set.WithSource), and running a request
// for one first loads it through the engine's runtime API (Set.Acquire), which admission
// counts in the predicted TTFT (route.Peer.AdapterLoad, Set.Load).
//
// # Contract
//
//   - New does no I/O; Start reads the source, before the node serves. Without a source every
//     method answers as for no adapter: nothing to load, nothing to list.
//   - A load's failure is the client's answer with a precise code (CodeAdapterLoadFailed,
//     CodeAdapterLoadTimeout, CodeAdapterSlotsBusy; 404 model_not_found for an adapter a
//     reload dropped while its request waited), through journey.EngineError.
//   - A request whose acquire loaded its adapter, waited for another's load or failed gets a
//     kvmesh.adapter.load span under its own (tracing.Spans.AdapterLoad).
//   - After Start a Set is safe for concurrent use.
package adapters
