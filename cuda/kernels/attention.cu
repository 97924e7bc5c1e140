// attention.cu — paged causal attention over the BF16 KV cache, FP32 math and
// FP32 online softmax (flash style). One block per (work item, KV head): the
// block loads each 32-key tile of its KV head once into shared memory and uses
// it for every query row of the item, i.e. for all n_q tokens x G query heads
// of that KV head (GQA-aware: G = 12 for GLM-4.7). Prefill chunks come as
// items of several consecutive query tokens; long decode contexts are split
// over keys into several items whose partial (o, m, l) are merged by
// attention_merge (flash-decoding). Work items are built on the host per step.
//
// Decode (one query token per sequence) has its own kernel, attention_decode,
// below the prefill path: bf16 tensor cores, cp.async pipeline, splits merged
// inside the launch.
#include <algorithm>
#include <atomic>
#include <cfloat>
#include <climits>
#include <cmath>
#include <type_traits>
#include <vector>

#include "common.cuh"
#include "hopper.cuh"

namespace glmk {
namespace {

constexpr int kD = 128;       // head_dim (threads per block: one per dim)
constexpr int kKeys = 32;     // keys per tile
constexpr int kRows = kAttnMaxRows;

struct AttnSmem {
  float q[kRows][kD];
  float k[kKeys][kD + 1];  // +1: conflict-free column reads in the score loop
  float v[kKeys][kD];
  float p[kRows][kKeys];
  float m[kRows], l[kRows], alpha[kRows];
  int qpos[kRows];
};

__global__ void __launch_bounds__(kD) attention_kernel(AttnArgs a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  AttnSmem& s = *reinterpret_cast<AttnSmem*>(smem_raw);
  const AttnItem it = a.items[blockIdx.x];
  const int kvh = blockIdx.y;
  const int G = a.n_q_heads / a.n_kv_heads;
  const int R = it.n_q * G;
  const int tid = threadIdx.x;

  // Query rows r = i*G + j: token q_begin+i, head kvh*G + j, pre-scaled.
  for (int idx = tid; idx < R * kD; idx += kD) {
    const int r = idx / kD, d = idx % kD;
    const int tok = it.q_begin + r / G, head = kvh * G + r % G;
    s.q[r][d] = a.q[((int64_t)tok * a.n_q_heads + head) * kD + d] * a.scale;
  }
  if (tid < R) {
    s.qpos[tid] = a.positions[it.q_begin + tid / G];
    s.m[tid] = -INFINITY;
    s.l[tid] = 0.f;
  }
  float acc[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) acc[r] = 0.f;

  const int* bt = a.block_tables + a.seq_bt_offset[it.seq];
  const int64_t head_stride = (int64_t)a.block_size * kD;        // one KV head of a block
  const int64_t block_stride = head_stride * a.n_kv_heads;       // one block
  for (int kt = it.k_begin; kt < it.k_end; kt += kKeys) {
    const int nk = min(kKeys, it.k_end - kt);
    __syncthreads();  // previous tile fully consumed
    for (int j = 0; j < nk; ++j) {
      const int key = kt + j;
      const int64_t base = (int64_t)bt[key / a.block_size] * block_stride + kvh * head_stride +
                           (int64_t)(key % a.block_size) * kD;
      if (a.kv_f32) {
        s.k[j][tid] = static_cast<const float*>(a.k_cache)[base + tid];
        s.v[j][tid] = static_cast<const float*>(a.v_cache)[base + tid];
      } else {
        s.k[j][tid] = __bfloat162float(static_cast<const __nv_bfloat16*>(a.k_cache)[base + tid]);
        s.v[j][tid] = __bfloat162float(static_cast<const __nv_bfloat16*>(a.v_cache)[base + tid]);
      }
    }
    __syncthreads();
    // Scores: warp w handles rows w, w+4, ...; lane = key.
    {
      const int j = tid & 31, r0 = tid >> 5;
      for (int r = r0; r < R; r += kD / 32) {
        float sc = -INFINITY;
        if (j < nk && kt + j <= s.qpos[r]) {
          float d0 = 0.f;
#pragma unroll 16
          for (int d = 0; d < kD; ++d) d0 += s.q[r][d] * s.k[j][d];
          sc = d0;
        }
        s.p[r][j] = sc;
      }
    }
    __syncthreads();
    // Online softmax, one thread per row.
    if (tid < R) {
      const int r = tid;
      float mx = -INFINITY;
      for (int j = 0; j < nk; ++j) mx = fmaxf(mx, s.p[r][j]);
      const float m_old = s.m[r];
      const float m_new = fmaxf(m_old, mx);
      float alpha = 1.f, sum = 0.f;
      if (m_new == -INFINITY) {
        for (int j = 0; j < kKeys; ++j) s.p[r][j] = 0.f;
      } else {
        alpha = (m_old == -INFINITY) ? 0.f : expf(m_old - m_new);
        for (int j = 0; j < kKeys; ++j) {
          const float e = (j < nk && s.p[r][j] != -INFINITY) ? expf(s.p[r][j] - m_new) : 0.f;
          s.p[r][j] = e;
          sum += e;
        }
        s.m[r] = m_new;
      }
      s.l[r] = s.l[r] * alpha + sum;
      s.alpha[r] = alpha;
    }
    __syncthreads();
    // acc[r] (dim tid) = acc[r] * alpha[r] + sum_j p[r][j] * v[j][tid]
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      if (r < R) acc[r] *= s.alpha[r];
    for (int j = 0; j < nk; ++j) {
      const float vj = s.v[j][tid];
#pragma unroll
      for (int r = 0; r < kRows; ++r)
        if (r < R) acc[r] += s.p[r][j] * vj;
    }
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (r >= R) continue;
    const int tok = it.q_begin + r / G, head = kvh * G + r % G;
    if (it.n_splits > 1) {
      a.part_o[((int64_t)it.part * a.n_q_heads + head) * kD + tid] = acc[r];
      if (tid == 0) {
        a.part_ml[((int64_t)it.part * a.n_q_heads + head) * 2 + 0] = s.m[r];
        a.part_ml[((int64_t)it.part * a.n_q_heads + head) * 2 + 1] = s.l[r];
      }
    } else {
      a.out[((int64_t)tok * a.n_q_heads + head) * kD + tid] = acc[r] / s.l[r];
    }
  }
}

__global__ void merge_kernel(const AttnMerge* __restrict__ merges, int n_q_heads,
                             const float* __restrict__ part_o, const float* __restrict__ part_ml,
                             float* __restrict__ out) {
  const AttnMerge mg = merges[blockIdx.x];
  const int d = threadIdx.x;
  for (int h = blockIdx.y; h < n_q_heads; h += gridDim.y) {
    float m = -INFINITY;
    for (int i = 0; i < mg.n_splits; ++i)
      m = fmaxf(m, part_ml[((int64_t)(mg.part + i) * n_q_heads + h) * 2]);
    float l = 0.f, o = 0.f;
    for (int i = 0; i < mg.n_splits; ++i) {
      const int64_t b = (int64_t)(mg.part + i) * n_q_heads + h;
      const float mi = part_ml[b * 2];
      const float w = (mi == -INFINITY) ? 0.f : expf(mi - m);
      l += part_ml[b * 2 + 1] * w;
      o += part_o[b * kD + d] * w;
    }
    out[((int64_t)mg.token * n_q_heads + h) * kD + d] = o / l;
  }
}

}  // namespace

cudaError_t attention_paged(const AttnArgs& a, cudaStream_t st) {
  if (a.n_items <= 0) return cudaSuccess;
  if (a.n_kv_heads <= 0 || a.n_q_heads % a.n_kv_heads != 0) return cudaErrorInvalidValue;
  const int smem = (int)sizeof(AttnSmem);
  static_assert(sizeof(AttnSmem) < 200 * 1024, "attention smem");
  cudaError_t e = cudaFuncSetAttribute(attention_kernel,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  attention_kernel<<<dim3(a.n_items, a.n_kv_heads), kD, smem, st>>>(a);
  return cudaGetLastError();
}

bool plan_attention(const AttnSeqDesc* seqs, int n_seqs, int G, AttnPlan* plan, const char** why) {
  plan->n_items = plan->n_merges = plan->n_parts = 0;
  const int qt = G >= kAttnMaxRows ? 1 : kAttnMaxRows / G;
  if (G > kAttnMaxRows) {
    *why = "query heads per KV head exceed the attention kernel's 64 rows";
    return false;
  }
  for (int s = 0; s < n_seqs; ++s) {
    const AttnSeqDesc& d = seqs[s];
    for (int i = 0; i < d.n_q; i += qt) {
      const int nq = std::min(qt, d.n_q - i);
      const int k_end = d.start_pos + i + nq;  // keys 0 .. last query position
      int splits = 1;
      if (nq == 1 && k_end >= 2 * kAttnSplitKeys)
        splits = std::min(kAttnMaxSplits, k_end / kAttnSplitKeys);
      if (splits > 1 && (plan->n_parts + splits > plan->max_parts ||
                         plan->n_merges + 1 > plan->max_merges))
        splits = 1;  // out of partial-result space: run this one unsplit
      if (plan->n_items + splits > plan->max_items) {
        *why = "attention work items exceed the planned capacity";
        return false;
      }
      if (splits == 1) {
        plan->items[plan->n_items++] = AttnItem{s, d.q_begin + i, nq, 0, k_end, 1, 0};
        continue;
      }
      const int per = (k_end + splits - 1) / splits;
      const int part0 = plan->n_parts;
      int made = 0;
      for (int k = 0; k < k_end; k += per) {
        plan->items[plan->n_items++] =
            AttnItem{s, d.q_begin + i, 1, k, std::min(k_end, k + per), splits, part0 + made};
        ++made;
      }
      // made == splits unless rounding left fewer pieces; the merge uses made.
      for (int m = 0; m < made; ++m) plan->items[plan->n_items - made + m].n_splits = made;
      plan->n_parts += made;
      plan->merges[plan->n_merges++] = AttnMerge{d.q_begin + i, part0, made};
    }
  }
  return true;
}

cudaError_t attention_merge(const AttnMerge* merges, int n_merges, int n_q_heads,
                            const float* part_o, const float* part_ml, float* out,
                            cudaStream_t st) {
  if (n_merges <= 0) return cudaSuccess;
  merge_kernel<<<dim3(n_merges, min(n_q_heads, 16)), kD, 0, st>>>(merges, n_q_heads, part_o,
                                                                    part_ml, out);
  return cudaGetLastError();
}

// ===================================================================== decode
//
// attention_decode: one CTA (W = 4 or 8 warps) per (sequence, KV head,
// split). The split's keys [k0, k1) are cut into 16-key tiles (a tile never
// straddles a page: block_size % 16 == 0 and tiles start at multiples of 16);
// warp w takes tiles w, w+W, w+2W, ... and streams them (K and V, 4 KB each) through its own
// S-stage cp.async pipeline in shared memory (no block barrier inside the key
// loop), with its own online-softmax state. Per tile and warp:
//   S[16 x 16]  = Q[16 x 128] . K^T    8 k-steps x 2 n-tiles of mma m16n8k16 bf16
//   P = exp2(S - m)                    FP32 online softmax (log2 domain)
//   O[16 x 128] += P(bf16) . V         16 n-tiles of mma m16n8k16 bf16
// The G query heads of the KV head are the 16 rows of the A operand (rows
// G..15 are zero); Q is scaled by scale*log2(e) and rounded to bf16 once, held
// in registers as A fragments. K tiles [key][dim] are the col-major B operand
// (ldmatrix), V tiles [key][dim] the row-major one (ldmatrix.trans). Shared
// copies are XOR-swizzled per 16-byte chunk (chunk c of key row r at c^(r&7)),
// so cp.async stores and ldmatrix reads are conflict-free.
// At the end the W warps' states are merged in shared memory in a fixed order.
// One split: the normalised row is written directly. Several: each CTA writes
// its partial (O unnormalised, m, l) to the workspace and counts itself on a
// per-(sequence, KV head) counter (cta_arrive_last: one release fence); the
// CTA that arrives last merges all partials in split order (deterministic)
// and resets the counter. More
// than direct_max splits merge in two levels (groups of ceil(sqrt(n)) splits,
// then the groups), which keeps one CTA's serial merge read small.
//
// Workspace: one buffer serves every launch shape (n_seqs, max_splits, ...),
// e.g. every batch-size bucket of the runtime, and is zeroed only once. So the
// merge counters sit in a header of FIXED size at its start (kDecMaxPairs x
// (1 + kDecMaxGroups) ints, index pair * kDecCntStride + slot) and the
// shape-dependent partial-result arrays always after it: no launch ever
// writes data where any launch keeps a counter, and every launch leaves its
// counters at zero. (Counters whose region grew with the shape used to land on
// a smaller shape's partial O: a non-zero float as a count never reaches the
// expected value, so that (sequence, KV head) was never merged or written.)
namespace {

constexpr int kDecD = 128;                      // head_dim
// Warps per CTA: W = 4 or 8 (a template parameter of the kernel; launch
// policy in attention_decode). Each warp streams its own tiles, so with one
// CTA an SM the warps per SM are the kernel's latency hiding.
constexpr int kDecMaxWarps = 8;
constexpr int kDecTile = 16;                    // keys per tile (one warp pipeline stage)
constexpr int kDecTileBytes = kDecTile * kDecD * 2;   // 4 KB: K or V of one tile
constexpr int kDecStageBytes = 2 * kDecTileBytes;     // K + V
constexpr int kDecMaxSplits = 256;              // max_splits accepted by attention_decode
constexpr int kDecPolicyMaxSplits = 128;        // most splits the policy picks
constexpr int kDecMaxMerge = 32;                // most partials one merge step reads
constexpr int kDecMaxCluster = 16;              // most CTAs of the cluster form (sm_90's non-portable size)
constexpr int kDecMaxGroups = 16;               // ceil(sqrt(kDecMaxSplits)): most level-1 groups
constexpr int kDecCntStride = 1 + kDecMaxGroups;  // counters per (sequence, KV head)
constexpr int kDecMaxPairs = 1024;              // (sequence, KV head) pairs that may split
constexpr size_t kDecCounterBytes = (size_t)kDecMaxPairs * kDecCntStride * sizeof(int);  // the header
static_assert(kDecMaxGroups * kDecMaxGroups >= kDecMaxSplits, "group counters for every split count");
static_assert(kDecCounterBytes % 256 == 0, "data regions stay 256-byte aligned");
constexpr int kDecOStride = kDecD + 8;          // floats per row of a warp's O in shared memory
constexpr float kLog2e = 1.4426950408889634f;
static_assert(16 * kDecOStride * 4 <= 2 * kDecStageBytes, "warp O copy fits in two stages");
// The FP8 cache's decode tiles (one 16-token block of one KV head): K codes 2
// KB (rows of 128 bytes, 16-byte chunks XOR-swizzled by key), V codes 2 KB
// (transposed: 128 rows of 16 keys), the 16 K and 16 V scales. Twice the
// stages of the BF16 form in about the same shared memory: the same bytes in
// flight per warp.
constexpr int kDecF8TileBytes = kDecTile * kDecD;                 // 2 KB
constexpr int kDecF8StageBytes = 2 * kDecF8TileBytes + 2 * 64;    // + the scales
// A warp's shared memory region (stages; after the key loop its O copy).
template <int S, bool F8>
__host__ __device__ constexpr int dec_warp_bytes() {
  return F8 ? 2 * S * kDecF8StageBytes : S * kDecStageBytes;
}
static_assert(16 * kDecOStride * 4 <= 2 * 2 * kDecF8StageBytes, "warp O copy fits in the FP8 stages");

// Launch knobs (defaults; attn_check --sweep changes them through the hook at
// the end of this file).
struct DecTuning {
  // Pipeline depth per warp: 2, 3 or 4 (smem 64 / 96 / 128 KB per CTA of 4
  // warps); 0: dec_shape's choice (4 where the grid fits one wave of one CTA
  // per SM, with the exceptions it lists; 2 past one wave). In the decode
  // step (rank share, 2k context, A/B on one H100,
  // 2026-11-27, ms, 3 -> 4 stages): batch 1 6.14 -> 6.05, 4 7.85 -> 7.77, 32
  // 19.45 -> 19.3, 128 26.85 -> 26.7, 16 and 64 unchanged; batch 256 (256
  // CTAs) 32.75 -> 33.05.
  int stages = 0;
  int min_chunk = 128;  // fewest keys per split (multiple of 16)
  int direct_max = 16;  // up to this many splits merge in one level
  // The split policy's target of CTAs per SM. attn_check --sweep on an H200
  // (2026-11-24): 1 beats 2 by 4-10% from batch 4 to 128 (b16/4k 16.6 vs 18.6
  // us, b64/2k 24.7 vs 25.6, b128/4k 68.5 vs 71.4) and ties at batch 1.
  int ctas_per_sm = 1;
  // Where the splits merge: 0 auto (a thread-block cluster per (sequence, KV
  // head) where max_splits is 2, 4, 8 or 16 and the whole grid's clusters fit
  // the device at once), 1 the workspace (counters and the last CTA), 2 a
  // cluster wherever one launches.
  int cluster = 0;
  int warps = 0;  // warps per CTA: 0 auto (dec_shape), 4 or 8
};
DecTuning g_dec_tuning;

struct DecParams {
  int G;           // query heads per KV head
  int min_chunk;
  int direct_max;
  int gmax;        // group slots per (sequence, KV head) in go / gml
  int* counters;   // [kDecMaxPairs][kDecCntStride] at offset 0 (shape-independent):
                   // [0] the final merge, [1 + g] group g
  float* po;       // [pairs][max_splits][G][128]  partial O (unnormalised)
  float2* pml;     // [pairs][max_splits][G]       partial (m, l), m in log2 units
  float* go;       // [pairs][gmax][G][128]        group results
  float2* gml;     // [pairs][gmax][G]
};

struct DecShared {
  float wm[kDecMaxWarps][16], wl[kDecMaxWarps][16], wf[kDecMaxWarps][16];  // per-warp state merge
  float M[16], L[16], scl[16];
  float2 ml[kDecMaxMerge * 16];   // (m, l) of the partials being merged
  float w[kDecMaxMerge][16];      // their weights exp2(m - M)
  float red[32];
  int flag;
};

// The cluster form's merge (dec_cluster_final), pushed into by every CTA of
// the cluster: this CTA's slice of the row from each, [source rank][float4 of
// the slice]; every CTA's (m, l) per head; every CTA's slice maximum.
static_assert(32 % kDecMaxCluster == 0, "a cluster of 2-16 CTAs splits every row (G * 32 float4s) evenly");
struct DecClusterShared {
  float4 po_in[kDecodeMaxGroup * 32];  // rank * span + j, CL * span = G * 32 (O unnormalised)
  float2 ml_in[kDecMaxCluster][kDecodeMaxGroup];  // (m, l), m in log2 units
  float amax_in[kDecMaxCluster];                  // max |y| over each CTA's slice
  uint64_t bar[2];  // complete when every CTA's pushes (partials + (m, l); maxima) have landed
};

__host__ __device__ constexpr int dec_ceil_sqrt(int n) {
  int r = 1;
  while (r * r < n) ++r;
  return r;
}

// A 4-byte global load issued where it is written (the compiler would sink a
// plain load below the early exits, lengthening the chain before the first KV
// request).
// griddepcontrol.wait: returns once the grid this one depends on (programmatic
// dependent launch) has completed and its writes are visible; at once otherwise.
__device__ __forceinline__ void dec_grid_wait() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}

__device__ __forceinline__ int ld_early(const int* p) {
  int v;
  asm volatile("ld.volatile.global.b32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}

// 16-byte cp.async that reads src_bytes (16 or 0) and zero-fills the rest.
__device__ __forceinline__ void cp_async16_zfill(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
// The same under an L2 policy (l2_policy_stream: the decode step reads each
// KV line once).
__device__ __forceinline__ void cp_async16_zfill_hint(uint32_t dst, const void* src, int src_bytes,
                                                      uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;" ::"r"(dst), "l"(src),
               "r"(src_bytes), "l"(policy)
               : "memory");
}
// A timing probe (built with -DGLMK_DEC_PROBE=1 only): thread 0 of each CTA
// stamps %globaltimer at the kernel's phases (attn_check --probe).
#if GLMK_DEC_PROBE
constexpr int kDecProbeCtas = 2048, kDecProbeStamps = 13;  // the last: the SM id
__device__ unsigned long long g_dec_probe[kDecProbeCtas][kDecProbeStamps];
__device__ __forceinline__ void dec_stamp(int k) {
  if (threadIdx.x == 0) {
    const int b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (b < kDecProbeCtas) g_dec_probe[b][k] = t;
    if (k == 0 && b < kDecProbeCtas) {
      unsigned smid;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
      g_dec_probe[b][kDecProbeStamps - 1] = smid;
    }
  }
}
#else
__device__ __forceinline__ void dec_stamp(int) {}
#endif

// Arrival on a merge counter. Every thread has stored its share of the CTA's
// result; returns (to every thread) whether this CTA is the expected-th, i.e.
// the last, to arrive. The last one resets the counter for the next launch.
__device__ __forceinline__ bool dec_arrive(int* counter, int expected, DecShared& sh) {
  return cta_arrive_last(counter, expected, true, &sh.flag);
}

// Merges n partial results (slots o[n][G*128], ml[n][G], contiguous) read
// through L2: acc[k] = sum_i w_i * o_i over this thread's float4s idx = tid +
// 128k < G*32 (row idx/32), and sh.M / sh.L per row. The slots are staged into
// shared memory (stage: cap slots at a time) with cp.async, so the whole read
// is in flight at once. Reuses the pipeline buffers: the caller has passed a
// block barrier since their last use.
template <int NTHR>
__device__ void dec_merge(const float* __restrict__ po, const float2* __restrict__ pml, int n, int G,
                          const float* stage, uint32_t stage_s, int cap, float4 (&acc)[4],
                          DecShared& sh) {
  const int tid = threadIdx.x;
  const int per = G * 32;  // 16-byte pieces per slot
  const char* src = reinterpret_cast<const char*>(po);
  {
    const int cn = min(n, cap);
    for (int q = tid; q < cn * per; q += NTHR) cp_async16_zfill(stage_s + q * 16, src + (size_t)q * 16, 16);
    asm volatile("cp.async.commit_group;" ::: "memory");
  }
  for (int q = tid; q < n * G; q += NTHR) sh.ml[q] = __ldcg(pml + q);
  __syncthreads();
  if (tid < G) {
    float M = -INFINITY;
    for (int i = 0; i < n; ++i) M = fmaxf(M, sh.ml[i * G + tid].x);
    float L = 0.f;
    for (int i = 0; i < n; ++i) {
      const float f = ex2(sh.ml[i * G + tid].x - M);
      sh.w[i][tid] = f;
      L += sh.ml[i * G + tid].y * f;
    }
    sh.M[tid] = M;
    sh.L[tid] = L;
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) acc[k] = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int c0 = 0; c0 < n; c0 += cap) {
    const int cn = min(cap, n - c0);
    if (c0 > 0) {
      for (int q = tid; q < cn * per; q += NTHR)
        cp_async16_zfill(stage_s + q * 16, src + ((size_t)c0 * per + q) * 16, 16);
      asm volatile("cp.async.commit_group;" ::: "memory");
    }
    cp_async_wait<0>();
    __syncthreads();  // staged slots and sh.w visible to all
    const float4* st4 = reinterpret_cast<const float4*>(stage);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int idx = tid + NTHR * k;
      if (idx < per) {
        const int r = idx >> 5;
        float4 a4 = acc[k];
        for (int i = 0; i < cn; ++i) {
          const float w = sh.w[c0 + i][r];
          const float4 v = st4[i * per + idx];
          a4.x += w * v.x;
          a4.y += w * v.y;
          a4.z += w * v.z;
          a4.w += w * v.w;
        }
        acc[k] = a4;
      }
    }
    __syncthreads();  // stage free for the next chunk / the caller
  }
}

// Writes this CTA's G heads of the output row: y = acc * sh.scl[row head]
// (out, if set) and, with out_q (n_kv_heads == 1: the CTA has the whole row),
// the row quantized exactly as quant_rows_fp8 does.
template <int NTHR>
__device__ void dec_write_final(const DecodeAttnArgs& a, int G, int row, int kvh,
                                const float4 (&acc)[4], DecShared& sh) {
  const int tid = threadIdx.x;
  const int per = G * 32;
  float4 y[4];
  float amax = 0.f;
  float* outp = a.out ? a.out + ((int64_t)row * a.n_q_heads + (int64_t)kvh * G) * kDecD : nullptr;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int idx = tid + NTHR * k;
    y[k] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (idx < per) {
      const float f = sh.scl[idx >> 5];
      y[k] = make_float4(acc[k].x * f, acc[k].y * f, acc[k].z * f, acc[k].w * f);
      if (outp) reinterpret_cast<float4*>(outp)[idx] = y[k];
      amax = fmaxf(amax, absmax4(y[k]));
    }
  }
  if (a.out_q) {  // uniform over the block
    amax = block_reduce(amax, sh.red, MaxOp());
    const float s = fmaxf(amax / kFp8Max, kMinActScale);
    const float inv = 1.0f / s;
    uint32_t* qr = reinterpret_cast<uint32_t*>(a.out_q + (int64_t)row * a.n_q_heads * kDecD);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int idx = tid + NTHR * k;
      if (idx < per) {
        qr[idx] = pack_e4m3x4(y[k], inv);
      }
    }
    if (tid == 0) a.out_scale[row] = s;
  }
}

