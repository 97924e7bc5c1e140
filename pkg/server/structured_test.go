//go:build !race

// The end-to-end structured-output tests sample hundreds of answers from the
// tiny model on the CPU backend: minutes of pure arithmetic under the race
// detector, which `make test` runs on this package after the plain pass. They
// run in the plain pass; the concurrency they rely on (the engine filling
// masks on several goroutines, constraints per request) is covered under
// -race by pkg/engine's constraint tests.

package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/glmctl/glmctl/pkg/backend/cpu"
	"github.com/glmctl/glmctl/pkg/engine"
	"github.com/glmctl/glmctl/pkg/grammar"
	"github.com/glmctl/glmctl/pkg/server"
	"github.com/glmctl/glmctl/pkg/tokenizer"
	"github.com/glmctl/glmctl/pkg/tokenizer/chat"
)

// Structured outputs end to end: the real CPU backend on the tiny model
// (random weights: its free output is noise), its real tokenizer, the real
// grammar library, over HTTP.
func startStructuredServer(t *testing.T) string {
	t.Helper()
	const dir = "../../testdata/models/tiny-f32"
	be, err := cpu.Open(dir, cpu.Options{NumKVBlocks: 512, Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tok.Close() })
	eos := make([]int, len(tok.StopIDs))
	for i, id := range tok.StopIDs {
		eos[i] = int(id)
	}
	vocab, err := grammar.NewVocabFromTokenizerJSON(dir+"/tokenizer.json", be.Info().VocabSize, eos)
	if err != nil {
		t.Fatal(err)
	}
	s, err := server.New(server.Options{
		Backend: be, Tokenizer: tokenizer.ServerTokenizer{Tok: tok}, Chat: server.GLMChat{Variant: chat.GLM47},
		Grammar: vocab, ModelName: "tiny", Engine: engine.Config{MaxSeqs: 32, EOSTokenIDs: tok.StopIDs, PrefixCaching: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Error("Serve did not return")
		}
	})
	return "http://" + ln.Addr().String()
}

func postJSON(t *testing.T, url string, body any) (int, []byte) {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, out
}

var structuredSchemas = []string{
	`{"type":"object","properties":{"name":{"type":"string","maxLength":8},"age":{"type":"integer","minimum":0,"maximum":120}},"required":["name","age"],"additionalProperties":false}`,
	`{"type":"object","properties":{"color":{"enum":["red","green","blue"]},"ok":{"type":"boolean"}},"required":["color","ok"],"additionalProperties":false}`,
	`{"type":"array","items":{"type":"integer","minimum":-5,"maximum":5},"minItems":1,"maxItems":4}`,
	`{"type":"object","properties":{"point":{"type":"object","properties":{"x":{"type":"number"},"y":{"type":"number"}},"required":["x","y"],"additionalProperties":false},"tags":{"type":"array","items":{"type":"string","maxLength":5},"maxItems":3}},"required":["point","tags"],"additionalProperties":false}`,
	`{"type":"object","properties":{"id":{"type":"string","pattern":"^[a-f0-9]{4}$"},"n":{"type":"number","minimum":1,"maximum":2}},"required":["id","n"],"additionalProperties":false}`,
}

// validateAgainst parses doc as JSON and validates it against sch.
func validateAgainst(sch *jsonschema.Schema, doc string) error {
	v, err := jsonschema.UnmarshalJSON(strings.NewReader(doc))
	if err != nil {
		return fmt.Errorf("not JSON: %w", err)
	}
	return sch.Validate(v)
}

func compileSchema(t *testing.T, i int, schema string) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(schema))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	url := fmt.Sprintf("mem://schema%d.json", i)
	if err := c.AddResource(url, doc); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile(url)
	if err != nil {
		t.Fatal(err)
	}
	return sch
}

type choiceWire struct {
	Text    string `json:"text"`
	Message struct {
		Content string `json:"content"`
	} `json:"message"`
	FinishReason string `json:"finish_reason"`
}

