package openai

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestAppendJSONMatchesReflection holds the hand-written chunk encoder to json.Marshal's
// output, byte for byte, over every escaping rule and every chunk shape a stream writes.
func TestAppendJSONMatchesReflection(t *testing.T) {
	var ascii strings.Builder
	for b := range 0x80 {
		ascii.WriteByte(byte(b))
	}
	texts := []string{"", "tok ", ascii.String(), "<b>&amp;</b>", "line\u2028sep\u2029", "naïve 日本 🙂",
		"bad \xff utf8 \xc3", "\x00\x1f\x7f", `quote " backslash \`}
	stop := "stop"
	var chunks []ChatCompletionChunk
	for _, text := range texts {
		for _, usage := range []bool{false, true} {
			chunks = append(chunks,
				ChatCompletionChunk{ID: "chatcmpl-" + text, Object: ObjectChatCompletionChunk, Created: 1733100000, Model: text,
					Choices: []ChunkChoice{{Delta: Delta{Content: StringPtr(text)}}}, IncludeUsage: usage},
				ChatCompletionChunk{ID: "c", Object: ObjectChatCompletionChunk, Model: "m", SystemFingerprint: text,
					Choices: []ChunkChoice{{Index: 2, Delta: Delta{Role: "assistant", Content: StringPtr(text)}}}, IncludeUsage: usage},
				ChatCompletionChunk{ID: "c", Object: ObjectChatCompletionChunk, Model: "m", Created: -5,
					Choices: []ChunkChoice{{Delta: Delta{Role: text}, FinishReason: &stop}, {Index: 1, FinishReason: &text}}, IncludeUsage: usage},
			)
		}
	}
	chunks = append(chunks,
		ChatCompletionChunk{ID: "c", Object: ObjectChatCompletionChunk, Model: "m"}, // nil choices: []
		ChatCompletionChunk{ID: "c", Object: ObjectChatCompletionChunk, Model: "m", IncludeUsage: true,
			Choices: []ChunkChoice{}, Usage: NewUsage(3, 2, 1)},
		ChatCompletionChunk{ID: "c", Object: ObjectChatCompletionChunk, Model: "m",
			Choices: []ChunkChoice{{Delta: Delta{Content: StringPtr("x")}, Logprobs: json.RawMessage(`{ "content" : [] }`)}}},
		ChatCompletionChunk{ID: "c", Object: ObjectChatCompletionChunk, Model: "m", IncludeUsage: true,
			Choices: []ChunkChoice{{Delta: Delta{ToolCalls: []ToolCall{{Index: new(int), ID: "call_1", Type: ToolTypeFunction,
				Function: FunctionCall{Name: "f", Arguments: `{"a":`}}}}}}},
	)
	if b := chunks[len(chunks)-1].AppendJSON(nil); !strings.Contains(string(b), `"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"a\":"}}]`) {
		t.Errorf("a tool call piece: %s", b)
	}
	for _, c := range chunks {
		want, err := c.marshalReflect()
		if err != nil {
			t.Fatal(err)
		}
		if got := c.AppendJSON([]byte("prefix")); string(got) != "prefix"+string(want) {
			t.Errorf("chunk %+v:\ngot  %s\nwant prefix%s", c, got, want)
		}
	}
}
