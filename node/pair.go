package node

import (
	"github.com/kvmesh/kvmesh/admit/route"
	"github.com/kvmesh/kvmesh/node/attempt"
	"github.com/kvmesh/kvmesh/node/transport"
)

// Disaggregated prefill and decode (docs/design/disaggregation.md). In a mesh with prefill or
// decode nodes the planner may choose, for a request, a pair instead of a whole candidate
// (route.Choose): a candidate with Pair set. The ingress then forwards the request to the
// prefill node p marked as a prefill (transport.Header.Prefill); p's engine computes the
// prompt's KV and p answers with the handover (transport.HandoverContentType), which the
// client never sees. The ingress forwards the request again to the decode node d with the
// handover in the header; d decodes from it and its chunks go to the client through the
// relay, as any owner's do, so the client reads one stream with one role chunk (and p's name
// in HeaderPrefillNode, which a request run whole never has), and a d that fails mid-stream is
// migrated like any owner. When p refuses or fails before the handover, the next prefill
// candidates are tried, then the request's whole candidates (mixed nodes), else it waits for
// room (every node refused) or ends with a 502 (attempts failed); when d refuses or fails
// before its first byte, the next decode candidates are tried with the same handover; when
// they all refused, the handover waits for decode room until the request's deadline
// (handoverDeadline), else the request ends with an explicit error (CodeDecodeUnavailable,
// CodeDecodeFailed). Either half may run on this node itself.

// Refusal and failure codes of the pair's flow (attempt's).
const (
	// CodeWrongRole is an owner's refusal (503) of a request its role does not run: a whole
	// request or a decode half on a prefill node, a prefill half on a decode node, or a whole
	// request there with its route.decode_local_prefill off, either half on a node whose
	// engine cannot split (an external engine without a role), a handover from the other
	// kind of engine.
	CodeWrongRole = attempt.CodeWrongRole
	// CodeDecodeUnavailable (503) ends a split request whose prompt was prefilled but whose
	// handover every decode node tried refused (no room).
	CodeDecodeUnavailable = attempt.CodeDecodeUnavailable
	// CodeDecodeFailed (502) ends a split request whose handover no decode node tried could
	// take: an attempt failed (unreachable, or its engine failed before the first token).
	CodeDecodeFailed = attempt.CodeDecodeFailed
)

// splits reports whether this node's engine can run either half of a split request: the
// embedded engine can, and an external one in a prefill or decode role (a vLLM server with a
// KV connector, whose handover is its kv_transfer_params).
func (n *Node) splits() bool { return n.sim != nil || route.IsHalf(n.cfg.Role) }

// takesHalf says why this node does not run the forwarded request h marks ("" when it does).
func (n *Node) takesHalf(h transport.Header) string {
	half := h.Prefill || h.Handover != nil
	switch {
	case half && !n.splits():
		return "this node's engine runs whole requests only"
	case h.Handover != nil && (len(h.Handover.Params) > 0) != (n.sim == nil):
		// An external engine decodes only from its own kind's transfer parameters, and the
		// embedded one only from the embedded engine's KV.
		return "the handover comes from another kind of engine than this node's"
	case n.cfg.Role == route.RolePrefill && !h.Prefill:
		return "this node runs the prefill half of a request only"
	case n.cfg.Role == route.RoleDecode && h.Prefill:
		return "this node does not run the prefill half of a request"
	case n.cfg.Role == route.RoleDecode && h.Handover == nil && !n.localPrefill():
		return "this node decodes from a handover only (route.decode_local_prefill is off)"
	}
	return ""
}

// localPrefill reports whether this node, in the decode role, runs a whole request it is given
// (route.decode_local_prefill, as the last reload left it).
func (n *Node) localPrefill() bool {
	cfg := n.planner.Policy().Config()
	return cfg.LocalPrefill()
}
