// Package engine defines the one interface a node runs requests on. Its subpackages implement
// it: sim (the embedded simulated GPU running a vLLM-like engine) and openai (any external
// OpenAI-compatible server: vLLM, SGLang, llama.cpp, TGI).
//
// # Concurrency
//
// Engine implementations are safe for concurrent use; a Stream belongs to one goroutine, but
// its Close may be called from any.
package engine
