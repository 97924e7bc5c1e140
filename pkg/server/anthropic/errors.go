package anthropic

import (
	"fmt"
	"net/http"
)

// Error types, as Anthropic names them.
const (
	TypeInvalidRequest  = "invalid_request_error"
	TypeAuthentication  = "authentication_error"
	TypePermission      = "permission_error"
	TypeNotFound        = "not_found_error"
	TypeRequestTooLarge = "request_too_large"
	TypeRateLimit       = "rate_limit_error"
	TypeAPI             = "api_error"
	TypeOverloaded      = "overloaded_error"
)

// Error is an API error: the HTTP status and the Anthropic error body.
type Error struct {
	Status int
	Type   string
	// Param is the offending field ("messages.2.content.0.type"), or "". It
	// is not part of Anthropic's body; messages start with it instead.
	Param   string
	Message string
}

func (e *Error) Error() string {
	return fmt.Sprintf("%d %s: %s", e.Status, e.Type, e.Message)
}

// Body returns the JSON body Anthropic sends:
// {"type": "error", "error": {"type": ..., "message": ...}}.
func (e *Error) Body() ErrorResponse {
	return ErrorResponse{Type: "error", Error: ErrorBody{Type: e.Type, Message: e.Message}}
}

// ErrorResponse is the wire form of an error (also the data of a stream's
// error event).
type ErrorResponse struct {
	Type  string    `json:"type"`
	Error ErrorBody `json:"error"`
}

// ErrorBody is the inside of ErrorResponse.
type ErrorBody struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

// TypeForStatus is the error type Anthropic sends with an HTTP status.
func TypeForStatus(status int) string {
	switch status {
	case http.StatusUnauthorized:
		return TypeAuthentication
	case http.StatusForbidden:
		return TypePermission
	case http.StatusNotFound:
		return TypeNotFound
	case http.StatusRequestEntityTooLarge:
		return TypeRequestTooLarge
	case http.StatusTooManyRequests:
		return TypeRateLimit
	case http.StatusServiceUnavailable, 529:
		return TypeOverloaded
	}
	if status >= 500 {
		return TypeAPI
	}
	return TypeInvalidRequest
}

// NewError is an error of the type that goes with status.
func NewError(status int, param, message string) *Error {
	return &Error{Status: status, Type: TypeForStatus(status), Param: param, Message: message}
}

// BadRequest is a 400 naming param.
func BadRequest(param, format string, args ...any) *Error {
	return &Error{Status: http.StatusBadRequest, Type: TypeInvalidRequest, Param: param, Message: fmt.Sprintf(format, args...)}
}
