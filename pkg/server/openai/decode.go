package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"github.com/glmctl/glmctl/pkg/server/internal/wirejson"
	"math"
	"strings"
)

// Limits enforced while decoding, so one request cannot make the server do
// unbounded work before it reaches the engine.
const (
	MaxMessages      = 4096
	MaxTools         = 256
	MaxPrompts       = 16 // prompts in one /v1/completions request
	MaxStopStrings   = 16
	MaxTopLogprobs   = 20
	MaxToolNameBytes = 64
	// MaxN caps n, the choices generated per prompt.
	MaxN = 16
	// MaxChoices caps the choices of one /v1/completions request: prompts × n.
	MaxChoices = 64
)

// samplingWire is the sampling fields as sent. Pointers tell "absent" from
// zero; wrong JSON types surface as *json.UnmarshalTypeError naming the field.
// It is decoded from the body in a pass of its own (not embedded in the
// endpoint structs, whose type errors would then name the embedded struct).
type samplingWire struct {
	Temperature       *float64 `json:"temperature"`
	TopP              *float64 `json:"top_p"`
	TopK              *int     `json:"top_k"`
	MinP              *float64 `json:"min_p"`
	PresencePenalty   *float64 `json:"presence_penalty"`
	FrequencyPenalty  *float64 `json:"frequency_penalty"`
	RepetitionPenalty *float64 `json:"repetition_penalty"`
	Seed              *int64   `json:"seed"`
}

type streamOptionsWire struct {
	IncludeUsage *bool `json:"include_usage"`
}

type chatWire struct {
	Model               *string            `json:"model"`
	Messages            []json.RawMessage  `json:"messages"`
	MaxTokens           *int               `json:"max_tokens"`
	MaxCompletionTokens *int               `json:"max_completion_tokens"`
	Stop                json.RawMessage    `json:"stop"`
	Logprobs            *bool              `json:"logprobs"`
	TopLogprobs         *int               `json:"top_logprobs"`
	N                   *int               `json:"n"`
	Stream              *bool              `json:"stream"`
	StreamOptions       *streamOptionsWire `json:"stream_options"`
	Tools               []json.RawMessage  `json:"tools"`
	ToolChoice          json.RawMessage    `json:"tool_choice"`
	ChatTemplateKwargs  *struct {
		EnableThinking *bool `json:"enable_thinking"`
		ClearThinking  *bool `json:"clear_thinking"`
	} `json:"chat_template_kwargs"`
	Thinking *struct {
		Type *string `json:"type"`
	} `json:"thinking"`
	LogitBias   map[string]float64 `json:"logit_bias"`
	IgnoreEOS   *bool              `json:"ignore_eos"`
	Speculative *bool              `json:"speculative"`
}

type messageWire struct {
	Role             *string           `json:"role"`
	Content          json.RawMessage   `json:"content"`
	ReasoningContent *string           `json:"reasoning_content"`
	ToolCalls        []json.RawMessage `json:"tool_calls"`
	ToolCallID       *string           `json:"tool_call_id"`
	Name             *string           `json:"name"`
}

