package responses

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/glmctl/glmctl/pkg/server/internal/wirejson"
	"github.com/glmctl/glmctl/pkg/server/openai"
)

// Limits enforced while decoding, so one request cannot make the server do
// unbounded work before it reaches the engine.
const (
	MaxInputItems    = 4096
	MaxParts         = 4096 // content parts of one item
	MaxTools         = 256
	MaxToolNameBytes = 64
	MaxMetadata      = 16 // metadata pairs, as OpenAI allows
	MaxMetadataKey   = 64
	MaxMetadataValue = 512
)

// Reasoning efforts OpenAI defines; "none" turns GLM's thinking off, every
// other one on (GLM has no finer control).
var reasoningEfforts = []string{"none", "minimal", "low", "medium", "high", "xhigh", "max"}

type requestWire struct {
	Model              *string           `json:"model"`
	Input              json.RawMessage   `json:"input"`
	Instructions       *string           `json:"instructions"`
	MaxOutputTokens    *int              `json:"max_output_tokens"`
	Temperature        *float64          `json:"temperature"`
	TopP               *float64          `json:"top_p"`
	Stream             *bool             `json:"stream"`
	Tools              []json.RawMessage `json:"tools"`
	ToolChoice         json.RawMessage   `json:"tool_choice"`
	ParallelToolCalls  *bool             `json:"parallel_tool_calls"`
	Reasoning          *reasoningWire    `json:"reasoning"`
	Store              *bool             `json:"store"`
	PreviousResponseID *string           `json:"previous_response_id"`
	Conversation       json.RawMessage   `json:"conversation"`
	Background         *bool             `json:"background"`
	Prompt             json.RawMessage   `json:"prompt"`
	Text               *struct {
		Format *struct {
			Type   *string         `json:"type"`
			Name   *string         `json:"name"`
			Schema json.RawMessage `json:"schema"`
			Strict *bool           `json:"strict"`
		} `json:"format"`
	} `json:"text"`
	TopLogprobs *int              `json:"top_logprobs"`
	Include     []string          `json:"include"`
	Truncation  *string           `json:"truncation"`
	Metadata    map[string]string `json:"metadata"`
	User        *string           `json:"user"`
}

type reasoningWire struct {
	Effort  *string `json:"effort"`
	Summary *string `json:"summary"`
}

type itemWire struct {
	Type      *string         `json:"type"`
	Role      *string         `json:"role"`
	Content   json.RawMessage `json:"content"`
	CallID    *string         `json:"call_id"`
	Name      *string         `json:"name"`
	Arguments *string         `json:"arguments"`
	Output    json.RawMessage `json:"output"`
	Summary   json.RawMessage `json:"summary"`
}

type partWire struct {
	Type    *string `json:"type"`
	Text    *string `json:"text"`
	Refusal *string `json:"refusal"`
}

type toolWire struct {
	Type        *string         `json:"type"`
	Name        *string         `json:"name"`
	Description *string         `json:"description"`
	Parameters  json.RawMessage `json:"parameters"`
	Strict      *bool           `json:"strict"`
}

