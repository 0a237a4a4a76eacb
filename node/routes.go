package node

import (
	"net/http"
	"slices"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvmesh/kvmesh/node/api"
	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/transport"
)

// routes is the HTTP API. Every known path answers a method it does not take with 405, an
// Allow header and an OpenAI error body (ServeMux's own 405 is text, and a catch-all pattern
// would turn it into a 404); an unknown path is a 404 in the same shape; under /v1/messages
// both are in the Messages API's shape (api.WriteRouteError). A GET endpoint also
// answers HEAD. The admin paths and the model list need a key (api.Server.RequireKey); the probes never
// do.
func (n *Node) routes() http.Handler {
	keyed := func(h http.HandlerFunc) http.HandlerFunc { return n.api.RequireKey(h, false).ServeHTTP }
	rs := []api.Endpoint{
		{Pattern: "/v1/chat/completions", Methods: api.Post(n.api.HandleGenerate(engine.Chat))},
		{Pattern: "/v1/completions", Methods: api.Post(n.api.HandleGenerate(engine.Completion))},
		{Pattern: "/v1/messages", Methods: api.Post(n.api.HandleCounted(api.EndpointMessages, n.api.IngestMessages))},
		{Pattern: "/v1/messages/count_tokens", Methods: api.Post(n.api.HandleCounted(api.EndpointCountTokens, n.api.IngestCountTokens))},
		{Pattern: "/v1/embeddings", Methods: api.Post(n.api.HandleSimple(transport.EndpointEmbeddings, n.api.KeyFirst(n.api.IngestEmbeddings)))},
		{Pattern: "/v1/responses", Methods: api.Post(n.api.HandleSimple(transport.EndpointResponses, n.api.KeyFirst(n.api.IngestResponses)))},
		// While keys are on, the model list asks one as the other /v1 paths do (vLLM with
		// --api-key, OpenAI), not to tell anyone what the mesh serves.
		{Pattern: "/v1/models", Methods: api.Get(keyed(n.api.HandleModels))},
		// The id may hold slashes (meta-llama/Llama-3.1-8B-Instruct), sent as they are or as %2F.
		{Pattern: "/v1/models/{id...}", Methods: api.Get(keyed(n.api.HandleModel))},
	}
	rs = append(rs, n.probeRoutes()...)
	for _, r := range n.adminRoutes() {
		for m, h := range r.Methods {
			r.Methods[m] = n.api.RequireKey(h, n.cfg.AdminAddr != "")
		}
		rs = append(rs, r)
	}
	return n.mux(append(rs, n.consoleRoutes(true)...))
}

// adminHandler serves the admin listener (Config.AdminAddr): the probes, the admin paths and
// the console, without a key.
func (n *Node) adminHandler() http.Handler {
	return n.mux(slices.Concat(n.probeRoutes(), n.adminRoutes(), n.consoleRoutes(false)))
}

// probeRoutes are the load balancer's probes, open on every listener.
func (n *Node) probeRoutes() []api.Endpoint {
	return []api.Endpoint{{Pattern: "/healthz", Methods: api.Get(n.api.HandleHealthz)}, {Pattern: "/readyz", Methods: api.Get(n.api.HandleReadyz)}}
}

// adminRoutes are the operator's paths: the mesh view and the metrics.
func (n *Node) adminRoutes() []api.Endpoint {
	metrics := promhttp.HandlerFor(n.reg, promhttp.HandlerOpts{Registry: n.reg})
	return []api.Endpoint{{Pattern: "/v1/mesh/peers", Methods: api.Get(n.handlePeers)}, {Pattern: "/metrics", Methods: api.Get(metrics.ServeHTTP)}}
}

func (n *Node) mux(rs []api.Endpoint) http.Handler {
	mux := http.NewServeMux()
	for _, r := range rs {
		mux.Handle(r.Pattern, api.ByMethod(r.Methods))
	}
	if n.cfg.Standalone && n.sim != nil {
		mux.Handle("/reset_prefix_cache", api.ByMethod(api.Post(n.api.HandleResetPrefixCache)))
		mux.Handle(api.KVPath, api.ByMethod(api.Get(n.api.HandleKV)))
		mux.Handle("/v1/load_lora_adapter", api.ByMethod(api.Post(n.api.HandleLoadLoRA)))
		mux.Handle("/v1/unload_lora_adapter", api.ByMethod(api.Post(n.api.HandleUnloadLoRA)))
	}
	mux.HandleFunc("/", n.api.HandleNotFound)
	return mux
}
