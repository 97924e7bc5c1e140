// Package responses holds the wire types of glmctl's OpenAI Responses API
// (POST /v1/responses): the request body, decoded and validated by
// DecodeRequest into plain structs, the response object and its output
// items, and the server-sent stream events. Errors have OpenAI's shape and
// are package openai's. It knows nothing of the engine, the tokenizer or
// the chat template; pkg/server converts between these types and engine and
// chat types with pure functions.
package responses

import (
	"encoding/json"

	"github.com/glmctl/glmctl/pkg/server/openai"
)

// ObjectResponse is a response object's "object".
const ObjectResponse = "response"

// Roles of input messages. System and developer messages are both the chat
// template's system messages.
const (
	RoleUser      = "user"
	RoleSystem    = "system"
	RoleDeveloper = "developer"
	RoleAssistant = "assistant"
)

// Item types, of input and output items.
const (
	ItemMessage            = "message"
	ItemFunctionCall       = "function_call"
	ItemFunctionCallOutput = "function_call_output"
	ItemReasoning          = "reasoning"
	ItemReference          = "item_reference"
)

// Content part types.
const (
	PartInputText     = "input_text"
	PartOutputText    = "output_text"
	PartRefusal       = "refusal"
	PartReasoningText = "reasoning_text"
	PartSummaryText   = "summary_text"
)

// Statuses of a response and of its output items.
const (
	StatusInProgress = "in_progress"
	StatusCompleted  = "completed"
	StatusIncomplete = "incomplete"
	StatusFailed     = "failed"
)

// IncompleteMaxOutputTokens is incomplete_details.reason when the answer
// hit max_output_tokens (or the end of the context).
const IncompleteMaxOutputTokens = "max_output_tokens"

// ToolFunction is the only tool type: a function the client runs.
const ToolFunction = "function"

// defaultArguments stands for a function call's missing arguments.
const defaultArguments = "{}"

// Tool choices accepted.
const (
	ToolChoiceAuto     ToolChoice = "auto"
	ToolChoiceNone     ToolChoice = "none"
	ToolChoiceRequired ToolChoice = "required"
	ToolChoiceFunction ToolChoice = "function"
)

// Stream event types, in the order a stream sends them.
const (
	EventCreated            = "response.created"
	EventInProgress         = "response.in_progress"
	EventOutputItemAdded    = "response.output_item.added"
	EventContentPartAdded   = "response.content_part.added"
	EventReasoningTextDelta = "response.reasoning_text.delta"
	EventReasoningTextDone  = "response.reasoning_text.done"
	EventOutputTextDelta    = "response.output_text.delta"
	EventOutputTextDone     = "response.output_text.done"
	EventContentPartDone    = "response.content_part.done"
	EventFunctionArgsDelta  = "response.function_call_arguments.delta"
	EventFunctionArgsDone   = "response.function_call_arguments.done"
	EventOutputItemDone     = "response.output_item.done"
	EventCompleted          = "response.completed"
	EventIncomplete         = "response.incomplete"
	EventFailed             = "response.failed"
)

// Request is a validated POST /v1/responses body.
type Request struct {
	Model string
	// Input is the conversation, in order; a string input is one user
	// message.
	Input []InputItem
	// Instructions is the system prompt put before the input; "" = none.
	Instructions string
	// MaxOutputTokens caps the answer, reasoning included; 0 = not given
	// (up to the end of the context).
	MaxOutputTokens int
	Temperature     *float64
	TopP            *float64
	Stream          bool
	// Tools are the request's function tools, in order.
	Tools      []Tool
	ToolChoice ToolChoice
	// ToolChoiceName is the function a {"type": "function"} tool_choice
	// names (ToolChoiceFunction).
	ToolChoiceName string
	// Format is text.format when it constrains the answer (json_object,
	// json_schema); nil for text. TextFormat is what the response echoes
	// (zero for text).
	Format     *openai.Format
	TextFormat TextFormat
	// ParallelToolCalls is parallel_tool_calls as sent (nil = not given);
	// it is echoed, not enforced.
	ParallelToolCalls *bool
	// Reasoning is the reasoning object as sent; Thinking is what it means
	// for GLM: false for effort "none", true for any other effort, nil when
	// no effort was given (the model's default).
	Reasoning Reasoning
	Thinking  *bool
	// Metadata (at most 16 string pairs) and User are echoed in the
	// response.
	Metadata map[string]string
	User     *string
}

