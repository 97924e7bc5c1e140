// Package anthropic holds the wire types of glmctl's Anthropic Messages API
// (POST /v1/messages and /v1/messages/count_tokens): the request bodies,
// decoded and validated by DecodeMessagesRequest and DecodeCountTokensRequest
// into plain structs, the response message and its content blocks, the
// server-sent stream events, and the error body. It knows nothing of the
// engine, the tokenizer or the chat template; pkg/server converts between
// these types and engine and chat types with pure functions.
package anthropic

import (
	"encoding/json"
)

// Roles of input messages.
const (
	RoleUser      = "user"
	RoleAssistant = "assistant"
)

// Content block types.
const (
	BlockText             = "text"
	BlockThinking         = "thinking"
	BlockRedactedThinking = "redacted_thinking"
	BlockToolUse          = "tool_use"
	BlockToolResult       = "tool_result"
)

// Stop reasons sent to clients.
const (
	StopEndTurn   = "end_turn"
	StopMaxTokens = "max_tokens"
	StopSequence  = "stop_sequence"
	StopToolUse   = "tool_use"
)

// ObjectMessage is a response message's "type".
const ObjectMessage = "message"

// Delta types of content_block_delta events.
const (
	DeltaText      = "text_delta"
	DeltaThinking  = "thinking_delta"
	DeltaInputJSON = "input_json_delta"
)

// Stream event names (each event's "event:" line and its "type").
const (
	EventMsgStart   = "message_start"
	EventBlockStart = "content_block_start"
	EventBlockDelta = "content_block_delta"
	EventBlockStop  = "content_block_stop"
	EventMsgDelta   = "message_delta"
	EventMsgStop    = "message_stop"
	EventPing       = "ping"
	EventError      = "error"
)

// Tool choices accepted.
const (
	ToolChoiceAuto ToolChoice = "auto"
	ToolChoiceNone ToolChoice = "none"
	ToolChoiceAny  ToolChoice = "any"  // at least one call, enforced by a grammar
	ToolChoiceTool ToolChoice = "tool" // a call to Prompt.ToolChoiceName, enforced by a grammar
)

const defaultToolInput = "{}"

// Prompt is what both endpoints render into the model's prompt: the system
// text, the conversation, the tools and the thinking switch.
type Prompt struct {
	// System is the system prompt (a string, or the text blocks joined with
	// "\n"); "" = none.
	System   string
	Messages []InputMessage
	// Tools are the request's custom tools, in order.
	Tools      []Tool
	ToolChoice ToolChoice
	// ToolChoiceName is tool_choice.name (ToolChoiceTool).
	ToolChoiceName string
	// Thinking is thinking.type: true for "enabled" (or "adaptive"), false
	// for "disabled", nil when not given (the model's default).
	Thinking *bool
}

// Prefill reports whether the conversation ends with an assistant message,
// which the answer continues (Anthropic's "prefill").
func (p *Prompt) Prefill() bool {
	n := len(p.Messages)
	return n > 0 && p.Messages[n-1].Role == RoleAssistant
}

// MessagesRequest is a validated POST /v1/messages body.
type MessagesRequest struct {
	Model string
	Prompt
	// MaxTokens is required (>= 1), as Anthropic requires it.
	MaxTokens     int
	StopSequences []string
	Temperature   *float64
	TopP          *float64
	TopK          *int
	Stream        bool
	// OutputSchema is output_config.format.schema (structured outputs:
	// the answer is JSON valid against it), or nil.
	OutputSchema json.RawMessage
}

// CountTokensRequest is a validated POST /v1/messages/count_tokens body.
type CountTokensRequest struct {
	Model string
	Prompt
}

// InputMessage is one message of the request's conversation.
type InputMessage struct {
	Role   string // RoleUser or RoleAssistant
	Blocks []InputBlock
}

