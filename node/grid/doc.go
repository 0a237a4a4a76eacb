// Package grid is a node's grid carbon signal: a carbon.Tracker fed by polling a provider
// (Electricity Maps, WattTime, a static reading) when the tracker's schedule says, and the
// gauges kvmesh_carbon_intensity and kvmesh_carbon_fail_mode_active. What the signal decides
// (routing away from a dirty grid, deferring) is the tracker's and admission's.
//
// # Concurrency
//
// New does no I/O and starts no goroutine; Run is the one polling loop, until its context
// ends. Export and Tracker are safe for concurrent use.
package grid
