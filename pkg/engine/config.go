package engine

import (
	"fmt"
	"log/slog"
)

// Defaults applied by New to zero fields of Config.
const (
	// DefaultMaxBatchedTokens is vLLM's default for GPUs of 70 GiB and more:
	// a prefill chunk of 8,192 tokens reads every weight once for 8,192
	// tokens instead of four times (an 8k prompt's TTFT on the GLM-4.7 rank
	// share 240 -> 191 ms against 2,048, docs/perf.md 2026-11-29 thirteenth
	// session). It is also capped by the backend's BackendInfo.MaxStepTokens.
	DefaultMaxBatchedTokens = 8192
	// DefaultMaxPrefillWithDecode keeps a step that also decodes short:
	// running streams wait for at most 2,048 prefill tokens a step (a long
	// prompt's full-budget chunk would hold their next token ~190 ms there).
	DefaultMaxPrefillWithDecode = 2048
	DefaultMaxSeqs              = 256
)

// Config holds the engine's knobs. Zero values take the defaults noted on
// each field; DefaultConfig returns the recommended settings.
type Config struct {
	// MaxBatchedTokens is the per-step token budget (--max-batched-tokens):
	// decode tokens plus prefill chunk tokens. 0 = DefaultMaxBatchedTokens,
	// or the backend's MaxStepTokens when that is smaller.
	MaxBatchedTokens int
	// MaxPrefillWithDecode caps the prefill tokens of a step in which some
	// sequence decodes (--max-prefill-with-decode), so a long prompt arriving
	// among running streams is prefilled in chunks that keep their
	// inter-token gaps short; a step without decodes prefills up to the
	// whole budget. 0 = DefaultMaxPrefillWithDecode; at or above the budget
	// it has no effect.
	MaxPrefillWithDecode int
	// MaxSeqs caps the sequences in one step (--max-seqs), and so the
	// running set. 0 = DefaultMaxSeqs. Also capped by BackendInfo.MaxBatchSeqs.
	MaxSeqs int
	// MaxModelLen caps prompt+output tokens of one sequence. 0 = the
	// backend's MaxContext. Always further capped by the KV pool's capacity
	// (NumKVBlocks * block size), so one sequence can always run alone.
	MaxModelLen int
	// NumKVBlocks limits how many of the backend's KV blocks the engine
	// uses. 0 = all of them. More than the backend has is an error.
	NumKVBlocks int
	// PrefixCaching shares full KV blocks between sequences with the same
	// token prefix and keeps freed ones for reuse (LRU).
	PrefixCaching bool
	// MaxQueue bounds requests submitted but not yet started; Submit returns
	// ErrQueueFull beyond it. 0 = unbounded.
	MaxQueue int
	// EOSTokenIDs end every request (finish "stop") unless it sets IgnoreEOS;
	// for GLM-4.7 the generation_config eos_token_id list.
	EOSTokenIDs []int32
	// Detokenizer produces event text and is needed for stop strings. nil =
	// events carry token ids only.
	Detokenizer Detokenizer
	// TextBetweenSteps decodes every sampled token's text before the next
	// step starts, instead of while it runs (overlap.go: a stop string found
	// there ends the request at that token, the next step's token for it
	// dropped). A debugging aid: the events, their order, the usage and the
	// finish are the same either way.
	TextBetweenSteps bool
	// Logger receives lifecycle logs. nil = slog.Default().
	Logger *slog.Logger
	// DraftTokens turns on speculative decoding with the backend's draft
	// model (the checkpoint's MTP layer, docs/speculative.md): each step
	// verifies up to this many draft tokens per sequence and proposes as
	// many for the next. 0 = off. At most BackendInfo.MaxDraftTokens.
	DraftTokens int
	// DraftMaxBatch: drafts are proposed only while at most this many
	// sequences run (past it a verify step may cost more than it saves).
	// 0 = DefaultDraftMaxBatch.
	DraftMaxBatch int
}

// DefaultDraftMaxBatch is Config.DraftMaxBatch's default: the largest batch
// at which a k = 1 verify step was measured on the GPU. On an H200 (GLM-4.7
// rank share, docs/perf.md 2026-11-25 fifth session) it cost 1.06-1.29 × a
// plain decode step at every batch from 1 to 128, so drafting pays from
// ~30% acceptance (the trained demo model accepts 66-81%, GLM-4.7's MTP ~90%).
const DefaultDraftMaxBatch = 128

// DefaultConfig returns the recommended settings: default budgets and prefix
// caching on.
func DefaultConfig() Config {
	return Config{
		MaxBatchedTokens:     DefaultMaxBatchedTokens,
		MaxPrefillWithDecode: DefaultMaxPrefillWithDecode,
		MaxSeqs:              DefaultMaxSeqs,
		PrefixCaching:        true,
	}
}

// Limits are the effective values the engine runs with, resolved from Config
// and BackendInfo.
type Limits struct {
	BlockSize        int // tokens per KV block
	NumKVBlocks      int // blocks the engine manages
	MaxBatchedTokens int
	// MaxPrefillWithDecode: the most prefill tokens in a step that also
	// decodes (Config.MaxPrefillWithDecode), at most MaxBatchedTokens.
	MaxPrefillWithDecode int
	MaxSeqs              int
	// MaxModelLen is the most tokens (prompt + output) one sequence may hold.
	MaxModelLen int
	VocabSize   int
	// DraftTokens and DraftMaxBatch: speculative decoding (Config).
	DraftTokens   int
	DraftMaxBatch int
}