// Every sampled output under a JSON schema parses and validates against it
// (an independent validator), through /v1/chat/completions response_format
// and /v1/completions guided_json; json_object, guided_regex and
// guided_choice outputs hold too: over 200 samples in all.
func TestStructuredOutputs(t *testing.T) {
	url := startStructuredServer(t)
	samples := 0
	check := func(what string, choices []choiceWire, valid func(string) error) {
		t.Helper()
		for i, c := range choices {
			out := c.Text + c.Message.Content
			if c.FinishReason == "length" && what == "json_object" {
				// Any object: a random-weight model may write one string
				// forever; a cut-off object is the client's max_tokens.
				continue
			}
			if c.FinishReason != "stop" {
				t.Errorf("%s choice %d: finish %q: %q", what, i, c.FinishReason, out)
				continue
			}
			if err := valid(out); err != nil {
				t.Errorf("%s choice %d: %q: %v", what, i, out, err)
			}
			samples++
		}
	}
	validJSON := func(sch *jsonschema.Schema) func(string) error {
		return func(out string) error {
			if sch != nil {
				return validateAgainst(sch, out)
			}
			v, err := jsonschema.UnmarshalJSON(strings.NewReader(out))
			if err != nil {
				return fmt.Errorf("not JSON: %w", err)
			}
			if _, ok := v.(map[string]any); !ok {
				return fmt.Errorf("not a JSON object")
			}
			return nil
		}
	}
	for i, schema := range structuredSchemas {
		sch := compileSchema(t, i, schema)
		code, body := postJSON(t, url+"/v1/chat/completions", map[string]any{
			"messages": []map[string]string{{"role": "user", "content": "Give me data."}},
			"n":        16, "temperature": 1.0, "seed": i, "max_tokens": 300,
			"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "x", "schema": json.RawMessage(schema), "strict": true}},
		})
		if code != 200 {
			t.Fatalf("chat schema %d: %d %s", i, code, body)
		}
		var resp struct{ Choices []choiceWire }
		if err := json.Unmarshal(body, &resp); err != nil {
			t.Fatal(err)
		}
		check(fmt.Sprintf("chat schema %d", i), resp.Choices, validJSON(sch))

		code, body = postJSON(t, url+"/v1/completions", map[string]any{
			"prompt": []string{"data:", "json"}, "n": 16, "temperature": 1.3, "seed": 100 + i, "max_tokens": 300,
			"guided_json": json.RawMessage(schema),
		})
		if code != 200 {
			t.Fatalf("completions schema %d: %d %s", i, code, body)
		}
		resp.Choices = nil
		if err := json.Unmarshal(body, &resp); err != nil {
			t.Fatal(err)
		}
		check(fmt.Sprintf("completions schema %d", i), resp.Choices, validJSON(sch))
	}
	other := []struct {
		what  string
		body  map[string]any
		valid func(string) error
	}{
		{"json_object", map[string]any{"response_format": map[string]any{"type": "json_object"}}, validJSON(nil)},
		{"guided_regex", map[string]any{"guided_regex": `[a-z]{2,6}-[0-9]{1,3}`}, func(s string) error {
			if !regexp.MustCompile(`^[a-z]{2,6}-[0-9]{1,3}$`).MatchString(s) {
				return fmt.Errorf("does not match")
			}
			return nil
		}},
		{"guided_choice", map[string]any{"guided_choice": []string{"yes", "no", "maybe (a.k.a. perhaps)"}}, func(s string) error {
			if s != "yes" && s != "no" && s != "maybe (a.k.a. perhaps)" {
				return fmt.Errorf("not a choice")
			}
			return nil
		}},
	}
	for _, o := range other {
		body := map[string]any{"prompt": "x", "n": 16, "temperature": 1.0, "seed": 7, "max_tokens": 120}
		for k, v := range o.body {
			body[k] = v
		}
		code, out := postJSON(t, url+"/v1/completions", body)
		if code != 200 {
			t.Fatalf("%s: %d %s", o.what, code, out)
		}
		var resp struct{ Choices []choiceWire }
		if err := json.Unmarshal(out, &resp); err != nil {
			t.Fatal(err)
		}
		check(o.what, resp.Choices, o.valid)
	}
	t.Logf("%d structured samples checked", samples)
	if samples < 200 {
		t.Fatalf("only %d samples", samples)
	}
}

// Bad formats are 400s naming the field and the problem.
func TestStructuredOutputErrors(t *testing.T) {
	url := startStructuredServer(t)
	tests := []struct {
		name string
		body map[string]any
		want []string
	}{
		{"schema that does not compile", map[string]any{"guided_json": map[string]any{"type": "object", "properties": map[string]any{"a": map[string]any{"type": "nope"}}}}, []string{"guided_json"}},
		{"bad regex", map[string]any{"guided_regex": "([a-z"}, []string{"guided_regex"}},
		{"bad grammar", map[string]any{"guided_grammar": "start: undefined_rule"}, []string{"guided_grammar"}},
		{"two formats", map[string]any{"guided_regex": "a", "guided_choice": []string{"b"}}, []string{"guided_regex and guided_choice both constrain the output"}},
		{"unknown type", map[string]any{"response_format": map[string]any{"type": "xml"}}, []string{"response_format.type", "xml"}},
		{"schema missing", map[string]any{"response_format": map[string]any{"type": "json_schema"}}, []string{"response_format.json_schema.schema: field required"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := map[string]any{"prompt": "x", "max_tokens": 5}
			for k, v := range tt.body {
				body[k] = v
			}
			code, out := postJSON(t, url+"/v1/completions", body)
			if code != 400 {
				t.Fatalf("status %d: %s", code, out)
			}
			for _, w := range tt.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("error %s lacks %q", out, w)
				}
			}
		})
	}
	code, out := postJSON(t, url+"/v1/chat/completions", map[string]any{
		"messages":             []map[string]string{{"role": "user", "content": "hi"}},
		"response_format":      map[string]any{"type": "json_object"},
		"chat_template_kwargs": map[string]any{"enable_thinking": true},
	})
	if code != 400 || !strings.Contains(string(out), "thinking enabled") {
		t.Fatalf("format with thinking: %d %s", code, out)
	}
}