// The cluster form's merge (n_act > 1). CTA `rank` of `CL` owns the float4s
// [rank * span, +span) of the row (span = G * 32 / CL exactly: CL divides 32).
// Every CTA, those without keys too, pushes each float4 of its partial O into
// its owner's shared memory and its (m, l) into every CTA's with st.async,
// counted on the receiver's transaction barrier bar[0] (initialised at the
// kernel's start, published by a relaxed cluster arrival that the first wait
// here pairs with); each owner waits for its CL slices and CL (m, l) sets,
// merges its slice from the local copies — the same operations in the same
// order as dec_merge + dec_write_final, so the same bits as the workspace
// form with one merge level — and pushes its slice maximum to every CTA
// (bar[1]) for the row's FP8 scale. No remote loads, no fence, and no cluster
// barrier on the data's way or at the end: every push into a CTA has landed
// before its waits return, and a CTA needs nothing of the others after its
// own pushes are issued. H200 probe, batch 4 / 4k, the merge (warps merged
// -> exit): 3.8 us reading remote partials after a barrier, 3.2 pushing them
// before barriers, 2.6 like this (docs/perf.md 2026-11-30).
template <int NTHR>
__device__ void dec_cluster_final(const DecodeAttnArgs& a, int G, int row, int kvh, int rank, int CL, int n_act,
                                  const float4 (&acc)[4], DecShared& sh, DecClusterShared& cs) {
  const int tid = threadIdx.x;
  const int per = G * 32;
  const int span = (per + CL - 1) / CL;
  const uint32_t po_s = (uint32_t)__cvta_generic_to_shared(cs.po_in);
  const uint32_t ml_s = (uint32_t)__cvta_generic_to_shared(&cs.ml_in[0][0]);
  const uint32_t am_s = (uint32_t)__cvta_generic_to_shared(cs.amax_in);
  const uint32_t bar0 = (uint32_t)__cvta_generic_to_shared(&cs.bar[0]);
  const uint32_t bar1 = (uint32_t)__cvta_generic_to_shared(&cs.bar[1]);
  const int lo = rank * span, hi = min(per, lo + span);
  cluster_wait_acquire();  // every CTA's barriers initialised (the arrival at the kernel's start)
  // Bytes this CTA receives: its slice from every CTA, every CTA's (m, l).
  if (tid == 0) tx_bar_expect(bar0, (uint32_t)(CL * ((hi - lo) * 16 + G * 8)));
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int idx = tid + NTHR * k;
    if (idx < per) {
      const int o = idx / span;
      st_async_f4(po_s + (uint32_t)(rank * span + idx - o * span) * 16u, o, bar0, acc[k]);
    }
  }
  for (int q = tid; q < G * CL; q += NTHR) {
    const int dst = q / G, r = q - dst * G;
    st_async_f2(ml_s + (uint32_t)(rank * kDecodeMaxGroup + r) * 8u, dst, bar0, make_float2(sh.M[r], sh.L[r]));
  }
  tx_bar_wait_cluster(bar0, 0);
  dec_stamp(8);
  float4 y[2];
  float amax = 0.f;
#pragma unroll
  for (int q = 0; q < 2; ++q) {  // span <= 2 * NTHR (CL >= 2, per <= 512)
    const int idx = lo + tid + NTHR * q;
    y[q] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (idx < hi) {
      const int r = idx >> 5, j = idx - lo;
      float M = -INFINITY;
      for (int i = 0; i < n_act; ++i) M = fmaxf(M, cs.ml_in[i][r].x);
      float L = 0.f;
      float4 a4 = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int i = 0; i < n_act; ++i) {
        const float w = ex2(cs.ml_in[i][r].x - M);
        const float4 vi = cs.po_in[i * span + j];
        L += cs.ml_in[i][r].y * w;
        a4.x += w * vi.x;
        a4.y += w * vi.y;
        a4.z += w * vi.z;
        a4.w += w * vi.w;
      }
      const float f = 1.f / L;
      y[q] = make_float4(a4.x * f, a4.y * f, a4.z * f, a4.w * f);
      amax = fmaxf(amax, absmax4(y[q]));
    }
  }
  dec_stamp(9);
  if (a.out_q) {  // (uniform over the cluster)
    amax = block_reduce(amax, sh.red, MaxOp());  // uniform over the CTA
    if (tid == 0) tx_bar_expect(bar1, (uint32_t)(CL * 4));
    for (int d = tid; d < CL; d += NTHR) st_async_f32(am_s + (uint32_t)rank * 4u, d, bar1, amax);
    tx_bar_wait_cluster(bar1, 0);
  }
  // No barrier at the end: every push into this CTA has landed (its waits),
  // and its own pushes need nothing of it after they are issued.
  dec_stamp(10);
  float* outp = a.out ? a.out + ((int64_t)row * a.n_q_heads + (int64_t)kvh * G) * kDecD : nullptr;
  if (outp) {
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int idx = lo + tid + NTHR * q;
      if (idx < hi) reinterpret_cast<float4*>(outp)[idx] = y[q];
    }
  }
  if (a.out_q) {
    float am = 0.f;
    for (int i = 0; i < CL; ++i) am = fmaxf(am, cs.amax_in[i]);
    const float s = fmaxf(am / kFp8Max, kMinActScale);
    const float inv = 1.0f / s;
    uint32_t* qr = reinterpret_cast<uint32_t*>(a.out_q + (int64_t)row * a.n_q_heads * kDecD);
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int idx = lo + tid + NTHR * q;
      if (idx < hi) {
        qr[idx] = pack_e4m3x4(y[q], inv);
      }
    }
    if (rank == 0 && tid == 0) a.out_scale[row] = s;
  }
}

// The FP8 cache's K rows are swizzled by this function of the key: distinct
// over the 8 keys {4a + 2nt + b} that one ldmatrix reads for n-tile nt (the
// permuted order below), so those 8 rows hit 8 different bank groups.
__device__ __forceinline__ int dec_f8_swz(int key) { return ((key >> 1) & 6) | (key & 1); }

// One 16-key FP8 tile of a warp (stage at sb: K codes, V codes transposed, K
// and V scales) into the warp's running state. ldmatrix hands thread (g, t)
// bytes 4t .. 4t+3 of a row: for K, dims 16kk + 4t .. of a key (Q's fragments
// carry the same dim permutation); for V (rows = dims), keys 4t .. 4t+3. The
// K rows of n-tile nt are keys 4(r/2) + 2nt + r%2 (r = 0..7), so score
// columns 2t, 2t+1 of n-tile 0 / 1 are keys 4t, 4t+1 / 4t+2, 4t+3: the keys
// of the thread's V fragments, and P (the C layout of S) is again the A
// fragment of O += P V. Scores scaled by the K scales; P by the V scales
// (its row sums l unscaled). Keys from `valid` are masked: scores -inf, V
// codes and scales zero (a stale slot's bytes may be anything).
__device__ __forceinline__ void dec_f8_tile(uint32_t sb, int lane, int g, int t, int valid,
                                            const uint32_t (&qa)[8][4], float& m0, float& m1, float& l0, float& l1,
                                            float (&o)[16][4]) {
  const int mi = lane >> 3, r = lane & 7;
  const int key = 4 * (r >> 1) + 2 * (mi >> 1) + (r & 1);
  const uint32_t krow = sb + key * 128;
  const int sw = dec_f8_swz(key);
  float s0[4] = {0.f, 0.f, 0.f, 0.f}, s1[4] = {0.f, 0.f, 0.f, 0.f};
  float u0[4] = {0.f, 0.f, 0.f, 0.f}, u1[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    uint32_t x0, x1, x2, x3;  // (n-tile 0, chunk 2q), (0, 2q+1), (1, 2q), (1, 2q+1)
    ldsm_x4(krow + (((2 * q + (mi & 1)) ^ sw) << 4), x0, x1, x2, x3);
    mma_f16_16816(s0, qa[2 * q], e4m3x2_to_f16x2(x0), e4m3x2_to_f16x2(x0 >> 16));
    mma_f16_16816(s1, qa[2 * q], e4m3x2_to_f16x2(x2), e4m3x2_to_f16x2(x2 >> 16));
    mma_f16_16816(u0, qa[2 * q + 1], e4m3x2_to_f16x2(x1), e4m3x2_to_f16x2(x1 >> 16));
    mma_f16_16816(u1, qa[2 * q + 1], e4m3x2_to_f16x2(x3), e4m3x2_to_f16x2(x3 >> 16));
  }
  const float4 ks = *reinterpret_cast<const float4*>(
      __cvta_shared_to_generic(sb + 2 * kDecF8TileBytes + 16 * t));
  float4 vs = *reinterpret_cast<const float4*>(__cvta_shared_to_generic(sb + 2 * kDecF8TileBytes + 64 + 16 * t));
  s0[0] = (s0[0] + u0[0]) * ks.x;
  s0[1] = (s0[1] + u0[1]) * ks.y;
  s0[2] = (s0[2] + u0[2]) * ks.x;
  s0[3] = (s0[3] + u0[3]) * ks.y;
  s1[0] = (s1[0] + u1[0]) * ks.z;
  s1[1] = (s1[1] + u1[1]) * ks.w;
  s1[2] = (s1[2] + u1[2]) * ks.z;
  s1[3] = (s1[3] + u1[3]) * ks.w;
  uint32_t vm0 = 0xFFFFFFFFu, vm1 = 0xFFFFFFFFu;  // V halves of keys 4t, 4t+1 / 4t+2, 4t+3
  if (valid < kDecTile) {
    const int k4 = 4 * t;
    if (k4 >= valid) s0[0] = s0[2] = -INFINITY, vs.x = 0.f, vm0 &= 0xFFFF0000u;
    if (k4 + 1 >= valid) s0[1] = s0[3] = -INFINITY, vs.y = 0.f, vm0 &= 0x0000FFFFu;
    if (k4 + 2 >= valid) s1[0] = s1[2] = -INFINITY, vs.z = 0.f, vm1 &= 0xFFFF0000u;
    if (k4 + 3 >= valid) s1[1] = s1[3] = -INFINITY, vs.w = 0.f, vm1 &= 0x0000FFFFu;
  }
  attn_block_softmax_p(s0, s1, kDecTile, t, m0, m1, l0, l1, o);
  uint32_t pa[4];
  pa[0] = pack_f16(s0[0] * vs.x, s0[1] * vs.y);
  pa[1] = pack_f16(s0[2] * vs.x, s0[3] * vs.y);
  pa[2] = pack_f16(s1[0] * vs.z, s1[1] * vs.w);
  pa[3] = pack_f16(s1[2] * vs.z, s1[3] * vs.w);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    uint32_t x[4];
    ldsm_x4(sb + kDecF8TileBytes + (32 * q + lane) * 16, x[0], x[1], x[2], x[3]);
#pragma unroll
    for (int m = 0; m < 4; ++m)
      mma_f16_16816(o[4 * q + m], pa, e4m3x2_to_f16x2(x[m]) & vm0, e4m3x2_to_f16x2(x[m] >> 16) & vm1);
  }
}