// DecodeRequest parses and validates a /v1/responses body. Unknown fields
// (service_tier, prompt_cache_key, safety_identifier, ...) are ignored; a
// wrong type or an out-of-range value is a 400 whose param is the field
// and whose message starts with it; what glmctl cannot do (stored state,
// hosted tools, constrained decoding) is a 400 that says why.
func DecodeRequest(body []byte) (*Request, *openai.Error) {
	var w requestWire
	if err := unmarshal(body, &w, ""); err != nil {
		return nil, err
	}
	if err := checkStateless(&w); err != nil {
		return nil, err
	}
	req := &Request{ToolChoice: ToolChoiceAuto, ParallelToolCalls: w.ParallelToolCalls, Metadata: w.Metadata, User: w.User}
	if w.Model != nil {
		req.Model = *w.Model
	}
	if w.Instructions != nil {
		req.Instructions = *w.Instructions
	}
	if p := w.MaxOutputTokens; p != nil {
		if *p < 1 {
			return nil, openai.BadRequest("max_output_tokens", "max_output_tokens: %d must be at least 1", *p)
		}
		req.MaxOutputTokens = *p
	}
	if t := w.Temperature; t != nil && (math.IsNaN(*t) || *t < 0 || *t > 2) {
		return nil, openai.BadRequest("temperature", "temperature: %v must be in [0, 2]", *t)
	}
	if t := w.TopP; t != nil && (math.IsNaN(*t) || *t <= 0 || *t > 1) {
		return nil, openai.BadRequest("top_p", "top_p: %v must be in (0, 1]", *t)
	}
	req.Temperature, req.TopP = w.Temperature, w.TopP
	req.Stream = w.Stream != nil && *w.Stream
	var err *openai.Error
	if req.Reasoning, req.Thinking, err = decodeReasoning(w.Reasoning); err != nil {
		return nil, err
	}
	if err := checkOutputOptions(&w); err != nil {
		return nil, err
	}
	if req.Format, req.TextFormat, err = decodeTextFormat(&w); err != nil {
		return nil, err
	}
	if err := checkMetadata(w.Metadata); err != nil {
		return nil, err
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
			return nil, openai.BadRequest("tool_choice", "tool_choice: \"required\" needs tools")
		}
	case ToolChoiceFunction:
		found := false
		for _, t := range req.Tools {
			found = found || t.Name == req.ToolChoiceName
		}
		if !found {
			return nil, openai.BadRequest("tool_choice.name", "tool_choice.name: %q is not among the tools", req.ToolChoiceName)
		}
	}
	if req.Input, err = decodeInput(w.Input); err != nil {
		return nil, err
	}
	return req, nil
}

// checkStateless refuses what needs state kept between requests: glmctl
// stores no responses, conversations or prompts.
func checkStateless(w *requestWire) *openai.Error {
	const why = "glmctl stores no responses: send the whole conversation in input"
	switch {
	case w.Store != nil && *w.Store:
		return openai.BadRequest("store", "store: true is not supported: %s, with store false or left out", why)
	case w.PreviousResponseID != nil:
		return openai.BadRequest("previous_response_id", "previous_response_id is not supported: %s", why)
	case !isNull(w.Conversation):
		return openai.BadRequest("conversation", "conversation is not supported: %s", why)
	case w.Background != nil && *w.Background:
		return openai.BadRequest("background", "background: true is not supported: %s, and wait for the answer or stream it", why)
	case !isNull(w.Prompt):
		return openai.BadRequest("prompt", "prompt (a stored prompt template) is not supported: send the instructions and input themselves")
	}
	return nil
}

// decodeTextFormat reads text.format: text (the default), json_object, or
// json_schema with its schema.
func decodeTextFormat(w *requestWire) (*openai.Format, TextFormat, *openai.Error) {
	t := w.Text
	if t == nil || t.Format == nil {
		return nil, TextFormat{}, nil
	}
	f := t.Format
	if f.Type == nil {
		return nil, TextFormat{}, openai.BadRequest("text.format.type", "text.format.type: field required")
	}
	switch *f.Type {
	case "text":
		return nil, TextFormat{}, nil
	case "json_object":
		return &openai.Format{Kind: openai.FormatJSONObject, Param: "text.format"}, TextFormat{Type: "json_object"}, nil
	case "json_schema":
		if isNull(f.Schema) || len(f.Schema) == 0 || !json.Valid(f.Schema) {
			return nil, TextFormat{}, openai.BadRequest("text.format.schema", "text.format.schema: a JSON schema is required for type \"json_schema\"")
		}
		echo := TextFormat{Type: "json_schema", Schema: f.Schema, Strict: f.Strict}
		if f.Name != nil {
			echo.Name = *f.Name
		}
		return &openai.Format{Kind: openai.FormatJSONSchema, Schema: f.Schema, Name: echo.Name, Param: "text.format.schema"}, echo, nil
	}
	return nil, TextFormat{}, openai.BadRequest("text.format.type", "text.format.type: %q must be \"text\", \"json_object\" or \"json_schema\"", *f.Type)
}

// checkOutputOptions refuses output settings glmctl cannot honour.
func checkOutputOptions(w *requestWire) *openai.Error {
	if p := w.TopLogprobs; p != nil && *p != 0 {
		return openai.BadRequest("top_logprobs", "top_logprobs: logprobs are not supported on /v1/responses (use /v1/chat/completions)")
	}
	if slices.Contains(w.Include, "message.output_text.logprobs") {
		return openai.BadRequest("include", "include: message.output_text.logprobs is not supported on /v1/responses (use /v1/chat/completions)")
	}
	if t := w.Truncation; t != nil && *t != "auto" && *t != "disabled" {
		return openai.BadRequest("truncation", "truncation: %q must be \"auto\" or \"disabled\"", *t)
	}
	return nil
}