// resolve checks cfg against the backend and fills defaults.
func resolve(cfg Config, info BackendInfo) (Limits, error) {
	l := Limits{
		BlockSize:            info.KVBlockSize,
		NumKVBlocks:          info.NumKVBlocks,
		MaxBatchedTokens:     cfg.MaxBatchedTokens,
		MaxPrefillWithDecode: cfg.MaxPrefillWithDecode,
		MaxSeqs:              cfg.MaxSeqs,
		MaxModelLen:          cfg.MaxModelLen,
		VocabSize:            info.VocabSize,
		DraftTokens:          cfg.DraftTokens,
		DraftMaxBatch:        cfg.DraftMaxBatch,
	}
	switch {
	case info.KVBlockSize <= 0:
		return l, fmt.Errorf("engine config: backend %q reports KV block size %d; it must be > 0", info.Name, info.KVBlockSize)
	case info.NumKVBlocks <= 0:
		return l, fmt.Errorf("engine config: backend %q reports %d KV blocks; it must be > 0", info.Name, info.NumKVBlocks)
	case info.VocabSize <= 0:
		return l, fmt.Errorf("engine config: backend %q reports vocab size %d; it must be > 0", info.Name, info.VocabSize)
	case cfg.MaxBatchedTokens < 0:
		return l, fmt.Errorf("engine config: max batched tokens %d must be >= 0 (0 = default %d)", cfg.MaxBatchedTokens, DefaultMaxBatchedTokens)
	case info.MaxStepTokens > 0 && cfg.MaxBatchedTokens > info.MaxStepTokens:
		return l, fmt.Errorf("engine config: max batched tokens %d exceed the %s backend's limit of %d tokens a step", cfg.MaxBatchedTokens, info.Name, info.MaxStepTokens)
	case cfg.MaxPrefillWithDecode < 0:
		return l, fmt.Errorf("engine config: max prefill with decode %d must be >= 0 (0 = default %d)", cfg.MaxPrefillWithDecode, DefaultMaxPrefillWithDecode)
	case cfg.MaxSeqs < 0:
		return l, fmt.Errorf("engine config: max seqs %d must be >= 0 (0 = default %d)", cfg.MaxSeqs, DefaultMaxSeqs)
	case cfg.MaxModelLen < 0:
		return l, fmt.Errorf("engine config: max model len %d must be >= 0 (0 = backend max context)", cfg.MaxModelLen)
	case cfg.MaxQueue < 0:
		return l, fmt.Errorf("engine config: max queue %d must be >= 0 (0 = unbounded)", cfg.MaxQueue)
	case cfg.NumKVBlocks < 0 || cfg.NumKVBlocks > info.NumKVBlocks:
		return l, fmt.Errorf("engine config: KV blocks %d must be in [0, %d] (the backend's pool; 0 = all)", cfg.NumKVBlocks, info.NumKVBlocks)
	case cfg.DraftTokens < 0 || cfg.DraftMaxBatch < 0:
		return l, fmt.Errorf("engine config: draft tokens %d and draft max batch %d must be >= 0", cfg.DraftTokens, cfg.DraftMaxBatch)
	case cfg.DraftTokens > info.MaxDraftTokens:
		if info.MaxDraftTokens == 0 {
			return l, fmt.Errorf("engine config: speculative decoding (%d draft tokens) needs a draft model, and the %s backend has none loaded (the checkpoint's MTP layer)", cfg.DraftTokens, info.Name)
		}
		return l, fmt.Errorf("engine config: %d draft tokens exceed the %s backend's limit of %d", cfg.DraftTokens, info.Name, info.MaxDraftTokens)
	case info.MaxContext > 0 && cfg.MaxModelLen > info.MaxContext:
		return l, fmt.Errorf("engine config: max model len %d exceeds the backend's max context %d", cfg.MaxModelLen, info.MaxContext)
	}
	for i, id := range cfg.EOSTokenIDs {
		if id < 0 || int(id) >= info.VocabSize {
			return l, fmt.Errorf("engine config: EOS token id %d at index %d is outside the vocabulary (size %d)", id, i, info.VocabSize)
		}
	}
	if cfg.NumKVBlocks > 0 {
		l.NumKVBlocks = cfg.NumKVBlocks
	}
	if l.MaxBatchedTokens == 0 {
		l.MaxBatchedTokens = DefaultMaxBatchedTokens
		if info.MaxStepTokens > 0 {
			l.MaxBatchedTokens = min(l.MaxBatchedTokens, info.MaxStepTokens)
		}
	}
	if l.MaxPrefillWithDecode == 0 {
		l.MaxPrefillWithDecode = DefaultMaxPrefillWithDecode
	}
	l.MaxPrefillWithDecode = min(l.MaxPrefillWithDecode, l.MaxBatchedTokens)
	if l.MaxSeqs == 0 {
		l.MaxSeqs = DefaultMaxSeqs
	}
	if info.MaxBatchSeqs > 0 && l.MaxSeqs > info.MaxBatchSeqs {
		l.MaxSeqs = info.MaxBatchSeqs
	}
	if l.MaxModelLen == 0 {
		l.MaxModelLen = info.MaxContext
	}
	if l.DraftTokens > 0 && l.DraftMaxBatch == 0 {
		l.DraftMaxBatch = DefaultDraftMaxBatch
	}
	kvTokens := l.NumKVBlocks * l.BlockSize
	if l.MaxModelLen == 0 || l.MaxModelLen > kvTokens {
		l.MaxModelLen = kvTokens
	}
	return l, nil
}