template <int S, int W, bool CLU, bool F8>
__global__ void __launch_bounds__(W * 32) decode_attn_kernel(DecodeAttnArgs a, DecParams p) {
  static_assert(S >= 2 && S <= 4, "pipeline depth");
  static_assert(W == 4 || W == 8, "warps per CTA");
  constexpr int kDecWarps = W, kDecThreads = W * 32;
  constexpr int kDecChunkRound = kDecTile * W;  // split lengths are multiples of this
  // F8: the FP8 cache, in twice the stages (QkRopeArgs::kv_fp8's layout).
  constexpr int NS = F8 ? 2 * S : S;
  constexpr int SB = F8 ? kDecF8StageBytes : kDecStageBytes;
  constexpr int WB = dec_warp_bytes<S, F8>();
  extern __shared__ __align__(1024) unsigned char dsmem[];
  __shared__ DecShared sh;
  __shared__ std::conditional_t<CLU, DecClusterShared, char> cs;
  pdl_launch_dependents();  // o_proj's weights may start streaming under this kernel
  dec_stamp(0);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (CLU) {
    // The merge's transaction barriers, initialised and published to the
    // cluster now (the arrival relaxed; dec_cluster_final waits for it).
    if (threadIdx.x == 0) {
      tx_bar_init((uint32_t)__cvta_generic_to_shared(&cs.bar[0]));
      tx_bar_init((uint32_t)__cvta_generic_to_shared(&cs.bar[1]));
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    asm volatile("barrier.cluster.arrive.relaxed;" ::: "memory");
  }
#endif
  const int split = blockIdx.x, kvh = blockIdx.y, seq = blockIdx.z;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  const int G = p.G;
  // Independent loads first (the block-table walk below waits on ctx and bto).
  const int ctx = ld_early(a.ctx_len + seq);
  const int row = ld_early(a.q_row + seq);
  const int bto = ld_early(a.bt_offset + seq);

  if (ctx <= 0) {  // a padding sequence: zero output (and zero FP8 codes, minimum scale)
    if (split != 0) return;
    dec_grid_wait();
    float4 acc[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) acc[k] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (tid < 16) sh.scl[tid] = 1.f;
    __syncthreads();
    dec_write_final<kDecThreads>(a, G, row, kvh, acc, sh);
    return;
  }
  // The split of the keys (the same in every CTA of the sequence): chunk a
  // multiple of 64 keys, at least min_chunk; n_act <= max_splits CTAs have keys.
  int chunk = (ctx + a.max_splits - 1) / a.max_splits;
  chunk = (chunk + kDecChunkRound - 1) / kDecChunkRound * kDecChunkRound;
  chunk = max(chunk, p.min_chunk);
  const int n_act = (ctx + chunk - 1) / chunk;
  // Past the keys: the cluster form's CTAs still take part in its merge (with
  // no tiles they flow through with m = -inf, l = 0, which no one reads).
  if (split >= n_act && (!CLU || n_act == 1)) return;
  const int k0 = split * chunk, k1 = min(ctx, k0 + chunk);
  const int n_tiles = (k1 - k0 + kDecTile - 1) / kDecTile;
  const int nt = n_tiles > warp ? (n_tiles - warp + kDecWarps - 1) / kDecWarps : 0;  // this warp's tiles
  const int* bt = a.block_tables + bto;
  const int bs = a.block_size;

  // Block ids of this warp's tiles, 32 at a time: lane i holds tile 32b + i.
  auto tile_ids = [&](int b) -> int {
    const int j = 32 * b + lane;
    if (j >= nt) return 0;
    return bt[(k0 + kDecTile * (warp + kDecWarps * j)) / bs];
  };
  int ids = tile_ids(0);
  int ids_next = tile_ids(1);
  dec_stamp(1);

  // Launched with programmatic dependent launch, the kernel gets here while
  // the previous one (q/k norm + RoPE + the new token's KV write) still runs:
  // the metadata and block tables above are the step's and older, and so is
  // every KV line but the new token's, which an L2 prefetch may touch early
  // anyway (L2 is where writes land). The first tiles of this warp go to L2
  // now; q, the KV itself, the outputs and the workspace wait for the grid
  // before this one. (Without PDL the wait returns at once.)
  {
    const int np = min(nt, S);
    for (int j = 0; j < np; ++j) {
      const int id = __shfl_sync(0xffffffffu, ids, j);
      const int key0 = k0 + kDecTile * (warp + kDecWarps * j);
      if constexpr (F8) {
        // 2 KB of K codes, then of V: one 128-byte line per lane.
        const int64_t bh = (int64_t)id * a.n_kv_heads + kvh;
        const uint8_t* c8 = lane < 16 ? a.k_cache8 : a.v_cache8;
        asm volatile("prefetch.global.L2 [%0];" ::"l"(c8 + bh * kDecF8TileBytes + (lane & 15) * 128));
      } else {
        const int64_t off = (((int64_t)id * a.n_kv_heads + kvh) * bs + (key0 % bs)) * kDecD;
        // 16 keys x 256 B of K, then of V: one 128-byte line per lane each.
        const char* kp = reinterpret_cast<const char*>(a.k_cache + off) + lane * 128;
        const char* vp = reinterpret_cast<const char*>(a.v_cache + off) + lane * 128;
        asm volatile("prefetch.global.L2 [%0];" ::"l"(kp));
        asm volatile("prefetch.global.L2 [%0];" ::"l"(vp));
      }
    }
  }
  dec_grid_wait();
  dec_stamp(2);

  // Q as bf16 A fragments: rows = heads kvh*G + r (r >= G: zero), pre-scaled
  // so that scores are in log2 units. qa[kk] covers dims 16kk .. 16kk+15.
  uint32_t qa[8][4];
  auto load_q = [&]() {
    const float* qp = a.q + ((int64_t)row * a.n_q_heads + (int64_t)kvh * G) * kDecD;
    const float sc = a.scale * kLog2e;
    if constexpr (F8) {
      // f16, the dims of a k-step permuted as the FP8 K rows arrive from
      // ldmatrix: thread (g, t) holds dims 16kk + 4t .. 4t+3 of its rows (a0 / a2
      // the first / second pair), the same permutation on both operands.
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = g + 8 * h;
          float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
          if (r < G) v = *reinterpret_cast<const float4*>(qp + r * kDecD + kk * 16 + 4 * t);
          qa[kk][h] = pack_f16(v.x * sc, v.y * sc);
          qa[kk][h + 2] = pack_f16(v.z * sc, v.w * sc);
        }
      }
    } else {
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int r = g + 8 * h;
            float2 v = make_float2(0.f, 0.f);
            if (r < G) v = *reinterpret_cast<const float2*>(qp + r * kDecD + kk * 16 + 8 * c + 2 * t);
            qa[kk][h + 2 * c] = pack_bf16(v.x * sc, v.y * sc);
          }
        }
      }
    }
  };
  // 8-warp CTAs request their first KV tiles before q (dec_shape's grids,
  // where the first tiles arrive late behind the other CTAs' requests): H200,
  // 2026-11-30, attn_check --bench, us, q first -> KV first: batch 64 / 1k
  // 16.75 -> 16.07, 128 / 1k 20.85 -> 19.99, 128 / 4k 66.1 -> 64.7; with 4
  // warps KV first was slower (batch 4 / 4k 10.9 -> 11.8).
  if constexpr (W != 8) load_q();
  const uint32_t wbase = (uint32_t)__cvta_generic_to_shared(dsmem) + warp * WB;
  const __nv_bfloat16* kc = a.k_cache;
  const __nv_bfloat16* vc = a.v_cache;
  const uint64_t kv_pol = l2_policy_stream();
  // Copies tile j of this warp into stage buf: lane copies 16-byte chunk
  // (lane & 15) of keys 2i + (lane >> 4), i = 0..7, of K and of V; keys >= k1
  // (the tail of the last tile) are zero-filled and not read.
  // F8: a tile is one block of one KV head; lane copies K chunks lane + 32i
  // (key c / 8, chunk c % 8, swizzled by dec_f8_swz) and V rows lane + 32i (dims),
  // lanes 0-3 the K scales, 4-7 the V scales. No zero fill: the tail's keys
  // are masked after the widening (their codes may be stale).
  auto issue8 = [&](int buf, int id) {
    const int64_t bh = (int64_t)id * a.n_kv_heads + kvh;
    const uint32_t dk = wbase + buf * SB;
    const uint8_t* kb = a.k_cache8 + bh * kDecF8TileBytes;
    const uint8_t* vb = a.v_cache8 + bh * kDecF8TileBytes;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int c = lane + 32 * i, key = c >> 3, ch = c & 7;
      cp_async16_zfill_hint(dk + key * 128 + ((ch ^ dec_f8_swz(key)) << 4), kb + c * 16, 16, kv_pol);
      cp_async16_zfill_hint(dk + kDecF8TileBytes + c * 16, vb + c * 16, 16, kv_pol);
    }
    if (lane < 8) {
      const float* sp = (lane < 4 ? a.k_scale : a.v_scale) + bh * kDecTile + (lane & 3) * 4;
      cp_async16_zfill_hint(dk + 2 * kDecF8TileBytes + lane * 16, sp, 16, kv_pol);
    }
  };
  auto issue = [&](int j, int buf, int id) {
    if constexpr (F8) {
      issue8(buf, id);
      return;
    }
    const int key0 = k0 + kDecTile * (warp + kDecWarps * j);
    const int64_t off = (((int64_t)id * a.n_kv_heads + kvh) * bs + (key0 % bs)) * kDecD;
    const int valid = k1 - key0;
    const uint32_t dk = wbase + buf * kDecStageBytes;
    const int ch = lane & 15;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int kl = 2 * i + (lane >> 4);
      const int nb = kl < valid ? 16 : 0;
      const uint32_t so = kl * 256 + ((ch ^ (kl & 7)) << 4);
      const int64_t src = off + kl * kDecD + ch * 8;
      cp_async16_zfill_hint(dk + so, kc + src, nb, kv_pol);
      cp_async16_zfill_hint(dk + kDecTileBytes + so, vc + src, nb, kv_pol);
    }
  };

  // ldmatrix lane addresses (byte offsets in a stage). K (no trans): matrix
  // mi = lane/8 is keys 8*(mi/2).., chunk 2kk + (mi&1) -> b0/b1 of n-tiles 0, 1.
  // V (trans): matrix mi is keys 8*(mi&1).., chunk 2*nd2 + mi/2 -> b0/b1 of
  // n-tiles 2*nd2, 2*nd2+1. Physical chunk = chunk ^ (key & 7) = chunk ^ (lane & 7).
  const uint32_t k_row = (uint32_t)((((lane >> 4) << 3) + (lane & 7)) * 256);
  const uint32_t k_x = (uint32_t)(((lane >> 3) & 1) ^ (lane & 7));
  const uint32_t v_row = (uint32_t)(((((lane >> 3) & 1) << 3) + (lane & 7)) * 256 + kDecTileBytes);
  const uint32_t v_x = (uint32_t)((lane >> 4) ^ (lane & 7));

  float o[16][4];
#pragma unroll
  for (int i = 0; i < 16; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;  // rows g, g+8 (l: this thread's columns)

#pragma unroll
  for (int s = 0; s < NS - 1; ++s) {
    if (s < nt) issue(s, s, __shfl_sync(0xffffffffu, ids, s));
    asm volatile("cp.async.commit_group;" ::: "memory");
  }
  if constexpr (W == 8) load_q();
#if GLMK_DEC_PROBE
  // (Never true.) A use of q, so that the probe's stamp 3 follows q's loads.
  if (warp == 0 && qa[7][3] == 0x7fffffffu) dec_stamp(7);
#endif
  dec_stamp(3);
  int rb = 0, wb = NS - 1;
  for (int j = 0; j < nt; ++j) {
    cp_async_wait<NS - 2>();  // tile j has landed (this thread's copies)
    __syncwarp();             // ... and every lane's; stage wb (read at j-1) is free
    if (j == 0) dec_stamp(4);
    {
      const int jn = j + NS - 1;
      if ((jn & 31) == 0) {  // next batch of block ids
        ids = ids_next;
        ids_next = tile_ids((jn >> 5) + 1);
      }
      if (jn < nt) issue(jn, wb, __shfl_sync(0xffffffffu, ids, jn & 31));
      asm volatile("cp.async.commit_group;" ::: "memory");
      wb = wb + 1 == NS ? 0 : wb + 1;
    }
    const uint32_t sb = wbase + rb * SB;
    rb = rb + 1 == NS ? 0 : rb + 1;
    if constexpr (F8) {
      dec_f8_tile(sb, lane, g, t, min(kDecTile, k1 - (k0 + kDecTile * (warp + kDecWarps * j))), qa, m0, m1, l0,
                  l1, o);
      continue;
    }

    // S = Q K^T: two accumulator chains per n-tile (even / odd k-steps).
    float s0[4] = {0.f, 0.f, 0.f, 0.f}, s1[4] = {0.f, 0.f, 0.f, 0.f};
    float u0[4] = {0.f, 0.f, 0.f, 0.f}, u1[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      uint32_t b0, b1, b2, b3;
      ldsm_x4(sb + k_row + ((k_x ^ (uint32_t)(2 * kk)) << 4), b0, b1, b2, b3);
      if (kk & 1) {
        mma_bf16_16816(u0, qa[kk], b0, b1);
        mma_bf16_16816(u1, qa[kk], b2, b3);
      } else {
        mma_bf16_16816(s0, qa[kk], b0, b1);
        mma_bf16_16816(s1, qa[kk], b2, b3);
      }
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s0[e] += u0[e];
      s1[e] += u1[e];
    }
    // Keys past the end (last tile only) get -inf; O += P V with P (C layout
    // of S) as the A fragment directly.
    const int key0 = k0 + kDecTile * (warp + kDecWarps * j);
    uint32_t pa[4];
    attn_block_softmax(s0, s1, min(kDecTile, k1 - key0), t, m0, m1, l0, l1, o, pa);
#pragma unroll
    for (int nd2 = 0; nd2 < 8; ++nd2) {
      uint32_t b0, b1, b2, b3;
      ldsm_x4_trans(sb + v_row + ((v_x ^ (uint32_t)(2 * nd2)) << 4), b0, b1, b2, b3);
      mma_bf16_16816(o[2 * nd2], pa, b0, b1);
      mma_bf16_16816(o[2 * nd2 + 1], pa, b2, b3);
    }
  }
  cp_async_wait<0>();
  dec_stamp(5);

  // ---- merge the 4 warps' states (fixed order) -> acc, sh.M, sh.L
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  if (t == 0) {
    sh.wm[warp][g] = m0;
    sh.wm[warp][g + 8] = m1;
    sh.wl[warp][g] = l0;
    sh.wl[warp][g + 8] = l1;
  }
  __syncwarp();  // every lane of this warp is done reading its stages
  {
    float* ow = reinterpret_cast<float*>(dsmem + (size_t)warp * WB);
#pragma unroll
    for (int nd = 0; nd < 16; ++nd) {
      *reinterpret_cast<float2*>(ow + g * kDecOStride + nd * 8 + 2 * t) = make_float2(o[nd][0], o[nd][1]);
      *reinterpret_cast<float2*>(ow + (g + 8) * kDecOStride + nd * 8 + 2 * t) =
          make_float2(o[nd][2], o[nd][3]);
    }
  }
  __syncthreads();
  if (tid < 16) {
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kDecWarps; ++w) M = fmaxf(M, sh.wm[w][tid]);
    float L = 0.f;
#pragma unroll
    for (int w = 0; w < kDecWarps; ++w) {
      const float mw = sh.wm[w][tid];
      const float f = mw == -INFINITY ? 0.f : ex2(mw - M);  // a warp without tiles: weight 0
      sh.wf[w][tid] = f;
      L += sh.wl[w][tid] * f;
    }
    sh.M[tid] = M;
    sh.L[tid] = L;
    sh.scl[tid] = 1.f / L;
  }
  __syncthreads();
  const int per = G * 32;
  float4 acc[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int idx = tid + kDecThreads * k;
    acc[k] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (idx < per) {
      const int r = idx >> 5, c = (idx & 31) * 4;
      float4 a4 = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int w = 0; w < kDecWarps; ++w) {
        const float f = sh.wf[w][r];
        const float4 v = *reinterpret_cast<const float4*>(
            reinterpret_cast<const float*>(dsmem + (size_t)w * WB) + r * kDecOStride + c);
        a4.x += f * v.x;
        a4.y += f * v.y;
        a4.z += f * v.z;
        a4.w += f * v.w;
      }
      acc[k] = a4;
    }
  }
  dec_stamp(6);
  if (n_act == 1) {
    dec_write_final<kDecThreads>(a, G, row, kvh, acc, sh);
    dec_stamp(7);
    return;
  }
  if constexpr (CLU) {
    dec_cluster_final<kDecThreads>(a, G, row, kvh, split, a.max_splits, n_act, acc, sh, cs);
    dec_stamp(7);
    return;
  }

  // ---- several splits: publish the partial, the last CTA merges.
  const int64_t pair = (int64_t)seq * a.n_kv_heads + kvh;
  {
    float4* dst = reinterpret_cast<float4*>(p.po + ((pair * a.max_splits + split) * G) * kDecD);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int idx = tid + kDecThreads * k;
      if (idx < per) __stcg(dst + idx, acc[k]);
    }
    if (tid < G) __stcg(p.pml + (pair * a.max_splits + split) * G + tid, make_float2(sh.M[tid], sh.L[tid]));
  }
  int* cnt = p.counters + pair * kDecCntStride;
  const float* stage = reinterpret_cast<const float*>(dsmem);
  const uint32_t stage_s = (uint32_t)__cvta_generic_to_shared(dsmem);
  const int cap = (kDecWarps * WB) / (G * kDecD * 4);
  int n_final = n_act;                                           // partials of the final merge
  const float* fin_o = p.po + (pair * a.max_splits) * G * kDecD;  // ... and where they are
  const float2* fin_ml = p.pml + (pair * a.max_splits) * G;
  if (n_act > p.direct_max) {
    // Level 1: groups of R consecutive splits; the last of a group merges it.
    const int R = dec_ceil_sqrt(n_act);
    const int grp = split / R;
    const int gn = min(R, n_act - grp * R);
    if (!dec_arrive(cnt + 1 + grp, gn, sh)) {
      dec_stamp(7);
      return;
    }
    dec_merge<kDecThreads>(p.po + (pair * a.max_splits + grp * R) * G * kDecD, p.pml + (pair * a.max_splits + grp * R) * G,
              gn, G, stage, stage_s, cap, acc, sh);
    float4* dst = reinterpret_cast<float4*>(p.go + ((pair * p.gmax + grp) * G) * kDecD);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int idx = tid + kDecThreads * k;
      if (idx < per) __stcg(dst + idx, acc[k]);
    }
    if (tid < G) __stcg(p.gml + (pair * p.gmax + grp) * G + tid, make_float2(sh.M[tid], sh.L[tid]));
    n_final = (n_act + R - 1) / R;
    fin_o = p.go + (pair * p.gmax) * G * kDecD;
    fin_ml = p.gml + (pair * p.gmax) * G;
  }
  if (!dec_arrive(cnt, n_final, sh)) {
    dec_stamp(7);
    return;
  }
  dec_stamp(8);
  dec_merge<kDecThreads>(fin_o, fin_ml, n_final, G, stage, stage_s, cap, acc, sh);
  dec_stamp(9);
  if (tid < G) sh.scl[tid] = 1.f / sh.L[tid];
  __syncthreads();
  dec_write_final<kDecThreads>(a, G, row, kvh, acc, sh);
  dec_stamp(7);
}

