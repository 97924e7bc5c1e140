package server

import (
	"bytes"
	"encoding/json"
	"strings"

	"github.com/glmctl/glmctl/pkg/engine"
	"github.com/glmctl/glmctl/pkg/server/anthropic"
	"github.com/glmctl/glmctl/pkg/server/openai"
	"github.com/glmctl/glmctl/pkg/tokenizer/chat"
)

// Pure conversions between the Anthropic wire types (package anthropic), the
// chat format's types and the engine's types. Nothing here does I/O or holds
// state beyond its arguments (blockBuilder holds only the blocks it built).

// chatPrompt is an Anthropic prompt in the chat template's terms.
type chatPrompt struct {
	messages []chat.Message
	// prefill is the text of a final assistant message, which the rendered
	// prompt ends with and the answer continues.
	prefill string
	tools   []json.RawMessage
	// enableThinking is the template's enable_thinking (nil = its default).
	enableThinking *bool
	// thinking tells the output parser that the answer starts inside the
	// reasoning.
	thinking bool
}

// toolResultErrorPrefix marks a tool_result with is_error set: the chat
// template has no such flag, so the model reads it in the text.
const toolResultErrorPrefix = "Error: "

// toChatPrompt converts an Anthropic prompt to chat messages: the system
// prompt first; a user message's tool_result blocks become tool messages
// (before its text, as Anthropic orders them); an assistant message's
// thinking blocks become its reasoning and its tool_use blocks its tool
// calls. Text blocks of one message are joined with "\n"; redacted thinking
// is dropped. A final assistant message is the prefill, which turns
// thinking off (the answer continues visible text).
func toChatPrompt(p *anthropic.Prompt) chatPrompt {
	var out chatPrompt
	if p.System != "" {
		out.messages = append(out.messages, chat.Message{Role: "system", Content: chat.Content(p.System)})
	}
	msgs := p.Messages
	if p.Prefill() {
		out.prefill = joinText(msgs[len(msgs)-1].Blocks, anthropic.BlockText)
		msgs = msgs[:len(msgs)-1]
		off := false
		out.enableThinking = &off
	} else {
		out.enableThinking = p.Thinking
		out.thinking = p.Thinking == nil || *p.Thinking
	}
	for _, m := range msgs {
		if m.Role == anthropic.RoleUser {
			var texts []string
			hasText := false
			for _, b := range m.Blocks {
				switch b.Type {
				case anthropic.BlockToolResult:
					content := b.Text
					if b.IsError {
						content = toolResultErrorPrefix + content
					}
					out.messages = append(out.messages, chat.Message{Role: "tool", Content: chat.Content(content), ToolCallID: b.ToolUseID})
				case anthropic.BlockText:
					texts, hasText = append(texts, b.Text), true
				}
			}
			if hasText || len(m.Blocks) == 0 {
				out.messages = append(out.messages, chat.Message{Role: "user", Content: chat.Content(strings.Join(texts, "\n"))})
			}
			continue
		}
		cm := chat.Message{Role: "assistant", Content: chat.Content(joinText(m.Blocks, anthropic.BlockText))}
		var thoughts []string
		for _, b := range m.Blocks {
			switch b.Type {
			case anthropic.BlockThinking:
				thoughts = append(thoughts, b.Text)
			case anthropic.BlockToolUse:
				cm.ToolCalls = append(cm.ToolCalls, chat.ToolCall{
					ID:       b.ID,
					Type:     "function",
					Function: chat.FunctionCall{Name: b.Name, Arguments: b.Input},
				})
			}
		}
		if len(thoughts) > 0 {
			r := strings.Join(thoughts, "\n")
			cm.ReasoningContent = &r
		}
		out.messages = append(out.messages, cm)
	}
	out.tools = anthropicToolObjects(p.Tools, p.ToolChoice)
	return out
}

// joinText joins the text of a message's blocks of type typ with "\n".
func joinText(blocks []anthropic.InputBlock, typ string) string {
	var texts []string
	for _, b := range blocks {
		if b.Type == typ {
			texts = append(texts, b.Text)
		}
	}
	return strings.Join(texts, "\n")
}

// anthropicToolObjects returns the OpenAI-shaped tool objects the chat
// template prints ({"type": "function", "function": {"name", "description",
// "parameters"}}, the input schema as sent), or nil when tool_choice is
// "none" (the model is then not offered the tools).
func anthropicToolObjects(tools []anthropic.Tool, choice anthropic.ToolChoice) []json.RawMessage {
	if choice == anthropic.ToolChoiceNone || len(tools) == 0 {
		return nil
	}
	out := make([]json.RawMessage, len(tools))
	for i, t := range tools {
		var b bytes.Buffer
		name, _ := json.Marshal(t.Name)
		b.WriteString(`{"type":"function","function":{"name":`)
		b.Write(name)
		if t.Description != nil {
			desc, _ := json.Marshal(*t.Description)
			b.WriteString(`,"description":`)
			b.Write(desc)
		}
		b.WriteString(`,"parameters":`)
		b.Write(t.InputSchema)
		b.WriteString("}}")
		out[i] = b.Bytes()
	}
	return out
}

