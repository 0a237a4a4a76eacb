package main

import (
	"encoding/pem"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestHealthURLAsksWildcardListenersOnLoopback pins the address `kvmesh health` derives from
// the node's --http: a wildcard or empty host is asked on loopback, a named one as given.
func TestHealthURLAsksWildcardListenersOnLoopback(t *testing.T) {
	for _, tc := range []struct{ listen, want string }{
		{":8080", "http://127.0.0.1:8080/healthz"},
		{"0.0.0.0:9000", "http://127.0.0.1:9000/healthz"},
		{"[::]:8080", "http://[::1]:8080/healthz"},
		{"10.0.0.5:8080", "http://10.0.0.5:8080/healthz"},
		{"localhost:18080", "http://localhost:18080/healthz"},
	} {
		t.Run(tc.listen, func(t *testing.T) {
			got, err := healthURL(tc.listen, "/healthz")
			if err != nil || got != tc.want {
				t.Errorf("healthURL(%q) = %q, %v; want %q", tc.listen, got, err, tc.want)
			}
		})
	}
	if _, err := healthURL("8080", "/healthz"); err == nil {
		t.Error("healthURL(\"8080\"): no error for an address without a port separator")
	}
}

// TestHealthExitsNonZeroUnless200 pins the command's answer: nil for a 200 from the path it
// was told to ask, an error naming the status for anything else or for no listener.
func TestHealthExitsNonZeroUnless200(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/healthz":
			w.WriteHeader(http.StatusOK)
		default:
			http.Error(w, `{"status":"draining"}`, http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(srv.Close)
	listen := strings.TrimPrefix(srv.URL, "http://")

	run := func(args ...string) error {
		t.Helper()
		return newApp().Run(append([]string{"kvmesh", "health"}, args...))
	}
	if err := run("--http", listen); err != nil {
		t.Errorf("/healthz 200: %v", err)
	}
	if err := run("--http", listen, "--ready"); err == nil || !strings.Contains(err.Error(), "503") {
		t.Errorf("/readyz 503: err %v, want one naming 503", err)
	}
	if err := run("--url", srv.URL+"/other"); err == nil {
		t.Error("--url to a 503: no error")
	}
	srv.Close()
	if err := run("--http", listen, "--timeout", "1s"); err == nil {
		t.Error("no listener: no error")
	}
}

// TestHealthTrustsTheCAOfAnHTTPSNode: a node serving its API over HTTPS under a private CA
// fails the check unless --ca-cert (or KVMESH_HEALTH_CA_CERT) names that CA.
func TestHealthTrustsTheCAOfAnHTTPSNode(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshake is expected
	srv.StartTLS()
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	notPEM := filepath.Join(dir, "empty.crt")
	if err := os.WriteFile(notPEM, []byte("no certificate here\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) error {
		t.Helper()
		return newApp().Run(append([]string{"kvmesh", "health", "--url", srv.URL + "/healthz"}, args...))
	}
	if err := run(); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("no --ca-cert: err %v; want a certificate error", err)
	}
	if err := run("--ca-cert", ca); err != nil {
		t.Errorf("--ca-cert naming the node's CA: %v", err)
	}
	if err := run("--ca-cert", notPEM); err == nil || !strings.Contains(err.Error(), "no certificate") {
		t.Errorf("--ca-cert of a file with no certificate: err %v", err)
	}
	t.Setenv("KVMESH_HEALTH_CA_CERT", ca)
	if err := run(); err != nil {
		t.Errorf("KVMESH_HEALTH_CA_CERT naming the node's CA: %v", err)
	}
}
