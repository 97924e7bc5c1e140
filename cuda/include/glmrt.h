/*
 * glmrt.h — the whole C ABI of libglmcuda.so, the CUDA runtime of glmctl.
 *
 * Contract (docs/architecture.md, design rules and step contract):
 *   - Plain C, every symbol prefixed glmrt_. Check glmrt_abi_version() ==
 *     GLMRT_ABI_VERSION right after dlopen; any change to a struct or a
 *     signature below bumps GLMRT_ABI_VERSION.
 *   - Handles, not globals: several engines may live in one process.
 *   - Every call returns an int status (GLMRT_OK == 0). On failure the text of
 *     the error (naming the tensor, field or limit) is available from
 *     glmrt_last_error() on the SAME OS thread until the next glmrt_ call on
 *     that thread. Go callers: runtime.LockOSThread() around the call and the
 *     error fetch, or copy the message before anything else.
 *   - No pointer passed in is kept past the call that received it.
 *   - One engine is driven by one thread at a time (calls on one engine are
 *     not concurrent); distinct engines are independent.
 *
 * Life cycle:
 *   glmrt_engine_create(config, options)     allocate weights, KV pool, workspaces
 *   glmrt_load_tensor(...) for every tensor  checkpoint names, host pointers
 *     or glmrt_synthesize(seed)              every tensor generated on the GPU
 *   glmrt_finalize()                         checks every needed tensor arrived
 *   glmrt_step(batch, result) repeatedly     one call per scheduler step, or
 *     glmrt_step_begin(batch) then            the same step in two calls: the
 *     glmrt_step_finish(masks, result)        forward runs on the GPU while the
 *                                             caller computes the token masks
 *   glmrt_engine_destroy()
 */
#ifndef GLMRT_H
#define GLMRT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GLMRT_ABI_VERSION 10

/* Status codes. */
#define GLMRT_OK 0
#define GLMRT_ERR_INVALID 1  /* bad argument, unknown/mis-shaped tensor, limit exceeded */
#define GLMRT_ERR_CUDA 2     /* a CUDA, cuBLAS or NCCL call failed */
#define GLMRT_ERR_OOM 3      /* not enough device (or pinned host) memory */
#define GLMRT_ERR_STATE 4    /* call out of order (step before finalize, ...) */

/* Tensor element types, as in safetensors headers. */
#define GLMRT_DTYPE_F32 0
#define GLMRT_DTYPE_BF16 1
#define GLMRT_DTYPE_F16 2
#define GLMRT_DTYPE_F8_E4M3 3

/* The model: the config.json fields of Glm4MoeForCausalLM (docs/model.md §1).
 * Every field is required; there are no defaults. */
typedef struct glmrt_model_config {
  int32_t hidden_size;             /* 5120 */
  int32_t num_hidden_layers;       /* 92 (the MTP layer, if any, is index num_hidden_layers) */
  int32_t first_k_dense_replace;   /* 3: layers [0, k) are dense MLP, the rest MoE */
  int32_t num_attention_heads;     /* 96 */
  int32_t num_key_value_heads;     /* 8 */
  int32_t head_dim;                /* 128 (the only value this runtime supports) */
  float partial_rotary_factor;     /* 0.5: RoPE on the first head_dim*factor dims */
  int32_t intermediate_size;       /* 12288: dense MLP */
  int32_t moe_intermediate_size;   /* 1536: each routed / shared expert */
  int32_t n_routed_experts;        /* 160 */
  int32_t num_experts_per_tok;     /* 8 */
  int32_t n_group;                 /* 1: expert groups for group-limited top-k */
  int32_t topk_group;              /* 1: groups kept */
  int32_t n_shared_experts;        /* 1 (0 or 1 supported) */
  float routed_scaling_factor;     /* 2.5 */
  int32_t norm_topk_prob;          /* 1: renormalise the top-k weights */
  int32_t vocab_size;              /* 151552 */
  int32_t max_position_embeddings; /* 202752 */
  float rope_theta;                /* 1e6 */
  float rms_norm_eps;              /* 1e-5 */
  int32_t num_nextn_predict_layers;/* 1: MTP layers present in the checkpoint */
  int32_t attention_bias;          /* 1: q/k/v projections carry biases */
  int32_t use_qk_norm;             /* 1: per-head RMSNorm on q and k before RoPE */
} glmrt_model_config;

