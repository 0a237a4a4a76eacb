// Package transport forwards requests between kvmesh nodes over QUIC with mutual TLS.
//
// One node runs one Transport: a single UDP socket that serves inbound forwards and dials
// peers. Each peer address gets one QUIC connection, opened on first use, kept alive by pings
// and redialed when it has died; each forwarded request is one bidirectional stream. A forward
// that finds its pooled connection dead only once sent on it (the peer restarted, or this host
// was frozen past the idle timeout) is sent once more on a new connection before it fails.
//
// # Wire format
//
// Every frame is a type byte, a uvarint length and a payload. The ingress writes a header
// frame (Header), a body frame and ends its side. The header starts with the frame version
// (Version) and a Kind: KindRequest carries an inference request, whose body is the client's
// JSON and whose header has typed request fields (Endpoint, Waited, TTFTSLO, TPOTSLO, and
// optional ones such as AgentFinal); KindAgentRenew and KindAgentGiveUp are an ingress's agent-lease messages to the
// agent's home, with an empty body (and RenewWait for a renewal). EncodeHeader documents the
// layout. The owner answers with one accept frame (status, headers) or one refuse frame
// (status, code, message, retry-after, opaque state), before any token. After an accept come
// data frames, relayed as the owner writes them, and an end frame: clean, or the owner's
// failure message. A stream that ends without an end frame is truncated, never silently
// short. Decoders are strict and bounded (MaxHeaderBytes, MaxDataFrameBytes, MaxAnswerBytes,
// Config.MaxBodyBytes).
//
// # Versions
//
// A header's optional fields are tagged (headerFields: a tag, a length, a value), as gossip's
// state records are: a new optional field is a new tag in that table, and needs no new
// version. An odd tag is required: a reader that does not know it refuses the header as of an
// unknown kind (StatusKind, CodeKind), as it does a request of an endpoint it does not know,
// and the ingress tries another candidate; an even tag is optional: a reader that does not
// know it skips it and runs the request without it (a trace context, a queue TTL).
//
// A node reads Version and PreviousVersion, the version before it, whose optional fields are
// positional behind a flags byte; PreviousVersion is kept for one release after Version's
// and dropped in the next. A node that speaks PreviousVersion only refuses a header of Version
// as of another version; Forward sends it again in PreviousVersion, and sends that peer
// PreviousVersion for a minute. In PreviousVersion, a peer built before the trace context or
// the queue TTL resets a header carrying one as malformed, and Forward sends it once more
// without them (not a continuation's or a half's trace context: such a peer cannot run them
// either, and the caller tries another peer).
//
// Nodes on other frame versions refuse each other's forwards cleanly; nothing runs
// half-understood. An owner refuses a header of another frame version (StatusVersion,
// CodeVersion) or of an unknown kind, endpoint or required field (StatusKind, CodeKind)
// before any handler runs, and counts it in kvmesh_transport_rejected_total{reason="version"}
// or {reason="unknown_kind"}. The refuse frame's layout is the same in every version so far,
// so the ingress reads that refusal whatever its own version; the *Refusal is errors.Is
// ErrVersion (or ErrKind). A node on frame version 1 predates these refusals: it resets the
// stream of a later header as malformed, and Forward to it fails with an error wrapping both
// ErrUnreachable and ErrRejected. Either way the caller moves on to another peer. The ALPN
// stays kvmesh/1: the version lives in the header, so that a refusal can say what went wrong,
// which a failed handshake could not.
//
// # Trust
//
// InitCA, IssueNode and LoadTLS manage a cluster CA and node certificates; IssueNode writes a
// node's directory with its pair and ca.crt, never the CA key. DevTLS is the development
// variant: a CA kept in a directory the nodes of one host share, created once, each process
// issuing its own certificate in memory. Both ends of every connection present a certificate
// and verify the other's chain against the cluster CA; the client verifies the owner under
// PeerServerName, a SAN every node certificate carries, since peers are known by gossiped
// address, not by DNS. ALPN is kvmesh/1, TLS is 1.3 only. A node certificate names its node
// (CertName, the common name IssueNode writes): LoadTLS refuses another node's, and a handler
// learns the sender's from PeerName, to check the name a header claims. A certificate issued
// with AnyNodeURI (IssueAnyNode) is any node's.
// Datagrams that are not QUIC, failed handshakes and malformed streams are dropped and counted
// in kvmesh_transport_rejected_total{reason}. On the dialling side, FailureReason tells why a
// Forward could not reach its owner (tls, timeout, refused, handshake), for the node's
// ejection of unreachable peers.
//
// # Concurrency
//
// All Transport methods are safe for concurrent use; concurrent first forwards to one peer
// share one dial. A ResponseWriter may be used from several goroutines. A Response.Body is
// read by one goroutine, and may be closed from another to abort it.
//
// # Zero value
//
// The zero Transport is not usable: build one with New, then Start it. Close is safe twice.
package transport
