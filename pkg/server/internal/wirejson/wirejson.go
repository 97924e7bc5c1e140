// Package wirejson holds the JSON decoding helpers both wire packages
// (pkg/server/openai and pkg/server/anthropic) use to turn encoding/json
// failures into a parameter name and a message; each package wraps them in
// its own error shape.
package wirejson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
)

// Unmarshal decodes data into v. On failure it returns the offending
// parameter (prefix plus the field encoding/json names, without a trailing
// '.'; "" for the body itself) and a message that names it.
func Unmarshal(data []byte, v any, prefix string) (param, msg string, failed bool) {
	at := strings.TrimSuffix(prefix, ".")
	if len(bytes.TrimSpace(data)) == 0 {
		if prefix == "" {
			return "", "request body is empty: want a JSON object", true
		}
		return at, at + ": value is empty", true
	}
	err := json.Unmarshal(data, v)
	if err == nil {
		return "", "", false
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		field := prefix + te.Field
		if te.Field == "" {
			field = at
		}
		if field == "" {
			return "", "request body must be a JSON object, got " + te.Value, true
		}
		return field, fmt.Sprintf("%s: expected %s, got %s", field, TypeName(te.Type), te.Value), true
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return at, fmt.Sprintf("invalid JSON at byte %d: %v", se.Offset, se), true
	}
	return at, fmt.Sprintf("invalid JSON: %v", err), true
}

// TypeName says which JSON type a Go destination type wants.
func TypeName(t reflect.Type) string {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil {
		return "a value"
	}
	if t == reflect.TypeFor[json.RawMessage]() {
		return "a JSON value"
	}
	switch t.Kind() {
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer (in range)"
	case reflect.Float32, reflect.Float64:
		return "a number (in range)"
	case reflect.String:
		return "a string"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Struct, reflect.Map:
		return "an object"
	}
	return "a " + t.Kind().String()
}

// IsNull reports whether raw is absent or the JSON null.
func IsNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || bytes.Equal(raw, []byte("null"))
}
