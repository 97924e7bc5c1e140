package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/glmctl/glmctl/pkg/engine"
	"github.com/glmctl/glmctl/pkg/server/openai"
	"github.com/glmctl/glmctl/pkg/tokenizer/chat"
)

// Routes, as registered.
const (
	pathChat        = "/v1/chat/completions"
	pathCompletions = "/v1/completions"
	pathModels      = "/v1/models"
	pathResponses   = "/v1/responses"
)

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST "+pathChat, s.instrument(pathChat, true, s.handleChat))
	mux.Handle("POST "+pathCompletions, s.instrument(pathCompletions, true, s.handleCompletions))
	mux.Handle("POST "+pathMessages, s.instrument(pathMessages, true, s.handleMessages))
	mux.Handle("POST "+pathCountTokens, s.instrument(pathCountTokens, true, s.handleCountTokens))
	mux.Handle(pathResponses, s.instrument(pathResponses, true, s.handleResponses)) // every method: handleResponses answers 405 to all but POST
	mux.Handle("GET "+pathModels, s.instrument(pathModels, true, s.handleModels))
	mux.Handle("GET "+pathModels+"/{model...}", s.instrument(pathModels+"/{model}", true, s.handleModel))
	mux.Handle("GET /healthz", s.instrument("/healthz", false, s.handleHealth))
	mux.Handle("GET /readyz", s.instrument("/readyz", false, s.handleReady))
	mux.Handle("GET /metrics", s.instrument("/metrics", false, s.metrics.handler().ServeHTTP))
	mux.Handle("GET "+pathHealth, s.instrument(pathHealth, false, s.handleVLLMHealth))
	mux.Handle("GET "+pathVersion, s.instrument(pathVersion, false, s.handleVersion))
	mux.Handle("POST "+pathTokenize, s.instrument(pathTokenize, true, s.handleTokenize))
	mux.Handle("POST "+pathDetokenize, s.instrument(pathDetokenize, true, s.handleDetokenize))
	mux.Handle("/", s.instrument("other", true, s.handleUnknown))
	return mux
}

func (s *Server) handleHealth(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte("ok\n"))
}

// handleReady answers 200 while the engine's step loop runs and makes
// progress, and the server is not shutting down.
func (s *Server) handleReady(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if reason := s.notReady(); reason != "" {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = fmt.Fprintf(w, "not ready: %s\n", reason)
		return
	}
	_, _ = w.Write([]byte("ready\n"))
}

func (s *Server) handleUnknown(w http.ResponseWriter, r *http.Request) {
	for _, p := range []struct{ path, allow string }{
		{pathChat, "POST"}, {pathCompletions, "POST"}, {pathMessages, "POST"}, {pathCountTokens, "POST"}, {pathModels, "GET"},
		{"/healthz", "GET"}, {"/readyz", "GET"}, {"/metrics", "GET"},
		{pathHealth, "GET"}, {pathVersion, "GET"}, {pathTokenize, "POST"}, {pathDetokenize, "POST"},
	} {
		if r.URL.Path == p.path {
			w.Header().Set("Allow", p.allow)
			writeErrorFor(w, r.URL.Path, &openai.Error{Status: http.StatusMethodNotAllowed, Type: openai.TypeInvalidRequest,
				Message: fmt.Sprintf("method %s is not allowed on %s (use %s)", r.Method, p.path, p.allow)})
			return
		}
	}
	writeErrorFor(w, r.URL.Path, &openai.Error{Status: http.StatusNotFound, Type: openai.TypeNotFound,
		Message: fmt.Sprintf("no route %s %s", r.Method, r.URL.Path)})
}

func (s *Server) modelObject() openai.Model {
	return openai.Model{ID: s.opts.ModelName, Object: openai.ObjectModel, Created: s.created, OwnedBy: "glmctl", MaxModelLen: s.lim.MaxModelLen}
}

func (s *Server) handleModels(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, openai.ModelList{Object: openai.ObjectList, Data: []openai.Model{s.modelObject()}})
}

func (s *Server) handleModel(w http.ResponseWriter, r *http.Request) {
	if err := s.checkModel(r.PathValue("model")); err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, s.modelObject())
}

