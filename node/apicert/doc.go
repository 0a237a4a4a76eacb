// Package apicert serves the client API's TLS certificate from a certificate and key file and
// picks up a replaced pair without a restart (Reloader.GetCertificate, for tls.Config).
//
// # Concurrency
//
// A Reloader is safe for concurrent use: every TLS handshake may call GetCertificate.
package apicert
