package anthropic

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
	MaxBlocks        = 4096 // content blocks of one message
	MaxTools         = 256
	MaxStopSequences = 16
	MaxToolNameBytes = 128
)

type promptWire struct {
	Model      *string           `json:"model"`
	Messages   []json.RawMessage `json:"messages"`
	System     json.RawMessage   `json:"system"`
	Tools      []json.RawMessage `json:"tools"`
	ToolChoice json.RawMessage   `json:"tool_choice"`
	Thinking   json.RawMessage   `json:"thinking"`
}

type messagesWire struct {
	MaxTokens     *int            `json:"max_tokens"`
	StopSequences json.RawMessage `json:"stop_sequences"`
	Temperature   *float64        `json:"temperature"`
	TopP          *float64        `json:"top_p"`
	TopK          *int            `json:"top_k"`
	Stream        *bool           `json:"stream"`
	OutputConfig  *struct {
		Format json.RawMessage `json:"format"`
	} `json:"output_config"`
}

type messageWire struct {
	Role    *string         `json:"role"`
	Content json.RawMessage `json:"content"`
}

type blockWire struct {
	Type      *string         `json:"type"`
	Text      *string         `json:"text"`
	Thinking  *string         `json:"thinking"`
	ID        *string         `json:"id"`
	Name      *string         `json:"name"`
	Input     json.RawMessage `json:"input"`
	ToolUseID *string         `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
	IsError   *bool           `json:"is_error"`
}

type toolWire struct {
	Type        *string         `json:"type"`
	Name        *string         `json:"name"`
	Description *string         `json:"description"`
	InputSchema json.RawMessage `json:"input_schema"`
}

type toolChoiceWire struct {
	Type *string `json:"type"`
	Name *string `json:"name"`
}

type thinkingWire struct {
	Type         *string `json:"type"`
	BudgetTokens *int    `json:"budget_tokens"`
}

// DecodeMessagesRequest parses and validates a /v1/messages body. Unknown
// fields (metadata, service_tier, cache_control, ...) are ignored; a wrong
// type or an out-of-range value is a 400 whose message starts with the
// field's path.
func DecodeMessagesRequest(body []byte) (*MessagesRequest, *Error) {
	var w messagesWire
	if err := unmarshal(body, &w, ""); err != nil {
		return nil, err
	}
	model, p, err := decodePrompt(body)
	if err != nil {
		return nil, err
	}
	req := &MessagesRequest{Model: model, Prompt: *p}
	if w.MaxTokens == nil {
		return nil, BadRequest("max_tokens", "max_tokens: field required")
	}
	if *w.MaxTokens < 1 {
		return nil, BadRequest("max_tokens", "max_tokens: %d must be at least 1", *w.MaxTokens)
	}
	req.MaxTokens = *w.MaxTokens
	if req.StopSequences, err = decodeStopSequences(w.StopSequences); err != nil {
		return nil, err
	}
	if t := w.Temperature; t != nil && (math.IsNaN(*t) || *t < 0 || *t > 1) {
		return nil, BadRequest("temperature", "temperature: %v must be in [0, 1]", *t)
	}
	if t := w.TopP; t != nil && (math.IsNaN(*t) || *t <= 0 || *t > 1) {
		return nil, BadRequest("top_p", "top_p: %v must be in (0, 1]", *t)
	}
	if k := w.TopK; k != nil && *k < 0 {
		return nil, BadRequest("top_k", "top_k: %d must be >= 0 (0 = off)", *k)
	}
	if oc := w.OutputConfig; oc != nil && !isNull(oc.Format) {
		var f struct {
			Type   *string         `json:"type"`
			Schema json.RawMessage `json:"schema"`
		}
		if err := unmarshal(oc.Format, &f, "output_config.format."); err != nil {
			return nil, err
		}
		if f.Type == nil || *f.Type != "json_schema" {
			return nil, BadRequest("output_config.format.type", "output_config.format.type: must be \"json_schema\"")
		}
		if isNull(f.Schema) || len(f.Schema) == 0 || !json.Valid(f.Schema) {
			return nil, BadRequest("output_config.format.schema", "output_config.format.schema: a JSON schema is required")
		}
		req.OutputSchema = f.Schema
	}
	req.Temperature, req.TopP, req.TopK = w.Temperature, w.TopP, w.TopK
	req.Stream = w.Stream != nil && *w.Stream
	return req, nil
}

// DecodeCountTokensRequest parses and validates a
// /v1/messages/count_tokens body (the prompt fields of a messages request).
func DecodeCountTokensRequest(body []byte) (*CountTokensRequest, *Error) {
	model, p, err := decodePrompt(body)
	if err != nil {
		return nil, err
	}
	return &CountTokensRequest{Model: model, Prompt: *p}, nil
}

func decodePrompt(body []byte) (string, *Prompt, *Error) {
	var w promptWire
	if err := unmarshal(body, &w, ""); err != nil {
		return "", nil, err
	}
	model := ""
	if w.Model != nil {
		model = *w.Model
	}
	p := &Prompt{ToolChoice: ToolChoiceAuto}
	var err *Error
	if p.System, err = decodeSystem(w.System); err != nil {
		return "", nil, err
	}
	if p.Tools, err = decodeTools(w.Tools); err != nil {
		return "", nil, err
	}
	if p.ToolChoice, p.ToolChoiceName, err = decodeToolChoice(w.ToolChoice); err != nil {
		return "", nil, err
	}
	switch p.ToolChoice {
	case ToolChoiceAny:
		if len(p.Tools) == 0 {
			return "", nil, BadRequest("tool_choice.type", "tool_choice.type: \"any\" needs tools")
		}
	case ToolChoiceTool:
		found := false
		for _, t := range p.Tools {
			found = found || t.Name == p.ToolChoiceName
		}
		if !found {
			return "", nil, BadRequest("tool_choice.name", "tool_choice.name: %q is not among the tools", p.ToolChoiceName)
		}
	}
	if p.Thinking, err = decodeThinking(w.Thinking); err != nil {
		return "", nil, err
	}
	if p.Messages, err = decodeMessages(w.Messages); err != nil {
		return "", nil, err
	}
	if p.Prefill() {
		last := len(p.Messages) - 1
		for j, b := range p.Messages[last].Blocks {
			if b.Type != BlockText {
				return "", nil, BadRequest(fmt.Sprintf("messages.%d.content.%d.type", last, j),
					"messages.%d.content.%d.type: a final assistant message (prefill) may only hold text blocks, not %s", last, j, b.Type)
			}
		}
		if p.Thinking != nil && *p.Thinking {
			return "", nil, BadRequest(fmt.Sprintf("messages.%d", last),
				"messages.%d: a final assistant message (prefill) cannot be continued with thinking enabled: the answer continues the prefilled text", last)
		}
	}
	return model, p, nil
}

// decodeText reads a string, or an array of text blocks joined with "\n"
// (the shape of system and of tool_result content). Other block types are
// refused: the model reads text only.
func decodeText(raw json.RawMessage, param string) (string, *Error) {
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
		texts := make([]string, 0, len(parts))
		for j, part := range parts {
			pp := fmt.Sprintf("%s.%d", param, j)
			if isNull(part) {
				return "", BadRequest(pp, "%s: expected a content block, got null", pp)
			}
			var w blockWire
			if err := unmarshal(part, &w, pp+"."); err != nil {
				return "", err
			}
			if w.Type == nil {
				return "", BadRequest(pp+".type", "%s.type: field required", pp)
			}
			if *w.Type != BlockText {
				return "", BadRequest(pp+".type", "%s.type: %q is not supported here: only text blocks (this model reads text only)", pp, *w.Type)
			}
			if w.Text == nil {
				return "", BadRequest(pp+".text", "%s.text: field required", pp)
			}
			texts = append(texts, *w.Text)
		}
		return strings.Join(texts, "\n"), nil
	}
	return "", BadRequest(param, "%s: expected a string or an array of text blocks", param)
}

func decodeSystem(raw json.RawMessage) (string, *Error) {
	return decodeText(raw, "system")
}

func decodeStopSequences(raw json.RawMessage) ([]string, *Error) {
	if isNull(raw) {
		return nil, nil
	}
	var seqs []string
	if err := json.Unmarshal(raw, &seqs); err != nil {
		return nil, BadRequest("stop_sequences", "stop_sequences: expected an array of strings")
	}
	if len(seqs) > MaxStopSequences {
		return nil, BadRequest("stop_sequences", "stop_sequences: %d sequences; the limit is %d", len(seqs), MaxStopSequences)
	}
	for i, s := range seqs {
		if s == "" {
			return nil, BadRequest(fmt.Sprintf("stop_sequences.%d", i), "stop_sequences.%d: a stop sequence must not be empty", i)
		}
	}
	return seqs, nil
}

func decodeTools(raws []json.RawMessage) ([]Tool, *Error) {
	if len(raws) > MaxTools {
		return nil, BadRequest("tools", "tools: %d tools; the limit is %d", len(raws), MaxTools)
	}
	var tools []Tool
	seen := map[string]bool{}
	for i, raw := range raws {
		param := fmt.Sprintf("tools.%d", i)
		if isNull(raw) {
			return nil, BadRequest(param, "%s: expected a tool object, got null", param)
		}
		var w toolWire
		if err := unmarshal(raw, &w, param+"."); err != nil {
			return nil, err
		}
		if w.Type != nil && *w.Type != "custom" {
			return nil, BadRequest(param+".type", "%s.type: %q is not supported: only custom tools (name, description, input_schema); glmctl runs no server tools", param, *w.Type)
		}
		if w.Name == nil {
			return nil, BadRequest(param+".name", "%s.name: field required", param)
		}
		if err := checkToolName(*w.Name); err != nil {
			return nil, BadRequest(param+".name", "%s.name: %q %v", param, *w.Name, err)
		}
		if seen[*w.Name] {
			return nil, BadRequest(param+".name", "%s.name: tool names must be unique (%q is repeated)", param, *w.Name)
		}
		seen[*w.Name] = true
		schema := bytes.TrimSpace(w.InputSchema)
		if isNull(schema) {
			return nil, BadRequest(param+".input_schema", "%s.input_schema: field required", param)
		}
		if schema[0] != '{' {
			return nil, BadRequest(param+".input_schema", "%s.input_schema: must be a JSON schema object", param)
		}
		tools = append(tools, Tool{Name: *w.Name, Description: w.Description, InputSchema: bytes.Clone(schema)})
	}
	return tools, nil
}

// checkToolName applies Anthropic's rule for tool names.
func checkToolName(name string) error {
	if name == "" || len(name) > MaxToolNameBytes {
		return fmt.Errorf("must be 1 to %d characters", MaxToolNameBytes)
	}
	for _, r := range name {
		if !(r == '_' || r == '-' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return fmt.Errorf("may only hold letters, digits, '_' and '-'")
		}
	}
	return nil
}

func decodeToolChoice(raw json.RawMessage) (ToolChoice, string, *Error) {
	if isNull(raw) {
		return ToolChoiceAuto, "", nil
	}
	var w toolChoiceWire
	if err := unmarshal(raw, &w, "tool_choice."); err != nil {
		return "", "", err
	}
	if w.Type == nil {
		return "", "", BadRequest("tool_choice.type", "tool_choice.type: field required")
	}
	switch *w.Type {
	case "auto":
		return ToolChoiceAuto, "", nil
	case "none":
		return ToolChoiceNone, "", nil
	case "any":
		return ToolChoiceAny, "", nil
	case "tool":
		if w.Name == nil || *w.Name == "" {
			return "", "", BadRequest("tool_choice.name", "tool_choice.name: field required for type \"tool\"")
		}
		return ToolChoiceTool, *w.Name, nil
	}
	return "", "", BadRequest("tool_choice.type", "tool_choice.type: %q must be \"auto\", \"none\", \"any\" or \"tool\"", *w.Type)
}

func decodeThinking(raw json.RawMessage) (*bool, *Error) {
	if isNull(raw) {
		return nil, nil
	}
	var w thinkingWire
	if err := unmarshal(raw, &w, "thinking."); err != nil {
		return nil, err
	}
	if w.Type == nil {
		return nil, BadRequest("thinking.type", "thinking.type: field required")
	}
	on := true
	switch *w.Type {
	case "enabled", "adaptive":
	case "disabled":
		on = false
	default:
		return nil, BadRequest("thinking.type", "thinking.type: %q must be \"enabled\", \"adaptive\" or \"disabled\"", *w.Type)
	}
	if w.BudgetTokens != nil && *w.BudgetTokens < 1 {
		return nil, BadRequest("thinking.budget_tokens", "thinking.budget_tokens: %d must be at least 1", *w.BudgetTokens)
	}
	return &on, nil
}

func decodeMessages(raws []json.RawMessage) ([]InputMessage, *Error) {
	if len(raws) == 0 {
		return nil, BadRequest("messages", "messages: field required and must not be empty")
	}
	if len(raws) > MaxMessages {
		return nil, BadRequest("messages", "messages: %d messages; the limit is %d", len(raws), MaxMessages)
	}
	msgs := make([]InputMessage, 0, len(raws))
	for i, raw := range raws {
		m, err := decodeMessage(raw, fmt.Sprintf("messages.%d", i))
		if err != nil {
			return nil, err
		}
		msgs = append(msgs, m)
	}
	return msgs, nil
}

func decodeMessage(raw json.RawMessage, param string) (InputMessage, *Error) {
	var m InputMessage
	if isNull(raw) {
		return m, BadRequest(param, "%s: expected a message object, got null", param)
	}
	var w messageWire
	if err := unmarshal(raw, &w, param+"."); err != nil {
		return m, err
	}
	if w.Role == nil {
		return m, BadRequest(param+".role", "%s.role: field required", param)
	}
	if *w.Role != RoleUser && *w.Role != RoleAssistant {
		return m, BadRequest(param+".role", "%s.role: %q must be \"user\" or \"assistant\" (the system prompt is the top-level system field)", param, *w.Role)
	}
	m.Role = *w.Role
	cp := param + ".content"
	content := bytes.TrimSpace(w.Content)
	switch {
	case isNull(content):
		return m, BadRequest(cp, "%s: field required", cp)
	case content[0] == '"':
		var s string
		if err := json.Unmarshal(content, &s); err != nil {
			return m, BadRequest(cp, "%s: %v", cp, err)
		}
		m.Blocks = []InputBlock{{Type: BlockText, Text: s}}
		return m, nil
	case content[0] != '[':
		return m, BadRequest(cp, "%s: expected a string or an array of content blocks", cp)
	}
	var parts []json.RawMessage
	if err := json.Unmarshal(content, &parts); err != nil {
		return m, BadRequest(cp, "%s: %v", cp, err)
	}
	if len(parts) > MaxBlocks {
		return m, BadRequest(cp, "%s: %d blocks; the limit is %d", cp, len(parts), MaxBlocks)
	}
	for j, part := range parts {
		b, err := decodeBlock(part, m.Role, fmt.Sprintf("%s.%d", cp, j))
		if err != nil {
			return m, err
		}
		m.Blocks = append(m.Blocks, b)
	}
	return m, nil
}

func decodeBlock(raw json.RawMessage, role, param string) (InputBlock, *Error) {
	var b InputBlock
	if isNull(raw) {
		return b, BadRequest(param, "%s: expected a content block, got null", param)
	}
	var w blockWire
	if err := unmarshal(raw, &w, param+"."); err != nil {
		return b, err
	}
	if w.Type == nil {
		return b, BadRequest(param+".type", "%s.type: field required", param)
	}
	b.Type = *w.Type
	only := func(want string) *Error {
		if role != want {
			return BadRequest(param+".type", "%s.type: %s blocks belong in %s messages, not %s", param, b.Type, want, role)
		}
		return nil
	}
	required := func(p *string, field string) (string, *Error) {
		if p == nil {
			return "", BadRequest(param+"."+field, "%s.%s: field required", param, field)
		}
		return *p, nil
	}
	var err *Error
	switch b.Type {
	case BlockText:
		b.Text, err = required(w.Text, "text")
	case BlockThinking:
		if err = only(RoleAssistant); err == nil {
			b.Text, err = required(w.Thinking, "thinking")
		}
	case BlockRedactedThinking:
		err = only(RoleAssistant)
	case BlockToolUse:
		if err = only(RoleAssistant); err != nil {
			break
		}
		if b.ID, err = required(w.ID, "id"); err != nil {
			break
		}
		if b.Name, err = required(w.Name, "name"); err != nil {
			break
		}
		b.Input, err = decodeToolInput(w.Input, param+".input")
	case BlockToolResult:
		if err = only(RoleUser); err != nil {
			break
		}
		if b.ToolUseID, err = required(w.ToolUseID, "tool_use_id"); err != nil {
			break
		}
		b.Text, err = decodeText(w.Content, param+".content")
		b.IsError = w.IsError != nil && *w.IsError
	case "image", "document", "search_result", "container_upload":
		err = BadRequest(param+".type", "%s.type: %q blocks are not supported: this model reads text only", param, b.Type)
	default:
		err = BadRequest(param+".type", "%s.type: %q is not a supported content block (text, thinking, redacted_thinking, tool_use, tool_result)", param, b.Type)
	}
	return b, err
}

// decodeToolInput checks that a tool_use input is a JSON object and
// compacts it (member order kept).
func decodeToolInput(raw json.RawMessage, param string) (json.RawMessage, *Error) {
	if isNull(raw) {
		return json.RawMessage(defaultToolInput), nil
	}
	raw = bytes.TrimSpace(raw)
	if raw[0] != '{' {
		return nil, BadRequest(param, "%s: must be a JSON object", param)
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return nil, BadRequest(param, "%s: %v", param, err)
	}
	return buf.Bytes(), nil
}

// unmarshal decodes a wire value, naming the offending parameter on failure.
func unmarshal(data []byte, v any, prefix string) *Error {
	if param, msg, failed := wirejson.Unmarshal(data, v, prefix); failed {
		return BadRequest(param, "%s", msg)
	}
	return nil
}

func isNull(raw json.RawMessage) bool { return wirejson.IsNull(raw) }