func decodeReasoning(w *reasoningWire) (Reasoning, *bool, *openai.Error) {
	if w == nil {
		return Reasoning{}, nil, nil
	}
	r := Reasoning{Effort: w.Effort, Summary: w.Summary}
	if s := w.Summary; s != nil && *s != "auto" && *s != "concise" && *s != "detailed" {
		return r, nil, openai.BadRequest("reasoning.summary", "reasoning.summary: %q must be \"auto\", \"concise\" or \"detailed\"", *s)
	}
	if w.Effort == nil {
		return r, nil, nil
	}
	if !slices.Contains(reasoningEfforts, *w.Effort) {
		return r, nil, openai.BadRequest("reasoning.effort", "reasoning.effort: %q must be one of %s", *w.Effort, strings.Join(reasoningEfforts, ", "))
	}
	on := *w.Effort != "none"
	return r, &on, nil
}

func checkMetadata(m map[string]string) *openai.Error {
	if len(m) > MaxMetadata {
		return openai.BadRequest("metadata", "metadata: %d pairs; the limit is %d", len(m), MaxMetadata)
	}
	for k, v := range m {
		if utf8.RuneCountInString(k) > MaxMetadataKey {
			return openai.BadRequest("metadata", "metadata: key %q is longer than %d characters", k, MaxMetadataKey)
		}
		if utf8.RuneCountInString(v) > MaxMetadataValue {
			return openai.BadRequest("metadata", "metadata.%s: the value is longer than %d characters", k, MaxMetadataValue)
		}
	}
	return nil
}

func decodeTools(raws []json.RawMessage) ([]Tool, *openai.Error) {
	if len(raws) > MaxTools {
		return nil, openai.BadRequest("tools", "tools: %d tools; the limit is %d", len(raws), MaxTools)
	}
	var tools []Tool
	seen := map[string]bool{}
	for i, raw := range raws {
		param := fmt.Sprintf("tools[%d]", i)
		if isNull(raw) {
			return nil, openai.BadRequest(param, "%s: expected a tool object, got null", param)
		}
		var w toolWire
		if err := unmarshal(raw, &w, param+"."); err != nil {
			return nil, err
		}
		if w.Type == nil {
			return nil, openai.BadRequest(param+".type", "%s.type: field required", param)
		}
		if *w.Type != ToolFunction {
			return nil, openai.BadRequest(param+".type", "%s.type: %q is not supported: glmctl runs no hosted tools, only function tools (type \"function\")", param, *w.Type)
		}
		if w.Name == nil {
			return nil, openai.BadRequest(param+".name", "%s.name: field required (a Responses function tool is flat: type, name, description, parameters)", param)
		}
		if err := checkToolName(*w.Name); err != nil {
			return nil, openai.BadRequest(param+".name", "%s.name: %q %v", param, *w.Name, err)
		}
		if seen[*w.Name] {
			return nil, openai.BadRequest(param+".name", "%s.name: tool names must be unique (%q is repeated)", param, *w.Name)
		}
		seen[*w.Name] = true
		t := Tool{Name: *w.Name, Description: w.Description, Strict: w.Strict}
		if schema := bytes.TrimSpace(w.Parameters); !isNull(schema) {
			if schema[0] != '{' {
				return nil, openai.BadRequest(param+".parameters", "%s.parameters: must be a JSON schema object", param)
			}
			t.Parameters = bytes.Clone(schema)
		}
		tools = append(tools, t)
	}
	return tools, nil
}

// checkToolName applies OpenAI's rule for function names.
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

func decodeToolChoice(raw json.RawMessage) (ToolChoice, string, *openai.Error) {
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
		return "", "", openai.BadRequest("tool_choice", "tool_choice: %q must be \"auto\", \"none\", \"required\" or an object naming a function", s)
	}
	var obj struct {
		Type *string `json:"type"`
		Name *string `json:"name"`
	}
	if err := unmarshal(raw, &obj, "tool_choice."); err != nil {
		return "", "", openai.BadRequest("tool_choice", "tool_choice: expected \"auto\", \"none\", \"required\" or an object")
	}
	if obj.Type == nil {
		return "", "", openai.BadRequest("tool_choice.type", "tool_choice.type: field required")
	}
	if *obj.Type != "function" {
		return "", "", openai.BadRequest("tool_choice.type", "tool_choice.type: %q is not supported (only \"function\": glmctl has function tools only)", *obj.Type)
	}
	if obj.Name == nil || *obj.Name == "" {
		return "", "", openai.BadRequest("tool_choice.name", "tool_choice.name: field required for type \"function\"")
	}
	return ToolChoiceFunction, *obj.Name, nil
}

