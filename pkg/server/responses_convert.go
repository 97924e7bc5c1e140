package server

import (
	"bytes"
	"encoding/json"
	"net/http"

	"github.com/glmctl/glmctl/pkg/engine"
	"github.com/glmctl/glmctl/pkg/server/openai"
	"github.com/glmctl/glmctl/pkg/server/responses"
	"github.com/glmctl/glmctl/pkg/tokenizer/chat"
)

// Pure conversions between the Responses wire types (package responses),
// the chat format's types and the engine's types. Nothing here does I/O or
// holds state beyond its arguments (outputBuilder holds only the items it
// built).

// toResponsesPrompt converts a Responses request to chat messages: the
// instructions first (a system message), then the input items in order.
// System and developer messages are system messages; a function_call_output
// is a tool message. An assistant turn gathers the items the model wrote
// in one turn, as the output holds them: a reasoning item (the turn's
// reasoning), an assistant message (its content) and function calls (its
// tool calls), in that order; an item out of that order starts a new turn.
func toResponsesPrompt(r *responses.Request) chatPrompt {
	out := chatPrompt{enableThinking: r.Thinking, thinking: r.Thinking == nil || *r.Thinking}
	if r.Instructions != "" {
		out.messages = append(out.messages, chat.Message{Role: "system", Content: chat.Content(r.Instructions)})
	}
	var turn *chat.Message // the assistant turn being gathered
	flush := func() {
		if turn != nil {
			out.messages = append(out.messages, *turn)
			turn = nil
		}
	}
	open := func() {
		if turn == nil {
			turn = &chat.Message{Role: "assistant"}
		}
	}
	for _, it := range r.Input {
		switch {
		case it.Type == responses.ItemReasoning:
			if turn != nil && (turn.ReasoningContent != nil || turn.Content != "" || len(turn.ToolCalls) > 0) {
				flush()
			}
			open()
			text := it.Text
			turn.ReasoningContent = &text
		case it.Type == responses.ItemMessage && it.Role == responses.RoleAssistant:
			if turn != nil && (turn.Content != "" || len(turn.ToolCalls) > 0) {
				flush()
			}
			open()
			turn.Content = chat.Content(it.Text)
		case it.Type == responses.ItemFunctionCall:
			open()
			turn.ToolCalls = append(turn.ToolCalls, chat.ToolCall{
				ID:       it.CallID,
				Type:     "function",
				Function: chat.FunctionCall{Name: it.Name, Arguments: it.Arguments},
			})
		case it.Type == responses.ItemFunctionCallOutput:
			flush()
			out.messages = append(out.messages, chat.Message{Role: "tool", Content: chat.Content(it.Text), ToolCallID: it.CallID})
		case it.Type == responses.ItemMessage:
			flush()
			role := "user"
			if it.Role == responses.RoleSystem || it.Role == responses.RoleDeveloper {
				role = "system"
			}
			out.messages = append(out.messages, chat.Message{Role: role, Content: chat.Content(it.Text)})
		}
	}
	flush()
	out.tools = responsesToolObjects(r.Tools, r.ToolChoice)
	return out
}

// responsesToolObjects returns the OpenAI chat tool objects the chat
// template prints ({"type": "function", "function": {"name",
// "description", "parameters"}}, the schema as sent), or nil when
// tool_choice is "none" (the model is then not offered the tools). strict
// is the API's business, not the model's, and is left out.
func responsesToolObjects(tools []responses.Tool, choice responses.ToolChoice) []json.RawMessage {
	if choice == responses.ToolChoiceNone || len(tools) == 0 {
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
		if len(t.Parameters) > 0 {
			b.WriteString(`,"parameters":`)
			b.Write(t.Parameters)
		}
		b.WriteString("}}")
		out[i] = b.Bytes()
	}
	return out
}

// responsesSampling is the request's sampling fields in the shared form;
// what it leaves out takes the server's defaults.
func responsesSampling(r *responses.Request) openai.Sampling {
	return openai.Sampling{Temperature: r.Temperature, TopP: r.TopP}
}

