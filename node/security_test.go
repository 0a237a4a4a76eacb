package node_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"log/slog"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/internal/poll"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/node/transport"
	"github.com/kvmesh/kvmesh/testnet"
)

// TestInsecureDevNodesForwardUnderTheSharedDevCA: two nodes that share nothing in the process
// but the development CA's directory, each loading the CA from it and issuing its own
// certificate (as two kvmesh node --insecure-dev processes on one host do), forward to each
// other: a request for the model only the second serves, sent to the first, runs on the second.
func TestInsecureDevNodesForwardUnderTheSharedDevCA(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "dev-ca")
	models := []string{"model-a", "model-b"}
	tn := startNet(t, 2, func(i int, cfg *node.Config) {
		cfg.Models = []string{models[i]}
		cfg.TLS, cfg.DevCADir = nil, dir
		if _, err := cfg.LoadDevTLS(); err != nil {
			t.Fatal(err)
		}
	})
	urls := tn.URLs()
	body, _ := json.Marshal(map[string]any{"model": "model-b", "max_tokens": 4,
		"messages": []map[string]string{{"role": "user", "content": "hello"}}})
	resp := post(t, urls[0], "/v1/chat/completions", string(body), nil)
	if b := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	if got, want := resp.Header.Get(node.HeaderNode), tn.Nodes[1].Name(); got != want {
		t.Errorf("ran on %q, want %q", got, want)
	}
	if got := metric(t, urls[0], "kvmesh_forward_attempts_total", `result="accepted"`); got != 1 {
		t.Errorf("accepted forwards %v, want 1", got)
	}
}

// errorLog records a logger's error records as "message peer=NAME".
type errorLog struct {
	mu    sync.Mutex
	lines []string
}

func (h *errorLog) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelError }
func (h *errorLog) WithAttrs([]slog.Attr) slog.Handler           { return h }
func (h *errorLog) WithGroup(string) slog.Handler                { return h }

func (h *errorLog) Handle(_ context.Context, r slog.Record) error {
	line := r.Message
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "peer" {
			line += " peer=" + a.Value.String()
		}
		return true
	})
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lines = append(h.lines, line)
	return nil
}

func (h *errorLog) get() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.lines...)
}

// TestPeerWithAWrongCAIsEjected: n3's certificate comes from another CA, so every forward to
// it fails its TLS handshake while gossip works. n3 holds the prompt's prefix, so the ingress
// n1 tries it first; that failure ejects it (logged once as an error, counted as tls), the
// same dispatch runs the request on n2, and the requests after it go to n2 without trying n3.
func TestPeerWithAWrongCAIsEjected(t *testing.T) {
	foreign := t.TempDir()
	if err := transport.NewDevCA(foreign, testnet.Name(2)); err != nil {
		t.Fatal(err)
	}
	logs := &errorLog{}
	tn := startNet(t, 3, func(i int, cfg *node.Config) {
		switch i {
		case 0: // the ingress runs nothing (a role routing excludes): every request is
			// forwarded; it serves the model, so it is in the model's prefix domain.
			cfg.Role, cfg.Route.Roles = "ingress", []string{""}
			cfg.Logger = slog.New(logs)
			// One failure ejects, for longer than the test, so nothing here depends on timing.
			cfg.Route.Eject = route.EjectConfig{Failures: 1, Backoff: time.Hour, MaxBackoff: time.Hour}
		case 2:
			tlsCfg, err := transport.LoadTLS(foreign, testnet.Name(2))
			if err != nil {
				t.Fatal(err)
			}
			cfg.TLS = tlsCfg
		}
	})
	urls := tn.URLs()
	bad, good := tn.Nodes[2].Name(), tn.Nodes[1].Name()
	body := chatBody(longPrompt("eject", 3000), 4, false)
	if got := warm(t, urls[2], body); got != bad {
		t.Fatalf("warm-up ran on %s, want %s", got, bad)
	}
	poll.Until(t, 5*time.Second, "the prefix on n3 to reach n1", func() bool { return knowsPrefix(t, urls[0], bad, 100) })

	resp := post(t, urls[0], "/v1/chat/completions", body, map[string]string{node.HeaderExplain: "1"})
	if b := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	if got := resp.Header.Get(node.HeaderNode); got != good {
		t.Errorf("ran on %q, want %q", got, good)
	}
	if ex := resp.Header.Get(node.HeaderExplain); !strings.HasPrefix(ex, bad+" ") {
		t.Fatalf("explain %q: the prefix holder %s was not the first choice", ex, bad)
	}
	for range 5 {
		resp := post(t, urls[0], "/v1/chat/completions", body, nil)
		if b := readAll(t, resp); resp.StatusCode != http.StatusOK || resp.Header.Get(node.HeaderNode) != good {
			t.Fatalf("status %d on %q: %s", resp.StatusCode, resp.Header.Get(node.HeaderNode), b)
		}
	}
	if got := metric(t, urls[0], "kvmesh_forward_attempts_total", `result="unreachable"`); got != 1 {
		t.Errorf("forwards to the ejected peer: %v, want the one that ejected it", got)
	}
	if got := metric(t, urls[0], "kvmesh_forward_peer_ejections_total", `reason="tls"`); got != 1 {
		t.Errorf("tls ejections %v, want 1", got)
	}
	if got := metric(t, urls[0], "kvmesh_route_filtered_total", `reason="ejected"`); got < 5 {
		t.Errorf("ejected peers filtered %v times, want at least once per later request", got)
	}
	var ejections []string
	for _, l := range logs.get() {
		if strings.Contains(l, "ejected") {
			ejections = append(ejections, l)
		}
	}
	if len(ejections) != 1 || !strings.HasSuffix(ejections[0], "peer="+bad) {
		t.Errorf("error log lines of ejections %q, want one naming %s", ejections, bad)
	}
}