struct DecWsLayout {
  size_t counters, po, pml, go, gml, total;
  int gmax;
};
// The counter header is the same for every shape (see the top of this part);
// only the data regions after it depend on the shape.
DecWsLayout dec_ws_layout(int n_seqs, int G, int n_kv, int max_splits) {
  DecWsLayout w{};
  const size_t pairs = (size_t)n_seqs * n_kv;
  w.gmax = max_splits > 1 ? dec_ceil_sqrt(max_splits) : 0;
  auto al = [](size_t x) { return (x + 255) & ~(size_t)255; };
  size_t off = 0;
  w.counters = off;
  off = al(off + kDecCounterBytes);
  w.po = off;
  off = al(off + pairs * max_splits * G * kDecD * sizeof(float));
  w.pml = off;
  off = al(off + pairs * max_splits * G * sizeof(float2));
  w.go = off;
  off = al(off + pairs * w.gmax * G * kDecD * sizeof(float));
  w.gml = off;
  off = al(off + pairs * w.gmax * G * sizeof(float2));
  w.total = off;
  return w;
}

// cudaFuncSetAttribute once per device and kernel instantiation.
template <int S, int W, bool CLU, bool F8>
cudaError_t dec_prepare(int smem) {
  static std::atomic<unsigned long long> done{0};
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  const unsigned long long bit = dev < 64 ? 1ull << dev : 0;
  if (bit && (done.load(std::memory_order_relaxed) & bit)) return cudaSuccess;
  e = cudaFuncSetAttribute(decode_attn_kernel<S, W, CLU, F8>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  e = cudaFuncSetAttribute(decode_attn_kernel<S, W, CLU, F8>, cudaFuncAttributePreferredSharedMemoryCarveout,
                           (int)cudaSharedmemCarveoutMaxShared);
  if (e != cudaSuccess) return e;
  if (CLU) {
    e = cudaFuncSetAttribute(decode_attn_kernel<S, W, CLU, F8>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    if (e != cudaSuccess) return e;
  }
  done.fetch_or(bit, std::memory_order_relaxed);
  return cudaSuccess;
}

int dec_smem(const DecodeAttnArgs& a, const DeviceInfo& dd, int S, int W) {
  int smem = W * (a.k_cache8 ? 2 * S * kDecF8StageBytes : S * kDecStageBytes);
  // Padded, two CTAs need more than the SM has (static shared memory and the
  // per-CTA reservation only add to that).
  if (a.one_per_sm) smem = std::max(smem, dd.smem_per_sm / 2 + 1024);
  return smem;
}

// The most dynamic shared memory a launch of any depth asks (4 stages with 4
// warps, 3 with 8), for the kernel's attribute (padding included where
// larger).
template <int W, bool F8>
constexpr int dec_smem_max() {
  return W * dec_warp_bytes<W == 8 ? 3 : 4, F8>() > W * (W == 8 ? 3 : 4) * kDecStageBytes
             ? W * dec_warp_bytes<W == 8 ? 3 : 4, F8>()
             : W * (W == 8 ? 3 : 4) * kDecStageBytes;
}

// Clusters of max_splits CTAs (2, 4, 8 or 16) of the S-stage cluster kernel
// that the device holds at once (cudaOccupancyMaxActiveClusters: registers,
// shared memory, GPC sizes); 0 where none launches. Asked once per device,
// depth, size and shared memory padding.
template <int S, int W, bool F8>
int dec_cluster_capacity(const DecodeAttnArgs& a, const DeviceInfo& dd, int dev) {
  const int cl = a.max_splits;
  const int ci = cl == 2 ? 0 : cl == 4 ? 1 : cl == 8 ? 2 : cl == 16 ? 3 : -1;
  if (ci < 0 || dd.major < 9 || dev < 0 || dev >= 64) return 0;
  static std::atomic<int> cache[64][4][2];  // capacity + 1; 0: not asked yet (per S, W, F8 instance)
  std::atomic<int>& c = cache[dev][ci][a.one_per_sm ? 1 : 0];
  int v = c.load(std::memory_order_relaxed);
  if (v > 0) return v - 1;
  const int smem = dec_smem(a, dd, S, W);
  int n = 0;
  if (dec_prepare<S, W, true, F8>(std::max(smem, dec_smem_max<W, F8>())) == cudaSuccess) {
    DecodeAttnArgs one = a;
    one.n_seqs = 1;
    one.n_kv_heads = 1;
    one.pdl = 0;
    const LaunchConfig lc(dim3(one.max_splits, one.n_kv_heads, one.n_seqs), dim3(W * 32), smem, nullptr, false, cl);
    if (cudaOccupancyMaxActiveClusters(&n, decode_attn_kernel<S, W, true, F8>, &lc.cfg) != cudaSuccess) n = 0;
  }
  (void)cudaGetLastError();  // a failed query means "no cluster"
  c.store(n + 1, std::memory_order_relaxed);
  return n;
}

template <int S, int W, bool CLU, bool F8>
cudaError_t dec_launch(const DecodeAttnArgs& a, const DecParams& p, const DeviceInfo& dd, cudaStream_t st) {
  const int smem = dec_smem(a, dd, S, W);
  cudaError_t e = dec_prepare<S, W, CLU, F8>(std::max(smem, dec_smem_max<W, F8>()));
  if (e != cudaSuccess) return e;
  return launch_kernel(a.pdl != 0, CLU ? a.max_splits : 0, decode_attn_kernel<S, W, CLU, F8>,
                       dim3(a.max_splits, a.n_kv_heads, a.n_seqs), dim3(W * 32), smem, st, a, p);
}

template <int S, int W, bool F8>
cudaError_t dec_dispatch(const DecodeAttnArgs& a, const DecParams& p, const DeviceInfo& dd, int dev,
                         int mode, cudaStream_t st) {
  if (mode != 1 && a.max_splits > 1) {
    const int64_t pairs = (int64_t)a.n_seqs * a.n_kv_heads;
    // Small batches (the policy asks 16 or more splits; 2-8 pairs on 132
    // SMs): a cluster of 16 splits per pair. attn_check --bench on an H200
    // (2026-11-28, batch 4, us, 33 splits merged by the last CTA -> 16 in a
    // cluster): 2k 11.44 -> 9.78, 4k 15.24 -> 11.52, 8k 18.00 -> 14.38, 16k
    // 21.76 -> 20.80, but 32k 31.48 -> 33.61, where 64 SMs stream too slowly.
    // Batch 1 too since the 8-warp CTAs and the pushed merge (the step runs
    // attn_layer_t1 there; other one-sequence launches take this): 16 splits
    // in a cluster against the policy's 128 merged by the last CTA, H200
    // 2026-11-30, us: 1k 7.55 / 9.06, 2k 8.34 / 9.97, 4k 10.01 / 13.03, 8k
    // 11.97 / 12.97, 16k 15.35 / 15.29, but 32k 22.06 / 18.07.
    // Where 2-8 clusters of 16 do not fit at once (6 and 8 sequences on an
    // H200), clusters of 8: decode step batch 6 8.65 -> 8.23 ms, 8 9.51 ->
    // 8.99 (the policy's 16 or 22 splits merged by the last CTA before).
    // (Clusters of 8 from the policy's 8-14 splits, batches 10-16: unchanged.)
    if (mode == 0 && a.max_splits >= kDecMaxCluster && pairs >= 1) {
      DecodeAttnArgs c = a;
      for (int cl = kDecMaxCluster; cl >= 8; cl /= 2) {
        c.max_splits = cl;
        if (dec_cluster_capacity<S, W, F8>(c, dd, dev) >= pairs) return dec_launch<S, W, true, F8>(c, p, dd, st);
      }
    }
    const int cap = dec_cluster_capacity<S, W, F8>(a, dd, dev);
    if (cap > 0 && (mode == 2 || cap >= pairs)) return dec_launch<S, W, true, F8>(a, p, dd, st);
  }
  return dec_launch<S, W, false, F8>(a, p, dd, st);
}

}  // namespace

int decode_attention_splits(int n_seqs, int n_kv_heads, int num_sms, bool kv_fp8) {
  if (n_seqs <= 0 || n_kv_heads <= 0) return 1;
  if (num_sms <= 0) num_sms = 132;
  const long long pairs = (long long)n_seqs * n_kv_heads;
  // The FP8 cache: twice the CTAs (its tiles carry half the bytes for the
  // same per-tile work, so more warps an SM keep HBM busy). H200, 2026-11-29,
  // kvfp8_check --sweep, us, 1 -> 2 CTAs an SM (2 stages): batch 64 / 4k
  // 27.2 -> 24.6, 128 / 4k 51.4 -> 41.1, 64 / 16k 88.4 -> 76.4, 256 / 2k 39.4
  // -> 39.3, 16 / 4k and batch 1 unchanged.
  const long long target = (long long)num_sms * std::max(1, g_dec_tuning.ctas_per_sm) * (kv_fp8 ? 2 : 1);
  long long s = target / pairs;
  // Mid batches (BF16 cache, one CTA an SM): fewer splits than SMs / pairs,
  // in clusters (dec_shape's forms for them). 5-7 splits (batch 17-26 on 132
  // SMs) -> 4, 3-4 (batch 27-44) -> 2. H200, 2026-11-30, attn_check --forms,
  // us, 1k / 2k / 4k / 8k / 16k, the policy -> these: batch 24 (5 splits, the
  // last CTA's merge -> 4 in clusters of 4, 3 stages) 12.01 / 15.37 / 19.86 /
  // 31.41 / 54.63 -> 10.12 / 12.76 / 18.33 / 29.98 / 53.52; batch 32 (4 -> 2,
  // 8 warps) 13.28 / 16.20 / 22.72 / 38.08 / 68.63 -> 12.15 / 15.56 / 22.48 /
  // 37.84 / 68.43; batch 40 (3 -> 2, 8 warps, 2 stages) 14.09 / 17.70 /
  // 27.09 / 46.38 / 85.02 -> 11.83 / 16.37 / 26.19 / 46.13 / 85.29.
  if (!kv_fp8 && g_dec_tuning.ctas_per_sm <= 1) s = s >= 5 && s <= 7 ? 4 : s >= 3 && s <= 4 ? 2 : s;
  return (int)std::max(1LL, std::min<long long>(s, kDecPolicyMaxSplits));
}

// A launch's pipeline depth and warps per CTA (tuning knobs override).
struct DecShape {
  int stages, warps;
};
static DecShape dec_shape(const DecodeAttnArgs& a, const DeviceInfo& dd) {
  const bool f8 = a.k_cache8 != nullptr;
  const bool one_wave = (int64_t)a.max_splits * a.n_kv_heads * a.n_seqs <= dd.sms;
  // Warps: 8 where the grid fits one wave of one CTA an SM and a pair has at
  // most 2 splits (batch 27-132 at one KV head) or there is one pair (BF16
  // cache), else 4. A 4-warp CTA alone on an SM (one warp a scheduler)
  // streamed ~32 GB/s, so such grids read KV at <= 4.25 TB/s. H200,
  // 2026-11-30, attn_check --bench, us, 4 -> 8 warps: batch 64 / 4k 38.5 ->
  // 37.1, 64 / 16k 130.6 -> 127.7, 128 / 4k 67.7 -> 66.0, 128 / 16k 252.3 ->
  // 247.9, batch 1 / 16k 15.7 -> 15.0; but 64 / 1k 16.3 -> 16.8, 128 / 1k
  // 20.1 -> 20.7, and at 4-16 sequences (16-33 splits, 8 splits) 1-9% slower
  // (a CTA's few keys over twice the warps), so not there. Past one wave two
  // 4-warp CTAs share an SM already. The FP8 cache runs two CTAs an SM
  // instead (decode_attention_splits).
  int warps = g_dec_tuning.warps;
  const int64_t pairs = (int64_t)a.n_kv_heads * a.n_seqs;
  if (warps != 4 && warps != 8) warps = !f8 && one_wave && (a.max_splits <= 2 || pairs == 1) ? 8 : 4;
  if (f8) warps = 4;
  int stages = g_dec_tuning.stages;
  // 8-warp CTAs at 2 stages where they hold more than half the SMs (batch
  // 33-132 at one KV head), 4-warp CTAs of the mid batches' 4 splits at 3,
  // and past one wave 2 (up to three CTAs an SM). H200, 2026-11-30,
  // attn_check --forms, us, 1k / 2k / 4k / 8k / 16k, the stages before ->
  // these: batch 48 (3 -> 2) 13.55 / 18.25 / 29.43 / 55.55 / 103.55 -> 12.55
  // / 17.79 / 28.93 / 52.01 / 98.36, 64 15.14 / 21.17 / 35.45 / 64.26 / 124.83
  // -> 14.14 / 20.46 / 35.36 / 65.05 / 125.44, 96 16.93 / 28.84 / 54.87 /
  // 105.51 / 208.89 -> 16.47 / 27.94 / 51.08 / 97.49 / 188.91, 128 19.87 /
  // 34.53 / 63.79 / 124.88 / 243.22 -> 19.55 / 34.41 / 64.30 / 123.68 /
  // 242.28; batch 24 at 4 splits (4 -> 3) 10.66 / 13.32 / 18.49 / 30.04 /
  // 53.06 -> 10.12 / 12.76 / 18.33 / 29.98 / 53.52; past one wave (3 -> 2)
  // batch 160 25.60 / 45.90 / 91.31 / 174.99 / 345.48 -> 25.47 / 45.40 /
  // 86.67 / 165.46 / 323.92, 192 28.74 / 52.97 / 101.93 / 196.43 / 391.02 ->
  // 27.99 / 51.36 / 97.54 / 189.69 / 371.09, 256 35.22 / 64.28 / 124.93 /
  // 244.14 / 479.83 -> 34.54 / 64.44 / 124.27 / 242.42 / 481.02.
  if (stages == 0 && !f8) {
    const int64_t ctas = (int64_t)a.max_splits * pairs;
    if (!one_wave) stages = 2;
    else if (warps == 8 && pairs > 1 && 2 * ctas > dd.sms) stages = 2;
    else if (warps == 4 && a.max_splits == 4 && pairs > 16) stages = 3;
  }
  // The FP8 cache's stages hold half the bytes, and it runs twice the stages
  // of the depth: 3 (6 of 4 KB a warp) where the grid fits one wave, else 2
  // (4). H200, 2026-11-29, kvfp8_check --sweep, us, default (4 / 3) -> these:
  // batch 1 / 2k 9.54 -> 9.28, 4 / 4k 8.79 -> 8.30, 16 / 4k 13.54 -> 12.96,
  // 256 / 2k 41.37 -> 39.40 (at 2 CTAs an SM the deeper rings lose more).
  // Eight warps: 3 stages (192 KB), 2 past one wave.
  if (stages == 0) stages = f8 ? (one_wave ? 3 : 2) : warps == 8 ? (one_wave ? 3 : 2) : one_wave ? 4 : 3;
  if (warps == 8) stages = std::min(stages, 3);
  return {stages, warps};
}

// Splits a launch really uses: more (sequence, KV head) pairs than the counter
// header holds run unsplit (max_splits is a maximum; with that many pairs the
// grid is large without splits, and the split policy never asks for it).
static int dec_eff_splits(int n_seqs, int n_kv_heads, int max_splits) {
  return (long long)n_seqs * n_kv_heads > kDecMaxPairs ? 1 : max_splits;
}

// The short-context form: 9-16 (sequence, KV head) pairs of 8 splits (the
// policy's for batch 16), BF16 cache, in clusters of 8 at 2 stages — 64 KB a
// CTA, so that 16 such clusters fit the device at once (at 3-4 stages they do
// not) — instead of the last CTA's merge at 4 stages: a cheaper merge against
// a shallower ring. Same splits, same bits. H200, 2026-11-30, attn_check
// --bench, batch 16, us, this form / the last-CTA merge: 1k 9.24 / 10.67, 2k
// 10.89 / 13.52, 4k 15.21 / 16.45, 6k 19.70 / 19.76, 8k 24.12 / 23.26, 16k
// 41.72 / 39.02; in the decode step (PDL, the last-CTA form padded to one CTA
// an SM), ms, batch 16: 1k 11.45 -> 11.0, 2k 11.6 -> 11.2, 4k 11.9 -> 11.6,
// 8k 12.7 -> 12.4, 10k 12.8 -> 12.7, 12k 13.15 -> 13.15, 16k 13.9 -> 14.0,
// 32k 16.5 -> 17.0 — hence kDecShortMaxCtx.
static bool dec_short_form(long long pairs, int max_splits, bool f8) {
  return !f8 && max_splits == 8 && pairs >= 9 && pairs <= 16;
}

int decode_attention_ctx_class(int n_seqs, int n_kv_heads, int max_splits, bool kv_fp8, int max_ctx) {
  if (n_seqs <= 0 || n_kv_heads <= 0) return kDecCtxAny;
  max_splits = dec_eff_splits(n_seqs, n_kv_heads, max_splits);
  const long long pairs = (long long)n_seqs * n_kv_heads;
  // (A long class for the small batches' clusters of 16, the policy's splits
  // past 16k keys, was measured and dropped: faster in the kernel bench at
  // batch 2 from 24k and batch 8 from 16k, but in the step, H200 2026-11-30,
  // ms, batch 2 / 20k 6.50 -> 6.77, 4 / 20k 7.78 -> 8.31, 4 / 32k 8.43 ->
  // 8.79, only 2 / 32k 7.20 -> 6.98.)
  return dec_short_form(pairs, max_splits, kv_fp8) && max_ctx <= kDecShortMaxCtx ? kDecCtxShort : kDecCtxAny;
}

size_t decode_attention_workspace_bytes(int n_seqs, int n_q_heads, int n_kv_heads, int max_splits) {
  if (n_seqs <= 0 || n_kv_heads <= 0 || n_q_heads <= 0 || n_q_heads % n_kv_heads != 0) return 0;
  max_splits = dec_eff_splits(n_seqs, n_kv_heads, max_splits);
  if (max_splits <= 1) return 0;
  return dec_ws_layout(n_seqs, n_q_heads / n_kv_heads, n_kv_heads, std::min(max_splits, kDecMaxSplits)).total;
}

cudaError_t attention_decode(const DecodeAttnArgs& args, cudaStream_t st) {
  if (args.n_seqs <= 0) return cudaSuccess;
  DecodeAttnArgs a = args;
  if (a.n_kv_heads <= 0 || a.n_q_heads <= 0 || a.n_q_heads % a.n_kv_heads != 0) return cudaErrorInvalidValue;
  const int G = a.n_q_heads / a.n_kv_heads;
  if (G < 1 || G > kDecodeMaxGroup) return cudaErrorInvalidValue;
  if (a.block_size <= 0 || a.block_size % kDecTile != 0) return cudaErrorInvalidValue;
  if (a.max_splits < 1 || a.max_splits > kDecMaxSplits) return cudaErrorInvalidValue;
  if (a.n_seqs > 65535 || a.n_kv_heads > 65535) return cudaErrorInvalidValue;
  if (a.out_q && (a.n_kv_heads != 1 || !a.out_scale)) return cudaErrorInvalidValue;
  if (!a.out && !a.out_q) return cudaErrorInvalidValue;
  const bool f8 = a.k_cache8 != nullptr;
  if (f8 ? (!a.v_cache8 || !a.k_scale || !a.v_scale || a.k_cache || a.v_cache || a.block_size != kKvFp8BlockSize)
         : (!a.k_cache || !a.v_cache))
    return cudaErrorInvalidValue;
  if (!a.q || !a.q_row || !a.ctx_len || !a.bt_offset || !a.block_tables) return cudaErrorInvalidValue;
  if (a.ctx_class != kDecCtxAny && a.ctx_class != kDecCtxShort) return cudaErrorInvalidValue;
  a.max_splits = dec_eff_splits(a.n_seqs, a.n_kv_heads, a.max_splits);
  if (a.max_splits > 1 && !a.workspace) return cudaErrorInvalidValue;
  const DecTuning& tu = g_dec_tuning;
  DecParams p{};
  p.G = G;
  p.min_chunk = std::max(kDecTile, tu.min_chunk / kDecTile * kDecTile);
  p.direct_max = std::max(1, std::min(tu.direct_max, kDecMaxMerge));
  if (a.max_splits > 1) {
    const DecWsLayout w = dec_ws_layout(a.n_seqs, G, a.n_kv_heads, a.max_splits);
    char* base = static_cast<char*>(a.workspace);
    p.gmax = w.gmax;
    p.counters = reinterpret_cast<int*>(base + w.counters);
    p.po = reinterpret_cast<float*>(base + w.po);
    p.pml = reinterpret_cast<float2*>(base + w.pml);
    p.go = reinterpret_cast<float*>(base + w.go);
    p.gml = reinterpret_cast<float2*>(base + w.gml);
  }
  // The SM count and shared memory per SM (asked once per device).
  DeviceInfo dd;
  int dev = 0;
  const cudaError_t de = device_info(dev, dd);
  if (de != cudaSuccess) return de;
  const DecShape shp = dec_shape(a, dd);
  // Short contexts (the host's ctx_class) at 9-16 pairs of 8 splits: clusters
  // of 8 at 2 stages (dec_short_form), unpadded (padded to one CTA an SM the 16
  // clusters would not fit), where the default knobs are in force.
  if (a.ctx_class == kDecCtxShort && dec_short_form((long long)a.n_seqs * a.n_kv_heads, a.max_splits, f8) &&
      tu.cluster == 0 && tu.stages == 0 && tu.warps == 0) {
    DecodeAttnArgs c = a;
    c.one_per_sm = 0;
    if (dec_cluster_capacity<2, 4, false>(c, dd, dev) >= a.n_seqs * a.n_kv_heads)
      return dec_launch<2, 4, true, false>(c, p, dd, st);
  }
  if (f8) {
    if (dd.major < 9) return cudaErrorInvalidValue;  // the FP8 cache is an sm_90 path (kernels.h)
    switch (shp.stages) {
      case 2: return dec_dispatch<2, 4, true>(a, p, dd, dev, tu.cluster, st);
      case 4: return dec_dispatch<4, 4, true>(a, p, dd, dev, tu.cluster, st);
      default: return dec_dispatch<3, 4, true>(a, p, dd, dev, tu.cluster, st);
    }
  }
  if (shp.warps == 8) {
    switch (shp.stages) {
      case 2: return dec_dispatch<2, 8, false>(a, p, dd, dev, tu.cluster, st);
      default: return dec_dispatch<3, 8, false>(a, p, dd, dev, tu.cluster, st);
    }
  }
  switch (shp.stages) {
    case 2: return dec_dispatch<2, 4, false>(a, p, dd, dev, tu.cluster, st);
    case 4: return dec_dispatch<4, 4, false>(a, p, dd, dev, tu.cluster, st);
    default: return dec_dispatch<3, 4, false>(a, p, dd, dev, tu.cluster, st);
  }
}

// Probe hook (attn_check --probe): copies the stamps of the first n CTAs
// since the last call, 13 a CTA (12 stamps, the SM id), and clears them; returns the CTAs copied, 0
// without the probe.
int decode_attention_probe(unsigned long long* out, int n) {
#if GLMK_DEC_PROBE
  n = std::min(n, kDecProbeCtas);
  if (cudaMemcpyFromSymbol(out, g_dec_probe, (size_t)n * kDecProbeStamps * 8) != cudaSuccess) return 0;
  void* sym = nullptr;  // cleared for the next launch
  if (cudaGetSymbolAddress(&sym, g_dec_probe) != cudaSuccess || cudaMemset(sym, 0, sizeof g_dec_probe) != cudaSuccess)
    return 0;
  return n;
#else
  (void)out;
  (void)n;
  return 0;
#endif
}

// Test / bench hook (not in kernels.h; attn_check declares it): the launch
// knobs of attention_decode. Not thread-safe; the runtime never calls it.
struct DecodeAttnTuning {
  int stages, min_chunk, direct_max, ctas_per_sm, cluster;
  int warps;  // 0 auto, 4 or 8
};
void decode_attention_get_tuning(DecodeAttnTuning* t) {
  *t = {g_dec_tuning.stages, g_dec_tuning.min_chunk, g_dec_tuning.direct_max, g_dec_tuning.ctas_per_sm,
        g_dec_tuning.cluster, g_dec_tuning.warps};
}
// The clusters of the launch's max_splits CTAs the device holds at once, for
// the stage count attention_decode would pick (0: the cluster form does not
// launch there).
int decode_attention_cluster_capacity(const DecodeAttnArgs& args) {
  DecodeAttnArgs a = args;
  a.max_splits = dec_eff_splits(a.n_seqs, a.n_kv_heads, a.max_splits);
  DeviceInfo dd;
  int dev = 0;
  if (device_info(dev, dd) != cudaSuccess) return 0;
  const DecShape shp = dec_shape(a, dd);
  if (a.k_cache8) {
    switch (shp.stages) {
      case 2: return dec_cluster_capacity<2, 4, true>(a, dd, dev);
      case 4: return dec_cluster_capacity<4, 4, true>(a, dd, dev);
      default: return dec_cluster_capacity<3, 4, true>(a, dd, dev);
    }
  }
  if (shp.warps == 8) {
    switch (shp.stages) {
      case 2: return dec_cluster_capacity<2, 8, false>(a, dd, dev);
      default: return dec_cluster_capacity<3, 8, false>(a, dd, dev);
    }
  }
  switch (shp.stages) {
    case 2: return dec_cluster_capacity<2, 4, false>(a, dd, dev);
    case 4: return dec_cluster_capacity<4, 4, false>(a, dd, dev);
    default: return dec_cluster_capacity<3, 4, false>(a, dd, dev);
  }
}
// Bytes at the start of every attention_decode workspace that hold the merge
// counters (the same for every shape); all zero between launches.
size_t decode_attention_counter_bytes() { return kDecCounterBytes; }
void decode_attention_set_tuning(const DecodeAttnTuning* t) {
  if (!t) {
    g_dec_tuning = DecTuning{};
    return;
  }
  g_dec_tuning.stages = t->stages;
  g_dec_tuning.min_chunk = t->min_chunk;
  g_dec_tuning.direct_max = t->direct_max;
  g_dec_tuning.ctas_per_sm = t->ctas_per_sm;
  g_dec_tuning.cluster = t->cluster;
  g_dec_tuning.warps = t->warps;
}


// ==================================================================== prefill
//
// attention_prefill: causal flash attention for several new tokens per
// sequence. One CTA (NW warps) per (work item, KV head); the item's rows
// (row r = token r / G, head r % G of the KV head, see kernels.h) are the M
// dimension of the mma, warp w owning rows [16*MT*w, 16*MT*(w+1)) as MT m16
// tiles. The keys [k_begin, k_end) are cut into 64-key tiles (a 16-key group
// never straddles a page: block_size % 16 == 0 and tiles start at multiples
// of 64); each tile's K and V (16 KB each) go through an S-stage cp.async ring
// shared by the whole CTA, one block barrier per tile. Per tile and warp:
//   S[16MT x 64]  = Q . K^T        8 k-steps x 8 n-tiles x MT  mma m16n8k16
//   P = exp2(S - m)                FP32 online softmax (log2 domain), causal
//                                  mask key < min(pos(row) + 1, k_end)
//   O[16MT x 128] += P(bf16) . V   4 k-steps x 16 n-tiles x MT
// Q is scaled by scale*log2(e), rounded to bf16 once and kept in shared
// memory (A fragments by ldmatrix each tile: registers hold O and S). K tiles
// are the col-major B operand (ldmatrix), V tiles the row-major one
// (ldmatrix.trans); Q, K and V rows are 256 bytes, XOR-swizzled per 16-byte
// chunk (chunk c of row r at c ^ (r & 7)) as in attention_decode. A warp
// skips tiles whose keys are all past its rows (the causal upper triangle)
// and masks only tiles that reach past its first row's limit.
// Block ids: every warp keeps, in lane i, the cache offset (in 16-key groups)
// of group 32b + i of the item's keys (batch b = 8 tiles), loaded one batch
// ahead, and the copy code reads them with __shfl_sync.
// Split items (n_splits > 1) write their partial (O unnormalised, m in log2
// units, l) per row into a workspace slot and count themselves on the item's
// counter; the CTA that arrives last merges the pieces in split order and
// writes the rows, then resets the counter (the workspace is zeroed once).
namespace {

constexpr int kPfD = 128;                        // head_dim
constexpr int kPfBN = 64;                        // keys per tile
constexpr int kPfTileBytes = kPfBN * kPfD * 2;   // 16 KB: K or V of one tile
constexpr int kPfStageBytes = 2 * kPfTileBytes;  // K + V
constexpr int kPfSlotFloats = kPfD + 4;          // a row's partial: O[128], m, l, 2 unused (528 B)
constexpr size_t kPfCounterBytes = (size_t)kPrefillMaxCounters * sizeof(int);  // workspace header
static_assert(kPfCounterBytes % 256 == 0, "slots stay 256-byte aligned");
static_assert(kPrefillMaxRows == 128, "workspace slots sized for 128-row items");

// Knobs (defaults; attn_check --sweep-prefill changes them through the hook
// at the end of this part).
// Defaults from prefill_check --sweep on an H200 (2026-11-24, ms): 2k prompt
// 128 rows split 0.5: 0.129, unsplit 0.086, 64 rows 0.067; 8k prompt 128 rows
// 0.641, 64 rows 0.752; 2k chunk after 14k 128 rows split 2.0: 0.749, 64 rows
// 0.918; 8 prompts of 1k 128 rows 0.115, 64 rows 0.135; 3 stages slower at
// 128 rows (shared memory halves the CTAs per SM), equal at 64.
struct PfTuning {
  int kernel = 0;             // 0: on sm_90 the warp-specialized kernel for 128-row items and the wgmma one
                              // for 64-row items, else mma.sync; 1: mma.sync; 2: wgmma; 3: as 0 on sm_90
  int rows = 0;               // rows per item: 128 (mma.sync: 4 warps x 32 rows; wgmma: 2 warpgroups
                              // x 64), 64 (4 warps x 16 rows; 1 warpgroup), 0: chosen per step
  int stages = 0;             // K/V ring depth of the mma.sync and wgmma kernels: 2 or 3 (smem 96 / 128 KB per
                              // CTA at 128 rows), 0: attention_prefill's choice; the warp-specialized kernel:
                              // 3 or 4, else its default (3)
  int min_split_tiles = 8;    // pieces of a split item have at least this many 64-key tiles (H200,
                              // 2026-11-29: at 4 a 512-token prompt took 0.032 ms split against 0.018 unsplit)
  float split_frac = 2.0f;    // split target: split_frac * (tiles per SM); 0: never split
  // ... at most this when the items would fill fewer than two CTAs per SM
  // and are long (kPfUnderfillMinTiles key tiles on average): a 2,048-token
  // chunk after long earlier context is 192 items of 128 rows. On an H200
  // (2026-11-28) the chunk after 14,336 keys took 0.534 ms split at 0.5
  // against 0.610 at 2.0 and a 32k prompt's TTFT went 1,724 -> 1,621 ms;
  // short items lose (a 1k prompt 0.030 -> 0.049 ms split so). 0: no such rule.
  float underfill_frac = 0.5f;
};
constexpr int kPfUnderfillMinTiles = 128;  // 8,192 keys
PfTuning g_pf_tuning;

// The 10 ints of an item, loaded where written (volatile: not hoisted, so not
// kept in registers across the key loop).
__device__ __forceinline__ PrefillItem ld_item(const PrefillItem* p) {
  static_assert(sizeof(PrefillItem) == 40, "PrefillItem layout");
  const int* q = reinterpret_cast<const int*>(p);
  int v[10];
#pragma unroll
  for (int i = 0; i < 10; ++i) asm volatile("ld.global.nc.b32 %0, [%1];" : "=r"(v[i]) : "l"(q + i));
  return PrefillItem{v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9]};
}

// Shared-memory byte offset of 16-byte chunk c (0..15) of row r in a tile of
// nrows rows of 128 dims (256 bytes). mma.sync kernel: rows of 256 bytes,
// chunk c at c ^ (r & 7). WG (wgmma) kernel: the tile as two halves of 64 dims,
// [2][nrows][128 bytes], chunk c at half c / 8, position (c % 8) ^ (r & 7): the
// 128-byte swizzle wgmma's descriptors describe (tile bases 1024-aligned).
template <bool WG>
__device__ __forceinline__ uint32_t pf_chunk_off(int r, int c, int nrows) {
  if constexpr (WG) return (uint32_t)((c >> 3) * nrows * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
  else return (uint32_t)(r * 256 + ((c ^ (r & 7)) << 4));
}

// The pieces both prefill kernels share (the wgmma kernel's and the
// warp-specialized one's): Q into shared memory, the output rows, the split
// pieces' partials and their merge.

// Q rows -> bf16 (scaled to log2 units) at q_s in pf_chunk_off<WG>'s layout,
// by nt threads from thread tid. Rows past the item repeat its last row
// (computed, never written).
template <int ROWS, bool WG>
__device__ __forceinline__ void pf_load_q(const PrefillAttnArgs& a, const PrefillItem& it, int kvh, int G,
                                          uint32_t q_s, int tid, int nt) {
  const float qsc = a.scale * kLog2e;
  for (int idx = tid; idx < ROWS * 16; idx += nt) {
    const int r = idx >> 4, c = idx & 15;
    const int f = it.row0 + min(r, it.n_rows - 1);
    const int tq = f / G;
    const int hh = f - tq * G;
    const float4* src = reinterpret_cast<const float4*>(
        a.q + ((int64_t)(it.q_begin + tq) * a.n_q_heads + (int64_t)kvh * G + hh) * kPfD + c * 8);
    const float4 x0 = __ldg(src), x1 = __ldg(src + 1);
    const uint32_t w0 = pack_bf16(x0.x * qsc, x0.y * qsc), w1 = pack_bf16(x0.z * qsc, x0.w * qsc);
    const uint32_t w2 = pack_bf16(x1.x * qsc, x1.y * qsc), w3 = pack_bf16(x1.z * qsc, x1.w * qsc);
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(q_s + pf_chunk_off<WG>(r, c, ROWS)), "r"(w0),
                 "r"(w1), "r"(w2), "r"(w3)
                 : "memory");
  }
}

// Cache offset, in 16-key groups of 128 dims (2048 elements), of group
// `lane` (lanes 0..3) of the 64-key tile j of keys [k_begin, k_end) of KV
// head kvh, bt the sequence's block table (0 past k_end: never read).
__device__ __forceinline__ int pf_tile_group(const int* bt, int k_begin, int k_end, int bs, int n_kv, int kvh,
                                             int j, int lane) {
  const int key = k_begin + kPfBN * j + 16 * lane;
  if (lane >= 4 || key >= k_end) return 0;
  // (A power-of-two block size, as the runtime's 16, by a shift: no integer
  // division in the producer's loop.)
  const int pg = (bs & (bs - 1)) == 0 ? key >> (__ffs(bs) - 1) : key / bs;
  const int off = key - pg * bs;
  return (int)(((int64_t)bt[pg] * n_kv + kvh) * (bs >> 4) + (off >> 4));
}

// Copies the tile of keys key0 .. key0 + 63 into the stage at dst by NT
// threads: thread tid copies 16-byte chunk (tid & 15) of keys (tid >> 4) +
// (NT / 16) i of K and of V (cp.async; keys >= k_end zero-filled, and
// masked). gj: pf_tile_group of the tile in lanes 0..3.
template <int NT, bool WG>
__device__ __forceinline__ void pf_copy_tile(const __nv_bfloat16* kc, const __nv_bfloat16* vc, int key0, int k_end,
                                             uint32_t dst, int gj, int tid) {
  constexpr int LD_ITERS = kPfBN * 16 / NT;  // 16-byte chunks per thread (K; V the same)
  static_assert(LD_ITERS * NT == kPfBN * 16 && NT % 16 == 0, "tile copy split");
  const int c = tid & 15;
#pragma unroll
  for (int i = 0; i < LD_ITERS; ++i) {
    const int kr = (tid >> 4) + (NT / 16) * i;  // key within the tile
    const int grp = __shfl_sync(0xffffffffu, gj, kr >> 4);
    const bool ok = key0 + kr < k_end;
    const int64_t src = (int64_t)grp * (16 * kPfD) + (kr & 15) * kPfD + c * 8;
    const uint32_t so = pf_chunk_off<WG>(kr, c, kPfBN);
    cp_async16_zfill(dst + so, ok ? kc + src : kc, ok ? 16 : 0);
    cp_async16_zfill(dst + kPfTileBytes + so, ok ? vc + src : vc, ok ? 16 : 0);
  }
}

// pf_copy_tile<128, true> for the warp-specialized kernel's producer: the
// same chunks into the same places, but thread tid's keys are r0 + 8i (r0 =
// tid >> 4 < 8, i = 0..7), so its two keys of 16-key group b = i / 2 share
// one cache group and their shared-memory chunks sit 1,024 bytes apart (the
// swizzle depends on key % 8 = r0 only): the addresses are built once per
// group, and only a tile that reaches k_end takes the zero-filling copy.
// (The producer issued ~200 instructions a tile against ~300 a consumer warp.)
__device__ __forceinline__ void pf_copy_tile_ws(const __nv_bfloat16* kc, const __nv_bfloat16* vc, int key0,
                                                int k_end, uint32_t dst, int gj, int tid) {
  if (key0 + kPfBN > k_end) {
    pf_copy_tile<128, true>(kc, vc, key0, k_end, dst, gj, tid);
    return;
  }
  const int c = tid & 15, r0 = (tid >> 4) & 7;
  const uint32_t so = dst + pf_chunk_off<true>(r0, c, kPfBN);
  const int off = r0 * kPfD + c * 8;
#pragma unroll
  for (int b = 0; b < kPfBN / 16; ++b) {
    const int64_t grp = __shfl_sync(0xffffffffu, gj, b);
    const __nv_bfloat16* ks = kc + grp * (16 * kPfD) + off;
    const __nv_bfloat16* vs = vc + grp * (16 * kPfD) + off;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      cp_async16_zfill(so + (2 * b + h) * 1024, ks + h * 8 * kPfD, 16);
      cp_async16_zfill(so + kPfTileBytes + (2 * b + h) * 1024, vs + h * 8 * kPfD, 16);
    }
  }
}

