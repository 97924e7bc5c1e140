// Package backend picks and opens a compute backend by name: "cpu" (the
// pure-Go reference, pkg/backend/cpu), "cuda" (libglmcuda.so through
// pkg/backend/cuda) or "auto" (CUDA when a GPU and the library are present,
// else CPU). Commands take --backend and call Open.
package backend

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/glmctl/glmctl/pkg/backend/cpu"
	"github.com/glmctl/glmctl/pkg/backend/cuda"
	"github.com/glmctl/glmctl/pkg/cudabuild"
	"github.com/glmctl/glmctl/pkg/engine"
	"github.com/glmctl/glmctl/pkg/synth"
	"github.com/glmctl/glmctl/pkg/weightcheck"
)

// Backend names accepted by Open.
const (
	Auto = "auto"
	CPU  = "cpu"
	CUDA = "cuda"
)

// Names lists the accepted backend names, for flag help.
var Names = []string{Auto, CPU, CUDA}

// Options configures whichever backend is opened; fields that do not apply
// to it are ignored. Zero values mean that backend's defaults.
type Options struct {
	KVBlockSize int // tokens per KV block
	NumKVBlocks int // KV pool size in blocks

	// CPU backend.
	FP8Activations bool // per-token dynamic FP8 activation quantization
	Threads        int  // worker goroutines

	// DraftTokens > 0 loads the checkpoint's MTP layer as the draft model of
	// speculative decoding, for up to this many drafts per step
	// (docs/speculative.md). Both backends run it; the CUDA runtime drafts
	// one token per step.
	DraftTokens int

	// CUDA backend (see cuda.Options).
	LibPath          string // libglmcuda.so; empty: $GLMCTL_CUDA_LIB, else the build cache
	Arch             string // cached build to use; empty: detected
	CacheDir         string // glmctl cache root
	Device, TP       int
	MemoryBudget     int64
	MaxTokensPerStep int
	MaxSeqs          int
	CUDAExact        bool // validation precision (see cuda.Options.Exact)
	CUDANoGraphs     bool // launch every kernel of every step (see cuda.Options.NoGraphs)
	// KVCacheDType is the KV cache's element type: "" or KVAuto (BF16 on
	// CUDA, FP32 on the CPU), or KVFP8 (CUDA only: e4m3 codes with a scale
	// per token and KV head; see cuda.Options.KVFP8).
	KVCacheDType string

	// Synthetic, when set, replaces the model directory: the synthetic
	// weights of docs/synthetic.md (generated on the GPU by the CUDA
	// backend, written to a temporary checkpoint by the CPU backend).
	Synthetic *synth.Spec

	// OnLoad, if not nil, is called as the weights load, with the checkpoint
	// bytes read (CPU) or handed to the runtime (CUDA) so far and their
	// total: progress.
	OnLoad func(done, total int64)
}

func (o Options) cpu() cpu.Options {
	return cpu.Options{KVBlockSize: o.KVBlockSize, NumKVBlocks: o.NumKVBlocks, FP8Activations: o.FP8Activations, Threads: o.Threads,
		DraftTokens: o.DraftTokens, OnLoad: o.OnLoad}
}

func (o Options) cuda() cuda.Options {
	return cuda.Options{
		LibPath: o.LibPath, Arch: o.Arch, CacheDir: o.CacheDir,
		Device: o.Device, TP: o.TP, KVBlockSize: o.KVBlockSize, NumKVBlocks: o.NumKVBlocks,
		MemoryBudget: o.MemoryBudget, MaxTokensPerStep: o.MaxTokensPerStep, MaxSeqs: o.MaxSeqs,
		Exact: o.CUDAExact, NoGraphs: o.CUDANoGraphs, OnLoad: o.OnLoad, DraftTokens: o.DraftTokens,
		KVFP8: o.KVCacheDType == KVFP8,
	}
}

// KV cache element types (Options.KVCacheDType, --kv-cache-dtype).
const (
	KVAuto = "auto"
	KVBF16 = "bf16"
	KVFP8  = "fp8"
)

// ParseKVCacheDType reads a --kv-cache-dtype value: auto or bf16 (the
// default cache), fp8 or fp8_e4m3 (vLLM's spellings).
func ParseKVCacheDType(s string) (string, error) {
	switch strings.ToLower(s) {
	case "", KVAuto:
		return KVAuto, nil
	case KVBF16:
		return KVBF16, nil
	case KVFP8, "fp8_e4m3":
		return KVFP8, nil
	}
	return "", fmt.Errorf("--kv-cache-dtype %q: want auto, bf16 or fp8 (fp8_e4m3)", s)
}

