package synth

import (
	"bytes"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/glmctl/glmctl/pkg/model"
)

// The embedded base config must stay the repository's copy of the real one.
func TestBaseConfigMatchesTestdata(t *testing.T) {
	want, err := os.ReadFile("../../testdata/glm-4.7-fp8/config.json")
	if err != nil {
		t.Fatal(err)
	}
	got, err := BaseConfig("glm-4.7")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Error("pkg/synth/glm-4.7.json differs from testdata/glm-4.7-fp8/config.json: copy it over")
	}
	if !slices.Equal(Bases(), []string{"glm-4.7"}) {
		t.Errorf("Bases() = %v", Bases())
	}
}

func TestConfigDerivation(t *testing.T) {
	type want struct {
		layers, dense, heads, kv, inter, experts, topk, vocab int
		eos                                                   []int
		pad                                                   bool
	}
	real := want{92, 3, 96, 8, 12288, 160, 8, 151552, []int{151329, 151336, 151338}, true}
	tests := []struct {
		name string
		spec Spec
		want want
		err  string
	}{
		{"whole model", Spec{Base: "glm-4.7", DenseLayers: -1}, real, ""},
		{"rank 0/8", Spec{Base: "glm-4.7", Rank: 0, Ranks: 8, DenseLayers: -1}, want{92, 3, 12, 1, 1536, 20, 1, 18944, nil, false}, ""},
		{"rank 7/8 same shapes", Spec{Base: "glm-4.7", Rank: 7, Ranks: 8, DenseLayers: -1}, want{92, 3, 12, 1, 1536, 20, 1, 18944, nil, false}, ""},
		{"rank 1/4", Spec{Base: "glm-4.7", Rank: 1, Ranks: 4, DenseLayers: -1}, want{92, 3, 24, 2, 3072, 40, 2, 37888, nil, false}, ""},
		{"rank 0/2", Spec{Base: "glm-4.7", Rank: 0, Ranks: 2, DenseLayers: -1}, want{92, 3, 48, 4, 6144, 80, 4, 75776, nil, false}, ""},
		{"rank 0/1", Spec{Base: "glm-4.7", Rank: 0, Ranks: 1, DenseLayers: -1}, real, ""},
		{"2 layers, default dense", Spec{Base: "glm-4.7", Rank: 0, Ranks: 8, Layers: 2, DenseLayers: -1}, want{2, 2, 12, 1, 1536, 20, 1, 18944, nil, false}, ""},
		{"2 layers, 1 dense", Spec{Base: "glm-4.7", Rank: 0, Ranks: 8, Layers: 2, DenseLayers: 1}, want{2, 1, 12, 1, 1536, 20, 1, 18944, nil, false}, ""},
		{"5 layers, all MoE", Spec{Base: "glm-4.7", Layers: 5, DenseLayers: 0}, want{5, 0, 96, 8, 12288, 160, 8, 151552, real.eos, true}, ""},
		{"unknown base", Spec{Base: "glm-5", DenseLayers: -1}, want{}, `--synthetic "glm-5": unknown base model (known: glm-4.7)`},
		{"7 ranks", Spec{Base: "glm-4.7", Rank: 3, Ranks: 7, DenseLayers: -1}, want{}, "--rank 3/7: 7 does not divide 96 attention heads"},
		{"3 ranks", Spec{Base: "glm-4.7", Rank: 0, Ranks: 3, DenseLayers: -1}, want{}, "--rank 0/3: 3 does not divide 8 key-value heads"},
		{"16 ranks", Spec{Base: "glm-4.7", Rank: 0, Ranks: 16, DenseLayers: -1}, want{}, "--rank 0/16: 16 does not divide 8 key-value heads"},
		{"rank out of range", Spec{Base: "glm-4.7", Rank: 8, Ranks: 8, DenseLayers: -1}, want{}, "--rank 8/8: the rank must be in 0..7"},
		{"too many layers", Spec{Base: "glm-4.7", Layers: 93, DenseLayers: -1}, want{}, "--layers 93: must be in 1..92"},
		{"negative layers", Spec{Base: "glm-4.7", Layers: -1, DenseLayers: -1}, want{}, "--layers -1"},
		{"dense above layers", Spec{Base: "glm-4.7", Layers: 2, DenseLayers: 3}, want{}, "--dense-layers 3: more than the 2 layers kept"},
		{"dense above the model's", Spec{Base: "glm-4.7", Layers: 10, DenseLayers: 4}, want{}, "--dense-layers 4: glm-4.7 has only 3 dense layers"},
	}
	for _, tt := range tests {
		cfg, err := tt.spec.Config()
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%s: error %v, want %q", tt.name, err, tt.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tt.name, err)
			continue
		}
		w := tt.want
		got := want{cfg.NumHiddenLayers, cfg.FirstKDenseReplace, cfg.NumAttentionHeads, cfg.NumKeyValueHeads, cfg.IntermediateSize,
			cfg.NRoutedExperts, cfg.NumExpertsPerTok, cfg.VocabSize, cfg.EOSTokenIDs, cfg.PadTokenID != nil}
		if got.layers != w.layers || got.dense != w.dense || got.heads != w.heads || got.kv != w.kv || got.inter != w.inter ||
			got.experts != w.experts || got.topk != w.topk || got.vocab != w.vocab || !slices.Equal(got.eos, w.eos) || got.pad != w.pad {
			t.Errorf("%s: got %+v, want %+v", tt.name, got, w)
		}
		// Unchanged under every spec: experts are whole, one shared expert,
		// one group, no MTP layer, the real quantization.
		if cfg.HiddenSize != 5120 || cfg.HeadDim != 128 || cfg.MoEIntermediateSize != 1536 || cfg.NSharedExperts != 1 ||
			cfg.NGroup != 1 || cfg.TopKGroup != 1 || cfg.NumNextNPredictLayers != 0 || cfg.PartialRotaryFactor != 0.5 ||
			cfg.MaxPositionEmbeddings != 202752 || cfg.RopeTheta != 1e6 || cfg.RMSNormEps != 1e-5 || cfg.RoutedScalingFactor != 2.5 {
			t.Errorf("%s: base fields changed: %+v", tt.name, cfg)
		}
		if q := cfg.Quantization; q == nil || q.WeightScheme().Strategy != model.StrategyChannel || !q.Ignored("lm_head") || !q.Ignored("model.layers.1.mlp.gate") {
			t.Errorf("%s: quantization_config %+v", tt.name, cfg.Quantization)
		}
	}
}

