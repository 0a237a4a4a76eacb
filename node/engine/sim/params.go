package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/kvmesh/kvmesh/node/engine"
	"github.com/kvmesh/kvmesh/node/openai"
)

// The fields of a request the node does not read itself (engine.Request.Extra) reach the
// embedded engine too, and it must not drop them silently. The rule: a field that only shapes
// the distribution tokens are drawn from, or the prompt template, or bookkeeping, is accepted
// as a no-op once its type is right (the simulator's words are not drawn from a model, so
// top_k or chat_template_kwargs has nothing to change); a field that changes how long the
// output runs is honoured (min_tokens, ignore_eos, include_stop_str_in_output); a value that
// promises something of the output the simulator cannot keep (a JSON schema, a forced legacy
// function_call, beam search, token ids) is refused, 400 unsupported_parameter naming the field; and a
// field the engine does not know at all is refused the same way. A value of the wrong type, or
// of a shape the field never takes (tool_choice "bogus", best_of 0), is 400 invalid_parameter
// instead: no engine would run it. null is always the same as leaving the field out. docs/operating.md lists every field.

// options are what the engine honours of a request's extra fields.
type options struct {
	minTokens   int
	ignoreEOS   bool
	includeStop bool
}

// kind is the JSON type a field takes.
type kind uint8

const (
	kindAny kind = iota
	kindNumber
	kindInteger
	kindBool
	kindString
	kindObject
	kindArray
)

var kindNames = [...]string{"any JSON value", "a number", "an integer", "a boolean", "a string", "an object", "an array"}

// param is the engine's rule for one field.
type param struct {
	kind kind
	// malformed returns why the (non-null, well-typed) value v is no value the field takes at
	// all, whatever the engine (400 invalid_parameter), or "" when it is one; nil: any is.
	malformed func(v []byte) string
	// cannot returns why the engine cannot honour the (non-null, well-typed) value v, or ""
	// when it can; nil means it can honour every value.
	cannot func(v []byte) string
	// set records a value the engine honours, or returns why it is malformed (nil: a no-op).
	set func(o *options, v []byte) string
}

// Why the engine refuses what it refuses.
const (
	whyStructured = "the simulated engine's output follows no schema, regex, grammar or choice"
	whyTools      = "the simulated engine calls a tool only when tool_choice forces it"
	whyOneSeq     = "the simulated engine runs one sequence per request"
	whyTokenIDs   = "the simulated engine's words have no token ids"
	whyVocab      = "the simulated engine cannot keep words out of its output"
	whyExtension  = "an engine extension the simulated engine does not have"
	whyTextOnly   = "the simulated engine produces text only"
	whyUnknown    = "a field the simulated engine does not know: it can neither honour nor silently ignore it"
)

func always(why string) func([]byte) string { return func([]byte) string { return why } }

// oneOf takes a string among strs, or an object whose string member key is non-empty (and
// among types, when any are listed): tool_choice, function_call and response_format's
// shapes, whatever an engine makes of them.
func oneOf(field string, strs []string, key string, types ...string) func([]byte) string {
	return func(v []byte) string {
		var s string
		if json.Unmarshal(v, &s) == nil && slices.Contains(strs, s) {
			return ""
		}
		var obj map[string]json.RawMessage
		if json.Unmarshal(v, &obj) == nil && obj != nil && json.Unmarshal(obj[key], &s) == nil && s != "" &&
			(len(types) == 0 || slices.Contains(types, s)) {
			return ""
		}
		var want []string
		for _, s := range strs {
			want = append(want, strconv.Quote(s))
		}
		if len(types) > 0 {
			return fmt.Sprintf("%s must be an object whose %s is one of %s", field, key, strings.Join(types, ", "))
		}
		return fmt.Sprintf("%s must be %s, or an object with a %s", field, strings.Join(want, ", "), key)
	}
}

// atLeast takes a number of at least low.
func atLeast(field string, low float64) func([]byte) string {
	return func(v []byte) string {
		if n, _ := strconv.ParseFloat(string(v), 64); n < low {
			return fmt.Sprintf("%s must be at least %g", field, low)
		}
		return ""
	}
}

// unless refuses every value but those listed (compared as compact JSON).
func unless(why string, ok ...string) func([]byte) string {
	return func(v []byte) string {
		var b bytes.Buffer
		if json.Compact(&b, v) == nil {
			for _, o := range ok {
				if b.String() == o {
					return ""
				}
			}
		}
		return why
	}
}

