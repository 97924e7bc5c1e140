// Package engine owns request lifecycle, scheduling, KV block management and
// sampling policy. It talks to compute through the Backend interface: one call
// per scheduler step, with a flat description of what runs (docs/architecture.md, step contract).
package engine

import (
	"context"
	"errors"
)

// Backend runs the model. Implementations: pkg/backend/cpu (pure Go
// reference) and pkg/backend/cuda (libglmcuda.so). A backend owns weights and
// the KV pool; the engine owns which KV blocks each sequence uses.
type Backend interface {
	// Info describes the backend's fixed properties (KV pool size, vocab, ...).
	Info() BackendInfo
	// Step runs one forward pass over a batch of sequences and returns one
	// result per entry of batch.Seqs, in the same order. Entries with
	// Sample == false (a non-final prefill chunk) return a zero Result apart
	// from SeqID (and Logits if WantLogits).
	//
	// Failures: a problem of one sequence (non-finite logits: wrap
	// ErrNonFiniteLogits) goes in that SeqResult.Err and the others still
	// get their tokens; an error return fails every sequence of the step,
	// and the engine goes on with the next step, unless the error wraps
	// ErrBackendFatal (the device can run nothing more: a sticky CUDA
	// error), which stops the engine. A panic counts as an error return.
	Step(ctx context.Context, batch *StepBatch) ([]SeqResult, error)
	// Close releases weights and device memory.
	Close() error
}

// BackendInfo is what the scheduler needs to know about a backend.
type BackendInfo struct {
	Name         string // "cpu" or "cuda"
	Device       string // human-readable device description
	VocabSize    int    // rows of lm_head (logits length)
	MaxContext   int    // max_position_embeddings
	KVBlockSize  int    // tokens per KV block
	NumKVBlocks  int    // blocks in the pool; block ids are 0..NumKVBlocks-1
	MaxBatchSeqs int    // most sequences one step accepts (0 = no limit)
	// MaxStepTokens is the most new tokens one step accepts (0 = no limit);
	// longer prompts are prefilled in chunks.
	MaxStepTokens int
	// TokenMasks: the backend applies StepSeq.AllowedTokens when it samples,
	// so the engine accepts requests with a Constraint.
	TokenMasks bool
	// LateMasks: the backend calls StepBatch.AwaitMasks (when set) before
	// it reads any AllowedTokens, after launching the step's forward pass,
	// so the engine computes the masks while the device runs the forward.
	LateMasks bool
	// MaxDraftTokens is the most draft tokens one sequence may verify and
	// propose in a step (StepSeq.Drafts, StepSeq.Propose): the backend runs
	// the checkpoint's MTP layer as a draft model (docs/speculative.md).
	// 0: no speculative decoding.
	MaxDraftTokens int
}

// StepBatch is the flat batch description of one step. Token ids of all
// sequences are concatenated in Seqs order.
type StepBatch struct {
	Seqs []StepSeq
	// AwaitMasks, when not nil (backends with LateMasks only), blocks until
	// the engine has filled every AllowedTokens of the batch: the backend
	// calls it once, after starting the forward pass and before it reads
	// the masks.
	AwaitMasks func()
}

// NumTokens is the total number of new tokens in the batch.
func (b *StepBatch) NumTokens() int {
	n := 0
	for i := range b.Seqs {
		n += len(b.Seqs[i].Tokens)
	}
	return n
}

