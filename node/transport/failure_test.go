package transport

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"

	"github.com/quic-go/quic-go"
)

// TestFailureReason: each kind of transport failure, as Forward wraps it, gets its label; the
// real handshakes of TestForeignCertificatesAreRefused and TestDialDeadAddressIsUnreachable
// check the tls and timeout cases end to end.
func TestFailureReason(t *testing.T) {
	tests := []struct {
		err  error
		want string
	}{
		{&quic.TransportError{ErrorCode: 0x12a, Remote: true}, FailTLS}, // bad_certificate, from the owner
		{&quic.TransportError{ErrorCode: 0x178}, FailTLS},               // no_application_protocol
		{&quic.HandshakeTimeoutError{}, FailTimeout},
		{&quic.IdleTimeoutError{}, FailTimeout},
		{context.DeadlineExceeded, FailTimeout},
		{&quic.TransportError{ErrorCode: quic.ConnectionRefused, Remote: true}, FailRefused},
		{syscall.ECONNREFUSED, FailRefused},
		{&quic.StatelessResetError{}, FailHandshake},
		{errors.New("lookup nowhere: no such host"), FailHandshake},
	}
	for _, tt := range tests {
		err := fmt.Errorf("%w: dial 127.0.0.1:1: %w", ErrUnreachable, tt.err)
		if got := FailureReason(err); got != tt.want {
			t.Errorf("FailureReason(%v) = %q, want %q", err, got, tt.want)
		}
	}
}
