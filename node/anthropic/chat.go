package anthropic

import (
	"bytes"
	"encoding/json"
	"strings"
)

// The chat completions body ToChat writes. Its members are OpenAI's, but for top_k,
// include_stop_str_in_output, continue_final_message and add_generation_prompt, vLLM's
// extensions that SGLang, TGI and the embedded engine also take.
type chatBody struct {
	Model             string         `json:"model"`
	Messages          []chatMessage  `json:"messages"`
	MaxTokens         *int           `json:"max_tokens,omitempty"`
	Stop              []string       `json:"stop,omitempty"`
	IncludeStopStr    bool           `json:"include_stop_str_in_output,omitempty"`
	Temperature       *float64       `json:"temperature,omitempty"`
	TopP              *float64       `json:"top_p,omitempty"`
	TopK              *int           `json:"top_k,omitempty"`
	Stream            bool           `json:"stream,omitempty"`
	StreamOptions     *streamOptions `json:"stream_options,omitempty"`
	Tools             []chatTool     `json:"tools,omitempty"`
	ToolChoice        any            `json:"tool_choice,omitempty"`
	ParallelToolCalls *bool          `json:"parallel_tool_calls,omitempty"`
	User              string         `json:"user,omitempty"`
	ContinueFinal     bool           `json:"continue_final_message,omitempty"`
	AddGenPrompt      *bool          `json:"add_generation_prompt,omitempty"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// chatMessage's Content is a string, a []chatPart, or nil (null: an assistant turn of tool
// calls only).
type chatMessage struct {
	Role       string         `json:"role"`
	Content    any            `json:"content"`
	ToolCalls  []chatToolCall `json:"tool_calls,omitempty"`
	ToolCallID string         `json:"tool_call_id,omitempty"`
}

type chatPart struct {
	Type     string    `json:"type"`
	Text     *string   `json:"text,omitempty"`
	ImageURL *imageURL `json:"image_url,omitempty"`
}

type imageURL struct {
	URL string `json:"url"`
}

type chatToolCall struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function chatFunction `json:"function"`
}

type chatFunction struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
	Arguments   *string         `json:"arguments,omitempty"`
}

type chatTool struct {
	Type     string       `json:"type"`
	Function chatFunction `json:"function"`
}

// ToChat translates r into the body of the equivalent chat completions request, the request
// the mesh admits, routes and runs:
//
//   - system becomes a first system message; a user or assistant message keeps its role.
//   - Text blocks become the content: a string when the message has one text block and
//     nothing else, else text parts in order. Images become image_url parts (base64 data as a
//     data: URL).
//   - An assistant's tool_use blocks become its tool_calls (input as the arguments' JSON); a
//     user's tool_result blocks become tool messages (tool_call_id, text content) in their
//     place, so the blocks before a result and after it stay on either side of it.
//   - A final assistant message is a prefill the answer continues: continue_final_message
//     true, add_generation_prompt false.
//   - max_tokens, temperature, top_p and top_k keep their names; stop_sequences is stop, with
//     include_stop_str_in_output so the answer says which sequence ended it (StopSequence);
//     metadata.user_id is user; tools are function tools (input_schema as parameters);
//     tool_choice auto, any, tool and none are "auto", "required", the named function and
//     "none", and disable_parallel_tool_use is parallel_tool_calls false.
//   - stream asks for the usage chunk (stream_options.include_usage), which message_delta
//     reports.
func ToChat(r *Request) []byte {
	c := chatBody{
		Model: r.Model, MaxTokens: r.MaxTokens, Stop: r.StopSequences, IncludeStopStr: len(r.StopSequences) > 0,
		Temperature: r.Temperature, TopP: r.TopP, TopK: r.TopK, Stream: r.Stream, User: r.UserID,
	}
	if r.Stream {
		c.StreamOptions = &streamOptions{IncludeUsage: true}
	}
	if len(r.System) > 0 {
		c.Messages = append(c.Messages, chatMessage{Role: "system", Content: textContent(r.System)})
	}
	for _, m := range r.Messages {
		if m.Role == RoleAssistant {
			c.Messages = append(c.Messages, assistantMessage(m.Content))
		} else {
			c.Messages = appendUser(c.Messages, m.Content)
		}
	}
	if n := len(r.Messages); n > 0 && r.Messages[n-1].Role == RoleAssistant {
		no := false
		c.ContinueFinal, c.AddGenPrompt = true, &no
	}
	for _, t := range r.Tools {
		c.Tools = append(c.Tools, chatTool{Type: "function",
			Function: chatFunction{Name: t.Name, Description: t.Description, Parameters: t.InputSchema}})
	}
	if tc := r.ToolChoice; tc != nil {
		c.ToolChoice = map[string]any{"auto": "auto", "any": "required", "none": "none"}[tc.Type]
		if tc.Type == "tool" {
			c.ToolChoice = map[string]any{"type": "function", "function": map[string]string{"name": tc.Name}}
		}
		if tc.DisableParallelToolUse {
			no := false
			c.ParallelToolCalls = &no
		}
	}
	b, _ := json.Marshal(c) // plain data, and raw members Decode read as valid JSON
	return b
}

// textContent is the chat content of text and image blocks.
func textContent(blocks []Block) any {
	if len(blocks) == 1 && blocks[0].Type == "text" {
		return blocks[0].Text
	}
	parts := make([]chatPart, 0, len(blocks))
	for _, b := range blocks {
		if b.Type == "image" {
			parts = append(parts, chatPart{Type: "image_url", ImageURL: &imageURL{URL: imageSourceURL(b.Source)}})
			continue
		}
		parts = append(parts, chatPart{Type: "text", Text: &b.Text})
	}
	return parts
}

func imageSourceURL(s *ImageSource) string {
	if s.Type == "url" {
		return s.URL
	}
	return "data:" + s.MediaType + ";base64," + s.Data
}

// appendUser appends a user turn: its tool results as tool messages, the blocks between them
// as user messages.
func appendUser(msgs []chatMessage, blocks []Block) []chatMessage {
	var run []Block
	flush := func() {
		if len(run) > 0 {
			msgs = append(msgs, chatMessage{Role: "user", Content: textContent(run)})
			run = nil
		}
	}
	for _, b := range blocks {
		if b.Type != "tool_result" {
			run = append(run, b)
			continue
		}
		flush()
		var text strings.Builder
		for i, ib := range b.Content {
			if i > 0 {
				text.WriteByte('\n')
			}
			text.WriteString(ib.Text)
		}
		msgs = append(msgs, chatMessage{Role: "tool", ToolCallID: b.ToolUseID, Content: text.String()})
	}
	flush()
	if len(blocks) == 0 {
		msgs = append(msgs, chatMessage{Role: "user", Content: ""})
	}
	return msgs
}

// assistantMessage is an assistant turn: its text concatenated, its tool_use blocks as
// tool_calls.
func assistantMessage(blocks []Block) chatMessage {
	m := chatMessage{Role: "assistant"}
	var text strings.Builder
	hasText := false
	for _, b := range blocks {
		switch b.Type {
		case "text":
			text.WriteString(b.Text)
			hasText = true
		case "tool_use":
			var args bytes.Buffer
			if json.Compact(&args, b.Input) != nil {
				args.Reset()
				args.Write(b.Input)
			}
			s := args.String()
			m.ToolCalls = append(m.ToolCalls, chatToolCall{ID: b.ID, Type: "function",
				Function: chatFunction{Name: b.Name, Arguments: &s}})
		}
	}
	if hasText || len(m.ToolCalls) == 0 {
		m.Content = text.String()
	}
	return m
}