func decodeInput(raw json.RawMessage) ([]InputItem, *openai.Error) {
	if isNull(raw) {
		return nil, openai.BadRequest("input", "input: field required")
	}
	raw = bytes.TrimSpace(raw)
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, openai.BadRequest("input", "input: %v", err)
		}
		return []InputItem{{Type: ItemMessage, Role: RoleUser, Text: s}}, nil
	case '[':
	default:
		return nil, openai.BadRequest("input", "input: expected a string or an array of input items")
	}
	var raws []json.RawMessage
	if err := json.Unmarshal(raw, &raws); err != nil {
		return nil, openai.BadRequest("input", "input: %v", err)
	}
	if len(raws) == 0 {
		return nil, openai.BadRequest("input", "input: must not be empty")
	}
	if len(raws) > MaxInputItems {
		return nil, openai.BadRequest("input", "input: %d items; the limit is %d", len(raws), MaxInputItems)
	}
	items := make([]InputItem, 0, len(raws))
	for i, r := range raws {
		it, err := decodeItem(r, fmt.Sprintf("input[%d]", i))
		if err != nil {
			return nil, err
		}
		items = append(items, it)
	}
	return items, nil
}

func decodeItem(raw json.RawMessage, param string) (InputItem, *openai.Error) {
	var it InputItem
	if isNull(raw) {
		return it, openai.BadRequest(param, "%s: expected an input item object, got null", param)
	}
	var w itemWire
	if err := unmarshal(raw, &w, param+"."); err != nil {
		return it, err
	}
	it.Type = ItemMessage // an item without a type is a message
	if w.Type != nil {
		it.Type = *w.Type
	}
	required := func(p *string, field string) (string, *openai.Error) {
		if p == nil {
			return "", openai.BadRequest(param+"."+field, "%s.%s: field required", param, field)
		}
		return *p, nil
	}
	var err *openai.Error
	switch it.Type {
	case ItemMessage:
		if it.Role, err = required(w.Role, "role"); err != nil {
			return it, err
		}
		switch it.Role {
		case RoleUser, RoleSystem, RoleDeveloper, RoleAssistant:
		default:
			return it, openai.BadRequest(param+".role", "%s.role: %q must be one of user, system, developer, assistant", param, it.Role)
		}
		it.Text, err = decodeMessageContent(w.Content, it.Role, param+".content")
	case ItemFunctionCall:
		if it.CallID, err = required(w.CallID, "call_id"); err != nil {
			return it, err
		}
		if it.Name, err = required(w.Name, "name"); err != nil {
			return it, err
		}
		if it.Name == "" {
			return it, openai.BadRequest(param+".name", "%s.name: must not be empty", param)
		}
		it.Arguments, err = decodeArguments(w.Arguments, param+".arguments")
	case ItemFunctionCallOutput:
		if it.CallID, err = required(w.CallID, "call_id"); err != nil {
			return it, err
		}
		if isNull(w.Output) {
			return it, openai.BadRequest(param+".output", "%s.output: field required", param)
		}
		it.Text, err = decodeText(w.Output, param+".output", []string{PartInputText})
	case ItemReasoning:
		it.Text, err = decodeReasoningText(w.Content, w.Summary, param)
	case ItemReference:
		err = openai.BadRequest(param+".type", "%s.type: item_reference is not supported: glmctl stores no items; send the item itself", param)
	default:
		err = openai.BadRequest(param+".type", "%s.type: %q is not supported: glmctl takes message, function_call, function_call_output and reasoning items (it runs no hosted tools)", param, it.Type)
	}
	return it, err
}

// decodeMessageContent reads a message's content: a string, or an array of
// parts (input_text in user, system and developer messages; output_text and
// refusal in assistant messages).
func decodeMessageContent(raw json.RawMessage, role, param string) (string, *openai.Error) {
	if isNull(raw) {
		return "", openai.BadRequest(param, "%s: field required", param)
	}
	allowed := []string{PartInputText}
	if role == RoleAssistant {
		allowed = []string{PartOutputText, PartRefusal}
	}
	return decodeText(raw, param, allowed)
}

