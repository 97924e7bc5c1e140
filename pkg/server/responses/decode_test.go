package responses

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

func ptr[T any](v T) *T { return &v }

func TestDecodeRequest(t *testing.T) {
	cases := []struct {
		name string
		body string
		want Request
	}{
		{"string input", `{"model":"m","input":"hi"}`,
			Request{Model: "m", ToolChoice: ToolChoiceAuto, Input: []InputItem{{Type: ItemMessage, Role: RoleUser, Text: "hi"}}}},
		{"everything", `{"model":"m","instructions":"Be brief.","max_output_tokens":64,"temperature":0.5,"top_p":0.9,"stream":true,
			"store":false,"previous_response_id":null,"parallel_tool_calls":false,"reasoning":{"effort":"high","summary":"auto"},
			"text":{"format":{"type":"text"},"verbosity":"low"},"truncation":"disabled","include":["reasoning.encrypted_content"],
			"metadata":{"k":"v"},"user":"u1","service_tier":"auto","prompt_cache_key":"x",
			"tools":[{"type":"function","name":"get_weather","description":"Weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}},"strict":true},
				{"type":"function","name":"noop","parameters":null,"strict":null}],
			"tool_choice":"auto",
			"input":[
				{"role":"system","content":"sys"},
				{"type":"message","role":"developer","content":[{"type":"input_text","text":"dev"}]},
				{"role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_text","text":"b"}]},
				{"type":"reasoning","id":"rs_1","summary":[],"content":[{"type":"reasoning_text","text":"t1"},{"type":"reasoning_text","text":"t2"}],"encrypted_content":null,"status":"completed"},
				{"type":"message","id":"msg_1","role":"assistant","status":"completed","content":[{"type":"output_text","text":"calling","annotations":[]},{"type":"refusal","refusal":"!"}]},
				{"type":"function_call","id":"fc_1","call_id":"call_1","name":"get_weather","arguments":"{ \"city\" : \"Paris\" }","status":"completed"},
				{"type":"function_call_output","call_id":"call_1","output":"21C"},
				{"type":"function_call_output","call_id":"call_2","output":[{"type":"input_text","text":"r"}]},
				{"type":"reasoning","summary":[{"type":"summary_text","text":"s1"},{"type":"summary_text","text":"s2"}]},
				{"type":"function_call","call_id":"call_3","name":"noop","arguments":""}
			]}`,
			Request{Model: "m", Instructions: "Be brief.", MaxOutputTokens: 64, Temperature: ptr(0.5), TopP: ptr(0.9), Stream: true,
				ParallelToolCalls: ptr(false), Reasoning: Reasoning{Effort: ptr("high"), Summary: ptr("auto")}, Thinking: ptr(true),
				Metadata: map[string]string{"k": "v"}, User: ptr("u1"), ToolChoice: ToolChoiceAuto,
				Tools: []Tool{
					{Name: "get_weather", Description: ptr("Weather"), Parameters: json.RawMessage(`{"type":"object","properties":{"city":{"type":"string"}}}`), Strict: ptr(true)},
					{Name: "noop"},
				},
				Input: []InputItem{
					{Type: ItemMessage, Role: RoleSystem, Text: "sys"},
					{Type: ItemMessage, Role: RoleDeveloper, Text: "dev"},
					{Type: ItemMessage, Role: RoleUser, Text: "ab"},
					{Type: ItemReasoning, Text: "t1\nt2"},
					{Type: ItemMessage, Role: RoleAssistant, Text: "calling!"},
					{Type: ItemFunctionCall, CallID: "call_1", Name: "get_weather", Arguments: json.RawMessage(`{"city":"Paris"}`)},
					{Type: ItemFunctionCallOutput, CallID: "call_1", Text: "21C"},
					{Type: ItemFunctionCallOutput, CallID: "call_2", Text: "r"},
					{Type: ItemReasoning, Text: "s1\ns2"},
					{Type: ItemFunctionCall, CallID: "call_3", Name: "noop", Arguments: json.RawMessage(`{}`)},
				}}},
		{"reasoning effort none turns thinking off, tool_choice none", `{"input":"x","reasoning":{"effort":"none"},"tool_choice":"none","store":null,"truncation":"auto"}`,
			Request{ToolChoice: ToolChoiceNone, Reasoning: Reasoning{Effort: ptr("none")}, Thinking: ptr(false),
				Input: []InputItem{{Type: ItemMessage, Role: RoleUser, Text: "x"}}}},
		{"reasoning without effort keeps the default", `{"input":"x","reasoning":{"summary":"detailed"}}`,
			Request{ToolChoice: ToolChoiceAuto, Reasoning: Reasoning{Summary: ptr("detailed")},
				Input: []InputItem{{Type: ItemMessage, Role: RoleUser, Text: "x"}}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodeRequest([]byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(*got, tc.want) {
				t.Errorf("got  %+v\nwant %+v", *got, tc.want)
			}
		})
	}
}

func TestDecodeErrors(t *testing.T) {
	const in = `"input":"x"`
	cases := []struct {
		name, body, param, contains string
	}{
		{"empty body", ``, "", "empty"},
		{"not an object", `[1]`, "", "JSON object"},
		{"bad JSON", `{"input":`, "", "invalid JSON"},
		{"input missing", `{"model":"m"}`, "input", "field required"},
		{"input null", `{"input":null}`, "input", "field required"},
		{"input number", `{"input":5}`, "input", "string or an array"},
		{"input empty array", `{"input":[]}`, "input", "must not be empty"},
		{"model number", `{"model":5,` + in + `}`, "model", "string"},
		{"item null", `{"input":[null]}`, "input[0]", "null"},
		{"item not an object", `{"input":["hi"]}`, "input[0]", "object"},
		{"unknown item type", `{"input":[{"type":"web_search_call","id":"x"}]}`, "input[0].type", "not supported"},
		{"item_reference", `{"input":[{"type":"item_reference","id":"msg_1"}]}`, "input[0].type", "stores no items"},
		{"role missing", `{"input":[{"content":"x"}]}`, "input[0].role", "field required"},
		{"role tool", `{"input":[{"role":"tool","content":"x"}]}`, "input[0].role", "must be one of"},
		{"content missing", `{"input":[{"role":"user"}]}`, "input[0].content", "field required"},
		{"content number", `{"input":[{"role":"user","content":5}]}`, "input[0].content", "string or an array"},
		{"content part null", `{"input":[{"role":"user","content":[null]}]}`, "input[0].content[0]", "null"},
		{"content part without type", `{"input":[{"role":"user","content":[{"text":"a"}]}]}`, "input[0].content[0].type", "field required"},
		{"content part without text", `{"input":[{"role":"user","content":[{"type":"input_text"}]}]}`, "input[0].content[0].text", "field required"},
		{"content text number", `{"input":[{"role":"user","content":[{"type":"input_text","text":1}]}]}`, "input[0].content[0].text", "string"},
		{"image", `{"input":[{"role":"user","content":[{"type":"input_image","image_url":"data:"}]}]}`, "input[0].content[0].type", "text only"},
		{"output_text in a user message", `{"input":[{"role":"user","content":[{"type":"output_text","text":"a"}]}]}`, "input[0].content[0].type", "input_text"},
		{"input_text in an assistant message", `{"input":[{"role":"assistant","content":[{"type":"input_text","text":"a"}]}]}`, "input[0].content[0].type", "output_text"},
		{"refusal without refusal", `{"input":[{"role":"assistant","content":[{"type":"refusal","text":"a"}]}]}`, "input[0].content[0].refusal", "field required"},
		{"function_call without call_id", `{"input":[{"type":"function_call","name":"f","arguments":"{}"}]}`, "input[0].call_id", "field required"},
		{"function_call without name", `{"input":[{"type":"function_call","call_id":"c","arguments":"{}"}]}`, "input[0].name", "field required"},
		{"function_call without arguments", `{"input":[{"type":"function_call","call_id":"c","name":"f"}]}`, "input[0].arguments", "field required"},
		{"function_call arguments object", `{"input":[{"type":"function_call","call_id":"c","name":"f","arguments":{"a":1}}]}`, "input[0].arguments", "string"},
		{"function_call arguments array", `{"input":[{"type":"function_call","call_id":"c","name":"f","arguments":"[1]"}]}`, "input[0].arguments", "JSON object"},
		{"function_call_output without output", `{"input":[{"type":"function_call_output","call_id":"c"}]}`, "input[0].output", "field required"},
		{"function_call_output image", `{"input":[{"type":"function_call_output","call_id":"c","output":[{"type":"input_image"}]}]}`, "input[0].output[0].type", "text only"},
		{"reasoning content bad part", `{"input":[{"type":"reasoning","summary":[],"content":[{"type":"output_text","text":"a"}]}]}`, "input[0].content[0].type", "reasoning_text"},
		{"reasoning summary string", `{"input":[{"type":"reasoning","summary":"x"}]}`, "input[0].summary", "summary_text"},
		{"store true", `{"store":true,` + in + `}`, "store", "stores no responses"},
		{"previous_response_id", `{"previous_response_id":"resp_1",` + in + `}`, "previous_response_id", "not supported"},
		{"conversation", `{"conversation":"conv_1",` + in + `}`, "conversation", "not supported"},
		{"background", `{"background":true,` + in + `}`, "background", "not supported"},
		{"stored prompt", `{"prompt":{"id":"pmpt_1"},` + in + `}`, "prompt", "not supported"},
		{"max_output_tokens zero", `{"max_output_tokens":0,` + in + `}`, "max_output_tokens", "at least 1"},
		{"max_output_tokens string", `{"max_output_tokens":"5",` + in + `}`, "max_output_tokens", "integer"},
		{"temperature above 2", `{"temperature":2.5,` + in + `}`, "temperature", "[0, 2]"},
		{"temperature string", `{"temperature":"hot",` + in + `}`, "temperature", "number"},
		{"top_p zero", `{"top_p":0,` + in + `}`, "top_p", "(0, 1]"},
		{"stream string", `{"stream":"yes",` + in + `}`, "stream", "boolean"},
		{"instructions array", `{"instructions":[{"role":"system","content":"x"}],` + in + `}`, "instructions", "string"},
		{"reasoning effort", `{"reasoning":{"effort":"extreme"},` + in + `}`, "reasoning.effort", "must be one of"},
		{"reasoning summary", `{"reasoning":{"summary":"long"},` + in + `}`, "reasoning.summary", "auto"},
		{"json schema output without a schema", `{"text":{"format":{"type":"json_schema","name":"x"}},` + in + `}`, "text.format.schema", "required"},
		{"unknown output format", `{"text":{"format":{"type":"yaml"}},` + in + `}`, "text.format.type", `must be "text"`},
		{"top_logprobs", `{"top_logprobs":2,` + in + `}`, "top_logprobs", "not supported"},
		{"include logprobs", `{"include":["message.output_text.logprobs"],` + in + `}`, "include", "not supported"},
		{"truncation", `{"truncation":"middle",` + in + `}`, "truncation", "auto"},
		{"metadata number", `{"metadata":{"k":1},` + in + `}`, "metadata", "string"},
		{"metadata too many", `{"metadata":{` + manyPairs(17) + `},` + in + `}`, "metadata", "limit is 16"},
		{"hosted tool", `{"tools":[{"type":"web_search"}],` + in + `}`, "tools[0].type", "hosted tools"},
		{"tool null", `{"tools":[null],` + in + `}`, "tools[0]", "null"},
		{"tool without type", `{"tools":[{"name":"f"}],` + in + `}`, "tools[0].type", "field required"},
		{"chat-style tool", `{"tools":[{"type":"function","function":{"name":"f"}}],` + in + `}`, "tools[0].name", "flat"},
		{"tool bad name", `{"tools":[{"type":"function","name":"a b"}],` + in + `}`, "tools[0].name", "letters"},
		{"tool repeated", `{"tools":[{"type":"function","name":"f"},{"type":"function","name":"f"}],` + in + `}`, "tools[1].name", "unique"},
		{"tool parameters array", `{"tools":[{"type":"function","name":"f","parameters":[1]}],` + in + `}`, "tools[0].parameters", "JSON schema object"},
		{"tool strict string", `{"tools":[{"type":"function","name":"f","strict":"yes"}],` + in + `}`, "tools[0].strict", "boolean"},
		{"tool_choice required without tools", `{"tool_choice":"required",` + in + `}`, "tool_choice", "needs tools"},
		{"tool_choice unknown", `{"tool_choice":"sometimes",` + in + `}`, "tool_choice", "auto"},
		{"tool_choice function not offered", `{"tool_choice":{"type":"function","name":"f"},` + in + `}`, "tool_choice.name", "not among the tools"},
		{"tool_choice of another type", `{"tool_choice":{"type":"web_search"},` + in + `}`, "tool_choice.type", "not supported"},
		{"tool_choice number", `{"tool_choice":1,` + in + `}`, "tool_choice", "expected"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeRequest([]byte(tc.body))
			if err == nil {
				t.Fatal("no error")
			}
			if err.Status != 400 || err.Type != "invalid_request_error" || err.Param != tc.param || !strings.Contains(err.Message, tc.contains) {
				t.Errorf("got %d %s param %q %q; want param %q, message containing %q", err.Status, err.Type, err.Param, err.Message, tc.param, tc.contains)
			}
			if tc.param != "" && !strings.HasPrefix(err.Message, tc.param) {
				t.Errorf("message %q does not start with the field %q", err.Message, tc.param)
			}
		})
	}
}

