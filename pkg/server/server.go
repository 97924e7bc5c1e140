// Package server is glmctl's OpenAI-compatible HTTP API: chat completions and
// completions (streamed as server-sent events or not), the model list,
// health and readiness probes and Prometheus metrics, in front of one
// pkg/engine Engine; and Anthropic's Messages API (/v1/messages, streamed or
// not, and /v1/messages/count_tokens) over the same engine.
//
// The wire types live in the subpackages openai and anthropic; this package
// converts them to and from engine requests and events with pure functions
// (convert.go, anthropic_convert.go), and
// adds what a server needs around that: backpressure (a bounded queue, 429
// with Retry-After), a body size limit, an optional API key, a request id and
// one structured log line per request, and graceful shutdown.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/glmctl/glmctl/pkg/engine"
	"github.com/glmctl/glmctl/pkg/grammar"
	"github.com/glmctl/glmctl/pkg/tokenizer/chat"
)

// Tokenizer is what the server needs from a tokenizer.
type Tokenizer interface {
	// Encode returns the ids of text, with special-token strings in the text
	// read as their ids and nothing added (rendered chat prompts carry their
	// own markers).
	Encode(text string) ([]int32, error)
	// Decode returns the text of ids without special tokens: the engine's
	// detokenizer, so generated text never shows <|user|> and friends.
	Decode(ids []int32) (string, error)
	// TokenText returns one token as text, special tokens included, for
	// logprobs. A token holding part of a UTF-8 character reads as U+FFFD.
	TokenText(id int32) string
}

// ChatFormat renders chat messages into a prompt and parses generated text
// back into reasoning, content and tool calls.
type ChatFormat interface {
	Render(messages []chat.Message, opts chat.Options) (string, error)
	NewParser(opts chat.ParserOptions) OutputParser
}

// OutputParser splits streamed output; see chat.Parser.
type OutputParser interface {
	Add(text string) []chat.Event
	Finish() []chat.Event
}

// GLMChat is the ChatFormat of GLM models, from pkg/tokenizer/chat.
type GLMChat struct{ Variant chat.Variant }

// Render implements ChatFormat.
func (g GLMChat) Render(messages []chat.Message, opts chat.Options) (string, error) {
	return chat.Render(g.Variant, messages, opts)
}

// NewParser implements ChatFormat.
func (g GLMChat) NewParser(opts chat.ParserOptions) OutputParser {
	return chat.NewParser(g.Variant, opts)
}

// SamplingDefaults apply to sampling fields a request leaves out (for
// example from the model's generation_config.json).
type SamplingDefaults struct {
	Temperature float64 // OpenAI's default is 1
	TopP        float64 // 1 = off
	TopK        int     // 0 = off
}

// Defaults for Options fields left zero.
const (
	DefaultMaxBodyBytes        = 8 << 20
	DefaultShutdownTimeout     = 30 * time.Second
	DefaultRetryAfter          = time.Second
	DefaultStallTimeout        = 2 * time.Minute
	DefaultMaxFailedSteps      = 3
	DefaultFailedStepsCooldown = 30 * time.Second
	DefaultCompletionMaxTokens = 16 // OpenAI's default for /v1/completions
	DefaultMaxQueue            = 256
	defaultReadHeaderTimeout   = 10 * time.Second
	defaultIdleTimeout         = 2 * time.Minute
	shutdownAfterCancelTimeout = 10 * time.Second
	statusClientClosedRequest  = 499 // nginx's convention, for logs and metrics only
)