func TestConfigJSONIsTheConfig(t *testing.T) {
	spec := Spec{Base: "glm-4.7", Rank: 0, Ranks: 8, Layers: 2, DenseLayers: 1}
	b, err := spec.ConfigJSON()
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]any{"num_hidden_layers": 2.0, "first_k_dense_replace": 1.0, "vocab_size": 18944.0, "num_nextn_predict_layers": 0.0, "rms_norm_eps": 1e-5} {
		if doc[k] != v {
			t.Errorf("config.json %s = %v, want %v", k, doc[k], v)
		}
	}
	for _, k := range []string{"eos_token_id", "pad_token_id"} {
		if _, ok := doc[k]; ok {
			t.Errorf("config.json keeps %s outside the rank's vocabulary", k)
		}
	}
	if !strings.Contains(string(b), `"observer_kwargs": {}`) || !strings.Contains(string(b), `"quant_method": "compressed-tensors"`) {
		t.Error("config.json lost parts of quantization_config")
	}
	gen, err := GenerationConfigJSON(mustConfig(t, Spec{Base: "glm-4.7", DenseLayers: -1}))
	if err != nil || !strings.Contains(string(gen), `"eos_token_id": [`) || !strings.Contains(string(gen), `"pad_token_id": 151329`) {
		t.Errorf("generation_config.json of the whole model: %s, %v", gen, err)
	}
}

func TestParseRankAndSeeds(t *testing.T) {
	for _, tt := range []struct {
		in      string
		r, n    int
		wantErr string
	}{
		{"0/8", 0, 8, ""}, {" 7/8 ", 7, 8, ""}, {"0/1", 0, 1, ""},
		{"8/8", 0, 0, "want 0 <= r < N"}, {"-1/8", 0, 0, "want 0 <= r < N"}, {"0/0", 0, 0, "want 0 <= r < N"},
		{"3", 0, 0, "want r/N"}, {"a/8", 0, 0, "want r/N"}, {"", 0, 0, "want r/N"},
	} {
		r, n, err := ParseRank(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), "--rank") {
				t.Errorf("ParseRank(%q) = %d, %d, %v; want error %q", tt.in, r, n, err, tt.wantErr)
			}
			continue
		}
		if err != nil || r != tt.r || n != tt.n {
			t.Errorf("ParseRank(%q) = %d, %d, %v", tt.in, r, n, err)
		}
	}
	seen := map[uint64]string{}
	for _, s := range []Spec{
		{Base: "glm-4.7", Seed: 1}, {Base: "glm-4.7", Seed: 2}, {Base: "glm-4.7", Ranks: 8, Seed: 1},
		{Base: "glm-4.7", Rank: 1, Ranks: 8, Seed: 1}, {Base: "glm-4.7", Ranks: 4, Seed: 1},
	} {
		es := s.EffectiveSeed()
		if prev, ok := seen[es]; ok {
			t.Errorf("%v and %s share the effective seed %d", s, prev, es)
		}
		seen[es] = s.String()
		if s.EffectiveSeed() != es {
			t.Error("EffectiveSeed is not a function")
		}
	}
	// The layer count does not change the values (a shortened model is the
	// first layers of the long one).
	a := Spec{Base: "glm-4.7", Rank: 2, Ranks: 8, Seed: 9}
	b := a
	b.Layers, b.DenseLayers = 2, 1
	if a.EffectiveSeed() != b.EffectiveSeed() {
		t.Error("--layers changed the effective seed")
	}
	if got := (Spec{Base: "glm-4.7", Rank: 0, Ranks: 8, Layers: 2, DenseLayers: 1, Seed: 1}).String(); got != "synthetic glm-4.7, rank 0/8, 2 layers (1 dense), seed 1" {
		t.Errorf("String() = %q", got)
	}
	if got := (Spec{Base: "glm-4.7", Rank: 0, Ranks: 8, Layers: 2}).Name(); got != "glm-4.7-synthetic-r0of8-l2" {
		t.Errorf("Name() = %q", got)
	}
}

func mustConfig(t *testing.T, s Spec) *model.Config {
	t.Helper()
	cfg, err := s.Config()
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}