// InputBlock is one content block of an input message. A string content is
// one text block.
type InputBlock struct {
	Type string // BlockText, BlockThinking, BlockRedactedThinking, BlockToolUse, BlockToolResult
	// Text is the text of a text block, the thinking of a thinking block, or
	// the content of a tool_result (its text blocks joined with "\n").
	Text string
	// ID, Name and Input (a compact JSON object) belong to tool_use blocks.
	ID    string
	Name  string
	Input json.RawMessage
	// ToolUseID and IsError belong to tool_result blocks.
	ToolUseID string
	IsError   bool
}

// Tool is a custom tool of the request.
type Tool struct {
	Name        string
	Description *string
	// InputSchema is the JSON schema object, raw (member order kept).
	InputSchema json.RawMessage
}

// ToolChoice is tool_choice.type: "auto" (default), "none", "any" or "tool"
// (the last two force a call through a grammar).
type ToolChoice string

// Message is the response: a whole assistant message, or (empty, with a nil
// StopReason) the message of a stream's message_start event.
type Message struct {
	ID           string         `json:"id"`
	Type         string         `json:"type"`
	Role         string         `json:"role"`
	Model        string         `json:"model"`
	Content      []ContentBlock `json:"content"`
	StopReason   *string        `json:"stop_reason"`
	StopSequence *string        `json:"stop_sequence"`
	Usage        Usage          `json:"usage"`
}

// Usage counts a request's tokens. InputTokens is the whole prompt
// (prefix-cache hits included).
type Usage struct {
	InputTokens  int `json:"input_tokens"`
	OutputTokens int `json:"output_tokens"`
}

// ContentBlock is one block of the response: text, thinking or tool_use.
// It marshals only the fields of its type, always with the required ones
// (an empty text block has "text": "").
type ContentBlock struct {
	Type      string          `json:"type"`
	Text      string          `json:"text,omitempty"`
	Thinking  string          `json:"thinking,omitempty"`
	Signature string          `json:"signature,omitempty"`
	ID        string          `json:"id,omitempty"`
	Name      string          `json:"name,omitempty"`
	Input     json.RawMessage `json:"input,omitempty"`
}

// MarshalJSON implements json.Marshaler.
func (b ContentBlock) MarshalJSON() ([]byte, error) {
	switch b.Type {
	case BlockThinking:
		// glmctl cannot sign its thinking; the signature is always empty
		// and is ignored when a client sends the block back.
		return json.Marshal(struct {
			Type      string `json:"type"`
			Thinking  string `json:"thinking"`
			Signature string `json:"signature"`
		}{b.Type, b.Thinking, b.Signature})
	case BlockToolUse:
		input := b.Input
		if len(input) == 0 {
			input = json.RawMessage(defaultToolInput)
		}
		return json.Marshal(struct {
			Type  string          `json:"type"`
			ID    string          `json:"id"`
			Name  string          `json:"name"`
			Input json.RawMessage `json:"input"`
		}{b.Type, b.ID, b.Name, input})
	default:
		return json.Marshal(struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}{b.Type, b.Text})
	}
}

// CountTokensResponse is the /v1/messages/count_tokens answer.
type CountTokensResponse struct {
	InputTokens int `json:"input_tokens"`
}

// StreamEvent is one server-sent event of a streamed response; EventName is
// its "event:" line, which always equals its "type".
type StreamEvent interface {
	EventName() string
}

// MessageStartEvent opens a stream with the empty message.
type MessageStartEvent struct {
	Type    string  `json:"type"`
	Message Message `json:"message"`
}

// ContentBlockStartEvent opens block Index, empty (a tool_use block with
// "input": {}).
type ContentBlockStartEvent struct {
	Type         string       `json:"type"`
	Index        int          `json:"index"`
	ContentBlock ContentBlock `json:"content_block"`
}

// ContentBlockDeltaEvent adds to block Index.
type ContentBlockDeltaEvent struct {
	Type  string `json:"type"`
	Index int    `json:"index"`
	Delta Delta  `json:"delta"`
}