type toolCallWire struct {
	ID       *string `json:"id"`
	Type     *string `json:"type"`
	Function *struct {
		Name      *string         `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	} `json:"function"`
}

type toolWire struct {
	Type     *string `json:"type"`
	Function *struct {
		Name       *string         `json:"name"`
		Parameters json.RawMessage `json:"parameters"`
	} `json:"function"`
}

type completionWire struct {
	Model         *string            `json:"model"`
	Prompt        json.RawMessage    `json:"prompt"`
	MaxTokens     *int               `json:"max_tokens"`
	Stop          json.RawMessage    `json:"stop"`
	Logprobs      *int               `json:"logprobs"`
	Echo          *bool              `json:"echo"`
	N             *int               `json:"n"`
	BestOf        *int               `json:"best_of"`
	Suffix        *string            `json:"suffix"`
	Stream        *bool              `json:"stream"`
	StreamOptions *streamOptionsWire `json:"stream_options"`
	LogitBias     map[string]float64 `json:"logit_bias"`
	IgnoreEOS     *bool              `json:"ignore_eos"`
	Speculative   *bool              `json:"speculative"`
}

// DecodeChatRequest parses and validates a chat completions body. Unknown
// fields are ignored; a wrong type or an out-of-range value is a 400 naming
// the field.
func DecodeChatRequest(body []byte) (*ChatRequest, *Error) {
	var w chatWire
	if err := unmarshal(body, &w, ""); err != nil {
		return nil, err
	}
	var sw samplingWire
	if err := unmarshal(body, &sw, ""); err != nil {
		return nil, err
	}
	req := &ChatRequest{ToolChoice: ToolChoiceAuto}
	if w.Model != nil {
		req.Model = *w.Model
	}
	var err *Error
	if req.Sampling, err = sw.validate(); err != nil {
		return nil, err
	}
	if req.MaxTokens, err = maxTokens(w.MaxCompletionTokens, "max_completion_tokens"); err != nil {
		return nil, err
	}
	if req.MaxTokens == 0 {
		if req.MaxTokens, err = maxTokens(w.MaxTokens, "max_tokens"); err != nil {
			return nil, err
		}
	}
	if req.Stop, err = decodeStop(w.Stop); err != nil {
		return nil, err
	}
	if req.N, err = decodeN(w.N); err != nil {
		return nil, err
	}
	req.Logprobs = w.Logprobs != nil && *w.Logprobs
	if w.TopLogprobs != nil {
		if *w.TopLogprobs < 0 || *w.TopLogprobs > MaxTopLogprobs {
			return nil, BadRequest("top_logprobs", "top_logprobs %d must be in [0, %d]", *w.TopLogprobs, MaxTopLogprobs)
		}
		if *w.TopLogprobs > 0 && !req.Logprobs {
			return nil, BadRequest("top_logprobs", "top_logprobs needs logprobs set to true")
		}
		req.TopLogprobs = *w.TopLogprobs
	}
	if req.Stream, req.IncludeUsage, err = streamFlags(w.Stream, w.StreamOptions); err != nil {
		return nil, err
	}
	if len(w.LogitBias) > 0 {
		return nil, BadRequest("logit_bias", "logit_bias is not supported")
	}
	if req.Format, err = decodeFormat(body); err != nil {
		return nil, err
	}
	req.IgnoreEOS = w.IgnoreEOS != nil && *w.IgnoreEOS
	req.Speculative = w.Speculative
	if kw := w.ChatTemplateKwargs; kw != nil {
		req.EnableThinking, req.ClearThinking = kw.EnableThinking, kw.ClearThinking
	}
	if th := w.Thinking; th != nil && th.Type != nil && req.EnableThinking == nil {
		switch *th.Type {
		case "enabled":
			req.EnableThinking = ptr(true)
		case "disabled":
			req.EnableThinking = ptr(false)
		default:
			return nil, BadRequest("thinking.type", "thinking.type %q must be \"enabled\" or \"disabled\"", *th.Type)
		}
	}
	if req.Tools, err = decodeTools(w.Tools); err != nil {
		return nil, err
	}
	if req.ToolChoice, req.ToolChoiceName, err = decodeToolChoice(w.ToolChoice); err != nil {
		return nil, err
	}
	switch req.ToolChoice {
	case ToolChoiceRequired:
		if len(req.Tools) == 0 {
			return nil, BadRequest("tool_choice", "tool_choice \"required\" needs tools")
		}
	case ToolChoiceFunction:
		found := false
		for _, t := range req.Tools {
			found = found || t.Name == req.ToolChoiceName
		}
		if !found {
			return nil, BadRequest("tool_choice.function.name", "tool_choice names function %q, which is not among the tools", req.ToolChoiceName)
		}
	}
	if req.Messages, err = decodeMessages(w.Messages); err != nil {
		return nil, err
	}
	return req, nil
}

// DecodeCompletionRequest parses and validates a completions body.
func DecodeCompletionRequest(body []byte) (*CompletionRequest, *Error) {
	var w completionWire
	if err := unmarshal(body, &w, ""); err != nil {
		return nil, err
	}
	var sw samplingWire
	if err := unmarshal(body, &sw, ""); err != nil {
		return nil, err
	}
	req := &CompletionRequest{}
	if w.Model != nil {
		req.Model = *w.Model
	}
	var err *Error
	if req.Sampling, err = sw.validate(); err != nil {
		return nil, err
	}
	if req.MaxTokens, err = maxTokens(w.MaxTokens, "max_tokens"); err != nil {
		return nil, err
	}
	if req.Stop, err = decodeStop(w.Stop); err != nil {
		return nil, err
	}
	if req.N, err = decodeN(w.N); err != nil {
		return nil, err
	}
	if err := checkN(w.BestOf, "best_of"); err != nil {
		return nil, err
	}
	if w.Suffix != nil && *w.Suffix != "" {
		return nil, BadRequest("suffix", "suffix is not supported")
	}
	if len(w.LogitBias) > 0 {
		return nil, BadRequest("logit_bias", "logit_bias is not supported")
	}
	if w.Logprobs != nil {
		if *w.Logprobs < 0 || *w.Logprobs > MaxTopLogprobs {
			return nil, BadRequest("logprobs", "logprobs %d must be in [0, %d]", *w.Logprobs, MaxTopLogprobs)
		}
		req.Logprobs = w.Logprobs
	}
	req.Echo = w.Echo != nil && *w.Echo
	if req.Echo && req.Logprobs != nil {
		return nil, BadRequest("echo", "echo together with logprobs is not supported (prompt logprobs are not computed)")
	}
	if req.Stream, req.IncludeUsage, err = streamFlags(w.Stream, w.StreamOptions); err != nil {
		return nil, err
	}
	req.IgnoreEOS = w.IgnoreEOS != nil && *w.IgnoreEOS
	req.Speculative = w.Speculative
	if req.Format, err = decodeFormat(body); err != nil {
		return nil, err
	}
	if req.Prompts, err = decodePrompt(w.Prompt); err != nil {
		return nil, err
	}
	if c := len(req.Prompts) * req.N; c > MaxChoices {
		return nil, BadRequest("n", "n %d with %d prompts makes %d choices; the limit is %d", req.N, len(req.Prompts), c, MaxChoices)
	}
	return req, nil
}

func (w samplingWire) validate() (Sampling, *Error) {
	s := Sampling{Temperature: w.Temperature, TopP: w.TopP, TopK: w.TopK, MinP: w.MinP,
		PresencePenalty: w.PresencePenalty, FrequencyPenalty: w.FrequencyPenalty,
		RepetitionPenalty: w.RepetitionPenalty, Seed: w.Seed}
	inRange := func(p *float64, name string, lo, hi float64, loOpen bool) *Error {
		if p == nil {
			return nil
		}
		v := *p
		ok := !math.IsNaN(v) && v <= hi && (v > lo || (!loOpen && v == lo))
		if ok {
			return nil
		}
		open := "["
		if loOpen {
			open = "("
		}
		return BadRequest(name, "%s %v must be in %s%g, %g]", name, v, open, lo, hi)
	}
	for _, c := range []struct {
		p      *float64
		name   string
		lo, hi float64
		open   bool
	}{
		{w.Temperature, "temperature", 0, 2, false},
		{w.TopP, "top_p", 0, 1, true},
		{w.MinP, "min_p", 0, 1, false},
		{w.PresencePenalty, "presence_penalty", -2, 2, false},
		{w.FrequencyPenalty, "frequency_penalty", -2, 2, false},
		{w.RepetitionPenalty, "repetition_penalty", 0, 10, true},
	} {
		if err := inRange(c.p, c.name, c.lo, c.hi, c.open); err != nil {
			return s, err
		}
	}
	if w.TopK != nil && *w.TopK < -1 {
		return s, BadRequest("top_k", "top_k %d must be -1 or 0 (disabled) or a positive count", *w.TopK)
	}
	return s, nil
}

func maxTokens(p *int, name string) (int, *Error) {
	if p == nil {
		return 0, nil
	}
	if *p < 1 {
		return 0, BadRequest(name, "%s %d must be at least 1", name, *p)
	}
	return *p, nil
}

// decodeN reads n: absent means 1; it must be in [1, MaxN].
func decodeN(p *int) (int, *Error) {
	if p == nil {
		return 1, nil
	}
	if *p < 1 || *p > MaxN {
		return 0, BadRequest("n", "n %d must be in [1, %d]", *p, MaxN)
	}
	return *p, nil
}

func checkN(p *int, name string) *Error {
	if p == nil || *p == 1 {
		return nil
	}
	if *p < 1 {
		return BadRequest(name, "%s %d must be at least 1", name, *p)
	}
	return BadRequest(name, "%s %d is not supported: only %s=1", name, *p, name)
}

func streamFlags(stream *bool, opts *streamOptionsWire) (bool, bool, *Error) {
	on := stream != nil && *stream
	if opts == nil {
		return on, false, nil
	}
	if !on {
		return false, false, BadRequest("stream_options", "stream_options is only allowed with stream set to true")
	}
	return true, opts.IncludeUsage != nil && *opts.IncludeUsage, nil
}

func decodeStop(raw json.RawMessage) ([]string, *Error) {
	if isNull(raw) {
		return nil, nil
	}
	var one string
	if json.Unmarshal(raw, &one) == nil {
		if one == "" {
			return nil, BadRequest("stop", "stop: a stop string must not be empty")
		}
		return []string{one}, nil
	}
	var many []string
	if err := json.Unmarshal(raw, &many); err != nil {
		return nil, BadRequest("stop", "stop: expected a string or an array of strings")
	}
	if len(many) > MaxStopStrings {
		return nil, BadRequest("stop", "stop: %d stop strings; the limit is %d", len(many), MaxStopStrings)
	}
	for i, s := range many {
		if s == "" {
			return nil, BadRequest(fmt.Sprintf("stop[%d]", i), "stop[%d]: a stop string must not be empty", i)
		}
	}
	return many, nil
}

func decodeTools(raws []json.RawMessage) ([]Tool, *Error) {
	if len(raws) > MaxTools {
		return nil, BadRequest("tools", "tools: %d tools; the limit is %d", len(raws), MaxTools)
	}
	var tools []Tool
	for i, raw := range raws {
		param := fmt.Sprintf("tools[%d]", i)
		var w toolWire
		if err := unmarshal(raw, &w, param+"."); err != nil {
			return nil, err
		}
		if w.Type == nil || *w.Type != "function" {
			return nil, BadRequest(param+".type", "%s.type must be \"function\"", param)
		}
		if w.Function == nil || w.Function.Name == nil {
			return nil, BadRequest(param+".function.name", "%s.function.name is required", param)
		}
		name := *w.Function.Name
		if err := checkToolName(name); err != nil {
			return nil, BadRequest(param+".function.name", "%s.function.name %q: %v", param, name, err)
		}
		if p := w.Function.Parameters; !isNull(p) && bytes.TrimSpace(p)[0] != '{' {
			return nil, BadRequest(param+".function.parameters", "%s.function.parameters must be a JSON schema object", param)
		}
		tool := Tool{Name: name, Raw: bytes.Clone(bytes.TrimSpace(raw))}
		if p := w.Function.Parameters; !isNull(p) {
			tool.Parameters = bytes.Clone(p)
		}
		tools = append(tools, tool)
	}
	return tools, nil
}

// checkToolName applies OpenAI's rule for function names.
func checkToolName(name string) error {
	if name == "" || len(name) > MaxToolNameBytes {
		return fmt.Errorf("must be 1 to %d characters", MaxToolNameBytes)
	}
	for _, r := range name {
		if !(r == '_' || r == '-' || r == '.' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return fmt.Errorf("may only hold letters, digits, '_', '-' and '.'")
		}
	}
	return nil
}

func decodeToolChoice(raw json.RawMessage) (ToolChoice, string, *Error) {
	if isNull(raw) {
		return ToolChoiceAuto, "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		switch s {
		case "auto":
			return ToolChoiceAuto, "", nil
		case "none":
			return ToolChoiceNone, "", nil
		case "required":
			return ToolChoiceRequired, "", nil
		}
		return "", "", BadRequest("tool_choice", "tool_choice %q must be \"auto\", \"none\", \"required\" or an object naming a function", s)
	}
	var obj struct {
		Type     *string `json:"type"`
		Function *struct {
			Name *string `json:"name"`
		} `json:"function"`
	}
	if json.Unmarshal(raw, &obj) == nil {
		if obj.Type == nil || *obj.Type != "function" {
			return "", "", BadRequest("tool_choice.type", "tool_choice.type must be \"function\"")
		}
		if obj.Function == nil || obj.Function.Name == nil {
			return "", "", BadRequest("tool_choice.function.name", "tool_choice.function.name is required")
		}
		return ToolChoiceFunction, *obj.Function.Name, nil
	}
	return "", "", BadRequest("tool_choice", "tool_choice: expected a string or an object")
}

func decodeMessages(raws []json.RawMessage) ([]Message, *Error) {
	if len(raws) == 0 {
		return nil, BadRequest("messages", "messages is required and must not be empty")
	}
	if len(raws) > MaxMessages {
		return nil, BadRequest("messages", "messages: %d messages; the limit is %d", len(raws), MaxMessages)
	}
	msgs := make([]Message, 0, len(raws))
	for i, raw := range raws {
		m, err := decodeMessage(raw, fmt.Sprintf("messages[%d]", i))
		if err != nil {
			return nil, err
		}
		msgs = append(msgs, m)
	}
	return msgs, nil
}

func decodeMessage(raw json.RawMessage, param string) (Message, *Error) {
	var w messageWire
	if isNull(raw) {
		return Message{}, BadRequest(param, "%s: expected an object, got null", param)
	}
	if err := unmarshal(raw, &w, param+"."); err != nil {
		return Message{}, err
	}
	var m Message
	if w.Role == nil {
		return m, BadRequest(param+".role", "%s.role is required", param)
	}
	switch *w.Role {
	case "system", "developer":
		m.Role = "system"
	case "user", "assistant", "tool":
		m.Role = *w.Role
	default:
		return m, BadRequest(param+".role", "%s.role %q must be one of system, developer, user, assistant, tool", param, *w.Role)
	}
	var err *Error
	if m.Content, err = decodeContent(w.Content, param+".content"); err != nil {
		return m, err
	}
	m.ReasoningContent = w.ReasoningContent
	if w.ToolCallID != nil {
		m.ToolCallID = *w.ToolCallID
	}
	if w.Name != nil {
		m.Name = *w.Name
	}
	if len(w.ToolCalls) > 0 && m.Role != "assistant" {
		return m, BadRequest(param+".tool_calls", "%s.tool_calls is only allowed on assistant messages", param)
	}
	for j, rawCall := range w.ToolCalls {
		call, err := decodeMessageToolCall(rawCall, fmt.Sprintf("%s.tool_calls[%d]", param, j))
		if err != nil {
			return m, err
		}
		m.ToolCalls = append(m.ToolCalls, call)
	}
	return m, nil
}

func decodeMessageToolCall(raw json.RawMessage, param string) (MessageToolCall, *Error) {
	var w toolCallWire
	if err := unmarshal(raw, &w, param+"."); err != nil {
		return MessageToolCall{}, err
	}
	var c MessageToolCall
	if w.ID != nil {
		c.ID = *w.ID
	}
	if w.Type != nil && *w.Type != "function" {
		return c, BadRequest(param+".type", "%s.type must be \"function\"", param)
	}
	if w.Function == nil || w.Function.Name == nil || *w.Function.Name == "" {
		return c, BadRequest(param+".function.name", "%s.function.name is required", param)
	}
	c.Name = *w.Function.Name
	args := bytes.TrimSpace(w.Function.Arguments)
	if len(args) > 0 && args[0] == '"' {
		var s string
		if err := json.Unmarshal(args, &s); err != nil {
			return c, BadRequest(param+".function.arguments", "%s.function.arguments: %v", param, err)
		}
		args = bytes.TrimSpace([]byte(s))
	}
	if len(args) == 0 || bytes.Equal(args, []byte("null")) {
		args = []byte("{}")
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(args, &obj); err != nil || obj == nil {
		return c, BadRequest(param+".function.arguments", "%s.function.arguments must be a JSON object (or a string holding one)", param)
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, args); err != nil {
		return c, BadRequest(param+".function.arguments", "%s.function.arguments: %v", param, err)
	}
	c.Arguments = buf.Bytes()
	return c, nil
}

// decodeContent flattens a message content (a string, null, or an array of
// parts) to text. Only text parts are accepted: the model is text-only, and
// silently dropping an image would answer a different question.
func decodeContent(raw json.RawMessage, param string) (string, *Error) {
	if isNull(raw) {
		return "", nil
	}
	raw = bytes.TrimSpace(raw)
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", BadRequest(param, "%s: %v", param, err)
		}
		return s, nil
	case '[':
		var parts []json.RawMessage
		if err := json.Unmarshal(raw, &parts); err != nil {
			return "", BadRequest(param, "%s: %v", param, err)
		}
		var sb strings.Builder
		for j, part := range parts {
			pp := fmt.Sprintf("%s[%d]", param, j)
			part = bytes.TrimSpace(part)
			if len(part) > 0 && part[0] == '"' {
				var s string
				if err := json.Unmarshal(part, &s); err != nil {
					return "", BadRequest(pp, "%s: %v", pp, err)
				}
				sb.WriteString(s)
				continue
			}
			var w struct {
				Type *string `json:"type"`
				Text *string `json:"text"`
			}
			if isNull(part) {
				return "", BadRequest(pp, "%s: expected a content part object, got null", pp)
			}
			if err := unmarshal(part, &w, pp+"."); err != nil {
				return "", err
			}
			if w.Type == nil {
				return "", BadRequest(pp+".type", "%s.type is required", pp)
			}
			if *w.Type != "text" {
				return "", BadRequest(pp+".type", "%s.type %q is not supported: this model reads text only", pp, *w.Type)
			}
			if w.Text == nil {
				return "", BadRequest(pp+".text", "%s.text is required for a text part", pp)
			}
			sb.WriteString(*w.Text)
		}
		return sb.String(), nil
	}
	return "", BadRequest(param, "%s: expected a string, an array of content parts or null", param)
}

// decodePrompt reads a completions prompt: a string, an array of strings, an
// array of token ids, or an array of arrays of token ids.
func decodePrompt(raw json.RawMessage) ([]Prompt, *Error) {
	if isNull(raw) {
		return nil, BadRequest("prompt", "prompt is required")
	}
	raw = bytes.TrimSpace(raw)
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, BadRequest("prompt", "prompt: %v", err)
		}
		return []Prompt{{Text: s}}, nil
	}
	var items []json.RawMessage
	if raw[0] != '[' || json.Unmarshal(raw, &items) != nil {
		return nil, BadRequest("prompt", "prompt: expected a string, an array of strings, an array of token ids or an array of token-id arrays")
	}
	if len(items) == 0 {
		return nil, BadRequest("prompt", "prompt must not be empty")
	}
	first := bytes.TrimSpace(items[0])
	switch {
	case len(first) > 0 && first[0] == '"':
		if len(items) > MaxPrompts {
			return nil, BadRequest("prompt", "prompt: %d prompts; the limit is %d", len(items), MaxPrompts)
		}
		out := make([]Prompt, len(items))
		for i, it := range items {
			if err := json.Unmarshal(it, &out[i].Text); err != nil {
				return nil, BadRequest(fmt.Sprintf("prompt[%d]", i), "prompt[%d]: expected a string like the other prompts", i)
			}
		}
		return out, nil
	case len(first) > 0 && first[0] == '[':
		if len(items) > MaxPrompts {
			return nil, BadRequest("prompt", "prompt: %d prompts; the limit is %d", len(items), MaxPrompts)
		}
		out := make([]Prompt, len(items))
		for i, it := range items {
			ids, err := tokenIDs(it, fmt.Sprintf("prompt[%d]", i))
			if err != nil {
				return nil, err
			}
			out[i] = Prompt{TokenIDs: ids, IsTokens: true}
		}
		return out, nil
	default:
		ids, err := tokenIDs(raw, "prompt")
		if err != nil {
			return nil, err
		}
		return []Prompt{{TokenIDs: ids, IsTokens: true}}, nil
	}
}

func tokenIDs(raw json.RawMessage, param string) ([]int32, *Error) {
	var ids []int64
	if err := json.Unmarshal(raw, &ids); err != nil {
		return nil, BadRequest(param, "%s: expected an array of integer token ids", param)
	}
	if len(ids) == 0 {
		return nil, BadRequest(param, "%s must not be empty", param)
	}
	out := make([]int32, len(ids))
	for i, id := range ids {
		if id < 0 || id > math.MaxInt32 {
			return nil, BadRequest(param, "%s[%d]: token id %d is out of range", param, i, id)
		}
		out[i] = int32(id)
	}
	return out, nil
}

func ptr[T any](v T) *T { return &v }

// unmarshal decodes data into v and turns decoding errors into 400s; prefix
// is prepended to field paths ("messages[3].").
func unmarshal(data []byte, v any, prefix string) *Error {
	if param, msg, failed := wirejson.Unmarshal(data, v, prefix); failed {
		return BadRequest(param, "%s", msg)
	}
	return nil
}

func isNull(raw json.RawMessage) bool { return wirejson.IsNull(raw) }
