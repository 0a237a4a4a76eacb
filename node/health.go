package node

import (
	"net/http"

	"github.com/kvmesh/kvmesh/node/api"
	"github.com/kvmesh/kvmesh/node/openai"
	"github.com/kvmesh/kvmesh/node/render"
)

// handleModels is GET /v1/models: every model served in the mesh this node sees.
func (n *Node) handleModels(w http.ResponseWriter, r *http.Request) {
	list := openai.ModelList{Object: "list", Data: []openai.Model{}}
	for _, m := range n.meshModels() {
		list.Data = append(list.Data, render.Model(m))
	}
	api.WriteJSON(w, http.StatusOK, list)
}

func (n *Node) handleHealthz(w http.ResponseWriter, r *http.Request) {
	api.WriteJSON(w, http.StatusOK, map[string]string{"status": "ok", "node": n.cfg.Name})
}

// handleReadyz is 200 while the node is not shutting down and its engine is healthy: for an
// external engine, while it answers, serves at least one of the node's models and its metrics
// scrape works. A 503's body says why ("reason"), for an unhealthy engine when it can.
func (n *Node) handleReadyz(w http.ResponseWriter, r *http.Request) {
	switch {
	case n.unready.Load():
		api.WriteJSON(w, http.StatusServiceUnavailable, map[string]string{"status": CodeDraining, "reason": "the node is shutting down"})
	case !n.eng.State().Healthy:
		body := map[string]string{"status": "engine unhealthy"}
		if n.ext != nil {
			if err := n.ext.Health(); err != nil {
				body["reason"] = err.Error()
			}
		}
		api.WriteJSON(w, http.StatusServiceUnavailable, body)
	default:
		body := map[string]string{"status": "ready"}
		if msg := n.joinFailing(); msg != "" {
			// Ready all the same: a fleet restarting at once must serve before its seeds are back.
			body["warning"] = msg
		}
		api.WriteJSON(w, http.StatusOK, body)
	}
}

// joinFailing says why this node serves alone while it cannot join its seeds, or "".
func (n *Node) joinFailing() string {
	if n.g == nil {
		return ""
	}
	if err := n.g.JoinFailing(); err != nil {
		return "serving alone: cannot join the seeds: " + err.Error()
	}
	return ""
}
