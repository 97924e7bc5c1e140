package wirejson

import (
	"encoding/json"
	"testing"
)

func TestUnmarshal(t *testing.T) {
	type inner struct {
		N int `json:"n"`
	}
	type body struct {
		Max   int             `json:"max_tokens"`
		Inner inner           `json:"inner"`
		Raw   json.RawMessage `json:"raw"`
	}
	tests := []struct {
		name, data, prefix, param, msg string
		failed                         bool
	}{
		{"ok", `{"max_tokens":3}`, "", "", "", false},
		{"empty body", ``, "", "", "request body is empty: want a JSON object", true},
		{"empty value", ` `, "messages[2].", "messages[2]", "messages[2]: value is empty", true},
		{"not an object", `[1]`, "", "", "request body must be a JSON object, got array", true},
		{"wrong type", `{"max_tokens":"x"}`, "", "max_tokens", "max_tokens: expected an integer (in range), got string", true},
		{"nested with prefix", `{"inner":{"n":1.5}}`, "tools.0.", "tools.0.inner.n", "tools.0.inner.n: expected an integer (in range), got number 1.5", true},
		{"syntax", `{"max_tokens":`, "x.", "x", "invalid JSON at byte 14: unexpected end of JSON input", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b body
			param, msg, failed := Unmarshal([]byte(tt.data), &b, tt.prefix)
			if param != tt.param || msg != tt.msg || failed != tt.failed {
				t.Errorf("Unmarshal(%q, %q) = %q, %q, %v; want %q, %q, %v", tt.data, tt.prefix, param, msg, failed, tt.param, tt.msg, tt.failed)
			}
		})
	}
	if !IsNull(json.RawMessage(" null ")) || !IsNull(nil) || IsNull(json.RawMessage(`0`)) {
		t.Error("IsNull")
	}
}
