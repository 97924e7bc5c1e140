package server

import (
	"encoding/json"
	"reflect"
	"strconv"
	"testing"

	"github.com/glmctl/glmctl/pkg/engine"
	"github.com/glmctl/glmctl/pkg/server/openai"
	"github.com/glmctl/glmctl/pkg/server/responses"
	"github.com/glmctl/glmctl/pkg/tokenizer/chat"
)

func TestToResponsesPrompt(t *testing.T) {
	on, off := true, false
	msg := func(role, text string) responses.InputItem {
		return responses.InputItem{Type: responses.ItemMessage, Role: role, Text: text}
	}
	reasoning := func(text string) responses.InputItem {
		return responses.InputItem{Type: responses.ItemReasoning, Text: text}
	}
	call := func(id, name, args string) responses.InputItem {
		return responses.InputItem{Type: responses.ItemFunctionCall, CallID: id, Name: name, Arguments: json.RawMessage(args)}
	}
	output := func(id, text string) responses.InputItem {
		return responses.InputItem{Type: responses.ItemFunctionCallOutput, CallID: id, Text: text}
	}
	toolCall := func(id, name, args string) chat.ToolCall {
		return chat.ToolCall{ID: id, Type: "function", Function: chat.FunctionCall{Name: name, Arguments: json.RawMessage(args)}}
	}
	tool := responses.Tool{Name: "get_weather", Parameters: json.RawMessage(`{"type":"object"}`)}
	cases := []struct {
		name string
		in   responses.Request
		want chatPrompt
	}{
		{"instructions and a question, thinking by default",
			responses.Request{Instructions: "Be brief.", Input: []responses.InputItem{msg("user", "a")}},
			chatPrompt{thinking: true, messages: []chat.Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "a"}}}},
		{"system and developer messages are system messages; effort none turns thinking off",
			responses.Request{Thinking: &off, Input: []responses.InputItem{msg("system", "s"), msg("developer", "d"), msg("user", "u")}},
			chatPrompt{enableThinking: &off, messages: []chat.Message{{Role: "system", Content: "s"}, {Role: "system", Content: "d"}, {Role: "user", Content: "u"}}}},
		{"reasoning effort on",
			responses.Request{Thinking: &on, Input: []responses.InputItem{msg("user", "a")}},
			chatPrompt{enableThinking: &on, thinking: true, messages: []chat.Message{{Role: "user", Content: "a"}}}},
		{"a turn's reasoning, message and function calls are one assistant message",
			responses.Request{Tools: []responses.Tool{tool}, ToolChoice: responses.ToolChoiceAuto, Input: []responses.InputItem{
				msg("user", "weather?"),
				reasoning("t1"), msg("assistant", "calling"), call("call_1", "get_weather", `{"city":"Paris"}`), call("call_2", "get_weather", `{"city":"Rome"}`),
				output("call_1", "21C"), output("call_2", "no data"),
				reasoning("t2"), call("call_3", "get_weather", `{}`),
				output("call_3", "?"),
				msg("user", "thanks"),
			}},
			chatPrompt{thinking: true, tools: []json.RawMessage{json.RawMessage(`{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}`)},
				messages: []chat.Message{
					{Role: "user", Content: "weather?"},
					{Role: "assistant", Content: "calling", ReasoningContent: ptr("t1"), ToolCalls: []chat.ToolCall{
						toolCall("call_1", "get_weather", `{"city":"Paris"}`), toolCall("call_2", "get_weather", `{"city":"Rome"}`)}},
					{Role: "tool", Content: "21C", ToolCallID: "call_1"},
					{Role: "tool", Content: "no data", ToolCallID: "call_2"},
					{Role: "assistant", ReasoningContent: ptr("t2"), ToolCalls: []chat.ToolCall{toolCall("call_3", "get_weather", `{}`)}},
					{Role: "tool", Content: "?", ToolCallID: "call_3"},
					{Role: "user", Content: "thanks"},
				}}},
		{"items out of a turn's order start new turns; tool_choice none hides the tools",
			responses.Request{Tools: []responses.Tool{tool}, ToolChoice: responses.ToolChoiceNone, Input: []responses.InputItem{
				msg("user", "q"), call("c1", "f", `{}`), msg("assistant", "after"), reasoning("r1"), reasoning("r2"), msg("assistant", "a1"), msg("assistant", "a2"),
			}},
			chatPrompt{thinking: true, messages: []chat.Message{
				{Role: "user", Content: "q"},
				{Role: "assistant", ToolCalls: []chat.ToolCall{toolCall("c1", "f", `{}`)}},
				{Role: "assistant", Content: "after"},
				{Role: "assistant", ReasoningContent: ptr("r1")},
				{Role: "assistant", Content: "a1", ReasoningContent: ptr("r2")},
				{Role: "assistant", Content: "a2"},
			}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := toResponsesPrompt(&tc.in)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestResponsesToolObjects(t *testing.T) {
	desc := `Weather <"now">`
	tools := []responses.Tool{
		{Name: "get_weather", Description: &desc, Parameters: json.RawMessage(`{"type":"object","properties":{"z":{},"a":{}}}`), Strict: ptr(true)},
		{Name: "noop"},
	}
	got := responsesToolObjects(tools, responses.ToolChoiceAuto)
	want := []string{
		`{"type":"function","function":{"name":"get_weather","description":"Weather \u003c\"now\"\u003e","parameters":{"type":"object","properties":{"z":{},"a":{}}}}}`,
		`{"type":"function","function":{"name":"noop"}}`,
	}
	if len(got) != len(want) {
		t.Fatalf("%d tools", len(got))
	}
	for i := range want {
		if string(got[i]) != want[i] {
			t.Errorf("tool %d: %s, want %s", i, got[i], want[i])
		}
	}
	if responsesToolObjects(tools, responses.ToolChoiceNone) != nil || responsesToolObjects(nil, responses.ToolChoiceAuto) != nil {
		t.Error("tool_choice none or no tools should offer none")
	}
}

func TestToResponseStatusAndUsage(t *testing.T) {
	if toResponseStatus(engine.FinishStop) != "completed" || toResponseStatus(engine.FinishLength) != "incomplete" {
		t.Error("status")
	}
	u, _ := json.Marshal(toResponsesUsage(engine.Usage{PromptTokens: 7, CompletionTokens: 3, CachedPromptTokens: 4}, 5))
	want := `{"input_tokens":7,"input_tokens_details":{"cached_tokens":4,"cache_write_tokens":0},"output_tokens":3,"output_tokens_details":{"reasoning_tokens":3},"total_tokens":10}`
	if string(u) != want {
		t.Errorf("usage %s\n want %s", u, want)
	}
	for _, tc := range []struct {
		e    *openai.Error
		want responses.ResponseError
	}{
		{&openai.Error{Status: 500, Message: "boom"}, responses.ResponseError{Code: "server_error", Message: "boom"}},
		{&openai.Error{Status: 503, Message: "stopping"}, responses.ResponseError{Code: "server_error", Message: "stopping"}},
		{&openai.Error{Status: 429, Message: "busy"}, responses.ResponseError{Code: "rate_limit_exceeded", Message: "busy"}},
	} {
		if got := toResponseError(tc.e); *got != tc.want {
			t.Errorf("%v: %+v", tc.e, *got)
		}
	}
}

func TestToResponse(t *testing.T) {
	d := SamplingDefaults{Temperature: 0.6, TopP: 0.95}
	m := meta{id: "resp_1", model: "glm", created: 1700000000}
	minimal := &responses.Request{ToolChoice: responses.ToolChoiceAuto}
	b, _ := json.Marshal(toResponse(m, minimal, d, responses.StatusInProgress, nil, nil))
	want := `{"id":"resp_1","object":"response","created_at":1700000000,"status":"in_progress","error":null,"incomplete_details":null,` +
		`"instructions":null,"max_output_tokens":null,"model":"glm","output":[],"parallel_tool_calls":true,"previous_response_id":null,` +
		`"reasoning":{"effort":null,"summary":null},"store":false,"temperature":0.6,"text":{"format":{"type":"text"}},"tool_choice":"auto",` +
		`"tools":[],"top_p":0.95,"truncation":"disabled","usage":null,"user":null,"metadata":{}}`
	if string(b) != want {
		t.Errorf("in progress:\n got %s\nwant %s", b, want)
	}
	full := &responses.Request{Instructions: "Be brief.", MaxOutputTokens: 3, Temperature: ptr(0.0), TopP: ptr(0.5), ToolChoice: responses.ToolChoiceNone,
		ParallelToolCalls: ptr(false), Reasoning: responses.Reasoning{Effort: ptr("low")}, Metadata: map[string]string{"k": "v"}, User: ptr("u"),
		Tools: []responses.Tool{{Name: "f", Parameters: json.RawMessage(`{"type":"object"}`), Strict: ptr(true)}}}
	items := []responses.OutputItem{{Type: responses.ItemMessage, ID: "msg_1", Status: responses.StatusIncomplete,
		Content: []responses.ContentPart{{Type: responses.PartOutputText, Text: "abc"}}}}
	b, _ = json.Marshal(toResponse(m, full, d, responses.StatusIncomplete, items, toResponsesUsage(engine.Usage{PromptTokens: 9, CompletionTokens: 3}, 0)))
	want = `{"id":"resp_1","object":"response","created_at":1700000000,"status":"incomplete","error":null,"incomplete_details":{"reason":"max_output_tokens"},` +
		`"instructions":"Be brief.","max_output_tokens":3,"model":"glm",` +
		`"output":[{"id":"msg_1","type":"message","status":"incomplete","role":"assistant","content":[{"type":"output_text","text":"abc","annotations":[],"logprobs":[]}]}],` +
		`"parallel_tool_calls":false,"previous_response_id":null,"reasoning":{"effort":"low","summary":null},"store":false,"temperature":0,` +
		`"text":{"format":{"type":"text"}},"tool_choice":"none","tools":[{"type":"function","name":"f","description":null,"parameters":{"type":"object"},"strict":true}],` +
		`"top_p":0.5,"truncation":"disabled","usage":{"input_tokens":9,"input_tokens_details":{"cached_tokens":0,"cache_write_tokens":0},"output_tokens":3,` +
		`"output_tokens_details":{"reasoning_tokens":0},"total_tokens":12},"user":"u","metadata":{"k":"v"}}`
	if string(b) != want {
		t.Errorf("incomplete:\n got %s\nwant %s", b, want)
	}
}

// The output builder opens an item when the kind of output changes,
// closes the previous one first (text done, part done, item done), sends a
// function call as one whole item, and counts the tokens whose text became
// reasoning (held-back tokens count with the text that comes out next).
func TestOutputBuilder(t *testing.T) {
	call := func(name, args string) chatPiece {
		idx := 0
		return chatPiece{kind: chat.EventToolCall, call: &openai.ToolCall{Index: &idx, ID: "call_x", Type: "function",
			Function: openai.FunctionCall{Name: name, Arguments: args}}}
	}
	reasoning := func(s string) chatPiece { return chatPiece{kind: chat.EventReasoning, text: s} }
	content := func(s string) chatPiece { return chatPiece{kind: chat.EventContent, text: s} }
	n := 0
	b := outputBuilder{newID: func(prefix string) string { n++; return prefix + strconv.Itoa(n) }}
	var got []string
	emit := func(evs []responses.StreamEvent) {
		for _, ev := range evs {
			j, err := json.Marshal(ev)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, string(j))
		}
	}
	for _, step := range [][]chatPiece{
		{reasoning("Let me")}, {}, {reasoning(" think.")}, {}, {content("Hi")}, {content("!"), call("get_weather", `{"city":"Paris"}`)},
		{}, {}, {call("noop", "")}, {content("done")},
	} {
		b.sampled()
		emit(b.add(step))
	}
	emit(b.closeItem(responses.StatusIncomplete))
	if len(b.closeItem(responses.StatusCompleted)) != 0 {
		t.Error("closeItem twice closed twice")
	}
	const h = `"sequence_number":0,`
	want := []string{
		`{"type":"response.output_item.added",` + h + `"output_index":0,"item":{"id":"rs_1","type":"reasoning","summary":[],"content":[],"status":"in_progress"}}`,
		`{"type":"response.content_part.added",` + h + `"item_id":"rs_1","output_index":0,"content_index":0,"part":{"type":"reasoning_text","text":""}}`,
		`{"type":"response.reasoning_text.delta",` + h + `"item_id":"rs_1","output_index":0,"content_index":0,"delta":"Let me"}`,
		`{"type":"response.reasoning_text.delta",` + h + `"item_id":"rs_1","output_index":0,"content_index":0,"delta":" think."}`,
		`{"type":"response.reasoning_text.done",` + h + `"item_id":"rs_1","output_index":0,"content_index":0,"text":"Let me think."}`,
		`{"type":"response.content_part.done",` + h + `"item_id":"rs_1","output_index":0,"content_index":0,"part":{"type":"reasoning_text","text":"Let me think."}}`,
		`{"type":"response.output_item.done",` + h + `"output_index":0,"item":{"id":"rs_1","type":"reasoning","summary":[],"content":[{"type":"reasoning_text","text":"Let me think."}],"status":"completed"}}`,
		`{"type":"response.output_item.added",` + h + `"output_index":1,"item":{"id":"msg_2","type":"message","status":"in_progress","role":"assistant","content":[]}}`,
		`{"type":"response.content_part.added",` + h + `"item_id":"msg_2","output_index":1,"content_index":0,"part":{"type":"output_text","text":"","annotations":[],"logprobs":[]}}`,
		`{"type":"response.output_text.delta",` + h + `"item_id":"msg_2","output_index":1,"content_index":0,"delta":"Hi","logprobs":[]}`,
		`{"type":"response.output_text.delta",` + h + `"item_id":"msg_2","output_index":1,"content_index":0,"delta":"!","logprobs":[]}`,
		`{"type":"response.output_text.done",` + h + `"item_id":"msg_2","output_index":1,"content_index":0,"text":"Hi!","logprobs":[]}`,
		`{"type":"response.content_part.done",` + h + `"item_id":"msg_2","output_index":1,"content_index":0,"part":{"type":"output_text","text":"Hi!","annotations":[],"logprobs":[]}}`,
		`{"type":"response.output_item.done",` + h + `"output_index":1,"item":{"id":"msg_2","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Hi!","annotations":[],"logprobs":[]}]}}`,
		`{"type":"response.output_item.added",` + h + `"output_index":2,"item":{"id":"fc_3","type":"function_call","status":"in_progress","arguments":"","call_id":"call_x","name":"get_weather"}}`,
		`{"type":"response.function_call_arguments.delta",` + h + `"item_id":"fc_3","output_index":2,"delta":"{\"city\":\"Paris\"}"}`,
		`{"type":"response.function_call_arguments.done",` + h + `"item_id":"fc_3","output_index":2,"arguments":"{\"city\":\"Paris\"}"}`,
		`{"type":"response.output_item.done",` + h + `"output_index":2,"item":{"id":"fc_3","type":"function_call","status":"completed","arguments":"{\"city\":\"Paris\"}","call_id":"call_x","name":"get_weather"}}`,
		`{"type":"response.output_item.added",` + h + `"output_index":3,"item":{"id":"fc_4","type":"function_call","status":"in_progress","arguments":"","call_id":"call_x","name":"noop"}}`,
		`{"type":"response.function_call_arguments.delta",` + h + `"item_id":"fc_4","output_index":3,"delta":"{}"}`,
		`{"type":"response.function_call_arguments.done",` + h + `"item_id":"fc_4","output_index":3,"arguments":"{}"}`,
		`{"type":"response.output_item.done",` + h + `"output_index":3,"item":{"id":"fc_4","type":"function_call","status":"completed","arguments":"{}","call_id":"call_x","name":"noop"}}`,
		`{"type":"response.output_item.added",` + h + `"output_index":4,"item":{"id":"msg_5","type":"message","status":"in_progress","role":"assistant","content":[]}}`,
		`{"type":"response.content_part.added",` + h + `"item_id":"msg_5","output_index":4,"content_index":0,"part":{"type":"output_text","text":"","annotations":[],"logprobs":[]}}`,
		`{"type":"response.output_text.delta",` + h + `"item_id":"msg_5","output_index":4,"content_index":0,"delta":"done","logprobs":[]}`,
		`{"type":"response.output_text.done",` + h + `"item_id":"msg_5","output_index":4,"content_index":0,"text":"done","logprobs":[]}`,
		`{"type":"response.content_part.done",` + h + `"item_id":"msg_5","output_index":4,"content_index":0,"part":{"type":"output_text","text":"done","annotations":[],"logprobs":[]}}`,
		`{"type":"response.output_item.done",` + h + `"output_index":4,"item":{"id":"msg_5","type":"message","status":"incomplete","role":"assistant","content":[{"type":"output_text","text":"done","annotations":[],"logprobs":[]}]}}`,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("events:\n%s\nwant:\n%s", join(got), join(want))
	}
	items, _ := json.Marshal(b.items)
	wantItems := `[{"id":"rs_1","type":"reasoning","summary":[],"content":[{"type":"reasoning_text","text":"Let me think."}],"status":"completed"},` +
		`{"id":"msg_2","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Hi!","annotations":[],"logprobs":[]}]},` +
		`{"id":"fc_3","type":"function_call","status":"completed","arguments":"{\"city\":\"Paris\"}","call_id":"call_x","name":"get_weather"},` +
		`{"id":"fc_4","type":"function_call","status":"completed","arguments":"{}","call_id":"call_x","name":"noop"},` +
		`{"id":"msg_5","type":"message","status":"incomplete","role":"assistant","content":[{"type":"output_text","text":"done","annotations":[],"logprobs":[]}]}]`
	if string(items) != wantItems || !b.functionCalls {
		t.Errorf("items %s\nwant  %s (function calls %v)", items, wantItems, b.functionCalls)
	}
	// Three tokens gave the reasoning (one of them held back); the one
	// held back before the content, and those of the tool call, are not
	// reasoning.
	if b.reasoningTokens != 3 {
		t.Errorf("reasoning tokens %d, want 3", b.reasoningTokens)
	}
}
