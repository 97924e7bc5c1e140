package server

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/glmctl/glmctl/pkg/engine"
	"github.com/glmctl/glmctl/pkg/server/anthropic"
	"github.com/glmctl/glmctl/pkg/server/openai"
	"github.com/glmctl/glmctl/pkg/tokenizer/chat"
)

func TestToChatPrompt(t *testing.T) {
	on, off := true, false
	text := func(s string) anthropic.InputBlock { return anthropic.InputBlock{Type: "text", Text: s} }
	user := func(bs ...anthropic.InputBlock) anthropic.InputMessage {
		return anthropic.InputMessage{Role: "user", Blocks: bs}
	}
	asst := func(bs ...anthropic.InputBlock) anthropic.InputMessage {
		return anthropic.InputMessage{Role: "assistant", Blocks: bs}
	}
	tool := anthropic.Tool{Name: "get_weather", InputSchema: json.RawMessage(`{"type":"object"}`)}
	cases := []struct {
		name string
		in   anthropic.Prompt
		want chatPrompt
	}{
		{"system and a question, thinking by default",
			anthropic.Prompt{System: "Be brief.", Messages: []anthropic.InputMessage{user(text("a"), text("b"))}},
			chatPrompt{thinking: true, messages: []chat.Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "a\nb"}}}},
		{"thinking disabled",
			anthropic.Prompt{Thinking: &off, Messages: []anthropic.InputMessage{user(text("a"))}},
			chatPrompt{enableThinking: &off, messages: []chat.Message{{Role: "user", Content: "a"}}}},
		{"thinking enabled",
			anthropic.Prompt{Thinking: &on, Messages: []anthropic.InputMessage{user(text("a"))}},
			chatPrompt{enableThinking: &on, thinking: true, messages: []chat.Message{{Role: "user", Content: "a"}}}},
		{"tool round trip",
			anthropic.Prompt{Tools: []anthropic.Tool{tool}, ToolChoice: anthropic.ToolChoiceAuto, Messages: []anthropic.InputMessage{
				user(text("weather?")),
				asst(anthropic.InputBlock{Type: "thinking", Text: "t1"}, anthropic.InputBlock{Type: "redacted_thinking"},
					anthropic.InputBlock{Type: "thinking", Text: "t2"}, text("calling"),
					anthropic.InputBlock{Type: "tool_use", ID: "toolu_1", Name: "get_weather", Input: json.RawMessage(`{"city":"Paris"}`)},
					anthropic.InputBlock{Type: "tool_use", ID: "toolu_2", Name: "get_weather", Input: json.RawMessage(`{"city":"Rome"}`)}),
				user(anthropic.InputBlock{Type: "tool_result", ToolUseID: "toolu_1", Text: "21C"},
					anthropic.InputBlock{Type: "tool_result", ToolUseID: "toolu_2", Text: "no data", IsError: true}, text("thanks")),
			}},
			chatPrompt{thinking: true, tools: []json.RawMessage{json.RawMessage(`{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}`)},
				messages: []chat.Message{
					{Role: "user", Content: "weather?"},
					{Role: "assistant", Content: "calling", ReasoningContent: ptr("t1\nt2"), ToolCalls: []chat.ToolCall{
						{ID: "toolu_1", Type: "function", Function: chat.FunctionCall{Name: "get_weather", Arguments: json.RawMessage(`{"city":"Paris"}`)}},
						{ID: "toolu_2", Type: "function", Function: chat.FunctionCall{Name: "get_weather", Arguments: json.RawMessage(`{"city":"Rome"}`)}}}},
					{Role: "tool", Content: "21C", ToolCallID: "toolu_1"},
					{Role: "tool", Content: "Error: no data", ToolCallID: "toolu_2"},
					{Role: "user", Content: "thanks"},
				}}},
		{"tool results only: no empty user message; tool_choice none hides the tools",
			anthropic.Prompt{Tools: []anthropic.Tool{tool}, ToolChoice: anthropic.ToolChoiceNone, Messages: []anthropic.InputMessage{
				user(anthropic.InputBlock{Type: "tool_result", ToolUseID: "x", Text: "r"})}},
			chatPrompt{thinking: true, messages: []chat.Message{{Role: "tool", Content: "r", ToolCallID: "x"}}}},
		{"prefill: rendered after the generation prompt, thinking off",
			anthropic.Prompt{Messages: []anthropic.InputMessage{user(text("q")), asst(text("The answer"), text("is"))}},
			chatPrompt{prefill: "The answer\nis", enableThinking: &off, messages: []chat.Message{{Role: "user", Content: "q"}}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := toChatPrompt(&tc.in)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestAnthropicToolObjects(t *testing.T) {
	desc := `Weather "now"`
	tools := []anthropic.Tool{
		{Name: "get_weather", Description: &desc, InputSchema: json.RawMessage(`{"type":"object","properties":{"z":{},"a":{}}}`)},
		{Name: "noop", InputSchema: json.RawMessage(`{}`)},
	}
	got := anthropicToolObjects(tools, anthropic.ToolChoiceAuto)
	want := []string{
		`{"type":"function","function":{"name":"get_weather","description":"Weather \"now\"","parameters":{"type":"object","properties":{"z":{},"a":{}}}}}`,
		`{"type":"function","function":{"name":"noop","parameters":{}}}`,
	}
	if len(got) != len(want) {
		t.Fatalf("%d tools", len(got))
	}
	for i := range want {
		if string(got[i]) != want[i] || !json.Valid(got[i]) {
			t.Errorf("tool %d: %s, want %s", i, got[i], want[i])
		}
	}
	if anthropicToolObjects(tools, anthropic.ToolChoiceNone) != nil || anthropicToolObjects(nil, anthropic.ToolChoiceAuto) != nil {
		t.Error("tool_choice none or no tools should offer none")
	}
}

func TestToStopReason(t *testing.T) {
	for _, tc := range []struct {
		f       engine.FinishReason
		stop    string
		tools   bool
		want    string
		wantSeq string
	}{
		{engine.FinishStop, "", false, "end_turn", ""},
		{engine.FinishStop, "", true, "tool_use", ""},
		{engine.FinishStop, "END", false, "stop_sequence", "END"},
		{engine.FinishStop, "END", true, "stop_sequence", "END"},
		{engine.FinishLength, "", true, "max_tokens", ""},
		{engine.FinishLength, "", false, "max_tokens", ""},
	} {
		got, seq := toStopReason(tc.f, tc.stop, tc.tools)
		if got != tc.want || (seq == nil) != (tc.wantSeq == "") || (seq != nil && *seq != tc.wantSeq) {
			t.Errorf("%s %q tools=%v: %q %v, want %q %q", tc.f, tc.stop, tc.tools, got, seq, tc.want, tc.wantSeq)
		}
	}
}

func TestToAnthropicError(t *testing.T) {
	for _, tc := range []struct {
		in   *openai.Error
		want anthropic.Error
	}{
		{openai.BadRequest("max_tokens", "too many"), anthropic.Error{Status: 400, Type: "invalid_request_error", Param: "max_tokens", Message: "too many"}},
		{&openai.Error{Status: 404, Type: openai.TypeInvalidRequest, Message: "no model"}, anthropic.Error{Status: 404, Type: "not_found_error", Message: "no model"}},
		{&openai.Error{Status: 413, Type: openai.TypeInvalidRequest, Message: "big"}, anthropic.Error{Status: 413, Type: "request_too_large", Message: "big"}},
		{&openai.Error{Status: 429, Type: openai.TypeRateLimit, Message: "busy"}, anthropic.Error{Status: 429, Type: "rate_limit_error", Message: "busy"}},
		{&openai.Error{Status: 500, Type: openai.TypeServer, Message: "boom"}, anthropic.Error{Status: 500, Type: "api_error", Message: "boom"}},
		{&openai.Error{Status: 503, Type: openai.TypeUnavailable, Message: "stopping"}, anthropic.Error{Status: 503, Type: "overloaded_error", Message: "stopping"}},
	} {
		if got := toAnthropicError(tc.in); *got != tc.want {
			t.Errorf("%v: %+v, want %+v", tc.in, *got, tc.want)
		}
	}
}

// The block builder opens a block when the kind of output changes, closes
// the previous one first, and sends a tool call as one whole tool_use block.
func TestBlockBuilder(t *testing.T) {
	call := func(name, args string) chatPiece {
		idx := 0
		return chatPiece{kind: chat.EventToolCall, call: &openai.ToolCall{Index: &idx, ID: "toolu_x", Type: "function",
			Function: openai.FunctionCall{Name: name, Arguments: args}}}
	}
	reasoning := func(s string) chatPiece { return chatPiece{kind: chat.EventReasoning, text: s} }
	content := func(s string) chatPiece { return chatPiece{kind: chat.EventContent, text: s} }
	var b blockBuilder
	var got []string
	for _, step := range [][]chatPiece{
		{reasoning("Let me")}, {reasoning(" think.")}, {content("Hi")}, {content("!"), call("get_weather", `{"city":"Paris"}`)},
		{call("noop", "")}, {content("done")},
	} {
		for _, ev := range b.add(step) {
			j, err := json.Marshal(ev)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, string(j))
		}
	}
	for _, ev := range b.closeBlock() {
		j, _ := json.Marshal(ev)
		got = append(got, string(j))
	}
	if len(b.closeBlock()) != 0 {
		t.Error("closeBlock twice closed twice")
	}
	want := []string{
		`{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}`,
		`{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Let me"}}`,
		`{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":" think."}}`,
		`{"type":"content_block_stop","index":0}`,
		`{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}`,
		`{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Hi"}}`,
		`{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"!"}}`,
		`{"type":"content_block_stop","index":1}`,
		`{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_x","name":"get_weather","input":{}}}`,
		`{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"city\":\"Paris\"}"}}`,
		`{"type":"content_block_stop","index":2}`,
		`{"type":"content_block_start","index":3,"content_block":{"type":"tool_use","id":"toolu_x","name":"noop","input":{}}}`,
		`{"type":"content_block_delta","index":3,"delta":{"type":"input_json_delta","partial_json":"{}"}}`,
		`{"type":"content_block_stop","index":3}`,
		`{"type":"content_block_start","index":4,"content_block":{"type":"text","text":""}}`,
		`{"type":"content_block_delta","index":4,"delta":{"type":"text_delta","text":"done"}}`,
		`{"type":"content_block_stop","index":4}`,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("events:\n%s\nwant:\n%s", join(got), join(want))
	}
	blocks, _ := json.Marshal(b.blocks)
	wantBlocks := `[{"type":"thinking","thinking":"Let me think.","signature":""},{"type":"text","text":"Hi!"},` +
		`{"type":"tool_use","id":"toolu_x","name":"get_weather","input":{"city":"Paris"}},{"type":"tool_use","id":"toolu_x","name":"noop","input":{}},` +
		`{"type":"text","text":"done"}]`
	if string(blocks) != wantBlocks || !b.toolUse {
		t.Errorf("blocks %s\nwant   %s (tool use %v)", blocks, wantBlocks, b.toolUse)
	}
}

func join(lines []string) string {
	out := ""
	for _, l := range lines {
		out += "  " + l + "\n"
	}
	return out
}

func TestToAnthropicMessage(t *testing.T) {
	reason := "end_turn"
	m := toAnthropicMessage(meta{id: "msg_1", model: "glm"}, nil, &reason, nil, toAnthropicUsage(engine.Usage{PromptTokens: 7, CompletionTokens: 3, CachedPromptTokens: 4}))
	b, _ := json.Marshal(m)
	want := `{"id":"msg_1","type":"message","role":"assistant","model":"glm","content":[],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":7,"output_tokens":3}}`
	if string(b) != want {
		t.Errorf("got  %s\nwant %s", b, want)
	}
}
