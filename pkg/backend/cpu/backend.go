// Package cpu is the pure-Go reference backend: the full GLM-4.7 forward
// (docs/model.md §3–§4, §8) in float32 over a paged KV cache, implementing
// engine.Backend. It is the executable specification that faster backends are
// checked against (through pkg/golden), and it runs the bundled tiny models on
// any machine.
//
// Numerics. The exact path dequantizes every FP8 weight once at load, as
// float32(fp8) × float32(weight_scale[row]) rounded in float32 (what
// scripts/make_golden.py and the transformers reference do), and computes
// everything in float32. With Options.FP8Activations every quantized linear
// instead keeps the FP8 weight codes and their row scales apart and quantizes
// its input per token (spec §4.3), and the backend rounds where the GPU's FP8
// path rounds (docs/validation.md, "FP8 golden"): K and V are stored as BF16,
// attention runs in the log2 domain on a BF16 query with BF16 probabilities
// under the GPU kernels' tile schedules (attention.go), and the final norm's
// output is rounded to BF16 before lm_head. So this path computes what the
// CUDA backend computes, up to float32 summation order.
package cpu

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"

	"github.com/glmctl/glmctl/pkg/engine"
	"github.com/glmctl/glmctl/pkg/model"
	"github.com/glmctl/glmctl/pkg/sample"
)

// Defaults and limits of Options.
const (
	DefaultKVBlockSize = 16
	// maxDefaultKVBlocks caps the default pool (8 sequences of max context).
	maxDefaultKVBlocks = 4096
	defaultPoolSeqs    = 8
	// MaxWeightBytes is the most float32 weight memory Open will allocate.
	// The CPU backend holds every weight as float32, which is meant for the
	// tiny test models, not for the 355B checkpoint (about 1.4 TB as float32).
	MaxWeightBytes = 64 << 30
	// MaxKVBytes is the most KV pool memory Open will allocate.
	MaxKVBytes = 32 << 30
)

// Variant selects deliberately wrong math. It exists only so that tests can
// prove the golden comparison catches these bugs; the zero value is the
// correct model.
type Variant struct {
	// InterleavedRoPE pairs dims (2i, 2i+1) (GPT-J / dense GLM-4 style)
	// instead of the NeoX halves (i, i+rot/2).
	InterleavedRoPE bool
	// RoutingWeightsFromBiased takes the expert weights from the
	// bias-corrected scores instead of the plain sigmoid scores.
	RoutingWeightsFromBiased bool
	// QKNormAfterRoPE applies the per-head q/k RMSNorm after RoPE.
	QKNormAfterRoPE bool
	// The FP8 path's arithmetic, each wrong by less than the FP8 rounding
	// noise (docs/validation.md, "FP8 golden"):
	// FP8ScaleHeadroom scales activations by amax/440 instead of amax/448
	// (another scale rule: every code moves, the dequantized values do not).
	FP8ScaleHeadroom bool
	// FP8FloatKV keeps K and V in float32 instead of BF16.
	FP8FloatKV bool
	// FP8ExactSoftmax computes attention in float32 with unrounded
	// probabilities (no BF16 query or P, no tile schedule).
	FP8ExactSoftmax bool
}

// IsZero reports whether v is the correct model.
func (v Variant) IsZero() bool { return v == Variant{} }

// Options configures Open.
type Options struct {
	KVBlockSize    int     // tokens per KV block; 0 -> 16
	NumKVBlocks    int     // blocks in the KV pool; 0 -> enough for 8 sequences of max context, capped at 4096
	FP8Activations bool    // the GPU's FP8 path: per-token FP8 activations in every quantized linear (spec §4.3), BF16 KV and attention operands, BF16 lm_head input
	Threads        int     // worker goroutines; 0 -> runtime.GOMAXPROCS(0)
	Variant        Variant // test hook: deliberately wrong math (zero value = correct)
	// DraftTokens is the most draft tokens a sequence may verify and
	// propose per step (BackendInfo.MaxDraftTokens): above 0 the backend
	// loads the checkpoint's MTP layer and runs it as the draft model of
	// speculative decoding (docs/speculative.md); 0 leaves it unloaded.
	DraftTokens int
	// OnLoad, if not nil, is called as weights are read, with the
	// checkpoint bytes read so far and the total to read (progress).
	OnLoad func(done, total int64)
}

// Backend is the CPU implementation of engine.Backend. Step calls are
// serialised; Info may be called at any time.
type Backend struct {
	cfg  *model.Config
	opts Options
	w    *weights

	kvBlockSize int
	numKVBlocks int
	// kvLayers is the number of layers in the pool: num_hidden_layers, plus
	// the MTP layer's when drafting (the last one).
	kvLayers int
	// kv is the pool [block][layer][k|v][slot][kvDim], flat.
	kv []float32

	// mtpHook, when set (tests only), receives the MTP layer's draft logits
	// of every (sequence, position) pair of step 3 of docs/speculative.md.
	mtpHook func(seq uint64, pos int, logits []float32)

	pool    *workerPool
	sampler sample.Sampler

	mu     sync.Mutex
	closed bool
	s      scratch
}