// InputItem is one item of the request's input.
type InputItem struct {
	Type string // ItemMessage, ItemFunctionCall, ItemFunctionCallOutput or ItemReasoning
	// Role (RoleUser, RoleSystem, RoleDeveloper or RoleAssistant) and Text
	// (its text parts, joined as the chat template joins text parts) belong
	// to messages. Text is also a reasoning item's text (its reasoning_text
	// parts, else its summary, joined with "\n") and a function_call_output's
	// output.
	Role string
	Text string
	// CallID belongs to function calls and their outputs; Name and
	// Arguments (a compact JSON object) to function calls.
	CallID    string
	Name      string
	Arguments json.RawMessage
}

// Tool is a function tool of the request.
type Tool struct {
	Name        string
	Description *string
	// Parameters is the JSON schema object, raw (member order kept); nil
	// when not given.
	Parameters json.RawMessage
	// Strict is echoed; glmctl does not constrain the arguments to the
	// schema.
	Strict *bool
}

// ToolChoice is "auto" (default), "none", "required" or "function" (a call
// to Request.ToolChoiceName); the last two are enforced by a grammar.
type ToolChoice string

// Reasoning is the request's reasoning object, echoed in the response.
type Reasoning struct {
	Effort  *string `json:"effort"`
	Summary *string `json:"summary"`
}

// Response is the response object: the whole answer, or (status
// in_progress, no output, no usage) the response of a stream's first
// events.
type Response struct {
	ID                 string             `json:"id"`
	Object             string             `json:"object"`
	CreatedAt          int64              `json:"created_at"`
	Status             string             `json:"status"`
	Error              *ResponseError     `json:"error"`
	IncompleteDetails  *IncompleteDetails `json:"incomplete_details"`
	Instructions       *string            `json:"instructions"`
	MaxOutputTokens    *int               `json:"max_output_tokens"`
	Model              string             `json:"model"`
	Output             []OutputItem       `json:"output"`
	ParallelToolCalls  bool               `json:"parallel_tool_calls"`
	PreviousResponseID *string            `json:"previous_response_id"`
	Reasoning          Reasoning          `json:"reasoning"`
	Store              bool               `json:"store"`
	Temperature        *float64           `json:"temperature"`
	Text               TextConfig         `json:"text"`
	ToolChoice         ToolChoice         `json:"tool_choice"`
	Tools              []ToolObject       `json:"tools"`
	TopP               *float64           `json:"top_p"`
	Truncation         string             `json:"truncation"`
	Usage              *Usage             `json:"usage"`
	User               *string            `json:"user"`
	Metadata           map[string]string  `json:"metadata"`
}

// ResponseError is a failed response's error.
type ResponseError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// IncompleteDetails says why a response is incomplete.
type IncompleteDetails struct {
	Reason string `json:"reason"`
}

// TextConfig is the response's text settings.
type TextConfig struct {
	Format TextFormat `json:"format"`
}

// TextFormat is text.format, as the response echoes it.
type TextFormat struct {
	Type   string          `json:"type"`
	Name   string          `json:"name,omitempty"`
	Schema json.RawMessage `json:"schema,omitempty"`
	Strict *bool           `json:"strict,omitempty"`
}

// ToolObject is a function tool as the response echoes it.
type ToolObject struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description *string         `json:"description"`
	Parameters  json.RawMessage `json:"parameters"`
	Strict      *bool           `json:"strict"`
}

// Usage counts a response's tokens. InputTokens is the whole prompt
// (prefix-cache hits included, and counted again in cached_tokens);
// OutputTokens every sampled token, reasoning included.
type Usage struct {
	InputTokens         int                 `json:"input_tokens"`
	InputTokensDetails  InputTokensDetails  `json:"input_tokens_details"`
	OutputTokens        int                 `json:"output_tokens"`
	OutputTokensDetails OutputTokensDetails `json:"output_tokens_details"`
	TotalTokens         int                 `json:"total_tokens"`
}

// InputTokensDetails is usage.input_tokens_details.
type InputTokensDetails struct {
	CachedTokens     int `json:"cached_tokens"`
	CacheWriteTokens int `json:"cache_write_tokens"`
}

// OutputTokensDetails is usage.output_tokens_details.
type OutputTokensDetails struct {
	ReasoningTokens int `json:"reasoning_tokens"`
}

