package cuda

/*
#include "glmrt.h"
*/
import "C"

import (
	"fmt"
	"math"

	"github.com/glmctl/glmctl/pkg/model"
	"github.com/glmctl/glmctl/pkg/safetensors"
)

func b2i(b bool) C.int32_t {
	if b {
		return 1
	}
	return 0
}

// modelConfig converts config.json (already validated by pkg/model) to the
// ABI struct; every field is required there, so every one is set here.
func modelConfig(c *model.Config) C.glmrt_model_config {
	return C.glmrt_model_config{
		hidden_size:              C.int32_t(c.HiddenSize),
		num_hidden_layers:        C.int32_t(c.NumHiddenLayers),
		first_k_dense_replace:    C.int32_t(c.FirstKDenseReplace),
		num_attention_heads:      C.int32_t(c.NumAttentionHeads),
		num_key_value_heads:      C.int32_t(c.NumKeyValueHeads),
		head_dim:                 C.int32_t(c.HeadDim),
		partial_rotary_factor:    C.float(c.PartialRotaryFactor),
		intermediate_size:        C.int32_t(c.IntermediateSize),
		moe_intermediate_size:    C.int32_t(c.MoEIntermediateSize),
		n_routed_experts:         C.int32_t(c.NRoutedExperts),
		num_experts_per_tok:      C.int32_t(c.NumExpertsPerTok),
		n_group:                  C.int32_t(c.NGroup),
		topk_group:               C.int32_t(c.TopKGroup),
		n_shared_experts:         C.int32_t(c.NSharedExperts),
		routed_scaling_factor:    C.float(c.RoutedScalingFactor),
		norm_topk_prob:           b2i(c.NormTopKProb),
		vocab_size:               C.int32_t(c.VocabSize),
		max_position_embeddings:  C.int32_t(c.MaxPositionEmbeddings),
		rope_theta:               C.float(c.RopeTheta),
		rms_norm_eps:             C.float(c.RMSNormEps),
		num_nextn_predict_layers: C.int32_t(c.NumNextNPredictLayers),
		attention_bias:           b2i(c.AttentionBias),
		use_qk_norm:              b2i(c.UseQKNorm),
	}
}

// checkConfigRange refuses configs whose integers do not fit the ABI's int32
// fields (pkg/model validates semantics, not C widths).
func checkConfigRange(c *model.Config) error {
	fields := []struct {
		name string
		v    int
	}{
		{"hidden_size", c.HiddenSize}, {"num_hidden_layers", c.NumHiddenLayers},
		{"intermediate_size", c.IntermediateSize}, {"moe_intermediate_size", c.MoEIntermediateSize},
		{"vocab_size", c.VocabSize}, {"max_position_embeddings", c.MaxPositionEmbeddings},
		{"n_routed_experts", c.NRoutedExperts}, {"num_attention_heads", c.NumAttentionHeads},
	}
	for _, f := range fields {
		if f.v > math.MaxInt32 {
			return fmt.Errorf("config.json field %s: %d exceeds the CUDA runtime's int32 limit", f.name, f.v)
		}
	}
	return nil
}

// engineOptions converts Options, checking the int32 ranges of the ABI.
func engineOptions(o Options) (C.glmrt_engine_options, error) {
	var co C.glmrt_engine_options
	fields := []struct {
		name string
		v    int
		dst  *C.int32_t
	}{
		{"Device", o.Device, &co.device},
		{"TP", o.TP, &co.tensor_parallel},
		{"KVBlockSize", o.KVBlockSize, &co.kv_block_size},
		{"NumKVBlocks", o.NumKVBlocks, &co.num_kv_blocks},
		{"MaxTokensPerStep", o.MaxTokensPerStep, &co.max_tokens_per_step},
		{"MaxSeqs", o.MaxSeqs, &co.max_seqs_per_step},
		{"MaxPenaltyEntries", o.MaxPenaltyEntries, &co.max_penalty_entries},
		{"DraftTokens", o.DraftTokens, &co.draft_tokens},
	}
	for _, f := range fields {
		if f.v < 0 || f.v > math.MaxInt32 {
			return co, fmt.Errorf("cuda backend option %s: %d out of range [0, %d]", f.name, f.v, math.MaxInt32)
		}
		*f.dst = C.int32_t(f.v)
	}
	if o.MemoryBudget < 0 {
		return co, fmt.Errorf("cuda backend option MemoryBudget: %d must be >= 0 (0: free memory minus 1 GiB)", o.MemoryBudget)
	}
	co.memory_budget_bytes = C.int64_t(o.MemoryBudget)
	if o.Exact {
		co.exact_activations = 1
		co.fp32_cache_and_head = 1
	}
	if o.NoGraphs {
		co.disable_graphs = 1
	}
	if o.KVFP8 {
		if o.Exact {
			return co, fmt.Errorf("cuda backend option KVFP8: the FP8 KV cache is not the validation precision (Exact keeps an FP32 cache); choose one")
		}
		co.kv_cache_dtype = C.GLMRT_KV_FP8_E4M3
	}
	return co, nil
}

