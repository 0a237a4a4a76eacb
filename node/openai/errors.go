package openai

import (
	"encoding/json"
	"net/http"
)

// Error codes kvmesh returns; each pairs with the status of its constructor.
const (
	CodeInvalidRequest   = "invalid_request"
	CodeInvalidParameter = "invalid_parameter"
	// CodeUnsupportedParameter: a well-formed field the engine that would run the request
	// cannot honour (the embedded engine and guided_json, say); its param names the field.
	CodeUnsupportedParameter = "unsupported_parameter"
	CodeBodyTooLarge         = "body_too_large"
	// CodeBodyTimeout (408): the request body did not arrive within the node's body timeout.
	CodeBodyTimeout           = "body_timeout"
	CodeModelNotFound         = "model_not_found"
	CodeContextLengthExceeded = "context_length_exceeded"
	CodeInvalidAPIKey         = "invalid_api_key"
	CodeRateLimited           = "rate_limited"
	CodeQueueFull             = "queue_full"
	CodeNoCapacity            = "no_capacity"
	CodeEngineError           = "engine_error"
	CodeEngineTimeout         = "engine_timeout"
	// CodeClientClosed labels requests the client abandoned (status 499, never sent).
	CodeClientClosed = "client_closed"
	// CodeUnsupportedMediaType (415): a body with a Content-Encoding other than identity.
	CodeUnsupportedMediaType = "unsupported_media_type"
)

// Error types, following the OpenAI API's "type" field.
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeAuthentication = "authentication_error"
	TypePermission     = "permission_error"
	TypeRateLimit      = "rate_limit_error"
	TypeServer         = "server_error"
)

// Error is an API error: an HTTP status and the OpenAI error body. Param names the offending
// request field, or is empty (sent as null).
type Error struct {
	Status  int
	Message string
	Type    string
	Param   string
	Code    string
}

func (e *Error) Error() string {
	return "openai: " + e.Code + ": " + e.Message
}

// NewError builds an Error whose Type follows from status: 401 authentication_error,
// 403 permission_error, 429 rate_limit_error, other 4xx invalid_request_error, 5xx (and anything
// else) server_error.
func NewError(status int, code, msg string) *Error {
	return &Error{Status: status, Message: msg, Type: typeFor(status), Code: code}
}

func typeFor(status int) string {
	switch {
	case status == http.StatusUnauthorized:
		return TypeAuthentication
	case status == http.StatusForbidden:
		return TypePermission
	case status == http.StatusTooManyRequests:
		return TypeRateLimit
	case status >= 400 && status < 500:
		return TypeInvalidRequest
	default:
		return TypeServer
	}
}

// WithParam returns a copy of e naming the request field at fault.
func (e *Error) WithParam(param string) *Error {
	c := *e
	c.Param = param
	return &c
}

// ErrInvalidRequest is a 400 invalid_request (malformed body).
func ErrInvalidRequest(msg string) *Error {
	return NewError(http.StatusBadRequest, CodeInvalidRequest, msg)
}

// ErrInvalidParameter is a 400 invalid_parameter naming param.
func ErrInvalidParameter(param, msg string) *Error {
	return NewError(http.StatusBadRequest, CodeInvalidParameter, msg).WithParam(param)
}

// ErrBodyTooLarge is a 413 body_too_large.
func ErrBodyTooLarge(msg string) *Error {
	return NewError(http.StatusRequestEntityTooLarge, CodeBodyTooLarge, msg)
}

// ErrModelNotFound is a 404 model_not_found for model.
func ErrModelNotFound(model string) *Error {
	return NewError(http.StatusNotFound, CodeModelNotFound,
		"the model "+model+" does not exist or is not served").WithParam("model")
}

// ErrContextLengthExceeded is a 400 context_length_exceeded.
func ErrContextLengthExceeded(msg string) *Error {
	return NewError(http.StatusBadRequest, CodeContextLengthExceeded, msg).WithParam("messages")
}

// ErrInvalidAPIKey is a 401 invalid_api_key.
func ErrInvalidAPIKey(msg string) *Error {
	return NewError(http.StatusUnauthorized, CodeInvalidAPIKey, msg)
}

// ErrRateLimited is a 429 rate_limited.
func ErrRateLimited(msg string) *Error {
	return NewError(http.StatusTooManyRequests, CodeRateLimited, msg)
}

// ErrQueueFull is a 429 queue_full.
func ErrQueueFull(msg string) *Error {
	return NewError(http.StatusTooManyRequests, CodeQueueFull, msg)
}

// ErrNoCapacity is a 503 no_capacity.
func ErrNoCapacity(msg string) *Error {
	return NewError(http.StatusServiceUnavailable, CodeNoCapacity, msg)
}

// ErrEngine is a 502 engine_error.
func ErrEngine(msg string) *Error {
	return NewError(http.StatusBadGateway, CodeEngineError, msg)
}

// ErrEngineTimeout is a 504 engine_timeout.
func ErrEngineTimeout(msg string) *Error {
	return NewError(http.StatusGatewayTimeout, CodeEngineTimeout, msg)
}

// ErrorBody is the JSON envelope of an error: {"error":{...}}.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is the inside of an ErrorBody. Param is null when unset.
type ErrorDetail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    string  `json:"code"`
}

// Body returns e's wire form.
func (e *Error) Body() ErrorBody {
	d := ErrorDetail{Message: e.Message, Type: e.Type, Code: e.Code}
	if d.Type == "" {
		d.Type = typeFor(e.Status)
	}
	if e.Param != "" {
		p := e.Param
		d.Param = &p
	}
	return ErrorBody{Error: d}
}

// WriteError sends e as the response: its status and the OpenAI error body.
func WriteError(w http.ResponseWriter, e *Error) {
	b, _ := json.Marshal(e.Body()) // cannot fail: strings only
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	status := e.Status
	if status < 400 || status > 599 {
		status = http.StatusInternalServerError
	}
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
