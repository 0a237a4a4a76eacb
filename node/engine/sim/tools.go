package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"unicode/utf8"

	"github.com/kvmesh/kvmesh/kvindex"
	"github.com/kvmesh/kvmesh/node/engine"
)

// A request that forces a tool call gets one: tool_choice "required" calls the first of its
// tools, {"type":"function","function":{"name":N}} the tool named N. The answer is that one
// call and no text. Its ID is "call_" and 16 hex digits of the request's text seed; its
// arguments are a JSON object with one member per property of the function's
// parameters.properties, in name order: an integer or number property gets an integer 0..99,
// a boolean true or false, any other a word of the simulator's vocabulary (without its
// space), each drawn from the seed, so a request's call repeats with its seed. The arguments
// stream out as text does, kvindex.BytesPerToken bytes a token (the call's ID and name ride
// with the first piece); the generation finishes tool_calls, or length when max_tokens cuts
// the arguments short. tool_choice "auto" or "none" is answered in text, and so is a
// continuation (Request.Resume): a continuation continues text.

// toolCall is the call a request forces, cut into its tokens' argument pieces.
type toolCall struct {
	id, name string
	pieces   []string
}

// piece is token i's piece of the call.
func (c *toolCall) piece(i int) engine.ToolCall {
	p := engine.ToolCall{Arguments: c.pieces[i]}
	if i == 0 {
		p.ID, p.Name = c.id, c.name
	}
	return p
}

// toolWire is what the engine reads of a tool and of a named tool_choice.
type toolWire struct {
	Type     string `json:"type"`
	Function struct {
		Name       string `json:"name"`
		Parameters struct {
			Properties map[string]struct {
				Type any `json:"type"`
			} `json:"properties"`
		} `json:"parameters"`
	} `json:"function"`
}

// choosable says why the engine cannot honour tool_choice v, or "": it honours the strings and
// a named function, not another type of tool.
func choosable(v []byte) string {
	var c toolWire
	if v[0] == '"' || json.Unmarshal(v, &c) == nil && c.Type == "function" && c.Function.Name != "" {
		return ""
	}
	return "the simulated engine calls functions only: tool_choice must be \"none\", \"auto\", \"required\" or {\"type\":\"function\",\"function\":{\"name\":...}}"
}

// forcedCall is the call req forces (nil when it forces none), or a *engine.ParamError when
// its tool_choice names no tool it offers.
func forcedCall(req *engine.Request, seed uint64) (*toolCall, error) {
	if req.Resume != nil {
		return nil, nil
	}
	var choice, tools []byte
	for _, f := range req.Extra {
		switch f.Name {
		case "tool_choice":
			choice = bytes.TrimSpace(f.Value)
		case "tools":
			tools = f.Value
		}
	}
	var name string
	switch {
	case len(choice) == 0 || string(choice) == `"auto"` || string(choice) == `"none"` || string(choice) == "null":
		return nil, nil
	case string(choice) == `"required"`:
	default:
		var c toolWire
		_ = json.Unmarshal(choice, &c) // its shape was checked (params)
		name = c.Function.Name
	}
	var list []toolWire
	if len(tools) > 0 && json.Unmarshal(tools, &list) != nil {
		return nil, &engine.ParamError{Param: "tools", Reason: "tools must be an array of {\"type\":\"function\",\"function\":{\"name\":...}}"}
	}
	i := slices.IndexFunc(list, func(t toolWire) bool { return t.Function.Name != "" && (name == "" || t.Function.Name == name) })
	if i < 0 {
		why := "tool_choice is \"required\" but tools lists no function"
		if name != "" {
			why = fmt.Sprintf("tool_choice names the function %q, which tools does not list", name)
		}
		return nil, &engine.ParamError{Param: "tool_choice", Reason: why}
	}
	args := callArguments(list[i], seed)
	return &toolCall{id: fmt.Sprintf("call_%016x", seed), name: list[i].Function.Name,
		pieces: splitPieces(args)}, nil
}

// callArguments is the arguments object of a call to t, drawn from seed.
func callArguments(t toolWire, seed uint64) string {
	props := t.Function.Parameters.Properties
	names := make([]string, 0, len(props))
	for k := range props {
		names = append(names, k)
	}
	slices.Sort(names)
	b := []byte{'{'}
	for i, k := range names {
		if i > 0 {
			b = append(b, ',')
		}
		key, _ := json.Marshal(k)
		b = append(append(b, key...), ':')
		h := splitmix64(seed ^ uint64(i+1)*0x746f6f6c) // "tool"
		switch props[k].Type {
		case "integer", "number":
			b = strconv.AppendUint(b, h%100, 10)
		case "boolean":
			b = strconv.AppendBool(b, h%2 == 0)
		default:
			w := word(seed, i)
			b = strconv.AppendQuote(b, w[:len(w)-1])
		}
	}
	return string(append(b, '}'))
}

// splitPieces cuts args into pieces of kvindex.BytesPerToken bytes (stretched to a character
// boundary): a token each.
func splitPieces(args string) []string {
	var out []string
	for len(args) > 0 {
		n := min(kvindex.BytesPerToken, len(args))
		for n < len(args) && !utf8.RuneStart(args[n]) {
			n++
		}
		out = append(out, args[:n])
		args = args[n:]
	}
	return out
}
