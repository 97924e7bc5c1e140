package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/glmctl/glmctl/pkg/server/openai"
)

// toolCallGrammar writes the Lark grammar (llguidance's dialect, docs/grammar.md)
// of GLM-4.7 tool calls for a forced tool_choice: one or more calls to any of
// tools ("required"), or exactly one call to the tool named only. A call is
// GLM-4.7's format (pkg/tokenizer/chat):
//
//	<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>
//
// with the tags as special tokens. The arguments follow the tool's parameters
// schema: its properties in schema order, the required ones always and the
// others optionally, no other keys; a string property's value is raw text
// (no '<', at most maxLength characters, or one of its enum values), any
// other property's value is JSON valid against its schema (%json), as the
// chat parser reads them.
func toolCallGrammar(tools []openai.Tool, only string) (string, error) {
	var sb strings.Builder
	var calls []string
	for i, t := range tools {
		if only != "" && t.Name != only {
			continue
		}
		props, required, err := toolProperties(t.Parameters)
		if err != nil {
			return "", fmt.Errorf("tool %q: parameters: %w", t.Name, err)
		}
		rule := fmt.Sprintf("call_%d", i)
		calls = append(calls, rule)
		fmt.Fprintf(&sb, "%s: <tool_call> %s", rule, larkString(t.Name))
		for j, p := range props {
			arg := fmt.Sprintf("arg_%d_%d", i, j)
			sb.WriteString(" " + arg)
			if !required[p.name] {
				sb.WriteString("?")
			}
		}
		sb.WriteString(" </tool_call>\n")
		for j, p := range props {
			val, err := valueRule(p.schema)
			if err != nil {
				return "", fmt.Errorf("tool %q: parameter %q: %w", t.Name, p.name, err)
			}
			fmt.Fprintf(&sb, "arg_%d_%d: <arg_key> %s </arg_key> <arg_value> val_%d_%d </arg_value>\n", i, j, larkString(p.name), i, j)
			fmt.Fprintf(&sb, "val_%d_%d: %s\n", i, j, val)
		}
	}
	switch {
	case len(calls) == 0 && only != "":
		return "", fmt.Errorf("no tool is named %q", only)
	case len(calls) == 0:
		return "", fmt.Errorf("no tools to call")
	case only != "":
		return "start: " + calls[0] + "\n" + sb.String(), nil
	}
	return "start: call+\ncall: " + strings.Join(calls, " | ") + "\n" + sb.String(), nil
}

type toolProperty struct {
	name   string
	schema json.RawMessage
}

// toolProperties reads a parameters schema's properties in their order and
// its required names.
func toolProperties(params json.RawMessage) ([]toolProperty, map[string]bool, error) {
	if len(bytes.TrimSpace(params)) == 0 || string(bytes.TrimSpace(params)) == "null" {
		return nil, nil, nil
	}
	var top struct {
		Properties json.RawMessage `json:"properties"`
		Required   []string        `json:"required"`
	}
	if err := json.Unmarshal(params, &top); err != nil {
		return nil, nil, err
	}
	required := map[string]bool{}
	for _, r := range top.Required {
		required[r] = true
	}
	if len(top.Properties) == 0 {
		return nil, required, nil
	}
	dec := json.NewDecoder(bytes.NewReader(top.Properties))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, nil, fmt.Errorf("properties must be an object")
	}
	var props []toolProperty
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, nil, err
		}
		name, _ := tok.(string)
		var schema json.RawMessage
		if err := dec.Decode(&schema); err != nil {
			return nil, nil, err
		}
		props = append(props, toolProperty{name: name, schema: schema})
	}
	for r := range required {
		found := false
		for _, p := range props {
			found = found || p.name == r
		}
		if !found {
			return nil, nil, fmt.Errorf("required property %q is not among the properties", r)
		}
	}
	return props, required, nil
}

// valueRule is the Lark right-hand side of one argument value.
func valueRule(schema json.RawMessage) (string, error) {
	var s struct {
		Type      json.RawMessage `json:"type"`
		Enum      []any           `json:"enum"`
		MaxLength *int            `json:"maxLength"`
	}
	if err := json.Unmarshal(schema, &s); err != nil {
		return "", err
	}
	var typ string
	_ = json.Unmarshal(s.Type, &typ)
	if typ != "string" {
		return "%json " + string(schema), nil
	}
	if len(s.Enum) > 0 {
		alts := make([]string, 0, len(s.Enum))
		for _, e := range s.Enum {
			str, ok := e.(string)
			if !ok {
				return "", fmt.Errorf("enum value %v of a string property is not a string", e)
			}
			alts = append(alts, larkString(str))
		}
		return strings.Join(alts, " | "), nil
	}
	if s.MaxLength != nil {
		return fmt.Sprintf("/[^<]{0,%d}/", max(*s.MaxLength, 0)), nil
	}
	return "/[^<]*/", nil
}

// larkString quotes s as a Lark string literal (JSON's escapes).
func larkString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
