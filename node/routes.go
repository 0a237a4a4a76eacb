package node

import (
	"net/http"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvmesh/kvmesh/node/api"
	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/journey"
	"github.com/kvmesh/kvmesh/node/openai"
	"github.com/kvmesh/kvmesh/node/render"
	"github.com/kvmesh/kvmesh/node/transport"
)

// endpoint is one path and the handler of each method it takes.
type endpoint struct {
	pattern string
	methods map[string]http.Handler
}

// get and post are the methods of an endpoint that takes one.
func get(h http.HandlerFunc) map[string]http.Handler {
	return map[string]http.Handler{http.MethodGet: h}
}

func post(h http.HandlerFunc) map[string]http.Handler {
	return map[string]http.Handler{http.MethodPost: h}
}

// routes is the HTTP API. Every known path answers a method it does not take with 405, an
// Allow header and an OpenAI error body (ServeMux's own 405 is text, and a catch-all pattern
// would turn it into a 404); an unknown path is a 404 in the same shape; under /v1/messages
// both are in the Messages API's shape (writeRouteError). A GET endpoint also
// answers HEAD. The admin paths and the model list need a key (requireKey); the probes never
// do.
func (n *Node) routes() http.Handler {
	keyed := func(h http.HandlerFunc) http.HandlerFunc { return n.requireKey(h, false).ServeHTTP }
	rs := []endpoint{
		{"/v1/chat/completions", post(n.api.HandleGenerate(engine.Chat))},
		{"/v1/completions", post(n.api.HandleGenerate(engine.Completion))},
		{"/v1/messages", post(n.api.HandleCounted(endpointMessages, n.ingestMessages))},
		{"/v1/messages/count_tokens", post(n.api.HandleCounted(endpointCountTokens, n.ingestCountTokens))},
		{"/v1/embeddings", post(n.api.HandleSimple(transport.EndpointEmbeddings, n.api.KeyFirst(n.api.IngestEmbeddings)))},
		{"/v1/responses", post(n.api.HandleSimple(transport.EndpointResponses, n.api.KeyFirst(n.api.IngestResponses)))},
		// While keys are on, the model list asks one as the other /v1 paths do (vLLM with
		// --api-key, OpenAI), not to tell anyone what the mesh serves.
		{"/v1/models", get(keyed(n.handleModels))},
		// The id may hold slashes (meta-llama/Llama-3.1-8B-Instruct), sent as they are or as %2F.
		{"/v1/models/{id...}", get(keyed(n.handleModel))},
	}
	rs = append(rs, n.probeRoutes()...)
	for _, r := range n.adminRoutes() {
		for m, h := range r.methods {
			r.methods[m] = n.requireKey(h, n.cfg.AdminAddr != "")
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
func (n *Node) probeRoutes() []endpoint {
	return []endpoint{{"/healthz", get(n.handleHealthz)}, {"/readyz", get(n.handleReadyz)}}
}

// adminRoutes are the operator's paths: the mesh view and the metrics.
func (n *Node) adminRoutes() []endpoint {
	metrics := promhttp.HandlerFor(n.reg, promhttp.HandlerOpts{Registry: n.reg})
	return []endpoint{{"/v1/mesh/peers", get(n.handlePeers)}, {"/metrics", get(metrics.ServeHTTP)}}
}

func (n *Node) mux(rs []endpoint) http.Handler {
	mux := http.NewServeMux()
	for _, r := range rs {
		mux.Handle(r.pattern, byMethod(r.methods))
	}
	if n.cfg.Standalone && n.sim != nil {
		mux.Handle("/reset_prefix_cache", byMethod(post(n.api.HandleResetPrefixCache)))
		mux.Handle(api.KVPath, byMethod(get(n.api.HandleKV)))
		mux.Handle("/v1/load_lora_adapter", byMethod(post(n.api.HandleLoadLoRA)))
		mux.Handle("/v1/unload_lora_adapter", byMethod(post(n.api.HandleUnloadLoRA)))
	}
	mux.HandleFunc("/", n.handleNotFound)
	return mux
}

// requireKey guards a path of the API listener that runs nothing: an admin path or the model
// list. While an API key file is loaded, or with always (the admin paths, while an admin
// listener serves them openly), a request must carry a valid API key (any tenant's: whoever
// may run requests may read the mesh's models, state and metrics; a key is not charged for
// it), or it is answered 401 invalid_api_key, as the inference endpoints answer.
func (n *Node) requireKey(h http.Handler, always bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !n.api.KeyValid(r, always) {
			journey.WriteRefusal(w, api.ErrInvalidKey(), 0)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// byMethod sends a request to the handler of its method, HEAD to GET's, and answers any other
// method 405.
func byMethod(methods map[string]http.Handler) http.Handler {
	var allowed []string
	for m := range methods {
		allowed = append(allowed, m)
		if m == http.MethodGet {
			allowed = append(allowed, http.MethodHead)
		}
	}
	slices.Sort(allowed)
	allow := strings.Join(allowed, ", ")
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m := r.Method
		if m == http.MethodHead {
			m = http.MethodGet
		}
		if h, ok := methods[m]; ok {
			h.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Allow", allow)
		writeRouteError(w, r, openai.NewError(http.StatusMethodNotAllowed, CodeMethodNotAllowed,
			r.Method+" is not allowed on "+r.URL.Path+"; allowed: "+allow))
	})
}

func (n *Node) handleNotFound(w http.ResponseWriter, r *http.Request) {
	writeRouteError(w, r, openai.NewError(http.StatusNotFound, CodeNotFound, "no such endpoint: "+r.Method+" "+r.URL.Path))
}

// handleModel is GET /v1/models/{id}: the model object of a model served in the mesh, or 404
// model_not_found.
func (n *Node) handleModel(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	for _, m := range n.meshModels() {
		if m.Name == id {
			api.WriteJSON(w, http.StatusOK, render.Model(m))
			return
		}
	}
	openai.WriteError(w, openai.ErrModelNotFound(id))
}
