package external

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/kvmesh/kvmesh/node/engine"
	wire "github.com/kvmesh/kvmesh/node/openai"
)

// StatusError is an HTTP error answer from the engine before any output. It wraps
// engine.ErrRejected for a 4xx the client caused and engine.ErrUnavailable otherwise, and
// keeps the engine's status and OpenAI error fields so the node can relay a 4xx as is.
type StatusError struct {
	Status  int
	Message string
	Type    string
	Param   string
	// Code is the engine's error code when it sent a string one (vLLM sends the HTTP status
	// as a number, which is not kept).
	Code string
	// Structured: the body was a JSON error (OpenAI's {"error":{...}}, vLLM's or TGI's), not
	// plain text such as a proxy's or a router's "404 page not found".
	Structured bool
}

// CodeEngineOverloaded is the code of an engine's 429 that names none (TGI at its
// concurrency cap sends {"error":"Model is overloaded","error_type":"overloaded"}).
const CodeEngineOverloaded = "engine_overloaded"

func (e *StatusError) Error() string {
	return fmt.Sprintf("external: engine answered %d: %s", e.Status, e.Message)
}

// HTTPStatus is the engine's status code.
func (e *StatusError) HTTPStatus() int { return e.Status }

// clientError reports whether the answer is the client's to fix: a 4xx other than the
// engine refusing the node's own credentials (401, 403, 407; the node sends none).
func (e *StatusError) clientError() bool {
	switch e.Status {
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusProxyAuthRequired:
		return false
	}
	return e.Status >= 400 && e.Status < 500
}

// Unwrap gives the engine sentinel.
func (e *StatusError) Unwrap() error {
	if e.clientError() {
		return engine.ErrRejected
	}
	return engine.ErrUnavailable
}

// APIError returns the error to send the client. A 4xx the client caused keeps its status, the
// engine's message, param and string code; without a code it gets one by status: 404
// model_not_found (not_found for a plain-text 404, which means a missing path), 413
// body_too_large, 429 engine_overloaded, others invalid_request. Anything else (5xx, and the
// engine refusing the node's credentials) is a 502 engine_error.
func (e *StatusError) APIError() *wire.Error {
	if !e.clientError() {
		return wire.ErrEngine(e.Error())
	}
	code := e.Code
	if code == "" {
		switch e.Status {
		case http.StatusNotFound:
			code = "not_found"
			if e.Structured {
				code = wire.CodeModelNotFound
			}
		case http.StatusRequestEntityTooLarge:
			code = wire.CodeBodyTooLarge
		case http.StatusTooManyRequests:
			code = CodeEngineOverloaded
		default:
			code = wire.CodeInvalidRequest
		}
	}
	out := wire.NewError(e.Status, code, e.Message)
	out.Param = e.Param
	return out
}

// errorFields are the fields of an OpenAI error object; vLLM's older builds send them at the
// top level with "object":"error".
type errorFields struct {
	Message string          `json:"message"`
	Type    string          `json:"type"`
	Param   *string         `json:"param"`
	Code    json.RawMessage `json:"code"`
}

func (f *errorFields) into(se *StatusError) {
	se.Message, se.Type, se.Structured = f.Message, f.Type, true
	if f.Param != nil {
		se.Param = *f.Param
	}
	var code string
	if json.Unmarshal(f.Code, &code) == nil {
		if _, err := strconv.Atoi(code); err != nil { // "404" is a status, not a code
			se.Code = code
		}
	}
}

func statusError(resp *http.Response) *StatusError {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	se := &StatusError{Status: resp.StatusCode}
	var body struct {
		Error json.RawMessage `json:"error"`
		// TGI and some others send {"error":"msg","error_type":"..."}.
		ErrorType string `json:"error_type"`
		errorFields
	}
	if json.Unmarshal(b, &body) == nil {
		var d errorFields
		var s string
		switch {
		case json.Unmarshal(body.Error, &d) == nil && d.Message != "":
			d.into(se)
		case json.Unmarshal(body.Error, &s) == nil && s != "":
			se.Message, se.Type, se.Structured = s, body.ErrorType, true
		case body.Message != "":
			body.errorFields.into(se)
		}
	}
	if se.Message == "" {
		se.Message = strings.TrimSpace(string(b))
		if se.Message == "" {
			se.Message = http.StatusText(resp.StatusCode)
		}
	}
	return se
}