func (s *Server) checkModel(name string) *openai.Error {
	if name == "" || name == s.opts.ModelName {
		return nil
	}
	return &openai.Error{Status: http.StatusNotFound, Type: openai.TypeInvalidRequest, Param: "model", Code: "model_not_found",
		Message: fmt.Sprintf("the model %q does not exist; this server serves %q", name, s.opts.ModelName)}
}

// fail writes an API error and notes it for the log line.
func (s *Server) fail(w http.ResponseWriter, ri *requestInfo, e *openai.Error) {
	ri.errMsg = e.Message
	if e.Status == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", strconv.Itoa(max(1, int(s.opts.RetryAfter.Round(time.Second)/time.Second))))
	}
	writeError(w, e)
}

// checkLength rejects prompts that leave no room, and max_tokens beyond the
// context.
func (s *Server) checkLength(promptTokens, maxTokens int, param string) *openai.Error {
	limit := s.lim.MaxModelLen
	switch {
	case promptTokens == 0:
		return openai.BadRequest(param, "%s: the prompt is empty (0 tokens)", param)
	case promptTokens >= limit:
		return openai.BadRequest(param, "%s: the prompt has %d tokens; this model's maximum context length is %d tokens, and at least one must be left for the completion",
			param, promptTokens, limit)
	case maxTokens > 0 && promptTokens+maxTokens > limit:
		return openai.BadRequest("max_tokens", "this model's maximum context length is %d tokens; you requested %d tokens (%d in the prompt, %d in the completion): reduce the prompt or max_tokens",
			limit, promptTokens+maxTokens, promptTokens, maxTokens)
	}
	return nil
}

// checkSpeculative refuses "speculative": true where the request cannot
// draft: a server without a draft model, or a constrained request (the
// engine never drafts under a token constraint). The engine refuses the same
// (engine.SpeculationOn); here the error names the field.
func (s *Server) checkSpeculative(spec *bool, constrained bool) *openai.Error {
	if spec == nil || !*spec {
		return nil
	}
	if s.eng.Limits().DraftTokens == 0 {
		return openai.BadRequest("speculative", "speculative decoding is not enabled on this server (start it with --speculative mtp)")
	}
	if constrained {
		return openai.BadRequest("speculative", "speculative decoding cannot go with structured outputs or a forced tool call")
	}
	return nil
}

// submitAll submits one engine request per prompt; if one fails, the ones
// already submitted are cancelled.
func (s *Server) submitAll(ctx context.Context, reqs []*engine.Request) ([]*engine.Stream, *openai.Error) {
	if s.draining.Load() {
		return nil, &openai.Error{Status: http.StatusServiceUnavailable, Type: openai.TypeUnavailable, Message: "the server is shutting down"}
	}
	streams := make([]*engine.Stream, 0, len(reqs))
	for _, r := range reqs {
		st, err := s.eng.Submit(ctx, r)
		if err != nil {
			for _, prev := range streams {
				prev.Close()
			}
			return nil, submitError(err)
		}
		streams = append(streams, st)
	}
	return streams, nil
}

// submitError maps Submit's errors to API errors.
func submitError(err error) *openai.Error {
	switch {
	case errors.Is(err, engine.ErrQueueFull):
		return &openai.Error{Status: http.StatusTooManyRequests, Type: openai.TypeRateLimit, Code: "rate_limit_exceeded",
			Message: "the server is busy: " + err.Error() + "; retry later"}
	case errors.Is(err, engine.ErrInvalidRequest):
		return openai.BadRequest("", "%s", err.Error())
	case errors.Is(err, engine.ErrEngineStopped):
		return &openai.Error{Status: http.StatusServiceUnavailable, Type: openai.TypeUnavailable, Message: "the engine has stopped (shutting down)"}
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return &openai.Error{Status: statusClientClosedRequest, Type: openai.TypeInvalidRequest, Message: "the client went away"}
	}
	return &openai.Error{Status: http.StatusInternalServerError, Type: openai.TypeServer, Message: err.Error()}
}