// anthropicSampling is the request's sampling fields in the shared form;
// what it leaves out takes the server's defaults.
func anthropicSampling(r *anthropic.MessagesRequest) openai.Sampling {
	return openai.Sampling{Temperature: r.Temperature, TopP: r.TopP, TopK: r.TopK}
}

// toStopReason maps the engine's finish to Anthropic's stop_reason, and
// the stop sequence that matched (nil unless stop_reason is
// "stop_sequence").
func toStopReason(f engine.FinishReason, stopString string, toolUse bool) (string, *string) {
	switch {
	case f == engine.FinishLength:
		return anthropic.StopMaxTokens, nil
	case stopString != "":
		s := stopString
		return anthropic.StopSequence, &s
	case toolUse:
		return anthropic.StopToolUse, nil
	default:
		return anthropic.StopEndTurn, nil
	}
}

// toAnthropicUsage converts engine usage.
func toAnthropicUsage(u engine.Usage) anthropic.Usage {
	return anthropic.Usage{InputTokens: u.PromptTokens, OutputTokens: u.CompletionTokens}
}

// toAnthropicMessage builds the non-streamed response (or, with no blocks,
// no stop reason and output 0, the message of message_start).
func toAnthropicMessage(m meta, blocks []anthropic.ContentBlock, stopReason *string, stopSeq *string, u anthropic.Usage) anthropic.Message {
	return anthropic.Message{ID: m.id, Type: anthropic.ObjectMessage, Role: anthropic.RoleAssistant, Model: m.model,
		Content: nonNil(blocks), StopReason: stopReason, StopSequence: stopSeq, Usage: u}
}

// toAnthropicError converts an error of the shared server paths (body,
// model, length, queue, engine) to Anthropic's shape: the type follows the
// status, as Anthropic's does.
func toAnthropicError(e *openai.Error) *anthropic.Error {
	return anthropic.NewError(e.Status, e.Param, e.Message)
}

// blockBuilder turns chat pieces into Anthropic content blocks, and returns
// the stream events that build them: a block is opened (content_block_start,
// empty) when the kind of output changes, grows by deltas, and is closed
// (content_block_stop) when the next one opens or at the end. A tool call
// is one whole tool_use block: start, one input_json_delta with the whole
// arguments object, stop.
type blockBuilder struct {
	blocks  []anthropic.ContentBlock
	open    bool // the last block is still open
	toolUse bool // a tool_use block was built
}

// add folds pieces in and returns their events.
func (b *blockBuilder) add(pieces []chatPiece) []anthropic.StreamEvent {
	var evs []anthropic.StreamEvent
	for _, p := range pieces {
		switch p.kind {
		case chat.EventReasoning, chat.EventContent:
			typ, delta := anthropic.BlockText, anthropic.Delta{Type: anthropic.DeltaText, Text: p.text}
			if p.kind == chat.EventReasoning {
				typ, delta = anthropic.BlockThinking, anthropic.Delta{Type: anthropic.DeltaThinking, Thinking: p.text}
			}
			if n := len(b.blocks); !b.open || b.blocks[n-1].Type != typ {
				evs = append(evs, b.closeBlock()...)
				b.blocks = append(b.blocks, anthropic.ContentBlock{Type: typ})
				b.open = true
				evs = append(evs, anthropic.NewBlockStart(len(b.blocks)-1, b.blocks[len(b.blocks)-1]))
			}
			i := len(b.blocks) - 1
			if typ == anthropic.BlockThinking {
				b.blocks[i].Thinking += p.text
			} else {
				b.blocks[i].Text += p.text
			}
			evs = append(evs, anthropic.NewBlockDelta(i, delta))
		case chat.EventToolCall:
			evs = append(evs, b.closeBlock()...)
			args := p.call.Function.Arguments
			if args == "" {
				args = "{}"
			}
			i := len(b.blocks)
			blk := anthropic.ContentBlock{Type: anthropic.BlockToolUse, ID: p.call.ID, Name: p.call.Function.Name}
			evs = append(evs, anthropic.NewBlockStart(i, blk)) // input {} until the delta
			blk.Input = json.RawMessage(args)
			b.blocks = append(b.blocks, blk)
			evs = append(evs,
				anthropic.NewBlockDelta(i, anthropic.Delta{Type: anthropic.DeltaInputJSON, PartialJSON: args}),
				anthropic.NewBlockStop(i))
			b.toolUse = true
		}
	}
	return evs
}

// closeBlock closes the open block, if any.
func (b *blockBuilder) closeBlock() []anthropic.StreamEvent {
	if !b.open {
		return nil
	}
	b.open = false
	return []anthropic.StreamEvent{anthropic.NewBlockStop(len(b.blocks) - 1)}
}