// Row limits of warp w's 16 MT rows (row rr sees keys < lim_s[rr] = min(its
// position + 1, k_end)) and the warp's smallest and largest in wlim_s[2w],
// [2w + 1] (shared memory: registers are short in the key loop). Thread rows:
// (mt, h) -> row 16 MT w + 16 mt + 8 h + g.
template <int MT>
__device__ __forceinline__ void pf_row_limits(const PrefillAttnArgs& a, const PrefillItem& it, int G, int w,
                                              int* lim_s, int* wlim_s) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  int wlo = INT_MAX, whi = 0;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int rr = w * 16 * MT + mt * 16 + h * 8 + g;
      const int f = it.row0 + min(rr, it.n_rows - 1);
      const int pos = a.positions[it.q_begin + f / G];
      const int lim = min(pos + 1, it.k_end);
      if (t == 0) lim_s[rr] = lim;
      wlo = min(wlo, lim);
      whi = max(whi, lim);
    }
  }
  wlo = __reduce_min_sync(0xffffffffu, wlo);
  whi = __reduce_max_sync(0xffffffffu, whi);
  if (lane == 0) {
    wlim_s[2 * w] = wlo;
    wlim_s[2 * w + 1] = whi;
  }
}

// The output row of the item's row rr.
__device__ __forceinline__ float* pf_out_row(const PrefillAttnArgs& a, const PrefillItem& ie, int kvh, int G,
                                             int rr) {
  const int f = ie.row0 + rr;
  const int tq = f / G;
  return a.out + ((int64_t)(ie.q_begin + tq) * a.n_q_heads + (int64_t)kvh * G + (f - tq * G)) * kPfD;
}

