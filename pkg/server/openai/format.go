package openai

import (
	"encoding/json"
	"regexp"
	"strings"
)

// FormatKind is what a structured-output request constrains the output to.
type FormatKind string

// Structured-output kinds.
const (
	FormatJSONObject FormatKind = "json_object" // any JSON object
	FormatJSONSchema FormatKind = "json_schema" // JSON valid against Schema
	FormatRegex      FormatKind = "regex"       // text matching Pattern in full
	FormatGrammar    FormatKind = "grammar"     // text of Grammar (llguidance's Lark dialect)
)

// Format is a request's structured-output constraint: OpenAI's
// response_format (json_object, json_schema), or vLLM's guided_json,
// guided_regex, guided_grammar and guided_choice. Nil means free text.
type Format struct {
	Kind    FormatKind
	Schema  json.RawMessage // FormatJSONSchema
	Name    string          // json_schema.name, if given
	Pattern string          // FormatRegex
	Grammar string          // FormatGrammar
	// Param is the request field it came from (for error messages).
	Param string
}

// MaxFormatBytes bounds a schema, regex or grammar.
const MaxFormatBytes = 64 << 10

// formatWire is the structured-output fields as sent, decoded in a pass of
// its own by both endpoints.
type formatWire struct {
	ResponseFormat *struct {
		Type       *string `json:"type"`
		JSONSchema *struct {
			Name   *string         `json:"name"`
			Schema json.RawMessage `json:"schema"`
			Strict *bool           `json:"strict"`
		} `json:"json_schema"`
	} `json:"response_format"`
	GuidedJSON    json.RawMessage `json:"guided_json"`
	GuidedRegex   *string         `json:"guided_regex"`
	GuidedGrammar *string         `json:"guided_grammar"`
	GuidedChoice  []string        `json:"guided_choice"`
}

// decodeFormat reads the structured-output fields of body: at most one of
// them may ask for a format.
func decodeFormat(body []byte) (*Format, *Error) {
	var w formatWire
	if err := unmarshal(body, &w, ""); err != nil {
		return nil, err
	}
	var got []*Format
	if rf := w.ResponseFormat; rf != nil {
		if rf.Type == nil {
			return nil, BadRequest("response_format.type", "response_format.type: field required")
		}
		switch *rf.Type {
		case "text":
		case "json_object":
			got = append(got, &Format{Kind: FormatJSONObject, Param: "response_format"})
		case "json_schema":
			js := rf.JSONSchema
			if js == nil || isNull(js.Schema) || len(js.Schema) == 0 {
				return nil, BadRequest("response_format.json_schema.schema", "response_format.json_schema.schema: field required for type \"json_schema\"")
			}
			f := &Format{Kind: FormatJSONSchema, Schema: js.Schema, Param: "response_format.json_schema.schema"}
			if js.Name != nil {
				f.Name = *js.Name
			}
			got = append(got, f)
		default:
			return nil, BadRequest("response_format.type", "response_format.type %q must be \"text\", \"json_object\" or \"json_schema\"", *rf.Type)
		}
	}
	if !isNull(w.GuidedJSON) && len(w.GuidedJSON) > 0 {
		schema := w.GuidedJSON
		var s string
		if json.Unmarshal(schema, &s) == nil { // vLLM takes the schema as a JSON string too
			schema = json.RawMessage(s)
		}
		got = append(got, &Format{Kind: FormatJSONSchema, Schema: schema, Param: "guided_json"})
	}
	if w.GuidedRegex != nil {
		got = append(got, &Format{Kind: FormatRegex, Pattern: *w.GuidedRegex, Param: "guided_regex"})
	}
	if w.GuidedGrammar != nil {
		got = append(got, &Format{Kind: FormatGrammar, Grammar: *w.GuidedGrammar, Param: "guided_grammar"})
	}
	if w.GuidedChoice != nil {
		if len(w.GuidedChoice) == 0 {
			return nil, BadRequest("guided_choice", "guided_choice: give at least one choice")
		}
		alts := make([]string, len(w.GuidedChoice))
		for i, c := range w.GuidedChoice {
			alts[i] = regexp.QuoteMeta(c)
		}
		got = append(got, &Format{Kind: FormatRegex, Pattern: "(" + strings.Join(alts, "|") + ")", Param: "guided_choice"})
	}
	switch {
	case len(got) == 0:
		return nil, nil
	case len(got) > 1:
		return nil, BadRequest(got[1].Param, "%s and %s both constrain the output: give one of response_format, guided_json, guided_regex, guided_grammar, guided_choice", got[0].Param, got[1].Param)
	}
	f := got[0]
	if n := len(f.Schema) + len(f.Pattern) + len(f.Grammar); n > MaxFormatBytes {
		return nil, BadRequest(f.Param, "%s: %d bytes; the limit is %d", f.Param, n, MaxFormatBytes)
	}
	if f.Kind == FormatJSONSchema && !json.Valid(f.Schema) {
		return nil, BadRequest(f.Param, "%s: the schema is not valid JSON", f.Param)
	}
	return f, nil
}
