package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/glmctl/glmctl/pkg/engine"
	"github.com/glmctl/glmctl/pkg/grammar"
	"github.com/glmctl/glmctl/pkg/server/anthropic"
	"github.com/glmctl/glmctl/pkg/server/openai"
	"github.com/glmctl/glmctl/pkg/tokenizer/chat"
)

// Anthropic Messages API routes.
const (
	pathMessages    = "/v1/messages"
	pathCountTokens = "/v1/messages/count_tokens"
)

// anthropicRoute reports whether a request path belongs to the Anthropic
// API, whose errors have Anthropic's shape.
func anthropicRoute(path string) bool {
	return path == pathMessages || strings.HasPrefix(path, pathMessages+"/")
}

// failAnthropic writes an Anthropic error and notes it for the log line.
func (s *Server) failAnthropic(w http.ResponseWriter, ri *requestInfo, e *anthropic.Error) {
	ri.errMsg = e.Message
	if e.Status == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", strconv.Itoa(max(1, int(s.opts.RetryAfter.Round(time.Second)/time.Second))))
	}
	writeJSON(w, e.Status, e.Body())
}

// renderAnthropic renders and tokenizes an Anthropic prompt.
func (s *Server) renderAnthropic(p *anthropic.Prompt) (chatPrompt, []int32, *anthropic.Error) {
	cp := toChatPrompt(p)
	if s.opts.Chat == nil {
		return cp, nil, anthropic.BadRequest("messages", "messages: this model has no chat template: use /v1/completions")
	}
	ids, _, err := EncodeChat(s.opts.Chat, s.opts.Tokenizer, ChatPrompt{
		Messages: cp.messages, Tools: cp.tools, EnableThinking: cp.enableThinking, Suffix: cp.prefill,
	})
	if re := (*RenderError)(nil); errors.As(err, &re) {
		return cp, nil, anthropic.BadRequest("messages", "messages: %v", re.Err)
	} else if err != nil {
		return cp, nil, anthropic.NewError(http.StatusInternalServerError, "", "tokenize prompt: "+err.Error())
	}
	return cp, ids, nil
}

func (s *Server) handleCountTokens(w http.ResponseWriter, r *http.Request) {
	ri := infoFrom(r.Context())
	body, oerr := s.readBody(w, r)
	if oerr != nil {
		s.failAnthropic(w, ri, toAnthropicError(oerr))
		return
	}
	req, aerr := anthropic.DecodeCountTokensRequest(body)
	if aerr != nil {
		s.failAnthropic(w, ri, aerr)
		return
	}
	if oerr := s.checkModel(req.Model); oerr != nil {
		s.failAnthropic(w, ri, toAnthropicError(oerr))
		return
	}
	_, ids, aerr := s.renderAnthropic(&req.Prompt)
	if aerr != nil {
		s.failAnthropic(w, ri, aerr)
		return
	}
	writeJSON(w, http.StatusOK, anthropic.CountTokensResponse{InputTokens: len(ids)})
}

func (s *Server) handleMessages(w http.ResponseWriter, r *http.Request) {
	ri := infoFrom(r.Context())
	body, oerr := s.readBody(w, r)
	if oerr != nil {
		s.failAnthropic(w, ri, toAnthropicError(oerr))
		return
	}
	req, aerr := anthropic.DecodeMessagesRequest(body)
	if aerr != nil {
		s.failAnthropic(w, ri, aerr)
		return
	}
	ri.stream = req.Stream
	if oerr := s.checkModel(req.Model); oerr != nil {
		s.failAnthropic(w, ri, toAnthropicError(oerr))
		return
	}
	gram, aerr := s.anthropicGrammar(req)
	if aerr != nil {
		s.failAnthropic(w, ri, aerr)
		return
	}
	cp, ids, aerr := s.renderAnthropic(&req.Prompt)
	if aerr != nil {
		s.failAnthropic(w, ri, aerr)
		return
	}
	if oerr := s.checkLength(len(ids), req.MaxTokens, "messages"); oerr != nil {
		s.failAnthropic(w, ri, toAnthropicError(oerr))
		return
	}
	g := genParams{
		label:     ri.id,
		sampling:  toSamplingParams(anthropicSampling(req), s.opts.Sampling, false, 0),
		maxTokens: req.MaxTokens,
		stop:      req.StopSequences,
		grammar:   gram,
	}
	streams, oerr := s.submitAll(r.Context(), []*engine.Request{toEngineRequest(ids, g)})
	if oerr != nil {
		s.failAnthropic(w, ri, toAnthropicError(oerr))
		return
	}
	st := streams[0]
	defer st.Close()
	ri.promptTokens = len(ids)
	gen := &messagesGen{
		s:      s,
		ri:     ri,
		parser: s.opts.Chat.NewParser(chat.ParserOptions{Thinking: cp.thinking, Tools: cp.tools}),
		meta:   meta{id: "msg_" + ri.id, model: s.opts.ModelName},
		clock:  &tokenClock{m: s.metrics, ri: ri, last: make([]time.Time, 1)},
		input:  len(ids),
	}
	if req.Stream {
		gen.stream(w, st)
		return
	}
	gen.collect(w, st)
}

// messagesGen turns one messages request's engine events into a response.
type messagesGen struct {
	s      *Server
	ri     *requestInfo
	parser OutputParser
	meta   meta
	clock  *tokenClock
	blocks blockBuilder
	input  int // prompt tokens
}

func newToolUseID() string { return "toolu_" + randomID(12) }

