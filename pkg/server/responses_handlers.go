package server

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/glmctl/glmctl/pkg/engine"
	"github.com/glmctl/glmctl/pkg/server/openai"
	"github.com/glmctl/glmctl/pkg/server/responses"
	"github.com/glmctl/glmctl/pkg/tokenizer/chat"
)

// handleResponses serves OpenAI's Responses API. It is registered for
// every method, so that a method other than POST gets the 405 the other
// routes get.
func (s *Server) handleResponses(w http.ResponseWriter, r *http.Request) {
	ri := infoFrom(r.Context())
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		s.fail(w, ri, &openai.Error{Status: http.StatusMethodNotAllowed, Type: openai.TypeInvalidRequest,
			Message: fmt.Sprintf("method %s is not allowed on %s (use POST; glmctl stores no responses to get or delete)", r.Method, pathResponses)})
		return
	}
	body, oerr := s.readBody(w, r)
	if oerr != nil {
		s.fail(w, ri, oerr)
		return
	}
	req, oerr := responses.DecodeRequest(body)
	if oerr != nil {
		s.fail(w, ri, oerr)
		return
	}
	ri.stream = req.Stream
	if oerr := s.checkModel(req.Model); oerr != nil {
		s.fail(w, ri, oerr)
		return
	}
	if s.opts.Chat == nil {
		s.fail(w, ri, openai.BadRequest("input", "input: this model has no chat template: use /v1/completions"))
		return
	}
	tools := make([]openai.Tool, len(req.Tools))
	for i, t := range req.Tools {
		tools[i] = openai.Tool{Name: t.Name, Parameters: t.Parameters}
	}
	forced := req.ToolChoice == responses.ToolChoiceRequired || req.ToolChoice == responses.ToolChoiceFunction
	format, oerr := requestFormat(req.Format, forced, string(req.ToolChoice), tools, req.ToolChoiceName)
	if oerr != nil {
		s.fail(w, ri, oerr)
		return
	}
	gram, oerr := s.compileFormat(format)
	if oerr != nil {
		s.fail(w, ri, oerr)
		return
	}
	if gram != nil {
		// The grammar covers the answer: thinking off, as on chat.
		if req.Thinking != nil && *req.Thinking {
			s.fail(w, ri, openai.BadRequest(format.Param, "%s: structured outputs and forced tool calls with reasoning are not supported; set reasoning.effort to \"none\" or leave it out", format.Param))
			return
		}
		off := false
		req.Thinking = &off
	}
	cp := toResponsesPrompt(req)
	ids, _, err := EncodeChat(s.opts.Chat, s.opts.Tokenizer, ChatPrompt{Messages: cp.messages, Tools: cp.tools, EnableThinking: cp.enableThinking})
	if re := (*RenderError)(nil); errors.As(err, &re) {
		s.fail(w, ri, openai.BadRequest("input", "input: %v", re.Err))
		return
	} else if err != nil {
		s.fail(w, ri, &openai.Error{Status: http.StatusInternalServerError, Type: openai.TypeServer, Message: "tokenize prompt: " + err.Error()})
		return
	}
	if oerr := s.checkResponsesLength(len(ids), req.MaxOutputTokens); oerr != nil {
		s.fail(w, ri, oerr)
		return
	}
	g := genParams{
		label:     ri.id,
		sampling:  toSamplingParams(responsesSampling(req), s.opts.Sampling, false, 0),
		maxTokens: req.MaxOutputTokens,
		grammar:   gram,
	}
	streams, oerr := s.submitAll(r.Context(), []*engine.Request{toEngineRequest(ids, g)})
	if oerr != nil {
		s.fail(w, ri, oerr)
		return
	}
	st := streams[0]
	defer st.Close()
	ri.promptTokens = len(ids)
	gen := &responsesGen{
		s:      s,
		ri:     ri,
		req:    req,
		parser: s.opts.Chat.NewParser(chat.ParserOptions{Thinking: cp.thinking, Tools: cp.tools}),
		meta:   meta{id: "resp_" + ri.id, model: s.opts.ModelName, created: time.Now().Unix()},
		clock:  &tokenClock{m: s.metrics, ri: ri, last: make([]time.Time, 1)},
		out:    outputBuilder{newID: newItemID},
	}
	if req.Stream {
		gen.stream(w, st)
		return
	}
	gen.collect(w, st)
}

// checkResponsesLength rejects inputs that leave no room, and
// max_output_tokens beyond the context.
func (s *Server) checkResponsesLength(promptTokens, maxOutput int) *openai.Error {
	if e := s.checkLength(promptTokens, 0, "input"); e != nil {
		return e
	}
	if limit := s.lim.MaxModelLen; maxOutput > 0 && promptTokens+maxOutput > limit {
		return openai.BadRequest("max_output_tokens", "max_output_tokens: this model's maximum context length is %d tokens; you requested %d tokens (%d in the input, %d in max_output_tokens): reduce the input or max_output_tokens",
			limit, promptTokens+maxOutput, promptTokens, maxOutput)
	}
	return nil
}