// decodeText reads a string, or an array of text parts of the allowed
// types, concatenated as the chat template concatenates text parts.
func decodeText(raw json.RawMessage, param string, allowed []string) (string, *openai.Error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) > 0 && raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", openai.BadRequest(param, "%s: %v", param, err)
		}
		return s, nil
	}
	texts, err := decodeParts(raw, param, allowed, "a string or an array of content parts")
	return strings.Join(texts, ""), err
}

// decodeParts reads an array of text parts of the allowed types and
// returns their texts. Images, files and audio are refused: the model
// reads text only. want describes the value expected, for the error.
func decodeParts(raw json.RawMessage, param string, allowed []string, want string) ([]string, *openai.Error) {
	var parts []json.RawMessage
	if raw = bytes.TrimSpace(raw); len(raw) == 0 || raw[0] != '[' || json.Unmarshal(raw, &parts) != nil {
		return nil, openai.BadRequest(param, "%s: expected %s", param, want)
	}
	if len(parts) > MaxParts {
		return nil, openai.BadRequest(param, "%s: %d parts; the limit is %d", param, len(parts), MaxParts)
	}
	texts := make([]string, 0, len(parts))
	for j, part := range parts {
		pp := fmt.Sprintf("%s[%d]", param, j)
		if isNull(part) {
			return nil, openai.BadRequest(pp, "%s: expected a content part object, got null", pp)
		}
		var w partWire
		if err := unmarshal(part, &w, pp+"."); err != nil {
			return nil, err
		}
		if w.Type == nil {
			return nil, openai.BadRequest(pp+".type", "%s.type: field required", pp)
		}
		typ := *w.Type
		switch {
		case slices.Contains(allowed, typ):
		case typ == "input_image" || typ == "input_file" || typ == "input_audio":
			return nil, openai.BadRequest(pp+".type", "%s.type: %q parts are not supported: this model reads text only", pp, typ)
		default:
			return nil, openai.BadRequest(pp+".type", "%s.type: %q is not supported here (%s)", pp, typ, strings.Join(allowed, ", "))
		}
		field, text := "text", w.Text
		if typ == PartRefusal {
			field, text = "refusal", w.Refusal
		}
		if text == nil {
			return nil, openai.BadRequest(pp+"."+field, "%s.%s: field required", pp, field)
		}
		texts = append(texts, *text)
	}
	return texts, nil
}

// decodeArguments checks that a function call's arguments (a JSON string)
// hold a JSON object, and compacts it (member order kept); "" is {}.
func decodeArguments(p *string, param string) (json.RawMessage, *openai.Error) {
	if p == nil {
		return nil, openai.BadRequest(param, "%s: field required", param)
	}
	args := bytes.TrimSpace([]byte(*p))
	if len(args) == 0 {
		return json.RawMessage(defaultArguments), nil
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(args, &obj); err != nil || obj == nil {
		return nil, openai.BadRequest(param, "%s: must be a string holding a JSON object", param)
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, args); err != nil {
		return nil, openai.BadRequest(param, "%s: %v", param, err)
	}
	return buf.Bytes(), nil
}

// decodeReasoningText reads a reasoning item sent back: its reasoning_text
// content, else its summary, joined with "\n". Encrypted content is
// ignored (glmctl sends none).
func decodeReasoningText(content, summary json.RawMessage, param string) (string, *openai.Error) {
	var texts, sums []string
	var err *openai.Error
	if !isNull(content) {
		if texts, err = decodeParts(content, param+".content", []string{PartReasoningText}, "an array of reasoning_text parts"); err != nil {
			return "", err
		}
	}
	if !isNull(summary) {
		if sums, err = decodeParts(summary, param+".summary", []string{PartSummaryText}, "an array of summary_text parts"); err != nil {
			return "", err
		}
	}
	if len(texts) == 0 {
		texts = sums
	}
	return strings.Join(texts, "\n"), nil
}

// unmarshal decodes a wire value, naming the offending parameter on failure.
func unmarshal(data []byte, v any, prefix string) *openai.Error {
	if param, msg, failed := wirejson.Unmarshal(data, v, prefix); failed {
		return openai.BadRequest(param, "%s", msg)
	}
	return nil
}

func isNull(raw json.RawMessage) bool { return wirejson.IsNull(raw) }
