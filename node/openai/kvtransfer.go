package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// KVTransferParams is vLLM's kv_transfer_params member as its NixlConnector reads and writes
// it (docs/design/disaggregation.md#external-engines): a proxy sends the prefill server
// {"do_remote_decode": true} and the remote fields null; the prefill server's answer carries
// them filled in, with do_remote_prefill true, and the proxy sends that object to the decode
// server, which pulls the KV from remote_host:remote_port. vLLM's connector adds members of
// its own (tp_size, remote_request_id); kvmesh engine writes remote_request_id, the handover
// its prefill engine holds, and reads no other.
type KVTransferParams struct {
	DoRemoteDecode  bool    `json:"do_remote_decode"`
	DoRemotePrefill bool    `json:"do_remote_prefill"`
	RemoteEngineID  *string `json:"remote_engine_id"`
	RemoteBlockIDs  []int   `json:"remote_block_ids"`
	RemoteHost      *string `json:"remote_host"`
	RemotePort      *int    `json:"remote_port"`
	RemoteRequestID string  `json:"remote_request_id,omitempty"`
}

// PrefillTransferParams is the kv_transfer_params of a request to a prefill server: vLLM's
// proxy sends exactly this.
const PrefillTransferParams = `{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,` +
	`"remote_block_ids":null,"remote_host":null,"remote_port":null}`

// ErrKVTransferParams is DecodeKVTransferParams' error.
var ErrKVTransferParams = errors.New("kv_transfer_params")

// DecodeKVTransferParams reads a kv_transfer_params value: a JSON object (null is nil, no
// error) of which do_remote_decode and do_remote_prefill are not both true, and which, with
// do_remote_prefill, names the remote engine, its request, host and a port in 1..65535.
// Its errors wrap ErrKVTransferParams and say what is wrong, for a 400.
func DecodeKVTransferParams(v []byte) (*KVTransferParams, error) {
	v = bytes.TrimSpace(v)
	if len(v) == 0 || string(v) == "null" {
		return nil, nil
	}
	if v[0] != '{' {
		return nil, fmt.Errorf("%w must be an object", ErrKVTransferParams)
	}
	var p KVTransferParams
	if err := json.Unmarshal(v, &p); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrKVTransferParams, err)
	}
	switch {
	case p.DoRemoteDecode && p.DoRemotePrefill:
		return nil, fmt.Errorf("%w: do_remote_decode and do_remote_prefill are both true", ErrKVTransferParams)
	case !p.DoRemotePrefill:
		return &p, nil
	case p.RemoteEngineID == nil || *p.RemoteEngineID == "" || p.RemoteRequestID == "":
		return nil, fmt.Errorf("%w: do_remote_prefill needs remote_engine_id and remote_request_id", ErrKVTransferParams)
	case p.RemoteHost == nil || *p.RemoteHost == "" || p.RemotePort == nil || *p.RemotePort < 1 || *p.RemotePort > 65535:
		return nil, fmt.Errorf("%w: do_remote_prefill needs remote_host and a remote_port in 1..65535", ErrKVTransferParams)
	}
	return &p, nil
}
