package anthropic

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

func ptr[T any](v T) *T { return &v }

func TestDecodeMessagesRequest(t *testing.T) {
	cases := []struct {
		name string
		body string
		want MessagesRequest
	}{
		{"minimal", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`,
			MessagesRequest{Model: "m", MaxTokens: 5, Prompt: Prompt{ToolChoice: ToolChoiceAuto,
				Messages: []InputMessage{{Role: "user", Blocks: []InputBlock{{Type: "text", Text: "hi"}}}}}}},
		{"everything", `{"max_tokens":64,"system":[{"type":"text","text":"a","cache_control":{"type":"ephemeral"}},{"type":"text","text":"b"}],
			"messages":[{"role":"user","content":[{"type":"text","text":"q"}]},
				{"role":"assistant","content":[{"type":"thinking","thinking":"hmm","signature":"sig"},{"type":"redacted_thinking","data":"x"},
					{"type":"text","text":"calling"},{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{ "city" : "Paris" }}]},
				{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"21C"}],"is_error":true},{"type":"text","text":"thanks"}]}],
			"stop_sequences":["END"],"temperature":0.5,"top_p":0.9,"top_k":20,"stream":true,"metadata":{"user_id":"u"},
			"tools":[{"name":"get_weather","description":"Weather","input_schema":{"type":"object","properties":{"city":{"type":"string"}}}}],
			"tool_choice":{"type":"auto","disable_parallel_tool_use":true},"thinking":{"type":"enabled","budget_tokens":2048}}`,
			MessagesRequest{MaxTokens: 64, StopSequences: []string{"END"}, Temperature: ptr(0.5), TopP: ptr(0.9), TopK: ptr(20), Stream: true,
				Prompt: Prompt{System: "a\nb", ToolChoice: ToolChoiceAuto, Thinking: ptr(true),
					Tools: []Tool{{Name: "get_weather", Description: ptr("Weather"), InputSchema: json.RawMessage(`{"type":"object","properties":{"city":{"type":"string"}}}`)}},
					Messages: []InputMessage{
						{Role: "user", Blocks: []InputBlock{{Type: "text", Text: "q"}}},
						{Role: "assistant", Blocks: []InputBlock{{Type: "thinking", Text: "hmm"}, {Type: "redacted_thinking"}, {Type: "text", Text: "calling"},
							{Type: "tool_use", ID: "toolu_1", Name: "get_weather", Input: json.RawMessage(`{"city":"Paris"}`)}}},
						{Role: "user", Blocks: []InputBlock{{Type: "tool_result", ToolUseID: "toolu_1", Text: "21C", IsError: true}, {Type: "text", Text: "thanks"}}},
					}}}},
		{"thinking disabled, tool_choice none, prefill", `{"max_tokens":1,"thinking":{"type":"disabled"},"tool_choice":{"type":"none"},
			"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"The answer is"}]}`,
			MessagesRequest{MaxTokens: 1, Prompt: Prompt{ToolChoice: ToolChoiceNone, Thinking: ptr(false), Messages: []InputMessage{
				{Role: "user", Blocks: []InputBlock{{Type: "text", Text: "q"}}},
				{Role: "assistant", Blocks: []InputBlock{{Type: "text", Text: "The answer is"}}}}}}},
		{"tool_use without input", `{"max_tokens":1,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"a","name":"f"}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"a"}]}]}`,
			MessagesRequest{MaxTokens: 1, Prompt: Prompt{ToolChoice: ToolChoiceAuto, Messages: []InputMessage{
				{Role: "assistant", Blocks: []InputBlock{{Type: "tool_use", ID: "a", Name: "f", Input: json.RawMessage(`{}`)}}},
				{Role: "user", Blocks: []InputBlock{{Type: "tool_result", ToolUseID: "a"}}}}}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodeMessagesRequest([]byte(tc.body))
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
	const msg = `"messages":[{"role":"user","content":"x"}]`
	cases := []struct {
		name, body, param, contains string
	}{
		{"empty body", ``, "", "empty"},
		{"not an object", `[1]`, "", "JSON object"},
		{"bad JSON", `{"max_tokens":`, "", "invalid JSON"},
		{"max_tokens missing", `{` + msg + `}`, "max_tokens", "field required"},
		{"max_tokens zero", `{"max_tokens":0,` + msg + `}`, "max_tokens", "at least 1"},
		{"max_tokens string", `{"max_tokens":"5",` + msg + `}`, "max_tokens", "integer"},
		{"messages missing", `{"max_tokens":5}`, "messages", "field required"},
		{"messages not array", `{"max_tokens":5,"messages":"hi"}`, "messages", "array"},
		{"role system", `{"max_tokens":5,"messages":[{"role":"system","content":"x"}]}`, "messages.0.role", "top-level system"},
		{"content missing", `{"max_tokens":5,"messages":[{"role":"user"}]}`, "messages.0.content", "field required"},
		{"content number", `{"max_tokens":5,"messages":[{"role":"user","content":5}]}`, "messages.0.content", "string or an array"},
		{"image block", `{"max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{}}]}]}`, "messages.0.content.0.type", "text only"},
		{"unknown block", `{"max_tokens":5,"messages":[{"role":"user","content":[{"type":"video"}]}]}`, "messages.0.content.0.type", "not a supported"},
		{"text block without text", `{"max_tokens":5,"messages":[{"role":"user","content":[{"type":"text"}]}]}`, "messages.0.content.0.text", "field required"},
		{"tool_use in user message", `{"max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_use","id":"a","name":"f","input":{}}]}]}`, "messages.0.content.0.type", "assistant messages"},
		{"tool_result in assistant message", `{"max_tokens":5,"messages":[{"role":"assistant","content":[{"type":"tool_result","tool_use_id":"a"}]},{"role":"user","content":"x"}]}`, "messages.0.content.0.type", "user messages"},
		{"tool_use input array", `{"max_tokens":5,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"a","name":"f","input":[1]}]},{"role":"user","content":"x"}]}`, "messages.0.content.0.input", "JSON object"},
		{"tool_result image", `{"max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"a","content":[{"type":"image"}]}]}]}`, "messages.0.content.0.content.0.type", "text only"},
		{"prefill with tool_use", `{"max_tokens":5,"messages":[{"role":"user","content":"x"},{"role":"assistant","content":[{"type":"tool_use","id":"a","name":"f","input":{}}]}]}`, "messages.1.content.0.type", "prefill"},
		{"prefill with thinking on", `{"max_tokens":5,"thinking":{"type":"enabled","budget_tokens":1024},"messages":[{"role":"user","content":"x"},{"role":"assistant","content":"a"}]}`, "messages.1", "thinking enabled"},
		{"temperature above 1", `{"max_tokens":5,` + msg + `,"temperature":1.5}`, "temperature", "[0, 1]"},
		{"temperature string", `{"max_tokens":5,` + msg + `,"temperature":"hot"}`, "temperature", "number"},
		{"top_p zero", `{"max_tokens":5,` + msg + `,"top_p":0}`, "top_p", "(0, 1]"},
		{"top_k negative", `{"max_tokens":5,` + msg + `,"top_k":-1}`, "top_k", ">= 0"},
		{"stop_sequences string", `{"max_tokens":5,` + msg + `,"stop_sequences":"x"}`, "stop_sequences", "array of strings"},
		{"stop_sequences empty string", `{"max_tokens":5,` + msg + `,"stop_sequences":["a",""]}`, "stop_sequences.1", "empty"},
		{"stream string", `{"max_tokens":5,` + msg + `,"stream":"yes"}`, "stream", "boolean"},
		{"system image", `{"max_tokens":5,` + msg + `,"system":[{"type":"image"}]}`, "system.0.type", "text only"},
		{"server tool", `{"max_tokens":5,` + msg + `,"tools":[{"type":"web_search_20250305","name":"web_search"}]}`, "tools.0.type", "server tools"},
		{"tool without schema", `{"max_tokens":5,` + msg + `,"tools":[{"name":"f"}]}`, "tools.0.input_schema", "field required"},
		{"tool bad name", `{"max_tokens":5,` + msg + `,"tools":[{"name":"a b","input_schema":{}}]}`, "tools.0.name", "letters"},
		{"tool repeated", `{"max_tokens":5,` + msg + `,"tools":[{"name":"f","input_schema":{}},{"name":"f","input_schema":{}}]}`, "tools.1.name", "unique"},
		{"tool_choice any without tools", `{"max_tokens":5,` + msg + `,"tool_choice":{"type":"any"}}`, "tool_choice.type", `"any" needs tools`},
		{"tool_choice tool not offered", `{"max_tokens":5,` + msg + `,"tool_choice":{"type":"tool","name":"f"}}`, "tool_choice.name", `"f" is not among the tools`},
		{"tool_choice tool without a name", `{"max_tokens":5,` + msg + `,"tool_choice":{"type":"tool"}}`, "tool_choice.name", "field required"},
		{"tool_choice string", `{"max_tokens":5,` + msg + `,"tool_choice":"auto"}`, "tool_choice", "object"},
		{"structured output of another type", `{"max_tokens":5,` + msg + `,"output_config":{"effort":"high","format":{"type":"xml"}}}`, "output_config.format.type", `must be "json_schema"`},
		{"structured output without a schema", `{"max_tokens":5,` + msg + `,"output_config":{"format":{"type":"json_schema"}}}`, "output_config.format.schema", "required"},
		{"thinking bad type", `{"max_tokens":5,` + msg + `,"thinking":{"type":"on"}}`, "thinking.type", "enabled"},
		{"thinking budget zero", `{"max_tokens":5,` + msg + `,"thinking":{"type":"enabled","budget_tokens":0}}`, "thinking.budget_tokens", "at least 1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeMessagesRequest([]byte(tc.body))
			if err == nil {
				t.Fatal("no error")
			}
			if err.Status != 400 || err.Type != TypeInvalidRequest || err.Param != tc.param || !strings.Contains(err.Message, tc.contains) {
				t.Errorf("got %d %s param %q %q; want param %q, message containing %q", err.Status, err.Type, err.Param, err.Message, tc.param, tc.contains)
			}
			if tc.param != "" && !strings.HasPrefix(err.Message, tc.param+":") {
				t.Errorf("message %q does not start with the field %q", err.Message, tc.param)
			}
		})
	}
}