// params is every field the engine knows beyond those the node reads.
var params = map[string]param{
	// Sampling knobs: the simulator's words are not drawn from a distribution to reshape.
	"top_k":              {kind: kindInteger},
	"min_p":              {kind: kindNumber},
	"presence_penalty":   {kind: kindNumber},
	"frequency_penalty":  {kind: kindNumber},
	"repetition_penalty": {kind: kindNumber},
	"length_penalty":     {kind: kindNumber},
	"logit_bias":         {kind: kindObject},
	// The simulator emits no token ids, so a stop token id is never produced.
	"stop_token_ids":                {kind: kindArray},
	"skip_special_tokens":           {kind: kindBool},
	"spaces_between_special_tokens": {kind: kindBool},
	// The prompt template: the simulator renders none.
	"chat_template":          {kind: kindString},
	"chat_template_kwargs":   {kind: kindObject},
	"add_generation_prompt":  {kind: kindBool},
	"continue_final_message": {kind: kindBool},
	"add_special_tokens":     {kind: kindBool},
	"documents":              {kind: kindArray},
	"mm_processor_kwargs":    {kind: kindObject},
	"reasoning_effort":       {kind: kindString},
	"include_reasoning":      {kind: kindBool},
	"verbosity":              {kind: kindString},
	"prediction":             {kind: kindObject},
	// Tools may be offered; the simulator answers in text, which "auto" allows, and calls a
	// tool when tool_choice forces one (tools.go).
	"tools":               {kind: kindArray},
	"functions":           {kind: kindArray},
	"parallel_tool_calls": {kind: kindBool},
	"tool_choice": {kind: kindAny, malformed: oneOf("tool_choice", []string{"none", "auto", "required"}, "type"),
		cannot: choosable},
	"function_call": {kind: kindAny, malformed: oneOf("function_call", []string{"none", "auto"}, "name"),
		cannot: unless(whyTools, `"none"`, `"auto"`)},
	// Bookkeeping.
	"metadata":                           {kind: kindObject},
	"store":                              {kind: kindBool},
	"service_tier":                       {kind: kindString},
	"prompt_cache_key":                   {kind: kindString},
	"safety_identifier":                  {kind: kindString},
	"request_id":                         {kind: kindString},
	"stream_options.include_obfuscation": {kind: kindBool},
	"guided_decoding_backend":            {kind: kindString},
	"guided_whitespace_pattern":          {kind: kindString},
	// Output length: honoured.
	"min_tokens": {kind: kindInteger, set: func(o *options, v []byte) string {
		n, _ := strconv.ParseFloat(string(v), 64)
		if n < 0 {
			return "min_tokens must not be negative"
		}
		o.minTokens = int(min(n, math.MaxInt32))
		return ""
	}},
	"ignore_eos": {kind: kindBool, set: func(o *options, v []byte) string {
		o.ignoreEOS = string(v) == "true"
		return ""
	}},
	"include_stop_str_in_output": {kind: kindBool, set: func(o *options, v []byte) string {
		o.includeStop = string(v) == "true"
		return ""
	}},
	// Promises about the output the simulator cannot keep.
	"response_format": {kind: kindObject, malformed: oneOf("response_format", nil, "type", "text", "json_object", "json_schema", "structural_tag"),
		cannot: unless(whyStructured, `{"type":"text"}`)},
	"guided_json":                {cannot: always(whyStructured)},
	"guided_regex":               {cannot: always(whyStructured)},
	"guided_choice":              {cannot: always(whyStructured)},
	"guided_grammar":             {cannot: always(whyStructured)},
	"structural_tag":             {cannot: always(whyStructured)},
	"structured_outputs":         {cannot: always(whyStructured)},
	"best_of":                    {kind: kindInteger, malformed: atLeast("best_of", 1), cannot: unless(whyOneSeq, `1`)},
	"use_beam_search":            {kind: kindBool, cannot: unless(whyOneSeq, `false`)},
	"allowed_token_ids":          {kind: kindArray, cannot: unless(whyTokenIDs, `[]`)},
	"bad_words":                  {kind: kindArray, cannot: unless(whyVocab, `[]`)},
	"return_token_ids":           {kind: kindBool, cannot: unless(whyTokenIDs, `false`)},
	"return_tokens_as_token_ids": {kind: kindBool, cannot: unless(whyTokenIDs, `false`)},
	"prompt_logprobs":            {cannot: always("the simulated engine does not score prompts (on /v1/completions, echo with logprobs does)")},
	"truncate_prompt_tokens":     {cannot: always("the simulated engine does not truncate prompts")},
	"cache_salt":                 {cannot: always("the simulated engine's prefix cache is shared by every request, not partitioned by salt")},
	"priority": {kind: kindInteger, cannot: unless("the simulated engine schedules by the priority admission "+
		"granted (X-Kvmesh-Priority, capped by the API key), not by a body field", `0`)},
	"echo":                                  {kind: kindBool, cannot: unless("the simulated engine does not echo the last message on /v1/chat/completions", `false`)},
	"suffix":                                {cannot: always("the simulated engine does not insert text after a suffix")},
	"modalities":                            {kind: kindArray, cannot: unless(whyTextOnly, `["text"]`, `[]`)},
	"audio":                                 {cannot: always(whyTextOnly)},
	"web_search_options":                    {cannot: always("the simulated engine does not search the web")},
	"logits_processors":                     {kind: kindArray, cannot: unless(whyExtension, `[]`)},
	"vllm_xargs":                            {cannot: always(whyExtension)},
	"kv_transfer_params":                    {cannot: always(whyExtension)},
	"stream_options.continuous_usage_stats": {kind: kindBool, cannot: unless("the simulated engine reports usage once, at the end of the stream", `false`)},
}

