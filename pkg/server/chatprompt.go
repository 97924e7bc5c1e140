package server

import (
	"encoding/json"

	"github.com/glmctl/glmctl/pkg/tokenizer/chat"
)

// ChatPrompt is what a chat request asks to generate from: its messages,
// tools and thinking switches. The chat endpoints (/v1/chat/completions,
// /v1/messages, /v1/responses) and `glmctl generate --chat` all build one and
// go through EncodeChat, so the same messages give the same prompt ids.
type ChatPrompt struct {
	Messages []chat.Message
	// Tools are OpenAI tool objects, printed into the system block.
	Tools []json.RawMessage
	// EnableThinking and ClearThinking are the template's switches (nil =
	// its default).
	EnableThinking, ClearThinking *bool
	// Suffix is appended to the rendered prompt before encoding: the text of
	// a final assistant message that the answer continues (Anthropic's
	// prefill).
	Suffix string
}

// Options are the template options of a prompt to generate from: the
// assistant turn opener added.
func (p ChatPrompt) Options() chat.Options {
	return chat.Options{Tools: p.Tools, AddGenerationPrompt: true, EnableThinking: p.EnableThinking, ClearThinking: p.ClearThinking}
}

// ParserOptions are the output parser's options for the answer to p.
func (p ChatPrompt) ParserOptions() chat.ParserOptions { return p.Options().ParserOptions() }

// RenderError is EncodeChat's error when the chat format cannot render the
// messages: the request's fault. Other errors are the tokenizer's.
type RenderError struct{ Err error }

func (e *RenderError) Error() string { return e.Err.Error() }
func (e *RenderError) Unwrap() error { return e.Err }

// EncodeChat renders p with format and encodes the prompt (plus p.Suffix)
// with tok. It returns the ids and the rendered prompt (without the suffix).
// A rendering failure is a *RenderError; an encoding failure is tok's error
// as is.
func EncodeChat(format ChatFormat, tok Tokenizer, p ChatPrompt) (ids []int32, prompt string, err error) {
	prompt, err = format.Render(p.Messages, p.Options())
	if err != nil {
		return nil, "", &RenderError{Err: err}
	}
	ids, err = tok.Encode(prompt + p.Suffix)
	if err != nil {
		return nil, "", err
	}
	return ids, prompt, nil
}
