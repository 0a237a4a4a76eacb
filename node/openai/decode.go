package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// DefaultBodyLimit is a reasonable cap on a request body: about a million tokens of prompt.
const DefaultBodyLimit = 4 << 20

// DecodeChat reads and validates a chat completions body of at most limit bytes (0 means
// DefaultBodyLimit). It returns the concrete *Error so callers can send it without a type check;
// keep it in a *Error variable, not an error interface, to avoid a non-nil nil.
func DecodeChat(r io.Reader, limit int64) (*ChatRequest, *Error) {
	var req ChatRequest
	if err := decodeBody(r, limit, req.member, &req.Extra); err != nil {
		return nil, err
	}
	if req.Model == "" {
		return nil, ErrInvalidParameter("model", "model is required")
	}
	if len(req.Messages) == 0 {
		return nil, ErrInvalidParameter("messages", "messages must be a non-empty array")
	}
	for i, m := range req.Messages {
		if m.Role == "" {
			p := fmt.Sprintf("messages[%d].role", i)
			return nil, ErrInvalidParameter(p, p+" is required")
		}
	}
	if req.TopLogprobs != nil && *req.TopLogprobs != 0 && (req.Logprobs == nil || !*req.Logprobs) {
		return nil, ErrInvalidParameter("top_logprobs", "top_logprobs needs logprobs set to true")
	}
	return &req, nil
}

// DecodeCompletion reads and validates a completions body of at most limit bytes, like DecodeChat.
func DecodeCompletion(r io.Reader, limit int64) (*CompletionRequest, *Error) {
	var req CompletionRequest
	if err := decodeBody(r, limit, req.member, &req.Extra); err != nil {
		return nil, err
	}
	if req.Model == "" {
		return nil, ErrInvalidParameter("model", "model is required")
	}
	if req.Prompt == nil {
		return nil, ErrInvalidParameter("prompt", "prompt is required")
	}
	return &req, nil
}

// decodeBody reads at most limit bytes and decodes exactly one JSON object, member by member
// (see decodeMembers).
func decodeBody(r io.Reader, limit int64, member func(string) any, extra *Fields) *Error {
	if limit <= 0 {
		limit = DefaultBodyLimit
	}
	body, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return ErrInvalidRequest("reading request body: " + err.Error())
	}
	if int64(len(body)) > limit {
		return ErrBodyTooLarge(fmt.Sprintf("request body is over the limit of %d bytes", limit))
	}
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 {
		return ErrInvalidRequest("request body is empty")
	}
	if trimmed[0] != '{' {
		return ErrInvalidRequest("request body must be a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	if err := decodeMembers(dec, member, extra); err != nil {
		return decodeError(err)
	}
	if rest := bytes.TrimSpace(trimmed[dec.InputOffset():]); len(rest) > 0 {
		return ErrInvalidRequest("unexpected data after the JSON object")
	}
	return nil
}

var errNotObject = errors.New("not a JSON object")

// decodeMembers reads one JSON object from dec, one member at a time: a member whose name
// member knows (exactly, case included) is decoded into the value it returns, strictly typed;
// any other is appended to extra (when not nil) with its value as sent. So the fields kvmesh reads are
// checked and the rest pass through. A member's decoding error comes back as a *fieldError
// naming its path.
func decodeMembers(dec *json.Decoder, member func(string) any, extra *Fields) error {
	t, err := dec.Token()
	if err != nil {
		return err
	}
	if t != json.Delim('{') {
		return errNotObject
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return err
		}
		name, _ := t.(string) // an object's keys are strings, or Token fails
		if v := member(name); v != nil {
			if err := dec.Decode(v); err != nil {
				return inField(name, err)
			}
			continue
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return err
		}
		if extra != nil {
			*extra = append(*extra, Field{Name: name, Value: raw})
		}
	}
	_, err = dec.Token() // the closing brace
	return err
}

// fieldError is the decoding error of the member at path ("max_tokens", "messages[0].role").
type fieldError struct {
	path string
	err  error
}

func (e *fieldError) Error() string { return e.path + ": " + e.err.Error() }
func (e *fieldError) Unwrap() error { return e.err }

// inField puts err, from decoding member name's value, under name's path.
func inField(name string, err error) error {
	join := func(sub string) string {
		if strings.HasPrefix(sub, "[") { // an element: messages[2]
			return name + sub
		}
		return name + "." + sub
	}
	var fe *fieldError
	if errors.As(err, &fe) {
		return &fieldError{path: join(fe.path), err: fe.err}
	}
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) && typeErr.Field != "" {
		return &fieldError{path: join(typeErr.Field), err: err}
	}
	return &fieldError{path: name, err: err}
}

// decodeError turns decoding errors into 400s that name the field.
func decodeError(err error) *Error {
	var synErr *json.SyntaxError
	var typeErr *json.UnmarshalTypeError
	var fe *fieldError
	switch {
	case errors.As(err, &synErr):
		return ErrInvalidRequest(fmt.Sprintf("invalid JSON at byte %d: %v", synErr.Offset, synErr))
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return ErrInvalidRequest("request body is truncated JSON")
	case !errors.As(err, &fe):
		if errors.Is(err, errNotObject) {
			return ErrInvalidRequest("request body must be a JSON object")
		}
		return ErrInvalidRequest("invalid request body: " + strings.TrimPrefix(err.Error(), "json: "))
	case errors.As(err, &typeErr):
		want := jsonType(typeErr.Type.Kind().String())
		if num, ok := strings.CutPrefix(typeErr.Value, "number "); ok && (want == "integer" || want == "number") {
			// A number that does not fit: a fraction where an integer goes, or a magnitude
			// (1e400) no integer or float64 holds.
			if f, _ := strconv.ParseFloat(num, 64); want == "integer" && f != math.Trunc(f) {
				return ErrInvalidParameter(fe.path, fmt.Sprintf("field %q must be an integer, not %s", fe.path, num))
			}
			return ErrInvalidParameter(fe.path, fmt.Sprintf("field %q is out of range: %s", fe.path, num))
		}
		return ErrInvalidParameter(fe.path, fmt.Sprintf("field %q must be of type %s, not %s",
			fe.path, want, typeErr.Value))
	case errors.Is(err, errNotObject):
		return ErrInvalidParameter(fe.path, fmt.Sprintf("field %q must be an object", fe.path))
	}
	return ErrInvalidParameter(fe.path, fe.path+": "+strings.TrimPrefix(fe.err.Error(), "json: "))
}

func jsonType(kind string) string {
	switch kind {
	case "string":
		return "string"
	case "bool":
		return "boolean"
	case "slice", "array":
		return "array"
	case "map", "struct", "ptr":
		return "object"
	case "int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64":
		return "integer"
	case "float32", "float64":
		return "number"
	}
	return kind
}