// checkRequest applies the rule above to req's extra fields, its messages' content parts
// other than text (images and audio run as the placeholders the prompt holds for them, the
// others are refused) and its messages' roles (a role outside OpenAI's chat API is refused: the
// simulator has no chat template to give it a meaning). It returns what the engine honours, or a *engine.ParamError.
func checkRequest(req *engine.Request) (options, error) {
	var o options
	for _, f := range req.Extra {
		v := bytes.TrimSpace(f.Value)
		if string(v) == "null" {
			continue
		}
		if strings.HasPrefix(f.Name, "messages[") { // a content part other than text (node/api/ingress.go)
			if typ := openai.PartType(v); typ != openai.PartImage && typ != openai.PartAudio {
				return o, &engine.ParamError{Param: f.Name, Unsupported: true,
					Reason: fmt.Sprintf("a content part of type %q: the simulated engine reads text, image_url and input_audio parts only", typ)}
			}
			continue // in the prompt as its placeholder (kvindex.Part), cached as any prompt text is
		}
		p, ok := params[f.Name]
		if !ok {
			return o, &engine.ParamError{Param: f.Name, Unsupported: true, Reason: whyUnknown}
		}
		if !p.kind.matches(v) {
			return o, &engine.ParamError{Param: f.Name, Reason: fmt.Sprintf("%s must be %s", f.Name, kindNames[p.kind])}
		}
		if p.malformed != nil {
			if why := p.malformed(v); why != "" {
				return o, &engine.ParamError{Param: f.Name, Reason: why}
			}
		}
		if p.cannot != nil {
			if why := p.cannot(v); why != "" {
				return o, &engine.ParamError{Param: f.Name, Unsupported: true, Reason: why}
			}
		}
		if p.set != nil {
			if bad := p.set(&o, v); bad != "" {
				return o, &engine.ParamError{Param: f.Name, Reason: bad}
			}
		}
	}
	limit := req.MaxTokens
	if r := req.Resume; r != nil {
		limit += r.Tokens // min_tokens counts the whole generation's
	}
	if o.minTokens > limit {
		return o, &engine.ParamError{Param: "min_tokens",
			Reason: fmt.Sprintf("min_tokens (%d) is over max_tokens (%d)", o.minTokens, limit)}
	}
	for i, r := range req.Roles {
		if !openai.KnownRole(r) {
			return o, &engine.ParamError{Param: fmt.Sprintf("messages[%d].role", i), Unsupported: true,
				Reason: fmt.Sprintf("role %q is not one of the simulated engine's (system, developer, user, assistant, tool, function)", r)}
		}
	}
	return o, nil
}

// matches reports whether the JSON value v (not null, valid) is of kind k.
func (k kind) matches(v []byte) bool {
	if len(v) == 0 {
		return false
	}
	switch k {
	case kindAny:
		return true
	case kindBool:
		return v[0] == 't' || v[0] == 'f'
	case kindString:
		return v[0] == '"'
	case kindObject:
		return v[0] == '{'
	case kindArray:
		return v[0] == '['
	}
	n, err := strconv.ParseFloat(string(v), 64)
	if err != nil {
		return false
	}
	return k == kindNumber || n == math.Trunc(n)
}