// A thread's half h of its 16-row tile (o[nd][2h], o[nd][2h + 1]: dims 8nd +
// 2t, +1 of row rr): normalised into the output row (unsplit items), or with
// (m, l) into the piece's workspace slot (split items).
__device__ __forceinline__ void pf_store_half(float* row, const float (&o)[16][4], int h, int t, float l) {
  float* const dst = row + 2 * t;
  const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
  for (int nd = 0; nd < 16; ++nd)
    *reinterpret_cast<float2*>(dst + nd * 8) = make_float2(o[nd][2 * h] * inv, o[nd][2 * h + 1] * inv);
}
__device__ __forceinline__ void pf_publish_half(float* slot, const float (&o)[16][4], int h, int t, float m, float l) {
  float* const dst = slot + 2 * t;
#pragma unroll
  for (int nd = 0; nd < 16; ++nd)
    __stcg(reinterpret_cast<float2*>(dst + nd * 8), make_float2(o[nd][2 * h], o[nd][2 * h + 1]));
  if (t == 0) __stcg(reinterpret_cast<float2*>(slot + kPfD), make_float2(m, l));
}

// The last piece of a split item merges every piece's rows in piece order
// into the output, nt threads from thread tid.
template <int ROWS>
__device__ __forceinline__ void pf_merge(const PrefillAttnArgs& a, const PrefillItem& ie, int kvh, int G,
                                         const float* slots, int tid, int nt) {
  const int n = ie.n_splits, n_kv = a.n_kv_heads;
  const int64_t pstride = (int64_t)n_kv * ROWS * kPfSlotFloats;  // a row's slots of consecutive pieces
  const float* s0 = slots + ((int64_t)ie.part0 * n_kv + kvh) * ROWS * kPfSlotFloats;
  for (int idx = tid; idx < ie.n_rows * 32; idx += nt) {
    const int r = idx >> 5, c4 = idx & 31;
    const float* rp = s0 + (int64_t)r * kPfSlotFloats;
    float M = -INFINITY;
    for (int i = 0; i < n; ++i) M = fmaxf(M, __ldcg(rp + i * pstride + kPfD));
    float L = 0.f;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int i = 0; i < n; ++i) {
      const float2 ml = __ldcg(reinterpret_cast<const float2*>(rp + i * pstride + kPfD));
      const float4 v = __ldcg(reinterpret_cast<const float4*>(rp + i * pstride) + c4);
      const float w = ml.x == -INFINITY ? 0.f : ex2(ml.x - M);
      L += ml.y * w;
      acc.x += w * v.x;
      acc.y += w * v.y;
      acc.z += w * v.z;
      acc.w += w * v.w;
    }
    const float inv = L > 0.f ? 1.f / L : 0.f;
    reinterpret_cast<float4*>(pf_out_row(a, ie, kvh, G, r))[c4] =
        make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
  }
}

// The FP8 cache's 64-key tile as one thread of 128 holds it between its load
// and its widening into shared memory (pf_f8_load / pf_f8_store): K bytes
// 64 of key tid / 2 (dims 64 (tid & 1) ..), V rows of dims (tid & 31) + 32i
// over the 16 keys of the tile's block tid / 32 (consecutive lanes on
// consecutive dims: their widened rows start in 8 different bank groups),
// and their scales.
struct PfF8Raw {
  uint4 k[4], v[4];
  float4 vs[4];
  float ks;
  int k_ok, v_cnt;  // the key is < k_end; keys of the V block < k_end
};
// Tile keys key0 .. key0 + 63 (gj: pf_tile_group in lanes 0..3): plain loads
// into registers, issued a tile ahead of their use.
__device__ __forceinline__ void pf_f8_load(const PrefillAttnArgs& a, int key0, int k_end, int gj, int tid,
                                           PfF8Raw& r) {
  const int key = tid >> 1, w = tid >> 5;
  const int gk = __shfl_sync(0xffffffffu, gj, key >> 4);
  const int gv = __shfl_sync(0xffffffffu, gj, w);
  r.k_ok = key0 + key < k_end;
  r.v_cnt = min(max(k_end - (key0 + 16 * w), 0), 16);
  if (r.k_ok) {
    const uint4* src = reinterpret_cast<const uint4*>(a.k_cache8 + (int64_t)gk * (16 * kPfD) + (key & 15) * kPfD +
                                                      (tid & 1) * 64);
#pragma unroll
    for (int i = 0; i < 4; ++i) r.k[i] = __ldg(src + i);
    r.ks = __ldg(a.k_scale + (int64_t)gk * 16 + (key & 15));
  }
  if (r.v_cnt > 0) {
    const uint4* src = reinterpret_cast<const uint4*>(a.v_cache8 + (int64_t)gv * (16 * kPfD)) + (tid & 31);
#pragma unroll
    for (int i = 0; i < 4; ++i) r.v[i] = __ldg(src + 32 * i);
    const float4* sp = reinterpret_cast<const float4*>(a.v_scale + (int64_t)gv * 16);
#pragma unroll
    for (int i = 0; i < 4; ++i) r.vs[i] = __ldg(sp + i);
  }
}
// Widens a loaded tile (code * scale, BF16) into the stage at dst: K in
// pf_chunk_off<true>'s layout, V transposed, [128 dims][64 keys] with the
// 128-byte swizzle (the K-major B operand of O += P V). Keys from k_end: zeros.
__device__ __forceinline__ void pf_f8_store(const PfF8Raw& r, uint32_t dst, int tid) {
  const int key = tid >> 1, w = tid >> 5;
  const uint32_t* kw = reinterpret_cast<const uint32_t*>(r.k);
#pragma unroll
  for (int i = 0; i < 4; ++i) {  // 16 dims: chunks 2cc, 2cc + 1 of 8 dims
    const int cc = 4 * (tid & 1) + i;
    uint32_t w8[8];
#pragma unroll
    for (int h = 0; h < 4; ++h) {
      const float4 f = e4m3x4_to_f32(kw[4 * i + h]);
      w8[2 * h] = r.k_ok ? pack_bf16(f.x * r.ks, f.y * r.ks) : 0u;
      w8[2 * h + 1] = r.k_ok ? pack_bf16(f.z * r.ks, f.w * r.ks) : 0u;
    }
#pragma unroll
    for (int c = 0; c < 2; ++c)
      asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(dst + pf_chunk_off<true>(key, 2 * cc + c, kPfBN)),
                   "r"(w8[4 * c]), "r"(w8[4 * c + 1]), "r"(w8[4 * c + 2]), "r"(w8[4 * c + 3])
                   : "memory");
  }
  const float* vs = reinterpret_cast<const float*>(r.vs);
  const uint32_t* vw = reinterpret_cast<const uint32_t*>(r.v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {  // dim d: keys 16w .. 16w + 15
    const int d = (tid & 31) + 32 * i;
    uint32_t w8[8];
#pragma unroll
    for (int h = 0; h < 4; ++h) {
      const float4 f = e4m3x4_to_f32(vw[4 * i + h]);
      const int k = 4 * h;
      const float x0 = k < r.v_cnt ? f.x * vs[k] : 0.f, x1 = k + 1 < r.v_cnt ? f.y * vs[k + 1] : 0.f;
      const float x2 = k + 2 < r.v_cnt ? f.z * vs[k + 2] : 0.f, x3 = k + 3 < r.v_cnt ? f.w * vs[k + 3] : 0.f;
      w8[2 * h] = pack_bf16(x0, x1);
      w8[2 * h + 1] = pack_bf16(x2, x3);
    }
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const uint32_t off = kPfTileBytes + d * 128 + ((((2 * w + c) ^ (d & 7))) << 4);
      asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(dst + off), "r"(w8[4 * c]), "r"(w8[4 * c + 1]),
                   "r"(w8[4 * c + 2]), "r"(w8[4 * c + 3])
                   : "memory");
    }
  }
}

// WG: the same flash loop on the wgmma tensor cores (sm_90a). MT = 1; each
// warpgroup (4 warps) owns 64 rows: S = Q K^T as 8 m64n64k16 with Q and K
// from shared memory, the mask and online softmax on the accumulators (the
// same per-warp layout as the mma.sync tiles, so the same code), O += P V as 4
// m64n128k16 with P from registers and V read transposed (MN-major) from the
// same tiles. A warpgroup skips a tile only when all its 64 rows do.
template <int MT, int NW, int S, bool WG, bool F8>
__global__ void __launch_bounds__(NW * 32, 2) prefill_attn_kernel(PrefillAttnArgs a) {
  static_assert(S >= 2 && S <= 4, "pipeline depth");
  static_assert(!F8 || (WG && NW == 4 && S == 2), "the FP8 cache: one warpgroup of 64 rows, two stages");
  static_assert(!WG || (MT == 1 && (NW == 4 || NW == 8)), "wgmma kernel: warpgroups of 64 rows");
#if !defined(GLMK_HAS_WGMMA)
  if constexpr (WG) {
    __trap();  // launched only on sm_90 (attention_prefill)
    return;
  }
#endif
  constexpr int NT = NW * 32;
  constexpr int ROWS = 16 * MT * NW;            // rows per CTA
  constexpr int WROWS = 16 * MT;                // rows per warp
  extern __shared__ __align__(1024) unsigned char pf_smem[];

  const PrefillItem it = a.items[blockIdx.x];
  const int kvh = blockIdx.y;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  const int n_kv = a.n_kv_heads;
  const int G = a.n_q_heads / n_kv;
  const int bs = a.block_size;
  const int k_begin = it.k_begin, k_end = it.k_end;
  const int n_tiles = (k_end - k_begin + kPfBN - 1) / kPfBN;
  const int* bt = a.block_tables + a.seq_bt_offset[it.seq];
  const __nv_bfloat16* kc = a.k_cache;
  const __nv_bfloat16* vc = a.v_cache;
  // Shared memory (pf_launch): Q [ROWS][256 B] | S x [K 16 KB | V 16 KB] |
  // lim[ROWS] | flag, from a 256-byte aligned base (the ldmatrix addresses
  // below XOR the chunk bits 4..7 of the address itself); WG: 1024-aligned,
  // tiles as pf_chunk_off<true> lays them out.
  constexpr uint32_t kAlign = WG ? 1024u : 256u;
  const uint32_t q_s = ((uint32_t)__cvta_generic_to_shared(pf_smem) + kAlign - 1) & ~(kAlign - 1);
  const uint32_t kv_s = q_s + ROWS * 256;
  int* lim_s = reinterpret_cast<int*>(pf_smem + (q_s - (uint32_t)__cvta_generic_to_shared(pf_smem)) + ROWS * 256 +
                                      S * kPfStageBytes);
  int* wlim_s = lim_s + ROWS;  // [NW][2]: a warp's smallest and largest lim
  int* flag_s = wlim_s + 2 * NW;

  // A tile's cache groups (pf_tile_group), loaded one tile ahead of its use.
  auto tile_groups = [&](int j) { return pf_tile_group(bt, k_begin, k_end, bs, n_kv, kvh, j, lane); };
  // Tile j into stage `stage`; gj: tile_groups(j).
  auto issue = [&](int j, int stage, int gj) {
    pf_copy_tile<NT, WG>(kc, vc, k_begin + kPfBN * j, k_end, kv_s + stage * kPfStageBytes, gj, tid);
  };

  // F8: tile j is loaded into registers during tile j-1 and widened into
  // stage j % 2 at the top of iteration j (that stage was last read at j-2).
  PfF8Raw raw;
  if constexpr (F8) {
    if (n_tiles > 0) pf_f8_load(a, k_begin, k_end, tile_groups(0), tid, raw);
  } else {
#pragma unroll
    for (int s = 0; s < S - 1; ++s) {  // tiles 0 .. S-2
      if (s < n_tiles) issue(s, s, tile_groups(s));
      asm volatile("cp.async.commit_group;" ::: "memory");
    }
  }
  int gnext = tile_groups(S - 1);  // the next tile to issue

  pf_load_q<ROWS, WG>(a, it, kvh, G, q_s, tid, NT);

  pf_row_limits<MT>(a, it, G, warp, lim_s, wlim_s);

  // ldmatrix lane addresses. Q (A, no trans): matrix mi = lane/8 is rows
  // 8*(mi&1).., chunk 2kk + mi/2 -> a0..a3. K (B, no trans): matrix mi is keys
  // 8*(mi/2).., chunk 2kk + (mi&1) -> b0/b1 of n-tiles 2np, 2np+1. V (B,
  // trans): matrix mi is keys 8*(mi&1).., chunk 2nd2 + mi/2 -> b0/b1 of dim
  // n-tiles 2nd2, 2nd2+1. Physical chunk = chunk ^ (row & 7) = chunk ^ (lane & 7)
  // = 2kk ^ x with x = (chunk & 1) ^ (lane & 7) < 8, so the byte address is
  // base(row) + (x << 4) XOR (kk << 5): bits 4..7 of base(row) are zero (rows
  // of 256 bytes from a 256-byte aligned base), one XOR per step.
  const uint32_t q_a = q_s + (uint32_t)((warp * WROWS + (lane & 15)) * 256) + (((lane >> 4) ^ (lane & 7)) << 4);
  const uint32_t k_a = (uint32_t)((((lane >> 4) << 3) + (lane & 7)) * 256) + ((((lane >> 3) & 1) ^ (lane & 7)) << 4);
  const uint32_t v_a =
      (uint32_t)(((((lane >> 3) & 1) << 3) + (lane & 7)) * 256 + kPfTileBytes) + (((lane >> 4) ^ (lane & 7)) << 4);

  float o[MT][16][4];
  float m_r[MT][2], l_r[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int nd = 0; nd < 16; ++nd) o[mt][nd][0] = o[mt][nd][1] = o[mt][nd][2] = o[mt][nd][3] = 0.f;
    m_r[mt][0] = m_r[mt][1] = -INFINITY;
    l_r[mt][0] = l_r[mt][1] = 0.f;
  }

  for (int j = 0; j < n_tiles; ++j) {
    if constexpr (F8) pf_f8_store(raw, kv_s + (j % S) * kPfStageBytes, tid);
    cp_async_wait<S - 2>();  // tile j has landed (this thread's copies)
#if defined(GLMK_HAS_WGMMA)
    if constexpr (WG) fence_proxy_async();  // the copies (and Q) are read next by the tensor cores
#endif
    __syncthreads();         // ... and every thread's (and Q); stage (j-1) % S is free
    if constexpr (F8) {
      if (j + 1 < n_tiles) {
        pf_f8_load(a, k_begin + kPfBN * (j + 1), k_end, gnext, tid, raw);
        gnext = tile_groups(j + 2);
      }
    } else {
      const int jn = j + S - 1;
      if (jn < n_tiles) {
        issue(jn, jn % S, gnext);
        gnext = tile_groups(jn + 1);
      }
      asm volatile("cp.async.commit_group;" ::: "memory");
    }
    const uint32_t kb = kv_s + (j % S) * kPfStageBytes;  // 256-byte aligned
    const int key0 = k_begin + kPfBN * j;
    // S = Q K^T. Thread holds keys 8nt + 2t, +1 of rows g ([0], [1]) and g+8 ([2], [3]).
    float sc[MT][8][4];
    if constexpr (WG) {
      // Every key of the tile past every row of this warpgroup (uniform over its warps).
      const int* wl = wlim_s + 2 * (warp & ~3);
      if (key0 >= max(max(wl[1], wl[3]), max(wl[5], wl[7]))) continue;
#if defined(GLMK_HAS_WGMMA)
      const uint32_t qw = q_s + (warp >> 2) * 64 * 128;  // the warpgroup's 64 rows
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 8; ++kk)
        wgmma_m64n64k16_bf16_ss(sc[0], wgmma_desc(qw + (kk >> 2) * ROWS * 128 + (kk & 3) * 32),
                                wgmma_desc(kb + (kk >> 2) * kPfBN * 128 + (kk & 3) * 32), kk);
      wgmma_commit();
      wgmma_wait<0>();
#endif
    } else {
    if (key0 >= wlim_s[2 * warp + 1]) continue;  // every key of the tile is past every row of this warp
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) sc[mt][nt][0] = sc[mt][nt][1] = sc[mt][nt][2] = sc[mt][nt][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      uint32_t qa[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        ldsm_x4((q_a ^ (uint32_t)(kk << 5)) + mt * 16 * 256, qa[mt][0], qa[mt][1], qa[mt][2], qa[mt][3]);
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t b0, b1, b2, b3;
        ldsm_x4(((kb + k_a) ^ (uint32_t)(kk << 5)) + np * 16 * 256, b0, b1, b2, b3);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_bf16_16816(sc[mt][2 * np], qa[mt], b0, b1);
          mma_bf16_16816(sc[mt][2 * np + 1], qa[mt], b2, b3);
        }
      }
    }
    }
    if (key0 + kPfBN > wlim_s[2 * warp]) {  // some key of the tile is past some row: causal mask (and k_end)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int lim = lim_s[warp * WROWS + mt * 16 + h * 8 + g] - key0 - 2 * t;  // visible: 8nt + e' < lim
#pragma unroll
          for (int nt = 0; nt < 8; ++nt) {
            if (nt * 8 >= lim) sc[mt][nt][2 * h] = -INFINITY;
            if (nt * 8 + 1 >= lim) sc[mt][nt][2 * h + 1] = -INFINITY;
          }
        }
    }
    // Online softmax per row (the 4 threads of a quad share a row).
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) mx = fmaxf(mx, fmaxf(sc[mt][nt][2 * h], sc[mt][nt][2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float mn = fmaxf(m_r[mt][h], mx);
        const float mu = mn == -INFINITY ? 0.f : mn;  // a row with no visible key yet: p = 0
        const float al = ex2(m_r[mt][h] - mu);        // 0 while m was -inf
        m_r[mt][h] = mn;
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          const float p0 = ex2(sc[mt][nt][2 * h] - mu), p1 = ex2(sc[mt][nt][2 * h + 1] - mu);
          sc[mt][nt][2 * h] = p0;
          sc[mt][nt][2 * h + 1] = p1;
          sum += p0 + p1;
        }
        l_r[mt][h] = l_r[mt][h] * al + sum;
#pragma unroll
        for (int nd = 0; nd < 16; ++nd) {
          o[mt][nd][2 * h] *= al;
          o[mt][nd][2 * h + 1] *= al;
        }
      }
    }
    // O += P V: P (C layout of S) is the A fragment directly.
    if constexpr (WG) {
#if defined(GLMK_HAS_WGMMA)
      uint32_t pa[4][4];
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        pa[kk][0] = pack_bf16(sc[0][2 * kk][0], sc[0][2 * kk][1]);
        pa[kk][1] = pack_bf16(sc[0][2 * kk][2], sc[0][2 * kk][3]);
        pa[kk][2] = pack_bf16(sc[0][2 * kk + 1][0], sc[0][2 * kk + 1][1]);
        pa[kk][3] = pack_bf16(sc[0][2 * kk + 1][2], sc[0][2 * kk + 1][3]);
      }
      wgmma_fence();  // O was rescaled by the softmax
      // V tile half h (dims 64h..) is [64 keys][128 bytes]: MN-major with the
      // two 64-dim atoms kPfBN * 128 bytes apart; k step kk = keys 16kk.. =
      // two 8-key groups of 1024 bytes.
      if constexpr (F8) {  // V transposed, [128 dims][64 keys]: K-major, k step kk = bytes 32kk..
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) wgmma_m64n128k16_bf16_rs(o[0], pa[kk], wgmma_desc(kb + kPfTileBytes + kk * 32));
      } else {
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
          wgmma_m64n128k16_bf16_rs_tb(o[0], pa[kk], wgmma_desc_mn(kb + kPfTileBytes + kk * 2048, kPfBN * 128));
      }
      wgmma_commit();
      wgmma_wait<0>();