// toResponseStatus maps the engine's finish to the response's status: an
// answer cut by max_output_tokens (or the end of the context) is
// incomplete.
func toResponseStatus(f engine.FinishReason) string {
	if f == engine.FinishLength {
		return responses.StatusIncomplete
	}
	return responses.StatusCompleted
}

// toResponsesUsage converts engine usage; reasoning is the tokens sampled
// while the model was reasoning.
func toResponsesUsage(u engine.Usage, reasoning int) *responses.Usage {
	return &responses.Usage{
		InputTokens:         u.PromptTokens,
		InputTokensDetails:  responses.InputTokensDetails{CachedTokens: u.CachedPromptTokens},
		OutputTokens:        u.CompletionTokens,
		OutputTokensDetails: responses.OutputTokensDetails{ReasoningTokens: min(reasoning, u.CompletionTokens)},
		TotalTokens:         u.PromptTokens + u.CompletionTokens,
	}
}

// toResponse builds the response object: its output and usage, and what it
// repeats of the request (the sampling values in effect: the request's, or
// the server's defaults d). With status in_progress, nil items and nil
// usage, it is the response of a stream's first events.
func toResponse(m meta, req *responses.Request, d SamplingDefaults, status string, items []responses.OutputItem, u *responses.Usage) responses.Response {
	temp, topP := d.Temperature, d.TopP
	if req.Temperature != nil {
		temp = *req.Temperature
	}
	if req.TopP != nil {
		topP = *req.TopP
	}
	r := responses.Response{
		ID:                m.id,
		Object:            responses.ObjectResponse,
		CreatedAt:         m.created,
		Status:            status,
		Model:             m.model,
		Output:            nonNil(items),
		ParallelToolCalls: req.ParallelToolCalls == nil || *req.ParallelToolCalls,
		Reasoning:         req.Reasoning,
		Temperature:       &temp,
		Text:              responses.TextConfig{Format: textFormatEcho(req.TextFormat)},
		ToolChoice:        req.ToolChoice,
		Tools:             []responses.ToolObject{},
		TopP:              &topP,
		Truncation:        "disabled",
		Usage:             u,
		User:              req.User,
		Metadata:          req.Metadata,
	}
	if r.Metadata == nil {
		r.Metadata = map[string]string{}
	}
	if req.Instructions != "" {
		r.Instructions = &req.Instructions
	}
	if req.MaxOutputTokens > 0 {
		r.MaxOutputTokens = &req.MaxOutputTokens
	}
	if status == responses.StatusIncomplete {
		r.IncompleteDetails = &responses.IncompleteDetails{Reason: responses.IncompleteMaxOutputTokens}
	}
	for _, t := range req.Tools {
		r.Tools = append(r.Tools, responses.ToolObject{Type: responses.ToolFunction, Name: t.Name, Description: t.Description,
			Parameters: t.Parameters, Strict: t.Strict})
	}
	return r
}

// toResponseError is a failed response's error: OpenAI's codes there are
// rate_limit_exceeded or server_error.
func toResponseError(e *openai.Error) *responses.ResponseError {
	code := "server_error"
	if e.Status == http.StatusTooManyRequests {
		code = "rate_limit_exceeded"
	}
	return &responses.ResponseError{Code: code, Message: e.Message}
}

// Prefixes of output item ids.
const (
	itemIDReasoning    = "rs_"
	itemIDMessage      = "msg_"
	itemIDFunctionCall = "fc_"
)

func newItemID(prefix string) string { return prefix + randomID(12) }

// outputBuilder turns chat pieces into the response's output items, and
// returns the stream events that build them, in OpenAI's order: an item is
// added (response.output_item.added, empty, in progress) when the kind of
// output changes, with its one content part (response.content_part.added,
// empty); the part grows by deltas (response.reasoning_text.delta or
// response.output_text.delta); when the next item starts or the output
// ends, the text, the part and the item are done
// (response.reasoning_text.done or response.output_text.done,
// response.content_part.done, response.output_item.done). A function call
// is one whole item: added, one function_call_arguments.delta with the
// whole arguments, function_call_arguments.done, done.
type outputBuilder struct {
	// newID makes an item id from its prefix.
	newID func(prefix string) string
	items []responses.OutputItem
	open  bool // the last item is still open
	// functionCalls says a function_call item was built.
	functionCalls bool
	// reasoningTokens counts the sampled tokens whose text became
	// reasoning. A token whose text the parser holds back (part of a tag,
	// </think> itself, a tool call not yet closed) is pending until text
	// comes out, and counts with it: as reasoning if that text is reasoning.
	reasoningTokens int
	pending         int
}