// A forced tool call (tool_choice "required" or naming a function) through
// chat completions: every choice is a tool call of an offered tool whose
// arguments validate against its parameters schema, finish_reason
// "tool_calls".
func TestForcedToolCalls(t *testing.T) {
	url := startStructuredServer(t)
	weather := `{"type":"object","properties":{"city":{"type":"string","maxLength":12},"days":{"type":"integer","minimum":1,"maximum":7},"unit":{"enum":["c","f"],"type":"string"}},"required":["city","days"],"additionalProperties":false}`
	search := `{"type":"object","properties":{"query":{"type":"string","maxLength":20},"tags":{"type":"array","items":{"type":"string","maxLength":6},"maxItems":3}},"required":["query"],"additionalProperties":false}`
	schemas := map[string]*jsonschema.Schema{"get_weather": compileSchema(t, 100, weather), "search": compileSchema(t, 101, search)}
	tools := []map[string]any{
		{"type": "function", "function": map[string]any{"name": "get_weather", "parameters": json.RawMessage(weather)}},
		{"type": "function", "function": map[string]any{"name": "search", "parameters": json.RawMessage(search)}},
	}
	calls := 0
	for _, choice := range []any{"required", map[string]any{"type": "function", "function": map[string]any{"name": "search"}}} {
		for seed := range 4 {
			code, body := postJSON(t, url+"/v1/chat/completions", map[string]any{
				"messages": []map[string]string{{"role": "user", "content": "What's the weather in Paris?"}},
				"tools":    tools, "tool_choice": choice, "n": 8, "temperature": 1.0, "seed": seed, "max_tokens": 300,
			})
			if code != 200 {
				t.Fatalf("tool_choice %v: %d %s", choice, code, body)
			}
			var resp struct {
				Choices []struct {
					Message struct {
						Content   *string `json:"content"`
						ToolCalls []struct {
							Function struct {
								Name      string `json:"name"`
								Arguments string `json:"arguments"`
							} `json:"function"`
						} `json:"tool_calls"`
					} `json:"message"`
					FinishReason string `json:"finish_reason"`
				}
			}
			if err := json.Unmarshal(body, &resp); err != nil {
				t.Fatal(err)
			}
			for i, c := range resp.Choices {
				if c.FinishReason != "tool_calls" || len(c.Message.ToolCalls) == 0 {
					t.Errorf("tool_choice %v choice %d: finish %q, %d calls, content %v", choice, i, c.FinishReason, len(c.Message.ToolCalls), c.Message.Content)
					continue
				}
				for _, tc := range c.Message.ToolCalls {
					sch := schemas[tc.Function.Name]
					if sch == nil || (choice != "required" && tc.Function.Name != "search") {
						t.Errorf("tool_choice %v: call to %q", choice, tc.Function.Name)
						continue
					}
					if err := validateAgainst(sch, tc.Function.Arguments); err != nil {
						t.Errorf("%s(%s): %v", tc.Function.Name, tc.Function.Arguments, err)
					}
					calls++
				}
			}
		}
	}
	t.Logf("%d forced tool calls checked", calls)
	if calls < 64 {
		t.Fatalf("only %d calls", calls)
	}
}