#endif
    } else {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      uint32_t pa[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        pa[mt][0] = pack_bf16(sc[mt][2 * kk][0], sc[mt][2 * kk][1]);
        pa[mt][1] = pack_bf16(sc[mt][2 * kk][2], sc[mt][2 * kk][3]);
        pa[mt][2] = pack_bf16(sc[mt][2 * kk + 1][0], sc[mt][2 * kk + 1][1]);
        pa[mt][3] = pack_bf16(sc[mt][2 * kk + 1][2], sc[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int nd2 = 0; nd2 < 8; ++nd2) {
        uint32_t b0, b1, b2, b3;
        ldsm_x4_trans(((kb + v_a) ^ (uint32_t)(nd2 << 5)) + kk * 16 * 256, b0, b1, b2, b3);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_bf16_16816(o[mt][2 * nd2], pa[mt], b0, b1);
          mma_bf16_16816(o[mt][2 * nd2 + 1], pa[mt], b2, b3);
        }
      }
    }
    }
  }
  cp_async_wait<0>();
  // The item's output fields, read again (registers are short in the loop).
  const PrefillItem ie = ld_item(a.items + blockIdx.x);

#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l_r[mt][h] += __shfl_xor_sync(0xffffffffu, l_r[mt][h], 1);
      l_r[mt][h] += __shfl_xor_sync(0xffffffffu, l_r[mt][h], 2);
    }

  if (ie.n_splits <= 1) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int rr = warp * WROWS + mt * 16 + h * 8 + g;
        if (rr < ie.n_rows) pf_store_half(pf_out_row(a, ie, kvh, G, rr), o[mt], h, t, l_r[mt][h]);
      }
    return;
  }

  // ---- a piece of a split item: publish the partial, the last piece merges.
  float* slots = reinterpret_cast<float*>(static_cast<char*>(a.workspace) + kPfCounterBytes);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int rr = warp * WROWS + mt * 16 + h * 8 + g;
      if (rr < ie.n_rows)
        pf_publish_half(slots + (((int64_t)ie.part * n_kv + kvh) * ROWS + rr) * kPfSlotFloats, o[mt], h, t,
                        m_r[mt][h], l_r[mt][h]);
    }
  if (!cta_arrive_last(static_cast<int*>(a.workspace) + ie.counter * n_kv + kvh, ie.n_splits, true, flag_s))
    return;
  pf_merge<ROWS>(a, ie, kvh, G, slots, tid, NT);
}

// The warp-specialized form of the wgmma kernel for 128-row items (sm_90a;
// FlashAttention-3's structure): one CTA an SM of three warpgroups. Warpgroup
// 0 copies the K/V tiles (cp.async, the same swizzled layout and zero fill)
// into an S-stage ring with full / empty mbarriers; warpgroups 1 and 2 own 64
// rows each and run unsynchronised with each other. Each consumer overlaps
// tile j's O += P V with tile j+1's S = Q K^T and softmax: S(j+1) and PV(j)
// are issued back to back, the softmax of S(j+1) runs while PV(j) is in
// flight (wait_group 1), and O is rescaled once PV(j) has landed. The same
// masks, online softmax (operation for operation), output and split merge as
// prefill_attn_kernel<1, 8, S, true>.
template <int S, bool F8>
__global__ void __launch_bounds__(384, 1) prefill_attn_ws_kernel(PrefillAttnArgs a) {
#if defined(GLMK_HAS_WGMMA)
  constexpr int ROWS = 128, NT = 384, PT = 128;  // rows, threads, producer threads
  extern __shared__ __align__(1024) unsigned char pf_smem[];

  const PrefillItem it = a.items[blockIdx.x];
  const int kvh = blockIdx.y;
  // wg through a shuffle: ptxas then knows it is warp-uniform, so the role
  // branch and everything a consumer derives from wg and the tile index (the
  // stages' addresses, the wgmma descriptors) live in uniform registers
  // instead of being rebuilt in vector registers and moved over (R2UR) for
  // every wgmma of every tile.
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wg = __shfl_sync(0xffffffffu, warp >> 2, 0);
  const int g = lane >> 2, t = lane & 3;
  const int n_kv = a.n_kv_heads;
  const int G = a.n_q_heads / n_kv;
  const int bs = a.block_size;
  const int k_begin = it.k_begin, k_end = it.k_end;
  const int n_tiles = (k_end - k_begin + kPfBN - 1) / kPfBN;
  // Shared memory: Q [ROWS][256 B] | S x [K 16 KB | V 16 KB] | lim[ROWS] |
  // wlim[8][2] | flag | full[S], empty[S] (8-byte aligned), 1024-aligned base.
  const uint32_t base = (uint32_t)__cvta_generic_to_shared(pf_smem);
  const uint32_t q_s = (base + 1023u) & ~1023u;
  const uint32_t kv_s = q_s + ROWS * 256;
  unsigned char* const gen = pf_smem + (q_s - base);
  int* lim_s = reinterpret_cast<int*>(gen + ROWS * 256 + S * kPfStageBytes);
  int* wlim_s = lim_s + ROWS;  // [8 consumer warps][2]
  int* flag_s = wlim_s + 16;
  const uint32_t bar_full = (q_s + ROWS * 256 + S * kPfStageBytes + ROWS * 4 + 16 * 4 + 4 + 7u) & ~7u;
  const uint32_t bar_empty = bar_full + 8 * S;
  if (tid == 0) {
    for (int i = 0; i < S; ++i) {
      mbar_init(bar_full + 8 * i, PT);  // the producers' cp.async arrivals
      mbar_init(bar_empty + 8 * i, 8);  // one per consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }

  pf_load_q<ROWS, true>(a, it, kvh, G, q_s, tid, NT);  // by every thread
  if (wg > 0) pf_row_limits<1>(a, it, G, warp - 4, lim_s, wlim_s);  // consumer warp cw = warp - 4: rows 16 cw ..
  fence_proxy_async();  // Q is read by the tensor cores
  __syncthreads();

  float o[16][4];
  float m_r[2], l_r[2];
  if (wg == 0) {
    // ---- producer: tile j into stage j % S once every consumer warp freed it.
    const int* bt = a.block_tables + a.seq_bt_offset[it.seq];
    auto tile_groups = [&](int j) { return pf_tile_group(bt, k_begin, k_end, bs, n_kv, kvh, j, lane); };
    int gj = tile_groups(0);
    if constexpr (F8) {
      // The FP8 cache: the codes of tiles j + 1 and j + 2 are in registers
      // (or on their way) while tile j is widened into its stage by plain
      // stores (pf_f8_store), made visible to the tensor cores and its stage
      // arrived at; then tile j + 2's loads are issued into j's registers.
      // (One tile ahead, the widening waited on each tile's loads. H200,
      // 2026-11-29, TTFT on the FP8 cache, ms: 32k 1,605 -> 1,491, 8k 210 ->
      // 206, 2k 52.5 -> 52.0; the BF16 cache's 1,265 / 191 / 50.0.)
      PfF8Raw r0, r1;
      if (n_tiles > 0) pf_f8_load(a, k_begin, k_end, gj, tid, r0);
      if (n_tiles > 1) pf_f8_load(a, k_begin + kPfBN, k_end, tile_groups(1), tid, r1);
      auto produce = [&](int j, PfF8Raw& r) {
        const int stage = j % S;
        const int g2 = j + 2 < n_tiles ? tile_groups(j + 2) : 0;
        mbar_wait(bar_empty + 8 * stage, ((j / S) & 1) ^ 1);
        pf_f8_store(r, kv_s + stage * kPfStageBytes, tid);
        fence_proxy_async();
        mbar_arrive(bar_full + 8 * stage);
        if (j + 2 < n_tiles) pf_f8_load(a, k_begin + kPfBN * (j + 2), k_end, g2, tid, r);
      };
      for (int j = 0; j < n_tiles; j += 2) {
        produce(j, r0);
        if (j + 1 < n_tiles) produce(j + 1, r1);
      }
    } else {
      for (int j = 0; j < n_tiles; ++j) {
        const int stage = j % S;
        mbar_wait(bar_empty + 8 * stage, ((j / S) & 1) ^ 1);
        pf_copy_tile_ws(a.k_cache, a.v_cache, k_begin + kPfBN * j, k_end, kv_s + stage * kPfStageBytes, gj, tid);
        cp_async_mbar_arrive(bar_full + 8 * stage);
        if (j + 1 < n_tiles) gj = tile_groups(j + 1);
      }
      cp_async_wait<0>();
    }
  } else {
    // ---- consumers: warpgroup wg - 1 owns rows 64 (wg - 1) ..
    const int cw = warp - 4;
    const uint32_t qw = q_s + (wg - 1) * 64 * 128;
    const int* wl = wlim_s + 8 * (wg - 1);
    const int wg_hi = max(max(wl[1], wl[3]), max(wl[5], wl[7]));
    // Tiles with some key before some row's limit: [0, n_eff); the rest only freed.
    // (Broadcast from lane 0: the same in every lane, and so known uniform.)
    const int n_eff = __shfl_sync(0xffffffffu, min(n_tiles, max(0, (wg_hi - k_begin + kPfBN - 1) / kPfBN)), 0);
#pragma unroll
    for (int nd = 0; nd < 16; ++nd) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.f;
    m_r[0] = m_r[1] = -INFINITY;
    l_r[0] = l_r[1] = 0.f;
    float sc[8][4];
    uint32_t pa[4][4];
    auto wait_tile = [&](int j) {
      mbar_wait(bar_full + 8 * (j % S), (j / S) & 1);
      fence_proxy_async();  // copied by cp.async (generic proxy), read by the tensor cores
    };
    // (Predicated, not a branch: ptxas serializes wgmma chains across a
    // divergent path, C7520.)
    auto release = [&](int j) {
      __syncwarp();
      mbar_arrive_if(bar_empty + 8 * (j % S), lane == 0);
    };
    // Descriptors: each k-step's is its tile's first plus the step's byte
    // offset / 16 (the address field is the low 14 bits of addr / 16, and no
    // shared address carries out of it), so a tile builds one per operand.
    const uint64_t dq = wgmma_desc(qw);
    auto issue_s = [&](int j) {
      const uint64_t dk = wgmma_desc(kv_s + (j % S) * kPfStageBytes);
#pragma unroll
      for (int kk = 0; kk < 8; ++kk)
        wgmma_m64n64k16_bf16_ss(sc, dq + (((kk >> 2) * ROWS * 128 + (kk & 3) * 32) >> 4),
                                dk + (((kk >> 2) * kPfBN * 128 + (kk & 3) * 32) >> 4), kk);
      wgmma_commit();
    };
    auto issue_pv = [&](int j) {
      const uint32_t vb = kv_s + (j % S) * kPfStageBytes + kPfTileBytes;
      if constexpr (F8) {  // V transposed (pf_f8_store): K-major
        const uint64_t dv = wgmma_desc(vb);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) wgmma_m64n128k16_bf16_rs(o, pa[kk], dv + ((kk * 32) >> 4));
      } else {
        const uint64_t dv = wgmma_desc_mn(vb, kPfBN * 128);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) wgmma_m64n128k16_bf16_rs_tb(o, pa[kk], dv + ((kk * 2048) >> 4));
      }
      wgmma_commit();
    };
    // Mask and softmax of tile j's S (in sc): p in sc, m updated; returns
    // through al / sum what O and l need once PV(j - 1) has landed. With
    // `mask` true, the causal mask (and k_end) as selects (no branch while
    // PV(j - 1) is in flight); tiles before every row's limit take the form
    // without it (TTFT 32k -1.5%).
    auto softmax = [&](auto mask, int j, float (&al)[2], float (&sum)[2]) {
      if constexpr (decltype(mask)::value) {
        const int key0 = k_begin + kPfBN * j;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int lim = lim_s[cw * 16 + h * 8 + g] - key0 - 2 * t;
#pragma unroll
          for (int nt = 0; nt < 8; ++nt) {
            sc[nt][2 * h] = nt * 8 >= lim ? -INFINITY : sc[nt][2 * h];
            sc[nt][2 * h + 1] = nt * 8 + 1 >= lim ? -INFINITY : sc[nt][2 * h + 1];
          }
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) mx = fmaxf(mx, fmaxf(sc[nt][2 * h], sc[nt][2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float mn = fmaxf(m_r[h], mx);
        const float mu = mn == -INFINITY ? 0.f : mn;
        al[h] = ex2(m_r[h] - mu);
        m_r[h] = mn;
        float sm = 0.f;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          const float p0 = ex2(sc[nt][2 * h] - mu), p1 = ex2(sc[nt][2 * h + 1] - mu);
          sc[nt][2 * h] = p0;
          sc[nt][2 * h + 1] = p1;
          sm += p0 + p1;
        }
        sum[h] = sm;
      }
    };
    auto pack_p = [&]() {
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        pa[kk][0] = pack_bf16(sc[2 * kk][0], sc[2 * kk][1]);
        pa[kk][1] = pack_bf16(sc[2 * kk][2], sc[2 * kk][3]);
        pa[kk][2] = pack_bf16(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
        pa[kk][3] = pack_bf16(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
      }
    };
    // O is rescaled only where some row of the warp has a new maximum (al <
    // 1): past a row's first tiles its maximum seldom moves, and skipping a
    // multiplication by exactly 1 changes no bit.
    auto rescale = [&](const float (&al)[2], const float (&sum)[2]) {
#pragma unroll
      for (int h = 0; h < 2; ++h) l_r[h] = l_r[h] * al[h] + sum[h];
      if (__any_sync(0xffffffffu, al[0] != 1.f || al[1] != 1.f)) {
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int nd = 0; nd < 16; ++nd) {
            o[nd][2 * h] *= al[h];
            o[nd][2 * h + 1] *= al[h];
          }
      }
    };
    // Tiles [0, n_full): every key before every row's limit (no mask).
    const int wg_lo = min(min(wl[0], wl[2]), min(wl[4], wl[6]));
    const int n_full = __shfl_sync(0xffffffffu, min(n_eff, max(0, (wg_lo - k_begin) / kPfBN)), 0);
    const std::true_type masked;
    const std::false_type unmasked;
    if (n_eff > 0) {
      wait_tile(0);
      wgmma_fence();
      issue_s(0);
      wgmma_wait<0>();
      float al[2], sum[2];
      if (n_full > 0) softmax(unmasked, 0, al, sum);
      else softmax(masked, 0, al, sum);
      rescale(al, sum);
      pack_p();
    }
    auto step = [&](auto mask, int j) {
      wait_tile(j + 1);
      wgmma_fence();  // sc, pa and O were written by other instructions
      issue_s(j + 1);
      issue_pv(j);
      wgmma_wait<1>();  // S(j + 1); PV(j) may still run
      float al[2], sum[2];
      softmax(mask, j + 1, al, sum);
      wgmma_wait<0>();  // PV(j): O and pa free
      release(j);
      rescale(al, sum);
      pack_p();
    };
    int jt = 0;
    for (; jt + 1 < n_full; ++jt) step(unmasked, jt);
    for (; jt + 1 < n_eff; ++jt) step(masked, jt);
    if (n_eff > 0) {
      wgmma_fence();
      issue_pv(n_eff - 1);
      wgmma_wait<0>();
      release(n_eff - 1);
    }
    for (int j = n_eff; j < n_tiles; ++j) {  // past every row of the warpgroup: freed unread
      mbar_wait(bar_full + 8 * (j % S), (j / S) & 1);
      release(j);
    }
  }

  // The item's output fields, read again (registers are short in the loop).
  const PrefillItem ie = ld_item(a.items + blockIdx.x);
  if (wg > 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l_r[h] += __shfl_xor_sync(0xffffffffu, l_r[h], 1);
      l_r[h] += __shfl_xor_sync(0xffffffffu, l_r[h], 2);
    }
  }
  const int cw = warp - 4;
  if (ie.n_splits <= 1) {
    if (wg == 0) return;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int rr = cw * 16 + h * 8 + g;
      if (rr < ie.n_rows) pf_store_half(pf_out_row(a, ie, kvh, G, rr), o, h, t, l_r[h]);
    }
    return;
  }

  // ---- a piece of a split item: publish the partial, the last piece merges.
  float* slots = reinterpret_cast<float*>(static_cast<char*>(a.workspace) + kPfCounterBytes);
  if (wg > 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int rr = cw * 16 + h * 8 + g;
      if (rr < ie.n_rows)
        pf_publish_half(slots + (((int64_t)ie.part * n_kv + kvh) * ROWS + rr) * kPfSlotFloats, o, h, t, m_r[h],
                        l_r[h]);
    }
  }
  if (!cta_arrive_last(static_cast<int*>(a.workspace) + ie.counter * n_kv + kvh, ie.n_splits, true, flag_s))
    return;
  pf_merge<ROWS>(a, ie, kvh, G, slots, tid, NT);
