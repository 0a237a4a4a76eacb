// Package loadgen drives any OpenAI-compatible endpoint (a kvmesh node, a bare engine, another
// router) with synthetic workloads or replayed production traces, and measures what a client
// sees: TTFT, TPOT, inter-token and end-to-end latency percentiles, output tokens per second,
// goodput (requests that met both their TTFT and TPOT SLOs, per priority class), refusals by
// status and reason, Retry-After, cached-token ratio and which node served each request. With
// Config.Requests set it also writes each request's own outcome (RequestRecord, a line of JSON
// each), so the misses of a run can be told apart one by one.
//
// # Usage
//
//	cfg := loadgen.DefaultConfig()
//	cfg.Targets = []string{"http://127.0.0.1:8080"}
//	cfg.Workload = "bursty"
//	rep, err := loadgen.Run(ctx, cfg)
//	rep.WriteTable(os.Stdout)
//
// Plan returns the deterministic request schedule of a Config without sending anything, so a
// benchmark can inspect or reuse it. ReadMooncake and ReadCSV parse traces; malformed lines are
// errors that name their line, never skipped.
//
// # Workloads
//
// Prompts are made of deterministic ASCII text: kvmesh counts 4 bytes per token, so a prompt of N
// tokens is 4N bytes of content, and prefixes that a workload means to share (RAG documents,
// repositories, agent system prompts, Mooncake hash-id blocks) are byte-identical. Everything is
// a function of Config.Seed; only agent sessions depend on the server, because each step's
// prompt carries the previous step's returned output. The shared-prefix workload (SharedPrefix)
// gives each of many tenants a long system prompt its requests share, with multi-turn
// follow-ups whose prompt is an earlier request's prompt and planned reply. Config.Variant
// draws another stream of requests over the same shared texts, to warm a mesh up without
// sending the requests a measurement will. Config.Models spreads a run over several models by
// conversation (Item.Conversation), each served by some of the targets, and reports the
// requests that entered through a node serving their model apart from the others
// (Report.Entries).
//
// Arrivals are open-loop: a request is sent at its planned time whether or not earlier ones have
// finished (Concurrency, if set, bounds requests in flight; latency is measured from the moment a
// request is actually sent), except that Sessions runs agent sessions as a closed loop. A
// request that is retried after Retry-After is measured from its first attempt, as its client
// would see it.
//
// # Accounting
//
// Every request sent is counted exactly once, as completed (a 200 stream that finished),
// refused (a non-200 status, keyed by status and by X-Kvmesh-Reason or the error body's code) or
// failed (transport error, timeout, a mid-stream error event, a stream cut before it finished).
//
// # Concurrency
//
// Run may be called concurrently with different Configs; it starts one goroutine per request in
// flight plus one for the progress line and returns only after all of them have ended. Reports
// are plain values, not safe for concurrent mutation.
//
// # Zero value
//
// A zero Config is invalid (no targets); start from DefaultConfig. A zero Report is an empty
// report.
package loadgen