// finishError maps a request that ended with Finish "error" to an API error.
// A choice of n that could not be submitted carries Submit's error.
func finishError(err error) *openai.Error {
	if errors.Is(err, engine.ErrQueueFull) || errors.Is(err, engine.ErrInvalidRequest) {
		return submitError(err)
	}
	if errors.Is(err, engine.ErrEngineStopped) {
		msg := "the request was cancelled: the server is shutting down"
		if errors.Is(err, engine.ErrBackendFatal) {
			msg = "the request was cancelled: the server is stopping after a fatal backend error (retry once it is ready again)"
		}
		return &openai.Error{Status: http.StatusServiceUnavailable, Type: openai.TypeUnavailable, Message: msg}
	}
	msg := "generation failed"
	if err != nil {
		msg += ": " + err.Error()
	}
	return &openai.Error{Status: http.StatusInternalServerError, Type: openai.TypeServer, Message: msg}
}

// tokenClock records token timings of one request into the metrics and the
// log line; choices are timed apart for the inter-token latency.
type tokenClock struct {
	m    *metrics
	ri   *requestInfo
	last []time.Time
}

func (c *tokenClock) token(choice int, now time.Time) {
	if c.ri.firstToken.IsZero() {
		c.ri.firstToken = now
		c.m.ttft.Observe(now.Sub(c.ri.start).Seconds())
	}
	if prev := c.last[choice]; !prev.IsZero() {
		c.m.itl.Observe(now.Sub(prev).Seconds())
	}
	c.last[choice] = now
	c.ri.lastToken = now
	c.ri.completionTokens++ // every sampled token has its event, so this equals usage even when the client left early
}

func (c *tokenClock) done(now time.Time) {
	c.m.e2e.Observe(now.Sub(c.ri.start).Seconds())
}

func (s *Server) handleChat(w http.ResponseWriter, r *http.Request) {
	ri := infoFrom(r.Context())
	body, aerr := s.readBody(w, r)
	if aerr != nil {
		s.fail(w, ri, aerr)
		return
	}
	req, aerr := openai.DecodeChatRequest(body)
	if aerr != nil {
		s.fail(w, ri, aerr)
		return
	}
	ri.stream = req.Stream
	if aerr := s.checkModel(req.Model); aerr != nil {
		s.fail(w, ri, aerr)
		return
	}
	if s.opts.Chat == nil {
		s.fail(w, ri, openai.BadRequest("messages", "this model has no chat template: use /v1/completions"))
		return
	}
	// A forced call: GLM-4.7's tool-call format over the tools' schemas.
	forced := req.ToolChoice == openai.ToolChoiceRequired || req.ToolChoice == openai.ToolChoiceFunction
	format, aerr := requestFormat(req.Format, forced, string(req.ToolChoice), req.Tools, req.ToolChoiceName)
	if aerr != nil {
		s.fail(w, ri, aerr)
		return
	}
	gram, aerr := s.compileFormat(format)
	if aerr != nil {
		s.fail(w, ri, aerr)
		return
	}
	if aerr := s.checkSpeculative(req.Speculative, gram != nil); aerr != nil {
		s.fail(w, ri, aerr)
		return
	}
	cp := ChatPrompt{
		Messages: toChatMessages(req.Messages), Tools: toolObjects(req.Tools, req.ToolChoice),
		EnableThinking: req.EnableThinking, ClearThinking: req.ClearThinking,
	}
	if gram != nil {
		// The grammar covers the answer, not a reasoning section: GLM's
		// <think> tag is outside every JSON, regex or grammar output.
		if req.EnableThinking != nil && *req.EnableThinking {
			s.fail(w, ri, openai.BadRequest(format.Param, "%s: structured outputs and forced tool calls with thinking enabled are not supported; leave thinking off (the default with a format)", format.Param))
			return
		}
		off := false
		cp.EnableThinking = &off
	}
	ids, _, err := EncodeChat(s.opts.Chat, s.opts.Tokenizer, cp)
	if re := (*RenderError)(nil); errors.As(err, &re) {
		s.fail(w, ri, openai.BadRequest("messages", "%v", re.Err))
		return
	} else if err != nil {
		s.fail(w, ri, &openai.Error{Status: http.StatusInternalServerError, Type: openai.TypeServer, Message: "tokenize prompt: " + err.Error()})
		return
	}
	if aerr := s.checkLength(len(ids), req.MaxTokens, "messages"); aerr != nil {
		s.fail(w, ri, aerr)
		return
	}
	g := genParams{
		label:       ri.id,
		sampling:    toSamplingParams(req.Sampling, s.opts.Sampling, req.Logprobs, req.TopLogprobs),
		maxTokens:   req.MaxTokens,
		stop:        req.Stop,
		ignoreEOS:   req.IgnoreEOS,
		speculative: req.Speculative,
		grammar:     gram,
	}
	cs, aerr := s.startChoices(r.Context(), []*engine.Request{toEngineRequest(ids, g)}, req.N)
	if aerr != nil {
		s.fail(w, ri, aerr)
		return
	}
	defer cs.close()
	ri.promptTokens = len(ids)
	gen := &chatGen{
		s:     s,
		ri:    ri,
		req:   req,
		cs:    cs,
		meta:  meta{id: "chatcmpl-" + ri.id, model: s.opts.ModelName, created: time.Now().Unix()},
		clock: &tokenClock{m: s.metrics, ri: ri, last: make([]time.Time, cs.choices())},
	}
	gen.choices = make([]chatChoiceState, cs.choices())
	for i := range gen.choices {
		gen.choices[i].parser = s.opts.Chat.NewParser(cp.ParserOptions())
	}
	if req.Stream {
		gen.stream(w)
		return
	}
	gen.collect(w)
}

