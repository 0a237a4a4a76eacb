package transport

import (
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// TestDevTLSSharesOneCAAcrossCallers: callers that share nothing but the directory, racing to
// create the CA, end up under one CA, so each trusts the others' certificates; the CA is one
// 0600 file in a 0700 directory, with no temporary file left behind.
func TestDevTLSSharesOneCAAcrossCallers(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "kvmesh", "dev-ca")
	const n = 8
	var wg sync.WaitGroup
	leaves := make([]*x509.Certificate, n)
	pools := make([]*x509.CertPool, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			c, err := DevTLS(dir, fmt.Sprintf("node-%d", i))
			if err != nil {
				errs[i] = err
				return
			}
			leaves[i], errs[i] = x509.ParseCertificate(c.Certificates[0].Certificate[0])
			pools[i] = c.RootCAs
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("DevTLS %d: %v", i, err)
		}
	}
	for i := range n {
		for j := range n {
			opts := x509.VerifyOptions{Roots: pools[j], DNSName: PeerServerName, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
			if _, err := leaves[i].Verify(opts); err != nil {
				t.Fatalf("node-%d's certificate is not trusted by node-%d: %v", i, j, err)
			}
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != devCAFile {
		t.Errorf("dev ca dir holds %v, want only %s", entries, devCAFile)
	}
	for path, want := range map[string]os.FileMode{dir: 0o700, filepath.Join(dir, devCAFile): 0o600} {
		if st, err := os.Stat(path); err != nil || st.Mode().Perm() != want {
			t.Errorf("%s: mode %v, %v; want %v", path, st.Mode().Perm(), err, want)
		}
	}
}

// TestDevTLSRefusesAnExposedCA: a CA file other users can read, or a directory they can
// write, is an error, not a CA to trust.
func TestDevTLSRefusesAnExposedCA(t *testing.T) {
	tests := []struct {
		name  string
		path  func(dir string) string
		perm  os.FileMode
		valid bool
	}{
		{"private", func(d string) string { return filepath.Join(d, devCAFile) }, 0o600, true},
		{"world readable file", func(d string) string { return filepath.Join(d, devCAFile) }, 0o644, false},
		{"group writable dir", func(d string) string { return d }, 0o770, false},
		{"world readable dir", func(d string) string { return d }, 0o755, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "dev-ca")
			if _, err := DevTLS(dir, "a"); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(tt.path(dir), tt.perm); err != nil {
				t.Fatal(err)
			}
			_, err := DevTLS(dir, "b")
			if tt.valid != (err == nil) {
				t.Errorf("DevTLS = %v, want valid %v", err, tt.valid)
			}
		})
	}
}
