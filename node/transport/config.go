package transport

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Config configures a Transport.
type Config struct {
	// TLS is the node's config from LoadTLS (cloned; TLS 1.3 and ALPN are enforced).
	TLS *tls.Config
	// ListenAddr is the UDP address to serve on and dial from, e.g. "127.0.0.1:0".
	ListenAddr string
	// Handler serves inbound forwards; nil refuses every inbound stream.
	Handler Handler
	// KeepAlive is how long a connection may hear nothing before it pings the peer (quic-go
	// pings after this much silence, or half the IdleTimeout if that is shorter), so that a
	// live peer, even one with no stream open, is never silent for long. It must be below
	// IdleTimeout. Default 1s.
	KeepAlive time.Duration
	// IdleTimeout closes a connection that heard nothing for this long, failing its streams:
	// it is how a peer that died without closing anything (power loss, a partition) is
	// detected while a forward to it waits for its answer or reads its response. The two ends
	// use the shorter of their two values. A forward caught on such a connection ends at most
	// KeepAlive + IdleTimeout after the peer's last packet: the silence starts counting from
	// this side's last packet to the peer, its ping at the latest. One still waiting for its
	// answer then redials once (a dead connection is not yet a dead peer), which adds up to
	// HandshakeTimeout. Default 3s.
	IdleTimeout time.Duration
	// HandshakeTimeout bounds a dial including its TLS handshake (and an inbound handshake's
	// idle time). Default 500ms, sized for a LAN: a dial to a peer that died silently fails after
	// it, where quic-go's own default is 5s.
	HandshakeTimeout time.Duration
	// RequestTimeout bounds how long an inbound stream may take to deliver header and body.
	RequestTimeout time.Duration
	// MaxBodyBytes bounds a forwarded body, on both sides.
	MaxBodyBytes int
	// MaxStreams bounds concurrent inbound streams per connection.
	MaxStreams int
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// DefaultConfig returns the production defaults; TLS and Handler are left to the caller.
//
// KeepAlive and IdleTimeout bound how long a forward waits on a peer that vanished: at most
// 4 s (4.5 s with the one redial of a forward still waiting for its answer), against gossip's 3 s to call a silent peer stale (gossip.Config.StaleAfter) and the
// seconds memberlist's suspicion takes to declare it dead. The transport's own silence is the
// faster and the more direct evidence (gossip can be cut off while QUIC still flows), so
// in-flight forwards end by it, not by gossip. A live peer answers the pings within a
// round-trip and quic-go retransmits a lost one after its probe timeout, so only a peer that
// sent nothing for 3 s, on a LAN, is given up; quic-go also keeps the idle timeout at three
// probe timeouts or more, for slow paths.
func DefaultConfig() Config {
	return Config{
		ListenAddr:       ":7443",
		KeepAlive:        time.Second,
		IdleTimeout:      3 * time.Second,
		HandshakeTimeout: 500 * time.Millisecond,
		RequestTimeout:   10 * time.Second,
		MaxBodyBytes:     16 << 20,
		MaxStreams:       1024,
	}
}

// fill validates cfg and replaces its zero fields with DefaultConfig's values.
func (cfg *Config) fill() error {
	def := DefaultConfig()
	if cfg.TLS == nil {
		return errors.New("transport: config: TLS is required")
	}
	if len(cfg.TLS.Certificates) == 0 {
		return errors.New("transport: config: TLS has no certificate")
	}
	if cfg.TLS.RootCAs == nil || cfg.TLS.ClientCAs == nil {
		return errors.New("transport: config: TLS needs the cluster CA as RootCAs and ClientCAs")
	}
	if cfg.TLS.InsecureSkipVerify {
		return errors.New("transport: config: TLS must verify peers")
	}
	if cfg.ListenAddr == "" {
		cfg.ListenAddr = def.ListenAddr
	}
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{{&cfg.KeepAlive, def.KeepAlive}, {&cfg.IdleTimeout, def.IdleTimeout}, {&cfg.HandshakeTimeout, def.HandshakeTimeout}, {&cfg.RequestTimeout, def.RequestTimeout}} {
		if *d.v < 0 {
			return fmt.Errorf("transport: config: negative duration %v", *d.v)
		}
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	if cfg.KeepAlive >= cfg.IdleTimeout {
		return fmt.Errorf("transport: config: keep-alive %v must be below idle timeout %v", cfg.KeepAlive, cfg.IdleTimeout)
	}
	if cfg.MaxBodyBytes < 0 || cfg.MaxStreams < 0 {
		return errors.New("transport: config: negative limit")
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = def.MaxBodyBytes
	}
	if cfg.MaxStreams == 0 {
		cfg.MaxStreams = def.MaxStreams
	}
	return nil
}