// OutputItem is one item of the response's output: a reasoning item, an
// assistant message, or a function call. It marshals only the fields of its
// type, always with the required ones.
type OutputItem struct {
	Type   string // ItemReasoning, ItemMessage or ItemFunctionCall
	ID     string
	Status string
	// Content is a message's output_text parts or a reasoning item's
	// reasoning_text parts.
	Content []ContentPart
	// CallID, Name and Arguments (a JSON object, as a string) belong to
	// function calls.
	CallID    string
	Name      string
	Arguments string
}

// MarshalJSON implements json.Marshaler.
func (it OutputItem) MarshalJSON() ([]byte, error) {
	content := it.Content
	if content == nil {
		content = []ContentPart{}
	}
	switch it.Type {
	case ItemReasoning:
		// GLM's reasoning is the item's content; there is no summary.
		return json.Marshal(struct {
			ID      string        `json:"id"`
			Type    string        `json:"type"`
			Summary []ContentPart `json:"summary"`
			Content []ContentPart `json:"content"`
			Status  string        `json:"status"`
		}{it.ID, it.Type, []ContentPart{}, content, it.Status})
	case ItemFunctionCall:
		return json.Marshal(struct {
			ID        string `json:"id"`
			Type      string `json:"type"`
			Status    string `json:"status"`
			Arguments string `json:"arguments"`
			CallID    string `json:"call_id"`
			Name      string `json:"name"`
		}{it.ID, it.Type, it.Status, it.Arguments, it.CallID, it.Name})
	default:
		return json.Marshal(struct {
			ID      string        `json:"id"`
			Type    string        `json:"type"`
			Status  string        `json:"status"`
			Role    string        `json:"role"`
			Content []ContentPart `json:"content"`
		}{it.ID, it.Type, it.Status, RoleAssistant, content})
	}
}

// ContentPart is an output_text part of a message or a reasoning_text part
// of a reasoning item.
type ContentPart struct {
	Type string
	Text string
}

// MarshalJSON implements json.Marshaler: an output_text part carries empty
// annotations and logprobs, as OpenAI sends them.
func (p ContentPart) MarshalJSON() ([]byte, error) {
	if p.Type == PartOutputText {
		return json.Marshal(struct {
			Type        string `json:"type"`
			Text        string `json:"text"`
			Annotations []any  `json:"annotations"`
			Logprobs    []any  `json:"logprobs"`
		}{p.Type, p.Text, []any{}, []any{}})
	}
	return json.Marshal(struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}{p.Type, p.Text})
}

// StreamEvent is one server-sent event of a streamed response. Its header
// holds the type (also the event's "event:" line) and the sequence number,
// which the sender sets as it sends the events in order.
type StreamEvent interface {
	Header() *EventHeader
}

// EventHeader starts every stream event.
type EventHeader struct {
	Type           string `json:"type"`
	SequenceNumber int    `json:"sequence_number"`
}

// Header implements StreamEvent.
func (h *EventHeader) Header() *EventHeader { return h }

// ResponseEvent is response.created, response.in_progress,
// response.completed, response.incomplete or response.failed: the response
// as it stands.
type ResponseEvent struct {
	EventHeader
	Response Response `json:"response"`
}

// OutputItemEvent is response.output_item.added (the item, empty and in
// progress) or response.output_item.done (the item, whole).
type OutputItemEvent struct {
	EventHeader
	OutputIndex int        `json:"output_index"`
	Item        OutputItem `json:"item"`
}

// ContentPartEvent is response.content_part.added (the part, empty) or
// response.content_part.done (the part, whole).
type ContentPartEvent struct {
	EventHeader
	ItemID       string      `json:"item_id"`
	OutputIndex  int         `json:"output_index"`
	ContentIndex int         `json:"content_index"`
	Part         ContentPart `json:"part"`
}

// OutputTextDeltaEvent is response.output_text.delta: more text of a
// message's part.
type OutputTextDeltaEvent struct {
	EventHeader
	ItemID       string `json:"item_id"`
	OutputIndex  int    `json:"output_index"`
	ContentIndex int    `json:"content_index"`
	Delta        string `json:"delta"`
	Logprobs     []any  `json:"logprobs"`
}

