package openai

import (
	"encoding/json"
	"math"
)

// MaxDetokenizeTokens bounds the ids of one /detokenize request.
const MaxDetokenizeTokens = 1 << 20

// TokenizeRequest is a validated POST /tokenize body, in vLLM's two shapes:
// {"prompt": "..."} (a completions prompt) or {"messages": [...],
// "add_generation_prompt": bool} (a chat rendered by the chat template).
type TokenizeRequest struct {
	Model string
	// Prompt is set for the completions shape; Messages (non-nil) for the
	// chat shape.
	Prompt   string
	Messages []Message
	// AddGenerationPrompt (chat shape; default true, as vLLM) ends the
	// rendered prompt with the assistant's turn marker.
	AddGenerationPrompt bool
	EnableThinking      *bool
	ReturnTokenStrs     bool
}

// TokenizeResponse is vLLM's /tokenize answer.
type TokenizeResponse struct {
	Tokens      []int32  `json:"tokens"`
	Count       int      `json:"count"`
	MaxModelLen int      `json:"max_model_len"`
	TokenStrs   []string `json:"token_strs,omitempty"`
}

// DetokenizeRequest is a validated POST /detokenize body.
type DetokenizeRequest struct {
	Model  string
	Tokens []int32
}

// DetokenizeResponse is vLLM's /detokenize answer.
type DetokenizeResponse struct {
	Prompt string `json:"prompt"`
}

// VersionResponse is GET /version: vLLM sends {"version": ...}; glmctl adds
// its commit.
type VersionResponse struct {
	Version string `json:"version"`
	Commit  string `json:"commit,omitempty"`
}

type tokenizeWire struct {
	Model               *string           `json:"model"`
	Prompt              json.RawMessage   `json:"prompt"`
	Messages            []json.RawMessage `json:"messages"`
	AddGenerationPrompt *bool             `json:"add_generation_prompt"`
	AddSpecialTokens    *bool             `json:"add_special_tokens"`
	ReturnTokenStrs     *bool             `json:"return_token_strs"`
	ChatTemplateKwargs  *struct {
		EnableThinking *bool `json:"enable_thinking"`
	} `json:"chat_template_kwargs"`
}

// DecodeTokenizeRequest parses and validates a /tokenize body: exactly one of
// "prompt" (a string) and "messages".
func DecodeTokenizeRequest(body []byte) (*TokenizeRequest, *Error) {
	var w tokenizeWire
	if err := unmarshal(body, &w, ""); err != nil {
		return nil, err
	}
	req := &TokenizeRequest{AddGenerationPrompt: true}
	if w.Model != nil {
		req.Model = *w.Model
	}
	req.ReturnTokenStrs = w.ReturnTokenStrs != nil && *w.ReturnTokenStrs
	hasPrompt, hasMessages := !isNull(w.Prompt), w.Messages != nil
	switch {
	case hasPrompt && hasMessages:
		return nil, BadRequest("messages", "give either prompt (a string) or messages, not both")
	case !hasPrompt && !hasMessages:
		return nil, BadRequest("prompt", "prompt (a string) or messages is required")
	case hasPrompt:
		if err := json.Unmarshal(w.Prompt, &req.Prompt); err != nil {
			return nil, BadRequest("prompt", "prompt: expected a string")
		}
		if w.AddGenerationPrompt != nil {
			return nil, BadRequest("add_generation_prompt", "add_generation_prompt applies to messages, not to a prompt")
		}
		return req, nil
	}
	var err *Error
	if req.Messages, err = decodeMessages(w.Messages); err != nil {
		return nil, err
	}
	if w.AddGenerationPrompt != nil {
		req.AddGenerationPrompt = *w.AddGenerationPrompt
	}
	if kw := w.ChatTemplateKwargs; kw != nil {
		req.EnableThinking = kw.EnableThinking
	}
	return req, nil
}

type detokenizeWire struct {
	Model  *string         `json:"model"`
	Tokens json.RawMessage `json:"tokens"`
}

// DecodeDetokenizeRequest parses and validates a /detokenize body. The ids'
// range against the vocabulary is the server's to check.
func DecodeDetokenizeRequest(body []byte) (*DetokenizeRequest, *Error) {
	var w detokenizeWire
	if err := unmarshal(body, &w, ""); err != nil {
		return nil, err
	}
	req := &DetokenizeRequest{}
	if w.Model != nil {
		req.Model = *w.Model
	}
	if isNull(w.Tokens) {
		return nil, BadRequest("tokens", "tokens (an array of token ids) is required")
	}
	var ids []int64
	if err := json.Unmarshal(w.Tokens, &ids); err != nil {
		return nil, BadRequest("tokens", "tokens: expected an array of integer token ids")
	}
	if len(ids) > MaxDetokenizeTokens {
		return nil, BadRequest("tokens", "tokens: %d ids; the limit is %d", len(ids), MaxDetokenizeTokens)
	}
	req.Tokens = make([]int32, len(ids))
	for i, id := range ids {
		if id < 0 || id > math.MaxInt32 {
			return nil, BadRequest("tokens", "tokens[%d]: token id %d is out of range", i, id)
		}
		req.Tokens[i] = int32(id)
	}
	return req, nil
}
