package transport

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(path, path[:len(path)-len(".crt")]+".key")
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestInitCA(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ca")
	if err := InitCA(dir); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(dir, "ca.key"))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("ca.key mode %v, %v; want 0600", st.Mode().Perm(), err)
	}
	ca := readCert(t, filepath.Join(dir, "ca.crt"))
	if !ca.IsCA || ca.PublicKeyAlgorithm != x509.ECDSA {
		t.Errorf("ca: IsCA=%v alg=%v", ca.IsCA, ca.PublicKeyAlgorithm)
	}
	before, _ := os.ReadFile(filepath.Join(dir, "ca.key"))
	if err := InitCA(dir); !errors.Is(err, ErrExists) {
		t.Errorf("second InitCA = %v, want ErrExists", err)
	}
	after, _ := os.ReadFile(filepath.Join(dir, "ca.key"))
	if string(before) != string(after) {
		t.Error("InitCA overwrote the CA key")
	}
}

func TestIssueNode(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ca")
	if err := InitCA(dir); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		hosts   []string
		wantDNS []string
		wantIPs []string
	}{
		{"node-1", nil, []string{PeerServerName, "node-1", "localhost"}, []string{"127.0.0.1", "::1"}},
		{"gpu7.dc1", []string{"10.0.0.7", "gpu7.example.com"}, []string{PeerServerName, "gpu7.dc1", "gpu7.example.com"}, []string{"10.0.0.7"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "tls-"+tt.name)
			if err := IssueNode(dir, out, tt.name, tt.hosts); err != nil {
				t.Fatal(err)
			}
			c := readCert(t, filepath.Join(out, tt.name+".crt"))
			if !slices.Equal(c.DNSNames, tt.wantDNS) {
				t.Errorf("DNS SANs %v, want %v", c.DNSNames, tt.wantDNS)
			}
			var ips []string
			for _, ip := range c.IPAddresses {
				ips = append(ips, ip.String())
			}
			if !slices.Equal(ips, tt.wantIPs) {
				t.Errorf("IP SANs %v, want %v", ips, tt.wantIPs)
			}
			if !slices.Contains(c.ExtKeyUsage, x509.ExtKeyUsageServerAuth) || !slices.Contains(c.ExtKeyUsage, x509.ExtKeyUsageClientAuth) {
				t.Errorf("ext key usage %v, want server and client auth", c.ExtKeyUsage)
			}
			if c.Subject.CommonName != tt.name {
				t.Errorf("CN %q", c.Subject.CommonName)
			}
			if st, err := os.Stat(filepath.Join(out, tt.name+".key")); err != nil || st.Mode().Perm() != 0o600 {
				t.Errorf("key mode: %v %v", st.Mode().Perm(), err)
			}
			if err := IssueNode(dir, out, tt.name, nil); !errors.Is(err, ErrExists) {
				t.Errorf("reissue = %v, want ErrExists", err)
			}
		})
	}
	for _, bad := range []string{"", "ca", "../x", "a/b", "-x", string(make([]byte, 80))} {
		if err := IssueNode(dir, t.TempDir(), bad, nil); err == nil {
			t.Errorf("IssueNode(%q) accepted", bad)
		}
	}
	if err := IssueNode(t.TempDir(), t.TempDir(), "n", nil); err == nil {
		t.Error("IssueNode without a CA succeeded")
	}
}

// TestIssueNodeWritesOnlyWhatTheNodeNeeds: the node's directory holds its own pair and the CA
// certificate, which LoadTLS accepts, and never the CA key: issuing into the CA's own
// directory, or any directory holding a ca.key, is refused.
func TestIssueNodeWritesOnlyWhatTheNodeNeeds(t *testing.T) {
	ca := filepath.Join(t.TempDir(), "ca")
	if err := InitCA(ca); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "tls-gpu-01")
	if err := IssueNode(ca, out, "gpu-01", nil); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(out)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	if want := []string{"ca.crt", "gpu-01.crt", "gpu-01.key"}; !slices.Equal(got, want) {
		t.Errorf("node dir holds %v, want %v", got, want)
	}
	if st, err := os.Stat(out); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("node dir mode %v, %v; want 0700", st.Mode().Perm(), err)
	}
	if _, err := LoadTLS(out, "gpu-01"); err != nil {
		t.Errorf("LoadTLS of the issued dir: %v", err)
	}
	// Another node's pair from the same CA may go beside it.
	if err := IssueNode(ca, out, "gpu-02", nil); err != nil {
		t.Errorf("second node into the same dir: %v", err)
	}
	if err := IssueNode(ca, ca, "gpu-03", nil); !errors.Is(err, ErrCAKeyBeside) {
		t.Errorf("IssueNode into the CA dir = %v, want ErrCAKeyBeside", err)
	}
	if _, err := os.Stat(filepath.Join(ca, "gpu-03.key")); err == nil {
		t.Error("a node key was written beside ca.key")
	}
	// A dir holding another CA's certificate is not mixed into.
	other := filepath.Join(t.TempDir(), "other")
	if err := InitCA(other); err != nil {
		t.Fatal(err)
	}
	if err := IssueNode(other, out, "gpu-04", nil); !errors.Is(err, ErrExists) {
		t.Errorf("IssueNode over another CA's ca.crt = %v, want ErrExists", err)
	}
}

