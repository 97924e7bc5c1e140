// Package openai holds the OpenAI-compatible wire types of glmctl's HTTP API:
// the request bodies (decoded and validated by DecodeChatRequest and
// DecodeCompletionRequest into plain structs), the response and stream-chunk
// bodies, and the error body. It knows nothing of the engine or the
// tokenizer; pkg/server converts between these types and engine types.
package openai

import "encoding/json"

// Object names used in responses.
const (
	ObjectChatCompletion      = "chat.completion"
	ObjectChatCompletionChunk = "chat.completion.chunk"
	ObjectTextCompletion      = "text_completion"
	ObjectList                = "list"
	ObjectModel               = "model"
)

// Finish reasons sent to clients.
const (
	FinishStop      = "stop"
	FinishLength    = "length"
	FinishToolCalls = "tool_calls"
)

// Sampling holds the sampling fields shared by both endpoints, as sent; nil
// means "not given" (the server's default applies).
type Sampling struct {
	Temperature       *float64
	TopP              *float64
	TopK              *int
	MinP              *float64
	PresencePenalty   *float64
	FrequencyPenalty  *float64
	RepetitionPenalty *float64
	Seed              *int64
}

// ChatRequest is a validated POST /v1/chat/completions body.
type ChatRequest struct {
	Model    string
	Messages []Message
	Sampling Sampling
	// MaxTokens is max_completion_tokens, else max_tokens; 0 = not given.
	MaxTokens   int
	Stop        []string
	Logprobs    bool
	TopLogprobs int
	// N is how many choices to generate (n; 1 when not given).
	N            int
	Stream       bool
	IncludeUsage bool
	// Tools are the request's tool objects, raw (member order kept for the
	// chat template), with their function names.
	Tools      []Tool
	ToolChoice ToolChoice
	// ToolChoiceName is the function tool_choice names (ToolChoiceFunction).
	ToolChoiceName string
	// EnableThinking and ClearThinking come from chat_template_kwargs (or
	// Z.ai's "thinking": {"type": "enabled"|"disabled"}); nil = not given.
	EnableThinking *bool
	ClearThinking  *bool
	IgnoreEOS      bool
	// Speculative (a glmctl extension, "speculative": true|false) turns
	// speculative decoding on or off for this request; nil = the server's
	// setting.
	Speculative *bool
	// Format constrains the output (structured outputs); nil = free text.
	Format *Format
}

// Message is one chat message with its content flattened to text.
type Message struct {
	Role             string
	Content          string
	ReasoningContent *string
	ToolCalls        []MessageToolCall
	ToolCallID       string
	Name             string
}

// MessageToolCall is a tool call inside an assistant message of the request.
// Arguments is a JSON object (decoded from the wire's JSON string).
type MessageToolCall struct {
	ID        string
	Name      string
	Arguments json.RawMessage
}

// Tool is one entry of the request's tools.
type Tool struct {
	Name string
	Raw  json.RawMessage
	// Parameters is function.parameters (a JSON schema object), or nil.
	Parameters json.RawMessage
}

// ToolChoice is the request's tool_choice: "auto" (default), "none",
// "required" (at least one call) or "function" (a call to
// ChatRequest.ToolChoiceName); the last two are enforced by a grammar.
type ToolChoice string

// Tool choices accepted.
const (
	ToolChoiceAuto     ToolChoice = "auto"
	ToolChoiceNone     ToolChoice = "none"
	ToolChoiceRequired ToolChoice = "required"
	ToolChoiceFunction ToolChoice = "function"
)

// CompletionRequest is a validated POST /v1/completions body.
type CompletionRequest struct {
	Model string
	// Prompts holds one entry per prompt: text, or token ids.
	Prompts []Prompt
	// N is how many choices to generate per prompt (n; 1 when not given).
	// Choice p*N+j is copy j of prompt p.
	N            int
	Sampling     Sampling
	MaxTokens    int // 0 = not given (OpenAI's default for completions is 16)
	Stop         []string
	Logprobs     *int // nil = no logprobs; n = sampled token plus n alternatives
	Echo         bool
	Stream       bool
	IncludeUsage bool
	IgnoreEOS    bool
	Speculative  *bool // as ChatRequest.Speculative
	// Format constrains each completion (vLLM's guided_* parameters, or
	// response_format); nil = free text.
	Format *Format
}

// Prompt is one completion prompt: Text, or TokenIDs when IsTokens.
type Prompt struct {
	Text     string
	TokenIDs []int32
	IsTokens bool
}

