package api

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/kvmesh/kvmesh/node/journey"
	"github.com/kvmesh/kvmesh/node/openai"
	"github.com/kvmesh/kvmesh/node/render"
)

// Endpoint is one path and the handler of each method it takes.
type Endpoint struct {
	Pattern string
	Methods map[string]http.Handler
}

// Get and Post are the methods of an endpoint that takes one.
func Get(h http.HandlerFunc) map[string]http.Handler {
	return map[string]http.Handler{http.MethodGet: h}
}

func Post(h http.HandlerFunc) map[string]http.Handler {
	return map[string]http.Handler{http.MethodPost: h}
}

// RequireKey guards a path of the API listener that runs nothing: an admin path or the model
// list. While an API key file is loaded, or with always (the admin paths, while an admin
// listener serves them openly), a request must carry a valid API key (any tenant's: whoever
// may run requests may read the mesh's models, state and metrics; a key is not charged for
// it), or it is answered 401 invalid_api_key, as the inference endpoints answer.
func (sv *Server) RequireKey(h http.Handler, always bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !sv.KeyValid(r, always) {
			journey.WriteRefusal(w, ErrInvalidKey(), 0)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// ByMethod sends a request to the handler of its method, HEAD to GET's, and answers any other
// method 405.
func ByMethod(methods map[string]http.Handler) http.Handler {
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
		WriteRouteError(w, r, openai.NewError(http.StatusMethodNotAllowed, CodeMethodNotAllowed,
			r.Method+" is not allowed on "+r.URL.Path+"; allowed: "+allow))
	})
}

// HandleNotFound answers a path the API does not serve: 404 not_found.
func (sv *Server) HandleNotFound(w http.ResponseWriter, r *http.Request) {
	WriteRouteError(w, r, openai.NewError(http.StatusNotFound, CodeNotFound, "no such endpoint: "+r.Method+" "+r.URL.Path))
}

// HandleModel is GET /v1/models/{id}: the model object of a model served in the mesh, or 404
// model_not_found.
func (sv *Server) HandleModel(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	for _, m := range sv.host.MeshModels() {
		if m.Name == id {
			WriteJSON(w, http.StatusOK, render.Model(m))
			return
		}
	}
	openai.WriteError(w, openai.ErrModelNotFound(id))
}

// HandleModels is GET /v1/models: every model served in the mesh this node sees.
func (sv *Server) HandleModels(w http.ResponseWriter, r *http.Request) {
	list := openai.ModelList{Object: "list", Data: []openai.Model{}}
	for _, m := range sv.host.MeshModels() {
		list.Data = append(list.Data, render.Model(m))
	}
	WriteJSON(w, http.StatusOK, list)
}

// HandleHealthz is 200 while the process serves.
func (sv *Server) HandleHealthz(w http.ResponseWriter, r *http.Request) {
	WriteJSON(w, http.StatusOK, map[string]string{"status": "ok", "node": sv.cfg.Name})
}

// HandleReadyz is 200 while the node is not shutting down and its engine is healthy: for an
// external engine, while it answers, serves at least one of the node's models and its metrics
// scrape works. A 503's body says why ("reason"), for an unhealthy engine when it can.
func (sv *Server) HandleReadyz(w http.ResponseWriter, r *http.Request) {
	switch {
	case sv.host.Unready():
		WriteJSON(w, http.StatusServiceUnavailable, map[string]string{"status": journey.CodeDraining, "reason": "the node is shutting down"})
	case !sv.eng.State().Healthy:
		body := map[string]string{"status": "engine unhealthy"}
		if sv.ext != nil {
			if err := sv.ext.Health(); err != nil {
				body["reason"] = err.Error()
			}
		}
		WriteJSON(w, http.StatusServiceUnavailable, body)
	default:
		body := map[string]string{"status": "ready"}
		if msg := sv.host.JoinFailing(); msg != "" {
			// Ready all the same: a fleet restarting at once must serve before its seeds are back.
			body["warning"] = msg
		}
		WriteJSON(w, http.StatusOK, body)
	}
}

// Counted counts the requests in h's handlers in serving, which a drain waits for, and
// answers 503 draining for a request the drain timeout ended before anything was written
// (drainCut says so): a handler that reads the cancellation as its client leaving writes
// nothing, which would be an empty 200.
func Counted(h http.Handler, serving *atomic.Int64, drainCut func(context.Context) *openai.Error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		serving.Add(1)
		defer serving.Add(-1)
		tw := &trackedWriter{ResponseWriter: w}
		h.ServeHTTP(tw, r)
		if e := drainCut(r.Context()); e != nil && !tw.wrote {
			journey.WriteRefusal(w, e, 0)
		}
	})
}

// trackedWriter notes whether a handler wrote anything.
type trackedWriter struct {
	http.ResponseWriter
	wrote bool
}

func (w *trackedWriter) WriteHeader(status int) {
	w.wrote = true
	w.ResponseWriter.WriteHeader(status)
}

func (w *trackedWriter) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's writer (Flush).
func (w *trackedWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// ConsoleKey asks the console's requests on the API listener for an API key while keys are
// on, as the other admin paths do. A browser cannot send a bearer token when it opens a page,
// so the key may also come as the password of HTTP Basic authentication, which the 401 asks
// for; the browser then sends it with each poll.
func (sv *Server) ConsoleKey(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, pw, ok := r.BasicAuth(); ok {
			r = r.Clone(r.Context())
			r.Header.Set("Authorization", "Bearer "+pw)
		}
		if !sv.KeyValid(r, false) {
			w.Header().Set("WWW-Authenticate", `Basic realm="kvmesh console", charset="UTF-8"`)
			journey.WriteRefusal(w, ErrInvalidKey(), 0)
			return
		}
		h.ServeHTTP(w, r)
	})
}
