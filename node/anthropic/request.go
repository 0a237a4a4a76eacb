package anthropic

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"

	"github.com/kvmesh/kvmesh/node/openai"
)

// Request is the body of POST /v1/messages (and of /v1/messages/count_tokens, which has no
// max_tokens). Pointer fields are nil when the client left them out.
type Request struct {
	Model         string
	Messages      []Message
	System        []Block // a string system prompt is one text block
	MaxTokens     *int
	StopSequences []string
	Temperature   *float64
	TopP          *float64
	TopK          *int
	Stream        bool
	Tools         []Tool
	ToolChoice    *ToolChoice
	UserID        string // metadata.user_id
	// Raw is the body as the client sent it: what an engine that serves the Messages API
	// natively is sent.
	Raw []byte
}

// Message is one turn: role user or assistant, content a string (one text block) or blocks.
type Message struct {
	Role    string
	Content []Block
}

// Block is one content block. Which fields are set depends on Type.
type Block struct {
	Type string `json:"type"`
	// text
	Text string `json:"text,omitempty"`
	// image
	Source *ImageSource `json:"source,omitempty"`
	// tool_use
	ID    string          `json:"id,omitempty"`
	Name  string          `json:"name,omitempty"`
	Input json.RawMessage `json:"input,omitempty"`
	// tool_result: Content is its text and image blocks (a string is one text block).
	ToolUseID string  `json:"tool_use_id,omitempty"`
	Content   []Block `json:"-"`
	IsError   bool    `json:"is_error,omitempty"`
}

// ImageSource is an image block's source: base64 data of a media type, or a URL.
type ImageSource struct {
	Type      string `json:"type"`
	MediaType string `json:"media_type,omitempty"`
	Data      string `json:"data,omitempty"`
	URL       string `json:"url,omitempty"`
}

// Tool is a client tool the model may call: a name, a description and its input's JSON schema.
type Tool struct {
	Name        string
	Description string
	InputSchema json.RawMessage
}

// ToolChoice is how the model must use the tools: auto, any, tool (Name) or none.
type ToolChoice struct {
	Type                   string
	Name                   string
	DisableParallelToolUse bool
}

// Roles of a Messages conversation.
const (
	RoleUser      = "user"
	RoleAssistant = "assistant"
)

// Refused names the request members and block types kvmesh knows but does not carry, with
// why: a client gets a 400 naming them rather than an answer that ignored them.
var refusedMembers = map[string]string{
	"thinking":           "extended thinking is not supported",
	"mcp_servers":        "MCP servers are not supported",
	"container":          "containers are not supported",
	"context_management": "context management is not supported",
	"output_format":      "structured output formats are not supported",
}

var refusedBlocks = map[string]string{
	"thinking":          "thinking blocks are not supported",
	"redacted_thinking": "thinking blocks are not supported",
	"document":          "document blocks are not supported",
	"search_result":     "search result blocks are not supported",
	"server_tool_use":   "server tools are not supported",
	"container_upload":  "container uploads are not supported",
}

// Decode reads a Messages body (count: a count_tokens body, without max_tokens). Members are
// matched by exact name and typed strictly; an unknown member, a member or block kvmesh
// refuses, or a wrong type is a 400 invalid_request whose param is the member's path in the
// Messages API's own notation (messages.1.content.0.type).
func Decode(body []byte, count bool) (*Request, *openai.Error) {
	var top map[string]json.RawMessage
	if err := strictUnmarshal(body, &top); err != nil || top == nil {
		return nil, invalid("", "the body must be a JSON object: "+errText(err))
	}
	r := Request{Raw: body}
	names := make([]string, 0, len(top))
	for name := range top {
		names = append(names, name)
	}
	slices.Sort(names) // one error for one body, whatever the map's order
	for _, name := range names {
		if oerr := r.member(name, top[name], count); oerr != nil {
			return nil, oerr
		}
	}
	return &r, r.validate(count)
}

