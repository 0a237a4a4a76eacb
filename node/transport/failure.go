package transport

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"syscall"

	"github.com/quic-go/quic-go"
)

// Why a forward failed at the transport (FailureReason): a fixed set, for metric labels.
const (
	// FailTLS: either side refused the other's certificate (another cluster CA, expired, not
	// a node certificate), or the two could not agree on TLS or ALPN.
	FailTLS = "tls"
	// FailTimeout: the handshake or the connection timed out; the peer, or UDP to it, is gone.
	FailTimeout = "timeout"
	// FailRefused: the peer's host or QUIC stack refused the connection.
	FailRefused = "refused"
	// FailHandshake: any other failure to connect or to open a stream.
	FailHandshake = "handshake"
)

// FailureReason classifies a Forward error that wraps ErrUnreachable: FailTLS, FailTimeout,
// FailRefused or FailHandshake.
func FailureReason(err error) string {
	var (
		te     *quic.TransportError
		verify *tls.CertificateVerificationError
		alert  tls.AlertError
		unkCA  x509.UnknownAuthorityError
		invCA  x509.CertificateInvalidError
		host   x509.HostnameError
		ne     net.Error
	)
	isTE := errors.As(err, &te)
	switch {
	case isTE && te.ErrorCode.IsCryptoError(), errors.As(err, &verify), errors.As(err, &alert),
		errors.As(err, &unkCA), errors.As(err, &invCA), errors.As(err, &host):
		return FailTLS
	case isTE && te.ErrorCode == quic.ConnectionRefused, errors.Is(err, syscall.ECONNREFUSED):
		return FailRefused
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return FailTimeout
	}
	return FailHandshake
}