// Delta is a text_delta, thinking_delta or input_json_delta.
type Delta struct {
	Type        string `json:"type"`
	Text        string `json:"text,omitempty"`
	Thinking    string `json:"thinking,omitempty"`
	PartialJSON string `json:"partial_json,omitempty"`
}

// MarshalJSON implements json.Marshaler: only the field of the delta's
// type, always present.
func (d Delta) MarshalJSON() ([]byte, error) {
	type one struct {
		Type string `json:"type"`
	}
	switch d.Type {
	case DeltaThinking:
		return json.Marshal(struct {
			one
			Thinking string `json:"thinking"`
		}{one{d.Type}, d.Thinking})
	case DeltaInputJSON:
		return json.Marshal(struct {
			one
			PartialJSON string `json:"partial_json"`
		}{one{d.Type}, d.PartialJSON})
	default:
		return json.Marshal(struct {
			one
			Text string `json:"text"`
		}{one{d.Type}, d.Text})
	}
}

// ContentBlockStopEvent closes block Index.
type ContentBlockStopEvent struct {
	Type  string `json:"type"`
	Index int    `json:"index"`
}

// MessageDeltaEvent carries the stop reason and the final usage.
type MessageDeltaEvent struct {
	Type  string       `json:"type"`
	Delta MessageDelta `json:"delta"`
	Usage Usage        `json:"usage"`
}

// MessageDelta is the top-level change of a message_delta event.
type MessageDelta struct {
	StopReason   *string `json:"stop_reason"`
	StopSequence *string `json:"stop_sequence"`
}

// MessageStopEvent ends a stream.
type MessageStopEvent struct {
	Type string `json:"type"`
}

// PingEvent keeps a stream alive; clients ignore it.
type PingEvent struct {
	Type string `json:"type"`
}

// EventName implements StreamEvent.
func (e MessageStartEvent) EventName() string { return e.Type }

// EventName implements StreamEvent.
func (e ContentBlockStartEvent) EventName() string { return e.Type }

// EventName implements StreamEvent.
func (e ContentBlockDeltaEvent) EventName() string { return e.Type }

// EventName implements StreamEvent.
func (e ContentBlockStopEvent) EventName() string { return e.Type }

// EventName implements StreamEvent.
func (e MessageDeltaEvent) EventName() string { return e.Type }

// EventName implements StreamEvent.
func (e MessageStopEvent) EventName() string { return e.Type }

// EventName implements StreamEvent.
func (e PingEvent) EventName() string { return e.Type }

// EventName implements StreamEvent.
func (e ErrorResponse) EventName() string { return EventError }

// NewMessageStart builds a message_start event.
func NewMessageStart(m Message) MessageStartEvent {
	return MessageStartEvent{Type: EventMsgStart, Message: m}
}

// NewBlockStart builds a content_block_start event.
func NewBlockStart(index int, b ContentBlock) ContentBlockStartEvent {
	return ContentBlockStartEvent{Type: EventBlockStart, Index: index, ContentBlock: b}
}

// NewBlockDelta builds a content_block_delta event.
func NewBlockDelta(index int, d Delta) ContentBlockDeltaEvent {
	return ContentBlockDeltaEvent{Type: EventBlockDelta, Index: index, Delta: d}
}

// NewBlockStop builds a content_block_stop event.
func NewBlockStop(index int) ContentBlockStopEvent {
	return ContentBlockStopEvent{Type: EventBlockStop, Index: index}
}

// NewMessageDelta builds a message_delta event.
func NewMessageDelta(stopReason string, stopSequence *string, u Usage) MessageDeltaEvent {
	return MessageDeltaEvent{Type: EventMsgDelta, Delta: MessageDelta{StopReason: &stopReason, StopSequence: stopSequence}, Usage: u}
}

// NewMessageStop builds a message_stop event.
func NewMessageStop() MessageStopEvent { return MessageStopEvent{Type: EventMsgStop} }

// NewPing builds a ping event.
func NewPing() PingEvent { return PingEvent{Type: EventPing} }