// chatGen turns one chat request's engine events into a response.
type chatGen struct {
	s       *Server
	ri      *requestInfo
	req     *openai.ChatRequest
	cs      *choiceSet
	choices []chatChoiceState
	meta    meta
	clock   *tokenClock
}

// chatChoiceState is what one choice has produced so far.
type chatChoiceState struct {
	parser    OutputParser
	res       chatResult
	pending   []openai.TokenLogprob // logprobs not yet sent (streaming)
	toolCalls bool                  // a tool call was sent (streaming)
	finish    string
	usage     engine.Usage
}

func newToolCallID() string { return "call_" + randomID(12) }

// next waits for the next event; ok is false when a stream closed without a
// final event (the client went away).
func (g *chatGen) next() (indexedEvent, bool) {
	ie := g.cs.next()
	if ie.closed {
		g.ri.clientGone, g.ri.finishReason = true, string(engine.FinishCancelled)
		return ie, false
	}
	return ie, true
}

// pieces feeds ev to choice i's parser (flushing it on a normal finish) and
// returns the delta pieces and the event's logprob entry, if any.
func (g *chatGen) pieces(i int, ev engine.Event) ([]chatPiece, *openai.TokenLogprob) {
	if ev.HasToken {
		g.clock.token(i, time.Now())
	}
	c := &g.choices[i]
	var lp *openai.TokenLogprob
	if g.req.Logprobs && hasVisibleToken(ev) {
		t := toTokenLogprob(ev, g.req.TopLogprobs, g.s.opts.Tokenizer.TokenText)
		lp = &t
	}
	evs := c.parser.Add(ev.Text)
	if ev.Finish == engine.FinishStop || ev.Finish == engine.FinishLength {
		evs = append(evs, c.parser.Finish()...)
	}
	return toChatPieces(evs, newToolCallID), lp
}

// end records the final event of choice i with its finish reason; the
// request log keeps the first reason that is not stop.
func (g *chatGen) end(i int, ev engine.Event, finish string) {
	c := &g.choices[i]
	c.finish, c.usage = finish, ev.Usage
	if g.ri.finishReason == "" || g.ri.finishReason == openai.FinishStop {
		g.ri.finishReason = finish
	}
}

func (g *chatGen) usage() *openai.Usage {
	us := make([]engine.Usage, len(g.choices))
	for i := range g.choices {
		us[i] = g.choices[i].usage
	}
	return toUsage(g.req.N, us...)
}

func (g *chatGen) collect(w http.ResponseWriter) {
	for ended := 0; ended < len(g.choices); {
		ie, ok := g.next()
		if !ok {
			return
		}
		i, ev := ie.index, ie.ev
		c := &g.choices[i]
		pieces, lp := g.pieces(i, ev)
		c.res.add(pieces)
		if lp != nil {
			c.res.logprobs = append(c.res.logprobs, *lp)
		}
		if ev.Finish == "" {
			continue
		}
		ended++
		switch ev.Finish {
		case engine.FinishError:
			g.end(i, ev, string(engine.FinishError))
			g.s.fail(w, g.ri, finishError(ev.Err))
			return
		case engine.FinishCancelled:
			g.end(i, ev, string(engine.FinishCancelled))
			g.ri.clientGone = true
			return
		}
		g.end(i, ev, toFinishReason(ev.Finish, len(c.res.toolCalls) > 0))
	}
	g.clock.done(time.Now())
	out := make([]openai.ChatChoice, len(g.choices))
	for i := range g.choices {
		out[i] = toChatChoice(i, &g.choices[i].res, g.choices[i].finish, g.req.Logprobs)
	}
	writeJSON(w, http.StatusOK, toChatCompletion(g.meta, out, g.usage()))
}