/* How to run it. Zero means "default" where a default is named. */
typedef struct glmrt_engine_options {
  int32_t device;              /* first CUDA device ordinal */
  int32_t tensor_parallel;     /* GPUs used: devices device .. device+tp-1 (0 -> 1) */
  int32_t kv_block_size;       /* tokens per KV block (0 -> 16; 1..1024) */
  int32_t num_kv_blocks;       /* >0: exactly this many blocks; 0: as many as the budget allows */
  int64_t memory_budget_bytes; /* per GPU, everything the engine allocates (weights, workspaces,
                                  KV); 0 -> free device memory at create minus 1 GiB */
  int32_t max_tokens_per_step; /* most new tokens in one step (0 -> 8192) */
  int32_t max_seqs_per_step;   /* most sequences in one step (0 -> 256) */
  int32_t max_penalty_entries; /* most penalty entries in one step (0 -> max_seqs * 4096) */
  int32_t exact_activations;   /* 0: per-token dynamic FP8 activations, FP8 tensor-core GEMMs
                                  (the real path). 1: exactness check: no activation
                                  quantization, FP32 activations times the dequantized FP8
                                  weights on CUDA cores (slow; to compare with float32
                                  references such as the transformers golden files) */
  int32_t fp32_cache_and_head; /* 0: BF16 KV cache, lm_head BF16 x BF16 (the real path).
                                  1: validation precision: FP32 KV cache (twice the bytes per
                                  block) and an FP32 lm_head on the FP32 normed hidden state */
  int32_t disable_graphs;      /* 0: steps whose sequences all decode one token are captured
                                  once per batch-size bucket as CUDA graphs and replayed;
                                  1: every kernel is launched every step */
  int32_t draft_tokens;        /* 0: no speculative decoding. 1 .. GLMRT_MAX_DRAFT_TOKENS: load
                                  the checkpoint's MTP layer (num_nextn_predict_layers 1) as the
                                  draft model: a sequence may verify up to draft_tokens drafts and
                                  propose as many per step, the MTP layer chained on its own
                                  output past the first (docs/speculative.md). Needs
                                  tensor_parallel 1, a MoE model and the real path
                                  (exact_activations and fp32_cache_and_head 0); more than 1 needs
                                  kv_block_size a multiple of 16 */
  int32_t kv_cache_dtype;      /* GLMRT_KV_AUTO (0): BF16 (FP32 with fp32_cache_and_head);
                                  GLMRT_KV_FP8_E4M3: e4m3 codes with an FP32 scale per (token,
                                  KV head), amax / 448 -- about half the bytes per block. Needs
                                  the real path (exact_activations and fp32_cache_and_head 0),
                                  kv_block_size 16, head_dim 128 and at most 16 query heads per
                                  KV head (docs/cuda.md, "The FP8 KV cache") */
  int32_t reserved[2];         /* must be zero */
} glmrt_engine_options;

#define GLMRT_KV_AUTO 0
#define GLMRT_KV_FP8_E4M3 1

/* What the engine became (glmrt_get_info). */
typedef struct glmrt_info {
  int32_t abi_version;
  int32_t tensor_parallel;
  int32_t kv_block_size;
  int32_t num_kv_blocks;       /* block ids are 0 .. num_kv_blocks-1 */
  int32_t max_tokens_per_step;
  int32_t max_seqs_per_step;
  int32_t max_blocks_per_seq;  /* ceil(max_position_embeddings / kv_block_size) */
  int32_t max_top_logprobs;    /* GLMRT_MAX_TOP_LOGPROBS */
  int32_t max_penalty_entries;
  int32_t vocab_size;
  int32_t max_draft_tokens;    /* options.draft_tokens: 0 when no draft model is loaded */
  int64_t weight_bytes;        /* device bytes per GPU (GPU 0) */
  int64_t kv_bytes;
  int64_t workspace_bytes;
  char device_name[128];       /* e.g. "NVIDIA H200 (sm_90, 139 GiB) x1" */
} glmrt_info;

#define GLMRT_MAX_TOP_LOGPROBS 20
#define GLMRT_MAX_DRAFT_TOKENS 8

/* Sampling parameters of one sequence (OpenAI/vLLM semantics, docs/engine.md). */
typedef struct glmrt_sampling {
  float temperature;        /* <= 0: greedy (argmax, ties -> lowest id) */
  int32_t top_k;            /* <= 0 or >= vocab: off */
  float top_p;              /* <= 0 or >= 1: off */
  float min_p;              /* <= 0: off */
  float repetition_penalty; /* 0 or 1: off; prompt+output tokens */
  float frequency_penalty;  /* output tokens only */
  float presence_penalty;   /* output tokens only */
  int32_t n_top_logprobs;   /* 0 .. GLMRT_MAX_TOP_LOGPROBS alternatives to return */
  uint64_t seed;            /* the request's seed (Go int64 bits); the engine picks one if unset */
  int64_t sample_index;     /* tokens generated before this one; keys the RNG with seed */
} glmrt_sampling;

