// Package cuda is the CUDA backend: it drives libglmcuda.so (cuda/, C ABI
// cuda/include/glmrt.h) through cgo and dlopen, so glmctl builds and runs
// without any CUDA library and loads the runtime only when asked. One
// locked OS thread per backend makes every glmrt_ call (docs/architecture.md, design rules).
package cuda

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"sync"
	"time"
	"unsafe"

	"github.com/glmctl/glmctl/pkg/cudabuild"
	"github.com/glmctl/glmctl/pkg/engine"
	"github.com/glmctl/glmctl/pkg/model"
	"github.com/glmctl/glmctl/pkg/safetensors"
)

// LibEnv names an environment variable holding the library path; it is
// consulted when Options.LibPath is empty.
const LibEnv = "GLMCTL_CUDA_LIB"

// Options configures Open. Zero values mean the runtime's defaults
// (glmrt_engine_options).
type Options struct {
	// LibPath is the libglmcuda.so to load; empty: $GLMCTL_CUDA_LIB, else
	// the `glmctl build` cache for Arch.
	LibPath string
	// Arch picks the cached build ("sm_90a"); empty: detected via NVML.
	Arch string
	// CacheDir is the glmctl cache root; empty: cudabuild.DefaultCacheDir().
	CacheDir string

	Device, TP       int   // first CUDA device; GPUs used (0: 1)
	KVBlockSize      int   // tokens per KV block (0: 16)
	NumKVBlocks      int   // 0: as many as MemoryBudget allows
	MemoryBudget     int64 // bytes per GPU (0: free memory minus 1 GiB)
	MaxTokensPerStep int   // 0: 8192
	MaxSeqs          int   // most sequences per step (0: 256)
	// MaxPenaltyEntries bounds the distinct-token penalty history per step
	// (0: MaxSeqs * 4096).
	MaxPenaltyEntries int
	// Exact runs the validation precision: float32 activations times the
	// dequantized FP8 weights (no activation quantization), an FP32 KV cache
	// and an FP32 lm_head. Slow; for comparing with float32 references such
	// as the transformers golden files. The default is the real FP8 path.
	Exact bool
	// NoGraphs launches every kernel of every step; by default decode steps
	// are captured as CUDA graphs per batch-size bucket and replayed.
	NoGraphs bool
	// DraftTokens > 0 loads the checkpoint's MTP layer as the draft model of
	// speculative decoding (docs/speculative.md): up to DraftTokens drafts
	// per sequence and step (1..8; past the first, the MTP layer chains on
	// its own output).
	DraftTokens int
	// KVFP8 keeps the KV cache as e4m3 codes with an FP32 scale per token
	// and KV head (amax / 448): about half the bytes of the BF16 cache, so
	// twice the tokens in the same memory and half the attention's reads.
	// Needs the real path (not Exact) and KVBlockSize 16 (or 0).
	KVFP8 bool
	// OnLoad, if not nil, is called after each tensor handed to the
	// runtime, with the checkpoint bytes handed over so far and their total
	// (progress; how the runtime splits them over the GPUs is its own). It
	// replaces the periodic "loading weights" log lines.
	OnLoad func(done, total int64)
}

// Backend is a loaded CUDA engine. It implements engine.Backend.
type Backend struct {
	thread *osThread
	lib    *library
	eng    *rtEngine
	bufs   *stepBuffers
	info   engine.BackendInfo
	rt     RuntimeInfo
	lim    limits

	mu     sync.Mutex // serializes Step and Close
	closed bool
}

var _ engine.Backend = (*Backend)(nil)

// LibraryPath resolves the library Open would load: o.LibPath,
// $GLMCTL_CUDA_LIB, else the newest `glmctl build` of this binary's sources
// for the GPU's architecture. Without one the error wraps
// cudabuild.ErrNotBuilt ("libglmcuda.so not found: run `glmctl build`").
func LibraryPath(o Options) (string, error) {
	if o.LibPath != "" {
		return o.LibPath, nil
	}
	if p := os.Getenv(LibEnv); p != "" {
		return p, nil
	}
	arch := o.Arch
	if arch == "" {
		a, _, err := cudabuild.DetectArch()
		if err != nil {
			return "", fmt.Errorf("%w: cannot pick a cached build: %v", cudabuild.ErrNotBuilt, err)
		}
		arch = a
	}
	found, err := cudabuild.FindLibrary(o.CacheDir, arch)
	if err != nil {
		return "", err
	}
	if !found.Current {
		slog.Warn("libglmcuda.so was built from other sources than this glmctl embeds (same ABI); run `glmctl build` to rebuild",
			"lib", found.Path, "built_at", found.Manifest.BuiltAt)
	}
	return found.Path, nil
}

