package node

import (
	"net/http"

	"github.com/kvmesh/kvmesh/node/api"
	"github.com/kvmesh/kvmesh/node/console"
)

// buildConsole makes the console unless Config.NoConsole turns it off.
func (n *Node) buildConsole() error {
	if n.cfg.NoConsole {
		return nil
	}
	c, err := console.New(console.Config{Node: n.cfg.Name, Peers: func() any { return n.peers() }, Gatherer: n.reg})
	n.console = c
	return err
}

// consoleRoutes are the console's paths, for the listener that serves them: the admin
// listener when there is one, else the API listener behind the API key (keyed).
func (n *Node) consoleRoutes(keyed bool) []api.Endpoint {
	if n.console == nil || keyed == (n.cfg.AdminAddr != "") {
		return nil
	}
	var rs []api.Endpoint
	for path, h := range n.console.Handlers() {
		var hh http.Handler = h
		if keyed {
			hh = n.api.ConsoleKey(h)
		}
		rs = append(rs, api.Endpoint{Pattern: path, Methods: map[string]http.Handler{http.MethodGet: hh}})
	}
	return rs
}

// forwardReceived counts a forward from peer in the console's matrix.
func (n *Node) forwardReceived(peer string) {
	if n.console != nil {
		n.console.ForwardReceived(peer)
	}
}