#else
  __trap();  // launched only on sm_90 (attention_prefill)
#endif
}

template <int S, bool F8 = false>
cudaError_t pf_ws_launch(const PrefillAttnArgs& a, cudaStream_t st) {
  constexpr int smem = 1024 + 128 * 256 + S * kPfStageBytes + 128 * 4 + 16 * 4 + 4 + 8 + 16 * S;
  static std::atomic<unsigned long long> done{0};
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  const unsigned long long bit = dev < 64 ? 1ull << dev : 0;
  if (!bit || !(done.load(std::memory_order_relaxed) & bit)) {
    e = cudaFuncSetAttribute(prefill_attn_ws_kernel<S, F8>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
    done.fetch_or(bit, std::memory_order_relaxed);
  }
  prefill_attn_ws_kernel<S, F8><<<dim3(a.n_items, a.n_kv_heads), 384, smem, st>>>(a);
  return cudaGetLastError();
}

// cudaFuncSetAttribute once per device and kernel instantiation.
template <int MT, int NW, int S, bool WG, bool F8>
cudaError_t pf_prepare(int smem) {
  static std::atomic<unsigned long long> done{0};
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  const unsigned long long bit = dev < 64 ? 1ull << dev : 0;
  if (bit && (done.load(std::memory_order_relaxed) & bit)) return cudaSuccess;
  e = cudaFuncSetAttribute(prefill_attn_kernel<MT, NW, S, WG, F8>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  e = cudaFuncSetAttribute(prefill_attn_kernel<MT, NW, S, WG, F8>, cudaFuncAttributePreferredSharedMemoryCarveout,
                           (int)cudaSharedmemCarveoutMaxShared);
  if (e != cudaSuccess) return e;
  done.fetch_or(bit, std::memory_order_relaxed);
  return cudaSuccess;
}

template <int MT, int NW, int S, bool WG = false, bool F8 = false>
cudaError_t pf_launch(const PrefillAttnArgs& a, cudaStream_t st) {
  constexpr int rows = 16 * MT * NW;
  // The kernel's layout (WG: a 1024-byte aligned base).
  constexpr int smem = (WG ? 1024 : 256) + rows * 256 + S * kPfStageBytes + rows * 4 + 2 * NW * 4 + 16;
  cudaError_t e = pf_prepare<MT, NW, S, WG, F8>(smem);
  if (e != cudaSuccess) return e;
  prefill_attn_kernel<MT, NW, S, WG, F8><<<dim3(a.n_items, a.n_kv_heads), NW * 32, smem, st>>>(a);
  return cudaGetLastError();
}

}  // namespace

bool attention_prefill_supported(int n_q_heads, int n_kv_heads, int block_size) {
  return n_kv_heads > 0 && n_kv_heads <= 65535 && n_q_heads > 0 && n_q_heads % n_kv_heads == 0 &&
         block_size > 0 && block_size % 16 == 0;
}

int attention_prefill_max_items(int max_tokens, int max_seqs, int G, int max_parts) {
  // Items of >= 64 rows: sum_s ceil(n_q_s G / 64) <= max_tokens G / 64 + n_seqs; each
  // piece of a split adds at most one item.
  const long long n = ((long long)std::max(0, max_tokens) * std::max(1, G) + 63) / 64 + std::max(0, max_seqs) +
                      std::max(0, max_parts);
  return (int)std::min<long long>(n, INT_MAX);
}

size_t attention_prefill_workspace_bytes(int max_parts, int n_kv_heads) {
  if (max_parts <= 0 || n_kv_heads <= 0) return 0;
  return kPfCounterBytes + (size_t)max_parts * n_kv_heads * kPrefillMaxRows * kPfSlotFloats * sizeof(float);
}

bool plan_prefill(const AttnSeqDesc* seqs, int n_seqs, int G, int n_kv_heads, int num_sms, PrefillPlan* plan,
                  const char** why, const int* seq_index) {
  plan->n_items = plan->n_parts = plan->n_merges = 0;
  const PfTuning tu = g_pf_tuning;
  if (G < 1 || n_kv_heads < 1) {
    *why = "prefill attention: bad head counts";
    return false;
  }
  if (num_sms <= 0) num_sms = 132;
  // Auto rows: 64-row items (twice the CTAs, each K/V tile shared by half the
  // rows) when 128-row items would not fill four CTAs per SM (with the
  // warp-specialized kernel: one CTA per SM) and are short (under 64 tiles of
  // keys on average: early prompt chunks, whose causal triangle makes items
  // uneven); 128 otherwise (long key ranges, many items). H200, 2026-11-29,
  // TTFT with the ws kernel's rule at 1 against 4 CTAs an SM: 2,048 tokens
  // 50.8 -> 49.8 ms, 4,096 (two 2k chunks) 109.5 -> 105.5, 1,024 unchanged
  // (at 0.5: 1,024 36.9 -> 37.6).
  int R = plan->rows_in == 64 || plan->rows_in == 128 ? plan->rows_in : tu.rows == 64 ? 64 : 128;
  if (plan->rows_in != 64 && plan->rows_in != 128 && tu.rows != 64 && tu.rows != 128) {
    long long n128 = 0, tiles128 = 0;
    for (int s = 0; s < n_seqs; ++s) {
      const AttnSeqDesc& d = seqs[s];
      if (d.n_q <= 0) continue;
      const long long rows = (long long)d.n_q * G;
      for (long long r0 = 0; r0 < rows; r0 += 128) {
        const long long last = (std::min(rows, r0 + 128) - 1) / G;
        tiles128 += (d.start_pos + last + 1 + kPfBN - 1) / kPfBN;
        ++n128;
      }
    }
    // With the warp-specialized kernel (sm_90; one CTA an SM) 128-row items
    // win down to one item an SM.
    int dev = 0;
    DeviceInfo di;
    const cudaError_t de = device_info(dev, di);
    if (de != cudaSuccess) (void)cudaGetLastError();  // not left for the caller: the old rule then
    const bool ws = (tu.kernel == 0 || tu.kernel == 3) && de == cudaSuccess && di.major == 9;
    const long long per_sm = ws ? 1 : 4;  // 128-row items an SM below which items are 64 rows
    R = (n128 * n_kv_heads < per_sm * num_sms && tiles128 < 64 * n128) ? 64 : 128;
  }
  plan->rows = R;
  struct Blk {
    int s, row0, n_rows, k_end, tiles, n, part0, counter;
  };
  static thread_local std::vector<Blk> blk;
  static thread_local std::vector<int> order;
  blk.clear();
  double W = 0;  // 64-key tiles of the step, per KV head
  for (int s = 0; s < n_seqs; ++s) {
    const AttnSeqDesc& d = seqs[s];
    if (d.n_q <= 0) continue;
    const long long rows = (long long)d.n_q * G;
    if (rows > INT_MAX / 2 || d.start_pos < 0 || (long long)d.start_pos + d.n_q > INT_MAX / 2) {
      *why = "prefill attention: sequence too long";
      return false;
    }
    for (long long r0 = 0; r0 < rows; r0 += R) {
      const int nr = (int)std::min<long long>(R, rows - r0);
      const int last = (int)((r0 + nr - 1) / G);  // the item's last token
      const int k_end = d.start_pos + last + 1;
      const int tiles = (k_end + kPfBN - 1) / kPfBN;
      blk.push_back(Blk{s, (int)r0, nr, k_end, tiles, 1, 0, 0});
      W += tiles;
    }
  }
  if ((long long)blk.size() > plan->max_items) {
    *why = "prefill attention work items exceed the planned capacity";
    return false;
  }
  // Splits, heaviest items first, while items, slots and counters last.
  float frac = tu.split_frac;
  if (tu.underfill_frac > 0.f && (long long)blk.size() * n_kv_heads < 2LL * num_sms && !blk.empty() &&
      W >= (double)kPfUnderfillMinTiles * blk.size())
    frac = std::min(frac, tu.underfill_frac);
  if (frac > 0.f && plan->max_parts > 1 && !blk.empty()) {
    const double per_sm = W * n_kv_heads / num_sms;
    const int target = std::max(std::max(1, tu.min_split_tiles), (int)std::ceil(frac * per_sm));
    order.resize(blk.size());
    for (size_t i = 0; i < blk.size(); ++i) order[i] = (int)i;
    std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return blk[x].tiles > blk[y].tiles; });
    int spare = plan->max_items - (int)blk.size();
    const int max_merges = kPrefillMaxCounters / n_kv_heads;
    for (int i : order) {
      Blk& b = blk[i];
      int n = (b.tiles + target - 1) / target;
      if (n <= 1) break;  // the rest are lighter
      n = std::min(std::min(n, kPrefillMaxSplits), std::min(spare + 1, plan->max_parts - plan->n_parts));
      if (n <= 1 || plan->n_merges >= max_merges) continue;
      const int per = (b.tiles + n - 1) / n;
      n = (b.tiles + per - 1) / per;  // pieces really made
      if (n <= 1) continue;
      b.n = n;
      b.part0 = plan->n_parts;
      b.counter = plan->n_merges;
      spare -= n - 1;
      plan->n_parts += n;
      ++plan->n_merges;
    }
  }
  PrefillItem* out = plan->items;
  int ni = 0;
  for (const Blk& b : blk) {
    const int seq = seq_index ? seq_index[b.s] : b.s;
    const int qb = seqs[b.s].q_begin;
    if (b.n == 1) {
      out[ni++] = PrefillItem{seq, qb, b.row0, b.n_rows, 0, b.k_end, 1, 0, 0, 0};
      continue;
    }
    const int per = (b.tiles + b.n - 1) / b.n;
    for (int c = 0; c < b.n; ++c)
      out[ni++] = PrefillItem{seq,         qb,   b.row0,           b.n_rows, c * per * kPfBN,
                              std::min(b.k_end, (c + 1) * per * kPfBN), b.n, b.part0 + c, b.part0, b.counter};
  }
  plan->n_items = ni;
  // Heaviest first: the longest key ranges start first and the short ones fill in.
  std::stable_sort(out, out + ni, [](const PrefillItem& x, const PrefillItem& y) {
    return x.k_end - x.k_begin > y.k_end - y.k_begin;
  });
  return true;
}

cudaError_t attention_prefill(const PrefillAttnArgs& a, cudaStream_t st) {
  if (!attention_prefill_supported(a.n_q_heads, a.n_kv_heads, a.block_size)) return cudaErrorInvalidValue;
  if (a.rows != 64 && a.rows != 128) return cudaErrorInvalidValue;
  if (a.n_items < 0 || a.n_parts < 0) return cudaErrorInvalidValue;
  if (a.n_items == 0) return cudaSuccess;
  const bool f8 = a.k_cache8 != nullptr;
  if (f8 ? (!a.v_cache8 || !a.k_scale || !a.v_scale || a.k_cache || a.v_cache || a.block_size != kKvFp8BlockSize)
         : (!a.k_cache || !a.v_cache))
    return cudaErrorInvalidValue;
  if (!a.q || !a.positions || !a.seq_bt_offset || !a.block_tables || !a.items || !a.out) return cudaErrorInvalidValue;
  if (a.n_parts > 0 && !a.workspace) return cudaErrorInvalidValue;
  int dev = 0;
  DeviceInfo di;
  const cudaError_t e = device_info(dev, di);
  if (e != cudaSuccess) return e;
  // The FP8 cache (sm_90): tiles widened to BF16 in shared memory, 128-row
  // items on the warp-specialized kernel (its producer warpgroup widens),
  // 64-row items on the wgmma kernel (two stages, a tile's codes loaded into
  // registers one tile ahead).
  if (f8) {
    if (di.major != 9) return cudaErrorInvalidValue;
    return a.rows == 128 ? pf_ws_launch<3, true>(a, st) : pf_launch<1, 4, 2, true, true>(a, st);
  }
  // The mma.sync and wgmma kernels' K/V ring (the ws kernel: its own): the
  // hook's 2 or 3, by default 3 for the wgmma kernel's 64-row items on sm_90
  // (short prompts: H200, 2026-11-29, launches timed back to back, a 1,024-token
  // prompt 0.0264 -> 0.0243 ms, 512 0.0148 -> 0.0146), else 2.
  const bool wgmma64 = di.major == 9 && a.rows == 64 && (g_pf_tuning.kernel == 0 || g_pf_tuning.kernel >= 2);
  const int stages = g_pf_tuning.stages >= 3 ? 3 : g_pf_tuning.stages == 2 ? 2 : wgmma64 ? 3 : 2;
  const int kernel = g_pf_tuning.kernel;
  if (kernel == 2 && di.major != 9) return cudaErrorInvalidValue;  // wgmma: sm_90 only
  if (kernel == 3 && di.major != 9) return cudaErrorInvalidValue;
  // 128-row items on sm_90: the warp-specialized kernel, in 3 stages unless
  // the hook asks for 4 (H200: 3 is faster, docs/perf.md 2026-11-29).
  if ((kernel == 3 || (kernel == 0 && di.major == 9)) && a.rows == 128)
    return g_pf_tuning.stages == 4 ? pf_ws_launch<4>(a, st) : pf_ws_launch<3>(a, st);
  if (kernel >= 2 || (kernel == 0 && di.major == 9)) {
    // Two warpgroups for 128-row items, one for 64-row ones.
    if (a.rows == 128) return stages == 3 ? pf_launch<1, 8, 3, true>(a, st) : pf_launch<1, 8, 2, true>(a, st);
    return stages == 3 ? pf_launch<1, 4, 3, true>(a, st) : pf_launch<1, 4, 2, true>(a, st);
  }
  if (a.rows == 128) return stages == 3 ? pf_launch<2, 4, 3>(a, st) : pf_launch<2, 4, 2>(a, st);
  return stages == 3 ? pf_launch<1, 4, 3>(a, st) : pf_launch<1, 4, 2>(a, st);
}

// Test / bench hook (not in kernels.h; attn_check declares it): the knobs of
// plan_prefill / attention_prefill. Not thread-safe; the runtime never calls it.
struct PrefillAttnTuning {
  int rows, stages, min_split_tiles;
  float split_frac;
  int kernel;            // 0 auto (wgmma on sm_90), 1 mma.sync, 2 wgmma
  float underfill_frac;  // PfTuning::underfill_frac (0: off)
};
void prefill_attention_get_tuning(PrefillAttnTuning* t) {
  *t = {g_pf_tuning.rows,   g_pf_tuning.stages, g_pf_tuning.min_split_tiles, g_pf_tuning.split_frac,
        g_pf_tuning.kernel, g_pf_tuning.underfill_frac};
}
void prefill_attention_set_tuning(const PrefillAttnTuning* t) {
  if (!t) {
    g_pf_tuning = PfTuning{};
    return;
  }
  g_pf_tuning.rows = t->rows;
  g_pf_tuning.stages = t->stages;
  g_pf_tuning.min_split_tiles = t->min_split_tiles;
  g_pf_tuning.split_frac = t->split_frac;
  g_pf_tuning.kernel = t->kernel;
  g_pf_tuning.underfill_frac = t->underfill_frac;
}
// Bytes at the start of every attention_prefill workspace that hold the merge
// counters; all zero between launches.
size_t prefill_attention_counter_bytes() { return kPfCounterBytes; }

}  // namespace glmk