func TestDecodeCountTokensRequest(t *testing.T) {
	got, err := DecodeCountTokensRequest([]byte(`{"model":"m","system":"s","messages":[{"role":"user","content":"hi"}],"thinking":{"type":"disabled"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if got.Model != "m" || got.System != "s" || len(got.Messages) != 1 || got.Thinking == nil || *got.Thinking {
		t.Errorf("%+v", got)
	}
	if _, err := DecodeCountTokensRequest([]byte(`{"messages":[]}`)); err == nil || err.Param != "messages" {
		t.Errorf("empty messages: %v", err)
	}
}

func TestWireShapes(t *testing.T) {
	cases := []struct {
		v    any
		want string
	}{
		{ContentBlock{Type: BlockText}, `{"type":"text","text":""}`},
		{ContentBlock{Type: BlockThinking, Thinking: "t"}, `{"type":"thinking","thinking":"t","signature":""}`},
		{ContentBlock{Type: BlockToolUse, ID: "toolu_1", Name: "f"}, `{"type":"tool_use","id":"toolu_1","name":"f","input":{}}`},
		{ContentBlock{Type: BlockToolUse, ID: "toolu_1", Name: "f", Input: json.RawMessage(`{"a":1}`)}, `{"type":"tool_use","id":"toolu_1","name":"f","input":{"a":1}}`},
		{NewBlockDelta(2, Delta{Type: DeltaText}), `{"type":"content_block_delta","index":2,"delta":{"type":"text_delta","text":""}}`},
		{NewBlockDelta(0, Delta{Type: DeltaThinking, Thinking: "x"}), `{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"x"}}`},
		{NewBlockDelta(1, Delta{Type: DeltaInputJSON, PartialJSON: `{"a":1}`}), `{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"a\":1}"}}`},
		{NewMessageDelta(StopSequence, ptr("END"), Usage{InputTokens: 3, OutputTokens: 4}),
			`{"type":"message_delta","delta":{"stop_reason":"stop_sequence","stop_sequence":"END"},"usage":{"input_tokens":3,"output_tokens":4}}`},
		{NewMessageStart(Message{ID: "msg_1", Type: ObjectMessage, Role: RoleAssistant, Model: "m", Content: []ContentBlock{}}),
			`{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":0,"output_tokens":0}}}`},
		{NewBlockStop(3), `{"type":"content_block_stop","index":3}`},
		{NewMessageStop(), `{"type":"message_stop"}`},
		{NewPing(), `{"type":"ping"}`},
		{NewError(401, "", "bad key").Body(), `{"type":"error","error":{"type":"authentication_error","message":"bad key"}}`},
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
			if ev.EventName() != typ.Type {
				t.Errorf("%T: event name %q, type %q", tc.v, ev.EventName(), typ.Type)
			}
		}
	}
}

func TestTypeForStatus(t *testing.T) {
	for status, want := range map[int]string{400: TypeInvalidRequest, 401: TypeAuthentication, 403: TypePermission, 404: TypeNotFound,
		405: TypeInvalidRequest, 413: TypeRequestTooLarge, 429: TypeRateLimit, 500: TypeAPI, 503: TypeOverloaded, 529: TypeOverloaded} {
		if got := TypeForStatus(status); got != want {
			t.Errorf("%d: %s, want %s", status, got, want)
		}
	}
}
