package responses

import (
	"net/http"
	"testing"
)

var requestSeeds = []string{
	`{"model":"m","input":"hi"}`,
	`{"instructions":"s","max_output_tokens":9,"temperature":0.5,"top_p":0.9,"stream":true,"reasoning":{"effort":"low"},` +
		`"tools":[{"type":"function","name":"f","parameters":{"type":"object"},"strict":true}],"tool_choice":"auto","metadata":{"a":"b"},` +
		`"input":[{"role":"developer","content":[{"type":"input_text","text":"d"}]},{"role":"user","content":"q"},` +
		`{"type":"reasoning","summary":[],"content":[{"type":"reasoning_text","text":"t"}]},` +
		`{"type":"message","role":"assistant","content":[{"type":"output_text","text":"a","annotations":[]}]},` +
		`{"type":"function_call","call_id":"c","name":"f","arguments":"{\"x\":[1,{\"y\":null}]}"},` +
		`{"type":"function_call_output","call_id":"c","output":"r"}]}`,
	`{"input":[{"role":"user","content":[{"type":"input_image","image_url":"x"}]}]}`,
	`{"input":[{"type":"item_reference","id":"x"}]}`,
	`{"input":"x","store":true}`, `{"input":"x","previous_response_id":"resp_1"}`,
	`{"input":"x","tool_choice":{"type":"function","name":"f"}}`, `{"input":"x","text":{"format":{"type":"json_object"}}}`,
	`{"max_output_tokens":0}`, `{"input":5}`, `[]`, `null`, `{"input":[null,{}]}`, `{"temperature":1e999}`,
	"{\"input\":[{\"role\":\"user\",\"content\":\"\xff\"}]}",
}

// FuzzDecodeRequest: decoding never panics; it either returns a request
// that satisfies the documented invariants or a 400 that says what is
// wrong.
func FuzzDecodeRequest(f *testing.F) {
	for _, s := range requestSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := DecodeRequest(body)
		if err != nil {
			if r != nil || err.Status != http.StatusBadRequest || err.Message == "" || err.Type != "invalid_request_error" {
				t.Fatalf("bad error %+v (request %v)", err, r)
			}
			return
		}
		if len(r.Input) == 0 || len(r.Input) > MaxInputItems || r.MaxOutputTokens < 0 || len(r.Tools) > MaxTools || len(r.Metadata) > MaxMetadata {
			t.Fatalf("accepted %+v", r)
		}
		if r.ToolChoice != ToolChoiceAuto && r.ToolChoice != ToolChoiceNone {
			t.Fatalf("tool choice %q", r.ToolChoice)
		}
		for i, it := range r.Input {
			switch it.Type {
			case ItemMessage:
				if it.Role != RoleUser && it.Role != RoleSystem && it.Role != RoleDeveloper && it.Role != RoleAssistant {
					t.Fatalf("input[%d]: role %q", i, it.Role)
				}
			case ItemFunctionCall:
				if it.Name == "" || len(it.Arguments) == 0 || it.Arguments[0] != '{' {
					t.Fatalf("input[%d]: function call %+v", i, it)
				}
			case ItemFunctionCallOutput, ItemReasoning:
			default:
				t.Fatalf("input[%d]: type %q", i, it.Type)
			}
		}
	})
}