func TestLoadTLS(t *testing.T) {
	dir := pki(t, "a")
	c, err := LoadTLS(dir, "a")
	if err != nil {
		t.Fatal(err)
	}
	if c.MinVersion != tls.VersionTLS13 || c.ClientAuth != tls.RequireAndVerifyClientCert ||
		!slices.Equal(c.NextProtos, []string{ALPN}) || c.ServerName != PeerServerName || c.RootCAs == nil || c.ClientCAs == nil {
		t.Errorf("config %+v", c)
	}
	if _, err := LoadTLS(dir, "missing"); err == nil {
		t.Error("LoadTLS of a missing node succeeded")
	}
	// A node pair copied in from another cluster is refused at load time.
	other := pki(t, "b")
	for _, ext := range []string{".crt", ".key"} {
		data, err := os.ReadFile(filepath.Join(other, "b"+ext))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "b"+ext), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := LoadTLS(dir, "b"); err == nil {
		t.Error("LoadTLS accepted a certificate from another CA")
	}
}

// copyPair copies node from's pair in dir to the file names of node to, as someone who got
// hold of from's files would to run a node named to.
func copyPair(t *testing.T, dir, from, to string) {
	t.Helper()
	for _, ext := range []string{".crt", ".key"} {
		data, err := os.ReadFile(filepath.Join(dir, from+ext))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, to+ext), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLoadTLSRefusesAnotherNodesCertificate pins that a node's certificate must be its own: a
// pair copied to another node's file names does not load under that name, while a certificate
// issued for any node (IssueAnyNode) loads under every name.
func TestLoadTLSRefusesAnotherNodesCertificate(t *testing.T) {
	dir := pki(t, "n1")
	copyPair(t, dir, "n1", "imp")
	if _, err := LoadTLS(dir, "imp"); !errors.Is(err, ErrNotNamed) {
		t.Errorf("LoadTLS of n1's certificate as imp = %v, want ErrNotNamed", err)
	}
	out := filepath.Join(t.TempDir(), "shared")
	if err := IssueAnyNode(dir, out, "kvmesh", nil); err != nil {
		t.Fatal(err)
	}
	if name, anyNode := CertName(readCert(t, filepath.Join(out, "kvmesh.crt"))); name != "kvmesh" || !anyNode {
		t.Errorf("CertName = %q, %v; want kvmesh, any node", name, anyNode)
	}
	copyPair(t, out, "kvmesh", "pod-7f9c")
	if _, err := LoadTLS(out, "pod-7f9c"); err != nil {
		t.Errorf("LoadTLS of a certificate for any node: %v", err)
	}
	if name, anyNode := CertName(readCert(t, filepath.Join(dir, "n1.crt"))); name != "n1" || anyNode {
		t.Errorf("CertName = %q, %v; want n1 alone", name, anyNode)
	}
}

// TestCABundleLetsTheCARoll pins what replacing a CA without stopping the mesh rests on: a node
// trusts every CA in its ca.crt, so with both CAs there, a node of the old CA and one of the
// new forward to each other.
func TestCABundleLetsTheCARoll(t *testing.T) {
	oldCA, newCA := pki(t, "a"), pki(t, "b")
	var bundle []byte
	for _, dir := range []string{oldCA, newCA} {
		data, err := os.ReadFile(filepath.Join(dir, caCertFile))
		if err != nil {
			t.Fatal(err)
		}
		bundle = append(bundle, data...)
	}
	for _, dir := range []string{oldCA, newCA} {
		if err := os.WriteFile(filepath.Join(dir, caCertFile), bundle, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	server := startNode(t, loadTLS(t, newCA, "b"), "127.0.0.1:0", HandlerFunc(func(_ context.Context, _ Header, _ []byte, w ResponseWriter) {
		_ = w.Accept(200, nil)
	}))
	client := startNode(t, loadTLS(t, oldCA, "a"), "127.0.0.1:0", nil)
	resp, err := client.tr.Forward(testCtx(t), server.addr(), Header{RequestID: "r", Ingress: "a"}, nil)
	if err != nil {
		t.Fatalf("forward across the two CAs: %v", err)
	}
	_ = resp.Body.Close()
}
