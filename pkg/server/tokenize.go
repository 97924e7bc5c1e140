package server

import (
	"fmt"
	"net/http"
	"time"

	"github.com/glmctl/glmctl/pkg/server/openai"
	"github.com/glmctl/glmctl/pkg/tokenizer/chat"
)

// vLLM-compatible utility routes: /health, /version, /tokenize, /detokenize.
const (
	pathHealth     = "/health"
	pathVersion    = "/version"
	pathTokenize   = "/tokenize"
	pathDetokenize = "/detokenize"
)

// SpecialDecoder is implemented by tokenizers that can decode ids with
// special tokens kept (as vLLM's /detokenize does). Without it, /detokenize
// uses Tokenizer.Decode, which drops them.
type SpecialDecoder interface {
	DecodeWithSpecial(ids []int32) (string, error)
}

// notReady says why the server is not ready, or "" when it is.
func (s *Server) notReady() string {
	switch {
	case s.draining.Load():
		return "shutting down"
	case !s.engineUp.Load():
		return "engine not running"
	case s.progressStalled(time.Now()):
		return fmt.Sprintf("engine has made no progress for over %s", s.opts.StallTimeout)
	}
	return s.failingSteps(time.Now())
}

// failingSteps is the reason for not being ready when the engine's last
// MaxFailedSteps steps failed and the latest failure is within the cooldown
// ("" otherwise).
func (s *Server) failingSteps(now time.Time) string {
	if s.opts.MaxFailedSteps < 0 {
		return ""
	}
	st := s.eng.Stats()
	if st.FailedStepsInARow < s.opts.MaxFailedSteps || now.Sub(st.LastStepErrorAt) >= s.opts.FailedStepsCooldown {
		return ""
	}
	return fmt.Sprintf("the last %d engine steps failed (latest %s ago: %s)", st.FailedStepsInARow,
		now.Sub(st.LastStepErrorAt).Round(time.Millisecond), st.LastStepError)
}

// handleVLLMHealth is vLLM's /health: 200 with an empty body when ready,
// 503 otherwise (with the reason as text).
func (s *Server) handleVLLMHealth(w http.ResponseWriter, _ *http.Request) {
	if reason := s.notReady(); reason != "" {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = fmt.Fprintf(w, "not ready: %s\n", reason)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (s *Server) handleVersion(w http.ResponseWriter, _ *http.Request) {
	v := s.opts.Version
	if v == "" {
		v = "dev"
	}
	writeJSON(w, http.StatusOK, openai.VersionResponse{Version: v, Commit: s.opts.Commit})
}

func (s *Server) handleTokenize(w http.ResponseWriter, r *http.Request) {
	ri := infoFrom(r.Context())
	body, aerr := s.readBody(w, r)
	if aerr != nil {
		s.fail(w, ri, aerr)
		return
	}
	req, aerr := openai.DecodeTokenizeRequest(body)
	if aerr != nil {
		s.fail(w, ri, aerr)
		return
	}
	if aerr := s.checkModel(req.Model); aerr != nil {
		s.fail(w, ri, aerr)
		return
	}
	text := req.Prompt
	if req.Messages != nil {
		if s.opts.Chat == nil {
			s.fail(w, ri, openai.BadRequest("messages", "this model has no chat template: tokenize a prompt instead"))
			return
		}
		var err error
		text, err = s.opts.Chat.Render(toChatMessages(req.Messages), chat.Options{
			AddGenerationPrompt: req.AddGenerationPrompt, EnableThinking: req.EnableThinking,
		})
		if err != nil {
			s.fail(w, ri, openai.BadRequest("messages", "%v", err))
			return
		}
	}
	ids, err := s.opts.Tokenizer.Encode(text)
	if err != nil {
		s.fail(w, ri, &openai.Error{Status: http.StatusInternalServerError, Type: openai.TypeServer, Message: "tokenize: " + err.Error()})
		return
	}
	if ids == nil {
		ids = []int32{}
	}
	resp := openai.TokenizeResponse{Tokens: ids, Count: len(ids), MaxModelLen: s.lim.MaxModelLen}
	if req.ReturnTokenStrs {
		resp.TokenStrs = make([]string, len(ids))
		for i, id := range ids {
			resp.TokenStrs[i] = s.opts.Tokenizer.TokenText(id)
		}
	}
	writeJSON(w, http.StatusOK, resp)
}

func (s *Server) handleDetokenize(w http.ResponseWriter, r *http.Request) {
	ri := infoFrom(r.Context())
	body, aerr := s.readBody(w, r)
	if aerr != nil {
		s.fail(w, ri, aerr)
		return
	}
	req, aerr := openai.DecodeDetokenizeRequest(body)
	if aerr != nil {
		s.fail(w, ri, aerr)
		return
	}
	if aerr := s.checkModel(req.Model); aerr != nil {
		s.fail(w, ri, aerr)
		return
	}
	for i, id := range req.Tokens {
		if int(id) >= s.lim.VocabSize {
			s.fail(w, ri, openai.BadRequest("tokens", "tokens[%d]: token id %d is outside the vocabulary (size %d)", i, id, s.lim.VocabSize))
			return
		}
	}
	var (
		text string
		err  error
	)
	if sd, ok := s.opts.Tokenizer.(SpecialDecoder); ok {
		text, err = sd.DecodeWithSpecial(req.Tokens)
	} else {
		text, err = s.opts.Tokenizer.Decode(req.Tokens)
	}
	if err != nil {
		// The model's vocabulary can be larger than the tokenizer's (padded
		// embedding rows): such ids are the client's mistake.
		s.fail(w, ri, openai.BadRequest("tokens", "detokenize: %v", err))
		return
	}
	writeJSON(w, http.StatusOK, openai.DetokenizeResponse{Prompt: text})
}