// add feeds ev to the parser (flushing it on a normal finish) and the
// block builder, and returns the stream events that result.
func (g *messagesGen) add(ev engine.Event) []anthropic.StreamEvent {
	if ev.HasToken {
		g.clock.token(0, time.Now())
	}
	evs := g.parser.Add(ev.Text)
	if ev.Finish == engine.FinishStop || ev.Finish == engine.FinishLength {
		evs = append(evs, g.parser.Finish()...)
	}
	return g.blocks.add(toChatPieces(evs, newToolUseID))
}

func (g *messagesGen) end(ev engine.Event, reason string) {
	g.ri.finishReason = reason
	if ev.Finish == engine.FinishStop || ev.Finish == engine.FinishLength {
		g.clock.done(time.Now())
	}
}

func (g *messagesGen) collect(w http.ResponseWriter, st *engine.Stream) {
	for ev := range st.Events() {
		g.add(ev)
		switch ev.Finish {
		case "":
			continue
		case engine.FinishError:
			g.end(ev, string(engine.FinishError))
			g.s.failAnthropic(w, g.ri, toAnthropicError(finishError(ev.Err)))
			return
		case engine.FinishCancelled:
			g.end(ev, string(engine.FinishCancelled))
			g.ri.clientGone = true
			return
		}
		reason, seq := toStopReason(ev.Finish, ev.StopString, g.blocks.toolUse)
		g.end(ev, reason)
		writeJSON(w, http.StatusOK, toAnthropicMessage(g.meta, g.blocks.blocks, &reason, seq, toAnthropicUsage(ev.Usage)))
		return
	}
	// Closed without a final event: the request's context ended (the
	// client went away) and the engine cancelled the request.
	g.ri.clientGone, g.ri.finishReason = true, string(engine.FinishCancelled)
}

// stream sends Anthropic's events: message_start, ping, then per content
// block content_block_start, content_block_delta..., content_block_stop,
// then message_delta (stop reason, usage) and message_stop. An error after
// the stream started is an error event, and the stream ends there.
func (g *messagesGen) stream(w http.ResponseWriter, st *engine.Stream) {
	sse := startSSE(w)
	send := func(evs ...anthropic.StreamEvent) bool {
		for _, e := range evs {
			if err := sse.event(e.EventName(), e); err != nil {
				g.ri.clientGone, g.ri.finishReason = true, string(engine.FinishCancelled)
				st.Close()
				return false
			}
		}
		return true
	}
	start := toAnthropicMessage(g.meta, nil, nil, nil, anthropic.Usage{InputTokens: g.input})
	if !send(anthropic.NewMessageStart(start), anthropic.NewPing()) {
		return
	}
	for ev := range st.Events() {
		if !send(g.add(ev)...) {
			return
		}
		switch ev.Finish {
		case "":
			continue
		case engine.FinishError:
			g.end(ev, string(engine.FinishError))
			e := toAnthropicError(finishError(ev.Err))
			g.ri.errMsg = e.Message
			send(e.Body())
			return
		case engine.FinishCancelled:
			g.end(ev, string(engine.FinishCancelled))
			g.ri.clientGone = true
			return
		}
		reason, seq := toStopReason(ev.Finish, ev.StopString, g.blocks.toolUse)
		g.end(ev, reason)
		if !send(g.blocks.closeBlock()...) {
			return
		}
		send(anthropic.NewMessageDelta(reason, seq, toAnthropicUsage(ev.Usage)), anthropic.NewMessageStop())
		return
	}
	g.ri.clientGone, g.ri.finishReason = true, string(engine.FinishCancelled)
}

// event writes one named server-sent event: "event: NAME", "data: JSON"
// and a blank line, as Anthropic sends them.
func (s *sseWriter) event(name string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode event: %w", err)
	}
	out := make([]byte, 0, len(name)+len(b)+16)
	out = append(out, "event: "...)
	out = append(out, name...)
	out = append(out, "\ndata: "...)
	out = append(out, b...)
	return s.write(append(out, '\n', '\n'))
}

// anthropicGrammar compiles a Messages request's structured output
// (output_config.format) or forced tool call (tool_choice any / tool), if
// any, and turns thinking off for it (the grammar covers the answer).
func (s *Server) anthropicGrammar(req *anthropic.MessagesRequest) (*grammar.Grammar, *anthropic.Error) {
	var schema *openai.Format
	if req.OutputSchema != nil {
		schema = &openai.Format{Kind: openai.FormatJSONSchema, Schema: req.OutputSchema, Param: "output_config.format.schema"}
	}
	tools := make([]openai.Tool, len(req.Tools))
	for i, t := range req.Tools {
		tools[i] = openai.Tool{Name: t.Name, Parameters: t.InputSchema}
	}
	forced := req.ToolChoice == anthropic.ToolChoiceAny || req.ToolChoice == anthropic.ToolChoiceTool
	f, oerr := requestFormat(schema, forced, string(req.ToolChoice), tools, req.ToolChoiceName)
	if oerr != nil {
		return nil, toAnthropicError(oerr)
	}
	if f == nil {
		return nil, nil
	}
	if req.Thinking != nil && *req.Thinking {
		return nil, anthropic.BadRequest(f.Param, "%s: structured outputs and forced tool calls with thinking enabled are not supported; leave thinking off", f.Param)
	}
	off := false
	req.Thinking = &off
	g, oerr := s.compileFormat(f)
	if oerr != nil {
		return nil, toAnthropicError(oerr)
	}
	return g, nil
}
