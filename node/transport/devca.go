package transport

import (
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// devCAFile holds the development CA's certificate and key, in one file so that it appears
// whole or not at all.
const devCAFile = "dev-ca.pem"

// DefaultDevCADir is where the development CA lives when no directory is given: kvmesh/dev-ca
// in the user's cache directory, shared by every node this user runs on the host.
func DefaultDevCADir() (string, error) {
	d, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("transport: no directory for the development CA: %w", err)
	}
	return filepath.Join(d, "kvmesh", "dev-ca"), nil
}

// DevTLS returns LoadTLS's peer config for node name under the development CA in dir, for
// nodes started with --insecure-dev. The first caller creates the CA (dir 0700, its file
// 0600); every later one, in this process or another, loads it, so that separate processes on
// one host trust each other. Creation is atomic: the CA is written to a temporary file and
// hard-linked into place, which fails if another process got there first, and the loser reads
// the winner's. Each caller issues its own certificate, in memory, with DefaultHosts.
//
// The CA's key sits unencrypted on the host: anyone who can read it can join the mesh. It is
// for development only. DevTLS refuses a CA file other users may read and a directory they
// may write.
func DevTLS(dir, name string) (*tls.Config, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	caCert, caKey, err := devCA(dir)
	if err != nil {
		return nil, err
	}
	der, key, err := nodeCert(caCert, caKey, name, nil, false)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	return peerTLS(pool, tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, name)
}

// devCA loads the development CA in dir, creating it first if there is none.
func devCA(dir string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("transport: dev ca dir: %w", err)
	}
	st, err := os.Stat(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("transport: dev ca dir: %w", err)
	}
	if st.Mode().Perm()&0o022 != 0 {
		return nil, nil, fmt.Errorf("transport: dev ca dir %s is writable by other users (mode %v): chmod 700 it", dir, st.Mode().Perm())
	}
	path := filepath.Join(dir, devCAFile)
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		if err := createDevCA(dir, path); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, nil, err
		}
	}
	return readDevCA(path)
}

// createDevCA writes a new CA to a temporary file in dir and links it to path; the error
// wraps fs.ErrExist when another process created path first.
func createDevCA(dir, path string) error {
	der, key, err := newCA("kvmesh development CA")
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("transport: marshal key: %w", err)
	}
	data := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	data = append(data, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})...)
	f, err := os.CreateTemp(dir, ".dev-ca-*") // mode 0600
	if err != nil {
		return fmt.Errorf("transport: dev ca: %w", err)
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return fmt.Errorf("transport: dev ca: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("transport: dev ca: %w", err)
	}
	if err := os.Link(f.Name(), path); err != nil {
		return fmt.Errorf("transport: dev ca: %w", err)
	}
	return nil
}

func readDevCA(path string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, nil, fmt.Errorf("transport: dev ca: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, nil, fmt.Errorf("transport: dev ca %s is readable by other users (mode %v): chmod 600 it, or remove it for a new one", path, st.Mode().Perm())
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("transport: dev ca: %w", err)
	}
	// The file holds both blocks; X509KeyPair takes the certificate from one and the key from
	// the other, and checks that they match.
	pair, err := tls.X509KeyPair(data, data)
	if err != nil {
		return nil, nil, fmt.Errorf("transport: dev ca %s: %w", path, err)
	}
	return caOf(pair, path)
}