/* One sequence's share of a step. Its new tokens are the next n_tokens entries
 * of glmrt_batch.token_ids (sequences in order), at positions
 * start_pos .. start_pos+n_tokens-1. Position p lives in KV block
 * block_tables[block_table_offset + p / kv_block_size], slot p % kv_block_size;
 * the table must cover start_pos+n_tokens positions. */
typedef struct glmrt_seq {
  int32_t n_tokens;           /* >= 1 */
  int32_t start_pos;          /* >= 0 */
  int32_t block_table_offset; /* into glmrt_batch.block_tables */
  int32_t block_table_len;    /* entries of this sequence's table */
  int32_t sample;             /* 1: sample the token after the last new token */
  int32_t want_logits;        /* 1: copy the last position's logits into glmrt_result.logits */
  int32_t penalty_offset;     /* into glmrt_batch.penalty_* */
  int32_t penalty_len;        /* distinct tokens of this sequence's history (0 if no penalty) */
  int32_t mask_index;         /* -1: every token allowed; else the row of glmrt_batch.token_masks
                                 that limits this sample (sample == 1 only) */
  glmrt_sampling sampling;    /* read only when sample == 1 */
  /* Speculative decoding (engine option draft_tokens > 0; docs/speculative.md).
   * None of these goes with want_logits or a token mask. */
  int32_t n_drafts;           /* the last n_drafts new tokens are drafts to verify (sample == 1,
                                 < n_tokens, <= draft_tokens): the target samples after each of
                                 the last n_drafts+1 positions (sample_index + j for the j-th),
                                 accepts drafts while the rule accepts them, and returns them in
                                 glmrt_result.accepted, then tokens[s] */
  int32_t draft;              /* 1: run the MTP layer over this step's positions (its KV cache
                                 follows the sequence) */
  int32_t next_token;         /* draft == 1 and sample == 0: the token after the last new token
                                 (the MTP input at that position), or -1 if unknown */
  int32_t propose;            /* draft == 1 and sample == 1: draft tokens to propose after the
                                 sampled token (0 .. draft_tokens), in glmrt_result.drafts */
} glmrt_seq;

/* The flat description of one step (docs/architecture.md, step contract). */
typedef struct glmrt_batch {
  int32_t n_seqs;                    /* 1 .. max_seqs_per_step */
  int32_t n_tokens;                  /* sum of seqs[i].n_tokens, <= max_tokens_per_step */
  const glmrt_seq* seqs;             /* [n_seqs] */
  const int32_t* token_ids;          /* [n_tokens], each in [0, vocab_size) */
  const int32_t* block_tables;       /* [n_block_table_entries], each in [0, num_kv_blocks) */
  int32_t n_block_table_entries;
  /* Penalty history, one entry per DISTINCT token of a sequence's history
   * (ids unique within a sequence's range): the repetition penalty applies to
   * tokens with prompt_count + output_count > 0, the frequency and presence
   * penalties use output_count. NULL when n_penalty_entries == 0. */
  const int32_t* penalty_tokens;
  const int32_t* penalty_prompt_counts;
  const int32_t* penalty_output_counts;
  int32_t n_penalty_entries;
  /* Token masks of constrained sequences (structured outputs): row r is
   * token_masks[r * mask_words .. +mask_words), bit t % 32 of word t / 32 set
   * when token t may be sampled; mask_words = ceil(vocab_size / 32). The
   * sampler sets the others to -Inf after the penalties; logprobs stay those
   * of the raw logits. NULL when n_token_masks == 0. */
  const uint32_t* token_masks;
  int32_t n_token_masks;             /* rows, <= max_seqs_per_step */
  int32_t mask_words;
} glmrt_batch;

