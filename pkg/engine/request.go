package engine

import "errors"

// Request is one generation request. The engine copies what it needs at
// Submit; the caller may reuse the Request afterwards.
type Request struct {
	// Label is an optional caller-side name used in logs (e.g. the HTTP
	// request id).
	Label string
	// PromptTokens are the prompt's token ids (at least one).
	PromptTokens []int32
	Sampling     SamplingParams
	// MaxTokens caps the generated tokens; 0 means "until the context limit".
	MaxTokens int
	// StopTokenIDs end generation when sampled (finish reason "stop"), in
	// addition to Config.EOSTokenIDs unless IgnoreEOS is set.
	StopTokenIDs []int32
	IgnoreEOS    bool
	// StopStrings end generation when the decoded output contains one of
	// them. The stop string and anything after it are never emitted. They
	// need Config.Detokenizer.
	StopStrings []string
	// ReturnLogits attaches the raw logits of every sampled position to its
	// event (validation and tests; costly for real vocabularies).
	ReturnLogits bool
	// Speculation overrides the engine's speculative-decoding setting for
	// this request (docs/speculative.md).
	Speculation Speculation
	// Constraint, if not nil, limits every generated token to those it allows
	// (structured outputs: JSON schema, regex, grammar). The request finishes
	// with FinishStop once the constraint is Done. When Submit succeeds the
	// engine owns it and closes it as the request ends; when Submit fails the
	// caller still owns it.
	Constraint Constraint
}

// Speculation is a request's choice about speculative decoding.
type Speculation int8

// Speculation values.
const (
	// SpeculationDefault follows the engine (Config.DraftTokens > 0: draft,
	// except for requests with a constraint or that want logits).
	SpeculationDefault Speculation = iota
	// SpeculationOff never drafts for this request: plain decoding steps,
	// so a seeded request samples as on an engine without a draft model.
	SpeculationOff
	// SpeculationOn asks for drafting: Submit fails when the engine has no
	// draft model, or with a Constraint or ReturnLogits.
	SpeculationOn
)

// Constraint is a per-request token constraint, e.g. a grammar matcher
// (pkg/grammar). The engine calls it from its loop only, never concurrently
// for one request.
type Constraint interface {
	// FillMask writes the tokens allowed next into dst, one bit per token id
	// (bit i%32 of dst[i/32]); len(dst) is MaskWords(vocab size).
	FillMask(dst []uint32) error
	// Accept advances past a generated token.
	Accept(token int32) error
	// Done reports that the constraint is complete: nothing but a stop may
	// follow.
	Done() bool
	// Close releases the constraint's resources.
	Close()
}

// MaskWords is the length of a token bitmask over a vocabulary of n ids.
func MaskWords(n int) int { return (n + 31) / 32 }

// Allowed reports whether a token bitmask allows token t (a nil mask allows
// every token).
func Allowed(mask []uint32, t int32) bool {
	if mask == nil {
		return true
	}
	i := int(t) >> 5
	return t >= 0 && i < len(mask) && mask[i]>>(uint(t)&31)&1 != 0
}

// Limits on stop strings, to bound the per-token matching work.
const (
	MaxStopStrings   = 64
	MaxStopStringLen = 1024
)

// Detokenizer turns token ids into text. Decode must be a pure function of
// ids and safe for concurrent use; for byte-level BPE a prefix of the ids
// must decode to a prefix of the text, apart from an incomplete UTF-8 tail
// (which it may render as U+FFFD or drop).
type Detokenizer interface {
	Decode(ids []int32) (string, error)
}

// FinishReason says why a request ended (OpenAI's finish_reason values plus
// "cancelled" and "error").
type FinishReason string

const (
	FinishStop      FinishReason = "stop"      // stop token or stop string
	FinishLength    FinishReason = "length"    // max_tokens or context limit
	FinishCancelled FinishReason = "cancelled" // Stream.Cancel or the Submit context
	FinishError     FinishReason = "error"     // backend failure or engine stop
)

// Usage counts tokens of one request.
type Usage struct {
	PromptTokens     int
	CompletionTokens int
	// CachedPromptTokens were served from the prefix cache at the request's
	// first admission (OpenAI prompt_tokens_details.cached_tokens).
	CachedPromptTokens int
}

// Event is one item of a Stream. Every sampled token produces exactly one
// event with HasToken set (a sampled stop token included). The last event
// has Finish set and carries Usage; it may also carry a token.
type Event struct {
	HasToken bool
	Token    int32
	// Text is the newly decoded text that is safe to show: text that could be
	// the start of a stop string is held back until it is known not to be.
	// Stop tokens are not decoded.
	Text        string
	Logprob     float32 // raw logprob of Token, when Sampling asks for logprobs
	TopLogprobs []TokenLogprob
	Logits      []float32 // only with Request.ReturnLogits

	Finish FinishReason // set on the last event only
	// StopToken is the stop token id that ended the request (Finish "stop"
	// by token); -1 otherwise.
	StopToken int32
	// StopString is the stop string that ended the request, if any.
	StopString string
	Usage      Usage // on the last event
	Err        error // with Finish "error"
}

// Errors returned by Submit, and carried by error events.
var (
	// ErrQueueFull: Config.MaxQueue requests are already waiting (HTTP 429).
	ErrQueueFull = errors.New("engine: request queue is full")
	// ErrEngineStopped: Run has returned; no more requests are served.
	ErrEngineStopped = errors.New("engine: stopped")
	// ErrInvalidRequest wraps every validation failure of Submit (HTTP 400).
	ErrInvalidRequest = errors.New("invalid request")
)
