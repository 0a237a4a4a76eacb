package transport

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"time"
)

// ALPN is the application protocol every kvmesh peer connection negotiates.
const ALPN = "kvmesh/1"

// PeerServerName is a DNS name every node certificate carries. Clients verify the owner's
// certificate chain against the cluster CA under this name, so a peer is trusted for being in
// the cluster, not for which address it happens to answer on (addresses come from gossip).
const PeerServerName = "peer.kvmesh.internal"

// AnyNodeURI, a URI SAN, marks a certificate issued for any node (IssueAnyNode): a node with
// any --name may present it, for deployments that give every node the same pair (the pods of
// a Deployment, whose names are not known in advance). It proves membership of the cluster,
// not which member.
const AnyNodeURI = "urn:kvmesh:any-node"

// ErrNotNamed is returned by LoadTLS for a certificate issued for another node.
var ErrNotNamed = errors.New("transport: the certificate was issued for another node")

// Validity of generated certificates.
const (
	CAValidity   = 10 * 365 * 24 * time.Hour
	NodeValidity = 2 * 365 * 24 * time.Hour
)

// ErrExists is returned instead of overwriting a key or certificate.
var ErrExists = errors.New("transport: file exists")

// DefaultHosts are the SANs a node certificate gets when no hosts are given.
var DefaultHosts = []string{"127.0.0.1", "::1", "localhost"}

var nodeNameRE = regexp.MustCompile(`^[a-zA-Z0-9]([a-zA-Z0-9._-]{0,62})$`)

// InitCA creates dir (0700) and a self-signed ECDSA P-256 cluster CA in it: ca.crt and ca.key
// (0600). It refuses to overwrite an existing CA.
func InitCA(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("transport: ca dir: %w", err)
	}
	certPath, keyPath := filepath.Join(dir, caCertFile), filepath.Join(dir, caKeyFile)
	for _, p := range []string{certPath, keyPath} {
		if _, err := os.Stat(p); err == nil {
			return fmt.Errorf("%w: %s", ErrExists, p)
		}
	}
	der, key, err := newCA("kvmesh cluster CA")
	if err != nil {
		return err
	}
	return writePair(certPath, keyPath, der, key)
}

// The CA's files in its directory.
const (
	caCertFile = "ca.crt"
	caKeyFile  = "ca.key"
)

func newCA(commonName string) ([]byte, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("transport: ca key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: commonName, Organization: []string{"kvmesh"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(CAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("transport: ca cert: %w", err)
	}
	return der, key, nil
}

// ErrCAKeyBeside is returned by IssueNode for an output directory that holds a CA key: what
// goes to a node must not let it mint other members.
var ErrCAKeyBeside = errors.New("transport: the output directory holds ca.key; a node's directory must not")

// IssueNode issues a certificate for node name, signed by the CA in caDir, and writes what the
// node needs, and nothing more, to outDir (created 0700): NAME.crt, NAME.key (0600) and a copy
// of ca.crt. outDir is the node's --tls-dir; it must not be caDir, or any directory holding a
// ca.key (ErrCAKeyBeside). The certificate is valid for both server and client auth; its
// subject's common name is name (CertName), its SANs name (when it is a DNS name),
// PeerServerName and hosts (IPs or DNS names; DefaultHosts when empty). It refuses to
// overwrite a node certificate, or a ca.crt of another CA.
func IssueNode(caDir, outDir, name string, hosts []string) error {
	return issue(caDir, outDir, name, hosts, false)
}

// IssueAnyNode is IssueNode for a certificate that also carries AnyNodeURI: a node of any name
// loads it (as NAME.crt and NAME.key under its own name) and its peers take its word for its
// name.
func IssueAnyNode(caDir, outDir, name string, hosts []string) error {
	return issue(caDir, outDir, name, hosts, true)
}

func issue(caDir, outDir, name string, hosts []string, anyNode bool) error {
	if err := checkName(name); err != nil {
		return err
	}
	caCert, caKey, err := loadCA(caDir)
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(outDir, caKeyFile)); err == nil {
		return fmt.Errorf("%w (%s)", ErrCAKeyBeside, outDir)
	}
	certPath, keyPath := filepath.Join(outDir, name+".crt"), filepath.Join(outDir, name+".key")
	for _, p := range []string{certPath, keyPath} {
		if _, err := os.Stat(p); err == nil {
			return fmt.Errorf("%w: %s", ErrExists, p)
		}
	}
	der, key, err := nodeCert(caCert, caKey, name, hosts, anyNode)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(outDir, 0o700); err != nil {
		return fmt.Errorf("transport: node dir: %w", err)
	}
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caCert.Raw})
	caCopy := filepath.Join(outDir, caCertFile)
	if old, err := os.ReadFile(caCopy); err == nil {
		if !bytes.Equal(old, caPEM) {
			return fmt.Errorf("%w: %s is another CA's", ErrExists, caCopy)
		}
	} else if err := writeExcl(caCopy, caPEM, 0o644); err != nil {
		return err
	}
	return writePair(certPath, keyPath, der, key)
}