func (g *chatGen) stream(w http.ResponseWriter) {
	sse := startSSE(w)
	send := func(v any) bool {
		if err := sse.send(v); err != nil {
			g.ri.clientGone, g.ri.finishReason = true, string(engine.FinishCancelled)
			g.cs.close()
			return false
		}
		return true
	}
	role := ""
	for i := range g.choices {
		if !send(toChatChunk(g.meta, i, openai.Delta{Role: "assistant", Content: &role}, nil, false, nil)) {
			return
		}
	}
	for ended := 0; ended < len(g.choices); {
		ie, ok := g.next()
		if !ok {
			return
		}
		i, ev := ie.index, ie.ev
		c := &g.choices[i]
		pieces, lp := g.pieces(i, ev)
		if lp != nil {
			c.pending = append(c.pending, *lp)
		}
		for _, p := range pieces {
			c.toolCalls = c.toolCalls || p.kind == chat.EventToolCall
			if !send(toChatChunk(g.meta, i, toDelta(p), c.pending, g.req.Logprobs, nil)) {
				return
			}
			c.pending = nil
		}
		if ev.Finish == "" {
			continue
		}
		ended++
		switch ev.Finish {
		case engine.FinishError:
			g.end(i, ev, string(engine.FinishError))
			e := finishError(ev.Err)
			g.ri.errMsg = e.Message
			if send(e.Body()) {
				_ = sse.done()
			}
			return
		case engine.FinishCancelled:
			g.end(i, ev, string(engine.FinishCancelled))
			g.ri.clientGone = true
			return
		}
		finish := toFinishReason(ev.Finish, c.toolCalls)
		g.end(i, ev, finish)
		if !send(toChatChunk(g.meta, i, openai.Delta{}, c.pending, g.req.Logprobs, &finish)) {
			return
		}
		c.pending = nil
	}
	g.clock.done(time.Now())
	if g.req.IncludeUsage && !send(toChatUsageChunk(g.meta, g.usage())) {
		return
	}
	if err := sse.done(); err != nil {
		g.ri.clientGone = true
	}
}