func manyPairs(n int) string {
	var pairs []string
	for i := range n {
		pairs = append(pairs, `"k`+strings.Repeat("x", i)+`":"v"`)
	}
	return strings.Join(pairs, ",")
}

func TestWireShapes(t *testing.T) {
	cases := []struct {
		v    any
		want string
	}{
		{OutputItem{Type: ItemMessage, ID: "msg_1", Status: StatusInProgress},
			`{"id":"msg_1","type":"message","status":"in_progress","role":"assistant","content":[]}`},
		{OutputItem{Type: ItemMessage, ID: "msg_1", Status: StatusCompleted, Content: []ContentPart{{Type: PartOutputText, Text: "hi"}}},
			`{"id":"msg_1","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"hi","annotations":[],"logprobs":[]}]}`},
		{OutputItem{Type: ItemReasoning, ID: "rs_1", Status: StatusIncomplete, Content: []ContentPart{{Type: PartReasoningText, Text: "hm"}}},
			`{"id":"rs_1","type":"reasoning","summary":[],"content":[{"type":"reasoning_text","text":"hm"}],"status":"incomplete"}`},
		{OutputItem{Type: ItemFunctionCall, ID: "fc_1", Status: StatusCompleted, CallID: "call_1", Name: "f", Arguments: `{"a":1}`},
			`{"id":"fc_1","type":"function_call","status":"completed","arguments":"{\"a\":1}","call_id":"call_1","name":"f"}`},
		{NewTextDelta(PartOutputText, "msg_1", 1, 0, "x"),
			`{"type":"response.output_text.delta","sequence_number":0,"item_id":"msg_1","output_index":1,"content_index":0,"delta":"x","logprobs":[]}`},
		{NewTextDelta(PartReasoningText, "rs_1", 0, 0, "x"),
			`{"type":"response.reasoning_text.delta","sequence_number":0,"item_id":"rs_1","output_index":0,"content_index":0,"delta":"x"}`},
		{NewTextDone(PartOutputText, "msg_1", 1, 0, "xy"),
			`{"type":"response.output_text.done","sequence_number":0,"item_id":"msg_1","output_index":1,"content_index":0,"text":"xy","logprobs":[]}`},
		{NewTextDone(PartReasoningText, "rs_1", 0, 0, "xy"),
			`{"type":"response.reasoning_text.done","sequence_number":0,"item_id":"rs_1","output_index":0,"content_index":0,"text":"xy"}`},
		{NewContentPartEvent(EventContentPartAdded, "msg_1", 2, 0, ContentPart{Type: PartOutputText}),
			`{"type":"response.content_part.added","sequence_number":0,"item_id":"msg_1","output_index":2,"content_index":0,"part":{"type":"output_text","text":"","annotations":[],"logprobs":[]}}`},
		{NewFunctionArgsDelta("fc_1", 0, `{}`), `{"type":"response.function_call_arguments.delta","sequence_number":0,"item_id":"fc_1","output_index":0,"delta":"{}"}`},
		{NewFunctionArgsDone("fc_1", 0, `{}`), `{"type":"response.function_call_arguments.done","sequence_number":0,"item_id":"fc_1","output_index":0,"arguments":"{}"}`},
		{NewOutputItemEvent(EventOutputItemAdded, 0, OutputItem{Type: ItemFunctionCall, ID: "fc_1", Status: StatusInProgress, CallID: "c", Name: "f"}),
			`{"type":"response.output_item.added","sequence_number":0,"output_index":0,"item":{"id":"fc_1","type":"function_call","status":"in_progress","arguments":"","call_id":"c","name":"f"}}`},
	}
	for _, tc := range cases {
		b, err := json.Marshal(tc.v)
		if err != nil {
			t.Fatal(err)
		}
		if string(b) != tc.want {
			t.Errorf("%T:\n got %s\nwant %s", tc.v, b, tc.want)
		}
		if ev, ok := tc.v.(StreamEvent); ok {
			var typ struct{ Type string }
			_ = json.Unmarshal(b, &typ)
			if ev.Header().Type != typ.Type {
				t.Errorf("%T: header type %q, JSON type %q", tc.v, ev.Header().Type, typ.Type)
			}
		}
	}
	// The sender numbers events through the header.
	ev := NewResponseEvent(EventCreated, Response{})
	ev.Header().SequenceNumber = 7
	if b, _ := json.Marshal(ev); !strings.HasPrefix(string(b), `{"type":"response.created","sequence_number":7,"response":{`) {
		t.Errorf("numbered event %s", b)
	}
}
