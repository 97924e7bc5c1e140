package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"github.com/glmctl/glmctl/pkg/backend"
	"github.com/glmctl/glmctl/pkg/engine"
	"github.com/glmctl/glmctl/pkg/model"
	"github.com/glmctl/glmctl/pkg/synth"
)

// addBackendFlags registers the flags shared by every command that runs the
// model (generate, validate, serve, bench).
func addBackendFlags(f *pflag.FlagSet) {
	f.String("backend", backend.Auto, "compute backend: cpu, cuda, or auto (cuda when a GPU and libglmcuda.so are present, else cpu)")
	f.Int("kv-blocks", 0, "KV cache blocks (0 = the backend's default: CPU a fixed pool, CUDA what the memory budget allows)")
	f.Int("kv-block-size", 0, "tokens per KV block (0 = 16)")
	f.Bool("fp8-activations", false, "cpu backend: quantize activations to FP8 per token, as the GPU path always does")
	f.Int("threads", 0, "cpu backend: worker goroutines (0 = all cores)")
	f.String("cuda-lib", "", "cuda backend: libglmcuda.so to load (default $GLMCTL_CUDA_LIB, else the `glmctl build` cache)")
	f.Int("device", 0, "cuda backend: first GPU ordinal")
	f.Int("tp", 1, "cuda backend: tensor-parallel GPUs")
	f.Int64("gpu-memory-budget", 0, "cuda backend: bytes per GPU for weights, KV and workspaces (0 = free memory minus 1 GiB)")
	f.Bool("cuda-graphs", true, "cuda backend: capture decode steps as CUDA graphs per batch size and replay them (false: launch every kernel every step)")
	f.Bool("cuda-exact", false, "cuda backend: validation precision (float32 activations, FP32 KV cache and lm_head; slow)")
	f.String("kv-cache-dtype", backend.KVAuto, "KV cache element type: auto (cuda BF16, cpu float32) or fp8 (cuda: e4m3 with a scale per token and KV head; half the bytes, twice the tokens; needs --kv-block-size 16)")
}

// addPrefillWithDecodeFlag registers the engine's cap on prefill tokens in a
// step that also decodes (generate, serve, bench).
func addPrefillWithDecodeFlag(f *pflag.FlagSet) {
	f.Int("max-prefill-with-decode", 0, fmt.Sprintf("most prefill tokens in a step that also decodes, so running streams keep short inter-token gaps (0 = engine default %d)", engine.DefaultMaxPrefillWithDecode))
}

// addSpeculativeFlags registers speculative decoding (generate, serve, bench).
func addSpeculativeFlags(f *pflag.FlagSet) {
	f.String("speculative", "", "speculative decoding: mtp (the checkpoint's multi-token-prediction layer drafts, the model verifies; docs/speculative.md), or empty for off")
	f.Int("draft-tokens", 1, "with --speculative mtp: draft tokens proposed and verified per step (1.."+strconv.Itoa(maxDraftTokens)+")")
	f.Int("draft-max-batch", 0, "with --speculative mtp: propose drafts only while at most this many sequences run (0 = "+strconv.Itoa(engine.DefaultDraftMaxBatch)+")")
}

// maxDraftTokens bounds --draft-tokens: MTP's chained drafts beyond a few
// are rarely accepted (one trained MTP layer predicts one token ahead).
const maxDraftTokens = 8

// speculative reads the speculative-decoding flags: the draft tokens per
// step (0 = off) and the batch size above which drafting pauses.
func (a *app) speculative() (drafts, maxBatch int, err error) {
	v := a.v
	switch mode := v.GetString("speculative"); mode {
	case "":
		for _, f := range []string{"draft-tokens", "draft-max-batch"} {
			if v.IsSet(f) {
				return 0, 0, fmt.Errorf("--%s: only means something with --speculative mtp", f)
			}
		}
		return 0, 0, nil
	case "mtp":
	default:
		return 0, 0, fmt.Errorf("--speculative %q: want mtp (or empty for off)", mode)
	}
	drafts, maxBatch = v.GetInt("draft-tokens"), v.GetInt("draft-max-batch")
	if drafts < 1 || drafts > maxDraftTokens {
		return 0, 0, fmt.Errorf("--draft-tokens %d: want 1..%d", drafts, maxDraftTokens)
	}
	if maxBatch < 0 {
		return 0, 0, fmt.Errorf("--draft-max-batch %d: want >= 0 (0 = %d)", maxBatch, engine.DefaultDraftMaxBatch)
	}
	return drafts, maxBatch, nil
}

// openBackend opens the compute backend chosen by the shared flags for the
// model in dir.
func (a *app) openBackend(ctx context.Context, dir string) (engine.Backend, error) {
	return a.openBackendFor(ctx, dir, nil)
}