func checkName(name string) error {
	if !nodeNameRE.MatchString(name) || name == "ca" {
		return fmt.Errorf("transport: invalid node name %q", name)
	}
	return nil
}

// nodeCert makes a node key and its certificate signed by the CA.
func nodeCert(caCert *x509.Certificate, caKey *ecdsa.PrivateKey, name string, hosts []string, anyNode bool) ([]byte, *ecdsa.PrivateKey, error) {
	if len(hosts) == 0 {
		hosts = DefaultHosts
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: name, Organization: []string{"kvmesh"}},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(NodeValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:     []string{PeerServerName},
	}
	if net.ParseIP(name) == nil && name != PeerServerName {
		tmpl.DNSNames = append(tmpl.DNSNames, name)
	}
	if anyNode {
		u, _ := url.Parse(AnyNodeURI)
		tmpl.URIs = []*url.URL{u}
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("transport: node key: %w", err)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("transport: node cert: %w", err)
	}
	return der, key, nil
}

// NewDevCA makes a throwaway CA in dir and one certificate per name with DefaultHosts, all in
// dir beside the CA key, for the testnet and tests.
func NewDevCA(dir string, names ...string) error {
	if err := InitCA(dir); err != nil {
		return err
	}
	caCert, caKey, err := loadCA(dir)
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := checkName(n); err != nil {
			return err
		}
		der, key, err := nodeCert(caCert, caKey, n, nil, false)
		if err != nil {
			return err
		}
		if err := writePair(filepath.Join(dir, n+".crt"), filepath.Join(dir, n+".key"), der, key); err != nil {
			return err
		}
	}
	return nil
}

// LoadTLS loads the cluster CA and node name's key pair from dir and returns one config for
// both ends of a peer connection: TLS 1.3 only, ALPN kvmesh/1, client certificates required and
// verified against the CA, the server verified against the CA under PeerServerName. The
// certificate must be name's (CertName) or any node's, else ErrNotNamed: peers know a node by
// the name in its certificate, so a pair copied from another node must not start under a new
// name.
func LoadTLS(dir, name string) (*tls.Config, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, caCertFile))
	if err != nil {
		return nil, fmt.Errorf("transport: read ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("transport: no certificate in %s", filepath.Join(dir, caCertFile))
	}
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key"))
	if err != nil {
		return nil, fmt.Errorf("transport: load node %q: %w", name, err)
	}
	return peerTLS(pool, pair, name)
}

// peerTLS is LoadTLS's config for pair under the CAs in pool. It refuses a pair the cluster
// itself would reject, at startup rather than at first dial.
func peerTLS(pool *x509.CertPool, pair tls.Certificate, name string) (*tls.Config, error) {
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("transport: parse node %q: %w", name, err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{
		Roots:     pool,
		DNSName:   PeerServerName,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}); err != nil {
		return nil, fmt.Errorf("transport: node %q not valid under the cluster ca: %w", name, err)
	}
	if issued, anyNode := CertName(leaf); issued != name && !anyNode {
		return nil, fmt.Errorf("%w: node %q has the certificate of node %q; run it as --name %s, or issue it its own (kvmesh ca issue --node %s)",
			ErrNotNamed, name, issued, issued, name)
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		MaxVersion:   tls.VersionTLS13,
		NextProtos:   []string{ALPN},
		Certificates: []tls.Certificate{pair},
		RootCAs:      pool,
		ClientCAs:    pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ServerName:   PeerServerName,
	}, nil
}

// CertName is the node a certificate was issued for, its subject's common name as IssueNode
// writes it (a SAN may be any host name), and whether it is issued for any node (AnyNodeURI).
func CertName(c *x509.Certificate) (name string, anyNode bool) {
	for _, u := range c.URIs {
		if u.String() == AnyNodeURI {
			anyNode = true
		}
	}
	return c.Subject.CommonName, anyNode
}

func loadCA(dir string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, caCertFile), filepath.Join(dir, caKeyFile))
	if err != nil {
		return nil, nil, fmt.Errorf("transport: load ca: %w", err)
	}
	return caOf(pair, dir)
}

// caOf checks that pair, read from where, is an ECDSA CA.
func caOf(pair tls.Certificate, where string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, nil, fmt.Errorf("transport: parse ca: %w", err)
	}
	key, ok := pair.PrivateKey.(*ecdsa.PrivateKey)
	if !ok || !cert.IsCA {
		return nil, nil, fmt.Errorf("transport: %s is not an ecdsa ca", where)
	}
	return cert, key, nil
}

func writePair(certPath, keyPath string, der []byte, key *ecdsa.PrivateKey) error {
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("transport: marshal key: %w", err)
	}
	// The key goes first and exclusively, so a race with another issuer fails rather than mixes.
	if err := writeExcl(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return err
	}
	if err := writeExcl(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		_ = os.Remove(keyPath)
		return err
	}
	return nil
}

func writeExcl(path string, data []byte, perm os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("%w: %s", ErrExists, path)
		}
		return fmt.Errorf("transport: create %s: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return fmt.Errorf("transport: write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("transport: write %s: %w", path, err)
	}
	return nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return n
}
