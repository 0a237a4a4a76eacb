package apicert

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"sync"
)

// Reloader serves the client API's certificate and picks up a new one at the first TLS
// handshake after either file changes: each handshake stats the two files, and only a change
// (another file, size or modification time) reads and parses them again. A new pair that does
// not load (half written, a key that does not match) leaves the last good certificate in use
// and is logged once, as an error. It is safe for concurrent use.
type Reloader struct {
	certFile, keyFile string
	log               *slog.Logger

	mu   sync.Mutex
	cert *tls.Certificate
	seen [2]os.FileInfo // the files as last read, good or bad
}

// Load reads the pair once; a pair that does not load is an error. log, nil for none, gets
// the reloads and the changed pairs that do not load.
func Load(certFile, keyFile string, log *slog.Logger) (*Reloader, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Reloader{certFile: certFile, keyFile: keyFile, log: log}
	seen, err := r.stat()
	if err != nil {
		return nil, err
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("api tls: %w", err)
	}
	r.cert, r.seen = &cert, seen
	return r, nil
}

func (r *Reloader) stat() ([2]os.FileInfo, error) {
	var fi [2]os.FileInfo
	for i, f := range []string{r.certFile, r.keyFile} {
		st, err := os.Stat(f)
		if err != nil {
			return fi, fmt.Errorf("api tls: %w", err)
		}
		fi[i] = st
	}
	return fi, nil
}

// GetCertificate is the API listener's tls.Config.GetCertificate.
func (r *Reloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	fi, err := r.stat()
	if err != nil || unchanged(fi, r.seen) {
		return r.cert, nil // a file missing while it is replaced keeps the current certificate
	}
	r.seen = fi
	cert, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		r.log.Error("api tls: the changed certificate does not load; serving the previous one", "cert", r.certFile, "key", r.keyFile, "err", err)
		return r.cert, nil
	}
	r.cert = &cert
	r.log.Info("api tls: certificate reloaded", "cert", r.certFile)
	return r.cert, nil
}

func unchanged(a, b [2]os.FileInfo) bool {
	for i := range a {
		if !os.SameFile(a[i], b[i]) || !a[i].ModTime().Equal(b[i].ModTime()) || a[i].Size() != b[i].Size() {
			return false
		}
	}
	return true
}