// abiDType maps a safetensors dtype to the ABI's; other dtypes have no
// place in a GLM-4.x checkpoint the runtime can run.
func abiDType(d safetensors.DType) (C.int32_t, bool) {
	switch d {
	case safetensors.F32:
		return C.GLMRT_DTYPE_F32, true
	case safetensors.BF16:
		return C.GLMRT_DTYPE_BF16, true
	case safetensors.F16:
		return C.GLMRT_DTYPE_F16, true
	case safetensors.F8_E4M3:
		return C.GLMRT_DTYPE_F8_E4M3, true
	}
	return 0, false
}

// RuntimeInfo is what the CUDA runtime reported after loading (glmrt_info).
type RuntimeInfo struct {
	LibPath           string
	ABIVersion        int
	Device            string
	TensorParallel    int
	KVBlockSize       int
	NumKVBlocks       int
	MaxTokensPerStep  int
	MaxSeqsPerStep    int
	MaxBlocksPerSeq   int
	MaxTopLogprobs    int
	MaxPenaltyEntries int
	VocabSize         int
	MaxDraftTokens    int   // the MTP draft model's tokens per step (0: not loaded)
	WeightBytes       int64 // device bytes per GPU (GPU 0)
	KVBytes           int64
	WorkspaceBytes    int64
}

func runtimeInfo(path string, i C.glmrt_info) RuntimeInfo {
	return RuntimeInfo{
		LibPath:           path,
		ABIVersion:        int(i.abi_version),
		Device:            C.GoString(&i.device_name[0]),
		TensorParallel:    int(i.tensor_parallel),
		KVBlockSize:       int(i.kv_block_size),
		NumKVBlocks:       int(i.num_kv_blocks),
		MaxTokensPerStep:  int(i.max_tokens_per_step),
		MaxSeqsPerStep:    int(i.max_seqs_per_step),
		MaxBlocksPerSeq:   int(i.max_blocks_per_seq),
		MaxTopLogprobs:    int(i.max_top_logprobs),
		MaxPenaltyEntries: int(i.max_penalty_entries),
		VocabSize:         int(i.vocab_size),
		MaxDraftTokens:    int(i.max_draft_tokens),
		WeightBytes:       int64(i.weight_bytes),
		KVBytes:           int64(i.kv_bytes),
		WorkspaceBytes:    int64(i.workspace_bytes),
	}
}

// check refuses an info block the Go side cannot work with, naming the field.
func (r RuntimeInfo) check(cfg *model.Config) error {
	switch {
	case r.ABIVersion != ABIVersion:
		return fmt.Errorf("glmrt_get_info: abi_version %d, want %d", r.ABIVersion, ABIVersion)
	case r.KVBlockSize <= 0:
		return fmt.Errorf("glmrt_get_info: kv_block_size %d must be > 0", r.KVBlockSize)
	case r.NumKVBlocks <= 0:
		return fmt.Errorf("glmrt_get_info: num_kv_blocks %d must be > 0 (memory budget too small for any KV cache?)", r.NumKVBlocks)
	case r.MaxTokensPerStep <= 0 || r.MaxSeqsPerStep <= 0:
		return fmt.Errorf("glmrt_get_info: max_tokens_per_step %d / max_seqs_per_step %d must be > 0", r.MaxTokensPerStep, r.MaxSeqsPerStep)
	case r.VocabSize != cfg.VocabSize:
		return fmt.Errorf("glmrt_get_info: vocab_size %d, config.json says %d", r.VocabSize, cfg.VocabSize)
	case r.MaxTopLogprobs < 0 || r.MaxTopLogprobs > MaxTopLogprobs:
		return fmt.Errorf("glmrt_get_info: max_top_logprobs %d out of [0, %d]", r.MaxTopLogprobs, MaxTopLogprobs)
	}
	return nil
}

// Aliases that let cgo-free files name the C types they pass along.
type (
	cInfo  = C.glmrt_info
	cInt64 = C.int64_t
)