// StepSeq is one sequence's share of a step: a prefill chunk or one decode
// token (later k+1 tokens for speculative verification).
type StepSeq struct {
	SeqID uint64
	// Tokens are the new token ids processed this step, at positions
	// StartPos .. StartPos+len(Tokens)-1.
	Tokens   []int32
	StartPos int
	// BlockTable lists the KV block ids owned by the sequence, in position
	// order: position p lives in block BlockTable[p/KVBlockSize], slot
	// p%KVBlockSize. It covers at least StartPos+len(Tokens) positions.
	BlockTable []int32
	// Sample asks for a next token after the last of Tokens.
	Sample bool
	// Sampling parameters, used only when Sample is set.
	Sampling SamplingParams
	// SampleIndex is how many tokens this sequence has generated before this
	// step; with Sampling.Seed it keys the counter-based RNG so the same seed
	// and inputs give the same tokens whatever else shares the batch.
	SampleIndex int
	// PromptTokens and OutputTokens are the sequence's history, read only for
	// penalties. The backend must not keep them past the call.
	PromptTokens []int32
	OutputTokens []int32
	// WantLogits returns the float32 logits at the last position in
	// SeqResult.Logits (validation and tests).
	WantLogits bool
	// AllowedTokens, when not nil, is a bitmask of the tokens the sample may
	// take (bit i%32 of word i/32 for token i; MaskWords(vocab) words): the
	// others are set to -Inf after the penalties, before temperature and the
	// filters. Logprobs stay those of the raw logits. Read only when Sample
	// is set; the backend must not keep it past the call.
	AllowedTokens []uint32

	// Speculative decoding (BackendInfo.MaxDraftTokens > 0;
	// docs/speculative.md has the rules). None of these is set together
	// with AllowedTokens or WantLogits.
	//
	// Draft runs the draft model (the MTP layer) over this step's positions
	// so that its KV cache follows the sequence: set on every step of a
	// sequence that speculates, prefill chunks included.
	Draft bool
	// NextToken, with Draft on a step that does not sample (a prefill chunk
	// before the prompt's end), is the token after the chunk: the draft
	// model's input at the chunk's last position. -1 otherwise.
	NextToken int32
	// Drafts: the last Drafts entries of Tokens are unverified draft tokens
	// (Sample is set). The backend samples the target model after each of
	// the positions Tokens[len-1-Drafts .. len-1], accepts drafts in order
	// while the rule of docs/speculative.md accepts them, and returns the
	// accepted ones in SeqResult.Accepted followed by SeqResult.Token.
	Drafts int
	// Propose, with Draft and Sample, asks for this many draft tokens to
	// follow SeqResult.Token (SeqResult.Drafts), at most MaxDraftTokens.
	Propose int
}

// SamplingParams are per-request sampling settings (OpenAI/vLLM semantics).
type SamplingParams struct {
	Temperature       float32 // 0 means greedy
	TopK              int     // 0 or <0 means disabled
	TopP              float32 // 1 means disabled
	MinP              float32 // 0 means disabled
	RepetitionPenalty float32 // 1 means disabled (vLLM/HF semantics, prompt+output)
	FrequencyPenalty  float32 // OpenAI semantics, output tokens only
	PresencePenalty   float32 // OpenAI semantics, output tokens only
	Seed              int64   // used when HasSeed
	HasSeed           bool
	TopLogprobs       int  // number of top alternatives to return (0 = none)
	Logprobs          bool // return the sampled token's logprob
}

// Greedy reports whether the parameters select the argmax token.
func (p SamplingParams) Greedy() bool { return p.Temperature <= 0 }

// TokenLogprob is one token with its log-probability.
type TokenLogprob struct {
	Token   int32
	Logprob float32
}

// SeqResult is what a step returns for one sequence.
type SeqResult struct {
	SeqID       uint64
	Token       int32 // sampled token (valid when the StepSeq had Sample set)
	Logprob     float32
	TopLogprobs []TokenLogprob
	Logits      []float32 // only when WantLogits
	// Err, when set, ends this sequence with finish reason "error" (its
	// Token is ignored); the rest of the step is unaffected. Backends set it
	// (wrapping ErrNonFiniteLogits) instead of sampling from logits holding
	// NaN or +Inf.
	Err error
	// Accepted are the draft tokens (StepSeq.Drafts) the target model
	// accepted, in order, each with its logprobs at its position; Token
	// follows the last of them. Empty when none was accepted.
	Accepted []AcceptedToken
	// Drafts are the draft model's proposals to follow Token
	// (StepSeq.Propose of them).
	Drafts []int32
}

// AcceptedToken is one accepted draft token with its logprob and top
// alternatives under the target model (when the request asks for logprobs).
type AcceptedToken struct {
	Token       int32
	Logprob     float32
	TopLogprobs []TokenLogprob
}

// Errors a backend reports through Step.
var (
	// ErrNonFiniteLogits: a sequence's logits held NaN or +Inf (or were all
	// -Inf), so no token could be sampled. The request ends with an error
	// and the engine counts it (Stats.NonFiniteLogits); its KV blocks are
	// kept out of the prefix cache.
	ErrNonFiniteLogits = errors.New("non-finite logits")
	// ErrNoAllowedToken: a constrained sequence's token mask allowed no
	// token with a finite logit. The request ends with an error.
	ErrNoAllowedToken = errors.New("no allowed token")
	// ErrBackendFatal: the backend can run no more steps (a sticky CUDA
	// error such as an illegal address or an uncorrectable ECC error). The
	// engine fails every request and Run returns an error wrapping it.
	ErrBackendFatal = errors.New("fatal backend error")
	// ErrStepPanic: Step panicked; that step's requests fail with it.
	ErrStepPanic = errors.New("backend step panicked")
)