/* Caller-owned output buffers, filled by glmrt_step. */
typedef struct glmrt_result {
  int32_t* tokens;       /* [n_seqs]: sampled id, -1 where sample == 0 */
  float* logprobs;       /* [n_seqs]: log-softmax of the raw logits at the sampled id (NaN if none) */
  int32_t* top_ids;      /* [n_seqs * top_stride]: top alternatives by raw logit, best first;
                            -1 past n_top_logprobs. NULL allowed if no seq asks for any. */
  float* top_logprobs;   /* [n_seqs * top_stride] */
  int32_t top_stride;    /* >= every n_top_logprobs in the batch */
  float* logits;         /* [rows * vocab_size]: one row per want_logits seq, in seq order;
                            NULL allowed if none wants logits */
  int64_t logits_capacity; /* floats available at logits */
  int32_t* sample_status;  /* [n_seqs], or NULL: GLMRT_SAMPLE_OK, or why this sequence could not be
                              sampled (then tokens[s] = -1, logprobs[s] = NaN and the step still
                              succeeds for the others); with NULL such a sequence fails the whole
                              step with GLMRT_ERR_INVALID. Set for every seq (OK where sample == 0). */
  /* Speculative decoding; all NULL / 0 allowed when no seq has n_drafts or propose. */
  int32_t draft_stride;          /* >= every n_drafts and propose of the batch */
  int32_t* n_accepted;           /* [n_seqs]: drafts accepted (0 where n_drafts == 0) */
  int32_t* accepted;             /* [n_seqs * draft_stride]: the accepted drafts, in order */
  float* accepted_logprobs;      /* [n_seqs * draft_stride]: their logprobs (raw logits) */
  int32_t* accepted_top_ids;     /* [n_seqs * draft_stride * top_stride]: their top alternatives;
                                    NULL allowed if no verifying seq asks for any */
  float* accepted_top_logprobs;  /* same shape */
  int32_t* drafts;               /* [n_seqs * draft_stride]: the proposals after tokens[s]
                                    (propose of them, -1 after) */
} glmrt_result;

/* glmrt_result.sample_status values. */
#define GLMRT_SAMPLE_OK 0
#define GLMRT_SAMPLE_NONFINITE 1          /* a logit is NaN or +Inf */
#define GLMRT_SAMPLE_ALL_NEG_INF 2        /* every logit is -Inf */
#define GLMRT_SAMPLE_ALL_NEG_INF_PENALTY 3 /* every logit is -Inf after the penalties */
#define GLMRT_SAMPLE_NONE_LEFT 4          /* top-k / top-p / min-p left no token */
#define GLMRT_SAMPLE_MASKED_ALL 5         /* the token mask allows no token with a finite logit */

typedef struct glmrt_engine glmrt_engine;

int glmrt_abi_version(void);

/* Text of the last failure on this thread ("" if none). Valid until the next
 * glmrt_ call on this thread. */
const char* glmrt_last_error(void);

/* Number of visible CUDA devices (0 with no driver/GPU: returns GLMRT_ERR_CUDA and a message). */
int glmrt_device_count(int32_t* out);

int glmrt_engine_create(const glmrt_model_config* config, const glmrt_engine_options* options,
                        glmrt_engine** out);

int glmrt_get_info(const glmrt_engine* engine, glmrt_info* out);

/* Hand over one checkpoint tensor by its checkpoint name (docs/model.md §2.2),
 * e.g. "model.layers.3.mlp.experts.17.up_proj.weight". data points at nbytes
 * bytes of little-endian elements (an mmap of the shard is fine); they are
 * copied (and fused / sharded / converted) before the call returns. Unknown
 * names, wrong dtypes, wrong shapes and duplicates are errors naming the
 * tensor. MTP tensors (layer index num_hidden_layers) are checked and skipped
 * unless options.draft_tokens > 0, which loads them (all but the layer's own
 * embed_tokens and shared_head.head copies: the main ones serve). */
int glmrt_load_tensor(glmrt_engine* engine, const char* name, int32_t dtype, const int64_t* shape,
                      int32_t ndim, const void* data, uint64_t nbytes);

/* Check that every tensor the forward needs has been loaded (names the first
 * missing one) and make the engine ready to step. */
int glmrt_finalize(glmrt_engine* engine);

/* Run one forward step over the batch and sample. Blocks until the results are
 * in the caller's buffers. The KV blocks named in the block tables are read
 * and the slots of the new tokens written. Equivalent to glmrt_step_begin
 * followed by glmrt_step_finish with batch->token_masks. */
int glmrt_step(glmrt_engine* engine, const glmrt_batch* batch, glmrt_result* result);

/* The same step in two calls, so that the caller can compute the token masks
 * of constrained sequences (structured outputs: a grammar engine on the CPU)
 * while the GPU runs the forward.
 *
 * glmrt_step_begin checks and packs the batch, sends it and launches the
 * forward, and returns without waiting for the GPU. batch->token_masks must be
 * NULL; n_token_masks, mask_words and each seq's mask_index say which rows
 * will come. Nothing of the batch is kept past the call.
 *
 * glmrt_step_finish(token_masks, result) must follow a successful begin
 * before any other step call: token_masks holds the n_token_masks rows of
 * mask_words words declared at begin (NULL when none). It sends the masks
 * behind the forward on the same stream (no host wait), samples and waits for
 * the results as glmrt_step does. After a failed finish the step is over (the
 * KV slots of its tokens may have been written). */
