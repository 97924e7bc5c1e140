// Package synth makes full-size synthetic GLM-4.7-FP8 weights: the model
// configuration of a whole model or of one rank's share of a TP = EP = N
// deployment, and pseudo-random FP8 weights conditioned so that activations
// and routing behave like a trained model's. Every value is a pure function
// of (seed, tensor name, element index) that the CUDA runtime
// (cuda/runtime/synth.cu, glmrt_synthesize) reproduces bit for bit on the
// GPU; Write stores the same values as a checkpoint in the GLM-4.7-FP8
// layout. docs/synthetic.md is the specification.
package synth

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/glmctl/glmctl/pkg/model"
)

// glm47Config is testdata/glm-4.7-fp8/config.json (a test keeps the two equal).
//
//go:embed glm-4.7.json
var glm47Config []byte

// bases are the real configurations a synthetic model derives from.
var bases = map[string][]byte{"glm-4.7": glm47Config}

// Bases lists the base model names Spec accepts, sorted.
func Bases() []string { return slices.Sorted(maps.Keys(bases)) }

// BaseConfig returns the real config.json of a base model.
func BaseConfig(name string) ([]byte, error) {
	b, ok := bases[name]
	if !ok {
		return nil, fmt.Errorf("--synthetic %q: unknown base model (known: %s)", name, strings.Join(Bases(), ", "))
	}
	return bytes.Clone(b), nil
}

// DefaultSeed is the seed the commands use unless told otherwise.
const DefaultSeed = 1

// Spec names a synthetic model: a base configuration, optionally one rank's
// share of a TP = EP = Ranks deployment, optionally shortened, and a seed.
type Spec struct {
	Base string // "glm-4.7"
	// Rank of Ranks: the share of rank Rank in a deployment of Ranks GPUs
	// (tensor parallel = expert parallel = Ranks). Ranks 0: the whole model.
	Rank, Ranks int
	// Layers keeps the first Layers decoder layers (0: all of the base).
	Layers int
	// DenseLayers is first_k_dense_replace; negative: the default,
	// min(the base's, Layers).
	DenseLayers int
	// Seed, combined with the rank by EffectiveSeed.
	Seed uint64
}

// String describes the spec in one line, e.g.
// "synthetic glm-4.7, rank 0/8, 2 layers (1 dense), seed 1".
func (s Spec) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "synthetic %s", s.Base)
	if s.Ranks > 0 {
		fmt.Fprintf(&b, ", rank %d/%d", s.Rank, s.Ranks)
	}
	if s.Layers == 1 {
		b.WriteString(", 1 layer")
	} else if s.Layers > 0 {
		fmt.Fprintf(&b, ", %d layers", s.Layers)
	}
	if s.Layers > 0 && s.DenseLayers >= 0 {
		fmt.Fprintf(&b, " (%d dense)", s.DenseLayers)
	} else if s.DenseLayers >= 0 {
		fmt.Fprintf(&b, ", %d dense layers", s.DenseLayers)
	}
	fmt.Fprintf(&b, ", seed %d", s.Seed)
	return b.String()
}

// Name is a short model name for the spec, e.g. "glm-4.7-synthetic-r0of8-l2"
// (the served model name).
func (s Spec) Name() string {
	n := s.Base + "-synthetic"
	if s.Ranks > 0 {
		n += fmt.Sprintf("-r%dof%d", s.Rank, s.Ranks)
	}
	if s.Layers > 0 {
		n += fmt.Sprintf("-l%d", s.Layers)
	}
	return n
}

// EffectiveSeed is the seed every value is generated from: the SplitMix64
// finalizer of Seed + γ·(Ranks<<32 | Rank) (γ = 0x9E3779B97F4A7C15), so
// different ranks of one deployment get different values. It is what
// glmrt_synthesize receives.
func (s Spec) EffectiveSeed() uint64 {
	return mix64(s.Seed + gamma*(uint64(uint32(s.Ranks))<<32|uint64(uint32(s.Rank))))
}

// ParseRank reads "r/N" (e.g. "0/8").
func ParseRank(v string) (rank, ranks int, err error) {
	a, b, ok := strings.Cut(strings.TrimSpace(v), "/")
	if ok {
		rank, err = strconv.Atoi(a)
		if err == nil {
			ranks, err = strconv.Atoi(b)
		}
	}
	if !ok || err != nil {
		return 0, 0, fmt.Errorf("--rank %q: want r/N, e.g. 0/8", v)
	}
	if ranks < 1 || rank < 0 || rank >= ranks {
		return 0, 0, fmt.Errorf("--rank %q: want 0 <= r < N", v)
	}
	return rank, ranks, nil
}