// member decodes the top-level member name.
func (r *Request) member(name string, v json.RawMessage, count bool) *openai.Error {
	if why, ok := refusedMembers[name]; ok {
		return invalid(name, name+": "+why)
	}
	var err error
	switch name {
	case "model":
		err = json.Unmarshal(v, &r.Model)
	case "messages":
		return r.decodeMessages(v)
	case "system":
		r.System, err = decodeContent(v, "system")
		if err == nil {
			for i, b := range r.System {
				if b.Type != "text" {
					return invalid(fmt.Sprintf("system.%d.type", i), fmt.Sprintf("system.%d: the system prompt takes text blocks only", i))
				}
			}
		}
	case "max_tokens":
		err = json.Unmarshal(v, &r.MaxTokens)
	case "stop_sequences":
		err = json.Unmarshal(v, &r.StopSequences)
	case "temperature":
		err = json.Unmarshal(v, &r.Temperature)
	case "top_p":
		err = json.Unmarshal(v, &r.TopP)
	case "top_k":
		err = json.Unmarshal(v, &r.TopK)
	case "stream":
		if count {
			return invalid(name, "stream: extra inputs are not permitted")
		}
		err = json.Unmarshal(v, &r.Stream)
	case "tools":
		return r.decodeTools(v)
	case "tool_choice":
		return r.decodeToolChoice(v)
	case "metadata":
		var m struct {
			UserID *string `json:"user_id"`
		}
		if err = strictUnmarshal(v, &m); err == nil && m.UserID != nil {
			r.UserID = *m.UserID
		}
	case "service_tier":
		// Which capacity tier serves the request is the mesh's admission, for every tier.
		var s string
		if err = json.Unmarshal(v, &s); err == nil && s != "auto" && s != "standard_only" {
			return invalid(name, `service_tier: must be "auto" or "standard_only"`)
		}
	default:
		return invalid(name, name+": extra inputs are not permitted")
	}
	if err != nil {
		return invalid(name, name+": "+errText(err))
	}
	return nil
}

// validate checks what the members say together.
func (r *Request) validate(count bool) *openai.Error {
	switch {
	case r.Model == "":
		return invalid("model", "model: field required")
	case len(r.Messages) == 0:
		return invalid("messages", "messages: at least one message is required")
	case r.MaxTokens == nil && !count:
		return invalid("max_tokens", "max_tokens: field required")
	case r.MaxTokens != nil && *r.MaxTokens < 1:
		return invalid("max_tokens", "max_tokens: must be at least 1")
	case r.Temperature != nil && (*r.Temperature < 0 || *r.Temperature > 1):
		return invalid("temperature", "temperature: must be between 0 and 1")
	case r.TopP != nil && (*r.TopP < 0 || *r.TopP > 1):
		return invalid("top_p", "top_p: must be between 0 and 1")
	case r.TopK != nil && *r.TopK < 0:
		return invalid("top_k", "top_k: must not be negative")
	case r.ToolChoice != nil && r.ToolChoice.Type == "tool" &&
		!slices.ContainsFunc(r.Tools, func(t Tool) bool { return t.Name == r.ToolChoice.Name }):
		return invalid("tool_choice.name", fmt.Sprintf("tool_choice.name: no tool named %q", r.ToolChoice.Name))
	}
	for i, s := range r.StopSequences {
		if s == "" {
			return invalid(fmt.Sprintf("stop_sequences.%d", i), fmt.Sprintf("stop_sequences.%d: must not be empty", i))
		}
	}
	return nil
}