func (s *Server) handleCompletions(w http.ResponseWriter, r *http.Request) {
	ri := infoFrom(r.Context())
	body, aerr := s.readBody(w, r)
	if aerr != nil {
		s.fail(w, ri, aerr)
		return
	}
	req, aerr := openai.DecodeCompletionRequest(body)
	if aerr != nil {
		s.fail(w, ri, aerr)
		return
	}
	ri.stream = req.Stream
	if aerr := s.checkModel(req.Model); aerr != nil {
		s.fail(w, ri, aerr)
		return
	}
	maxTokens := req.MaxTokens
	if maxTokens == 0 {
		maxTokens = s.opts.CompletionMaxTokens
	}
	top, logprobs := 0, req.Logprobs != nil
	if logprobs {
		top = *req.Logprobs
	}
	gram, aerr := s.compileFormat(req.Format)
	if aerr != nil {
		s.fail(w, ri, aerr)
		return
	}
	if aerr := s.checkSpeculative(req.Speculative, gram != nil); aerr != nil {
		s.fail(w, ri, aerr)
		return
	}
	g := genParams{
		label:       ri.id,
		sampling:    toSamplingParams(req.Sampling, s.opts.Sampling, logprobs, top),
		maxTokens:   maxTokens,
		stop:        req.Stop,
		ignoreEOS:   req.IgnoreEOS,
		speculative: req.Speculative,
		grammar:     gram,
	}
	ereqs := make([]*engine.Request, len(req.Prompts))
	echo := make([]string, len(req.Prompts))
	for i, p := range req.Prompts {
		param := "prompt"
		if len(req.Prompts) > 1 {
			param = fmt.Sprintf("prompt[%d]", i)
		}
		ids := p.TokenIDs
		if !p.IsTokens {
			var err error
			if ids, err = s.opts.Tokenizer.Encode(p.Text); err != nil {
				s.fail(w, ri, &openai.Error{Status: http.StatusInternalServerError, Type: openai.TypeServer, Message: "tokenize prompt: " + err.Error()})
				return
			}
		} else {
			for j, id := range ids {
				if int(id) >= s.lim.VocabSize {
					s.fail(w, ri, openai.BadRequest(param, "%s[%d]: token id %d is outside the vocabulary (size %d)", param, j, id, s.lim.VocabSize))
					return
				}
			}
		}
		if aerr := s.checkLength(len(ids), maxTokens, param); aerr != nil {
			s.fail(w, ri, aerr)
			return
		}
		if req.Echo {
			if p.IsTokens {
				text, err := s.opts.Tokenizer.Decode(ids)
				if err != nil {
					s.fail(w, ri, &openai.Error{Status: http.StatusInternalServerError, Type: openai.TypeServer, Message: "decode prompt: " + err.Error()})
					return
				}
				echo[i] = text
			} else {
				echo[i] = p.Text
			}
		}
		ri.promptTokens += len(ids)
		ereqs[i] = toEngineRequest(ids, g)
	}
	cs, aerr := s.startChoices(r.Context(), ereqs, req.N)
	if aerr != nil {
		ri.promptTokens = 0
		s.fail(w, ri, aerr)
		return
	}
	defer cs.close()
	choiceEcho := make([]string, cs.choices())
	for i := range choiceEcho {
		choiceEcho[i] = echo[i/req.N]
	}
	gen := &completionGen{
		s:     s,
		ri:    ri,
		req:   req,
		top:   top,
		echo:  choiceEcho,
		meta:  meta{id: "cmpl-" + ri.id, model: s.opts.ModelName, created: time.Now().Unix()},
		clock: &tokenClock{m: s.metrics, ri: ri, last: make([]time.Time, cs.choices())},
		cs:    cs,
		n:     cs.choices(),
	}
	if req.Stream {
		gen.stream(w)
		return
	}
	gen.collect(w)
}

// completionGen turns a completions request's events into a response.
type completionGen struct {
	s     *Server
	ri    *requestInfo
	req   *openai.CompletionRequest
	top   int
	echo  []string
	meta  meta
	clock *tokenClock
	cs    *choiceSet
	n     int // choices in all
}

// choiceState is what one prompt's choice has produced so far.
type choiceState struct {
	text     strings.Builder
	logprobs *completionLogprobs
	finish   string
	usage    engine.Usage
	ended    bool
}

// next waits for the next event; ok is false when a stream closed without a
// final event (the client went away).
func (g *completionGen) next() (indexedEvent, bool) {
	ie := g.cs.next()
	if ie.closed {
		g.ri.clientGone, g.ri.finishReason = true, string(engine.FinishCancelled)
		return ie, false
	}
	if ie.ev.HasToken {
		g.clock.token(ie.index, time.Now())
	}
	return ie, true
}

// end records a choice's final event and reports whether it failed; the
// request log keeps the first reason that is not stop.
func (g *completionGen) end(c *choiceState, ev engine.Event) {
	c.ended, c.usage = true, ev.Usage
	c.finish = string(ev.Finish)
	if ev.Finish == engine.FinishStop || ev.Finish == engine.FinishLength {
		c.finish = toFinishReason(ev.Finish, false)
	}
	if g.ri.finishReason == "" || g.ri.finishReason == openai.FinishStop {
		g.ri.finishReason = c.finish
	}
}

func (g *completionGen) usages(choices []choiceState) []engine.Usage {
	us := make([]engine.Usage, len(choices))
	for i := range choices {
		us[i] = choices[i].usage
	}
	return us
}