// DeviceCount loads the library at path and asks it how many CUDA devices
// are visible (used when NVML is not available).
func DeviceCount(path string) (int, error) {
	t := newOSThread()
	defer t.stop()
	var (
		n   int
		err error
	)
	t.run(func() {
		var l *library
		if l, err = openLibrary(path); err != nil {
			return
		}
		// The library stays loaded: glmrt_device_count initialises CUDA.
		n, err = l.deviceCount()
	})
	return n, err
}

// Open is OpenContext without cancellation.
func Open(dir string, o Options) (*Backend, error) {
	return OpenContext(context.Background(), dir, o)
}

// OpenContext loads the library, checks its ABI version, reads the model in
// dir (config.json and the mmap'ed safetensors shards), creates the engine,
// hands every tensor over, finalizes and reads back what the runtime became.
// ctx cancels between tensors.
func OpenContext(ctx context.Context, dir string, o Options) (*Backend, error) {
	b, path, copts, err := openRuntime(o)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			b.release()
		}
	}()
	cfg, err := model.LoadConfig(dir)
	if err != nil {
		return nil, err
	}
	if err := checkConfigRange(cfg); err != nil {
		return nil, err
	}
	ckpt, binding, err := model.OpenBound(dir, cfg)
	if err != nil {
		return nil, err
	}
	defer ckpt.Close()
	if err := binding.Err(); err != nil {
		return nil, fmt.Errorf("model %s: %w", dir, err)
	}
	// MTP tensors that fail the binding checks are not handed over: plain
	// inference ignores that layer, so a flaw there must not block loading.
	skip := map[string]bool{}
	for _, p := range binding.Problems {
		if p.MTP {
			skip[p.Tensor] = true
		}
	}

	ccfg := modelConfig(cfg)
	b.thread.run(func() { b.eng, err = b.lib.createEngine(&ccfg, &copts) })
	if err != nil {
		return nil, fmt.Errorf("cuda backend %s: %w", path, err)
	}
	if err := b.loadTensors(ctx, ckpt, skip, o.OnLoad); err != nil {
		return nil, err
	}
	if err := b.finish(path, cfg); err != nil {
		return nil, err
	}
	ok = true
	return b, nil
}

// finish finalizes the engine once every tensor is in place (loaded or
// synthesized), reads back what the runtime became and sets up the step
// buffers and limits.
func (b *Backend) finish(path string, cfg *model.Config) error {
	var (
		info RuntimeInfo
		err  error
	)
	b.thread.run(func() {
		if err = b.eng.finalize(); err != nil {
			return
		}
		var ci cInfo
		if ci, err = b.eng.info(); err == nil {
			info = runtimeInfo(path, ci)
		}
	})
	if err != nil {
		return fmt.Errorf("cuda backend: %w", err)
	}
	if err := info.check(cfg); err != nil {
		return fmt.Errorf("cuda backend %s: %w", path, err)
	}
	if b.bufs, err = newStepBuffers(); err != nil {
		return err
	}
	b.rt = info
	b.lim = limits{
		vocab: info.VocabSize, maxContext: cfg.MaxPositionEmbeddings, blockSize: info.KVBlockSize,
		maxSeqs: info.MaxSeqsPerStep, maxTokens: info.MaxTokensPerStep, maxBlocksSeq: info.MaxBlocksPerSeq,
		maxTopLogprobs: info.MaxTopLogprobs, maxPenaltyEntries: info.MaxPenaltyEntries,
	}
	b.info = engine.BackendInfo{
		Name: "cuda", Device: info.Device, VocabSize: info.VocabSize, MaxContext: cfg.MaxPositionEmbeddings,
		KVBlockSize: info.KVBlockSize, NumKVBlocks: info.NumKVBlocks, MaxBatchSeqs: info.MaxSeqsPerStep,
		MaxStepTokens: info.MaxTokensPerStep, TokenMasks: true, LateMasks: true, // token masks at glmrt_step_finish (ABI 6)
		MaxDraftTokens: info.MaxDraftTokens,
	}
	slog.Info("cuda backend ready", "lib", path, "device", info.Device, "tp", info.TensorParallel,
		"kv_blocks", info.NumKVBlocks, "kv_block_size", info.KVBlockSize, "draft_tokens", info.MaxDraftTokens,
		"weights_gb", float64(info.WeightBytes)/1e9, "kv_gb", float64(info.KVBytes)/1e9)
	return nil
}

