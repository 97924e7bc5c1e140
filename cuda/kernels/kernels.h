// kernels.h — host-side launch functions of every kernel family under
// cuda/kernels/. The runtime (cuda/runtime) and the kernel_check test program
// (cuda/tests) call only these. Launchers enqueue work on the given stream and
// return the launch status (cudaGetLastError); they never synchronize.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <cmath>
#include <string>

namespace glmk {

// ---------------------------------------------------------------- quant.cu
// Per-row dynamic FP8 quantization (docs/model.md §4.3):
//   s[r] = max(max_c |x[r,c]| / 448, 1/(448*512)),  q[r,c] = e4m3_rne(clamp(x[r,c] / s[r])).
// cols % 4 == 0. If rows_dev is set, rows >= *rows_dev are skipped.
cudaError_t quant_rows_fp8(const float* x, int64_t ldx, int rows, int cols, uint8_t* q,
                           int64_t ldq, float* scale, const int* rows_dev, cudaStream_t st);

// h = silu(gate) * up over gu[r] = [gate(inter) | up(inter)], then per-row FP8.
cudaError_t silu_mul_quant_fp8(const float* gu, int rows, int inter, uint8_t* q, float* scale,
                               const int* rows_dev, cudaStream_t st);
// The same over BF16 rows (gemm_fp8_grouped_tc_bf16's output), widened
// exactly to FP32 first, where silu_mul_quant_bf16_supported(inter) (else
// cudaErrorInvalidValue): inter % 4 == 0 and inter <= 4096.
bool silu_mul_quant_bf16_supported(int inter);
cudaError_t silu_mul_quant_fp8(const __nv_bfloat16* gu, int rows, int inter, uint8_t* q, float* scale,
                               const int* rows_dev, cudaStream_t st);
// Per-row FP8 of BF16 rows x [rows][cols] that are SiLU·up already (the
// SiLU-fused gate|up, GroupedTcTuning::silu_gate_up): quant_rows_fp8's
// scales and codes over the widened values, rows strided as the SiLU's (with
// rows_dev, only rows < *rows_dev). Where silu_mul_quant_bf16_supported(cols),
// else cudaErrorInvalidValue.
cudaError_t quant_rows_fp8_bf16(const __nv_bfloat16* x, int rows, int cols, uint8_t* q, float* scale,
                                const int* rows_dev, cudaStream_t st);
// The same over a GEMM's unscaled FP32 sums (linear()'s deferred epilogue):
// each value is scaled first as gemm_fp8_epilogue would, (sum * x_scale[r]) *
// w_scale[c] for c < 2 * inter, so the result equals gemm_fp8_epilogue then
// silu_mul_quant_fp8 bit for bit. Where silu_mul_quant_fp8_scaled_supported
// (inter % 4 == 0, inter <= 4096, w_scale 16-byte aligned), else cudaErrorInvalidValue.
bool silu_mul_quant_fp8_scaled_supported(int inter, const float* w_scale);
cudaError_t silu_mul_quant_fp8_scaled(const float* gu, int rows, int inter, const float* x_scale,
                                      const float* w_scale, uint8_t* q, float* scale, cudaStream_t st);
// The same without quantization (exactness-check path): h [rows, inter] FP32.
cudaError_t silu_mul_f32(const float* gu, int rows, int inter, float* h, const int* rows_dev,
                         cudaStream_t st);

// ------------------------------------------------------------ norm_rope.cu
// Fused residual add + RMSNorm (+ optional FP8 quantization) over rows:
//   src = row_index ? row_index[i] : i
//   if delta: h[src] += delta[src]          (the residual stream, FP32)
//   y = weight * (h[src] * 1/sqrt(mean(h[src]^2) + eps))
//   out_f32[i] = y; out_bf16[i] = bf16(y); (out_q[i], out_scale[i]) = fp8(y)   (each optional)
struct AddNormArgs {
  float* h = nullptr;
  const float* delta = nullptr;
  const float* weight = nullptr;
  int rows = 0, hidden = 0;
  float eps = 1e-5f;
  const int* row_index = nullptr;
  float* out_f32 = nullptr;
  __nv_bfloat16* out_bf16 = nullptr;
  uint8_t* out_q = nullptr;
  float* out_scale = nullptr;
  // out_rstd[i] = 1/sqrt(mean(h[src]^2) + eps), the factor y is computed with
  // (optional): router_logits_normed recomputes y from h and it.
  float* out_rstd = nullptr;
  // With delta: normalise h + delta without storing the sum back into h (the
  // MTP head, whose row_index may name one row several times).
  bool keep_h = false;
  // delta as delta_splits slices delta_split_stride floats apart (a K-split
  // linear's products, StreamTcTuning::split_stride), summed in slice order
  // before the add. 1: one delta.
  int delta_splits = 1;
  int64_t delta_split_stride = 0;
};
cudaError_t add_rmsnorm(const AddNormArgs& a, cudaStream_t st);

// moe_combine(y, inv, w, ..., add) followed by add_rmsnorm(a) with that sum as
// a.delta, in one launch (a.delta and a.row_index unset; the sum itself is not
// written): the end of a MoE layer and the next layer's input norm on one GPU.
// Bit-identical to the two kernels. slots <= 32; hidden / 4 <= 2048.
bool combine_add_rmsnorm_supported(int hidden, int slots);
cudaError_t combine_add_rmsnorm(const float* y, const int* inv, const float* w, int slots,
                                const float* add, const AddNormArgs& a, cudaStream_t st);
// The same with BF16 expert rows (gemm_fp8_grouped_tc_bf16's output),
// each value widened exactly to FP32 before the same sums.
cudaError_t combine_add_rmsnorm(const __nv_bfloat16* y, const int* inv, const float* w, int slots,
                                const float* add, const AddNormArgs& a, cudaStream_t st);

// Per token: q/k per-head RMSNorm (if weights given), partial NeoX RoPE on the
// first rot_dim dims (pairs j, j+rot/2; angle pos*inv_freq[j mod rot/2]), q
// written to q_out [T, n_q_heads, head_dim] (FP32), k and v written as BF16 into
// the paged caches at slot slots[t]: cache[(block*n_kv_heads + kvh)*block_size + off][d]
// (FP32 caches with kv_f32: the validation precision of the runtime).
// qkv row layout: [q heads | k heads | v heads], each head_dim wide. head_dim == 128.
// A token whose slot is < 0 (a padding row of a captured batch) writes q only.
struct QkRopeArgs {
  const float* qkv = nullptr;
  int T = 0, n_q_heads = 0, n_kv_heads = 0, head_dim = 128, rot_dim = 64;
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  float eps = 1e-5f;
  const float* inv_freq = nullptr;  // [rot_dim/2]
  const int* positions = nullptr;   // [T]
  const int* slots = nullptr;       // [T]
  int block_size = 16;
  float* q_out = nullptr;
  void* k_cache = nullptr;  // BF16, or FP32 when kv_f32
  void* v_cache = nullptr;
  int kv_f32 = 0;
  // qkv as a cuBLASLt FP8 GEMM left it, unscaled: with x_scale set, every value
  // is first taken to qkv[t][n] * x_scale[t] * w_scale[n] (+ bias[n]), what
  // gemm_fp8_epilogue would have written (one kernel fewer per layer).
  const float* x_scale = nullptr;
  const float* w_scale = nullptr;
  const float* bias = nullptr;
  // qkv as qkv_splits slices qkv_split_stride floats apart (a K-split linear's
  // scaled products, bias in the first; StreamTcTuning::split_stride), summed
  // in slice order. Not with x_scale. 1: one qkv.
  int qkv_splits = 1;
  int64_t qkv_split_stride = 0;
  // The FP8 KV cache (kv_fp8 = 1; block_size 16; not with kv_f32): k_cache and
  // v_cache hold e4m3 codes, K as [block][kvh][16 keys][128 dims] and V
  // transposed within a block, [block][kvh][128 dims][16 keys] (the decode
  // kernel's PV operand reads rows of one dim over 16 keys); every (token, KV
  // head) row has its own FP32 scale, amax / 448 (at least 2^-24 so zero rows
  // stay finite), in k_scale / v_scale [block][kvh][16]: value = code * scale.
  int kv_fp8 = 0;
  float* k_scale = nullptr;
  float* v_scale = nullptr;
};
constexpr int kKvFp8BlockSize = 16;  // the FP8 cache's block size (one decode tile)
cudaError_t qk_norm_rope_kv_write(const QkRopeArgs& a, cudaStream_t st);

// ------------------------------------------------------------ attention.cu
// One unit of attention work: query tokens [q_begin, q_begin+n_q) of sequence
// seq (consecutive positions), keys [k_begin, k_end) of that sequence, for one
// KV head (grid y). n_q * (n_q_heads / n_kv_heads) <= kAttnMaxRows. Items with
// n_splits > 1 must have n_q == 1 and write partials at index part (merged
// later by attention_merge); others write the normalised output.
constexpr int kAttnMaxRows = 64;
struct AttnItem {
  int seq, q_begin, n_q, k_begin, k_end, n_splits, part;
};
struct AttnMerge {
  int token, part, n_splits;
};
struct AttnArgs {
  const float* q = nullptr;  // [T, n_q_heads, 128]
  const void* k_cache = nullptr;  // BF16, or FP32 when kv_f32
  const void* v_cache = nullptr;
  int kv_f32 = 0;
  int block_size = 16, n_q_heads = 0, n_kv_heads = 0;
  float scale = 0;                   // 1/sqrt(head_dim)
  const int* positions = nullptr;    // [T]
  const int* seq_bt_offset = nullptr;// [n_seqs]
  const int* block_tables = nullptr;
  const AttnItem* items = nullptr;
  int n_items = 0;
  float* out = nullptr;      // [T, n_q_heads * 128]
  float* part_o = nullptr;   // [n_parts, n_q_heads, 128]
  float* part_ml = nullptr;  // [n_parts, n_q_heads, 2]
};
cudaError_t attention_paged(const AttnArgs& a, cudaStream_t st);

// Host-side planner: turns the step's sequences into work items. Query tokens
// are grouped kAttnMaxRows / G at a time (G = query heads per KV head); a
// single-token item whose context reaches 2 * kAttnSplitKeys keys is split
// over keys into pieces of ~kAttnSplitKeys (at most kAttnMaxSplits) merged by
// attention_merge. Returns false, with *why set, if a capacity is exceeded.
constexpr int kAttnSplitKeys = 512;
constexpr int kAttnMaxSplits = 16;
struct AttnSeqDesc {
  int q_begin;    // first token of the sequence in the step
  int n_q;        // its new tokens
  int start_pos;  // position of the first new token
};
struct AttnPlan {
  AttnItem* items;
  int max_items, n_items;
  AttnMerge* merges;
  int max_merges, n_merges;
  int max_parts, n_parts;
};
bool plan_attention(const AttnSeqDesc* seqs, int n_seqs, int G, AttnPlan* plan, const char** why);
cudaError_t attention_merge(const AttnMerge* merges, int n_merges, int n_q_heads,
                            const float* part_o, const float* part_ml, float* out,
                            cudaStream_t st);

// ----------------------------------------------------- attention.cu: prefill
// Prefill attention (several new tokens per sequence: whole prompts, chunked
// prefill, prefix-cache hits) over the paged BF16 KV cache, causal, flash
// style on tensor cores (bf16 wgmma m64n64k16 / m64n128k16 on sm_90, a
// warpgroup per 64 rows; bf16 mma.sync m16n8k16 elsewhere; FP32 accumulate
// and online softmax in FP32, exp2 with the scale folded into Q).
//
// Rows. For one KV head the G = n_q_heads / n_kv_heads query heads of every
// new token of a sequence form the sequence's query rows, in order:
//   row r  <->  token q_begin + r / G (of the step), head kvh * G + r % G.
// A work item covers `rows` (the plan's: 128, or 64) consecutive rows of one
// sequence (the last item of a sequence fewer; a token's heads may straddle
// two items), and a CTA (item, KV head) loads each 64-key K/V tile once for
// all of them. Its keys are [k_begin, k_end) with k_end <= the position of
// its last token + 1; row r attends keys <= positions[its token] (and <
// k_end). K/V of the new tokens must already be in the cache (the RoPE kernel
// writes them before attention).
//
// Splits. When the step has too little work per SM, the heaviest items are
// split over keys (whole 64-key tiles) into n_splits pieces; each writes its
// partial (O unnormalised, m, l) to the workspace, and the CTA that finishes
// last merges the pieces in split order (deterministic) and writes the rows.
// Items run heaviest first (longest key range first).
constexpr int kPrefillMaxRows = 128;       // most rows per item (workspace slots are this tall)
constexpr int kPrefillMaxCounters = 8192;  // merge counters: n_merges * n_kv_heads <= this
constexpr int kPrefillMaxSplits = 64;      // most pieces per split item
struct PrefillItem {
  int seq;           // index into seq_bt_offset
  int q_begin;       // step token (row of q, out, positions) of the sequence's first new token
  int row0, n_rows;  // the item's rows [row0, row0 + n_rows) of the sequence (see above)
  int k_begin, k_end;  // keys; k_begin a multiple of 64
  int n_splits;      // 1: writes the normalised output; > 1: one piece of a split item
  int part;          // n_splits > 1: this piece's workspace slot
  int part0;         // n_splits > 1: the first slot of the item (pieces use part0 .. part0+n_splits-1)
  int counter;       // n_splits > 1: the item's merge counter (0 .. n_merges-1)
};
struct PrefillAttnArgs {
  const float* q = nullptr;                // [T, n_q_heads, 128] FP32, RoPE applied
  const __nv_bfloat16* k_cache = nullptr;  // [blocks][n_kv_heads][block_size][128]
  const __nv_bfloat16* v_cache = nullptr;
  int block_size = 16;                     // a multiple of 16
  int n_q_heads = 0, n_kv_heads = 0;       // n_q_heads % n_kv_heads == 0 (any G)
  float scale = 0;                         // softmax scale, 1/sqrt(128)
  const int* positions = nullptr;          // [T]: position of each step token (start_pos + i)
  const int* seq_bt_offset = nullptr;      // [seqs] offset of a sequence's table in block_tables
  const int* block_tables = nullptr;
  const PrefillItem* items = nullptr;      // device copy of the plan's items
  int n_items = 0;                         // plan.n_items (grid: n_items x n_kv_heads)
  int rows = 0;                            // plan.rows
  int n_parts = 0;                         // plan.n_parts (> 0: the items include split pieces)
  float* out = nullptr;                    // [T, n_q_heads * 128] FP32 (only the items' rows written)
  // The FP8 cache (QkRopeArgs::kv_fp8's layout), instead of k_cache / v_cache:
  // sm_90 only; the tiles are widened to BF16 (code * scale) in shared memory
  // (128-row items: by the warp-specialized kernel's producer warpgroup).
  const uint8_t* k_cache8 = nullptr;
  const uint8_t* v_cache8 = nullptr;
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
  void* workspace = nullptr;               // attention_prefill_workspace_bytes(plan.max_parts,
                                           // n_kv_heads) bytes, zeroed once after allocation;
                                           // each launch leaves it reusable. Unused without splits.
};
// Whether attention_prefill takes this shape (block_size % 16 == 0, head_dim
// 128, n_q_heads % n_kv_heads == 0, n_kv_heads <= 65535); otherwise use
// plan_attention + attention_paged.
bool attention_prefill_supported(int n_q_heads, int n_kv_heads, int block_size);

// Host-side planner. For each sequence (seqs[s]: q_begin, n_q new tokens at
// start_pos; n_q == 0 is skipped) items of plan->rows rows (see above), keys
// [0, start_pos + last token of the item + 1). Split policy: with W the
// step's 64-key tiles summed over items and KV heads, an item of more than
// target = max(min_split_tiles, split_frac * W / num_sms) tiles is split into
// ceil(tiles / target) pieces (at most kPrefillMaxSplits), heaviest items
// first, while capacity lasts. Capacities (set by the caller):
//   max_items: items written to `items` (host array). Without splits a step
//     needs sum_s ceil(n_q_s * G / rows) items; more: returns false ("work
//     items exceed the planned capacity"). Each split adds n_splits - 1 items;
//     splits never make the plan fail (an item that does not fit stays whole).
//   max_parts: workspace slots for pieces (the workspace was sized for it);
//     0: never split.
//   merge counters: n_merges * n_kv_heads <= kPrefillMaxCounters.
// attention_prefill_max_items gives a max_items that always suffices.
// seq_index (optional): item.seq = seq_index[s] (the index of seqs[s] in
// seq_bt_offset); null: item.seq = s. Items are ordered heaviest first.
// num_sms: multiprocessors of the GPU (the split policy); <= 0: 132.
struct PrefillPlan {
  PrefillItem* items = nullptr;  // host array
  int max_items = 0;
  int max_parts = 0;
  int n_items = 0, n_parts = 0, n_merges = 0;  // out
  int rows = 0;                                // out: rows per item (PrefillAttnArgs::rows)
  int rows_in = 0;  // in: 64 or 128 forces that item height (tests); 0: the policy's
};
bool plan_prefill(const AttnSeqDesc* seqs, int n_seqs, int G, int n_kv_heads, int num_sms,
                  PrefillPlan* plan, const char** why, const int* seq_index = nullptr);
int attention_prefill_max_items(int max_tokens, int max_seqs, int G, int max_parts);
size_t attention_prefill_workspace_bytes(int max_parts, int n_kv_heads);
// cudaErrorInvalidValue for shapes it does not take (see attention_prefill_supported,
// rows not a kernel's, a split plan without workspace, null pointers).
cudaError_t attention_prefill(const PrefillAttnArgs& a, cudaStream_t st);

// ------------------------------------------------------ attention.cu: decode
// Decode attention (flash-decoding) over the paged BF16 KV cache: one query
// token per sequence; all G = n_q_heads / n_kv_heads query heads of a KV head
// in one CTA, so each KV byte is read once; tensor cores (bf16 mma) for QK^T
// and PV; the keys of a (sequence, KV head) split over up to max_splits CTAs
// whose partial results are combined inside the same launch. Everything that
// changes from step to step (context lengths, block tables, rows) is read from
// device memory: the launch depends only on n_seqs, n_kv_heads and max_splits,
// so it can be captured in a CUDA graph once per batch size and replayed.
// Prefill chunks (several query tokens of a sequence) use attention_prefill (or,
// for shapes it does not take, attention_paged).
constexpr int kDecodeMaxGroup = 16;  // query heads per KV head the decode kernel takes
struct DecodeAttnArgs {
  const float* q = nullptr;                // [rows, n_q_heads, 128] FP32, RoPE applied
  const __nv_bfloat16* k_cache = nullptr;  // [blocks][n_kv_heads][block_size][128]
  const __nv_bfloat16* v_cache = nullptr;
  int block_size = 16;                     // a multiple of 16
  int n_q_heads = 0, n_kv_heads = 0;       // n_q_heads / n_kv_heads <= kDecodeMaxGroup
  float scale = 0;                         // softmax scale, 1/sqrt(128)
  int n_seqs = 0;                          // sequences (host; part of the launch shape)
  const int* q_row = nullptr;              // [n_seqs] row of the sequence's query in q and out
  const int* ctx_len = nullptr;            // [n_seqs] attend to keys 0..ctx_len-1 (the new
                                           // token's included); 0: the out row is written as zeros
  const int* bt_offset = nullptr;          // [n_seqs] offset of the sequence's table in block_tables
  const int* block_tables = nullptr;
  int max_splits = 1;                      // most CTAs per (sequence, KV head) (host)
  float* out = nullptr;                    // [rows, n_q_heads * 128] FP32
  // Optional, only with n_kv_heads == 1: also the row quantized to FP8 exactly as
  // quant_rows_fp8 does (scale max(amax/448, 1/(448*512)), e4m3 RNE of y/scale).
  uint8_t* out_q = nullptr;                // [rows, n_q_heads * 128]
  float* out_scale = nullptr;              // [rows]
  void* workspace = nullptr;               // decode_attention_workspace_bytes(...) bytes, zeroed
                                           // once after allocation; each launch leaves it reusable
  // The FP8 cache (QkRopeArgs::kv_fp8's layout; block_size 16), instead of
  // k_cache / v_cache: e4m3 widened to f16 in registers, f16 mma, the K scales
  // applied to the scores and the V scales to P (sm_89+).
  const uint8_t* k_cache8 = nullptr;
  const uint8_t* v_cache8 = nullptr;
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
  // 1: launched with programmatic dependent launch. The CTAs then start while
  // the previous kernel runs (it must trigger its dependents early) and read
  // the metadata and block tables and prefetch their first KV tiles into L2
  // before waiting for it; everything else (q, KV, outputs, workspace) after.
  int pdl = 0;
  // 1: shared memory padded so that at most one CTA fits an SM. For an early
  // (pdl) launch whose grid fits one wave: its CTAs, resident before the
  // kernel ahead finishes, then spread over the SMs instead of packing two to
  // an SM on those the kernel ahead leaves free.
  int one_per_sm = 0;
  // What the host knows of the launch's longest context, a hint for the launch
  // form only (the results are the same bits for any contexts):
  // kDecCtxAny, or kDecCtxShort (every ctx_len <= kDecShortMaxCtx). The runtime
  // takes it from decode_attention_ctx_class and keeps a CUDA graph per class.
  int ctx_class = 0;
};
constexpr int kDecCtxAny = 0, kDecCtxShort = 1;
constexpr int kDecShortMaxCtx = 10240;
// The ctx_class a launch of n_seqs sequences with max_splits splits should
// carry when its longest context is max_ctx: kDecCtxAny where the launch form
// of this shape does not depend on it, so that a caller keying CUDA graphs by
// the class captures a second graph only where it pays.
int decode_attention_ctx_class(int n_seqs, int n_kv_heads, int max_splits, bool kv_fp8, int max_ctx);
// Split policy (host): the most CTAs per (sequence, KV head) for a batch of
// n_seqs on num_sms multiprocessors. Independent of context lengths, which the
// kernel reads on the device (short contexts use fewer of the splits).
// kv_fp8: the policy for the FP8 cache (twice the CTAs).
int decode_attention_splits(int n_seqs, int n_kv_heads, int num_sms, bool kv_fp8 = false);
size_t decode_attention_workspace_bytes(int n_seqs, int n_q_heads, int n_kv_heads, int max_splits);
// cudaErrorInvalidValue for shapes it does not take (block_size % 16, G > kDecodeMaxGroup,
// out_q with n_kv_heads != 1, ...): the caller then uses attention_paged.
cudaError_t attention_decode(const DecodeAttnArgs& a, cudaStream_t st);

// ----------------------------------------------------------------- gemm.cu
// FP8 linear y[r, n] = (sum_k xq[r,k] * W[n,k]) * xs[r] * ws[n] + bias[n].
// Weight-streaming tensor-core kernel (mma.sync m16n8k32 e4m3, weights as the
// 16-row operand, tokens as the 8-column operand) for few rows; groups give the
// grouped (MoE) form: group g uses weights W + g*N*K and rows
// [group_offsets[g], group_offsets[g+1]) whose activations are X[x_rows[r]].
// K % 128 == 0 (per split), N any.
// Dense (no groups): up to 32 rows (max_rows_per_group, else M) the weights
// are streamed through a cp.async pipeline in shared memory, K possibly split
// over the warps of a block (reduced in shared memory in a fixed order, so
// results are deterministic); more rows: a register-pipelined kernel. With
// ksplit > 1, K is also split over blocks (partials in ws + gemm_fp8_epilogue).
// Grouped: every group, whatever its size, through the pipelined kernel in
// row tiles of 8, 16 or 32 rows (typical_rows_per_group picks the height); a
// block serves one (group, tile) pair found on the device among the non-empty
// groups, and the blocks stride over the pairs, so the result never depends on
// the bounds below (they size the grid); a group taller than a tile streams its
// weights once per tile. When groups typically hold more than 32 rows (prefill)
// the whole-group dispatch of before runs instead (StreamTuning::legacy: a block
// per group, pipelined kernel up to a 32-row bound, register kernel above). A
// row's result depends only on K, the K-warps and the stage width, not on the
// tiling: a group that fits one tile gives bit for bit what the whole-group
// dispatch gives with the same K-warps (the register kernel sums like one K-warp).
struct StreamGemmArgs {
  const uint8_t* W = nullptr;       // [groups][N][K]
  const float* w_scale = nullptr;   // [groups][N]
  const float* bias = nullptr;      // [groups][N] or null
  const uint8_t* X = nullptr;       // [*, K] FP8 rows
  const float* x_scale = nullptr;   // [*]
  // Exactness-check path: FP32 activation rows [*, K] instead of X/x_scale
  // (y = sum_k x * float(W) * ws[n] + bias, CUDA cores, no activation
  // quantization; slow, for validation against float32 references).
  const float* Xf = nullptr;
  const int* x_rows = nullptr;      // null: identity
  const int* group_offsets = nullptr;  // null: one group of M rows
  int groups = 1, M = 0, N = 0, K = 0;
  // Host bound on the rows of a group (dense: <= M). Dense: picks the kernel and
  // its token tile (<= 8, 16, 32 rows: pipelined; more: register kernel).
  // Grouped: with max_active_groups sizes the grid (see below).
  int max_rows_per_group = 0;
  // Grouped form: an upper bound on the number of non-empty groups (e.g.
  // min(groups, rows x slots) for MoE); the grid then covers only that many
  // groups, each block finding its group among the non-empty ones. 0: all groups.
  // With row tiles an underestimate costs time, not correctness (the blocks
  // loop over any further pairs); with the whole-group dispatch (typical rows
  // above 32, or StreamTuning::legacy) a bound below the true count drops groups,
  // so pass a real bound.
  int max_active_groups = 0;
  // Grouped form: the rows a non-empty group typically has (MoE: the expected
  // rows of a routed expert, ceil(rows x top_k / n_routed_experts); GLM-4.7:
  // ceil(rows / 20)). Picks the row-tile height: <= 8: 8-row tiles, <= 16: 16,
  // <= 32: 32, more: the whole-group dispatch. 0: max_rows_per_group (else M),
  // i.e. the dispatch before this field unless that bound is <= 32. The grid covers
  //   items = min(A * ceil(B / R), A + ceil(A * U / R))   (group, tile) pairs,
  // A = min(groups, max_active_groups) (groups if 0), B = max_rows_per_group
  // (else M; R if neither is set), U = min(typical_rows_per_group, B) (B if 0),
  // R = the tile height; when a step has more pairs the blocks sweep again.
  int typical_rows_per_group = 0;
  int ksplit = 1;                   // >1 only without groups; needs ws
  float* Y = nullptr;               // [rows][ldy]
  int64_t ldy = 0;
  float* ws = nullptr;              // [ksplit][M][N] when ksplit > 1
  // Dense form, pipelined kernel (<= 32 rows): launch with programmatic
  // dependent launch (cudaLaunchKernelEx + ProgrammaticStreamSerialization). The
  // kernel may start while the previous kernel in the stream still runs (once
  // that kernel has executed griddepcontrol.launch_dependents in every block,
  // else when it finishes): it issues its first weight stages and an L2
  // prefetch of its weight slice (StreamTuning::pdl_prefetch), then
  // griddepcontrol.wait, then reads X / x_rows / scales and writes Y / ws. W
  // must not be written by any kernel still running (weights never are). Inside
  // stream capture the launch becomes a programmatic edge from a preceding
  // kernel node (a non-kernel predecessor: an ordinary edge). Grouped form in
  // row tiles, and gemm_fp8_stream_tc (dense or grouped): the same launch;
  // the blocks read nothing the previous kernel writes (offsets, rows,
  // activations) before griddepcontrol.wait, and before it only prefetch
  // prefetch_group's weights into L2 (below). Ignored
  // (plain launch) for the whole-group dispatch, the register kernel (> 32
  // rows), Xf, and the split-K epilogue, which is always a plain launch after
  // the GEMM.
  int pdl = 0;
  // Grouped form with pdl: a group whose rows are known to come (the shared
  // expert, a row for every token) — the blocks ask L2 for its [N, K] weights
  // (cp.async.bulk.prefetch.L2, spread over all blocks) while the kernel
  // before (the router) runs, so that its stream after the wait comes from
  // L2. -1: none.
  int prefetch_group = -1;
};
cudaError_t gemm_fp8_stream(const StreamGemmArgs& a, cudaStream_t st);
// Launch shape of the shared-memory pipelined kernel; 0 (or -1) = chosen from
// the shape and the GPU. Set by kernel_check to check and time every variant.
// A shape that does not fit (shared memory, K not a multiple of stage_k,
// stage_k > 128 with more than 8 rows per token tile), tile_rows without groups,
// or any launch setting where the register kernel runs (dense, or whole-group
// dispatch, with more than 32 rows) gives cudaErrorInvalidValue.
struct StreamTuning {
  int k_warps = 0;      // warps splitting K inside a block (1, 2, 4, 8)
  int row_tiles = 0;    // 16-row weight tiles per block (row_tiles * k_warps <= 8)
  int stages = 0;       // cp.async pipeline depth per warp (2..16)
  int l2_prefetch = -1; // weight loads' L2 prefetch hint: 0 none, 1 128 B, 2 256 B
  int stage_k = 0;      // K bytes per pipeline stage: 128, 256 or 512
  int tile_rows = 0;    // grouped: row-tile height 8, 16 or 32 (0: typical_rows_per_group)
  int legacy = 0;       // grouped: the dispatch before row tiles (a block per whole group,
                        // token tile from max_rows_per_group, > 32 rows: register kernel)
  int pdl_prefetch = -1;// pdl: bytes of each weight row (from its K start) prefetched into
                        // L2 before griddepcontrol.wait; -1: all of it while the weights fill
                        // at most half of L2, else the leading part that does; 0: none (the
                        // first pipeline stages are always issued before the wait)
};
cudaError_t gemm_fp8_stream_tuned(const StreamGemmArgs& a, const StreamTuning& tune,
                                  cudaStream_t st);
// How many K splits the dense streaming kernel should use for this shape on
// num_sms multiprocessors (1 if K cannot be split in multiples of 128).
int gemm_fp8_stream_splits(int M, int N, int K, int num_sms);

// -------------------------------------------------------- gemm_grouped.cu
// Grouped FP8 GEMM on the tensor cores for many rows per group (MoE prefill,
// where gemm_fp8_stream's weight streaming does little math per weight byte).
// The grouped form of StreamGemmArgs, same semantics: group g = sorted
// positions [group_offsets[g], group_offsets[g+1]) (offsets on the device;
// null: one group of M rows), A row of position p = X[x_rows ? x_rows[p] : p],
//   Y[p * ldy + n] = (sum_k A[p,k] W[g][n][k]) * x_scale[A row] * w_scale[g][n] + bias[g][n].
// Each non-empty group is cut into m-tiles of BM sorted rows (64 or 128); a
// CTA computes one (m-tile, n-tile) of BM rows x BN channels over the whole K
// on the tensor cores (cp.async pipeline through swizzled shared memory) and
// finds its group on the device: no host sync, no allocation, capturable in
// a CUDA graph. Deterministic: one CTA sums each output element, in a fixed
// order (bit-identical launches). Numerics by default: exact products, FP32
// sums (6e-6 relative to float64 at K = 5120 on random codes; gemm_fp8_stream,
// which sums in another order, agrees to the same). M is a bound on the total
// rows (off[groups] <= M; rows of Y past off[groups] are never touched) and
// sizes the grid: ceil(M / BM) + min(groups, M, max_active_groups if > 0)
// m-tiles, so max_active_groups must be a true bound when given.
// typical_rows_per_group (else M over the groups) picks the tile. Requires
// K % 128 == 0, N % 128 == 0, W and X 16-byte aligned, Y 8-byte aligned,
// ldy >= N and even; the FP32-activation path (Xf) and ksplit > 1 are not
// taken; pdl is ignored (plain launch). cudaErrorInvalidValue otherwise.
cudaError_t gemm_fp8_grouped_tc(const StreamGemmArgs& a, cudaStream_t st);
// Whether gemm_fp8_grouped_tc takes an N x K weight shape (N, K > 0 and
// multiples of 128; the pointer and ldy requirements above are the caller's).
bool gemm_fp8_grouped_tc_supported(int N, int K);
// Launch shape and numerics; grouped_check checks and times every variant.
// E (sm_90): the FP8 operands converted to FP16 on chip (weights into shared
// memory, activations into registers), wgmma f16 with FP32 accumulation.
// F (sm_90): wgmma on the FP8 operands, up to twice the tensor rate, with
// Hopper's FP8 accumulation (~13-bit alignment inside each k32 step) limited,
// as in cuBLASLt, to one 128-K stage per chain, chains summed in FP32: ~2e-4
// relative on random FP8 codes, the precision of lt_gemm_fp8 and
// torch._scaled_mm. M: mma.sync (exact; any sm_89+ GPU; on sm_90 it runs as
// FP16 HMMA). auto: M up to 32 rows a group (weights-bound), E64x128 up to
// 64, E128x256 above (with fp8_accum: W128x256 — W128x256Fast with
// fp8_accum 2 — and F64x256 up to 64 rows when K > 2048; M off sm_90). W: the F numerics (bit for bit F128x256's results)
// with a producer warpgroup (TMA weights through a tensor map encoded per
// call, cp.async gathered rows) and two consumer warpgroups handing stages
// over mbarriers, persistent CTAs (one per SM, raster order, panel as for F;
// with tile_counter they take tiles from a queue; one-m-tile groups' tiles
// are interleaved with heavier groups'), the producer finding each tile and
// gathering its epilogue factors a tile ahead of the consumers.
// W128x256Fast: W128x256 with every stage's chains accumulating straight
// into the output registers (no per-128-K chain from zero, no wait for it
// before the next): the tensor cores never drain between stages, at the
// precision of Hopper's FP8 accumulation over all of K (~13 fraction bits at
// each k32 step; measured ~1.3e-3 relative on random codes at K = 5120 —
// far below the 2^-4 steps of the FP8 activations it multiplies).
// An E, F or W tile on a GPU other than sm_90 gives cudaErrorInvalidValue.
enum GroupedTcTile {
  kGroupedTcAuto = 0,      // from the rows a group is expected to hold (and fp8_accum, the GPU)
  kGroupedTcE128x256 = 1,  // exact: 2 warpgroups x m64n256 f16
  kGroupedTcE128x128 = 2,  // exact: 2 warpgroups x m64n128 f16
  kGroupedTcE64x128 = 3,   // exact: 2 warpgroups x m64n64 f16, 2 CTAs per SM
  kGroupedTcF128x256 = 4,  // FP8 accumulation: 2 warpgroups x m64n256
  kGroupedTcF64x256 = 5,   // FP8 accumulation: 2 warpgroups x m64n128
  kGroupedTcM64x128 = 6,   // exact: 8 warps x 32x32 mma.sync
  kGroupedTcW128x256 = 7,  // F128x256 warp-specialized: TMA/cp.async producer warpgroup,
                           // 2 consumer warpgroups x m64n256, mbarrier pipeline, persistent
  kGroupedTcW128x128 = 8,  // the same, 2 consumer warpgroups x m64n128
  kGroupedTcW128x256Fast = 9,  // W128x256 with one FP8 chain over all of K (no promotion)
  kGroupedTcTiles = 10
};
struct GroupedTcTuning {
  int tile = kGroupedTcAuto;
  int panel = 0;      // m-tiles per raster panel (CTAs of a panel share n-tiles); 0: default
  // auto only: 1 picks an F or W tile (faster, cuBLASLt's FP8 precision);
  // 2 the same but W128x256Fast for the W tile (fastest; the precision of
  // CUTLASS's FP8FastAccum kernels, which vLLM runs for FP8 linears on sm_90).
  int fp8_accum = 0;
  // W tiles only: two zeroed ints on the device, the launch's tile queue
  // (CTAs take tiles as they finish instead of a fixed stride; the launch
  // leaves them zero again). One pair per stream: launches that share it must
  // not overlap. null: the fixed stride. The same outputs bit for bit.
  int* tile_counter = nullptr;
  // gate|up with SiLU·up in the epilogue (gemm_fp8_grouped_tc_bf16 only,
  // where gemm_fp8_grouped_tc_silu_supported): the weights of each group are
  // [gate (N/2 rows) | up (N/2 rows)], a tile's 256 channels are 128 gate
  // channels and their 128 up channels, and Y16 [rows][ldy >= N/2] gets
  // silu(gate) * up (common.cuh's silu_fast over the scaled FP32 sums) rounded
  // to BF16 — half the bytes of the gate|up rows, and no SiLU pass over them
  // (quant_rows_fp8_bf16 quantizes). Always the W128x256Fast tile.
  int silu_gate_up = 0;
};
// Whether the SiLU-fused gate|up runs here: an sm_90 device, N % 256 == 0,
// K % 128 == 0.
bool gemm_fp8_grouped_tc_silu_supported(int N, int K);
cudaError_t gemm_fp8_grouped_tc_tuned(const StreamGemmArgs& a, const GroupedTcTuning& tune,
                                      cudaStream_t st);
// The same with the outputs rounded to BF16 (nearest even) into Y16 [rows][a.ldy]
// (ldy even) instead of a.Y, which must be null. (A kernel argument of its own,
// not a StreamGemmArgs field: a field there changed the streaming kernels' code
// and made batch 1-4 decode steps ~2% slower on an H100.)
cudaError_t gemm_fp8_grouped_tc_bf16(const StreamGemmArgs& a, __nv_bfloat16* Y16, const GroupedTcTuning& tune,
                                     cudaStream_t st);

// Tensor-core weight streaming for decode-sized batches (gemm_stream_tc.cu,
// sm_90 only): the same Y as gemm_fp8_stream (dense or grouped, x_rows,
// bias), with the weights as the wgmma A operand streamed by TMA and the
// token rows (tiles of 16, 32, 64 or 128) as its B operand; FP32 promotion
// every 128 K (cuBLASLt's precision). M must be set (grouped: a bound on the
// sorted rows, e.g. rows x slots), K % 128 == 0, W and X 16-byte aligned.
// Splits of K over CTAs need the workspace: partials and per-tile counters
// that must be zero before the first launch (each launch leaves them zero);
// a launch splits no more than the workspace holds (none: one CTA per unit).
struct StreamTcWorkspace {
  float* partials = nullptr;
  size_t partial_floats = 0;
  int* counters = nullptr;
  int n_counters = 0;
};
struct StreamTcTuning {
  int token_tile = 0;  // 16, 32, 64, 128; 0: from max_rows_per_group (dense) or twice typical_rows_per_group
  int splits = 0;      // K splits per tile (1..64); 0: none (every split measured slower on an H200)
  // > 0 (>= M * ldy): the K splits' products are not summed here. Split s of
  // exactly `splits` (<= K / 128) writes its scaled product to the slice
  // Y + s * split_stride (split 0 adds the bias), and the kernel that reads Y
  // sums the slices in split order (add_rmsnorm's delta_splits, the rope
  // kernel's qkv_splits): no workspace, counter or fence between the splits.
  int64_t split_stride = 0;
  // > 0: at most this many CTAs (else one per SM), so that a launch on another
  // stream finds SMs free (stream_tc_check --experts-side: the shared expert
  // beside the routed experts; docs/perf.md 2026-11-30).
  int max_ctas = 0;
};
bool gemm_fp8_stream_tc_supported(int N, int K);
// The token tile the launch would choose (StreamTcTuning::token_tile 0).
int gemm_fp8_stream_tc_token_tile(const StreamGemmArgs& a);
cudaError_t gemm_fp8_stream_tc(const StreamGemmArgs& a, const StreamTcWorkspace& ws,
                               const StreamTcTuning& tune, cudaStream_t st);

// Y[r, n] = (sum_s ws[s][r][n]) * xs[r] * w_scale[n] + bias[n]  (dense, no groups)
cudaError_t gemm_fp8_epilogue(const float* ws, int ksplit, int M, int N, const float* x_scale,
                              const float* w_scale, const float* bias, float* Y, int64_t ldy,
                              cudaStream_t st);

struct LtAlgoCache;  // gemm.cu: the algorithm lt_tune_fp8 chose per call shape
struct LtGemm {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // Null: every call runs the heuristic's first algorithm. Else (lt_algo_cache_create)
  // a call whose shape lt_tune_fp8 timed runs the fastest algorithm found there.
  LtAlgoCache* algos = nullptr;
};
// The shape of one cuBLASLt FP8 call: the key of the algorithm cache.
struct LtShape {
  int M = 0, N = 0, K = 0;
  bool scaled = false;      // lt_gemm_fp8_scaled (else lt_gemm_fp8)
  bool bias = false;        // scaled with a bias epilogue
  bool accumulate = false;  // scaled, Y += product
};
LtAlgoCache* lt_algo_cache_create();
void lt_algo_cache_destroy(LtAlgoCache* c);
constexpr int kLtMaxCandidates = 16;  // candidates of cuBLASLt's heuristic tried per shape
struct LtTuneReport {
  int candidates = 0;  // the heuristic's candidates
  int best = -1;       // the one chosen (-1: none ran)
  float first_us = NAN, best_us = NAN;  // time per call of the heuristic's first and of the chosen
};
// Times every candidate of shape s (a CUDA graph of reps calls each, the
// weights rotated over Ws[0..nW) so that they come from HBM as in a decode
// step; Y is overwritten, or added to with accumulate) and keeps the fastest
// in lt.algos (calls of that shape then run it; the heuristic's first stays
// unless another is 3% faster). Synchronizes the stream: call it at start-up,
// never inside a step.
std::string lt_tune_fp8(const LtGemm& lt, const LtShape& s, const uint8_t* const* Ws, int nW,
                        const uint8_t* X, float* Y, const float* x_scale, const float* w_scale,
                        const float* bias, cudaStream_t st, int reps, LtTuneReport* report);
// cuBLASLt FP8 GEMM for many rows: D[M,N] (FP32, row-major) = Xq[M,K] * W[N,K]^T
// with unit scales; the caller applies gemm_fp8_epilogue (ksplit = 1) or the
// scales as it reads D. Returns "" on success, otherwise a description naming
// the failed call.
std::string lt_gemm_fp8(const LtGemm& lt, const uint8_t* W, const uint8_t* X, float* D, int M,
                        int N, int K, cudaStream_t st);
// The same with the scales (and bias) applied inside cuBLASLt, so no epilogue
// kernel follows: Y[r, n] = (sum_k X[r,k] W[n,k]) * x_scale[r] * w_scale[n] + bias[n]
// (per-row / per-column "outer vector" FP32 scales, bias as the epilogue;
// bias may be null). Sets *unsupported (and returns "") when this cuBLASLt
// or GPU has no such algorithm: the caller then uses lt_gemm_fp8 + epilogue.
// accumulate: Y += that product instead (cuBLASLt's C operand, beta 1, in
// place); Y is unchanged when *unsupported is set.
std::string lt_gemm_fp8_scaled(const LtGemm& lt, const uint8_t* W, const uint8_t* X, float* Y,
                               int M, int N, int K, const float* x_scale, const float* w_scale,
                               const float* bias, bool* unsupported, cudaStream_t st,
                               bool accumulate = false);

// BF16 x BF16 -> FP32 (cuBLAS, FP32 accumulate): C[M,N] = A[M,K] * B[N,K]^T
// (lm_head: A = normalised hidden rows, B = lm_head weight).
std::string gemm_bf16_nt(cublasHandle_t h, const __nv_bfloat16* A, const __nv_bfloat16* B,
                         float* C, int M, int N, int K, cudaStream_t st);
// FP32 SGEMM (no TF32): C[M,N] = A[M,K] * B[N,K]^T (router logits).
std::string gemm_f32_nt(cublasHandle_t h, const float* A, const float* B, float* C, int M, int N,
                        int K, cudaStream_t st);

// ------------------------------------------------------------------ moe.cu
// Router selection per token from FP32 router logits [T, E] (docs/model.md §3.6):
// sigmoid, + correction bias for selection, group-limited top-k (group score =
// sum of its top-2 biased scores, experts of other groups masked with -inf as
// transformers 5.x does; docs/model.md §3.6: 4.5x used 0.0), weights from
// the unbiased sigmoid, renormalised if norm_topk, x scaling. Writes, per token,
// slots = top_k (+1 if shared_local >= 0) entries:
//   ids[t*slots + j] = expert - expert_begin if that expert is local
//                      (expert_begin <= e < expert_begin + n_local) else -1
//   w[t*slots + j]   = routing weight; the last slot is the shared expert
//                      (id shared_local, weight 1) when shared_local >= 0.
// Also writes the global expert ids to topk_global [T, top_k] if non-null.
struct RouterArgs {
  const float* logits = nullptr;
  const float* bias = nullptr;
  int T = 0, E = 0, top_k = 0, n_group = 1, topk_group = 1, norm_topk = 1;
  float scale = 1.0f;
  int expert_begin = 0, n_local = 0, shared_local = -1;
  int slots = 0;  // entries per token (0: top_k + (shared_local >= 0)); an extra slot with
                  // shared_local < 0 gets id -1 (the shared expert lives on another GPU)
  int* ids = nullptr;
  float* w = nullptr;
  int* topk_global = nullptr;
  // Padding rows of a captured batch-size bucket: tokens t >= *n_valid get
  // ids -1 and weight 0 in every slot (the shared one too), so no expert sees
  // them. Null: all T rows are real.
  const int* n_valid = nullptr;
};
cudaError_t router_topk(const RouterArgs& a, cudaStream_t st);

// The router in one launch for decode-sized batches: logits = x · W^T in FP32
// (W the [E, H] FP32 router), router_topk's selection on them (sel.logits is
// unused; sel.ids / sel.w / sel.n_valid / sel.topk_global as in router_topk),
// then moe_align's sort of the selected (token, slot) pairs into offsets /
// sorted_rows / inv. T <= kRouterFusedMaxT, H % 4 == 0, x and W 16-byte aligned.
// workspace: router_fused_workspace_bytes(T, E) bytes, zeroed once after
// allocation; each launch leaves it reusable (launches on one stream, or in a
// graph, may share it). The size is non-decreasing in T and stops growing at
// T = 256, so one workspace sized for the largest T serves every smaller T.
// Logits are summed in a fixed order (ids / w deterministic); as with moe_align,
// the order of the rows inside a group of sorted_rows is not.
constexpr int kRouterFusedMaxT = 2048;
struct RouterFusedArgs {
  RouterArgs sel;
  const float* x = nullptr;  // [T, H]
  const float* W = nullptr;  // [E, H]
  int H = 0;
  int n_groups = 0;          // local expert groups (moe_align's n_groups)
  int* offsets = nullptr;    // [n_groups + 1]
  int* sorted_rows = nullptr;
  int* inv = nullptr;
  void* workspace = nullptr;
};
// Whether router_fused is the faster choice for this shape (else cuBLAS +
// router_topk + moe_align).
bool router_fused_supported(int T, int E, int H);
size_t router_fused_workspace_bytes(int T, int E);
cudaError_t router_fused(const RouterFusedArgs& a, cudaStream_t st);

// add_rmsnorm(n) followed by router_fused(a) on its output rows, in one
// launch (thread-block clusters, sm_90) for 2..112 decode rows: n.h += delta
// (its slices summed in order), y = RMSNorm(h) quantized into n.out_q /
// n.out_scale (n.out_f32 / n.out_rstd written if set), and a's selection and
// sort on y (a.x unused). Each element's operations are add_rmsnorm's and the
// selection router_topk's; the sum of squares runs in another order, so r (and
// with it an FP8 code) may differ from add_rmsnorm's by an ulp. n.rows ==
// a.sel.T, n.hidden == a.H; no row_index, keep_h or out_bf16. The workspace
// as router_fused's (router_fused_workspace_bytes; one int of it is used).
// cudaErrorNotSupported where add_rmsnorm_router_supported is false.
bool add_rmsnorm_router_supported(int T, int E, int H);
cudaError_t add_rmsnorm_router(const AddNormArgs& n, const RouterFusedArgs& a, cudaStream_t st);

// Router logits for prefill-sized batches (past router_fused), from the
// residual rows instead of the normed rows: logits[t, e] = sum_k y[t, k] W[e, k]
// (H % 32 == 0: 3xTF32 tensor-core products summed in FP32, else FP32 FMAs;
// a fixed order either way) with y[t, k] = norm_w[k] * (h[t, k] * rstd[t]),
// the very floats add_rmsnorm writes as out_f32 (rstd: its out_rstd; h as it
// left it, no row_index), so that norm need not write them: at a 2k-token
// prefill step that is 42 MB written and read again per MoE layer. E <= 32,
// H % 4 == 0, h / norm_w / W 16-byte aligned.
bool router_logits_normed_supported(int E, int H);
cudaError_t router_logits_normed(const float* h, const float* norm_w, const float* rstd, const float* W,
                                 float* logits, int T, int E, int H, cudaStream_t st);

// The prefill post-attention norm and the router's logits in one launch (one
// read of h from HBM instead of two): n as add_rmsnorm takes it with no delta
// (o_proj already added into h), no row_index, FP8 rows out (out_q,
// out_scale; out_rstd optional; no FP32 or BF16 rows), and logits [rows][E]
// as router_logits_normed computes them from those rows — here as r times
// the sum of (w * h) * W (3xTF32), r = 1 / rms. The codes are add_rmsnorm's
// y = w * (h * r) quantized with the scale max(r * max|w * h| / 448, min),
// which may differ from add_rmsnorm's max|y| / 448 in its last bits (and r
// itself, its sum of squares taken in another order). E <= 24, H % 32 == 0,
// h, weight, W 16-byte aligned, out_q 8-byte aligned.
bool rmsnorm_router_logits_supported(int E, int H);
cudaError_t rmsnorm_router_logits(const AddNormArgs& n, const float* W, float* logits, int E, cudaStream_t st);

// Sort (token, slot) pairs by local expert: offsets[G+1], sorted_rows[pos] =
// token, inv[t*slots+j] = pos (or -1 for non-local slots). One block.
cudaError_t moe_align(const int* ids, int T, int slots, int n_groups, int* offsets,
                      int* sorted_rows, int* inv, cudaStream_t st);

// delta[t, :] = sum_j w[t*slots+j] * y[inv[t*slots+j], :]   (inv < 0 skipped)
//              (+ add[t, :], last, when add is set: the shared expert run as a dense MLP)
cudaError_t moe_combine(const float* y, const int* inv, const float* w, int T, int slots, int H,
                        float* delta, cudaStream_t st, const float* add = nullptr);

// ------------------------------------------------------------ moe_decode.cu
// The MoE half of a one-token decode layer on one GPU in one launch (one CTA
// per SM, cooperative): h += delta; x = RMSNorm(h) (FP32 for the router, FP8
// for the experts); the router (logits in FP32, router_topk's selection,
// sel.ids / sel.w written if set, offsets if set); for every slot whose
// expert is on this GPU (the shared expert at slot top_k) gate|up, SiLU·up,
// the activations to FP8 per slot, down; h += sum over those slots, in slot
// order, of w * y; then the next layer's input norm of h into out_q /
// out_scale (FP8). What add_rmsnorm + router_fused + the grouped streaming
// GEMMs + silu_mul_quant_fp8 + combine_add_rmsnorm compute, to FP32 rounding
// (other summation orders; a routing can differ from theirs only at a
// near-tie of two logits). Expert weights [groups][2*MI][H] / [groups][H][MI]
// with per-row scales; router W [E][H] FP32. workspace:
// moe_decode_t1_workspace_bytes, zeroed once after allocation (each launch
// leaves it reusable; launches on one stream or in a graph may share it).
// moe_decode_t1_supported checks the shape (H % 128 == 0, H <= 8192, MI % 64
// == 0, MI <= 4096, E <= min(512, H), slots <= 16) and the current device
// (sm_90, at least H / 128 SMs, the shared memory); what it refuses, the
// launch returns as cudaErrorInvalidValue.
struct MoeT1Args {
  float* h = nullptr;             // [H] residual row (updated)
  const float* delta = nullptr;   // [H] o_proj's output, added first (optional)
  const float* post_norm = nullptr;
  float eps = 1e-5f;
  int H = 0, MI = 0;
  const float* router_W = nullptr;
  RouterArgs sel;  // T = 1; logits and n_valid unused
  const uint8_t* e_gu = nullptr;
  const float* e_gu_scale = nullptr;
  const uint8_t* e_down = nullptr;
  const float* e_down_scale = nullptr;
  int n_groups = 0;
  int* offsets = nullptr;         // [n_groups + 1] (optional; moe_align's)
  const float* next_norm = nullptr;
  uint8_t* out_q = nullptr;       // [H]
  float* out_scale = nullptr;     // [1]
  void* workspace = nullptr;
  // Benches only: [9][grid] %globaltimer stamps of each CTA's phases (start,
  // router partials out, norm done, gate|up done, activations ready, down
  // start, down done, the last CTA's norm start and end); null otherwise.
  unsigned long long* trace = nullptr;
};
bool moe_decode_t1_supported(int H, int MI, int E, int slots);
size_t moe_decode_t1_workspace_bytes(int H, int MI, int E, int slots);
cudaError_t moe_decode_t1(const MoeT1Args& a, cudaStream_t st);

// ------------------------------------------------------------ attn_layer.cu
// The attention half of a one-token decode layer on one GPU in one launch (one
// CTA per SM, cooperative), from the layer's FP8 input row: qkv = x . Wqkv
// (per-row scales, + bias); q and k heads RMSNorm (q_norm / k_norm, optional)
// + RoPE (the first rot_dim dims, rotate_half); the new token's K and V (BF16)
// into the paged cache at slots[0] (unless < 0); attention of the n_q_heads
// query heads (GQA: head h reads KV head h / (n_q_heads / n_kv_heads)) over
// keys [0, ctx_len[0]) of the sequence (block table at block_tables +
// bt_offset[0]; the last key is the new token's) with scores q.k * scale;
// the output row quantized to FP8 per row; delta = o . Wo (per-row scales,
// FP32, [H]). What add-free q|k|v gemm_fp8_stream + qk_norm_rope_kv_write +
// attention_decode (FP8 output) + o_proj gemm_fp8_stream compute, to FP32
// rounding (other summation orders; an FP8 code of the attention output may
// move one step). head_dim 128, BF16 cache. workspace:
// attn_layer_t1_workspace_bytes(n_q_heads, n_kv_heads, ctas >= the device's
// SMs), zeroed once after allocation (each launch leaves it reusable).
// attn_layer_t1_supported checks the shape (H % 64 == 0, H <= 8192, n_q_heads
// <= 16, n_kv_heads <= 8, rot_dim % 8 == 0, <= 128) and the current device
// (sm_90, at least 4 * n_q_heads SMs, the shared memory).
struct AttnT1Args {
  const uint8_t* xq = nullptr;  // [H] FP8 input row
  const float* xs = nullptr;    // [1] its scale
  int H = 0, n_q_heads = 0, n_kv_heads = 0, rot_dim = 64;
  const uint8_t* qkv_w = nullptr;  // [(n_q_heads + 2 n_kv_heads) * 128][H]
  const float* qkv_scale = nullptr;
  const float* qkv_bias = nullptr;  // optional
  const float* q_norm = nullptr;    // [128], optional
  const float* k_norm = nullptr;
  float eps = 1e-5f;
  const float* inv_freq = nullptr;  // [rot_dim / 2]
  const int* positions = nullptr;   // [1]
  const int* slots = nullptr;       // [1]
  const int* ctx_len = nullptr;     // [1]
  const int* bt_offset = nullptr;   // [1]
  const int* block_tables = nullptr;
  int block_size = 16;
  __nv_bfloat16* k_cache = nullptr;  // [blocks][n_kv_heads][block_size][128]
  __nv_bfloat16* v_cache = nullptr;
  // The FP8 cache (QkRopeArgs::kv_fp8's layout; block_size 16) instead of
  // k_cache / v_cache: a split's blocks are copied as codes and widened to
  // BF16 (code * scale) in shared memory; the new token's row is quantized
  // as the rope kernel does it and attended as its dequantized value.
  uint8_t* k_cache8 = nullptr;
  uint8_t* v_cache8 = nullptr;
  float* k_scale = nullptr;
  float* v_scale = nullptr;
  float scale = 0.f;                 // softmax scale (1 / sqrt(128))
  const uint8_t* o_w = nullptr;      // [H][n_q_heads * 128]
  const float* o_scale = nullptr;
  float* delta = nullptr;            // [H]
  void* workspace = nullptr;
  int ws_ctas = 0;                   // the CTAs the workspace was sized for
  // Benches only: [22][grid] stamps; rows 0-10 each CTA's %globaltimer at
  // its phases (start, q|k|v out, q|k|v polled, q/k norm + RoPE done,
  // attention done, split out, merge polled, merge out, o_proj weights
  // requested, output polled, o_proj done), rows 11-21 its clock64 at the
  // same points; null otherwise.
  unsigned long long* trace = nullptr;
};
bool attn_layer_t1_supported(int H, int n_q_heads, int n_kv_heads, int rot_dim);
size_t attn_layer_t1_workspace_bytes(int n_q_heads, int n_kv_heads, int ctas);
cudaError_t attn_layer_t1(const AttnT1Args& a, cudaStream_t st);

// ---------------------------------------------------------------- embed.cu
// h[t, :] = float(table[ids[t], :])
cudaError_t embed_gather(const __nv_bfloat16* table, const int* ids, int T, int H, float* h,
                         cudaStream_t st);
// Vocab-parallel logits: parts [tp][rows][v_local] -> out [rows][tp*v_local].
cudaError_t logits_interleave(const float* parts, int tp, int rows, int v_local, float* out,
                              cudaStream_t st);

// -------------------------------------------------------------- sampling.cu
// GPU sampling that mirrors pkg/sample (docs/engine.md) rule for rule, in
// float64: penalties on the raw logits -> greedy argmax (ties: lowest id), or
// temperature -> softmax numerators relative to the max -> min-p -> top-k
// (ties with the k-th kept) -> top-p (in order of decreasing weight, ties:
// lower id) -> one inverse-CDF draw over ascending ids with
// u = Uniform(seed, sample_index) (SplitMix64, pkg/sample/rng.go).
// Logprobs: log-softmax of the raw logits; top-n by raw logit, ties: lower id.
// Sums run in parallel here and sequentially on the CPU, so the two agree
// except when u lands within rounding (~1e-16 relative) of a CDF boundary.
constexpr int kMaxTop = 20;
struct SampleRow {
  float temperature;        // <= 0: greedy
  int top_k;                // <= 0 or >= V: off
  float top_p;              // <= 0 or >= 1: off
  float min_p;              // <= 0: off
  float repetition_penalty; // 0 or 1: off
  float frequency_penalty, presence_penalty;
  int n_top;                // top logprobs wanted (0..kMaxTop)
  uint64_t seed;
  int64_t sample_index;
  int sort_segment;         // index of this row's segment in the sort (top-k/top-p rows), else -1
  int skip;                 // 1: row has logits but is not sampled (token -1, status 0)
  int mask_row = -1;        // row of SampleArgs.masks limiting the draw, else -1
  // A draft token to verify at this row (speculative decoding), else -1.
  // Sampling rows (temperature > 0) then decide it by the rule of
  // pkg/sample/verify.go: with p the distribution the row draws from, the
  // draft is the row's token when AcceptUniform(seed, sample_index) <
  // p[draft]; otherwise the token is drawn from p without the draft,
  // renormalised, with Uniform(seed, sample_index). Greedy rows ignore it (the
  // caller compares the argmax with the draft).
  int draft = -1;
};
// status: 0 ok, 1 a logit is NaN or +Inf, 2 every logit is -Inf,
// 3 every logit is -Inf after penalties, 4 no token left to sample,
// 5 the token mask allows no token with a finite logit.
struct SampleOut {
  int token;
  float logprob;
  int status;
  int pad;
};
struct SampleArgs {
  const float* logits = nullptr;     // [rows][ld]
  int64_t ld = 0;
  int rows = 0, V = 0;
  const SampleRow* params = nullptr; // [rows] (device)
  // Penalty entries (device): distinct tokens per row.
  const int* pen_row = nullptr;
  const int* pen_token = nullptr;
  const int* pen_prompt = nullptr;
  const int* pen_output = nullptr;
  int n_pen = 0;
  // Segmented descending sort of the rows with top-k/top-p: segment s covers
  // w[seg_begin[s] .. seg_end[s]) (= row*V .. row*V+V).
  const int* seg_begin = nullptr;
  const int* seg_end = nullptr;
  int n_seg = 0;
  // Token masks (device), mask_words per row: a row with SampleRow.mask_row
  // >= 0 may draw token t only if bit t % 32 of word t / 32 is set; the
  // others are -Inf from the start (before the penalties, which leave -Inf
  // as it is: the CPU's order, penalties then mask, gives the same weights).
  const uint32_t* masks = nullptr;
  int mask_words = 0;
  // Workspace (device), sized by sample_workspace_bytes.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  SampleOut* out = nullptr;          // [rows]
  int* top_ids = nullptr;            // [rows][kMaxTop]
  float* top_lp = nullptr;           // [rows][kMaxTop]
};
size_t sample_workspace_bytes(int rows, int V);
cudaError_t sample_rows(const SampleArgs& a, cudaStream_t st);

// ----------------------------------------------------------- speculative.cu
// Speculative decoding with the MTP layer (docs/speculative.md).
//
// One sequence that samples and runs the draft model in a step: its logits
// rows logit_row0 .. logit_row0 + n_drafts (sampled into SampleOut), the
// token row of its first verify position tok_row0 (its drafts are the tokens
// at rows tok_row0 + 1 .. tok_row0 + n_drafts); for chained proposals, its
// block table (bt_offset into the step's tables, bt_len blocks) and the drafts
// it proposes.
struct SpecSeq {
  int logit_row0, n_drafts, tok_row0, bt_offset, bt_len, propose, pad[2];
};
// Per SpecSeq i < *n (device; the launch covers cap >= it, so that a captured
// graph serves any count): a = the accepted drafts (the longest prefix whose
// sampled token equals the draft, a row with a non-zero status ending it),
// the row's token y after them; mtp_next[tok_row0 + a] = y (0 if that row
// could not be sampled) and mtp_rows[i] = tok_row0 + a: the MTP input at the
// last valid position and the row its draft is read from. mtp_rows[i] = 0
// for n <= i < cap.
cudaError_t spec_accept(const SampleOut* out, const SpecSeq* seqs, const int* n, int cap,
                        const int* tokens, int* mtp_next, int* mtp_rows, cudaStream_t st);
// The MTP layer's input rows: out[r, 0:H] = bf16(enorm * RMSNorm(embed[next[r]]))
// and out[r, H:2H] = bf16(hnorm * RMSNorm(hid[r])) (FP32 statistics), the
// concatenation eh_proj reads. next[r] outside [0, V) reads token 0.
cudaError_t mtp_input(const __nv_bfloat16* embed, int V, const int* next, const float* hid,
                      const float* enorm, const float* hnorm, int rows, int H, float eps,
                      __nv_bfloat16* out, cudaStream_t st);
// Chained pass j >= 2 of the draft model: one row per entry i < cap, at
// position positions[mtp_rows[i]] + j - 1 (the sequence's last valid position
// v, found by spec_accept, plus j - 1), MTP input token prev[i] (draft j - 1)
// and hidden input hid[i] = h[src] + delta[src], the previous pass's MTP
// output (src = mtp_rows[i] for j == 2, else i). Writes the rows' positions,
// KV slots and decode-attention entries (query row i over keys 0..p). An
// entry i >= *n (padding of the captured pass), or one past its propose
// count or its block table, gets slot -1 and no keys: it writes no KV.
struct ChainRows {
  int *pos, *slot, *dec_qrow, *dec_ctx, *dec_bt, *tok;
};
cudaError_t spec_chain_rows(const SpecSeq* seqs, const int* n, int cap, int j, const int* positions,
                            const int* mtp_rows, const int* block_tables, int block_size,
                            const float* h, const float* delta, int H, const int* prev, ChainRows out,
                            float* hid, cudaStream_t st);
// out[r] = argmax of x[r, 0:V) (ties: lowest id; NaN never wins; 0 if none).
cudaError_t argmax_rows(const float* x, int64_t ld, int rows, int V, int* out, cudaStream_t st);

}  // namespace glmk
