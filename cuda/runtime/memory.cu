// memory.cu — engine creation: configuration checks, the per-GPU memory plan
// (weights, workspaces for the largest step, KV pool), device handles, and
// teardown. Everything a step needs is allocated here; the step path never
// allocates.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include <cuda_fp8.h>

#include "engine.h"

namespace glmrt {
namespace {

constexpr size_t kAlign = 256;
size_t al(size_t x) { return (x + kAlign - 1) & ~(kAlign - 1); }

int check_config(Engine& e) {
  const glmrt_model_config& c = e.cfg;
  const glmrt_engine_options& o = e.opt;
#define REQ(cond, ...)                                   \
  do {                                                   \
    if (!(cond)) return fail(GLMRT_ERR_INVALID, __VA_ARGS__); \
  } while (0)
  REQ(c.hidden_size > 0 && c.hidden_size % 128 == 0,
      "config: hidden_size %d must be a positive multiple of 128", c.hidden_size);
  REQ(c.num_hidden_layers > 0 && c.num_hidden_layers <= 1024,
      "config: num_hidden_layers %d must be in 1..1024", c.num_hidden_layers);
  REQ(c.first_k_dense_replace >= 0 && c.first_k_dense_replace <= c.num_hidden_layers,
      "config: first_k_dense_replace %d must be in 0..num_hidden_layers (%d)",
      c.first_k_dense_replace, c.num_hidden_layers);
  REQ(c.head_dim == 128, "config: head_dim %d: this runtime supports 128 only", c.head_dim);
  REQ(c.num_attention_heads > 0 && c.num_key_value_heads > 0 &&
          c.num_attention_heads % c.num_key_value_heads == 0,
      "config: num_attention_heads %d must be a positive multiple of num_key_value_heads %d",
      c.num_attention_heads, c.num_key_value_heads);
  REQ(c.num_attention_heads / c.num_key_value_heads <= glmk::kAttnMaxRows,
      "config: %d query heads per KV head exceed the limit %d",
      c.num_attention_heads / c.num_key_value_heads, glmk::kAttnMaxRows);
  const int rot = (int)(c.head_dim * c.partial_rotary_factor);
  REQ(c.partial_rotary_factor > 0 && c.partial_rotary_factor <= 1 && rot % 8 == 0,
      "config: partial_rotary_factor %g gives rotary dim %d; need (0,1] and a multiple of 8",
      c.partial_rotary_factor, rot);
  const bool any_dense = c.first_k_dense_replace > 0;
  const bool any_moe = c.first_k_dense_replace < c.num_hidden_layers;
  REQ(!any_dense || (c.intermediate_size > 0 && c.intermediate_size % 128 == 0),
      "config: intermediate_size %d must be a positive multiple of 128", c.intermediate_size);
  if (any_moe) {
    REQ(c.moe_intermediate_size > 0 && c.moe_intermediate_size % 128 == 0,
        "config: moe_intermediate_size %d must be a positive multiple of 128",
        c.moe_intermediate_size);
    REQ(c.n_routed_experts > 0 && c.n_routed_experts <= 512,
        "config: n_routed_experts %d must be in 1..512", c.n_routed_experts);
    REQ(c.num_experts_per_tok > 0 && c.num_experts_per_tok <= 32 &&
            c.num_experts_per_tok <= c.n_routed_experts,
        "config: num_experts_per_tok %d must be in 1..min(32, n_routed_experts)",
        c.num_experts_per_tok);
    REQ(c.n_group > 0 && c.n_group <= 32 && c.n_routed_experts % c.n_group == 0 &&
            (c.n_group == 1 || c.n_routed_experts / c.n_group >= 2),
        "config: n_group %d must be in 1..32, divide n_routed_experts %d, and leave >= 2 "
        "experts per group",
        c.n_group, c.n_routed_experts);
    REQ(c.topk_group > 0 && c.topk_group <= c.n_group,
        "config: topk_group %d must be in 1..n_group (%d)", c.topk_group, c.n_group);
    REQ(c.n_shared_experts == 0 || c.n_shared_experts == 1,
        "config: n_shared_experts %d: this runtime supports 0 or 1", c.n_shared_experts);
    REQ(std::isfinite(c.routed_scaling_factor),
        "config: routed_scaling_factor %g is not finite", c.routed_scaling_factor);
  }
  REQ(c.vocab_size > 0, "config: vocab_size %d must be > 0", c.vocab_size);
  REQ(c.max_position_embeddings > 0, "config: max_position_embeddings %d must be > 0",
      c.max_position_embeddings);
  REQ(c.rope_theta > 0 && std::isfinite(c.rope_theta), "config: rope_theta %g must be > 0",
      c.rope_theta);
  REQ(c.rms_norm_eps > 0 && std::isfinite(c.rms_norm_eps), "config: rms_norm_eps %g must be > 0",
      c.rms_norm_eps);
  REQ(c.num_nextn_predict_layers >= 0 && c.num_nextn_predict_layers <= 1,
      "config: num_nextn_predict_layers %d must be 0 or 1", c.num_nextn_predict_layers);

  for (int i = 0; i < 2; ++i)
    REQ(o.reserved[i] == 0, "options: reserved[%d] must be zero", i);
  REQ(o.disable_graphs == 0 || o.disable_graphs == 1, "options: disable_graphs %d must be 0 or 1",
      o.disable_graphs);
  REQ(o.fp32_cache_and_head == 0 || o.fp32_cache_and_head == 1,
      "options: fp32_cache_and_head %d must be 0 or 1", o.fp32_cache_and_head);
  e.f32kv = o.fp32_cache_and_head == 1;
  REQ(o.exact_activations == 0 || o.exact_activations == 1,
      "options: exact_activations %d must be 0 or 1", o.exact_activations);
  e.exact = o.exact_activations == 1;
  e.tp = o.tensor_parallel == 0 ? 1 : o.tensor_parallel;
  REQ(e.tp >= 1 && e.tp <= 64, "options: tensor_parallel %d must be in 1..64", e.tp);
  REQ(c.num_attention_heads % e.tp == 0 && c.num_key_value_heads % e.tp == 0,
      "options: tensor_parallel %d must divide num_attention_heads %d and num_key_value_heads %d",
      e.tp, c.num_attention_heads, c.num_key_value_heads);
  REQ(c.vocab_size % e.tp == 0, "options: tensor_parallel %d must divide vocab_size %d", e.tp,
      c.vocab_size);
  if (any_dense)
    REQ(c.intermediate_size % (128 * e.tp) == 0,
        "options: intermediate_size %d must split into multiples of 128 over %d GPUs",
        c.intermediate_size, e.tp);
  if (any_moe)
    REQ(c.n_routed_experts % e.tp == 0,
        "options: tensor_parallel %d must divide n_routed_experts %d (expert parallel)", e.tp,
        c.n_routed_experts);
  e.block_size = o.kv_block_size == 0 ? 16 : o.kv_block_size;
  REQ(e.block_size >= 1 && e.block_size <= 1024, "options: kv_block_size %d must be in 1..1024",
      e.block_size);
  REQ(o.num_kv_blocks >= 0, "options: num_kv_blocks %d must be >= 0", o.num_kv_blocks);
  REQ(o.kv_cache_dtype == GLMRT_KV_AUTO || o.kv_cache_dtype == GLMRT_KV_FP8_E4M3,
      "options: kv_cache_dtype %d must be %d (auto: BF16) or %d (FP8 e4m3)", o.kv_cache_dtype, GLMRT_KV_AUTO,
      GLMRT_KV_FP8_E4M3);
  e.kv8 = o.kv_cache_dtype == GLMRT_KV_FP8_E4M3;
  if (e.kv8) {
    REQ(!e.exact && !e.f32kv,
        "options: kv_cache_dtype FP8 needs the real path (exact_activations and fp32_cache_and_head 0)");
    REQ(e.block_size == glmk::kKvFp8BlockSize, "options: kv_cache_dtype FP8 needs kv_block_size %d, not %d",
        glmk::kKvFp8BlockSize, e.block_size);
    REQ(c.head_dim == 128 && c.num_attention_heads / c.num_key_value_heads <= glmk::kDecodeMaxGroup,
        "options: kv_cache_dtype FP8 needs head_dim 128 (not %d) and at most %d query heads per KV head (not %d)",
        c.head_dim, glmk::kDecodeMaxGroup, c.num_attention_heads / c.num_key_value_heads);
  }
  REQ(o.memory_budget_bytes >= 0, "options: memory_budget_bytes must be >= 0");
  e.max_tokens = o.max_tokens_per_step == 0 ? 8192 : o.max_tokens_per_step;
  REQ(e.max_tokens >= 1 && e.max_tokens <= 65536,
      "options: max_tokens_per_step %d must be in 1..65536", e.max_tokens);
  e.max_seqs = o.max_seqs_per_step == 0 ? std::min(256, e.max_tokens) : o.max_seqs_per_step;
  REQ(e.max_seqs >= 1 && e.max_seqs <= e.max_tokens && e.max_seqs <= 16384,
      "options: max_seqs_per_step %d must be in 1..min(16384, max_tokens_per_step (%d))", e.max_seqs,
      e.max_tokens);
  REQ(o.max_penalty_entries >= 0, "options: max_penalty_entries must be >= 0");
  e.max_pen = o.max_penalty_entries == 0 ? e.max_seqs * 4096 : o.max_penalty_entries;
  REQ(o.draft_tokens >= 0 && o.draft_tokens <= GLMRT_MAX_DRAFT_TOKENS,
      "options: draft_tokens %d must be in 0..%d", o.draft_tokens, GLMRT_MAX_DRAFT_TOKENS);
  e.draft_k = o.draft_tokens;
  if (e.draft_k > 0) {
    REQ(c.num_nextn_predict_layers == 1,
        "options: draft_tokens %d needs the checkpoint's MTP layer, but num_nextn_predict_layers is %d",
        e.draft_k, c.num_nextn_predict_layers);
    REQ(any_moe, "options: draft_tokens needs a MoE model (the MTP layer is a MoE decoder layer)");
    REQ(e.tp == 1, "options: draft_tokens with tensor_parallel %d: the draft model runs on one GPU only",
        e.tp);
    REQ(!e.exact && !e.f32kv,
        "options: draft_tokens needs the real path (exact_activations and fp32_cache_and_head 0)");
    // Chained passes run their rows through attention_decode (step.cu's
    // decode_kernel_ok; the group bound is checked below, with the heads).
    REQ(e.draft_k == 1 || e.block_size % 16 == 0,
        "options: draft_tokens %d (chained drafts) needs kv_block_size a multiple of 16, not %d",
        e.draft_k, e.block_size);
  }
  e.max_logit_rows = e.max_seqs * (1 + e.draft_k);
  // Verify row j of a sequence holds its history plus its first j drafts.
  e.pen_cap = (int64_t)e.max_pen * (1 + e.draft_k) + (int64_t)e.max_seqs * e.draft_k * (e.draft_k + 1) / 2;
#undef REQ

  Dims& d = e.d;
  d.H = c.hidden_size;
  d.L = c.num_hidden_layers;
  d.D = c.head_dim;
  d.rot = rot;
  d.nq = c.num_attention_heads;
  d.nkv = c.num_key_value_heads;
  d.nq_l = d.nq / e.tp;
  d.nkv_l = d.nkv / e.tp;
  d.qkv_rows = (d.nq_l + 2 * d.nkv_l) * d.D;
  d.I = any_dense ? c.intermediate_size : 0;
  d.I_l = d.I / e.tp;
  d.MI = any_moe ? c.moe_intermediate_size : 0;
  d.E = any_moe ? c.n_routed_experts : 0;
  d.E_l = d.E / e.tp;
  d.K = any_moe ? c.num_experts_per_tok : 0;
  d.slots = d.K + (any_moe && c.n_shared_experts == 1 ? 1 : 0);
  d.V = c.vocab_size;
  d.V_l = d.V / e.tp;
  d.first_dense = c.first_k_dense_replace;
  e.max_blocks_per_seq = (c.max_position_embeddings + e.block_size - 1) / e.block_size;
  e.max_merges = e.max_seqs;
  e.max_parts = std::max(64, e.max_seqs) * 4;
  e.max_items = e.max_tokens + e.max_seqs * glmk::kAttnMaxSplits;
  // attention_prefill: at most 512 split pieces per step (a 2k prompt on a
  // 132-SM GPU uses ~300; past the cap items just stay whole), 66 KB of
  // workspace per piece and KV head.
  e.prefill_tc = !e.exact && !e.f32kv && glmk::attention_prefill_supported(d.nq_l, d.nkv_l, e.block_size);
  e.pf_max_parts = e.prefill_tc ? 512 : 0;
  e.pf_max_items = e.prefill_tc ? glmk::attention_prefill_max_items(e.max_tokens, e.max_seqs, d.nq / d.nkv,
                                                                    e.pf_max_parts)
                                : 0;
  e.pf_ws_bytes = glmk::attention_prefill_workspace_bytes(e.pf_max_parts, d.nkv_l);
  // Rows per sampling launch: as many as a 256 MiB workspace holds (V x 24
  // bytes a row), at least 32. Each launch is one CTA per row, so 32-row
  // chunks left 100 of 132 SMs idle: a batch-256 decode step of the rank
  // share (V 18,944) sampled in eight serial launches of ~44 us (H100, ncu,
  // 2026-11-27), where one launch of 256 rows needs about one.
  constexpr size_t kSampleBudget = size_t(256) << 20;
  const size_t per_row = (size_t)d.V * (2 * sizeof(double) + 2 * sizeof(int));
  const int fit = (int)std::min<size_t>(kSampleBudget / std::max<size_t>(per_row, 1), 1 << 20);
  e.sample_chunk = std::min(e.max_seqs, std::max(fit, 32));
  if (e.draft_k > 1 && d.nq / d.nkv > glmk::kDecodeMaxGroup)
    return fail(GLMRT_ERR_INVALID,
                "options: draft_tokens %d (chained drafts) needs at most %d query heads per KV head "
                "(attention_decode), not %d",
                e.draft_k, glmk::kDecodeMaxGroup, d.nq / d.nkv);
  return GLMRT_OK;
}

struct Alloc {
  Rank& r;
  int64_t* counter;
  template <typename T>
  int operator()(T** p, size_t count, const char* what) {
    void* v = nullptr;
    const size_t bytes = al(std::max<size_t>(count, 1) * sizeof(T));
    cudaError_t err = cudaMalloc(&v, bytes);
    if (err != cudaSuccess) {
      cudaGetLastError();
      size_t fr = 0, tot = 0;
      cudaMemGetInfo(&fr, &tot);
      return fail(GLMRT_ERR_OOM,
                  "GPU %d: cannot allocate %s (%.1f MiB; %.1f MiB free of %.1f MiB): %s",
                  r.device, what, bytes / 1048576.0, fr / 1048576.0, tot / 1048576.0,
                  cudaGetErrorString(err));
    }
    r.allocations.push_back(v);
    *counter += (int64_t)bytes;
    *p = static_cast<T*>(v);
    return GLMRT_OK;
  }
};

int alloc_weights(Engine& e, Rank& r) {
  const Dims& d = e.d;
  const glmrt_model_config& c = e.cfg;
  Alloc A{r, &r.weight_bytes};
  const int n_layers = d.L + (e.draft_k > 0 ? 1 : 0);  // the MTP layer is layers[L]
  r.layers.resize(n_layers);
  for (int l = 0; l < n_layers; ++l) {
    LayerDev& L = r.layers[l];
    L.moe = l >= d.first_dense;
    GLMRT_TRY(A(&L.in_norm, d.H, "input_layernorm"));
    GLMRT_TRY(A(&L.post_norm, d.H, "post_attention_layernorm"));
    GLMRT_TRY(A(&L.qkv, (size_t)d.qkv_rows * d.H, "q|k|v weights"));
    GLMRT_TRY(A(&L.qkv_scale, d.qkv_rows, "q|k|v scales"));
    if (c.attention_bias) GLMRT_TRY(A(&L.qkv_bias, d.qkv_rows, "q|k|v biases"));
    if (c.use_qk_norm) {
      GLMRT_TRY(A(&L.q_norm, d.D, "q_norm"));
      GLMRT_TRY(A(&L.k_norm, d.D, "k_norm"));
    }
    GLMRT_TRY(A(&L.o, (size_t)d.H * d.nq_l * d.D, "o_proj weights"));
    GLMRT_TRY(A(&L.o_scale, d.H, "o_proj scales"));
    if (!L.moe) {
      GLMRT_TRY(A(&L.gu, (size_t)2 * d.I_l * d.H, "dense gate|up weights"));
      GLMRT_TRY(A(&L.gu_scale, 2 * d.I_l, "dense gate|up scales"));
      GLMRT_TRY(A(&L.down, (size_t)d.H * d.I_l, "dense down weights"));
      GLMRT_TRY(A(&L.down_scale, d.H, "dense down scales"));
    } else {
      GLMRT_TRY(A(&L.router, (size_t)d.E * d.H, "router weights"));
      GLMRT_TRY(A(&L.router_bias, d.E, "router correction bias"));
      GLMRT_TRY(A(&L.e_gu, (size_t)r.groups * 2 * d.MI * d.H, "expert gate|up weights"));
      GLMRT_TRY(A(&L.e_gu_scale, (size_t)r.groups * 2 * d.MI, "expert gate|up scales"));
      GLMRT_TRY(A(&L.e_down, (size_t)r.groups * d.H * d.MI, "expert down weights"));
      GLMRT_TRY(A(&L.e_down_scale, (size_t)r.groups * d.H, "expert down scales"));
    }
  }
  GLMRT_TRY(A(&r.embed, (size_t)d.V * d.H, "embed_tokens"));
  if (e.f32kv)
    GLMRT_TRY(A(&r.lm_head_f32, (size_t)d.V_l * d.H, "lm_head (FP32)"));
  else
    GLMRT_TRY(A(&r.lm_head, (size_t)d.V_l * d.H, "lm_head"));
  GLMRT_TRY(A(&r.final_norm, d.H, "model.norm"));
  if (e.draft_k > 0) {
    GLMRT_TRY(A(&r.mtp_enorm, d.H, "MTP enorm"));
    GLMRT_TRY(A(&r.mtp_hnorm, d.H, "MTP hnorm"));
    GLMRT_TRY(A(&r.mtp_head_norm, d.H, "MTP shared_head.norm"));
    GLMRT_TRY(A(&r.mtp_eh_proj, (size_t)d.H * 2 * d.H, "MTP eh_proj"));
  }
  GLMRT_TRY(A(&r.inv_freq, d.rot / 2, "RoPE inverse frequencies"));
  // inv_freq exactly as HF computes it in FP32: 1 / theta^(float(2i) / float(rot)).
  std::vector<float> inv(d.rot / 2);
  for (int i = 0; i < d.rot / 2; ++i) {
    const float ex = (float)(2 * i) / (float)d.rot;
    inv[i] = 1.0f / powf(c.rope_theta, ex);
  }
  GLMRT_CUDA(cudaMemcpy(r.inv_freq, inv.data(), inv.size() * sizeof(float), cudaMemcpyHostToDevice),
             "upload RoPE inverse frequencies");
  return GLMRT_OK;
}

int alloc_workspaces(Engine& e, Rank& r) {
  const Dims& d = e.d;
  Alloc A{r, &r.workspace_bytes};
  const size_t T = e.max_tokens, S = e.max_seqs, LR = e.max_logit_rows;
  const size_t rows_moe = T * std::max(d.slots, 1);
  const size_t max_k = std::max<size_t>(d.H, (size_t)d.nq_l * d.D);
  const size_t max_n = std::max({(size_t)d.qkv_rows, (size_t)d.H, (size_t)2 * d.I_l});
  GLMRT_TRY(A(&r.h, T * d.H, "residual stream"));
  GLMRT_TRY(A(&r.delta, T * d.H, "sub-layer output"));
  if (!e.exact) GLMRT_TRY(A(&r.xf, T * d.H, "normed activations (router input)"));
  if (!e.exact && d.E > 0) GLMRT_TRY(A(&r.rstd, T, "post-attention norm factors (router input)"));
  GLMRT_TRY(A(&r.xq, T * max_k, "FP8 activations"));
  GLMRT_TRY(A(&r.xs, T, "activation scales"));
  GLMRT_TRY(A(&r.qkv, T * d.qkv_rows, "q|k|v outputs"));
  GLMRT_TRY(A(&r.q, T * d.nq_l * d.D, "rotated queries"));
  GLMRT_TRY(A(&r.attn, T * d.nq_l * d.D, "attention outputs"));
  GLMRT_TRY(A(&r.big, std::max(T * 2 * d.I_l, rows_moe * 2 * d.MI), "gate|up outputs"));
  GLMRT_TRY(A(&r.hq, std::max(T * d.I_l, rows_moe * d.MI), "FP8 SiLU*up"));
  GLMRT_TRY(A(&r.hs, rows_moe, "SiLU*up scales"));
  if (e.exact) {
    GLMRT_TRY(A(&r.xf, T * max_k, "FP32 linear inputs (exact mode)"));
    GLMRT_TRY(A(&r.hf, std::max(T * d.I_l, rows_moe * d.MI), "FP32 SiLU*up (exact mode)"));
  }
  if (d.E > 0) {
    GLMRT_TRY(A(&r.ysort, rows_moe * d.H, "expert outputs"));
    GLMRT_TRY(A(&r.router_logits, T * d.E, "router logits"));
    GLMRT_TRY(A(&r.topk_ids, rows_moe, "routing ids"));
    GLMRT_TRY(A(&r.topk_w, rows_moe, "routing weights"));
    GLMRT_TRY(A(&r.offsets, (size_t)r.groups + 1, "expert offsets"));
    GLMRT_TRY(A(&r.sorted_rows, rows_moe, "sorted rows"));
    GLMRT_TRY(A(&r.inv, rows_moe, "sorted positions"));
    GLMRT_TRY(A(&r.tile_queue, 2, "expert GEMM tile queue"));
    GLMRT_CUDA(cudaMemset(r.tile_queue, 0, 2 * sizeof(int)), "zero the expert GEMM tile queue");
  }
  GLMRT_TRY(A(&r.split_ws, (size_t)16 * 64 * max_n, "split-K partials"));
  if (!e.exact) {
    // A K-split linear's slices (step.cu, split_out_plan): at most one 128-row
    // token tile x 128 weight rows per SM and split.
    r.lin_parts_floats = (size_t)std::max(r.num_sms, 1) * 128 * 128;
    GLMRT_TRY(A(&r.lin_parts, r.lin_parts_floats, "K-split linear slices"));
  }
  GLMRT_TRY(A(&r.part_o, (size_t)e.max_parts * d.nq_l * d.D, "attention partials"));
  GLMRT_TRY(A(&r.part_ml, (size_t)e.max_parts * d.nq_l * 2, "attention partial stats"));
  if (e.f32kv)
    GLMRT_TRY(A(&r.final_f32, LR * d.H, "final normed rows (FP32)"));
  else
    GLMRT_TRY(A(&r.final_bf16, LR * d.H, "final normed rows"));
  GLMRT_TRY(A(&r.logits_local, LR * d.V_l, "logits (local vocabulary)"));
  if (e.tp > 1) GLMRT_TRY(A(&r.logits_gather, (size_t)e.tp * LR * d.V_l, "logits all-gather"));
  if (r.index == 0) {
    r.logits = e.tp > 1 ? nullptr : r.logits_local;
    if (e.tp > 1) GLMRT_TRY(A(&r.logits, LR * d.V, "logits"));
    r.sample_ws_bytes = glmk::sample_workspace_bytes(e.sample_chunk, d.V);
    GLMRT_TRY(A((unsigned char**)&r.sample_ws, r.sample_ws_bytes, "sampler workspace"));
    GLMRT_TRY(A(&r.sample_out, LR, "sample results"));
    GLMRT_TRY(A(&r.top_ids, LR * glmk::kMaxTop, "top logprob ids"));
    GLMRT_TRY(A(&r.top_lp, LR * glmk::kMaxTop, "top logprobs"));
  }
  if (e.draft_k > 0) {
    GLMRT_TRY(A(&r.mtp_hid, T * d.H, "MTP hidden inputs"));
    GLMRT_TRY(A(&r.mtp_cat, T * 2 * d.H, "MTP projection inputs"));
    GLMRT_TRY(A(&r.mtp_draft, S * e.draft_k, "MTP proposals"));
  }
  GLMRT_TRY(A(&r.meta, e.meta_bytes, "step metadata"));
  if (r.index == 0 && d.E > 0) GLMRT_TRY(A(&r.prof_active, (size_t)d.L + 1, "profile expert counts"));
  if (r.shared_local >= 0) {
    GLMRT_TRY(A(&r.sh_big, T * 2 * d.MI, "shared expert gate|up outputs"));
    GLMRT_TRY(A(&r.sh_hq, T * d.MI, "shared expert FP8 SiLU*up"));
    GLMRT_TRY(A(&r.sh_hs, T, "shared expert SiLU*up scales"));
    GLMRT_TRY(A(&r.sh_out, T * d.H, "shared expert outputs"));
  }
  // attention_decode: the most workspace any batch size needs (its split count
  // falls as the batch grows).
  if (e.dec_ws_bytes == 0) {
    for (int n = 1; n <= e.max_logit_rows; ++n) {  // decode entries: sequences, or verify rows
      const int sp = glmk::decode_attention_splits(n, d.nkv_l, r.num_sms, e.kv8);
      e.dec_ws_bytes = std::max(e.dec_ws_bytes,
                                glmk::decode_attention_workspace_bytes(n, d.nq_l, d.nkv_l, sp));
    }
  }
  GLMRT_TRY(A((unsigned char**)&r.dec_ws, e.dec_ws_bytes, "decode attention workspace"));
  GLMRT_CUDA(cudaMemset(r.dec_ws, 0, e.dec_ws_bytes), "zero the decode attention workspace");
  if (e.pf_ws_bytes > 0) {
    GLMRT_TRY(A((unsigned char**)&r.pf_ws, e.pf_ws_bytes, "prefill attention workspace"));
    GLMRT_CUDA(cudaMemset(r.pf_ws, 0, e.pf_ws_bytes), "zero the prefill attention workspace");
  }
  if (d.E > 0) {
    e.router_ws_bytes = glmk::router_fused_workspace_bytes(e.max_tokens, d.E);
    GLMRT_TRY(A((unsigned char**)&r.router_ws, e.router_ws_bytes, "router workspace"));
    GLMRT_CUDA(cudaMemset(r.router_ws, 0, e.router_ws_bytes), "zero the router workspace");
    if (glmk::moe_decode_t1_supported(d.H, d.MI, d.E, d.slots)) {
      const size_t b = glmk::moe_decode_t1_workspace_bytes(d.H, d.MI, d.E, d.slots);
      GLMRT_TRY(A((unsigned char**)&r.moe_t1_ws, b, "one-token MoE layer workspace"));
      GLMRT_CUDA(cudaMemset(r.moe_t1_ws, 0, b), "zero the one-token MoE layer workspace");
    }
  }
  // The one-token attention half (attn_layer_t1): BF16 or FP8 cache, head_dim 128.
  if (!e.f32kv && d.D == 128 && glmk::attn_layer_t1_supported(d.H, d.nq_l, d.nkv_l, d.rot)) {
    const size_t b = glmk::attn_layer_t1_workspace_bytes(d.nq_l, d.nkv_l, r.num_sms);
    GLMRT_TRY(A((unsigned char**)&r.attn_t1_ws, b, "one-token attention layer workspace"));
    GLMRT_CUDA(cudaMemset(r.attn_t1_ws, 0, b), "zero the one-token attention layer workspace");
  }
  // cuBLAS gets its workspace from us, so that it allocates nothing while a
  // step is captured into a CUDA graph.
  unsigned char* cublas_ws = nullptr;
  const size_t cublas_ws_bytes = 32u << 20;
  GLMRT_TRY(A(&cublas_ws, cublas_ws_bytes, "cuBLAS workspace"));
  {
    // The stream first: cublasSetStream resets the workspace.
    cublasStatus_t s = cublasSetStream(r.cublas, r.stream);
    if (s != CUBLAS_STATUS_SUCCESS)
      return fail(GLMRT_ERR_CUDA, "GPU %d: cublasSetStream: %s", r.device, cublasGetStatusString(s));
    s = cublasSetWorkspace(r.cublas, cublas_ws, cublas_ws_bytes);
    if (s != CUBLAS_STATUS_SUCCESS)
      return fail(GLMRT_ERR_CUDA, "GPU %d: cublasSetWorkspace: %s", r.device, cublasGetStatusString(s));
  }
  r.lt.workspace_bytes = 32u << 20;
  GLMRT_TRY(A((unsigned char**)&r.lt.workspace, r.lt.workspace_bytes, "cuBLASLt workspace"));
  return GLMRT_OK;
}

// The FP8 cache's form of fill_kv_kernel: n codes of values in [-1, 1) at
// scale 1/448 and n_scales scales of 1/448 (the pool's codes, then its scales).
__global__ void fill_kv_fp8_kernel(uint8_t* codes, size_t n, float* scales, size_t n_scales, uint64_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * (i + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float v = (float)(int32_t)(z >> 40 & 0xFFFFFF) / 8388608.0f - 1.0f;
    codes[i] = (uint8_t)__nv_cvt_float_to_fp8(v * 448.0f, __NV_SATFINITE, __NV_E4M3);
    if (i < n_scales) scales[i] = 1.0f / 448.0f;
  }
}

// Random finite KV values in [-1, 1) (BF16 or FP32 elements).
__global__ void fill_kv_kernel(void* pool, size_t n, int f32, uint64_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * (i + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float v = (float)(int32_t)(z >> 40 & 0xFFFFFF) / 8388608.0f - 1.0f;
    if (f32) static_cast<float*>(pool)[i] = v;
    else static_cast<__nv_bfloat16*>(pool)[i] = __float2bfloat16_rn(v);
  }
}

}  // namespace

int fill_kv_random(Engine& e, uint64_t seed) {
  const size_t elems = e.f32kv ? sizeof(float) : sizeof(__nv_bfloat16);
  for (Rank& r : e.ranks) {
    if (r.layers.empty()) continue;
    GLMRT_CUDA(cudaSetDevice(r.device), "cudaSetDevice");
    const size_t n = (size_t)r.kv_bytes / elems;
    if (e.kv8) {
      // Codes of values in [-1, 1) at scale 1/448, every scale 1/448.
      const size_t codes = (size_t)r.layers.size() * 2 * e.num_blocks * e.d.nkv_l * e.block_size * e.d.D;
      fill_kv_fp8_kernel<<<4 * r.num_sms, 256, 0, r.stream>>>(static_cast<uint8_t*>(r.layers[0].k_cache), codes,
                                                              r.layers[0].k_scale, codes / e.d.D,
                                                              seed ^ 0x4B56ull);
    } else {
      fill_kv_kernel<<<4 * r.num_sms, 256, 0, r.stream>>>(r.layers[0].k_cache, n, e.f32kv ? 1 : 0,
                                                           seed ^ 0x4B56ull);
    }
    GLMRT_CUDA(cudaGetLastError(), "fill the KV cache");
    GLMRT_CUDA(cudaStreamSynchronize(r.stream), "fill the KV cache: synchronize");
  }
  return GLMRT_OK;
}

int create_engine(Engine& e) {
  GLMRT_TRY(check_config(e));
  int ndev = 0;
  GLMRT_CUDA(cudaGetDeviceCount(&ndev), "cudaGetDeviceCount");
  if (e.opt.device < 0 || e.opt.device + e.tp > ndev)
    return fail(GLMRT_ERR_INVALID, "options: devices %d..%d requested but %d CUDA device(s) visible",
                e.opt.device, e.opt.device + e.tp - 1, ndev);
  plan_meta_layout(e);
  e.result_bytes = al(e.max_logit_rows * sizeof(glmk::SampleOut)) +
                   al((size_t)e.max_logit_rows * glmk::kMaxTop * 4) * 2 +
                   al((size_t)e.max_seqs * std::max(1, e.draft_k) * 4);  // proposals
  e.ranks.resize(e.tp);
  std::vector<int> devices;
  for (int i = 0; i < e.tp; ++i) {
    Rank& r = e.ranks[i];
    r.index = i;
    r.device = e.opt.device + i;
    devices.push_back(r.device);
    GLMRT_CUDA(cudaSetDevice(r.device), "cudaSetDevice");
    cudaDeviceProp prop;
    GLMRT_CUDA(cudaGetDeviceProperties(&prop, r.device), "cudaGetDeviceProperties");
    if (prop.major < 9)
      return fail(GLMRT_ERR_INVALID, "GPU %d (%s) is sm_%d%d; this build needs sm_90a (Hopper)",
                  r.device, prop.name, prop.major, prop.minor);
    r.num_sms = prop.multiProcessorCount;
    r.stream_tc = prop.major == 9;
    if (i == 0) {
      char buf[256];
      snprintf(buf, sizeof buf, "%s (sm_%d%d, %.0f GiB) x%d", prop.name, prop.major, prop.minor,
               prop.totalGlobalMem / 1073741824.0, e.tp);
      e.device_name = buf;
    }
    GLMRT_CUDA(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking), "cudaStreamCreate");
    cublasStatus_t s = cublasCreate(&r.cublas);
    if (s != CUBLAS_STATUS_SUCCESS)
      return fail(GLMRT_ERR_CUDA, "GPU %d: cublasCreate: %s", r.device, cublasGetStatusString(s));
    s = cublasLtCreate(&r.lt.handle);
    if (s != CUBLAS_STATUS_SUCCESS)
      return fail(GLMRT_ERR_CUDA, "GPU %d: cublasLtCreate: %s", r.device, cublasGetStatusString(s));
    // Experts: [i*E_l, (i+1)*E_l) routed here; the shared expert on rank 0.
    r.n_local_experts = e.d.E_l;
    r.expert_begin = i * e.d.E_l;
    r.shared_local = (e.d.E > 0 && e.cfg.n_shared_experts == 1 && i == 0) ? e.d.E_l : -1;
    r.groups = e.d.E_l + (r.shared_local >= 0 ? 1 : 0);
    if (r.groups > 1024)
      return fail(GLMRT_ERR_INVALID, "GPU %d: %d local experts exceed the limit of 1024", r.device,
                  r.groups);
    GLMRT_TRY(alloc_weights(e, r));
    GLMRT_TRY(alloc_workspaces(e, r));
  }
  // KV pool: the same number of blocks on every GPU.
  const size_t kv_elem = e.kv8 ? 1 : e.f32kv ? sizeof(float) : sizeof(__nv_bfloat16);
  const int kv_layers = (int)e.ranks[0].layers.size();  // + the MTP layer's when drafting
  // FP8: each token's K and V rows of a KV head also have a 4-byte scale.
  const size_t row_bytes = e.d.D * kv_elem + (e.kv8 ? sizeof(float) : 0);
  const size_t per_block = (size_t)kv_layers * 2 * e.d.nkv_l * e.block_size * row_bytes;
  int64_t blocks = e.opt.num_kv_blocks;
  if (blocks == 0) {
    for (Rank& r : e.ranks) {
      GLMRT_CUDA(cudaSetDevice(r.device), "cudaSetDevice");
      size_t fr = 0, tot = 0;
      GLMRT_CUDA(cudaMemGetInfo(&fr, &tot), "cudaMemGetInfo");
      int64_t avail;
      if (e.opt.memory_budget_bytes > 0)
        avail = e.opt.memory_budget_bytes - r.weight_bytes - r.workspace_bytes;
      else
        avail = (int64_t)fr - (int64_t)(1ull << 30);
      avail = std::min<int64_t>(avail, (int64_t)fr - (int64_t)(256ull << 20));
      const int64_t b = avail > 0 ? avail / (int64_t)per_block : 0;
      blocks = (r.index == 0) ? b : std::min(blocks, b);
      if (b < 1)
        return fail(GLMRT_ERR_OOM,
                    "GPU %d: memory budget leaves no room for the KV cache: weights %.1f MiB + "
                    "workspaces %.1f MiB, %.1f MiB free, one KV block needs %.2f MiB",
                    r.device, r.weight_bytes / 1048576.0, r.workspace_bytes / 1048576.0,
                    fr / 1048576.0, per_block / 1048576.0);
    }
    blocks = std::min<int64_t>(blocks, 1 << 30);
  }
  e.num_blocks = (int)blocks;
  for (Rank& r : e.ranks) {
    GLMRT_CUDA(cudaSetDevice(r.device), "cudaSetDevice");
    Alloc A{r, &r.kv_bytes};
    unsigned char* pool = nullptr;
    GLMRT_TRY(A(&pool, per_block * e.num_blocks, "KV cache"));
    const size_t layer_bytes = (size_t)e.num_blocks * e.d.nkv_l * e.block_size * e.d.D * kv_elem;
    for (int l = 0; l < kv_layers; ++l) {
      r.layers[l].k_cache = pool + (2 * l) * layer_bytes;
      r.layers[l].v_cache = pool + (2 * l + 1) * layer_bytes;
    }
    if (e.kv8) {  // the scales after every layer's codes (16-byte aligned: 16 floats a block-head)
      float* sc = reinterpret_cast<float*>(pool + 2 * (size_t)kv_layers * layer_bytes);
      const size_t layer_scales = (size_t)e.num_blocks * e.d.nkv_l * e.block_size;
      for (int l = 0; l < kv_layers; ++l) {
        r.layers[l].k_scale = sc + (2 * l) * layer_scales;
        r.layers[l].v_scale = sc + (2 * l + 1) * layer_scales;
      }
      // Zero codes and scales: a slot never written reads as 0 (fill_kv_random
      // may replace them).
      GLMRT_CUDA(cudaMemset(pool, 0, per_block * e.num_blocks), "zero the FP8 KV cache");
    }
  }
  if (e.tp > 1) {
    std::string err = glmc::comm_init(e.comm, devices);
    if (!err.empty()) return fail(GLMRT_ERR_CUDA, "NCCL init over %d GPUs: %s", e.tp, err.c_str());
  }
  GLMRT_CUDA(cudaSetDevice(e.ranks[0].device), "cudaSetDevice");
  GLMRT_CUDA(cudaMallocHost((void**)&e.meta_host, e.meta_bytes), "cudaMallocHost(step metadata)");
  GLMRT_CUDA(cudaMallocHost((void**)&e.result_host, e.result_bytes), "cudaMallocHost(step results)");
  // CUDA graphs for pure-decode steps: one per batch-size bucket (1, 2, 4, 8,
  // then steps of 8 to 64, of 16 to 128, of 32 beyond), TP1 on the real path.
  e.graphs = e.opt.disable_graphs == 0 && e.tp == 1 && !e.exact && !e.f32kv;
  e.buckets.clear();
  for (int b = 1; b <= e.max_seqs;) {
    e.buckets.push_back(b);
    b = b < 8 ? b * 2 : b < 64 ? b + 8 : b < 128 ? b + 16 : b + 32;
  }
  if (e.buckets.back() != e.max_seqs) e.buckets.push_back(e.max_seqs);
  // ... and per decode-attention context class (glmk::kDecCtx*; step.cu
  // graph_index): most buckets only ever use the first.
  const size_t keys = e.buckets.size() * kCtxClasses;
  e.step_graphs.assign(keys, StepGraph{});
  e.prof_graphs.assign(keys, StepGraph{});
  e.draft_graphs.assign(keys, StepGraph{});
  e.chain_graphs.assign(e.buckets.size() * std::max(0, e.draft_k - 1), StepGraph{});  // per bucket, pass count
  e.attn_seqs.reserve(e.max_seqs);
  e.attn_seq_index.reserve(e.max_seqs);
  e.attn_items.resize(e.max_items);
  e.pf_items.resize(e.pf_max_items);
  e.attn_merges.resize(e.max_merges);
  e.logits_seq.reserve(e.max_logit_rows);
  step_state_create(e);
  return GLMRT_OK;
}

void destroy_engine(Engine& e) {
  if (!e.ranks.empty()) cudaSetDevice(e.ranks[0].device);
  step_state_destroy(e);
  profile_destroy(e);
  glmc::comm_destroy(e.comm);
  for (Rank& r : e.ranks) {
    cudaSetDevice(r.device);
    if (r.stream) cudaStreamSynchronize(r.stream);
    for (void* p : r.allocations) cudaFree(p);
    r.allocations.clear();
    if (r.lt.handle) cublasLtDestroy(r.lt.handle);
    if (r.cublas) cublasDestroy(r.cublas);
    if (r.stream) cudaStreamDestroy(r.stream);
    r.lt.handle = nullptr;
    r.cublas = nullptr;
    r.stream = nullptr;
  }
  if (e.meta_host) cudaFreeHost(e.meta_host);
  if (e.result_host) cudaFreeHost(e.result_host);
  e.meta_host = e.result_host = nullptr;
  e.ranks.clear();
}

}  // namespace glmrt