// openBackendFor opens the backend on the model in dir, or on the synthetic
// model spec when it is set (dir is then ignored).
func (a *app) openBackendFor(ctx context.Context, dir string, spec *synth.Spec) (engine.Backend, error) {
	v := a.v
	o := backend.Options{
		KVBlockSize:    v.GetInt("kv-block-size"),
		NumKVBlocks:    v.GetInt("kv-blocks"),
		FP8Activations: v.GetBool("fp8-activations"),
		Threads:        v.GetInt("threads"),
		LibPath:        v.GetString("cuda-lib"),
		Device:         v.GetInt("device"),
		TP:             v.GetInt("tp"),
		MemoryBudget:   v.GetInt64("gpu-memory-budget"),
		MaxSeqs:        v.GetInt("max-seqs"),
		CUDAExact:      v.GetBool("cuda-exact"),
		CUDANoGraphs:   !v.GetBool("cuda-graphs"),
		Synthetic:      spec,
	}
	kvType, err := backend.ParseKVCacheDType(v.GetString("kv-cache-dtype"))
	if err != nil {
		return nil, err
	}
	o.KVCacheDType = kvType
	if v.IsSet("speculative") || v.GetString("speculative") != "" {
		drafts, _, err := a.speculative()
		if err != nil {
			return nil, err
		}
		o.DraftTokens = drafts
	}
	if n := v.GetInt("max-batched-tokens"); n > 0 {
		o.MaxTokensPerStep = n
	}
	if spec != nil {
		dir = ""
	}
	name := v.GetString("backend")
	onLoad, loaded := a.loadProgress()
	o.OnLoad = onLoad
	be, err := backend.Open(ctx, name, dir, o)
	loaded()
	if err != nil {
		return nil, fmt.Errorf("--backend %s: %w", name, err)
	}
	return be, nil
}

// addSyntheticFlags registers the flags that run synthetic weights instead
// of a model directory (generate, bench, serve; docs/synthetic.md).
func addSyntheticFlags(f *pflag.FlagSet) {
	f.String("synthetic", "", "run full-size synthetic weights of this model instead of --model: "+strings.Join(synth.Bases(), ", ")+" (docs/synthetic.md)")
	f.String("rank", "", "with --synthetic: r/N, exactly rank r's share of a TP = EP = N deployment (e.g. 0/8); empty = the whole model")
	f.Int("layers", 0, "with --synthetic: keep the first N decoder layers (0 = all)")
	f.Int("dense-layers", -1, "with --synthetic: how many of them are dense-MLP layers (-1 = the model's, at most --layers)")
	f.Uint64("synthetic-seed", synth.DefaultSeed, "with --synthetic: seed of the weights (each rank combines it with its index)")
}

// syntheticFlags are the flags that only mean something with --synthetic.
var syntheticFlags = []string{"rank", "layers", "dense-layers", "synthetic-seed"}

// syntheticSpec reads the synthetic-model flags: nil (and no error) without
// --synthetic. --synthetic replaces --model, so setting both is an error, as
// is a synthetic-only flag without --synthetic.
func (a *app) syntheticSpec() (*synth.Spec, error) {
	v := a.v
	base := v.GetString("synthetic")
	if base == "" {
		for _, f := range syntheticFlags {
			if v.IsSet(f) {
				return nil, fmt.Errorf("--%s: only means something with --synthetic", f)
			}
		}
		return nil, nil
	}
	if v.IsSet("model") {
		return nil, fmt.Errorf("--synthetic %s and --model %s: choose one (--synthetic replaces the model directory)", base, v.GetString("model"))
	}
	spec := &synth.Spec{Base: base, Layers: v.GetInt("layers"), DenseLayers: v.GetInt("dense-layers"), Seed: v.GetUint64("synthetic-seed")}
	if r := v.GetString("rank"); r != "" {
		var err error
		if spec.Rank, spec.Ranks, err = synth.ParseRank(r); err != nil {
			return nil, err
		}
	}
	if _, err := spec.Config(); err != nil {
		return nil, err
	}
	return spec, nil
}

// modelSource is what a command runs: a model directory, or synthetic
// weights with their derived config.
type modelSource struct {
	dir   string
	spec  *synth.Spec
	cfg   *model.Config // set for synthetic models
	label string        // the directory, or the spec in words
}

// modelFromFlags resolves --synthetic (with its flags) or --model.
func (a *app) modelFromFlags() (modelSource, error) {
	spec, err := a.syntheticSpec()
	if err != nil {
		return modelSource{}, err
	}
	if spec == nil {
		dir := a.v.GetString("model")
		return modelSource{dir: dir, label: dir}, nil
	}
	cfg, err := spec.Config()
	if err != nil {
		return modelSource{}, err
	}
	return modelSource{spec: spec, cfg: cfg, label: spec.String()}, nil
}

// open opens the backend on the source.
func (a *app) open(ctx context.Context, m modelSource) (engine.Backend, error) {
	return a.openBackendFor(ctx, m.dir, m.spec)
}

// errNoTokenizer is the error of text input for a model without tokenizer.
var errNoTokenizer = errors.New("a synthetic model has no tokenizer: give --prompt-ids")
