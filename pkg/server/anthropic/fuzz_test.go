package anthropic

import (
	"encoding/json"
	"net/http"
	"testing"
)

var messagesSeeds = []string{
	`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`,
	`{"max_tokens":9,"system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":[{"type":"text","text":"q"}]},` +
		`{"role":"assistant","content":[{"type":"thinking","thinking":"t","signature":""},{"type":"tool_use","id":"a","name":"f","input":{"x":[1,{"y":null}]}}]},` +
		`{"role":"user","content":[{"type":"tool_result","tool_use_id":"a","content":[{"type":"text","text":"r"}],"is_error":true}]}],` +
		`"tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"auto"},"thinking":{"type":"enabled","budget_tokens":1024},` +
		`"stop_sequences":["x"],"temperature":0.5,"top_p":0.9,"top_k":3,"stream":true}`,
	`{"max_tokens":1,"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"prefill"}]}`,
	`{"max_tokens":1,"messages":[{"role":"user","content":[{"type":"image","source":{}}]}]}`,
	`{"max_tokens":1,"messages":[{"role":"system","content":"x"}]}`,
	`{"max_tokens":0}`, `{"messages":"x"}`, `[]`, `null`, `{"messages":[null,{}]}`, `{"temperature":1e999}`,
	"{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}",
}

// FuzzMessagesRequest: decoding never panics; it either returns a request
// that satisfies the documented invariants or a 400 that says what is wrong.
func FuzzMessagesRequest(f *testing.F) {
	for _, s := range messagesSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := DecodeMessagesRequest(body)
		if err != nil {
			if r != nil || err.Status != http.StatusBadRequest || err.Message == "" || err.Type != TypeInvalidRequest {
				t.Fatalf("bad error %+v (request %v)", err, r)
			}
			return
		}
		if r.MaxTokens < 1 || len(r.Messages) == 0 || len(r.Messages) > MaxMessages || len(r.StopSequences) > MaxStopSequences {
			t.Fatalf("accepted %+v", r)
		}
		if r.ToolChoice != ToolChoiceAuto && r.ToolChoice != ToolChoiceNone {
			t.Fatalf("tool_choice %q", r.ToolChoice)
		}
		for _, s := range r.StopSequences {
			if s == "" {
				t.Fatal("empty stop sequence accepted")
			}
		}
		for _, tool := range r.Tools {
			if checkToolName(tool.Name) != nil || len(tool.InputSchema) == 0 || tool.InputSchema[0] != '{' {
				t.Fatalf("tool %+v accepted", tool)
			}
		}
		for i, m := range r.Messages {
			if m.Role != RoleUser && m.Role != RoleAssistant {
				t.Fatalf("role %q accepted", m.Role)
			}
			for _, b := range m.Blocks {
				switch b.Type {
				case BlockText:
				case BlockThinking, BlockRedactedThinking, BlockToolUse:
					if m.Role != RoleAssistant {
						t.Fatalf("%s in a %s message", b.Type, m.Role)
					}
					if b.Type == BlockToolUse && (!json.Valid(b.Input) || b.Input[0] != '{') {
						t.Fatalf("tool_use input %q accepted", b.Input)
					}
				case BlockToolResult:
					if m.Role != RoleUser {
						t.Fatalf("tool_result in a %s message", m.Role)
					}
				default:
					t.Fatalf("block type %q accepted", b.Type)
				}
				if i == len(r.Messages)-1 && m.Role == RoleAssistant && b.Type != BlockText {
					t.Fatalf("prefill with a %s block accepted", b.Type)
				}
			}
		}
	})
}