// responsesGen turns one Responses request's engine events into a
// response.
type responsesGen struct {
	s      *Server
	ri     *requestInfo
	req    *responses.Request
	parser OutputParser
	meta   meta
	clock  *tokenClock
	out    outputBuilder
	seq    int // the next stream event's sequence_number
}

// add feeds ev to the parser (flushing it on a normal finish) and the
// output builder, and returns the stream events that result.
func (g *responsesGen) add(ev engine.Event) []responses.StreamEvent {
	if ev.HasToken {
		g.clock.token(0, time.Now())
		g.out.sampled()
	}
	evs := g.parser.Add(ev.Text)
	if ev.Finish == engine.FinishStop || ev.Finish == engine.FinishLength {
		evs = append(evs, g.parser.Finish()...)
	}
	return g.out.add(toChatPieces(evs, newToolCallID))
}

// end records the request's finish for the log line: the chat finish
// reason (stop, length, tool_calls), or error or cancelled.
func (g *responsesGen) end(ev engine.Event, reason string) {
	g.ri.finishReason = reason
	if ev.Finish == engine.FinishStop || ev.Finish == engine.FinishLength {
		g.clock.done(time.Now())
	}
}

// response is the response object as it stands.
func (g *responsesGen) response(status string, u *responses.Usage) responses.Response {
	var items []responses.OutputItem
	if status != responses.StatusInProgress {
		items = g.out.items
	}
	return toResponse(g.meta, g.req, g.s.opts.Sampling, status, items, u)
}

func (g *responsesGen) collect(w http.ResponseWriter, st *engine.Stream) {
	for ev := range st.Events() {
		g.add(ev)
		switch ev.Finish {
		case "":
			continue
		case engine.FinishError:
			g.end(ev, string(engine.FinishError))
			g.s.fail(w, g.ri, finishError(ev.Err))
			return
		case engine.FinishCancelled:
			g.end(ev, string(engine.FinishCancelled))
			g.ri.clientGone = true
			return
		}
		status := toResponseStatus(ev.Finish)
		g.out.closeItem(status)
		g.end(ev, toFinishReason(ev.Finish, g.out.functionCalls))
		writeJSON(w, http.StatusOK, g.response(status, toResponsesUsage(ev.Usage, g.out.reasoningTokens)))
		return
	}
	// Closed without a final event: the request's context ended (the
	// client went away) and the engine cancelled the request.
	g.ri.clientGone, g.ri.finishReason = true, string(engine.FinishCancelled)
}

// stream sends OpenAI's Responses events, each a named server-sent event
// ("event: TYPE", "data: JSON") with its sequence_number:
// response.created and response.in_progress (the response, in progress,
// no output), the output items' events (see outputBuilder), then
// response.completed or, cut by max_output_tokens, response.incomplete
// (the whole response, with usage). An error after the stream started
// closes the open item as incomplete and ends the stream with
// response.failed, whose response carries the error.
func (g *responsesGen) stream(w http.ResponseWriter, st *engine.Stream) {
	sse := startSSE(w)
	send := func(evs ...responses.StreamEvent) bool {
		for _, e := range evs {
			h := e.Header()
			h.SequenceNumber = g.seq
			g.seq++
			if err := sse.event(h.Type, e); err != nil {
				g.ri.clientGone, g.ri.finishReason = true, string(engine.FinishCancelled)
				st.Close()
				return false
			}
		}
		return true
	}
	start := g.response(responses.StatusInProgress, nil)
	if !send(responses.NewResponseEvent(responses.EventCreated, start), responses.NewResponseEvent(responses.EventInProgress, start)) {
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
			e := finishError(ev.Err)
			g.ri.errMsg = e.Message
			if !send(g.out.closeItem(responses.StatusIncomplete)...) {
				return
			}
			failed := g.response(responses.StatusFailed, nil)
			failed.Error = toResponseError(e)
			send(responses.NewResponseEvent(responses.EventFailed, failed))
			return
		case engine.FinishCancelled:
			g.end(ev, string(engine.FinishCancelled))
			g.ri.clientGone = true
			return
		}
		status := toResponseStatus(ev.Finish)
		g.end(ev, toFinishReason(ev.Finish, g.out.functionCalls))
		if !send(g.out.closeItem(status)...) {
			return
		}
		last := responses.EventCompleted
		if status == responses.StatusIncomplete {
			last = responses.EventIncomplete
		}
		send(responses.NewResponseEvent(last, g.response(status, toResponsesUsage(ev.Usage, g.out.reasoningTokens))))
		return
	}
	g.ri.clientGone, g.ri.finishReason = true, string(engine.FinishCancelled)
}