func (g *completionGen) collect(w http.ResponseWriter) {
	choices := make([]choiceState, g.n)
	for i := range choices {
		choices[i].text.WriteString(g.echo[i])
		if g.req.Logprobs != nil {
			choices[i].logprobs = newCompletionLogprobs(len(g.echo[i]))
		}
	}
	for ended := 0; ended < g.n; {
		ie, ok := g.next()
		if !ok {
			return
		}
		c, ev := &choices[ie.index], ie.ev
		if c.logprobs != nil && hasVisibleToken(ev) {
			c.logprobs.add(ev, g.top, g.s.opts.Tokenizer.TokenText)
		}
		c.text.WriteString(ev.Text)
		if ev.Finish == "" {
			continue
		}
		ended++
		g.end(c, ev)
		switch ev.Finish {
		case engine.FinishError:
			g.s.fail(w, g.ri, finishError(ev.Err))
			return
		case engine.FinishCancelled:
			g.ri.clientGone = true
			return
		}
	}
	g.clock.done(time.Now())
	out := make([]openai.CompletionChoice, g.n)
	for i := range choices {
		var lp *openai.CompletionLogprobs
		if choices[i].logprobs != nil {
			lp = &choices[i].logprobs.lp
		}
		finish := choices[i].finish
		out[i] = toCompletionChoice(i, choices[i].text.String(), lp, &finish)
	}
	writeJSON(w, http.StatusOK, toCompletion(g.meta, out, toUsage(g.req.N, g.usages(choices)...)))
}

func (g *completionGen) stream(w http.ResponseWriter) {
	sse := startSSE(w)
	send := func(v any) bool {
		if err := sse.send(v); err != nil {
			g.ri.clientGone, g.ri.finishReason = true, string(engine.FinishCancelled)
			return false
		}
		return true
	}
	choices := make([]choiceState, g.n)
	offsets := make([]int, g.n)
	for i, e := range g.echo {
		offsets[i] = len(e)
		if e != "" && !send(toCompletion(g.meta, []openai.CompletionChoice{toCompletionChoice(i, e, nil, nil)}, nil)) {
			return
		}
	}
	for ended := 0; ended < g.n; {
		ie, ok := g.next()
		if !ok {
			return
		}
		c, ev := &choices[ie.index], ie.ev
		var lp *openai.CompletionLogprobs
		if g.req.Logprobs != nil && hasVisibleToken(ev) {
			cl := newCompletionLogprobs(offsets[ie.index])
			cl.add(ev, g.top, g.s.opts.Tokenizer.TokenText)
			lp = &cl.lp
		}
		offsets[ie.index] += len(ev.Text)
		var finish *string
		if ev.Finish != "" {
			ended++
			g.end(c, ev)
			switch ev.Finish {
			case engine.FinishError:
				e := finishError(ev.Err)
				g.ri.errMsg = e.Message
				if send(e.Body()) {
					_ = sse.done()
				}
				return
			case engine.FinishCancelled:
				g.ri.clientGone = true
				return
			}
			finish = &c.finish
		}
		if ev.Text == "" && lp == nil && finish == nil {
			continue // a token whose text is held back (partial character, possible stop string)
		}
		if !send(toCompletion(g.meta, []openai.CompletionChoice{toCompletionChoice(ie.index, ev.Text, lp, finish)}, nil)) {
			return
		}
	}
	g.clock.done(time.Now())
	if g.req.IncludeUsage && !send(toCompletion(g.meta, nil, toUsage(g.req.N, g.usages(choices)...))) {
		return
	}
	if err := sse.done(); err != nil {
		g.ri.clientGone = true
	}
}

// sseWriter writes server-sent events exactly as OpenAI does: "data: JSON"
// and a blank line per event, flushed at once, and "data: [DONE]" last.
type sseWriter struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

// sseWriteTimeout bounds one event write: a client that stops reading for
// this long is treated as gone, so its request is cancelled rather than its
// events piling up.
const sseWriteTimeout = 30 * time.Second

func startSSE(w http.ResponseWriter) *sseWriter {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	s := &sseWriter{w: w, rc: http.NewResponseController(w)}
	_ = s.rc.Flush()
	return s
}

func (s *sseWriter) send(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode event: %w", err)
	}
	return s.write(append(append([]byte("data: "), b...), '\n', '\n'))
}

func (s *sseWriter) done() error { return s.write([]byte("data: [DONE]\n\n")) }

func (s *sseWriter) write(b []byte) error {
	_ = s.rc.SetWriteDeadline(time.Now().Add(sseWriteTimeout)) // unsupported writers just don't time out
	if _, err := s.w.Write(b); err != nil {
		return err
	}
	return s.rc.Flush()
}
