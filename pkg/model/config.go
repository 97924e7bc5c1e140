// Package model knows the GLM-4.x MoE architecture: config.json and its
// quantization_config, the checkpoint's tensor naming, binding tensors to the
// model structure, and parameter / memory accounting. It knows nothing about
// how tensors are stored (pkg/safetensors) or computed (backends).
package model

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Config is the Glm4Moe config.json (docs/model.md §1.1). Unknown keys are
// ignored; Validate rejects values the architecture cannot run.
type Config struct {
	Architectures         []string    `json:"architectures"`
	ModelType             string      `json:"model_type"`
	AttentionBias         bool        `json:"attention_bias"`
	AttentionDropout      float64     `json:"attention_dropout"`
	HeadDim               int         `json:"head_dim"`
	HiddenAct             string      `json:"hidden_act"`
	HiddenSize            int         `json:"hidden_size"`
	IntermediateSize      int         `json:"intermediate_size"`
	MaxPositionEmbeddings int         `json:"max_position_embeddings"`
	MoEIntermediateSize   int         `json:"moe_intermediate_size"`
	NormTopKProb          bool        `json:"norm_topk_prob"`
	ScoringFunc           string      `json:"scoring_func"`
	NumAttentionHeads     int         `json:"num_attention_heads"`
	NGroup                int         `json:"n_group"`
	TopKGroup             int         `json:"topk_group"`
	NRoutedExperts        int         `json:"n_routed_experts"`
	NSharedExperts        int         `json:"n_shared_experts"`
	RoutedScalingFactor   float64     `json:"routed_scaling_factor"`
	TopKMethod            string      `json:"topk_method"`
	MoERouterDType        string      `json:"moe_router_dtype"`
	NumExpertsPerTok      int         `json:"num_experts_per_tok"`
	FirstKDenseReplace    int         `json:"first_k_dense_replace"`
	UseQKNorm             bool        `json:"use_qk_norm"`
	NumHiddenLayers       int         `json:"num_hidden_layers"`
	NumKeyValueHeads      int         `json:"num_key_value_heads"`
	NumNextNPredictLayers int         `json:"num_nextn_predict_layers"`
	PartialRotaryFactor   float64     `json:"partial_rotary_factor"`
	RMSNormEps            float64     `json:"rms_norm_eps"`
	RopeTheta             float64     `json:"rope_theta"`
	RopeScaling           any         `json:"rope_scaling"`
	RopeParameters        *RopeParams `json:"rope_parameters,omitempty"`
	TieWordEmbeddings     bool        `json:"tie_word_embeddings"`
	TorchDType            string      `json:"torch_dtype"`
	VocabSize             int         `json:"vocab_size"`
	TransformersVersion   string      `json:"transformers_version"`
	EOSTokenIDs           TokenIDList `json:"eos_token_id"`
	PadTokenID            *int        `json:"pad_token_id"`
	BOSTokenID            *int        `json:"bos_token_id"`

	Quantization *QuantConfig `json:"quantization_config,omitempty"`
}

// RopeParams is the transformers v5 rope_parameters block; when present its
// values take precedence over the legacy top-level fields.
type RopeParams struct {
	RopeType            string  `json:"rope_type"`
	RopeTheta           float64 `json:"rope_theta"`
	PartialRotaryFactor float64 `json:"partial_rotary_factor"`
}

// TokenIDList accepts either a single integer or a list of integers, as HF
// configs write eos_token_id both ways.
type TokenIDList []int

// UnmarshalJSON implements json.Unmarshaler.
func (l *TokenIDList) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*l = nil
		return nil
	}
	var one int
	if err := json.Unmarshal(b, &one); err == nil {
		*l = TokenIDList{one}
		return nil
	}
	var many []int
	if err := json.Unmarshal(b, &many); err != nil {
		return fmt.Errorf("want an integer or a list of integers: %w", err)
	}
	*l = many
	return nil
}

// ConfigFile is the file name of the model configuration in a model directory.
const ConfigFile = "config.json"

// LoadConfig reads and validates dir/config.json.
func LoadConfig(dir string) (*Config, error) {
	path := filepath.Join(dir, ConfigFile)
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read model config: %w", err)
	}
	c, err := ParseConfig(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// ParseConfig decodes and validates a config.json document.
func ParseConfig(b []byte) (*Config, error) {
	c := &Config{}
	if err := json.Unmarshal(b, c); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return nil, fmt.Errorf("field %q: want %s, got JSON %s", te.Field, te.Type, te.Value)
		}
		return nil, fmt.Errorf("parse config JSON: %w", err)
	}
	c.applyDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// applyDefaults fills fields that transformers defaults when absent.
