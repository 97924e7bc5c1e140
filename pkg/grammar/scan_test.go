package grammar

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestObjectFields(t *testing.T) {
	data := []byte(` { "a" : [1, {"x": "}]\"{"}], "b":null ,"c":"s\\\"}" , "d": -1.5e3, "e":{} }`)
	fields, err := objectFields(data)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"a": `[1, {"x": "}]\"{"}]`, "b": "null", "c": `"s\\\"}"`, "d": "-1.5e3", "e": "{}"}
	if len(fields) != len(want) {
		t.Fatalf("fields %v", fields)
	}
	for k, w := range want {
		if got := string(data[fields[k].start:fields[k].end]); got != w {
			t.Errorf("%s = %q, want %q", k, got, w)
		}
	}
	for _, bad := range []string{``, `[]`, `{`, `{"a"`, `{"a":`, `{"a":1`, `{"a":1,`, `{"a" 1}`, `{"a":"x}`, `{"a":[}`, `{a:1}`, `{"a":1 "b":2}`} {
		if _, err := objectFields([]byte(bad)); err == nil {
			t.Errorf("objectFields(%q): no error", bad)
		}
	}
	if n, err := maxValue([]byte(`{"a\"b:": 7, "c" :12,"d":0}`)); err != nil || n != 12 {
		t.Errorf("maxValue = %d, %v", n, err)
	}
	for _, bad := range []string{`{"a":-1}`, `{"a":"1"}`, `{"a":99999999999}`} {
		if _, err := maxValue([]byte(bad)); err == nil {
			t.Errorf("maxValue(%q): no error", bad)
		}
	}
}

func TestWithXGuidance(t *testing.T) {
	for _, tc := range []struct{ text, want string }{
		{`{}`, `{"x-guidance":{"lenient":false,"whitespace_flexible":false,"whitespace_pattern":"[\\x20\\x0A\\x0D\\x09]{1,20}"}}`},
		{`{ "type" : "object" }`, `{"x-guidance":{"lenient":false,"whitespace_flexible":false,"whitespace_pattern":"[\\x20\\x0A\\x0D\\x09]{1,20}"},"type" : "object" }`},
	} {
		got := withXGuidance(tc.text, Spec{Kind: JSONSchema})
		if got != tc.want {
			t.Errorf("withXGuidance(%s) = %s, want %s", tc.text, got, tc.want)
		}
		if !json.Valid([]byte(got)) {
			t.Errorf("%s is not JSON", got)
		}
	}
	if got := withXGuidance(`{}`, Spec{Kind: JSONSchema, Whitespace: WhitespaceCompact, Lenient: true}); !strings.Contains(got, `"lenient":true,"whitespace_flexible":false}`) {
		t.Errorf("compact, lenient: %s", got)
	}
}

// FuzzObjectFields: the tokenizer.json scanner never panics, and on a valid
// JSON object it finds exactly encoding/json's values.
func FuzzObjectFields(f *testing.F) {
	f.Add([]byte(`{"model":{"vocab":{"a":0,"b":1}},"added_tokens":[{"id":2,"content":"<x>","special":false}]}`))
	f.Add([]byte(`{"a":"\\\"","b":[{"c":"]}"}],"d":true}`))
	f.Add([]byte(`{"a":1,}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		fields, err := objectFields(data)
		_, _, _ = prepareTokenizerJSON(data)
		for _, sp := range fields {
			_, _ = maxValue(data[sp.start:sp.end])
		}
		var want map[string]json.RawMessage
		if json.Unmarshal(data, &want) != nil || bytes.HasPrefix(bytes.TrimSpace(data), []byte("null")) {
			return
		}
		if err != nil {
			t.Fatalf("valid object %q: %v", data, err)
		}
		for k, raw := range want {
			sp, ok := fields[k]
			if !ok {
				// encoding/json folds keys with invalid UTF-8; compare only
				// what both decoded the same way.
				continue
			}
			if !bytes.Equal(data[sp.start:sp.end], raw) {
				t.Fatalf("%q: field %q = %q, encoding/json %q", data, k, data[sp.start:sp.end], raw)
			}
		}
	})
}
