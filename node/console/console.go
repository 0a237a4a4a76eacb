package console

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

//go:embed assets
var assets embed.FS

// Paths the console serves, each a GET. Page is the one an operator opens.
const (
	Page        = "/console"
	PathScript  = "/console/console.js"
	PathStyle   = "/console/console.css"
	PathState   = "/console/state"
	PathExplain = "/console/explain"
)

// Config is what a Console reads and how much it keeps.
type Config struct {
	// Node is this node's name.
	Node string
	// Peers returns this node's view of the mesh, JSON-encodable (the /v1/mesh/peers body).
	Peers func() any
	// Gatherer is the node's metric registry; the console reads Families from it.
	Gatherer prometheus.Gatherer
	// Interval is the shortest time between two builds of the state (default 1s): the page
	// polls at this period and any poll within it gets the last build.
	Interval time.Duration
	// RingSize is how many requests' explanations are kept (default 256).
	RingSize int
	// MaxFlowPeers is how many peers forwards are counted by name (default 4096).
	MaxFlowPeers int
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Console serves the page and its data. Build it with New.
type Console struct {
	cfg   Config
	ring  *Ring
	flows *Flows

	mu    sync.Mutex
	built time.Time
	state []byte
}

// New checks cfg, fills its defaults and returns the console; it starts nothing.
func New(cfg Config) (*Console, error) {
	if cfg.Peers == nil || cfg.Gatherer == nil {
		return nil, errors.New("console: Peers and Gatherer are required")
	}
	if cfg.Interval < 0 || cfg.RingSize < 0 || cfg.MaxFlowPeers < 0 {
		return nil, errors.New("console: Interval, RingSize and MaxFlowPeers must not be negative")
	}
	if cfg.Interval == 0 {
		cfg.Interval = time.Second
	}
	if cfg.RingSize == 0 {
		cfg.RingSize = 256
	}
	if cfg.MaxFlowPeers == 0 {
		cfg.MaxFlowPeers = 4096
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Console{cfg: cfg, ring: NewRing(cfg.RingSize), flows: NewFlows(cfg.MaxFlowPeers)}, nil
}

// Record keeps the explanation of a decided request.
func (c *Console) Record(e Explanation) { c.ring.Add(e) }

// ForwardSent counts a forward this node sent to peer.
func (c *Console) ForwardSent(peer string) { c.flows.Sent(peer) }

// ForwardReceived counts a forward this node received from peer.
func (c *Console) ForwardReceived(peer string) { c.flows.Received(peer) }

// Handlers are the console's GET handlers by path; the caller guards them (an API key) and
// mounts them.
func (c *Console) Handlers() map[string]http.HandlerFunc {
	return map[string]http.HandlerFunc{
		Page:        c.asset("assets/index.html", "text/html; charset=utf-8"),
		PathScript:  c.asset("assets/console.js", "text/javascript; charset=utf-8"),
		PathStyle:   c.asset("assets/console.css", "text/css; charset=utf-8"),
		PathState:   c.handleState,
		PathExplain: c.handleExplain,
	}
}

// PageBytes is the size of the page with its script and style, as served.
func PageBytes() int {
	n := 0
	for _, f := range []string{"assets/index.html", "assets/console.js", "assets/console.css"} {
		b, _ := assets.ReadFile(f)
		n += len(b)
	}
	return n
}

// secure sets the headers of every console answer: nothing but this node's own script,
// style and JSON may load, and the page is not framed.
func secure(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
}

func (c *Console) asset(name, ctype string) http.HandlerFunc {
	b, err := assets.ReadFile(name)
	if err != nil {
		panic("console: missing embedded asset " + name) // a build defect, caught by every test
	}
	return func(w http.ResponseWriter, r *http.Request) {
		secure(w)
		w.Header().Set("Content-Type", ctype)
		_, _ = w.Write(b)
	}
}

// State is the body of GET /console/state.
type State struct {
	Node       string              `json:"node"`
	Time       time.Time           `json:"time"`
	IntervalMS int64               `json:"interval_ms"`
	Mesh       any                 `json:"mesh"`
	Metrics    map[string][]Sample `json:"metrics"`
	Flows      map[string]Flow     `json:"flows"`
	Recent     []Explanation       `json:"recent"`
}

// recentShown is how many of the ring's newest requests the state lists.
const recentShown = 20

// State builds the state now, or returns the last build when it is younger than Interval.
func (c *Console) State() ([]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.cfg.Now()
	if c.state != nil && now.Sub(c.built) < c.cfg.Interval {
		return c.state, nil
	}
	ms, err := gather(c.cfg.Gatherer)
	if err != nil {
		return nil, err
	}
	s := State{Node: c.cfg.Node, Time: now, IntervalMS: c.cfg.Interval.Milliseconds(), Mesh: c.cfg.Peers(),
		Metrics: ms, Flows: c.flows.Snapshot(), Recent: c.ring.Recent(recentShown)}
	var buf bytes.Buffer
	buf.Grow(len(c.state))
	if err := json.NewEncoder(&buf).Encode(s); err != nil {
		return nil, err
	}
	c.state, c.built = buf.Bytes(), now
	return c.state, nil
}

func (c *Console) handleState(w http.ResponseWriter, r *http.Request) {
	b, err := c.State()
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	secure(w)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

// handleExplain is GET /console/explain?id=ID: the explanation of request ID, or 404 when
// the ring no longer (or never) held it. Without id: the newest requests, without candidates.
func (c *Console) handleExplain(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("id")
	if id == "" {
		writeJSON(w, http.StatusOK, c.ring.Recent(c.cfg.RingSize))
		return
	}
	e, ok := c.ring.Get(id)
	if !ok {
		writeError(w, http.StatusNotFound, "no explanation of request "+id+" here: it was decided by another node, or more than the last requests ago")
		return
	}
	writeJSON(w, http.StatusOK, e)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	secure(w)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeError answers in the API's error shape ({"error": {"message", "code"}}).
func writeError(w http.ResponseWriter, status int, msg string) {
	code := "not_found"
	if status != http.StatusNotFound {
		code = "internal_error"
	}
	writeJSON(w, status, map[string]any{"error": map[string]string{"message": msg, "type": "kvmesh_error", "code": code}})
}
