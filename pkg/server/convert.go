package server

import (
	"encoding/json"
	"math"
	"strings"

	"github.com/glmctl/glmctl/pkg/engine"
	"github.com/glmctl/glmctl/pkg/grammar"
	"github.com/glmctl/glmctl/pkg/server/openai"
	"github.com/glmctl/glmctl/pkg/tokenizer/chat"
)

// Pure conversions between the wire types (package openai), the engine's
// request and event types, and the chat format's types. Nothing here does
// I/O or holds state beyond its arguments.

// toSamplingParams fills engine sampling parameters from a request's fields,
// taking defaults for what it leaves out.
func toSamplingParams(s openai.Sampling, d SamplingDefaults, logprobs bool, topLogprobs int) engine.SamplingParams {
	p := engine.SamplingParams{
		Temperature: float32(d.Temperature),
		TopP:        float32(d.TopP),
		TopK:        d.TopK,
		Logprobs:    logprobs,
		TopLogprobs: topLogprobs,
	}
	if s.Temperature != nil {
		p.Temperature = float32(*s.Temperature)
	}
	if s.TopP != nil {
		p.TopP = float32(*s.TopP)
	}
	if s.TopK != nil {
		p.TopK = max(*s.TopK, 0) // -1 and 0 both mean "off"
	}
	if s.MinP != nil {
		p.MinP = float32(*s.MinP)
	}
	if s.PresencePenalty != nil {
		p.PresencePenalty = float32(*s.PresencePenalty)
	}
	if s.FrequencyPenalty != nil {
		p.FrequencyPenalty = float32(*s.FrequencyPenalty)
	}
	if s.RepetitionPenalty != nil {
		p.RepetitionPenalty = float32(*s.RepetitionPenalty)
	}
	if s.Seed != nil {
		p.Seed, p.HasSeed = *s.Seed, true
	}
	return p
}

// genParams are the generation settings common to both endpoints.
type genParams struct {
	label     string
	sampling  engine.SamplingParams
	maxTokens int
	stop      []string
	ignoreEOS bool
	// speculative: the request's "speculative" (nil = the server's setting).
	speculative *bool
	grammar     *grammar.Grammar // structured outputs; nil = free text
}

// toEngineRequest builds the engine request for one prompt.
func toEngineRequest(ids []int32, g genParams) *engine.Request {
	return &engine.Request{
		Label:        g.label,
		PromptTokens: ids,
		Sampling:     g.sampling,
		MaxTokens:    g.maxTokens,
		StopStrings:  g.stop,
		IgnoreEOS:    g.ignoreEOS,
		Speculation:  toSpeculation(g.speculative),
		Constraint:   newGrammarConstraint(g.grammar),
	}
}

// toSpeculation maps the request's "speculative" to the engine's choice.
func toSpeculation(b *bool) engine.Speculation {
	switch {
	case b == nil:
		return engine.SpeculationDefault
	case *b:
		return engine.SpeculationOn
	default:
		return engine.SpeculationOff
	}
}

// toChatMessages converts request messages to the chat format's messages.
func toChatMessages(msgs []openai.Message) []chat.Message {
	out := make([]chat.Message, len(msgs))
	for i, m := range msgs {
		cm := chat.Message{
			Role:             m.Role,
			Content:          chat.Content(m.Content),
			ReasoningContent: m.ReasoningContent,
			ToolCallID:       m.ToolCallID,
			Name:             m.Name,
		}
		for _, tc := range m.ToolCalls {
			cm.ToolCalls = append(cm.ToolCalls, chat.ToolCall{
				ID:       tc.ID,
				Type:     "function",
				Function: chat.FunctionCall{Name: tc.Name, Arguments: tc.Arguments},
			})
		}
		out[i] = cm
	}
	return out
}

// toolObjects returns the raw tool objects the chat template prints, or nil
// when tool_choice is "none" (the model is then not offered the tools).
func toolObjects(tools []openai.Tool, choice openai.ToolChoice) []json.RawMessage {
	if choice == openai.ToolChoiceNone || len(tools) == 0 {
		return nil
	}
	out := make([]json.RawMessage, len(tools))
	for i, t := range tools {
		out[i] = t.Raw
	}
	return out
}