// OutputTextDoneEvent is response.output_text.done: a message part's whole
// text.
type OutputTextDoneEvent struct {
	EventHeader
	ItemID       string `json:"item_id"`
	OutputIndex  int    `json:"output_index"`
	ContentIndex int    `json:"content_index"`
	Text         string `json:"text"`
	Logprobs     []any  `json:"logprobs"`
}

// ReasoningTextDeltaEvent is response.reasoning_text.delta: more of the
// reasoning.
type ReasoningTextDeltaEvent struct {
	EventHeader
	ItemID       string `json:"item_id"`
	OutputIndex  int    `json:"output_index"`
	ContentIndex int    `json:"content_index"`
	Delta        string `json:"delta"`
}

// ReasoningTextDoneEvent is response.reasoning_text.done: the whole
// reasoning.
type ReasoningTextDoneEvent struct {
	EventHeader
	ItemID       string `json:"item_id"`
	OutputIndex  int    `json:"output_index"`
	ContentIndex int    `json:"content_index"`
	Text         string `json:"text"`
}

// FunctionArgsDeltaEvent is response.function_call_arguments.delta.
type FunctionArgsDeltaEvent struct {
	EventHeader
	ItemID      string `json:"item_id"`
	OutputIndex int    `json:"output_index"`
	Delta       string `json:"delta"`
}

// FunctionArgsDoneEvent is response.function_call_arguments.done: a
// call's whole arguments.
type FunctionArgsDoneEvent struct {
	EventHeader
	ItemID      string `json:"item_id"`
	OutputIndex int    `json:"output_index"`
	Arguments   string `json:"arguments"`
}

func header(typ string) EventHeader { return EventHeader{Type: typ} }

// NewResponseEvent builds a response.* lifecycle event of type typ.
func NewResponseEvent(typ string, r Response) *ResponseEvent {
	return &ResponseEvent{EventHeader: header(typ), Response: r}
}

// NewOutputItemEvent builds response.output_item.added or .done.
func NewOutputItemEvent(typ string, index int, it OutputItem) *OutputItemEvent {
	return &OutputItemEvent{EventHeader: header(typ), OutputIndex: index, Item: it}
}

// NewContentPartEvent builds response.content_part.added or .done.
func NewContentPartEvent(typ, itemID string, index, contentIndex int, p ContentPart) *ContentPartEvent {
	return &ContentPartEvent{EventHeader: header(typ), ItemID: itemID, OutputIndex: index, ContentIndex: contentIndex, Part: p}
}

// NewTextDelta builds the delta event of a message part (output_text) or
// of reasoning (reasoning_text), following the part's type.
func NewTextDelta(partType, itemID string, index, contentIndex int, delta string) StreamEvent {
	if partType == PartReasoningText {
		return &ReasoningTextDeltaEvent{EventHeader: header(EventReasoningTextDelta), ItemID: itemID, OutputIndex: index, ContentIndex: contentIndex, Delta: delta}
	}
	return &OutputTextDeltaEvent{EventHeader: header(EventOutputTextDelta), ItemID: itemID, OutputIndex: index, ContentIndex: contentIndex,
		Delta: delta, Logprobs: []any{}}
}

// NewTextDone builds the done event of a message part or of reasoning.
func NewTextDone(partType, itemID string, index, contentIndex int, text string) StreamEvent {
	if partType == PartReasoningText {
		return &ReasoningTextDoneEvent{EventHeader: header(EventReasoningTextDone), ItemID: itemID, OutputIndex: index, ContentIndex: contentIndex, Text: text}
	}
	return &OutputTextDoneEvent{EventHeader: header(EventOutputTextDone), ItemID: itemID, OutputIndex: index, ContentIndex: contentIndex,
		Text: text, Logprobs: []any{}}
}

// NewFunctionArgsDelta builds response.function_call_arguments.delta.
func NewFunctionArgsDelta(itemID string, index int, delta string) *FunctionArgsDeltaEvent {
	return &FunctionArgsDeltaEvent{EventHeader: header(EventFunctionArgsDelta), ItemID: itemID, OutputIndex: index, Delta: delta}
}

// NewFunctionArgsDone builds response.function_call_arguments.done.
func NewFunctionArgsDone(itemID string, index int, args string) *FunctionArgsDoneEvent {
	return &FunctionArgsDoneEvent{EventHeader: header(EventFunctionArgsDone), ItemID: itemID, OutputIndex: index, Arguments: args}
}