// The same through Anthropic's Messages API: output_config.format (a JSON
// schema) and tool_choice any / tool.
func TestAnthropicStructured(t *testing.T) {
	url := startStructuredServer(t)
	schema := structuredSchemas[0]
	sch := compileSchema(t, 200, schema)
	weather := `{"type":"object","properties":{"city":{"type":"string","maxLength":12},"days":{"type":"integer","minimum":1,"maximum":7}},"required":["city","days"],"additionalProperties":false}`
	wsch := compileSchema(t, 201, weather)
	tools := []map[string]any{{"name": "get_weather", "input_schema": json.RawMessage(weather)}}
	type block struct {
		Type  string          `json:"type"`
		Text  string          `json:"text"`
		Name  string          `json:"name"`
		Input json.RawMessage `json:"input"`
	}
	var resp struct {
		Content    []block `json:"content"`
		StopReason string  `json:"stop_reason"`
	}
	msgs := []map[string]string{{"role": "user", "content": "Weather in Paris?"}}
	for i := range 6 {
		code, body := postJSON(t, url+"/v1/messages", map[string]any{"max_tokens": 300, "messages": msgs, "temperature": 1.0,
			"output_config": map[string]any{"format": map[string]any{"type": "json_schema", "schema": json.RawMessage(schema)}}})
		if code != 200 {
			t.Fatalf("output_config.format: %d %s", code, body)
		}
		resp.Content = nil
		if err := json.Unmarshal(body, &resp); err != nil {
			t.Fatal(err)
		}
		text := ""
		for _, b := range resp.Content {
			if b.Type == "text" {
				text += b.Text
			}
		}
		if err := validateAgainst(sch, text); err != nil || resp.StopReason != "end_turn" {
			t.Errorf("output_config.format %d: stop %q, %q: %v", i, resp.StopReason, text, err)
		}
		choice := map[string]any{"type": "any"}
		if i%2 == 1 {
			choice = map[string]any{"type": "tool", "name": "get_weather"}
		}
		code, body = postJSON(t, url+"/v1/messages", map[string]any{"max_tokens": 300, "messages": msgs, "temperature": 1.0,
			"tools": tools, "tool_choice": choice})
		if code != 200 {
			t.Fatalf("tool_choice %v: %d %s", choice, code, body)
		}
		resp.Content = nil
		if err := json.Unmarshal(body, &resp); err != nil {
			t.Fatal(err)
		}
		uses := 0
		for _, b := range resp.Content {
			if b.Type != "tool_use" {
				continue
			}
			uses++
			if err := validateAgainst(wsch, string(b.Input)); b.Name != "get_weather" || err != nil {
				t.Errorf("tool_choice %v: %s(%s): %v", choice, b.Name, b.Input, err)
			}
		}
		// "any" is one or more calls: an untrained model sampling at
		// temperature 1 may chain calls until max_tokens (seen: 8 complete,
		// valid calls, then the limit). The named tool is exactly one call,
		// so it always ends with tool_use.
		stopOK := resp.StopReason == "tool_use" || (choice["type"] == "any" && resp.StopReason == "max_tokens")
		if uses == 0 || !stopOK {
			t.Errorf("tool_choice %v: %d tool_use blocks, stop %q: %s", choice, uses, resp.StopReason, body)
		}
	}
}

// And through the Responses API: text.format json_schema and a forced
// function call.
func TestResponsesStructured(t *testing.T) {
	url := startStructuredServer(t)
	schema := structuredSchemas[1]
	sch := compileSchema(t, 300, schema)
	weather := `{"type":"object","properties":{"city":{"type":"string","maxLength":12}},"required":["city"],"additionalProperties":false}`
	wsch := compileSchema(t, 301, weather)
	var resp struct {
		Output []struct {
			Type    string `json:"type"`
			Name    string `json:"name"`
			Args    string `json:"arguments"`
			Content []struct {
				Text string `json:"text"`
			} `json:"content"`
		} `json:"output"`
		Text struct {
			Format struct {
				Type string `json:"type"`
			} `json:"format"`
		} `json:"text"`
	}
	for i := range 6 {
		code, body := postJSON(t, url+"/v1/responses", map[string]any{"input": "colour?", "max_output_tokens": 200, "temperature": 1.0,
			"text": map[string]any{"format": map[string]any{"type": "json_schema", "name": "c", "schema": json.RawMessage(schema), "strict": true}}})
		if code != 200 {
			t.Fatalf("text.format: %d %s", code, body)
		}
		resp.Output = nil
		if err := json.Unmarshal(body, &resp); err != nil {
			t.Fatal(err)
		}
		text := ""
		for _, o := range resp.Output {
			for _, c := range o.Content {
				text += c.Text
			}
		}
		if err := validateAgainst(sch, text); err != nil || resp.Text.Format.Type != "json_schema" {
			t.Errorf("text.format %d (echoed %q): %q: %v", i, resp.Text.Format.Type, text, err)
		}
		code, body = postJSON(t, url+"/v1/responses", map[string]any{"input": "weather?", "max_output_tokens": 200, "temperature": 1.0,
			"tools":       []map[string]any{{"type": "function", "name": "get_weather", "parameters": json.RawMessage(weather)}},
			"tool_choice": map[string]any{"type": "function", "name": "get_weather"}})
		if code != 200 {
			t.Fatalf("tool_choice: %d %s", code, body)
		}
		resp.Output = nil
		if err := json.Unmarshal(body, &resp); err != nil {
			t.Fatal(err)
		}
		calls := 0
		for _, o := range resp.Output {
			if o.Type != "function_call" {
				continue
			}
			calls++
			if err := validateAgainst(wsch, o.Args); o.Name != "get_weather" || err != nil {
				t.Errorf("forced call %s(%s): %v", o.Name, o.Args, err)
			}
		}
		if calls != 1 {
			t.Errorf("forced call %d: %d function_call items: %s", i, calls, body)
		}
	}
}
