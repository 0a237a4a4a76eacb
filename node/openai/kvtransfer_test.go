package openai

import (
	"errors"
	"strings"
	"testing"
)

// TestDecodeKVTransferParams pins what a kvmesh engine accepts of kv_transfer_params: vLLM's
// prefill request and a prefill answer's object, and a clear error for each malformed one.
func TestDecodeKVTransferParams(t *testing.T) {
	tests := []struct {
		in, err string
	}{
		{PrefillTransferParams, ""},
		{`null`, ""},
		{`{"do_remote_prefill":true,"remote_engine_id":"e","remote_request_id":"r","remote_block_ids":[0,1],"remote_host":"h","remote_port":80,"tp_size":1}`, ""},
		{`"x"`, "must be an object"},
		{`{"do_remote_decode":true,"do_remote_prefill":true}`, "both true"},
		{`{"do_remote_decode":"yes"}`, "cannot unmarshal"},
		{`{"do_remote_prefill":true,"remote_host":"h","remote_port":80}`, "remote_engine_id and remote_request_id"},
		{`{"do_remote_prefill":true,"remote_engine_id":"e","remote_request_id":"r","remote_host":"h","remote_port":0}`, "remote_port in 1..65535"},
		{`{"do_remote_prefill":true,"remote_engine_id":"e","remote_request_id":"r","remote_block_ids":[[0]],"remote_host":"h","remote_port":80}`, "remote_block_ids"},
	}
	for _, tt := range tests {
		p, err := DecodeKVTransferParams([]byte(tt.in))
		switch {
		case tt.err == "" && err != nil:
			t.Errorf("%s: %v", tt.in, err)
		case tt.err != "" && (err == nil || !errors.Is(err, ErrKVTransferParams) || !strings.Contains(err.Error(), tt.err)):
			t.Errorf("%s: error %v, want one saying %q", tt.in, err, tt.err)
		case tt.in == "null" && p != nil:
			t.Errorf("null decoded as %+v", p)
		}
	}
}