func (r *Request) decodeMessages(v json.RawMessage) *openai.Error {
	var raw []struct {
		Role    *string         `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := strictUnmarshal(v, &raw); err != nil {
		return invalid("messages", "messages: "+errText(err))
	}
	r.Messages = make([]Message, len(raw))
	for i, m := range raw {
		at := fmt.Sprintf("messages.%d", i)
		switch {
		case m.Role == nil:
			return invalid(at+".role", at+".role: field required")
		case *m.Role != RoleUser && *m.Role != RoleAssistant:
			return invalid(at+".role", fmt.Sprintf(`%s.role: must be "user" or "assistant", not %q`, at, *m.Role))
		case m.Content == nil:
			return invalid(at+".content", at+".content: field required")
		}
		blocks, err := decodeContent(m.Content, at+".content")
		if err != nil {
			return invalid(at+".content", err.Error())
		}
		if oerr := checkBlocks(blocks, *m.Role, at+".content"); oerr != nil {
			return oerr
		}
		r.Messages[i] = Message{Role: *m.Role, Content: blocks}
	}
	return nil
}

// checkBlocks refuses the blocks role may not send.
func checkBlocks(blocks []Block, role, at string) *openai.Error {
	for j, b := range blocks {
		p := fmt.Sprintf("%s.%d", at, j)
		switch {
		case b.Type == "tool_use" && role != RoleAssistant:
			return invalid(p, p+": tool_use blocks belong to assistant messages")
		case b.Type == "tool_result" && role != RoleUser:
			return invalid(p, p+": tool_result blocks belong to user messages")
		case b.Type == "image" && role != RoleUser:
			return invalid(p, p+": image blocks belong to user messages")
		}
	}
	return nil
}

// decodeContent reads a content value: a string (one text block) or an array of blocks.
func decodeContent(v json.RawMessage, at string) ([]Block, error) {
	v = bytes.TrimSpace(v)
	if len(v) > 0 && v[0] == '"' {
		var s string
		if err := json.Unmarshal(v, &s); err != nil {
			return nil, fmt.Errorf("%s: %s", at, errText(err))
		}
		return []Block{{Type: "text", Text: s}}, nil
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(v, &raw); err != nil || raw == nil {
		return nil, fmt.Errorf("%s: must be a string or an array of content blocks", at)
	}
	blocks := make([]Block, len(raw))
	for i, rb := range raw {
		b, err := decodeBlock(rb, fmt.Sprintf("%s.%d", at, i))
		if err != nil {
			return nil, err
		}
		blocks[i] = b
	}
	return blocks, nil
}

// wireBlock is a block as sent: cache_control and citations are accepted and not carried
// (the engine caches every prefix by itself; citations are an answer's, not a prompt's).
type wireBlock struct {
	Block
	Content      json.RawMessage `json:"content,omitempty"`
	CacheControl json.RawMessage `json:"cache_control,omitempty"`
	Citations    json.RawMessage `json:"citations,omitempty"`
}

// decodeBlock reads one content block and checks the members its type needs.
func decodeBlock(v json.RawMessage, at string) (Block, error) {
	var w wireBlock
	if err := strictUnmarshal(v, &w); err != nil {
		return Block{}, fmt.Errorf("%s: %s", at, errText(err))
	}
	b := w.Block
	if why, ok := refusedBlocks[b.Type]; ok {
		return Block{}, fmt.Errorf("%s.type: %s (%q)", at, why, b.Type)
	}
	switch b.Type {
	case "text":
	case "image":
		if err := checkImage(b.Source, at); err != nil {
			return Block{}, err
		}
	case "tool_use":
		if b.ID == "" || b.Name == "" {
			return Block{}, fmt.Errorf("%s: a tool_use block needs an id and a name", at)
		}
		if t := bytes.TrimSpace(b.Input); len(t) == 0 || t[0] != '{' {
			return Block{}, fmt.Errorf("%s.input: must be an object", at)
		}
	case "tool_result":
		if b.ToolUseID == "" {
			return Block{}, fmt.Errorf("%s.tool_use_id: field required", at)
		}
		if w.Content != nil && string(bytes.TrimSpace(w.Content)) != "null" {
			inner, err := decodeContent(w.Content, at+".content")
			if err != nil {
				return Block{}, err
			}
			for i, ib := range inner {
				if ib.Type != "text" {
					return Block{}, fmt.Errorf("%s.content.%d: a tool_result carries text blocks only, not %q", at, i, ib.Type)
				}
			}
			b.Content = inner
		}
	case "":
		return Block{}, fmt.Errorf("%s.type: field required", at)
	default:
		return Block{}, fmt.Errorf("%s.type: unknown content block type %q", at, b.Type)
	}
	if w.Content != nil && b.Type != "tool_result" {
		return Block{}, fmt.Errorf("%s.content: extra inputs are not permitted", at)
	}
	return b, nil
}

func checkImage(s *ImageSource, at string) error {
	switch {
	case s == nil:
		return fmt.Errorf("%s.source: field required", at)
	case s.Type == "base64" && s.MediaType != "" && s.Data != "":
	case s.Type == "url" && s.URL != "":
	default:
		return fmt.Errorf(`%s.source: an image source is {"type":"base64","media_type","data"} or {"type":"url","url"}`, at)
	}
	return nil
}

func (r *Request) decodeTools(v json.RawMessage) *openai.Error {
	var raw []struct {
		Type         string          `json:"type"`
		Name         string          `json:"name"`
		Description  string          `json:"description"`
		InputSchema  json.RawMessage `json:"input_schema"`
		CacheControl json.RawMessage `json:"cache_control"`
	}
	if err := strictUnmarshal(v, &raw); err != nil {
		return invalid("tools", "tools: "+errText(err)+" (server tools such as web search are not supported)")
	}
	for i, t := range raw {
		at := fmt.Sprintf("tools.%d", i)
		switch {
		case t.Type != "" && t.Type != "custom":
			return invalid(at+".type", fmt.Sprintf("%s.type: server tool %q is not supported; only client tools (custom)", at, t.Type))
		case t.Name == "":
			return invalid(at+".name", at+".name: field required")
		case len(bytes.TrimSpace(t.InputSchema)) == 0 || bytes.TrimSpace(t.InputSchema)[0] != '{':
			return invalid(at+".input_schema", at+".input_schema: must be a JSON schema object")
		}
		r.Tools = append(r.Tools, Tool{Name: t.Name, Description: t.Description, InputSchema: t.InputSchema})
	}
	return nil
}

func (r *Request) decodeToolChoice(v json.RawMessage) *openai.Error {
	var tc struct {
		Type                   string `json:"type"`
		Name                   string `json:"name"`
		DisableParallelToolUse bool   `json:"disable_parallel_tool_use"`
	}
	if err := strictUnmarshal(v, &tc); err != nil {
		return invalid("tool_choice", "tool_choice: "+errText(err))
	}
	switch {
	case tc.Type == "tool" && tc.Name == "":
		return invalid("tool_choice.name", `tool_choice.name: field required for type "tool"`)
	case tc.Type != "tool" && tc.Name != "":
		return invalid("tool_choice.name", `tool_choice.name: only type "tool" names a tool`)
	case !slices.Contains([]string{"auto", "any", "tool", "none"}, tc.Type):
		return invalid("tool_choice.type", `tool_choice.type: must be "auto", "any", "tool" or "none"`)
	}
	r.ToolChoice = &ToolChoice{Type: tc.Type, Name: tc.Name, DisableParallelToolUse: tc.DisableParallelToolUse}
	return nil
}

// strictUnmarshal decodes v into dst, refusing members dst does not name and trailing data.
func strictUnmarshal(v []byte, dst any) error {
	dec := json.NewDecoder(bytes.NewReader(v))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("trailing data after the JSON value")
	}
	return nil
}

// errText is a decoding error without encoding/json's prefix.
func errText(err error) string {
	if err == nil {
		return "not an object"
	}
	s := strings.TrimPrefix(err.Error(), "json: ")
	if strings.HasPrefix(s, "unknown field ") {
		return "extra input " + strings.TrimPrefix(s, "unknown field ") + " is not permitted"
	}
	return s
}

// invalid is a 400 invalid_request naming param.
func invalid(param, msg string) *openai.Error {
	e := openai.NewError(http.StatusBadRequest, openai.CodeInvalidRequest, msg)
	if param != "" {
		e = e.WithParam(param)
	}
	return e
}