// apiCerts makes a CA and two server certificates for 127.0.0.1 under it, returning the CA
// pool and the two pairs' directories.
func apiCerts(t *testing.T) (*x509.CertPool, [2]string) {
	t.Helper()
	ca := filepath.Join(t.TempDir(), "ca")
	if err := transport.InitCA(ca); err != nil {
		t.Fatal(err)
	}
	var dirs [2]string
	for i, name := range []string{"api-1", "api-2"} {
		dirs[i] = filepath.Join(t.TempDir(), name)
		if err := transport.IssueNode(ca, dirs[i], name, nil); err != nil {
			t.Fatal(err)
		}
	}
	pem, err := os.ReadFile(filepath.Join(ca, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	return pool, dirs
}

// replace writes data to path through a rename, as deployment tools do.
func replace(t *testing.T, path string, data []byte) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	replace(t, to, data)
}

// TestAPIServesHTTPSAndReloadsItsCertificate: with TLSCert and TLSKey the API is HTTPS; a new
// pair put in place is served from the next handshake on, and a replacement that does not
// load leaves the last good certificate served and is logged as an error.
func TestAPIServesHTTPSAndReloadsItsCertificate(t *testing.T) {
	pool, issued := apiCerts(t)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "api.crt"), filepath.Join(dir, "api.key")
	copyFile(t, filepath.Join(issued[0], "api-1.crt"), certFile)
	copyFile(t, filepath.Join(issued[0], "api-1.key"), keyFile)
	logs := &errorLog{}
	n, _, err := startStandalone(t, func(cfg *node.Config) {
		cfg.TLSCert, cfg.TLSKey, cfg.Logger = certFile, keyFile, slog.New(logs)
	})
	if err != nil {
		t.Fatal(err)
	}
	// No keep-alive: every request is a new handshake.
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true}}
	t.Cleanup(client.CloseIdleConnections)
	served := func() *big.Int {
		t.Helper()
		resp, err := client.Get("https://" + n.HTTPAddr() + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.TLS == nil {
			t.Fatalf("status %d, tls %v", resp.StatusCode, resp.TLS != nil)
		}
		return resp.TLS.PeerCertificates[0].SerialNumber
	}
	serial := func(dir, name string) *big.Int {
		t.Helper()
		pair, err := tls.LoadX509KeyPair(filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key"))
		if err != nil {
			t.Fatal(err)
		}
		c, err := x509.ParseCertificate(pair.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return c.SerialNumber
	}
	first, second := serial(issued[0], "api-1"), serial(issued[1], "api-2")
	if got := served(); got.Cmp(first) != 0 {
		t.Fatalf("served serial %v, want the first certificate's %v", got, first)
	}
	if resp, err := http.Get("http://" + n.HTTPAddr() + "/healthz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Error("plain HTTP was served on the HTTPS listener")
		}
	}

	copyFile(t, filepath.Join(issued[1], "api-2.crt"), certFile)
	copyFile(t, filepath.Join(issued[1], "api-2.key"), keyFile)
	if got := served(); got.Cmp(second) != 0 {
		t.Fatalf("after the replacement, served serial %v, want the new certificate's %v", got, second)
	}
	if len(logs.get()) != 0 {
		t.Errorf("errors logged for a good replacement: %q", logs.get())
	}

	replace(t, certFile, []byte("-----BEGIN CERTIFICATE-----\nbroken\n-----END CERTIFICATE-----\n"))
	if got := served(); got.Cmp(second) != 0 {
		t.Fatalf("after a broken replacement, served serial %v, want the last good %v", got, second)
	}
	if got := served(); got.Cmp(second) != 0 {
		t.Fatalf("second handshake after a broken replacement: serial %v, want %v", got, second)
	}
	if l := logs.get(); len(l) != 1 || !strings.Contains(l[0], "does not load") {
		t.Errorf("error log %q, want one line about the broken certificate", l)
	}
}

// TestAPITLSNeedsBothFiles: a certificate without its key is a configuration error, and a
// pair that does not load stops Start.
func TestAPITLSNeedsBothFiles(t *testing.T) {
	cfg := node.DefaultConfig()
	cfg.Name, cfg.Standalone, cfg.TLSCert = "x", true, "api.crt"
	if _, err := node.New(cfg); err == nil {
		t.Error("New accepted a certificate without a key")
	}
	_, _, err := startStandalone(t, func(cfg *node.Config) {
		cfg.TLSCert, cfg.TLSKey = filepath.Join(t.TempDir(), "missing.crt"), filepath.Join(t.TempDir(), "missing.key")
	})
	if err == nil {
		t.Error("Start served HTTPS without a certificate")
	}
}

// TestForwardUnderAnotherNodesCertificateIsRefused: n3 runs with n1's certificate (copied, and
// set past the start-up check), so its forwards name ingress n3 but come with n1's
// certificate; the owner refuses them 403 ingress_mismatch, while n1's own forwards run.
func TestForwardUnderAnotherNodesCertificateIsRefused(t *testing.T) {
	var n1TLS *tls.Config
	tn := startNet(t, 3, func(i int, cfg *node.Config) {
		switch i {
		case 0:
			n1TLS = cfg.TLS
		case 2:
			cfg.TLS = n1TLS
			cfg.Models = []string{"another-model"} // an ingress only: it forwards every request
		}
	})
	body := chatBody("hello", 4, false)
	owner := tn.Nodes[1].Name()
	if status, answer, code, err := tn.Nodes[0].ForwardWhole(t.Context(), owner, body); err != nil || status != http.StatusOK {
		t.Fatalf("n1's own forward: %d %q %v: %s", status, code, err, answer)
	}
	status, _, code, err := tn.Nodes[2].ForwardWhole(t.Context(), owner, body)
	if err != nil || status != http.StatusForbidden || code != node.CodeIngressMismatch {
		t.Errorf("n3's forward with n1's certificate: %d %q %v, want 403 %s", status, code, err, node.CodeIngressMismatch)
	}
	// A client of n3, which serves another model: every owner refuses n3's forwards for the
	// name, a failure (not a refusal to wait out in the room): the client gets a 502 at once.
	resp := post(t, tn.URLs()[2], "/v1/chat/completions", body, map[string]string{node.HeaderQueueTTL: "20s"})
	if b := readAll(t, resp); resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(b), node.CodeIngressMismatch) {
		t.Errorf("a client of the node with another's certificate: %d %s; want 502 naming %s", resp.StatusCode, b, node.CodeIngressMismatch)
	}
}