func (c *Config) applyDefaults() {
	if c.RopeParameters != nil {
		if c.RopeParameters.RopeTheta > 0 {
			c.RopeTheta = c.RopeParameters.RopeTheta
		}
		if c.RopeParameters.PartialRotaryFactor > 0 {
			c.PartialRotaryFactor = c.RopeParameters.PartialRotaryFactor
		}
	}
	if c.HeadDim == 0 && c.NumAttentionHeads > 0 {
		c.HeadDim = c.HiddenSize / c.NumAttentionHeads
	}
	if c.PartialRotaryFactor == 0 {
		c.PartialRotaryFactor = 0.5 // Glm4MoeConfig default
	}
	if c.RopeTheta == 0 {
		c.RopeTheta = 10000 // Glm4MoeConfig default
	}
	if c.RMSNormEps == 0 {
		c.RMSNormEps = 1e-5
	}
	if c.NGroup == 0 {
		c.NGroup = 1
	}
	if c.TopKGroup == 0 {
		c.TopKGroup = 1
	}
	if c.RoutedScalingFactor == 0 {
		c.RoutedScalingFactor = 1
	}
	if c.HiddenAct == "" {
		c.HiddenAct = "silu"
	}
}

// Validate rejects configurations the GLM-4.x MoE forward cannot run, naming
// the offending field.
func (c *Config) Validate() error {
	if c.ModelType != "" && c.ModelType != "glm4_moe" {
		return fmt.Errorf("field model_type: %q is not supported (want glm4_moe)", c.ModelType)
	}
	pos := []struct {
		name string
		v    int
	}{
		{"hidden_size", c.HiddenSize},
		{"num_hidden_layers", c.NumHiddenLayers},
		{"num_attention_heads", c.NumAttentionHeads},
		{"num_key_value_heads", c.NumKeyValueHeads},
		{"head_dim", c.HeadDim},
		{"intermediate_size", c.IntermediateSize},
		{"vocab_size", c.VocabSize},
		{"max_position_embeddings", c.MaxPositionEmbeddings},
	}
	for _, p := range pos {
		if p.v <= 0 {
			return fmt.Errorf("field %s: must be > 0, got %d", p.name, p.v)
		}
	}
	if c.NumAttentionHeads%c.NumKeyValueHeads != 0 {
		return fmt.Errorf("field num_key_value_heads: %d does not divide num_attention_heads %d", c.NumKeyValueHeads, c.NumAttentionHeads)
	}
	if c.HiddenAct != "silu" {
		return fmt.Errorf("field hidden_act: %q is not supported (want silu)", c.HiddenAct)
	}
	if c.PartialRotaryFactor <= 0 || c.PartialRotaryFactor > 1 {
		return fmt.Errorf("field partial_rotary_factor: %g must be in (0, 1]", c.PartialRotaryFactor)
	}
	rd := c.RotaryDim()
	if rd <= 0 || rd%2 != 0 {
		return fmt.Errorf("field partial_rotary_factor: rotary dim head_dim*factor = %d must be even and > 0", rd)
	}
	if c.RopeTheta <= 0 {
		return fmt.Errorf("field rope_theta: must be > 0, got %g", c.RopeTheta)
	}
	if c.RopeScaling != nil {
		return fmt.Errorf("field rope_scaling: only null is supported, got %v", c.RopeScaling)
	}
	if c.RopeParameters != nil && c.RopeParameters.RopeType != "" && c.RopeParameters.RopeType != "default" {
		return fmt.Errorf("field rope_parameters.rope_type: %q is not supported (want default)", c.RopeParameters.RopeType)
	}
	if c.RMSNormEps <= 0 || c.RMSNormEps > 1e-2 {
		return fmt.Errorf("field rms_norm_eps: %g out of range (0, 1e-2]", c.RMSNormEps)
	}
	if c.TieWordEmbeddings {
		return fmt.Errorf("field tie_word_embeddings: true is not supported (GLM-4.x has a separate lm_head)")
	}
	if c.FirstKDenseReplace < 0 || c.FirstKDenseReplace > c.NumHiddenLayers {
		return fmt.Errorf("field first_k_dense_replace: %d out of range [0, num_hidden_layers=%d]", c.FirstKDenseReplace, c.NumHiddenLayers)
	}
	if c.NumNextNPredictLayers < 0 {
		return fmt.Errorf("field num_nextn_predict_layers: must be >= 0, got %d", c.NumNextNPredictLayers)
	}
	if c.NumMoELayers() > 0 || c.NumNextNPredictLayers > 0 {
		if err := c.validateMoE(); err != nil {
			return err
		}
	}
	for _, id := range c.EOSTokenIDs {
		if id < 0 || id >= c.VocabSize {
			return fmt.Errorf("field eos_token_id: %d outside vocab [0, %d)", id, c.VocabSize)
		}
	}
	if c.PadTokenID != nil && (*c.PadTokenID < 0 || *c.PadTokenID >= c.VocabSize) {
		return fmt.Errorf("field pad_token_id: %d outside vocab [0, %d)", *c.PadTokenID, c.VocabSize)
	}
	if c.Quantization != nil {
		if err := c.Quantization.Validate(); err != nil {
			return fmt.Errorf("field quantization_config: %w", err)
		}
	}
	return nil
}

