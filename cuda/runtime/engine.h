// engine.h — the runtime's internal state (not part of the ABI). One Engine
// drives tensor_parallel GPUs ("ranks"): attention heads, dense-MLP rows and the
// lm_head vocabulary are split over ranks (tensor parallel), routed experts are
// split over ranks (expert parallel), the shared expert runs on rank 0 as one
// extra local expert, and the sub-layer outputs are summed with NCCL.
//
// Numerics (docs/model.md §3, §4): residual stream FP32; RMSNorm statistics
// FP32; every quantized linear takes per-token dynamic FP8 activations and
// FP8 weights with per-row scales, accumulates in FP32; q/k/v biases FP32;
// router, sigmoid, top-k and softmax FP32; KV cache BF16; lm_head BF16 x BF16
// (the normed hidden rounded to BF16) with FP32 accumulation; sampling FP64.
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <unordered_map>
#include <vector>

#include "../comm/comm.h"
#include "../kernels/kernels.h"
#include "glmrt.h"

namespace glmrt {

// ---- errors (thread-local last error, see glmrt.h) ----
void set_error(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
int fail(int code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
// Returns GLMRT_OK or fails with GLMRT_ERR_CUDA naming what.
int check_cuda(cudaError_t e, const char* what);
#define GLMRT_TRY(expr)             \
  do {                              \
    int rc_ = (expr);               \
    if (rc_ != GLMRT_OK) return rc_; \
  } while (0)
#define GLMRT_CUDA(call, what) GLMRT_TRY(::glmrt::check_cuda((call), (what)))

// ---- what the checkpoint holds (one entry per expected tensor) ----
enum class Role {
  Embed, LmHead, FinalNorm,
  InNorm, PostNorm,
  QW, QS, QB, KW, KS, KB, VW, VS, VB, OW, OS, QNorm, KNorm,
  DGateW, DGateS, DUpW, DUpS, DDownW, DDownS,
  RouterW, RouterB,
  EGateW, EGateS, EUpW, EUpS, EDownW, EDownS,  // expert = index, or E for the shared expert
  MtpENorm, MtpHNorm, MtpEhProj, MtpHeadNorm,  // the MTP layer's own (draft_tokens > 0)
  MtpSkip,                                     // MTP layer: shape-checked, not uploaded
};
enum DClass { kFp8, kScale, kHigh };  // F8_E4M3 | F32/BF16 scale | F32/BF16 values
struct Piece {
  Role role;
  int layer, expert;
  int64_t rows, cols;  // cols == 0: 1-D [rows]; scales accept [rows] and [rows, 1]
  DClass dclass;
  bool loaded;
};

// ---- device state of one GPU ----
struct LayerDev {
  bool moe = false;
  float *in_norm = nullptr, *post_norm = nullptr;
  uint8_t* qkv = nullptr;  // [qkv_rows, H]: q heads | k heads | v heads of this rank
  float *qkv_scale = nullptr, *qkv_bias = nullptr;
  float *q_norm = nullptr, *k_norm = nullptr;
  uint8_t* o = nullptr;  // [H, nq_l*D]
  float* o_scale = nullptr;
  // dense MLP: gate rows then up rows of this rank; down columns of this rank
  uint8_t *gu = nullptr, *down = nullptr;
  float *gu_scale = nullptr, *down_scale = nullptr;
  // MoE: FP32 router (replicated), local experts [+ shared on rank 0]
  float *router = nullptr, *router_bias = nullptr;
  uint8_t *e_gu = nullptr, *e_down = nullptr;  // [G][2*MI][H], [G][H][MI]
  float *e_gu_scale = nullptr, *e_down_scale = nullptr;
  void *k_cache = nullptr, *v_cache = nullptr;  // [blocks][nkv_l][bs][D], BF16 (FP32 if f32kv)
  // kv8: e4m3 codes (glmk::QkRopeArgs::kv_fp8's layout) and their scales [blocks][nkv_l][16]
  float *k_scale = nullptr, *v_scale = nullptr;
};

struct Rank {
  int index = 0, device = 0, num_sms = 0;
  // sm_90 (wgmma, TMA): the routed experts' gate|up past kStreamMaxRows rows
  // run through gemm_fp8_stream_tc instead of gemm_fp8_stream's row tiles.
  bool stream_tc = false;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  glmk::LtGemm lt;
  int lt_scaled = -1;  // cuBLASLt applies the FP8 scales itself: -1 not yet known, 0 no, 1 yes
  int lt_accumulate = -1;  // ... and also adds the product to its output (C = D): likewise
  // The last attention_block's o_proj added its product to h itself (linear's
  // acc_into): the mlp_block of the same layer then normalises h without a delta.
  bool o_in_h = false;
  // ... or left it as o_splits K-split slices in lin_parts, o_split_stride
  // floats apart, for the post-attention norm to sum (1: in delta or h).
  int o_splits = 1;
  int64_t o_split_stride = 0;
  std::vector<void*> allocations;
  int64_t weight_bytes = 0, kv_bytes = 0, workspace_bytes = 0;

  int n_local_experts = 0;  // routed experts on this rank
  int expert_begin = 0;
  int groups = 0;           // n_local_experts (+1 with the shared expert)
  int shared_local = -1;    // group index of the shared expert, or -1

  std::vector<LayerDev> layers;
  __nv_bfloat16* embed = nullptr;    // [V, H] (replicated)
  __nv_bfloat16* lm_head = nullptr;  // [V_l, H]
  float* lm_head_f32 = nullptr;      // [V_l, H] (fp32_cache_and_head)
  float* final_norm = nullptr;
  float* inv_freq = nullptr;
  // The MTP layer (draft_tokens > 0): its decoder layer is layers[L]; these
  // are its input norms, the [embedding ; hidden] projection and the norm
  // before the shared lm_head.
  float *mtp_enorm = nullptr, *mtp_hnorm = nullptr, *mtp_head_norm = nullptr;
  __nv_bfloat16* mtp_eh_proj = nullptr;  // [H, 2H]

  // workspaces (sized for max tokens / seqs at create)
  float *h = nullptr, *delta = nullptr, *xf = nullptr;
  float* rstd = nullptr;  // the post-attention norm's 1/rms per row (router_logits_normed)
  uint8_t* xq = nullptr;
  float* xs = nullptr;
  float *qkv = nullptr, *q = nullptr, *attn = nullptr;
  float* big = nullptr;       // gate|up outputs
  uint8_t* hq = nullptr;      // SiLU*up FP8
  float* hs = nullptr;
  float* hf = nullptr;        // SiLU*up FP32 (exact mode)
  float* ysort = nullptr;     // expert outputs in sorted order
  float* split_ws = nullptr;  // split-K partials
  // The slices of K-split linears whose next kernel sums them (linear's
  // SplitOut: q|k|v for the rope kernel, o_proj for the post-attention norm).
  float* lin_parts = nullptr;
  size_t lin_parts_floats = 0;
  float* router_logits = nullptr;
  int *topk_ids = nullptr, *offsets = nullptr, *sorted_rows = nullptr, *inv = nullptr;
  // The prefill experts' GEMMs' tile queue (GroupedTcTuning::tile_counter):
  // two ints, zero between launches; the rank's launches are serialized on
  // its stream.
  int* tile_queue = nullptr;
  float* topk_w = nullptr;
  float *part_o = nullptr, *part_ml = nullptr;
  __nv_bfloat16* final_bf16 = nullptr;
  float* final_f32 = nullptr;
  float* logits_local = nullptr;   // [max_seqs, V_l]
  float* logits_gather = nullptr;  // [tp, max_seqs, V_l] (tp > 1)
  float* logits = nullptr;         // [max_seqs, V] (rank 0)
  unsigned char* meta = nullptr;   // the step's metadata (device copy)
  void* dec_ws = nullptr;          // attention_decode workspace (zeroed at create)
  void* pf_ws = nullptr;           // attention_prefill workspace (zeroed at create; prefill_tc)
  void* router_ws = nullptr;       // router_fused workspace (zeroed at create)
  void* moe_t1_ws = nullptr;       // moe_decode_t1 workspace (zeroed at create; null: not used)
  void* attn_t1_ws = nullptr;      // attn_layer_t1 workspace (zeroed at create; null: not used)
  int* prof_active = nullptr;      // [L] experts hit per layer (profiling)
  // The shared expert as a dense MLP (steps of more than a few rows).
  float* sh_big = nullptr;         // [T, 2*MI] gate|up
  uint8_t* sh_hq = nullptr;        // [T, MI] SiLU*up FP8
  float* sh_hs = nullptr;          // [T]
  float* sh_out = nullptr;         // [T, H]
  void* sample_ws = nullptr;
  size_t sample_ws_bytes = 0;
  glmk::SampleOut* sample_out = nullptr;
  int* top_ids = nullptr;
  float* top_lp = nullptr;
  // The draft pass (draft_tokens > 0).
  float* mtp_hid = nullptr;              // [T, H] the target's final-normed rows (h_i)
  __nv_bfloat16* mtp_cat = nullptr;      // [T, 2H] [enorm(embed(next)) ; hnorm(h_i)]
  int* mtp_draft = nullptr;              // [draft_k][max_seqs] the proposals, pass by pass
};

struct Dims {  // derived per-rank sizes
  int H, L, D, rot, nq, nkv, nq_l, nkv_l, qkv_rows, I, I_l, MI, E, E_l, K, slots, V, V_l;
  int first_dense;
};

// Byte offsets of the step's metadata arrays in the pinned host buffer and its
// device copy. Region A holds what the forward reads and has fixed offsets
// (sized for the largest step), so a captured CUDA graph always finds its
// inputs at the same addresses; the block tables come last so that one copy
// of [0, bt + used) sends it. Region B (sampling, prefill attention plan) is
// packed per step and read only outside graphs.
struct MetaLayout {
  size_t tokens, positions, slots;      // [max_tokens]
  size_t dec_qrow, dec_ctx, dec_bt;     // [max_seqs] decode sequences: query row, keys, table offset
  size_t bt_off;                        // [max_seqs]
  size_t logit_rows;                    // [max_logit_rows]
  size_t n_valid;                       // [1] real rows of a padded (graph) step
  // The draft pass (draft_tokens > 0): the MTP input token of every row, the
  // SpecSeq entries and their count, the rows the drafts are read from
  // (written on the GPU by spec_accept). In region A so that a captured draft
  // pass finds them at fixed addresses.
  size_t mtp_next;                      // [max_tokens]
  size_t spec, n_spec, mtp_rows;        // [max_seqs], [1], [max_seqs]
  // The chained passes (draft_k > 1): their rows' positions, KV slots,
  // decode entries and MTP input tokens, written on the GPU (spec_chain_rows).
  size_t chain_pos, chain_slot, chain_dq, chain_dc, chain_db, chain_tok;  // [max_seqs] each
  size_t bt;                            // [max_seqs * max_blocks_per_seq]
  size_t b_begin;                       // region B starts here
  size_t total;
};

// Decode-attention context classes a bucket's graphs are kept for
// (glmk::kDecCtxAny, kDecCtxShort).
constexpr int kCtxClasses = 2;
static_assert(glmk::kDecCtxShort < kCtxClasses, "a graph slot per context class");

// One captured decode step (tensor_parallel 1): embedding to logits for a
// batch of `bucket` sequences of one token each.
struct StepGraph {
  cudaGraphExec_t exec = nullptr;
  int seen = 0;                      // steps of this bucket so far (capture on the second)
  int captured_events = 0;           // events recorded inside the graph (profiling)
  std::vector<cudaEvent_t> events;   // profiling graphs: one event after each launch
  std::vector<int> families;
};

// Profiling state (profile.cu).
struct Profiler {
  bool on = false;
  bool capturing = false;           // the launches go into a graph being captured
  std::vector<cudaEvent_t> pool;    // eager steps: events reused every step
  std::vector<cudaEvent_t>* events = nullptr;  // where this step's events go
  std::vector<int>* families = nullptr;
  std::vector<int> eager_families;
  int n = 0;                        // events recorded this step (the first marks its start)
  bool graph_step = false;
  glmrt_profile acc{};
  int64_t step_bytes[GLMRT_PROF_N] = {};
};

struct PendingStep;  // step.cu: a step between glmrt_step_begin and glmrt_step_finish

struct Engine {
  glmrt_model_config cfg{};
  glmrt_engine_options opt{};
  Dims d{};
  int tp = 1, block_size = 16, num_blocks = 0, max_tokens = 0, max_seqs = 0, max_blocks_per_seq = 0;
  int max_pen = 0, max_items = 0, max_merges = 0, max_parts = 0, sample_chunk = 0;
  // Speculative decoding: draft_k = options.draft_tokens (the MTP layer is
  // loaded, as layers[L], when > 0). A sequence verifying drafts has a logits
  // row per verify position, so logits, sampling rows and their results are
  // sized for max_logit_rows = max_seqs * (1 + draft_k); pen_cap is the
  // penalty entries those rows may need (each row its own history).
  int draft_k = 0, max_logit_rows = 0;
  int64_t pen_cap = 0;
  // Prefill tokens (several new tokens of a sequence) go through attention_prefill
  // (tensor cores, BF16 cache) when prefill_tc, else attention_paged (the FP32
  // validation paths). pf_max_items / pf_max_parts: its plan's capacities.
  bool prefill_tc = false;
  int pf_max_items = 0, pf_max_parts = 0;
  size_t pf_ws_bytes = 0;
  std::vector<glmk::PrefillItem> pf_items;
  std::vector<Rank> ranks;
  glmc::Comm comm;
  std::unordered_map<std::string, int> names;  // checkpoint name -> index in pieces
  std::vector<Piece> pieces;
  bool finalized = false;
  bool exact = false;  // options.exact_activations
  bool f32kv = false;  // options.fp32_cache_and_head
  bool kv8 = false;    // options.kv_cache_dtype == GLMRT_KV_FP8_E4M3
  std::string device_name;

  // Host side of the step: pinned metadata staging and results.
  unsigned char* meta_host = nullptr;
  size_t meta_bytes = 0;
  unsigned char* result_host = nullptr;  // SampleOut + top arrays
  size_t result_bytes = 0;
  std::vector<glmk::AttnSeqDesc> attn_seqs;
  std::vector<int> attn_seq_index;  // the batch's index of each attn_seqs entry
  std::vector<glmk::AttnItem> attn_items;
  std::vector<glmk::AttnMerge> attn_merges;
  std::vector<int> logits_seq;  // seq index of each logits row
  std::vector<int> logits_vrow; // its verify index j (0 .. n_drafts; 0 for a plain row)
  std::vector<int> seq_logit_row0;  // [n_seqs] first logits row of each sequence, -1 if none
  std::vector<glmk::SpecSeq> spec_seqs;  // sequences the draft pass proposes for (sample && draft)
  std::vector<int> spec_seq_index;       // their batch index
  MetaLayout ml{};
  size_t dec_ws_bytes = 0, router_ws_bytes = 0;
  bool graphs = false;          // capture pure-decode steps (options.disable_graphs == 0, TP1)
  std::vector<int> buckets;     // batch sizes graphs are captured for, ascending
  // Graphs of pure-decode steps, per bucket and context class (step.cu
  // graph_index: bucket * kCtxClasses + glmk::kDecCtx*).
  std::vector<StepGraph> step_graphs;
  std::vector<StepGraph> prof_graphs;       // profiling variants (events inside)
  std::vector<StepGraph> draft_graphs;      // the draft pass of a graph step
  std::vector<StepGraph> chain_graphs;      // the chained draft passes, per bucket of proposers and pass count
  Profiler prof;
  PendingStep* pending = nullptr;  // step_state_create; its `active` is set between begin and finish
};

// weights.cu
int build_expected_names(Engine& e);
// Where a checkpoint tensor lives on the GPUs: the one mapping that load_tensor
// (uploads) and synthesize (generates in place) both follow.
enum DevElem : int { kElemU8 = 0, kElemF32 = 1, kElemBF16 = 2 };  // element type on the device
// The part of one checkpoint tensor that one rank holds: n elements of type
// elem at dst, element t being element src_off + (t / w) * src_ld + t % w of
// the tensor (row-major): w == n for a contiguous run from src_off, w < n for
// columns [src_off, src_off + w) of each of n / w rows of src_ld columns.
struct Placement {
  void* dst;
  int elem;  // DevElem
  int64_t n, w, src_ld, src_off;
};
// The part of piece pc (checkpoint name `name`) on e.ranks[rank]: sets held
// (false where that rank holds none of it: a routed expert of another rank,
// an MTP tensor) and, if held, p. Fails only on an inconsistent engine.
int place_piece(const Engine& e, const Piece& pc, const char* name, int rank, Placement& p, bool& held);
int load_tensor(Engine& e, const char* name, int32_t dtype, const int64_t* shape, int32_t ndim,
                const void* data, uint64_t nbytes);
int check_complete(Engine& e);
// memory.cu
int create_engine(Engine& e);
void destroy_engine(Engine& e);
// step.cu
int run_step(Engine& e, const glmrt_batch& b, glmrt_result& r);
int step_begin(Engine& e, const glmrt_batch& b);
int step_finish(Engine& e, const uint32_t* token_masks, glmrt_result& r);
void plan_meta_layout(Engine& e);
// The begin/finish state, allocated with the engine (nothing in the step path).
void step_state_create(Engine& e);
void step_state_destroy(Engine& e);
// memory.cu: random finite values in the whole KV pool (synthetic engines, so a
// decode step at any position reads real-looking keys without a prefill).
int fill_kv_random(Engine& e, uint64_t seed);
// synth.cu: every tensor of the model generated on the GPU(s) (docs/synthetic.md);
// marks every piece loaded.
int synthesize(Engine& e, uint64_t seed);
// profile.cu
int profile_enable(Engine& e, bool on);
int profile_read(Engine& e, glmrt_profile& out, bool reset);
// Called by the step: begin (records the start event), mark after each launch
// on rank r's stream (family, GLMRT_PROF_*), end after the step's sync.
int profile_begin(Engine& e, Rank& r, bool graph_step);
int profile_mark(Engine& e, Rank& r, int family);
int profile_end(Engine& e, const int64_t* bytes);
void profile_destroy(Engine& e);
// Counts the non-empty expert groups of one layer into counts[layer] (profiling).
cudaError_t profile_count_active(const int* offsets, int groups, int* counts, int layer,
                                 cudaStream_t st);

}  // namespace glmrt