var _ engine.Backend = (*Backend)(nil)

// Open loads the checkpoint in dir (config.json, index and shards), binds it
// to the GLM-4.x MoE architecture, dequantizes the weights to float32 and
// allocates the KV pool.
func Open(dir string, o Options) (*Backend, error) {
	if o.KVBlockSize < 0 || o.NumKVBlocks < 0 || o.Threads < 0 || o.DraftTokens < 0 {
		return nil, fmt.Errorf("cpu backend: options: KVBlockSize %d, NumKVBlocks %d, Threads %d and DraftTokens %d must be >= 0",
			o.KVBlockSize, o.NumKVBlocks, o.Threads, o.DraftTokens)
	}
	cfg, err := model.LoadConfig(dir)
	if err != nil {
		return nil, fmt.Errorf("cpu backend: %w", err)
	}
	kvLayers := cfg.NumHiddenLayers
	if o.DraftTokens > 0 {
		if cfg.NumNextNPredictLayers < 1 {
			return nil, fmt.Errorf("cpu backend: DraftTokens %d needs the checkpoint's MTP layer, but %s/config.json has num_nextn_predict_layers = %d",
				o.DraftTokens, dir, cfg.NumNextNPredictLayers)
		}
		kvLayers++ // the MTP layer's cache
	}
	if o.KVBlockSize == 0 {
		o.KVBlockSize = DefaultKVBlockSize
	}
	if o.Threads == 0 {
		o.Threads = runtime.GOMAXPROCS(0)
	}
	blocksPerSeq := (cfg.MaxPositionEmbeddings + o.KVBlockSize - 1) / o.KVBlockSize
	if o.NumKVBlocks == 0 {
		o.NumKVBlocks = min(defaultPoolSeqs*blocksPerSeq, maxDefaultKVBlocks)
	}
	kvPerBlock := int64(kvLayers) * 2 * int64(o.KVBlockSize) * int64(cfg.KVDim())
	if kvBytes := kvPerBlock * int64(o.NumKVBlocks) * 4; kvBytes > MaxKVBytes {
		return nil, fmt.Errorf("cpu backend: KV pool of %d blocks x %d tokens needs %d bytes as float32, over the limit of %d; ask for fewer blocks",
			o.NumKVBlocks, o.KVBlockSize, kvBytes, int64(MaxKVBytes))
	}
	w, err := loadWeights(dir, cfg, o.FP8Activations, o.DraftTokens > 0, o.OnLoad)
	if err != nil {
		return nil, fmt.Errorf("cpu backend: %w", err)
	}
	b := &Backend{
		cfg:         cfg,
		opts:        o,
		w:           w,
		kvBlockSize: o.KVBlockSize,
		numKVBlocks: o.NumKVBlocks,
		kvLayers:    kvLayers,
		kv:          make([]float32, kvPerBlock*int64(o.NumKVBlocks)),
		pool:        newWorkerPool(o.Threads),
	}
	return b, nil
}

// Config returns the model configuration the backend runs.
func (b *Backend) Config() *model.Config { return b.cfg }

// Info describes the backend.
func (b *Backend) Info() engine.BackendInfo {
	mode := "exact float32"
	if b.opts.FP8Activations {
		mode = "FP8 activations"
	}
	dev := fmt.Sprintf("CPU, %d threads, pure Go (%s)", b.opts.Threads, mode)
	if !b.opts.Variant.IsZero() {
		dev += fmt.Sprintf(", WRONG-MATH VARIANT %+v", b.opts.Variant)
	}
	return engine.BackendInfo{
		Name:        "cpu",
		Device:      dev,
		VocabSize:   b.cfg.VocabSize,
		MaxContext:  b.cfg.MaxPositionEmbeddings,
		KVBlockSize: b.kvBlockSize,
		NumKVBlocks: b.numKVBlocks,
		TokenMasks:  true, // pkg/sample applies StepSeq.AllowedTokens
		// The MTP layer is loaded exactly when DraftTokens > 0.
		MaxDraftTokens: b.opts.DraftTokens,
	}
}

// Close releases the weights and the KV pool. Step fails afterwards.
func (b *Backend) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	b.pool.close()
	b.w = nil
	b.kv = nil
	b.s = scratch{}
	return nil
}

// ErrClosed is returned by Step after Close.
var ErrClosed = errors.New("cpu backend is closed")

// Step runs one forward pass over the batch (docs/architecture.md, step contract): every sequence's
// new tokens are embedded, their K/V written to the slots their block tables
// name, attention reads positions 0..pos of each sequence from the pool, and
// logits are computed at each sequence's last position where it samples or
// asks for logits. A sequence with Draft set also has its drafts verified
// and runs the MTP layer (mtp.go, docs/speculative.md).
func (b *Backend) Step(ctx context.Context, batch *engine.StepBatch) ([]engine.SeqResult, error) {
	if batch == nil {
		return nil, errors.New("cpu step: nil batch")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, fmt.Errorf("cpu step: %w", ErrClosed)
	}
	if err := b.validate(batch); err != nil {
		return nil, fmt.Errorf("cpu step: %w", err)
	}
	return b.forward(ctx, batch)
}