func (c *Config) validateMoE() error {
	if c.NRoutedExperts <= 0 {
		return fmt.Errorf("field n_routed_experts: must be > 0, got %d", c.NRoutedExperts)
	}
	if c.MoEIntermediateSize <= 0 {
		return fmt.Errorf("field moe_intermediate_size: must be > 0, got %d", c.MoEIntermediateSize)
	}
	if c.NumExpertsPerTok <= 0 || c.NumExpertsPerTok > c.NRoutedExperts {
		return fmt.Errorf("field num_experts_per_tok: %d out of range [1, n_routed_experts=%d]", c.NumExpertsPerTok, c.NRoutedExperts)
	}
	if c.NSharedExperts < 0 {
		return fmt.Errorf("field n_shared_experts: must be >= 0, got %d", c.NSharedExperts)
	}
	if c.NGroup <= 0 || c.NRoutedExperts%c.NGroup != 0 {
		return fmt.Errorf("field n_group: %d must be > 0 and divide n_routed_experts %d", c.NGroup, c.NRoutedExperts)
	}
	if c.TopKGroup <= 0 || c.TopKGroup > c.NGroup {
		return fmt.Errorf("field topk_group: %d out of range [1, n_group=%d]", c.TopKGroup, c.NGroup)
	}
	perGroup := c.NRoutedExperts / c.NGroup
	if c.NGroup > 1 && perGroup < 2 {
		return fmt.Errorf("field n_group: %d groups leave %d expert(s) per group; group scores need >= 2", c.NGroup, perGroup)
	}
	if c.NumExpertsPerTok > c.TopKGroup*perGroup {
		return fmt.Errorf("field num_experts_per_tok: %d exceeds the %d experts in topk_group=%d groups", c.NumExpertsPerTok, c.TopKGroup*perGroup, c.TopKGroup)
	}
	if c.RoutedScalingFactor <= 0 {
		return fmt.Errorf("field routed_scaling_factor: must be > 0, got %g", c.RoutedScalingFactor)
	}
	if c.ScoringFunc != "" && c.ScoringFunc != "sigmoid" {
		return fmt.Errorf("field scoring_func: %q is not supported (want sigmoid)", c.ScoringFunc)
	}
	if c.TopKMethod != "" && c.TopKMethod != "noaux_tc" {
		return fmt.Errorf("field topk_method: %q is not supported (want noaux_tc)", c.TopKMethod)
	}
	return nil
}

// RotaryDim is the number of leading head dims that RoPE rotates.
func (c *Config) RotaryDim() int { return int(float64(c.HeadDim) * c.PartialRotaryFactor) }

// QueryDim is the width of the q projection output (heads × head_dim).
func (c *Config) QueryDim() int { return c.NumAttentionHeads * c.HeadDim }

// KVDim is the width of the k and v projection outputs.
func (c *Config) KVDim() int { return c.NumKeyValueHeads * c.HeadDim }

// IsMoELayer reports whether decoder layer l uses the MoE block. The MTP
// layers (index >= num_hidden_layers) are MoE layers too.
func (c *Config) IsMoELayer(l int) bool { return l >= c.FirstKDenseReplace }

// NumMoELayers is the number of MoE layers in the main model.
func (c *Config) NumMoELayers() int { return c.NumHiddenLayers - c.FirstKDenseReplace }

// NumDenseLayers is the number of dense-MLP layers in the main model.
func (c *Config) NumDenseLayers() int { return c.FirstKDenseReplace }

// SharedIntermediateSize is the shared expert's intermediate width.
func (c *Config) SharedIntermediateSize() int { return c.MoEIntermediateSize * c.NSharedExperts }

// KVBytesPerToken is the KV cache size of one token over all main-model
// layers at the given element size (2 for BF16, 1 for FP8).
func (c *Config) KVBytesPerToken(elemBytes int) int64 {
	return int64(c.NumHiddenLayers) * 2 * int64(c.KVDim()) * int64(elemBytes)
}