// Config derives the model configuration of the spec (docs/synthetic.md):
// the base config, with, for rank r of N, heads, KV heads, the dense
// intermediate size, routed experts and vocabulary divided by N, top-k
// max(1, round(k/N)) in one group, the shared expert whole; with Layers the
// first Layers layers; and no MTP layer. Errors name the flag and the limit.
func (s Spec) Config() (*model.Config, error) {
	b, err := s.ConfigJSON()
	if err != nil {
		return nil, err
	}
	cfg, err := model.ParseConfig(b)
	if err != nil {
		return nil, fmt.Errorf("%s: derived config: %w", s, err)
	}
	return cfg, nil
}

// ConfigJSON is the config.json of the spec: the base's document with the
// derived fields replaced (keys sorted, two-space indentation).
func (s Spec) ConfigJSON() ([]byte, error) {
	raw, err := BaseConfig(s.Base)
	if err != nil {
		return nil, err
	}
	base, err := model.ParseConfig(raw)
	if err != nil {
		return nil, fmt.Errorf("base config %s: %w", s.Base, err)
	}
	var doc map[string]any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("base config %s: %w", s.Base, err)
	}
	set := func(k string, v any) { doc[k] = v }

	layers := base.NumHiddenLayers
	if s.Layers < 0 || s.Layers > base.NumHiddenLayers {
		return nil, fmt.Errorf("--layers %d: must be in 1..%d (the layers of %s; 0 = all)", s.Layers, base.NumHiddenLayers, s.Base)
	}
	if s.Layers > 0 {
		layers = s.Layers
	}
	dense := min(base.FirstKDenseReplace, layers)
	if s.DenseLayers >= 0 {
		if s.DenseLayers > layers {
			return nil, fmt.Errorf("--dense-layers %d: more than the %d layers kept", s.DenseLayers, layers)
		}
		if s.DenseLayers > base.FirstKDenseReplace {
			return nil, fmt.Errorf("--dense-layers %d: %s has only %d dense layers", s.DenseLayers, s.Base, base.FirstKDenseReplace)
		}
		dense = s.DenseLayers
	}
	set("num_hidden_layers", layers)
	set("first_k_dense_replace", dense)
	set("num_nextn_predict_layers", 0)

	vocab := base.VocabSize
	if s.Ranks > 0 {
		n := s.Ranks
		if s.Rank < 0 || s.Rank >= n {
			return nil, fmt.Errorf("--rank %d/%d: the rank must be in 0..%d", s.Rank, n, n-1)
		}
		for _, d := range []struct {
			v    int
			what string
		}{
			{base.NumAttentionHeads, "attention heads"},
			{base.NumKeyValueHeads, "key-value heads"},
			{base.NRoutedExperts, "routed experts"},
			{base.VocabSize, "vocabulary entries"},
			{base.IntermediateSize, "dense intermediate rows"},
		} {
			if d.v%n != 0 {
				return nil, fmt.Errorf("--rank %d/%d: %d does not divide %d %s", s.Rank, n, n, d.v, d.what)
			}
		}
		if (base.IntermediateSize/n)%128 != 0 {
			return nil, fmt.Errorf("--rank %d/%d: the dense intermediate share %d is not a multiple of 128", s.Rank, n, base.IntermediateSize/n)
		}
		vocab = base.VocabSize / n
		set("num_attention_heads", base.NumAttentionHeads/n)
		set("num_key_value_heads", base.NumKeyValueHeads/n)
		set("intermediate_size", base.IntermediateSize/n)
		set("n_routed_experts", base.NRoutedExperts/n)
		set("num_experts_per_tok", max(1, int(math.Round(float64(base.NumExpertsPerTok)/float64(n)))))
		set("n_group", 1)
		set("topk_group", 1)
		set("vocab_size", vocab)
		set("n_shared_experts", 1)
	}
	// Special token ids outside a rank's vocabulary share do not exist there.
	var eos []int
	for _, id := range base.EOSTokenIDs {
		if id < vocab {
			eos = append(eos, id)
		}
	}
	if len(eos) > 0 {
		set("eos_token_id", eos)
	} else {
		delete(doc, "eos_token_id")
	}
	if base.PadTokenID != nil && *base.PadTokenID >= vocab {
		delete(doc, "pad_token_id")
	}
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("%s: encode config: %w", s, err)
	}
	return append(out, '\n'), nil
}

// GenerationConfigJSON is the generation_config.json written next to the
// config: the base's (docs/model.md §5.3) with the spec's stop ids.
func GenerationConfigJSON(cfg *model.Config) ([]byte, error) {
	doc := map[string]any{"_from_model_config": true, "temperature": 1.0, "transformers_version": "4.56.2"}
	if len(cfg.EOSTokenIDs) > 0 {
		doc["eos_token_id"] = []int(cfg.EOSTokenIDs)
	}
	if cfg.PadTokenID != nil {
		doc["pad_token_id"] = *cfg.PadTokenID
	}
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}