int glmrt_step_begin(glmrt_engine* engine, const glmrt_batch* batch);
int glmrt_step_finish(glmrt_engine* engine, const uint32_t* token_masks, glmrt_result* result);

void glmrt_engine_destroy(glmrt_engine* engine);

/* ---- synthetic weights ----
 * Fill every tensor the forward needs with the deterministic pseudo-random
 * values of docs/synthetic.md, generated on the GPU(s): exactly the values that
 * `glmctl synth` writes to a checkpoint for the same config and seed, so a
 * synthesized engine and one loaded from that checkpoint compute the same
 * thing. Replaces the glmrt_load_tensor calls: call it once, before any of
 * them, then glmrt_finalize. MTP tensors are generated only when
 * options.draft_tokens > 0 (by the same rules, keyed by their names).
 * The KV cache is also filled with random finite values, so a decode step at
 * any position can be timed without a prefill first. */
int glmrt_synthesize(glmrt_engine* engine, uint64_t seed);

/* ---- step profile ----
 * Families of GPU work in a step. Each launch of the step belongs to one. */
#define GLMRT_PROF_EMBED 0           /* embedding gather */
#define GLMRT_PROF_NORM 1            /* residual add + RMSNorm (+ FP8 quantization), final norm */
#define GLMRT_PROF_QKV 2             /* q|k|v linear */
#define GLMRT_PROF_ROPE_KV 3         /* q/k norm + RoPE + KV-cache write */
#define GLMRT_PROF_ATTENTION 4       /* attention (+ split merge, output quantization) */
#define GLMRT_PROF_O_PROJ 5          /* o_proj linear */
#define GLMRT_PROF_DENSE_GATE_UP 6   /* dense MLP gate|up linear */
#define GLMRT_PROF_DENSE_DOWN 7      /* dense MLP down linear */
#define GLMRT_PROF_ROUTER 8          /* router logits, top-k, expert sort */
#define GLMRT_PROF_EXPERT_GATE_UP 9  /* routed + shared experts, gate|up */
#define GLMRT_PROF_EXPERT_DOWN 10    /* routed + shared experts, down */
#define GLMRT_PROF_ACTIVATION 11     /* SiLU*up (+ FP8 quantization) */
#define GLMRT_PROF_MOE_COMBINE 12    /* weighted sum of expert outputs */
#define GLMRT_PROF_LM_HEAD 13        /* lm_head (+ vocab gather) */
#define GLMRT_PROF_SAMPLING 14       /* penalties, sampling, logprobs */
#define GLMRT_PROF_COMM 15           /* all-reduce / all-gather between GPUs */
#define GLMRT_PROF_COPY 16           /* host <-> device copies of the step */
#define GLMRT_PROF_MOE_LAYER 17      /* a one-token MoE layer in one launch: norm, router, experts, combine, next norm */
#define GLMRT_PROF_ATTN_LAYER 18     /* a one-token attention half in one launch: q|k|v, rope + KV write, attention, o_proj */
#define GLMRT_PROF_N 19

typedef struct glmrt_profile {
  int64_t steps;                       /* steps accumulated */
  double step_us;                      /* GPU time from the step's first to last work */
  double family_us[GLMRT_PROF_N];      /* GPU time per family (sums to about step_us) */
  int64_t family_bytes[GLMRT_PROF_N];  /* device-memory bytes the family must move: weights
                                          read (experts actually hit), KV read and written,
                                          activations read and written */
  int64_t family_launches[GLMRT_PROF_N];
  int32_t graphs;                      /* 1: timed inside replayed CUDA graphs; 0: eager */
  int32_t reserved[7];
} glmrt_profile;

/* Start (on = 1) or stop (on = 0) profiling steps of GPU 0: from then on every
 * step records a timing event after each launch (steps run somewhat slower)
 * and accumulates into the profile. Starting also clears it. */
int glmrt_profile_enable(glmrt_engine* engine, int32_t on);
/* Copy the accumulated profile out; reset = 1 clears it afterwards. */
int glmrt_profile_read(glmrt_engine* engine, glmrt_profile* out, int32_t reset);

#ifdef __cplusplus
}
#endif

#endif /* GLMRT_H */
