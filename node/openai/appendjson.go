package openai

import (
	"encoding/json"
	"strconv"
	"unicode/utf8"
)

// The streaming path writes one chunk per generated token, through every node it crosses, so
// the common chunk (text or a finish reason, no logprobs, no usage) is encoded by hand rather
// than by reflection. The output is byte-identical to json.Marshal's; the tests hold it to that.

// AppendJSON appends c's JSON encoding (what MarshalJSON returns) to dst.
func (c ChatCompletionChunk) AppendJSON(dst []byte) []byte {
	if c.Usage != nil || !plainChoices(c.Choices) {
		b, err := c.marshalReflect()
		if err != nil { // unreachable: every field of the chunk encodes
			return append(dst, "null"...)
		}
		return append(dst, b...)
	}
	dst = append(dst, `{"id":`...)
	dst = appendString(dst, c.ID)
	dst = append(dst, `,"object":`...)
	dst = appendString(dst, c.Object)
	dst = append(dst, `,"created":`...)
	dst = strconv.AppendInt(dst, c.Created, 10)
	dst = append(dst, `,"model":`...)
	dst = appendString(dst, c.Model)
	if c.SystemFingerprint != "" {
		dst = append(dst, `,"system_fingerprint":`...)
		dst = appendString(dst, c.SystemFingerprint)
	}
	dst = append(dst, `,"choices":[`...)
	for i, ch := range c.Choices {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"index":`...)
		dst = strconv.AppendInt(dst, int64(ch.Index), 10)
		dst = append(dst, `,"delta":{`...)
		if ch.Delta.Role != "" {
			dst = append(dst, `"role":`...)
			dst = appendString(dst, ch.Delta.Role)
		}
		if ch.Delta.Content != nil {
			if ch.Delta.Role != "" {
				dst = append(dst, ',')
			}
			dst = append(dst, `"content":`...)
			dst = appendString(dst, *ch.Delta.Content)
		}
		dst = append(dst, `},"logprobs":null,"finish_reason":`...)
		if ch.FinishReason == nil {
			dst = append(dst, "null"...)
		} else {
			dst = appendString(dst, *ch.FinishReason)
		}
		dst = append(dst, '}')
	}
	dst = append(dst, ']')
	if c.IncludeUsage {
		dst = append(dst, `,"usage":null`...)
	}
	return append(dst, '}')
}

// plainChoices reports whether no choice carries logprobs (raw JSON from an engine, which
// json.Marshal would validate and compact) or tool calls (rare enough to go by reflection).
func plainChoices(cs []ChunkChoice) bool {
	for _, ch := range cs {
		if len(ch.Logprobs) > 0 && string(ch.Logprobs) != "null" || len(ch.Delta.ToolCalls) > 0 {
			return false
		}
	}
	return true
}

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string escaped as encoding/json escapes it: quote,
// backslash and control characters, the HTML-sensitive <, > and &, U+2028 and U+2029, and
// invalid UTF-8 as U+FFFD.
func appendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		b := s[i]
		if b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' && b != '<' && b != '>' && b != '&' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '"', '\\':
				dst = append(dst, '\\', b)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[b>>4], hexDigits[b&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// jsonAppender is implemented by the chunk types with a hand-written encoder.
type jsonAppender interface {
	AppendJSON(dst []byte) []byte
}

var _ jsonAppender = ChatCompletionChunk{}
var _ json.Marshaler = ChatCompletionChunk{}