// ChatCompletion is a non-streamed chat response.
type ChatCompletion struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []ChatChoice `json:"choices"`
	Usage   *Usage       `json:"usage,omitempty"`
}

// ChatChoice is one choice of a ChatCompletion.
type ChatChoice struct {
	Index        int             `json:"index"`
	Message      ResponseMessage `json:"message"`
	Logprobs     *ChatLogprobs   `json:"logprobs"`
	FinishReason string          `json:"finish_reason"`
}

// ResponseMessage is the assistant message of a ChatChoice. Content is null
// when the model produced only tool calls.
type ResponseMessage struct {
	Role             string     `json:"role"`
	Content          *string    `json:"content"`
	ReasoningContent *string    `json:"reasoning_content,omitempty"`
	ToolCalls        []ToolCall `json:"tool_calls,omitempty"`
}

// ToolCall is a tool call in a response message or a stream delta (Index
// only in deltas).
type ToolCall struct {
	Index    *int         `json:"index,omitempty"`
	ID       string       `json:"id,omitempty"`
	Type     string       `json:"type,omitempty"`
	Function FunctionCall `json:"function"`
}

// FunctionCall names the function and carries its arguments as a JSON string.
type FunctionCall struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}

// ChatLogprobs are the logprobs of a chat choice or chunk.
type ChatLogprobs struct {
	Content []TokenLogprob `json:"content"`
}

// TokenLogprob is one sampled token with its logprob and alternatives.
type TokenLogprob struct {
	Token       string       `json:"token"`
	Logprob     float64      `json:"logprob"`
	Bytes       []int        `json:"bytes"`
	TopLogprobs []TopLogprob `json:"top_logprobs"`
}

// TopLogprob is one alternative token.
type TopLogprob struct {
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

// ChatCompletionChunk is one SSE event of a streamed chat response. The
// usage-only chunk (stream_options.include_usage) has no choices.
type ChatCompletionChunk struct {
	ID      string        `json:"id"`
	Object  string        `json:"object"`
	Created int64         `json:"created"`
	Model   string        `json:"model"`
	Choices []ChunkChoice `json:"choices"`
	Usage   *Usage        `json:"usage,omitempty"`
}

// ChunkChoice is one choice of a chunk; FinishReason is null until the last.
type ChunkChoice struct {
	Index        int           `json:"index"`
	Delta        Delta         `json:"delta"`
	Logprobs     *ChatLogprobs `json:"logprobs"`
	FinishReason *string       `json:"finish_reason"`
}

// Delta is the new part of the assistant message.
type Delta struct {
	Role             string     `json:"role,omitempty"`
	Content          *string    `json:"content,omitempty"`
	ReasoningContent *string    `json:"reasoning_content,omitempty"`
	ToolCalls        []ToolCall `json:"tool_calls,omitempty"`
}

// Completion is a /v1/completions response, and (with Object the same) one
// chunk of a streamed one.
type Completion struct {
	ID      string             `json:"id"`
	Object  string             `json:"object"`
	Created int64              `json:"created"`
	Model   string             `json:"model"`
	Choices []CompletionChoice `json:"choices"`
	Usage   *Usage             `json:"usage,omitempty"`
}

// CompletionChoice is one choice; FinishReason is null in intermediate
// stream chunks.
type CompletionChoice struct {
	Index        int                 `json:"index"`
	Text         string              `json:"text"`
	Logprobs     *CompletionLogprobs `json:"logprobs"`
	FinishReason *string             `json:"finish_reason"`
}

// CompletionLogprobs is the legacy completions logprobs object.
type CompletionLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []float64            `json:"token_logprobs"`
	TopLogprobs   []map[string]float64 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

// Usage counts the tokens of a request.
type Usage struct {
	PromptTokens        int                  `json:"prompt_tokens"`
	CompletionTokens    int                  `json:"completion_tokens"`
	TotalTokens         int                  `json:"total_tokens"`
	PromptTokensDetails *PromptTokensDetails `json:"prompt_tokens_details,omitempty"`
}

// PromptTokensDetails says how many prompt tokens came from the prefix cache.
type PromptTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// ModelList is the GET /v1/models response.
type ModelList struct {
	Object string  `json:"object"`
	Data   []Model `json:"data"`
}

// Model describes the served model.
type Model struct {
	ID          string `json:"id"`
	Object      string `json:"object"`
	Created     int64  `json:"created"`
	OwnedBy     string `json:"owned_by"`
	MaxModelLen int    `json:"max_model_len,omitempty"`
}
