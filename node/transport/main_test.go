package transport

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// pki makes a throwaway CA with the given node certificates and returns its directory.
func pki(t testing.TB, names ...string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "pki")
	if err := NewDevCA(dir, names...); err != nil {
		t.Fatalf("NewDevCA: %v", err)
	}
	return dir
}

func loadTLS(t testing.TB, dir, name string) *tls.Config {
	t.Helper()
	c, err := LoadTLS(dir, name)
	if err != nil {
		t.Fatalf("LoadTLS(%s): %v", name, err)
	}
	return c
}

type node struct {
	tr  *Transport
	reg *prometheus.Registry
}

// testConfig shortens every timer so failure paths resolve in well under a second.
func testConfig(t testing.TB, tlsConf *tls.Config, addr string, h Handler) Config {
	t.Helper()
	cfg := DefaultConfig()
	cfg.TLS = tlsConf
	cfg.ListenAddr = addr
	cfg.Handler = h
	cfg.KeepAlive = 100 * time.Millisecond
	cfg.IdleTimeout = time.Second
	cfg.HandshakeTimeout = time.Second
	cfg.RequestTimeout = time.Second
	return cfg
}

func startNode(t testing.TB, tlsConf *tls.Config, addr string, h Handler) *node {
	t.Helper()
	return startNodeConfig(t, testConfig(t, tlsConf, addr, h))
}

// startNodeConfig starts a transport of cfg, with its own registry and the test's log.
func startNodeConfig(t testing.TB, cfg Config) *node {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	if tt, ok := t.(*testing.T); ok {
		cfg.Logger = testLogger(tt)
	}
	tr, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if err := tr.Start(context.Background()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { _ = tr.Close() })
	return &node{tr: tr, reg: reg}
}

func (n *node) addr() string { return n.tr.Addr().String() }

func (n *node) rejected(reason string) float64 {
	return testutil.ToFloat64(n.tr.m.rejected.WithLabelValues(reason))
}

func (n *node) conns(dir string) float64 {
	return testutil.ToFloat64(n.tr.m.conns.WithLabelValues(dir))
}

func testCtx(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// readAll reads r to its end, failing the test if that takes more than a few seconds.
func readAll(t testing.TB, r io.Reader) ([]byte, error) {
	t.Helper()
	type res struct {
		b   []byte
		err error
	}
	ch := make(chan res, 1)
	go func() {
		var buf bytes.Buffer
		_, err := io.Copy(&buf, r)
		ch <- res{buf.Bytes(), err}
	}()
	select {
	case r := <-ch:
		return r.b, r.err
	case <-time.After(5 * time.Second):
		t.Fatalf("reading the body hung")
		return nil, nil
	}
}

// deadAddr is a loopback UDP address nobody listens on.
func deadAddr(t testing.TB) string {
	t.Helper()
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := c.LocalAddr().String()
	_ = c.Close()
	return addr
}

// recorder is a handler that remembers what it was called with.
type recorder struct {
	mu    sync.Mutex
	calls int
	serve func(ctx context.Context, h Header, body []byte, w ResponseWriter)
}

func (r *recorder) ServeForward(ctx context.Context, h Header, body []byte, w ResponseWriter) {
	r.mu.Lock()
	r.calls++
	r.mu.Unlock()
	if r.serve != nil {
		r.serve(ctx, h, body, w)
	}
}

func (r *recorder) n() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls
}

func isUnreachable(err error) bool { return errors.Is(err, ErrUnreachable) }