// probe is how auto looks at the machine; tests replace it.
type probe struct {
	gpus        func() ([]cudabuild.GPU, error)
	libPath     func(cuda.Options) (string, error)
	deviceCount func(lib string) (int, error)
}

var machine = probe{gpus: cudabuild.DetectGPUs, libPath: cuda.LibraryPath, deviceCount: cuda.DeviceCount}

// Choice is the backend auto resolved to, and why.
type Choice struct {
	Name    string // CPU or CUDA
	LibPath string // the library, for CUDA
	Reason  string
}

// Choose resolves a backend name. For "auto" (or "") it picks CUDA when a
// GPU is visible (NVML, or glmrt_device_count when NVML is unavailable) and
// the library is found, else CPU; the reason says what decided.
func Choose(name string, o Options) (Choice, error) {
	return machine.choose(name, o)
}

func (p probe) choose(name string, o Options) (Choice, error) {
	switch strings.ToLower(name) {
	case CPU:
		return Choice{Name: CPU, Reason: "requested"}, nil
	case CUDA:
		return Choice{Name: CUDA, LibPath: o.LibPath, Reason: "requested"}, nil
	case Auto, "":
	default:
		return Choice{}, fmt.Errorf("backend %q: want one of %s", name, strings.Join(Names, ", "))
	}
	lib, libErr := p.libPath(o.cuda())
	gpus, gpuErr := p.gpus()
	visible := len(gpus)
	gpuDesc := ""
	if gpuErr == nil && visible > 0 {
		gpuDesc = fmt.Sprintf("%d GPU(s), GPU 0 %s", visible, gpus[0].Name)
	} else if libErr == nil {
		// NVML missing or failing (e.g. a -tags nonvml binary): ask the
		// runtime itself.
		n, err := p.deviceCount(lib)
		if err != nil {
			gpuErr = errors.Join(gpuErr, err)
		} else if n > 0 {
			visible, gpuDesc = n, fmt.Sprintf("%d CUDA device(s) (glmrt_device_count)", n)
		}
	}
	switch {
	case visible == 0 && gpuErr != nil:
		return Choice{Name: CPU, Reason: fmt.Sprintf("no GPU: %v", gpuErr)}, nil
	case visible == 0:
		return Choice{Name: CPU, Reason: "no GPU visible"}, nil
	case libErr != nil:
		return Choice{Name: CPU, Reason: fmt.Sprintf("%s, but %v", gpuDesc, libErr)}, nil
	}
	return Choice{Name: CUDA, LibPath: lib, Reason: fmt.Sprintf("%s and %s", gpuDesc, lib)}, nil
}

// Open opens the named backend ("cpu", "cuda", "auto") on the model in dir,
// or on the synthetic model o.Synthetic (dir must then be empty).
// An explicit "cuda" fails with the CUDA backend's error (no library, stale
// library, no GPU); "auto" falls back to CPU only when no GPU or no library
// is found, never when a found library fails to load.
func Open(ctx context.Context, name, dir string, o Options) (engine.Backend, error) {
	if o.Synthetic != nil && dir != "" {
		return nil, fmt.Errorf("model directory %s and %s: choose one", dir, o.Synthetic)
	}
	c, err := Choose(name, o)
	if err != nil {
		return nil, err
	}
	if strings.ToLower(name) != CPU && strings.ToLower(name) != CUDA {
		slog.Info("backend auto-selected", "backend", c.Name, "reason", c.Reason)
	}
	switch c.Name {
	case CUDA:
		co := o.cuda()
		co.LibPath = c.LibPath
		if o.Synthetic != nil {
			b, err := cuda.OpenSynthetic(ctx, *o.Synthetic, co)
			if err != nil {
				return nil, err
			}
			return b, nil
		}
		// The CPU loader runs the same check itself, on tensors it reads anyway.
		if err := weightcheck.CheckDir(dir); err != nil {
			return nil, err
		}
		b, err := cuda.OpenContext(ctx, dir, co)
		if err != nil {
			return nil, err
		}
		return b, nil
	default:
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if o.KVCacheDType == KVFP8 {
			return nil, fmt.Errorf("cpu backend: --kv-cache-dtype fp8 is a cuda backend option (the cpu reference keeps its KV cache in float32)")
		}
		if o.KVCacheDType == KVBF16 {
			return nil, fmt.Errorf("cpu backend: --kv-cache-dtype bf16 is a cuda backend option (the cpu reference keeps its KV cache in float32; use auto)")
		}
		if o.Synthetic != nil {
			b, err := cpu.OpenSynthetic(ctx, *o.Synthetic, o.cpu())
			if err != nil {
				return nil, err
			}
			return b, nil
		}
		b, err := cpu.Open(dir, o.cpu())
		if err != nil {
			return nil, err
		}
		return b, nil
	}
}
