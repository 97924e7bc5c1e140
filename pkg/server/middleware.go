package server

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/glmctl/glmctl/pkg/server/openai"
)

// RequestIDHeader carries the request id in responses (and is reused from
// the request when the client sends a well-formed one).
const RequestIDHeader = "X-Request-Id"

// requestInfo collects what the per-request log line reports; handlers fill
// the generation fields.
type requestInfo struct {
	id     string
	path   string
	start  time.Time
	stream bool

	promptTokens     int
	completionTokens int
	firstToken       time.Time
	lastToken        time.Time
	finishReason     string
	errMsg           string
	clientGone       bool
}

type ctxKey struct{}

func infoFrom(ctx context.Context) *requestInfo {
	if ri, ok := ctx.Value(ctxKey{}).(*requestInfo); ok {
		return ri
	}
	return &requestInfo{start: time.Now()} // handlers called without middleware (tests)
}

// statusRecorder remembers the status written; Unwrap lets
// http.ResponseController reach the connection's Flush.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// instrument wraps a handler of route path with the request id, panic
// recovery, the API key check (when auth is set and the path is under
// /v1/), metrics and one log line.
func (s *Server) instrument(path string, auth bool, h http.HandlerFunc) http.Handler {
	api := strings.HasPrefix(path, "/v1/") || path == pathTokenize || path == pathDetokenize
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ri := &requestInfo{id: requestID(r.Header.Get(RequestIDHeader)), path: path, start: time.Now()}
		w.Header().Set(RequestIDHeader, ri.id)
		if anthropicRoute(r.URL.Path) {
			w.Header().Set("Request-Id", ri.id) // where Anthropic's clients look for it
		}
		rec := &statusRecorder{ResponseWriter: w}
		r = r.WithContext(context.WithValue(r.Context(), ctxKey{}, ri))
		s.metrics.inFlight.Inc()
		defer func() {
			s.metrics.inFlight.Dec()
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler {
					panic(p)
				}
				s.log.Error("handler panic", "request_id", ri.id, "path", path, "panic", fmt.Sprint(p))
				ri.errMsg = fmt.Sprint("internal error: ", p)
				if rec.status == 0 {
					writeErrorFor(rec, r.URL.Path, &openai.Error{Status: http.StatusInternalServerError, Type: openai.TypeServer, Message: "internal server error"})
				}
			}
			status := rec.status
			if status == 0 {
				status = http.StatusOK
			}
			if ri.clientGone && status == http.StatusOK && !ri.stream {
				status = statusClientClosedRequest
			}
			s.metrics.requests.WithLabelValues(path, strconv.Itoa(status)).Inc()
			s.logRequest(r, ri, status, api)
		}()
		if auth && s.opts.APIKey != "" && needsKey(r.URL.Path) && !s.authorized(r) {
			writeErrorFor(rec, r.URL.Path, &openai.Error{Status: http.StatusUnauthorized, Type: openai.TypeAuthentication, Code: "invalid_api_key",
				Message: "missing or incorrect API key: send it as \"Authorization: Bearer KEY\" or \"x-api-key: KEY\""})
			ri.errMsg = "unauthorized"
			return
		}
		h(rec, r)
	})
}

// needsKey reports whether a request path needs the API key (when one is
// set): the /v1/ API and /tokenize, /detokenize; probes, /version and
// /metrics stay open.
func needsKey(path string) bool {
	return strings.HasPrefix(path, "/v1/") || path == pathTokenize || path == pathDetokenize
}

func (s *Server) logRequest(r *http.Request, ri *requestInfo, status int, api bool) {
	level := slog.LevelInfo
	if !api {
		level = slog.LevelDebug // probes and scrapes would drown the log
	}
	if !s.log.Enabled(r.Context(), level) {
		return
	}
	end := time.Now()
	attrs := []slog.Attr{
		slog.String("request_id", ri.id),
		slog.String("method", r.Method),
		slog.String("path", ri.path),
		slog.Int("status", status),
		slog.Float64("duration_ms", ms(end.Sub(ri.start))),
	}
	if ri.path == pathChat || ri.path == pathCompletions || ri.path == pathMessages || ri.path == pathResponses {
		ttft, tps := 0.0, 0.0
		if !ri.firstToken.IsZero() {
			ttft = ms(ri.firstToken.Sub(ri.start))
			// Decode speed: tokens after the first over the time they took.
			if d := ri.lastToken.Sub(ri.firstToken); ri.completionTokens > 1 && d > 0 {
				tps = float64(ri.completionTokens-1) / d.Seconds()
			}
		}
		attrs = append(attrs,
			slog.Bool("stream", ri.stream),
			slog.Int("prompt_tokens", ri.promptTokens),
			slog.Int("completion_tokens", ri.completionTokens),
			slog.Float64("ttft_ms", round3(ttft)),
			slog.Float64("tokens_per_s", round3(tps)),
			slog.String("finish_reason", ri.finishReason),
		)
	}
	if ri.errMsg != "" {
		attrs = append(attrs, slog.String("error", ri.errMsg))
	}
	s.log.LogAttrs(r.Context(), level, "request", attrs...)
}

func ms(d time.Duration) float64 { return round3(float64(d) / float64(time.Millisecond)) }

func round3(f float64) float64 { return float64(int64(f*1000+0.5)) / 1000 }

// authorized compares the bearer token (OpenAI's clients) or the x-api-key
// header (Anthropic's) with the API key in constant time (over SHA-256
// digests, so the key's length does not leak either). Either header that
// matches is enough.
func (s *Server) authorized(r *http.Request) bool {
	want := sha256.Sum256([]byte(s.opts.APIKey))
	match := func(token string) bool {
		got := sha256.Sum256([]byte(strings.TrimSpace(token)))
		return subtle.ConstantTimeCompare(got[:], want[:]) == 1
	}
	h := r.Header.Get("Authorization")
	token, ok := strings.CutPrefix(h, "Bearer ")
	if !ok {
		token, ok = strings.CutPrefix(h, "bearer ")
	}
	if ok && match(token) {
		return true
	}
	key := r.Header.Get("X-Api-Key")
	return key != "" && match(key)
}

// requestID reuses a client's id when it is short and plain, else makes one.
func requestID(fromClient string) string {
	if n := len(fromClient); n > 0 && n <= 64 && !strings.ContainsFunc(fromClient, func(r rune) bool {
		return !(r == '-' || r == '_' || r == '.' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z')
	}) {
		return fromClient
	}
	return randomID(12)
}

// randomID returns 2n hex digits from crypto/rand.
func randomID(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b)
}

// readBody reads a request body within the size limit. The Content-Type is
// not checked: curl's default form type with a JSON body is common.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *openai.Error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.opts.MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, &openai.Error{Status: http.StatusRequestEntityTooLarge, Type: openai.TypeInvalidRequest,
				Message: fmt.Sprintf("request body is larger than the limit of %d bytes", tooBig.Limit)}
		}
		return nil, openai.BadRequest("", "read request body: %v", err)
	}
	return body, nil
}

// writeError sends an OpenAI error body.
func writeError(w http.ResponseWriter, e *openai.Error) {
	writeJSON(w, e.Status, e.Body())
}

// writeErrorFor sends e in the shape of the API that path belongs to:
// Anthropic's under /v1/messages, OpenAI's elsewhere.
func writeErrorFor(w http.ResponseWriter, path string, e *openai.Error) {
	if anthropicRoute(path) {
		writeJSON(w, e.Status, toAnthropicError(e).Body())
		return
	}
	writeError(w, e)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"error":{"message":"encode response failed","type":"server_error","param":null,"code":null}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