// Options configure a Server.
type Options struct {
	// Backend runs the model; the caller keeps ownership (and closes it
	// after Serve returns).
	Backend engine.Backend
	// Engine configures the engine the server builds on Backend. Its
	// Detokenizer defaults to Tokenizer, its Logger to Logger, and MaxQueue
	// to DefaultMaxQueue (a negative value means unbounded).
	Engine engine.Config
	// Tokenizer and Chat are required: Chat renders /v1/chat/completions
	// prompts; a nil Chat makes that endpoint answer 400.
	Tokenizer Tokenizer
	Chat      ChatFormat
	// Grammar is the model's vocabulary for structured outputs
	// (response_format, guided_*): nil makes such requests a 400.
	Grammar *grammar.Vocab
	// ModelName is the id served by /v1/models; requests naming another
	// model get 404 (an empty "model" is accepted).
	ModelName string
	// APIKey, when set, is required as "Authorization: Bearer KEY" or
	// "x-api-key: KEY" (Anthropic's header) on /v1/*, /tokenize and
	// /detokenize.
	APIKey string
	// Addr is the listen address for ListenAndServe ("127.0.0.1:8000").
	Addr string
	// MaxBodyBytes limits request bodies (413 beyond). 0 = DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// Sampling defaults; zero value = temperature 1, top_p 1, top_k off.
	Sampling SamplingDefaults
	// CompletionMaxTokens is max_tokens when a /v1/completions request
	// leaves it out. 0 = DefaultCompletionMaxTokens.
	CompletionMaxTokens int
	// ShutdownTimeout is how long Serve lets running requests finish after
	// its context ends before cancelling them. 0 = DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
	// RetryAfter is sent with 429. 0 = DefaultRetryAfter.
	RetryAfter time.Duration
	// StallTimeout: /readyz fails when requests are pending and the engine
	// has not finished a step for this long. 0 = DefaultStallTimeout.
	StallTimeout time.Duration
	// MaxFailedSteps: /readyz (and /health) fail once this many engine steps
	// in a row have failed (a backend error or panic, each failing its own
	// requests), until FailedStepsCooldown after the latest failure or the
	// next step that succeeds. The cooldown lets a load balancer send
	// traffic again later: without requests no step runs, so none could
	// succeed. 0 = DefaultMaxFailedSteps; negative = never.
	MaxFailedSteps int
	// FailedStepsCooldown: 0 = DefaultFailedStepsCooldown.
	FailedStepsCooldown time.Duration
	// Logger receives the per-request lines and lifecycle logs. nil =
	// slog.Default().
	Logger *slog.Logger
	// Version and Commit are what GET /version reports ("dev" when empty).
	Version string
	Commit  string
	// GPU, when set, is sampled at each /metrics scrape for the
	// glmctl_gpu_* gauges (metrics_gpu.go). nil, or a sampler whose first
	// sample (in New) answers gpustat.ErrUnavailable, leaves them out, with
	// one log line saying why. The caller keeps ownership (and closes it).
	GPU GPUSampler
}

// Server serves the OpenAI-compatible API over one engine.
type Server struct {
	opts    Options
	log     *slog.Logger
	eng     *engine.Engine
	lim     engine.Limits
	metrics *metrics
	handler http.Handler
	created int64

	engineUp  atomic.Bool // the step loop is running
	draining  atomic.Bool // shutdown has begun
	progress  progressWatch
	serveOnce sync.Once
}