// loadTensors hands every checkpoint tensor (sorted by name, so failures are
// reproducible) to the runtime, straight from the mmap.
func (b *Backend) loadTensors(ctx context.Context, ckpt *safetensors.Checkpoint, skip map[string]bool, onLoad func(done, total int64)) error {
	names := make([]string, 0, len(ckpt.Tensors))
	var total int64
	for name, t := range ckpt.Tensors {
		if !skip[name] {
			names = append(names, name)
			total += t.ByteSize()
		}
	}
	sort.Strings(names)
	slog.Info("cuda backend: loading weights", "dir", ckpt.Dir, "tensors", len(names), "gb", float64(total)/1e9)
	start, lastLog := time.Now(), time.Now()
	var done int64
	for i, name := range names {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("load weights: %w", err)
		}
		t := ckpt.Tensors[name]
		dt, ok := abiDType(t.DType)
		if !ok {
			return fmt.Errorf("tensor %s (shard %s): dtype %s is not one the CUDA runtime accepts (F32, BF16, F16, F8_E4M3)", name, t.File, t.DType)
		}
		data, err := ckpt.Data(name)
		if err != nil {
			return err
		}
		shape := make([]cInt64, len(t.Shape))
		for j, d := range t.Shape {
			shape[j] = cInt64(d)
		}
		var ptr unsafe.Pointer
		if len(data) > 0 {
			ptr = unsafe.Pointer(&data[0]) // mmap'ed file, not Go memory
		}
		b.thread.run(func() { err = b.eng.loadTensor(name, dt, shape, ptr, uint64(len(data))) })
		if err != nil {
			return fmt.Errorf("cuda backend: %w", err)
		}
		done += int64(len(data))
		if onLoad != nil {
			onLoad(done, total)
		} else if time.Since(lastLog) > 5*time.Second {
			lastLog = time.Now()
			slog.Info("cuda backend: loading weights", "tensors", fmt.Sprintf("%d/%d", i+1, len(names)),
				"gb", fmt.Sprintf("%.1f/%.1f", float64(done)/1e9, float64(total)/1e9))
		}
	}
	slog.Info("cuda backend: weights loaded", "tensors", len(names), "seconds", time.Since(start).Seconds())
	return nil
}

// Info implements engine.Backend.
func (b *Backend) Info() engine.BackendInfo { return b.info }

// RuntimeInfo is what the runtime reported at load (memory use, limits).
func (b *Backend) RuntimeInfo() RuntimeInfo { return b.rt }

// ErrClosed is returned by Step after Close.
var ErrClosed = errors.New("cuda backend: closed")

// Step implements engine.Backend: the step's forward is launched
// (glmrt_step_begin), then, while the GPU runs it, the engine finishes the
// token masks (batch.AwaitMasks), which glmrt_step_finish sends behind the
// forward before sampling. The call itself cannot be interrupted; ctx is
// checked before it starts.
func (b *Backend) Step(ctx context.Context, batch *engine.StepBatch) ([]engine.SeqResult, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, ErrClosed
	}
	var (
		res []engine.SeqResult
		err error
	)
	b.thread.run(func() {
		if err = b.bufs.fill(batch, b.lim); err != nil {
			return
		}
		if err = b.eng.stepBegin(b.bufs.batch); err != nil {
			return
		}
		if batch.AwaitMasks != nil {
			batch.AwaitMasks()
		}
		if err = b.eng.stepFinish(b.bufs.copyMasks(batch, b.lim), b.bufs.result); err != nil {
			return
		}
		res, err = b.bufs.results(batch, b.lim.vocab)
	})
	return res, err
}

// Close implements engine.Backend: destroys the engine (device memory) and
// ends the backend's thread. It is safe to call more than once.
func (b *Backend) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	b.release()
	return nil
}

// release frees what Open built so far, on the backend's thread.
func (b *Backend) release() {
	if b.thread == nil {
		return
	}
	b.thread.run(func() {
		if b.eng != nil {
			b.eng.destroy()
			b.eng = nil
			// The library stays loaded (see library.close).
		} else if b.lib != nil {
			b.lib.close()
		}
		b.lib = nil
		if b.bufs != nil {
			b.bufs.free()
			b.bufs = nil
		}
	})
	b.thread.stop()
	b.thread = nil
}