// add folds pieces in and returns their events.
func (b *outputBuilder) add(pieces []chatPiece) []responses.StreamEvent {
	if len(pieces) > 0 {
		for _, p := range pieces {
			if p.kind == chat.EventReasoning {
				b.reasoningTokens += b.pending
				break
			}
		}
		b.pending = 0
	}
	var evs []responses.StreamEvent
	for _, p := range pieces {
		switch p.kind {
		case chat.EventReasoning, chat.EventContent:
			typ, part, prefix := responses.ItemMessage, responses.PartOutputText, itemIDMessage
			if p.kind == chat.EventReasoning {
				typ, part, prefix = responses.ItemReasoning, responses.PartReasoningText, itemIDReasoning
			}
			if n := len(b.items); !b.open || b.items[n-1].Type != typ {
				evs = append(evs, b.closeItem(responses.StatusCompleted)...)
				it := responses.OutputItem{Type: typ, ID: b.newID(prefix), Status: responses.StatusInProgress}
				i := len(b.items)
				evs = append(evs,
					responses.NewOutputItemEvent(responses.EventOutputItemAdded, i, it),
					responses.NewContentPartEvent(responses.EventContentPartAdded, it.ID, i, 0, responses.ContentPart{Type: part}))
				it.Content = []responses.ContentPart{{Type: part}}
				b.items = append(b.items, it)
				b.open = true
			}
			i := len(b.items) - 1
			it := &b.items[i]
			it.Content[0].Text += p.text
			evs = append(evs, responses.NewTextDelta(part, it.ID, i, 0, p.text))
		case chat.EventToolCall:
			evs = append(evs, b.closeItem(responses.StatusCompleted)...)
			args := p.call.Function.Arguments
			if args == "" {
				args = "{}"
			}
			i := len(b.items)
			it := responses.OutputItem{Type: responses.ItemFunctionCall, ID: b.newID(itemIDFunctionCall), Status: responses.StatusInProgress,
				CallID: p.call.ID, Name: p.call.Function.Name}
			evs = append(evs,
				responses.NewOutputItemEvent(responses.EventOutputItemAdded, i, it), // arguments "" until the delta
				responses.NewFunctionArgsDelta(it.ID, i, args),
				responses.NewFunctionArgsDone(it.ID, i, args))
			it.Arguments, it.Status = args, responses.StatusCompleted
			b.items = append(b.items, it)
			evs = append(evs, responses.NewOutputItemEvent(responses.EventOutputItemDone, i, it))
			b.functionCalls = true
		}
	}
	return evs
}

// sampled counts one sampled token; call it before adding the pieces its
// text gave.
func (b *outputBuilder) sampled() { b.pending++ }

// closeItem ends the open item, if any, with status (completed, or
// incomplete when the output was cut).
func (b *outputBuilder) closeItem(status string) []responses.StreamEvent {
	if !b.open {
		return nil
	}
	b.open = false
	i := len(b.items) - 1
	it := &b.items[i]
	it.Status = status
	part := it.Content[0]
	return []responses.StreamEvent{
		responses.NewTextDone(part.Type, it.ID, i, 0, part.Text),
		responses.NewContentPartEvent(responses.EventContentPartDone, it.ID, i, 0, part),
		responses.NewOutputItemEvent(responses.EventOutputItemDone, i, *it),
	}
}

// textFormatEcho is text.format as the response shows it: "text" unless the
// request constrained the answer.
func textFormatEcho(f responses.TextFormat) responses.TextFormat {
	if f.Type == "" {
		return responses.TextFormat{Type: "text"}
	}
	return f
}