// toUsage converts engine usage. us holds one entry per choice, n choices
// per prompt (choice p*n+j is copy j of prompt p): completion tokens are
// summed over all choices, prompt tokens (and their cache hits) over the
// first copy of each prompt only, since the copies share the prompt.
func toUsage(n int, us ...engine.Usage) *openai.Usage {
	n = max(n, 1)
	var u openai.Usage
	cached := 0
	for i, e := range us {
		u.CompletionTokens += e.CompletionTokens
		if i%n == 0 {
			u.PromptTokens += e.PromptTokens
			cached += e.CachedPromptTokens
		}
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	u.PromptTokensDetails = &openai.PromptTokensDetails{CachedTokens: cached}
	return &u
}

// choiceRequests expands one engine request per prompt into n per prompt:
// choice p*n+j is copy j of prompt p. A seeded request's copy j samples with
// seed+j, so the choices differ but reproduce; unseeded copies each get a
// seed of their own from the engine.
func choiceRequests(prompts []*engine.Request, n int) []*engine.Request {
	n = max(n, 1)
	out := make([]*engine.Request, 0, len(prompts)*n)
	for _, r := range prompts {
		for j := range n {
			c := *r
			if c.Sampling.HasSeed {
				c.Sampling.Seed += int64(j)
			}
			if j > 0 {
				c.Constraint = freshConstraint(r.Constraint) // a matcher per choice
			}
			out = append(out, &c)
		}
	}
	return out
}

// toFinishReason maps the engine's reason to OpenAI's; a stop after tool
// calls is "tool_calls".
func toFinishReason(f engine.FinishReason, toolCalls bool) string {
	switch {
	case f == engine.FinishLength:
		return openai.FinishLength
	case toolCalls:
		return openai.FinishToolCalls
	default:
		return openai.FinishStop
	}
}

// logprobValue makes a logprob JSON-safe (JSON has no -Inf or NaN).
func logprobValue(v float32) float64 {
	f := float64(v)
	if math.IsNaN(f) || math.IsInf(f, 0) || f < -9999 {
		return -9999
	}
	return f
}

func tokenBytes(s string) []int {
	b := make([]int, len(s))
	for i := 0; i < len(s); i++ {
		b[i] = int(s[i])
	}
	return b
}

// hasVisibleToken reports whether ev carries a token that is part of the
// output: not the stop token that ended the request (OpenAI never shows it).
func hasVisibleToken(ev engine.Event) bool {
	return ev.HasToken && (ev.StopToken < 0 || ev.Token != ev.StopToken)
}

// toTokenLogprob converts one event's logprobs to the chat form; top is how
// many alternatives the request asked for.
func toTokenLogprob(ev engine.Event, top int, text func(int32) string) openai.TokenLogprob {
	s := text(ev.Token)
	lp := openai.TokenLogprob{Token: s, Logprob: logprobValue(ev.Logprob), Bytes: tokenBytes(s), TopLogprobs: []openai.TopLogprob{}}
	for i, alt := range ev.TopLogprobs {
		if i >= top {
			break
		}
		as := text(alt.Token)
		lp.TopLogprobs = append(lp.TopLogprobs, openai.TopLogprob{Token: as, Logprob: logprobValue(alt.Logprob), Bytes: tokenBytes(as)})
	}
	return lp
}

// chatPiece is one part of a chat delta: reasoning or content text, or a
// whole tool call.
type chatPiece struct {
	kind chat.EventKind
	text string
	call *openai.ToolCall
}

// toChatPieces converts parser events to pieces; newID names tool calls.
func toChatPieces(evs []chat.Event, newID func() string) []chatPiece {
	var out []chatPiece
	for _, ev := range evs {
		switch ev.Kind {
		case chat.EventReasoning, chat.EventContent:
			if ev.Text == "" {
				continue
			}
			if n := len(out); n > 0 && out[n-1].kind == ev.Kind {
				out[n-1].text += ev.Text
				continue
			}
			out = append(out, chatPiece{kind: ev.Kind, text: ev.Text})
		case chat.EventToolCall:
			idx := ev.ToolCall.Index
			out = append(out, chatPiece{kind: chat.EventToolCall, call: &openai.ToolCall{
				Index:    &idx,
				ID:       newID(),
				Type:     "function",
				Function: openai.FunctionCall{Name: ev.ToolCall.Name, Arguments: ev.ToolCall.Arguments},
			}})
		}
	}
	return out
}

// chatResult is a whole chat choice, gathered from pieces.
type chatResult struct {
	reasoning strings.Builder
	content   strings.Builder
	toolCalls []openai.ToolCall
	logprobs  []openai.TokenLogprob
}

func (r *chatResult) add(pieces []chatPiece) {
	for _, p := range pieces {
		switch p.kind {
		case chat.EventReasoning:
			r.reasoning.WriteString(p.text)
		case chat.EventContent:
			r.content.WriteString(p.text)
		case chat.EventToolCall:
			c := *p.call
			c.Index = nil // only deltas carry an index
			r.toolCalls = append(r.toolCalls, c)
		}
	}
}

// meta is what every response object repeats.
type meta struct {
	id      string
	model   string
	created int64
}

// toChatChoice builds choice index of the non-streamed response.
func toChatChoice(index int, r *chatResult, finish string, logprobs bool) openai.ChatChoice {
	msg := openai.ResponseMessage{Role: "assistant", ToolCalls: r.toolCalls}
	if c := r.content.String(); c != "" || len(r.toolCalls) == 0 {
		msg.Content = &c
	}
	if rs := r.reasoning.String(); rs != "" {
		msg.ReasoningContent = &rs
	}
	choice := openai.ChatChoice{Index: index, Message: msg, FinishReason: finish}
	if logprobs {
		choice.Logprobs = &openai.ChatLogprobs{Content: nonNil(r.logprobs)}
	}
	return choice
}

// toChatCompletion builds the non-streamed response.
func toChatCompletion(m meta, choices []openai.ChatChoice, usage *openai.Usage) openai.ChatCompletion {
	return openai.ChatCompletion{ID: m.id, Object: openai.ObjectChatCompletion, Created: m.created, Model: m.model,
		Choices: nonNil(choices), Usage: usage}
}

// toChatChunk builds one stream chunk carrying a delta of choice index.
func toChatChunk(m meta, index int, delta openai.Delta, lps []openai.TokenLogprob, logprobs bool, finish *string) openai.ChatCompletionChunk {
	c := openai.ChunkChoice{Index: index, Delta: delta, FinishReason: finish}
	if logprobs && (len(lps) > 0 || finish != nil) {
		c.Logprobs = &openai.ChatLogprobs{Content: nonNil(lps)}
	}
	return openai.ChatCompletionChunk{ID: m.id, Object: openai.ObjectChatCompletionChunk, Created: m.created, Model: m.model,
		Choices: []openai.ChunkChoice{c}}
}

// toDelta converts a piece to a stream delta.
func toDelta(p chatPiece) openai.Delta {
	switch p.kind {
	case chat.EventReasoning:
		t := p.text
		return openai.Delta{ReasoningContent: &t}
	case chat.EventToolCall:
		return openai.Delta{ToolCalls: []openai.ToolCall{*p.call}}
	default:
		t := p.text
		return openai.Delta{Content: &t}
	}
}

// toChatUsageChunk is the final usage-only chunk (stream_options.include_usage).
func toChatUsageChunk(m meta, usage *openai.Usage) openai.ChatCompletionChunk {
	return openai.ChatCompletionChunk{ID: m.id, Object: openai.ObjectChatCompletionChunk, Created: m.created, Model: m.model,
		Choices: []openai.ChunkChoice{}, Usage: usage}
}

// completionLogprobs accumulates the legacy logprobs object of one choice.
type completionLogprobs struct {
	lp   openai.CompletionLogprobs
	text int // bytes of text so far, for text_offset
}

func newCompletionLogprobs(offset int) *completionLogprobs {
	return &completionLogprobs{lp: openai.CompletionLogprobs{
		Tokens: []string{}, TokenLogprobs: []float64{}, TopLogprobs: []map[string]float64{}, TextOffset: []int{},
	}, text: offset}
}

// add records one event's token; the event's text advances the offset.
func (c *completionLogprobs) add(ev engine.Event, top int, text func(int32) string) {
	s := text(ev.Token)
	c.lp.Tokens = append(c.lp.Tokens, s)
	c.lp.TokenLogprobs = append(c.lp.TokenLogprobs, logprobValue(ev.Logprob))
	alts := map[string]float64{}
	for i, alt := range ev.TopLogprobs {
		if i >= top {
			break
		}
		as := text(alt.Token)
		if _, dup := alts[as]; !dup {
			alts[as] = logprobValue(alt.Logprob)
		}
	}
	c.lp.TopLogprobs = append(c.lp.TopLogprobs, alts)
	c.lp.TextOffset = append(c.lp.TextOffset, c.text)
	c.text += len(ev.Text)
}

// toCompletionChoice builds one completions choice (or chunk choice).
func toCompletionChoice(index int, text string, lp *openai.CompletionLogprobs, finish *string) openai.CompletionChoice {
	return openai.CompletionChoice{Index: index, Text: text, Logprobs: lp, FinishReason: finish}
}

// toCompletion wraps choices in a completion object (response or chunk).
func toCompletion(m meta, choices []openai.CompletionChoice, usage *openai.Usage) openai.Completion {
	return openai.Completion{ID: m.id, Object: openai.ObjectTextCompletion, Created: m.created, Model: m.model,
		Choices: nonNil(choices), Usage: usage}
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
