package openai

import (
	"encoding/json"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

func TestDecodeChatRequestFull(t *testing.T) {
	body := `{
	  "model": "glm", "unknown_field": {"ignored": true},
	  "messages": [
	    {"role": "developer", "content": "be brief"},
	    {"role": "user", "content": [{"type": "text", "text": "a"}, "b", {"type": "text", "text": "c"}]},
	    {"role": "assistant", "content": null, "reasoning_content": "r",
	     "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1, \"y\": \"z\"}"}}]},
	    {"role": "tool", "tool_call_id": "call_1", "content": "ok"}
	  ],
	  "max_tokens": 10, "max_completion_tokens": 20,
	  "temperature": 0.5, "top_p": 0.9, "top_k": 5, "min_p": 0.05,
	  "presence_penalty": 0.1, "frequency_penalty": -0.2, "repetition_penalty": 1.1, "seed": 42,
	  "stop": "END", "logprobs": true, "top_logprobs": 3, "n": 3,
	  "stream": true, "stream_options": {"include_usage": true},
	  "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
	  "tool_choice": "auto", "chat_template_kwargs": {"enable_thinking": false, "clear_thinking": false},
	  "response_format": {"type": "text"}, "ignore_eos": true, "speculative": false
	}`
	r, err := DecodeChatRequest([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	f := func(v float64) *float64 { return &v }
	i := func(v int) *int { return &v }
	seed := int64(42)
	wantSampling := Sampling{Temperature: f(0.5), TopP: f(0.9), TopK: i(5), MinP: f(0.05), PresencePenalty: f(0.1),
		FrequencyPenalty: f(-0.2), RepetitionPenalty: f(1.1), Seed: &seed}
	if !reflect.DeepEqual(r.Sampling, wantSampling) {
		t.Errorf("sampling %+v", r.Sampling)
	}
	if r.Model != "glm" || r.MaxTokens != 20 || !reflect.DeepEqual(r.Stop, []string{"END"}) || !r.Logprobs || r.TopLogprobs != 3 || r.N != 3 ||
		!r.Stream || !r.IncludeUsage || r.ToolChoice != ToolChoiceAuto || !r.IgnoreEOS || r.Speculative == nil || *r.Speculative ||
		r.EnableThinking == nil || *r.EnableThinking || r.ClearThinking == nil || *r.ClearThinking {
		t.Errorf("fields %+v", r)
	}
	if len(r.Tools) != 1 || r.Tools[0].Name != "f" || !json.Valid(r.Tools[0].Raw) {
		t.Errorf("tools %+v", r.Tools)
	}
	m := r.Messages
	if len(m) != 4 || m[0].Role != "system" || m[1].Content != "abc" || m[2].Content != "" || *m[2].ReasoningContent != "r" ||
		m[3].Role != "tool" || m[3].ToolCallID != "call_1" {
		t.Fatalf("messages %+v", m)
	}
	if tc := m[2].ToolCalls; len(tc) != 1 || tc[0].ID != "call_1" || tc[0].Name != "f" || string(tc[0].Arguments) != `{"x":1,"y":"z"}` {
		t.Errorf("tool calls %+v", tc)
	}
}

func TestDecodeChatRequestMinimal(t *testing.T) {
	r, err := DecodeChatRequest([]byte(`{"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if r.Stream || r.MaxTokens != 0 || r.Sampling != (Sampling{}) || r.ToolChoice != ToolChoiceAuto || r.EnableThinking != nil || r.Speculative != nil {
		t.Errorf("defaults %+v", r)
	}
	r, err = DecodeChatRequest([]byte(`{"messages":[{"role":"user","content":"hi"}],"thinking":{"type":"disabled"},"max_tokens":7}`))
	if err != nil || r.EnableThinking == nil || *r.EnableThinking || r.MaxTokens != 7 {
		t.Errorf("thinking alias: %+v %v", r, err)
	}
}

func TestDecodeErrors(t *testing.T) {
	msgs := `"messages":[{"role":"user","content":"x"}]`
	chat := []struct {
		body, param, msg string
	}{
		{``, "", "empty"},
		{`{`, "", "invalid JSON"},
		{`{} x`, "", "invalid JSON"},
		{`"str"`, "", "JSON object"},
		{`{"messages":[]}`, "messages", "must not be empty"},
		{`{}`, "messages", "required"},
		{`{"messages":[1]}`, "messages[0]", "object"},
		{`{"messages":[null]}`, "messages[0]", "null"},
		{`{"messages":[{"role":"bot","content":"x"}]}`, "messages[0].role", "must be one of"},
		{`{"messages":[{"role":7}]}`, "messages[0].role", "string"},
		{`{"messages":[{"role":"user","content":{"a":1}}]}`, "messages[0].content", "array of content parts"},
		{`{"messages":[{"role":"user","content":[{"text":"x"}]}]}`, "messages[0].content[0].type", "required"},
		{`{"messages":[{"role":"user","content":[{"type":"text"}]}]}`, "messages[0].content[0].text", "required"},
		{`{"messages":[{"role":"user","content":[{"type":"text","text":5}]}]}`, "messages[0].content[0].text", "string"},
		{`{"messages":[{"role":"user","content":[{"type":"input_audio"}]}]}`, "messages[0].content[0].type", "text only"},
		{`{"messages":[{"role":"user","content":"x","tool_calls":[]}, {"role":"user","content":"x","tool_calls":[{}]}]}`, "messages[1].tool_calls", "assistant"},
		{`{"messages":[{"role":"assistant","tool_calls":[{"function":{"arguments":"{}"}}]}]}`, "messages[0].tool_calls[0].function.name", "required"},
		{`{"messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"[1]"}}]}]}`, "messages[0].tool_calls[0].function.arguments", "JSON object"},
		{`{"messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"{bad"}}]}]}`, "messages[0].tool_calls[0].function.arguments", "JSON object"},
		{`{` + msgs + `,"temperature":"1"}`, "temperature", "number"},
		{`{` + msgs + `,"temperature":3}`, "temperature", "[0, 2]"},
		{`{` + msgs + `,"top_p":1.5}`, "top_p", "(0, 1]"},
		{`{` + msgs + `,"top_k":-2}`, "top_k", "-1"},
		{`{` + msgs + `,"top_k":1.5}`, "top_k", "integer"},
		{`{` + msgs + `,"min_p":-0.1}`, "min_p", "[0, 1]"},
		{`{` + msgs + `,"presence_penalty":2.5}`, "presence_penalty", "[-2, 2]"},
		{`{` + msgs + `,"frequency_penalty":true}`, "frequency_penalty", "number"},
		{`{` + msgs + `,"repetition_penalty":0}`, "repetition_penalty", "(0, 10]"},
		{`{` + msgs + `,"seed":"x"}`, "seed", "integer"},
		{`{` + msgs + `,"seed":1e30}`, "seed", "integer"},
		{`{` + msgs + `,"max_tokens":0}`, "max_tokens", "at least 1"},
		{`{` + msgs + `,"max_completion_tokens":-5}`, "max_completion_tokens", "at least 1"},
		{`{` + msgs + `,"max_tokens":"10"}`, "max_tokens", "integer"},
		{`{` + msgs + `,"stop":5}`, "stop", "string or an array"},
		{`{` + msgs + `,"stop":""}`, "stop", "empty"},
		{`{` + msgs + `,"stop":["a",""]}`, "stop[1]", "empty"},
		{`{` + msgs + `,"stop":["1","2","3","4","5","6","7","8","9","10","11","12","13","14","15","16","17"]}`, "stop", "limit is 16"},
		{`{` + msgs + `,"n":17}`, "n", "[1, 16]"},
		{`{` + msgs + `,"n":0}`, "n", "[1, 16]"},
		{`{` + msgs + `,"n":-1}`, "n", "[1, 16]"},
		{`{` + msgs + `,"n":"2"}`, "n", "integer"},
		{`{` + msgs + `,"logprobs":"yes"}`, "logprobs", "boolean"},
		{`{` + msgs + `,"speculative":"on"}`, "speculative", "boolean"},
		{`{` + msgs + `,"top_logprobs":3}`, "top_logprobs", "logprobs"},
		{`{` + msgs + `,"logprobs":true,"top_logprobs":21}`, "top_logprobs", "[0, 20]"},
		{`{` + msgs + `,"stream":"true"}`, "stream", "boolean"},
		{`{` + msgs + `,"stream_options":{"include_usage":true}}`, "stream_options", "stream set to true"},
		{`{` + msgs + `,"stream":true,"stream_options":{"include_usage":1}}`, "stream_options.include_usage", "boolean"},
		{`{` + msgs + `,"tools":{}}`, "tools", "array"},
		{`{` + msgs + `,"tools":[{"type":"retrieval"}]}`, "tools[0].type", "function"},
		{`{` + msgs + `,"tools":[{"type":"function","function":{}}]}`, "tools[0].function.name", "required"},
		{`{` + msgs + `,"tools":[{"type":"function","function":{"name":"a b"}}]}`, "tools[0].function.name", "letters"},
		{`{` + msgs + `,"tools":[{"type":"function","function":{"name":"f","parameters":[]}}]}`, "tools[0].function.parameters", "schema object"},
		{`{` + msgs + `,"tool_choice":"sometimes"}`, "tool_choice", "auto"},
		{`{` + msgs + `,"tool_choice":{"type":"function","function":{"name":"f"}}}`, "tool_choice.function.name", `names function "f", which is not among the tools`},
		{`{` + msgs + `,"tool_choice":"required"}`, "tool_choice", `"required" needs tools`},
		{`{` + msgs + `,"tool_choice":{"type":"tool"}}`, "tool_choice.type", `must be "function"`},
		{`{` + msgs + `,"tool_choice":3}`, "tool_choice", "string or an object"},
		{`{` + msgs + `,"chat_template_kwargs":{"enable_thinking":"no"}}`, "chat_template_kwargs.enable_thinking", "boolean"},
		{`{` + msgs + `,"thinking":{"type":"maybe"}}`, "thinking.type", "enabled"},
		{`{` + msgs + `,"response_format":{"type":"yaml"}}`, "response_format.type", `"yaml" must be "text", "json_object" or "json_schema"`},
		{`{` + msgs + `,"response_format":{"type":"json_schema","json_schema":{"schema":{"type":"object"}}},"guided_regex":"a"}`, "guided_regex", "both constrain the output"},
		{`{` + msgs + `,"guided_json":"{not json"}`, "guided_json", "not valid JSON"},
		{`{` + msgs + `,"guided_choice":[]}`, "guided_choice", "at least one choice"},
		{`{` + msgs + `,"logit_bias":{"5":1}}`, "logit_bias", "not supported"},
		{`{` + msgs + `,"model":5}`, "model", "string"},
	}
	for _, tc := range chat {
		_, err := DecodeChatRequest([]byte(tc.body))
		checkErr(t, tc.body, err, tc.param, tc.msg)
	}
	completion := []struct {
		body, param, msg string
	}{
		{`{}`, "prompt", "required"},
		{`{"prompt":5}`, "prompt", "expected a string"},
		{`{"prompt":[]}`, "prompt", "must not be empty"},
		{`{"prompt":["a",1]}`, "prompt[1]", "string"},
		{`{"prompt":[1,"a"]}`, "prompt", "token ids"},
		{`{"prompt":[1,-1]}`, "prompt", "out of range"},
		{`{"prompt":[1,4294967296]}`, "prompt", "out of range"},
		{`{"prompt":[[1],[]]}`, "prompt[1]", "must not be empty"},
		{`{"prompt":[[1],"a"]}`, "prompt[1]", "token ids"},
		{`{"prompt":["1","2","3","4","5","6","7","8","9","10","11","12","13","14","15","16","17"]}`, "prompt", "limit is 16"},
		{`{"prompt":"x","logprobs":true}`, "logprobs", "integer"},
		{`{"prompt":"x","logprobs":21}`, "logprobs", "[0, 20]"},
		{`{"prompt":"x","echo":true,"logprobs":1}`, "echo", "not supported"},
		{`{"prompt":"x","best_of":2}`, "best_of", "only best_of=1"},
		{`{"prompt":"x","suffix":"y"}`, "suffix", "not supported"},
		{`{"prompt":"x","n":17}`, "n", "[1, 16]"},
		{`{"prompt":"x","n":0}`, "n", "[1, 16]"},
		{`{"prompt":["a","b","c","d","e"],"n":16}`, "n", "80 choices; the limit is 64"},
		{`{"prompt":"x","max_tokens":0}`, "max_tokens", "at least 1"},
		{`{"prompt":"x","temperature":-1}`, "temperature", "[0, 2]"},
	}
	for _, tc := range completion {
		_, err := DecodeCompletionRequest([]byte(tc.body))
		checkErr(t, tc.body, err, tc.param, tc.msg)
	}
}

func checkErr(t *testing.T, body string, err *Error, param, msg string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: no error, want one naming %q", body, param)
		return
	}
	if err.Status != http.StatusBadRequest || err.Type != TypeInvalidRequest || err.Param != param || !strings.Contains(err.Message, msg) {
		t.Errorf("%s:\n got status %d param %q message %q\nwant 400, param %q, message containing %q", body, err.Status, err.Param, err.Message, param, msg)
	}
	b, jerr := json.Marshal(err.Body())
	if jerr != nil || !strings.Contains(string(b), `"error":{"message":`) {
		t.Errorf("error body %s %v", b, jerr)
	}
}

func TestDecodeCompletionPrompts(t *testing.T) {
	for _, tc := range []struct {
		prompt string
		want   []Prompt
	}{
		{`"hi"`, []Prompt{{Text: "hi"}}},
		{`["a","b"]`, []Prompt{{Text: "a"}, {Text: "b"}}},
		{`[1,2,3]`, []Prompt{{TokenIDs: []int32{1, 2, 3}, IsTokens: true}}},
		{`[[1],[2,3]]`, []Prompt{{TokenIDs: []int32{1}, IsTokens: true}, {TokenIDs: []int32{2, 3}, IsTokens: true}}},
	} {
		r, err := DecodeCompletionRequest([]byte(`{"prompt":` + tc.prompt + `,"logprobs":0,"echo":false,"speculative":true}`))
		if err != nil {
			t.Errorf("%s: %v", tc.prompt, err)
			continue
		}
		if !reflect.DeepEqual(r.Prompts, tc.want) || r.Logprobs == nil || *r.Logprobs != 0 || r.Speculative == nil || !*r.Speculative {
			t.Errorf("%s: got %+v", tc.prompt, r)
		}
	}
}

func TestDecodeN(t *testing.T) {
	for _, tc := range []struct {
		body string
		chat bool
		want int
	}{
		{`{"messages":[{"role":"user","content":"x"}]}`, true, 1},
		{`{"messages":[{"role":"user","content":"x"}],"n":null}`, true, 1},
		{`{"messages":[{"role":"user","content":"x"}],"n":16}`, true, 16},
		{`{"prompt":"x"}`, false, 1},
		{`{"prompt":"x","n":2}`, false, 2},
		{`{"prompt":["a","b","c","d"],"n":16}`, false, 16},
	} {
		var got int
		if tc.chat {
			r, err := DecodeChatRequest([]byte(tc.body))
			if err != nil {
				t.Fatalf("%s: %v", tc.body, err)
			}
			got = r.N
		} else {
			r, err := DecodeCompletionRequest([]byte(tc.body))
			if err != nil {
				t.Fatalf("%s: %v", tc.body, err)
			}
			got = r.N
		}
		if got != tc.want {
			t.Errorf("%s: n = %d, want %d", tc.body, got, tc.want)
		}
	}
}

// The structured-output fields decode into one Format.
func TestDecodeFormat(t *testing.T) {
	const msgs = `"messages":[{"role":"user","content":"x"}]`
	tests := []struct {
		body string
		want *Format
	}{
		{`{` + msgs + `}`, nil},
		{`{` + msgs + `,"response_format":{"type":"text"}}`, nil},
		{`{` + msgs + `,"response_format":{"type":"json_object"}}`, &Format{Kind: FormatJSONObject, Param: "response_format"}},
		{`{` + msgs + `,"response_format":{"type":"json_schema","json_schema":{"name":"p","schema":{"type":"object"},"strict":true}}}`,
			&Format{Kind: FormatJSONSchema, Schema: json.RawMessage(`{"type":"object"}`), Name: "p", Param: "response_format.json_schema.schema"}},
		{`{` + msgs + `,"guided_json":"{\"type\":\"array\"}"}`, &Format{Kind: FormatJSONSchema, Schema: json.RawMessage(`{"type":"array"}`), Param: "guided_json"}},
		{`{` + msgs + `,"guided_regex":"[0-9]+"}`, &Format{Kind: FormatRegex, Pattern: "[0-9]+", Param: "guided_regex"}},
		{`{` + msgs + `,"guided_grammar":"start: \"a\""}`, &Format{Kind: FormatGrammar, Grammar: `start: "a"`, Param: "guided_grammar"}},
		{`{` + msgs + `,"guided_choice":["a.b","c"]}`, &Format{Kind: FormatRegex, Pattern: `(a\.b|c)`, Param: "guided_choice"}},
	}
	for _, tt := range tests {
		req, err := DecodeChatRequest([]byte(tt.body))
		if err != nil {
			t.Fatalf("%s: %v", tt.body, err)
		}
		if !reflect.DeepEqual(req.Format, tt.want) {
			t.Errorf("%s: format %+v, want %+v", tt.body, req.Format, tt.want)
		}
	}
}