// New builds the engine on opts.Backend and the HTTP handler. Call Serve or
// ListenAndServe to run both.
func New(opts Options) (*Server, error) {
	switch {
	case opts.Backend == nil:
		return nil, errors.New("server: Options.Backend is nil")
	case opts.Tokenizer == nil:
		return nil, errors.New("server: Options.Tokenizer is nil")
	case opts.ModelName == "":
		return nil, errors.New("server: Options.ModelName is empty")
	case opts.MaxBodyBytes < 0:
		return nil, fmt.Errorf("server: max body bytes %d must be >= 0", opts.MaxBodyBytes)
	case opts.CompletionMaxTokens < 0:
		return nil, fmt.Errorf("server: completion max tokens %d must be >= 0", opts.CompletionMaxTokens)
	case opts.ShutdownTimeout < 0 || opts.RetryAfter < 0 || opts.StallTimeout < 0 || opts.FailedStepsCooldown < 0:
		return nil, errors.New("server: timeouts must be >= 0")
	}
	if opts.MaxFailedSteps == 0 {
		opts.MaxFailedSteps = DefaultMaxFailedSteps
	}
	if opts.FailedStepsCooldown == 0 {
		opts.FailedStepsCooldown = DefaultFailedStepsCooldown
	}
	if opts.MaxBodyBytes == 0 {
		opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if opts.CompletionMaxTokens == 0 {
		opts.CompletionMaxTokens = DefaultCompletionMaxTokens
	}
	if opts.ShutdownTimeout == 0 {
		opts.ShutdownTimeout = DefaultShutdownTimeout
	}
	if opts.RetryAfter == 0 {
		opts.RetryAfter = DefaultRetryAfter
	}
	if opts.StallTimeout == 0 {
		opts.StallTimeout = DefaultStallTimeout
	}
	if opts.Sampling == (SamplingDefaults{}) {
		opts.Sampling = SamplingDefaults{Temperature: 1, TopP: 1}
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	cfg := opts.Engine
	if cfg.Detokenizer == nil {
		cfg.Detokenizer = opts.Tokenizer
	}
	if cfg.Logger == nil {
		cfg.Logger = opts.Logger
	}
	switch {
	case cfg.MaxQueue == 0:
		cfg.MaxQueue = DefaultMaxQueue
	case cfg.MaxQueue < 0:
		cfg.MaxQueue = 0 // the engine's "unbounded"
	}
	m := newMetrics()
	eng, err := engine.New(m.timeSteps(opts.Backend), cfg)
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	s := &Server{
		opts:    opts,
		log:     opts.Logger,
		eng:     eng,
		lim:     eng.Limits(),
		metrics: m,
		created: time.Now().Unix(),
	}
	m.watchEngine(eng)
	if opts.GPU != nil {
		m.watchGPUs(opts.GPU, opts.Logger)
	}
	s.handler = s.routes()
	return s, nil
}

// Handler returns the HTTP handler. Generation endpoints answer only while
// Serve runs the engine.
func (s *Server) Handler() http.Handler { return s.handler }

// Engine returns the engine the server runs (for stats in tests and tools).
func (s *Server) Engine() *engine.Engine { return s.eng }

// ListenAndServe listens on Options.Addr and serves until ctx ends; see Serve.
func (s *Server) ListenAndServe(ctx context.Context) error {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", s.opts.Addr)
	if err != nil {
		return fmt.Errorf("server: listen on %s: %w", s.opts.Addr, err)
	}
	return s.Serve(ctx, ln)
}

// Serve runs the engine and serves HTTP on ln until ctx ends, then shuts
// down gracefully: it stops accepting connections, fails /readyz, lets
// running requests finish for up to ShutdownTimeout, then cancels what is
// left (streams get an error event), stops the engine and returns nil. It
// returns an error if serving fails, or if the engine stops on a fatal
// backend error (engine.ErrBackendFatal): then /readyz fails at once, the
// running requests get their error responses, and Serve returns the error.
// Serve may be called once.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	first := false
	s.serveOnce.Do(func() { first = true })
	if !first {
		_ = ln.Close()
		return errors.New("server: Serve called more than once")
	}
	engCtx, stopEngine := context.WithCancel(context.WithoutCancel(ctx))
	defer stopEngine()
	engDone := make(chan error, 1)
	s.engineUp.Store(true)
	s.progress.observe(s.eng.Stats(), time.Now())
	go s.watchProgress(engCtx)
	go func() {
		err := s.eng.Run(engCtx)
		s.engineUp.Store(false)
		engDone <- err
	}()

	hs := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: defaultReadHeaderTimeout,
		IdleTimeout:       defaultIdleTimeout,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	srvErr := make(chan error, 1)
	go func() { srvErr <- hs.Serve(ln) }()
	s.log.Info("serving", "addr", ln.Addr().String(), "model", s.opts.ModelName,
		"max_model_len", s.lim.MaxModelLen, "max_seqs", s.lim.MaxSeqs, "kv_blocks", s.lim.NumKVBlocks,
		"auth", s.opts.APIKey != "")

	var serveErr error
	select {
	case <-ctx.Done():
	case err := <-srvErr:
		serveErr = fmt.Errorf("server: serve on %s: %w", ln.Addr(), err)
	case err := <-engDone:
		// The step loop ended on its own: a fatal backend error (a sticky
		// CUDA error) or a panic of the loop. Its requests have their error
		// events; stop being ready, let the handlers write those, and return
		// the error so the process exits non-zero and a supervisor restarts
		// it.
		engDone <- err
		s.draining.Store(true)
		s.log.Error("engine stopped on a fatal error: not ready, draining, then exiting", "err", err)
		serveErr = fmt.Errorf("server: engine stopped: %w", err)
	}

	s.draining.Store(true)
	s.log.Info("shutting down: draining requests", "timeout", s.opts.ShutdownTimeout.String())
	drainCtx, cancelDrain := context.WithTimeout(context.Background(), s.opts.ShutdownTimeout)
	err := hs.Shutdown(drainCtx)
	cancelDrain()
	if err != nil {
		// Requests still running past the deadline: cancel them all by
		// stopping the engine (streams end with an error event), then give
		// the handlers a moment to write that and return.
		s.log.Warn("shutdown deadline passed: cancelling running requests", "stats_running", s.eng.Stats().Running)
		stopEngine()
		finalCtx, cancelFinal := context.WithTimeout(context.Background(), shutdownAfterCancelTimeout)
		if err := hs.Shutdown(finalCtx); err != nil {
			_ = hs.Close()
		}
		cancelFinal()
	}
	stopEngine()
	<-engDone
	s.log.Info("shut down")
	return serveErr
}

// progressWatch remembers when the engine last made progress (finished a
// step, or had nothing to do), for /readyz. Serve samples it every second.
type progressWatch struct {
	mu    sync.Mutex
	steps uint64
	at    time.Time
}

func (p *progressWatch) observe(st engine.Stats, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.at.IsZero() || st.Steps != p.steps || st.Running+st.Waiting == 0 {
		p.steps, p.at = st.Steps, now
	}
}

// stalled reports whether the engine has made no progress for longer than
// limit.
func (p *progressWatch) stalled(now time.Time, limit time.Duration) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.at.IsZero() && now.Sub(p.at) > limit
}

// progressStalled takes a fresh sample first: between the watcher's
// once-a-second samples an idle or advancing engine would otherwise look
// stalled to a StallTimeout under a second.
func (s *Server) progressStalled(now time.Time) bool {
	s.progress.observe(s.eng.Stats(), now)
	return s.progress.stalled(now, s.opts.StallTimeout)
}

// watchProgress samples engine progress until ctx ends.
func (s *Server) watchProgress(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		s.progress.observe(s.eng.Stats(), time.Now())
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
