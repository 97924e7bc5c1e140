// small_check — correctness and speed of the small decode kernels of
// cuda/kernels (norm_rope.cu, moe.cu, quant.cu, embed.cu, speculative.cu):
// add_rmsnorm, qk_norm_rope_kv_write, router_topk / router_fused /
// router_logits_normed / moe_align,
// moe_combine, quant_rows_fp8, silu_mul_quant_fp8, embed_gather,
// spec_chain_rows.
//
//   small_check [--seed N] [--bench] [--bench-only] [--bench-norm-router] [--bench-norm-rows]
//
// Correctness: fresh random inputs, outputs poisoned before each run and checked
// fully written (and, where a kernel must not write, untouched); float64 CPU
// references; the kernels that must give the same results as before this
// rewrite are compared bit for bit with verbatim copies of the previous
// kernels (namespace prev below), and add_rmsnorm with a CPU emulation of its
// float formula. Prints one row per check and "small_check: N checks, M failed";
// exits non-zero on any failure.
//
// --bench: each kernel at full GLM-4.7 decode shapes (one GPU of 8: hidden
// 5120, 12 q + 1 kv heads, 20 local experts + shared, intermediate 1536) for
// T in {1, 4, 16, 64, 256}: microseconds per call from 20 calls captured in one
// CUDA graph, median of 11 replays after warm-up; the previous kernel beside the
// new one, and for the router the fused launch beside cuBLAS SGEMM +
// router_topk + moe_align, for E = 20 and E = 160 at T in {1, 4, 16, 64, 128,
// 256}: the fused router's last-CTA form (the kernel before clusters, on its
// own plan), its cluster form (clusters up to the device's limit, and capped
// at the portable 8) and which form router_fused picks by default.
#include <cublas_v2.h>

#include <memory>
#include <numeric>

#include "common.cuh"
#include "kernels.h"

#define CHECK_NAME_W 26
#define CHECK_DETAIL_W 58
#include "check.cuh"

namespace glmk {
// Test / bench hooks defined in moe.cu (not part of kernels.h): the form of
// router_fused (path 0 auto, 1 the cluster form only, 2 the last-CTA form on
// the cluster form's plan, 3 the last-CTA form on its own plan) and the launch
// it makes.
struct RouterFusedTuning {
  int path, max_cluster;
};
void router_fused_get_tuning(RouterFusedTuning* t);
void router_fused_set_tuning(const RouterFusedTuning* t);
struct RouterFusedPlan {
  int cluster, n_tt, n_et, n_ks, kw, grid;
};
cudaError_t router_fused_plan(int T, int E, int H, RouterFusedPlan* p);
// router_logits_normed's FMA kernel at every H (true) or the default (false).
void router_logits_normed_force_fma(bool on);
// Tokens a CTA of qk_norm_rope_kv_write: 1, 2, 4, 8, or 0 (by T; norm_rope.cu).
void qk_rope_set_tokens_per_cta(int tpc);
// The largest cluster add_rmsnorm_router's plan may take (0: the portable 8).
void add_rmsnorm_router_set_cluster(int max_c);
// add_rmsnorm's several-rows-a-CTA kernel (no delta) from this many rows (0: the default).
void add_rmsnorm_set_rows_min(int rows);
}  // namespace glmk

using namespace glmk;

#define CKB(call)                                                                          \
  do {                                                                                     \
    cublasStatus_t s_ = (call);                                                            \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                     \
      fprintf(stderr, "%s:%d: %s: cuBLAS status %d\n", __FILE__, __LINE__, #call, (int)s_); \
      exit(2);                                                                             \
    }                                                                                      \
  } while (0)

// Device buffers of 4-byte ints are poisoned with 0x7f7f7f7f (-1 is a real id).
template <typename T>
struct PoisonByte<T, typename std::enable_if<sizeof(T) == 4 && std::is_integral<T>::value>::type> {
  static constexpr int value = 0x7f;
};
static const int kPoisonInt = 0x7f7f7f7f;

static uint32_t fbits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

// An exact check: passes iff bad == 0.
static void report_exact(const std::string& name, const std::string& detail, size_t bad) {
  report(name, detail, bad ? 1.0 : 0.0, 0.0);
}

// x rounded to BF16 (nearest even), and those values widened back to FP32:
// the inputs of a BF16-row kernel and of its FP32 twin that must match it.
static void round_bf16(const std::vector<float>& x, std::vector<__nv_bfloat16>& b16, std::vector<float>& wide) {
  b16.resize(x.size());
  wide.resize(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    b16[i] = __float2bfloat16_rn(x[i]);
    wide[i] = __bfloat162float(b16[i]);
  }
}

// ------------------------------------------------------------ previous kernels
// Verbatim copies of the kernels as they were before the decode rewrite (the
// launch shapes included), to check the new ones give the same bits and to
// time both.
namespace prev {

constexpr int kNormThreads = 256;

__global__ void add_rmsnorm_kernel(AddNormArgs a) {
  const int i = blockIdx.x;
  const int src = a.row_index ? a.row_index[i] : i;
  __shared__ float scratch[32];
  float* h = a.h + (int64_t)src * a.hidden;
  const float* d = a.delta ? a.delta + (int64_t)src * a.hidden : nullptr;
  float ss = 0.f;
  for (int c = threadIdx.x; c < a.hidden; c += blockDim.x) {
    float v = h[c];
    if (d) {
      v += d[c];
      h[c] = v;
    }
    ss += v * v;
  }
  ss = block_reduce(ss, scratch, SumOp());
  const float r = 1.0f / sqrtf(ss / (float)a.hidden + a.eps);
  float amax = 0.f;
  for (int c = threadIdx.x; c < a.hidden; c += blockDim.x) {
    const float y = a.weight[c] * (h[c] * r);
    if (a.out_f32) a.out_f32[(int64_t)i * a.hidden + c] = y;
    if (a.out_bf16) a.out_bf16[(int64_t)i * a.hidden + c] = __float2bfloat16_rn(y);
    amax = fmaxf(amax, fabsf(y));
  }
  if (!a.out_q) return;
  amax = block_reduce(amax, scratch, MaxOp());
  const float s = fmaxf(amax / kFp8Max, kMinActScale);
  for (int c = threadIdx.x; c < a.hidden; c += blockDim.x) {
    const float y = a.weight[c] * (h[c] * r);
    a.out_q[(int64_t)i * a.hidden + c] = f32_to_e4m3(y / s);
  }
  if (threadIdx.x == 0) a.out_scale[i] = s;
}
static void add_rmsnorm(const AddNormArgs& a, cudaStream_t st) {
  add_rmsnorm_kernel<<<a.rows, kNormThreads, 0, st>>>(a);
  CK(cudaGetLastError());
}

constexpr int kRopeWarps = 8;
__global__ void qk_rope_kernel(QkRopeArgs a) {
  const int t = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n_heads = a.n_q_heads + 2 * a.n_kv_heads;
  const int pos = a.positions[t];
  const int slot = a.slots[t];
  const int blk = slot / a.block_size, off = slot % a.block_size;
  const int half = a.rot_dim / 2;
  const int q4 = half / 4;
  const float* row = a.qkv + (int64_t)t * n_heads * 128;
  for (int hd = warp; hd < n_heads; hd += kRopeWarps) {
    float4 v = reinterpret_cast<const float4*>(row + hd * 128)[lane];
    const bool is_q = hd < a.n_q_heads;
    const bool is_k = !is_q && hd < a.n_q_heads + a.n_kv_heads;
    if (is_q || is_k) {
      const float* w = is_q ? a.q_norm : a.k_norm;
      if (w) {
        float ss = warp_sum(v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w);
        const float r = 1.0f / sqrtf(ss / 128.0f + a.eps);
        const float4 wv = reinterpret_cast<const float4*>(w)[lane];
        v.x = wv.x * (v.x * r);
        v.y = wv.y * (v.y * r);
        v.z = wv.z * (v.z * r);
        v.w = wv.w * (v.w * r);
      }
      int src = lane;
      if (lane < q4) src = lane + q4;
      else if (lane < 2 * q4) src = lane - q4;
      float px = __shfl_sync(0xffffffffu, v.x, src);
      float py = __shfl_sync(0xffffffffu, v.y, src);
      float pz = __shfl_sync(0xffffffffu, v.z, src);
      float pw = __shfl_sync(0xffffffffu, v.w, src);
      if (lane < 2 * q4) {
        const bool first = lane < q4;
        const float sgn = first ? -1.0f : 1.0f;
        float xs[4] = {v.x, v.y, v.z, v.w};
        float ps[4] = {px, py, pz, pw};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int j = lane * 4 + i;
          const float ang = (float)pos * a.inv_freq[j % half];
          float sn, cs;
          sincosf(ang, &sn, &cs);
          xs[i] = xs[i] * cs + sgn * ps[i] * sn;
        }
        v = make_float4(xs[0], xs[1], xs[2], xs[3]);
      }
      if (is_q) {
        reinterpret_cast<float4*>(a.q_out + ((int64_t)t * a.n_q_heads + hd) * 128)[lane] = v;
        continue;
      }
    }
    const int kvh = is_k ? hd - a.n_q_heads : hd - a.n_q_heads - a.n_kv_heads;
    const int64_t elem = (((int64_t)blk * a.n_kv_heads + kvh) * a.block_size + off) * 128 + lane * 4;
    void* cache = is_k ? a.k_cache : a.v_cache;
    if (a.kv_f32) {
      *reinterpret_cast<float4*>(static_cast<float*>(cache) + elem) = v;
    } else {
      __nv_bfloat16* dst = static_cast<__nv_bfloat16*>(cache) + elem;
      reinterpret_cast<__nv_bfloat162*>(dst)[0] = __floats2bfloat162_rn(v.x, v.y);
      reinterpret_cast<__nv_bfloat162*>(dst)[1] = __floats2bfloat162_rn(v.z, v.w);
    }
  }
}
static void qk_rope(const QkRopeArgs& a, cudaStream_t st) {
  qk_rope_kernel<<<a.T, kRopeWarps * 32, 0, st>>>(a);
  CK(cudaGetLastError());
}

constexpr int kThreads = 256;
__global__ void quant_rows_kernel(const float* __restrict__ x, int64_t ldx, int cols,
                                  uint8_t* __restrict__ q, int64_t ldq, float* __restrict__ scale,
                                  const int* __restrict__ rows_dev) {
  const int r = blockIdx.x;
  if (rows_dev && r >= *rows_dev) return;
  __shared__ float scratch[32];
  const float4* xr = reinterpret_cast<const float4*>(x + r * ldx);
  const int n4 = cols / 4;
  float amax = 0.f;
  for (int i = threadIdx.x; i < n4; i += blockDim.x) {
    float4 v = xr[i];
    amax = fmaxf(amax, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
  }
  amax = block_reduce(amax, scratch, MaxOp());
  const float s = fmaxf(amax / kFp8Max, kMinActScale);
  uint32_t* qr = reinterpret_cast<uint32_t*>(q + r * ldq);
  for (int i = threadIdx.x; i < n4; i += blockDim.x) {
    float4 v = xr[i];
    qr[i] = (uint32_t)f32_to_e4m3(v.x / s) | ((uint32_t)f32_to_e4m3(v.y / s) << 8) |
            ((uint32_t)f32_to_e4m3(v.z / s) << 16) | ((uint32_t)f32_to_e4m3(v.w / s) << 24);
  }
  if (threadIdx.x == 0) scale[r] = s;
}
static void quant_rows(const float* x, int64_t ldx, int rows, int cols, uint8_t* q, int64_t ldq,
                       float* scale, const int* rows_dev, cudaStream_t st) {
  quant_rows_kernel<<<rows, kThreads, 0, st>>>(x, ldx, cols, q, ldq, scale, rows_dev);
  CK(cudaGetLastError());
}

__device__ __forceinline__ float silu(float g) { return g / (1.0f + expf(-g)); }
__global__ void silu_mul_quant_kernel(const float* __restrict__ gu, int inter,
                                      uint8_t* __restrict__ q, float* __restrict__ scale,
                                      const int* __restrict__ rows_dev) {
  const int r = blockIdx.x;
  if (rows_dev && r >= *rows_dev) return;
  __shared__ float scratch[32];
  const float4* g4 = reinterpret_cast<const float4*>(gu + (int64_t)r * 2 * inter);
  const float4* u4 = g4 + inter / 4;
  const int n4 = inter / 4;
  float amax = 0.f;
  for (int i = threadIdx.x; i < n4; i += blockDim.x) {
    float4 g = g4[i], u = u4[i];
    float a = silu(g.x) * u.x, b = silu(g.y) * u.y, c = silu(g.z) * u.z, d = silu(g.w) * u.w;
    amax = fmaxf(amax, fmaxf(fmaxf(fabsf(a), fabsf(b)), fmaxf(fabsf(c), fabsf(d))));
  }
  amax = block_reduce(amax, scratch, MaxOp());
  const float s = fmaxf(amax / kFp8Max, kMinActScale);
  uint32_t* qr = reinterpret_cast<uint32_t*>(q + (int64_t)r * inter);
  for (int i = threadIdx.x; i < n4; i += blockDim.x) {
    float4 g = g4[i], u = u4[i];
    float a = silu(g.x) * u.x, b = silu(g.y) * u.y, c = silu(g.z) * u.z, d = silu(g.w) * u.w;
    qr[i] = (uint32_t)f32_to_e4m3(a / s) | ((uint32_t)f32_to_e4m3(b / s) << 8) |
            ((uint32_t)f32_to_e4m3(c / s) << 16) | ((uint32_t)f32_to_e4m3(d / s) << 24);
  }
  if (threadIdx.x == 0) scale[r] = s;
}
static void silu_mul_quant(const float* gu, int rows, int inter, uint8_t* q, float* scale,
                           const int* rows_dev, cudaStream_t st) {
  silu_mul_quant_kernel<<<rows, kThreads, 0, st>>>(gu, inter, q, scale, rows_dev);
  CK(cudaGetLastError());
}

constexpr int kMaxExpertsPerLane = 16;
constexpr int kRouterWarps = 4;
__device__ __forceinline__ bool better(float v, int i, float w, int j) {
  return v > w || (v == w && i < j);
}
__device__ __forceinline__ void warp_argmax(float& v, int& i) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    const int j = __shfl_xor_sync(0xffffffffu, i, o);
    if (better(w, j, v, i)) {
      v = w;
      i = j;
    }
  }
}
__global__ void router_kernel(RouterArgs a) {
  const int lane = threadIdx.x & 31;
  const int t = blockIdx.x * kRouterWarps + (threadIdx.x >> 5);
  if (t >= a.T) return;
  const float* lg = a.logits + (int64_t)t * a.E;
  float sc[kMaxExpertsPerLane], sel[kMaxExpertsPerLane];
#pragma unroll
  for (int j = 0; j < kMaxExpertsPerLane; ++j) {
    const int e = lane + 32 * j;
    sc[j] = 0.f;
    sel[j] = -INFINITY;
    if (e < a.E) {
      sc[j] = 1.0f / (1.0f + expf(-lg[e]));
      sel[j] = sc[j] + a.bias[e];
    }
  }
  if (a.n_group > 1) {
    const int gsz = a.E / a.n_group;
    float gscore = -INFINITY;
    for (int gi = 0; gi < a.n_group; ++gi) {
      float top2 = 0.f;
      int taken = -1;
      for (int pass = 0; pass < 2; ++pass) {
        float v = -INFINITY;
        int idx = 0x7fffffff;
#pragma unroll
        for (int j = 0; j < kMaxExpertsPerLane; ++j) {
          const int e = lane + 32 * j;
          if (e < a.E && e / gsz == gi && e != taken && better(sel[j], e, v, idx)) {
            v = sel[j];
            idx = e;
          }
        }
        warp_argmax(v, idx);
        top2 += v;
        taken = idx;
      }
      if (lane == gi) gscore = top2;
    }
    uint32_t keep = 0;
    for (int k = 0; k < a.topk_group; ++k) {
      float v = (lane < a.n_group && !((keep >> lane) & 1)) ? gscore : -INFINITY;
      int idx = lane < a.n_group ? lane : 0x7fffffff;
      warp_argmax(v, idx);
      keep |= 1u << idx;
    }
#pragma unroll
    for (int j = 0; j < kMaxExpertsPerLane; ++j) {
      const int e = lane + 32 * j;
      if (e < a.E && !((keep >> (e / gsz)) & 1)) sel[j] = -INFINITY;
    }
  }
  uint32_t taken = 0;
  const int slots = a.slots > 0 ? a.slots : a.top_k + (a.shared_local >= 0 ? 1 : 0);
  float wsum = 0.f, my_w = 0.f;
  int my_e = -1;
  for (int k = 0; k < a.top_k; ++k) {
    float v = -INFINITY;
    int idx = 0x7fffffff;
    float s_of = 0.f;
#pragma unroll
    for (int j = 0; j < kMaxExpertsPerLane; ++j) {
      const int e = lane + 32 * j;
      if (e < a.E && !((taken >> j) & 1) && better(sel[j], e, v, idx)) {
        v = sel[j];
        idx = e;
        s_of = sc[j];
      }
    }
    float vb = v;
    int ib = idx;
    warp_argmax(vb, ib);
    if (ib == idx) {
      taken |= 1u << (idx / 32);
    }
    const float w = __shfl_sync(0xffffffffu, s_of, ib & 31);
    wsum += w;
    if (lane == k) {
      my_w = w;
      my_e = ib;
    }
  }
  if (lane < a.top_k) {
    float w = my_w;
    if (a.norm_topk) w = w / (wsum + 1e-20f);
    w *= a.scale;
    const int local = (my_e >= a.expert_begin && my_e < a.expert_begin + a.n_local)
                          ? my_e - a.expert_begin
                          : -1;
    a.ids[(int64_t)t * slots + lane] = local;
    a.w[(int64_t)t * slots + lane] = w;
    if (a.topk_global) a.topk_global[(int64_t)t * a.top_k + lane] = my_e;
  }
  if (lane == 0 && slots > a.top_k) {
    a.ids[(int64_t)t * slots + a.top_k] = a.shared_local;
    a.w[(int64_t)t * slots + a.top_k] = 1.0f;
  }
}
static void router_topk(const RouterArgs& a, cudaStream_t st) {
  router_kernel<<<ceil_div(a.T, kRouterWarps), kRouterWarps * 32, 0, st>>>(a);
  CK(cudaGetLastError());
}

constexpr int kAlignThreads = 1024;
constexpr int kMaxGroups = 1024;
__global__ void align_kernel(const int* __restrict__ ids, int n, int slots, int G,
                             int* __restrict__ offsets, int* __restrict__ sorted_rows,
                             int* __restrict__ inv) {
  __shared__ int cnt[kMaxGroups];
  __shared__ int cur[kMaxGroups];
  for (int i = threadIdx.x; i < G; i += blockDim.x) cnt[i] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int e = ids[i];
    if (e >= 0 && e < G) atomicAdd(&cnt[e], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int run = 0;
    for (int g = 0; g < G; ++g) {
      offsets[g] = run;
      cur[g] = run;
      run += cnt[g];
    }
    offsets[G] = run;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int e = ids[i];
    if (e >= 0 && e < G) {
      const int pos = atomicAdd(&cur[e], 1);
      sorted_rows[pos] = i / slots;
      inv[i] = pos;
    } else {
      inv[i] = -1;
    }
  }
}
static void moe_align(const int* ids, int T, int slots, int n_groups, int* offsets, int* sorted_rows,
                      int* inv, cudaStream_t st) {
  align_kernel<<<1, kAlignThreads, 0, st>>>(ids, T * slots, slots, n_groups, offsets, sorted_rows,
                                            inv);
  CK(cudaGetLastError());
}

__global__ void combine_kernel(const float* __restrict__ y, const int* __restrict__ inv,
                               const float* __restrict__ w, int slots, int H,
                               float* __restrict__ delta) {
  const int t = blockIdx.x;
  const int n4 = H / 4;
  for (int c = threadIdx.x; c < n4; c += blockDim.x) {
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int j = 0; j < slots; ++j) {
      const int p = inv[(int64_t)t * slots + j];
      if (p < 0) continue;
      const float wj = w[(int64_t)t * slots + j];
      const float4 v = reinterpret_cast<const float4*>(y + (int64_t)p * H)[c];
      acc.x += wj * v.x;
      acc.y += wj * v.y;
      acc.z += wj * v.z;
      acc.w += wj * v.w;
    }
    reinterpret_cast<float4*>(delta + (int64_t)t * H)[c] = acc;
  }
}
static void moe_combine(const float* y, const int* inv, const float* w, int T, int slots, int H,
                        float* delta, cudaStream_t st) {
  combine_kernel<<<T, 256, 0, st>>>(y, inv, w, slots, H, delta);
  CK(cudaGetLastError());
}

__global__ void embed_kernel(const __nv_bfloat16* __restrict__ table, const int* __restrict__ ids,
                             int H, float* __restrict__ h) {
  const int t = blockIdx.x;
  const __nv_bfloat162* row = reinterpret_cast<const __nv_bfloat162*>(table + (int64_t)ids[t] * H);
  float2* out = reinterpret_cast<float2*>(h + (int64_t)t * H);
  for (int c = threadIdx.x; c < H / 2; c += blockDim.x) out[c] = __bfloat1622float2(row[c]);
}
static void embed_gather(const __nv_bfloat16* table, const int* ids, int T, int H, float* h,
                         cudaStream_t st) {
  embed_kernel<<<T, 256, 0, st>>>(table, ids, H, h);
  CK(cudaGetLastError());
}

}  // namespace prev

template <typename T>
static size_t count_diff(const std::vector<T>& a, const std::vector<T>& b) {
  size_t n = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) n += memcmp(&a[i], &b[i], sizeof(T)) != 0;
  return n + (a.size() > b.size() ? a.size() - b.size() : b.size() - a.size());
}

// Codes of two FP8 quantizations of the same rows that may differ by at most
// one E4M3 step (same sign, magnitudes 1 apart), and scales within rel of
// each other: how many break that (the BF16 SiLU's fast arithmetic against
// the exact FP32 form).
static size_t count_fp8_far(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b,
                            const std::vector<float>& sa, const std::vector<float>& sb, double rel) {
  size_t n = a.size() != b.size() || sa.size() != sb.size();
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (a[i] == b[i]) continue;  // (untouched poison included)
    const int ma = a[i] & 0x7f, mb = b[i] & 0x7f;
    const bool same_sign = (a[i] & 0x80) == (b[i] & 0x80) || ma == 0 || mb == 0;
    n += !same_sign || std::abs(ma - mb) > 1 || ma == 0x7f || mb == 0x7f;  // (0x7f: NaN)
  }
  for (size_t i = 0; i < sa.size() && i < sb.size(); ++i)
    n += memcmp(&sa[i], &sb[i], sizeof(float)) != 0 && !(std::fabs((double)sa[i] - sb[i]) <= rel * std::fabs((double)sb[i]));
  return n;
}

// ------------------------------------------------------------ add_rmsnorm

// add_rmsnorm's arguments for rows x H of h normalised with w into FP8 rows
// and their scales (the fields the checks and benches below share; each sets
// its own others).
static AddNormArgs fp8_norm_args(float* h, const float* w, int rows, int H, uint8_t* q, float* scale) {
  AddNormArgs a;
  a.h = h;
  a.weight = w;
  a.rows = rows;
  a.hidden = H;
  a.out_q = q;
  a.out_scale = scale;
  return a;
}

// The float formula of add_rmsnorm for one row: y = w * (v * r) with
// r = 1 / sqrtf(ss / H + eps). The GPU's ss is a float sum in some order, so r
// is searched among the values of ss within 64 float ulps of the float64 sum.
// Returns the ulp distance of the matching ss, or -1 if no r reproduces the row.
static int norm_row_exact(const float* v, const float* w, const float* y, int H, float eps) {
  double ssd = 0;
  for (int c = 0; c < H; ++c) ssd += (double)v[c] * v[c];
  const float ss0 = (float)ssd;
  float last_r = NAN;
  for (int k = 0; k <= 64; ++k) {
    for (int sgn = 0; sgn < 2; ++sgn) {
      if (k == 0 && sgn) continue;
      float ss = ss0;
      for (int i = 0; i < k; ++i) ss = std::nextafter(ss, sgn ? -INFINITY : INFINITY);
      volatile float m = ss / (float)H;
      volatile float d = m + eps;
      volatile float sq = std::sqrt((float)d);
      const float r = 1.0f / (float)sq;
      if (fbits(r) == fbits(last_r)) continue;
      last_r = r;
      bool ok = true;
      for (int c = 0; c < H && ok; ++c) {
        volatile float vr = v[c] * r;
        const float yy = w[c] * (float)vr;
        ok = fbits(yy) == fbits(y[c]);
      }
      if (ok) return k;
    }
  }
  return -1;
}

// A norm's FP32 and FP8 rows against add_rmsnorm's float formulas, row by row:
// y exactly w * (v * r) for an r norm_row_exact finds, the scale
// max(amax(y) / 448, 1 / (448 * 512)) and the codes e4m3(y * (1 / s)), bit for bit.
struct NormFormula {
  size_t bad_rows = 0, bad_s = 0, bad_q = 0;
  int max_ulp = 0;
};
static NormFormula check_norm_formula(const std::vector<float>& v, const std::vector<float>& w,
                                      const std::vector<float>& gy, const std::vector<float>& gs,
                                      const std::vector<uint8_t>& gq, int rows, int H, float eps) {
  NormFormula f;
  for (int r = 0; r < rows; ++r) {
    const float* yr = gy.data() + (size_t)r * H;
    const int k = norm_row_exact(v.data() + (size_t)r * H, w.data(), yr, H, eps);
    if (k < 0) ++f.bad_rows;
    f.max_ulp = std::max(f.max_ulp, k);
    float amax = 0;
    for (int c = 0; c < H; ++c) amax = std::max(amax, std::fabs(yr[c]));
    const float sc = std::max(amax / 448.0f, 1.0f / (448.0f * 512.0f));
    f.bad_s += fbits(sc) != fbits(gs[r]);
    for (int c = 0; c < H; ++c) f.bad_q += gq[(size_t)r * H + c] != fp8_enc(yr[c] * (1.0f / sc));
  }
  return f;
}

static void check_norm(int H, int rows) {
  const float eps = 1e-5f;
  std::vector<float> h0((size_t)rows * H), d((size_t)rows * H), w(H);
  for (int r = 0; r < rows; ++r) {
    const float mag = std::pow(10.f, randu(-2, 2));
    for (int c = 0; c < H; ++c) h0[(size_t)r * H + c] = randn() * mag;
  }
  for (auto& v : d) v = randn();
  for (auto& v : w) v = bf16_round(randu(0.5f, 1.5f));
  h0[(size_t)(rows / 2) * H + H / 3] = 300.f;  // an outlier sets the FP8 scale of one row
  Dev<float> dd(d), dw(w);
  std::vector<int> idx = {rows - 1, 0, rows / 2};
  Dev<int> didx(idx);
  // keep_h (h not written): a row may be named several times (the MTP head's
  // padding entries all name row 0).
  std::vector<int> idx_rep = {0, rows - 1, 0, rows / 2, 0, 0};
  Dev<int> didx_rep(idx_rep);
  const size_t n = (size_t)rows * H;

  for (int use_delta = 1; use_delta >= 0; --use_delta) {
    const char* dname = use_delta ? "h+=delta" : "no delta";
    // Reference run: every output.
    Dev<float> dh(h0), dy(n), ds(rows);
    Dev<uint16_t> db(n);
    Dev<uint8_t> dq(n);
    dy.poison();
    ds.poison();
    db.poison();
    dq.poison();
    AddNormArgs a;
    a.h = dh.p;
    a.delta = use_delta ? dd.p : nullptr;
    a.weight = dw.p;
    a.rows = rows;
    a.hidden = H;
    a.eps = eps;
    a.out_f32 = dy.p;
    a.out_bf16 = (__nv_bfloat16*)db.p;
    a.out_q = dq.p;
    a.out_scale = ds.p;
    CK(add_rmsnorm(a, 0));
    CK(cudaDeviceSynchronize());
    const auto gh = dh.down();
    const auto gy = dy.down();
    const auto gb = db.down();
    const auto gq = dq.down();
    const auto gs = ds.down();
    // Exact float formula.
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = use_delta ? h0[i] + d[i] : h0[i];
    const size_t bad_h = count_diff(gh, v);
    const NormFormula f = check_norm_formula(v, w, gy, gs, gq, rows, H, eps);
    size_t bad_b = 0;
    for (size_t i = 0; i < n; ++i) bad_b += gb[i] != bf16_bits(gy[i]);
    report_exact("add_rmsnorm formula", fmt("H=%d rows=%d %s: rows no r fits %zu (ss ulps<=%d), h %zu", H,
                                           rows, dname, f.bad_rows, f.max_ulp, bad_h),
                 f.bad_rows + bad_h);
    report_exact("add_rmsnorm bf16/fp8 bits", fmt("H=%d %s: bf16 %zu fp8 %zu scale %zu differ", H, dname,
                                                 bad_b, f.bad_q, f.bad_s),
                 bad_b + f.bad_q + f.bad_s);
    // float64 reference.
    std::vector<double> ry, oy, ob, oq;
    for (int r = 0; r < rows; ++r) {
      double ss = 0;
      for (int c = 0; c < H; ++c) ss += (double)v[(size_t)r * H + c] * v[(size_t)r * H + c];
      const double inv = 1.0 / std::sqrt(ss / H + eps);
      for (int c = 0; c < H; ++c) {
        const size_t i = (size_t)r * H + c;
        ry.push_back(w[c] * (double)v[i] * inv);
        oy.push_back(gy[i]);
        ob.push_back(bf16_val(gb[i]));
        oq.push_back(fp8_dec(gq[i]) * gs[r]);
      }
    }
    report("add_rmsnorm f32 vs f64", fmt("H=%d %s", H, dname), rel_err(oy, ry), 1e-6);
    report("add_rmsnorm bf16 vs f64", fmt("H=%d %s", H, dname), rel_err(ob, ry), 5e-3);
    report("add_rmsnorm fp8 vs f64", fmt("H=%d %s", H, dname), rel_err(oq, ry), 4e-2);
    // The previous kernel: same h and bf16/fp8 codes except where r moved by an
    // ulp (expected: none at all).
    {
      Dev<float> ph(h0), py(n), ps(rows);
      Dev<uint16_t> pb(n);
      Dev<uint8_t> pq(n);
      AddNormArgs p = a;
      p.h = ph.p;
      p.out_f32 = py.p;
      p.out_bf16 = (__nv_bfloat16*)pb.p;
      p.out_q = pq.p;
      p.out_scale = ps.p;
      prev::add_rmsnorm(p, 0);
      CK(cudaDeviceSynchronize());
      const size_t dq_ = count_diff(pq.down(), gq), dh_ = count_diff(ph.down(), gh);
      const size_t dy_ = count_diff(py.down(), gy);
      report("add_rmsnorm vs previous", fmt("H=%d %s: fp8 %zu h %zu (f32 y %zu ulp-level) differ", H,
                                            dname, dq_, dh_, dy_),
             (double)(dq_ + dh_ * n) / n, 1e-4);
    }
    // Every other output combination, with and without row_index, with and
    // without keep_h: bitwise the reference run's rows; outputs not asked for
    // untouched.
    size_t bad = 0, runs = 0;
    for (int mask = 1; mask < 8; ++mask) {
      for (int variant = 0; variant < 4; ++variant) {
        const int indexed = variant & 1, keep = variant >> 1;
        const std::vector<int>& ix = keep ? idx_rep : idx;
        const int R = indexed ? (int)ix.size() : rows;
        const size_t m = (size_t)R * H;
        Dev<float> h2(h0), y2(m), s2(R);
        Dev<uint16_t> b2(m);
        Dev<uint8_t> q2(m);
        y2.poison();
        s2.poison();
        b2.poison();
        q2.poison();
        AddNormArgs c = a;
        c.h = h2.p;
        c.rows = R;
        c.row_index = indexed ? (keep ? didx_rep.p : didx.p) : nullptr;
        c.keep_h = keep != 0;
        c.out_f32 = (mask & 1) ? y2.p : nullptr;
        c.out_bf16 = (mask & 2) ? (__nv_bfloat16*)b2.p : nullptr;
        c.out_q = (mask & 4) ? q2.p : nullptr;
        c.out_scale = (mask & 4) ? s2.p : nullptr;
        CK(add_rmsnorm(c, 0));
        CK(cudaDeviceSynchronize());
        ++runs;
        const auto hy = y2.down();
        const auto hb = b2.down();
        const auto hq = q2.down();
        const auto hs = s2.down();
        const auto hh = h2.down();
        for (int i = 0; i < R; ++i) {
          const int src = indexed ? ix[i] : i;
          for (int cc = 0; cc < H; ++cc) {
            const size_t o = (size_t)i * H + cc, g = (size_t)src * H + cc;
            bad += (mask & 1) ? fbits(hy[o]) != fbits(gy[g]) : !std::isnan(hy[o]);
            bad += (mask & 2) ? hb[o] != gb[g] : hb[o] != 0xffff;
            bad += (mask & 4) ? hq[o] != gq[g] : hq[o] != 0xff;
          }
          bad += (mask & 4) ? fbits(hs[i]) != fbits(gs[src]) : !std::isnan(hs[i]);
        }
        // The residual: rows named (all rows when not indexed) updated, the
        // rest as before; with keep_h every row as before.
        std::vector<bool> named(rows, !indexed && !keep);
        for (int i : ix) named[i] = named[i] || (indexed && !keep);
        for (int r = 0; r < rows; ++r)
          for (int cc = 0; cc < H; ++cc) {
            const size_t g = (size_t)r * H + cc;
            bad += fbits(hh[g]) != fbits(named[r] ? gh[g] : h0[g]);
          }
      }
    }
    report_exact("add_rmsnorm outputs", fmt("H=%d %s: %zu runs (7 output sets x row_index x keep_h), %zu differ",
                                           H, dname, runs, bad),
                 bad);
  }
}

// delta (AddNormArgs::delta_splits) and qkv (QkRopeArgs::qkv_splits) as a
// K-split linear's slices, stride past the rows: bit for bit the same kernel on
// the slices summed on the host in slice order (float adds, no contraction).
static std::vector<float> slices_with_sum(size_t n, int S, int64_t stride, std::vector<float>& sum) {
  std::vector<float> sl((size_t)S * stride, std::nanf(""));
  sum.assign(n, 0.f);
  for (int s = 0; s < S; ++s)
    for (size_t i = 0; i < n; ++i) {
      const float v = randn() * (s == 0 ? 2.f : 0.5f);
      sl[(size_t)s * stride + i] = v;
      sum[i] = s == 0 ? v : sum[i] + v;
    }
  return sl;
}

// Prefill-sized norms without a delta take add_rmsnorm_rows_kernel (several
// rows a CTA, the next row's loads ahead): bit for bit the one-row-a-CTA
// kernel (forced by the hook) on every output, with and without row_index.
static void check_norm_rows(int H, int rows) {
  std::vector<float> h0((size_t)rows * H), w(H);
  for (auto& v : h0) v = randn() * 2;
  for (auto& v : w) v = randu(0.5f, 1.5f);
  std::vector<int> idx(rows);
  for (int i = 0; i < rows; ++i) idx[i] = (i * 7 + 3) % rows;
  Dev<float> dh(h0), dw(w);
  Dev<int> didx(idx);
  const size_t n = (size_t)rows * H;
  for (int indexed = 0; indexed < 2; ++indexed) {
    std::vector<float> y[2], sc[2], rs[2], hh[2];
    std::vector<uint8_t> q[2];
    for (int form = 0; form < 2; ++form) {  // 0: one row a CTA, 1: the rows kernel
      Dev<float> y2(n), s2(rows), r2(rows);
      Dev<uint8_t> q2(n);
      y2.poison();
      s2.poison();
      r2.poison();
      q2.poison();
      AddNormArgs a = fp8_norm_args(dh.p, dw.p, rows, H, q2.p, s2.p);
      a.eps = 1e-5f;
      a.row_index = indexed ? didx.p : nullptr;
      a.out_f32 = y2.p;
      a.out_rstd = r2.p;
      add_rmsnorm_set_rows_min(form == 0 ? 1 << 30 : 1);
      CK(add_rmsnorm(a, 0));
      add_rmsnorm_set_rows_min(0);
      CK(cudaDeviceSynchronize());
      y[form] = y2.down();
      q[form] = q2.down();
      sc[form] = s2.down();
      rs[form] = r2.down();
      hh[form] = dh.down();
    }
    size_t bad = count_diff(y[0], y[1]) + count_diff(q[0], q[1]) + count_diff(sc[0], sc[1]) +
                 count_diff(rs[0], rs[1]) + count_diff(hh[0], h0) + count_diff(hh[1], h0);
    for (float v : y[1]) bad += std::isnan(v);  // every output written (poisoned before)
    for (float v : sc[1]) bad += std::isnan(v);
    for (float v : rs[1]) bad += std::isnan(v);
    for (uint8_t v : q[1]) bad += v == 0xff;
    report_exact("add_rmsnorm rows kernel vs one row a CTA",
                 fmt("H=%d rows %d%s: differ %zu", H, rows, indexed ? " row_index" : "", bad), bad);
  }
}

static void check_norm_splits(int H, int rows) {
  std::vector<float> h0((size_t)rows * H), w(H);
  for (auto& v : h0) v = randn();
  for (auto& v : w) v = bf16_round(randu(0.5f, 1.5f));
  const size_t n = (size_t)rows * H;
  Dev<float> dw(w);
  for (int S : {2, 3, 9}) {
    const int64_t stride = (int64_t)n + 4 * 37;
    std::vector<float> sum;
    const std::vector<float> sl = slices_with_sum(n, S, stride, sum);
    Dev<float> dsl(sl), dsum(sum);
    size_t bad = 0;
    for (int vec = 0; vec < 2; ++vec) {
      Dev<float> h1(h0), h2(h0), y1(n), y2(n), s1(rows), s2(rows);
      Dev<uint8_t> q1(n), q2(n);
      y1.poison();
      y2.poison();
      s1.poison();
      s2.poison();
      q1.poison();
      q2.poison();
      AddNormArgs a;
      a.weight = dw.p;
      a.rows = rows;
      a.hidden = H;
      a.out_f32 = y1.p;
      a.out_q = q1.p;
      a.out_scale = s1.p;
      a.h = h1.p;
      a.delta = dsum.p;
      AddNormArgs b = a;
      b.h = h2.p;
      b.out_f32 = y2.p;
      b.out_q = q2.p;
      b.out_scale = s2.p;
      b.delta = dsl.p;
      b.delta_splits = S;
      b.delta_split_stride = stride;
      if (!vec) {  // the scalar kernel: out_f32 misaligned by a float
        a.out_f32 = y1.p + 1;
        b.out_f32 = y2.p + 1;
        a.rows = b.rows = rows - 1;
      }
      CK(add_rmsnorm(a, 0));
      CK(add_rmsnorm(b, 0));
      CK(cudaDeviceSynchronize());
      bad += count_diff(h1.down(), h2.down()) + count_diff(y1.down(), y2.down()) +
             count_diff(s1.down(), s2.down());
      const auto qa = q1.down(), qb = q2.down();
      for (size_t i = 0; i < n; ++i) bad += qa[i] != qb[i];
    }
    report_exact("add_rmsnorm delta slices", fmt("H=%d rows=%d, %d slices = their sum (vec, scalar): %zu differ", H,
                                                rows, S, bad),
                 bad);
  }
  // Refused: slices without a stride, a stride not a multiple of 4, 0 slices.
  Dev<float> h(n), d(2 * n);
  AddNormArgs a;
  a.h = h.p;
  a.delta = d.p;
  a.weight = dw.p;
  a.rows = rows;
  a.hidden = H;
  AddNormArgs b = a;
  b.delta_splits = 2;
  bool ok = add_rmsnorm(b, 0) == cudaErrorInvalidValue;
  b.delta_split_stride = (int64_t)n + 2;
  ok = ok && add_rmsnorm(b, 0) == cudaErrorInvalidValue;
  b = a;
  b.delta_splits = 0;
  ok = ok && add_rmsnorm(b, 0) == cudaErrorInvalidValue;
  (void)cudaGetLastError();
  report_exact("add_rmsnorm slices refused", fmt("H=%d: no stride, stride %% 4, 0 slices", H), ok ? 0 : 1);
}

// ------------------------------------------------------------ qk rope

static void check_rope(int T, int NH, int NKV, bool f32) {
  const int D = 128, rot = 64, bs = 16, nblocks = std::max(64, 2 * T / bs + 8);
  const int W = (NH + 2 * NKV) * D;
  std::vector<float> qkv((size_t)T * W), qn(D), kn(D);
  for (auto& v : qkv) v = randn() * 2 + 0.5f;
  for (auto& v : qn) v = bf16_round(randu(0.5f, 1.5f));
  for (auto& v : kn) v = bf16_round(randu(0.5f, 1.5f));
  std::vector<int> pos(T), slots(T), slots_all(T);
  std::vector<int> perm(nblocks * bs);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  int n_valid = 0;
  for (int t = 0; t < T; ++t) {
    pos[t] = t == 0 ? 202751 : t == 1 ? 0 : randi(0, 131071);
    slots_all[t] = perm[t];
    slots[t] = (t % 3 == 1) ? -1 : perm[t];  // every third token a padding row
    n_valid += slots[t] >= 0;
  }
  auto inv = make_inv_freq(rot, 1e6f);
  const size_t cache_n = (size_t)nblocks * NKV * bs * D;
  const size_t ce = f32 ? 2 : 1;
  Dev<float> dqkv(qkv), dqn(qn), dkn(kn), dinv(inv), dq((size_t)T * NH * D), pq((size_t)T * NH * D);
  Dev<int> dpos(pos), dslot(slots), dslot_all(slots_all);
  Dev<uint16_t> dk(cache_n * ce), dv(cache_n * ce), pk(cache_n * ce), pv(cache_n * ce);
  dq.poison();
  pq.poison();
  dk.poison();
  dv.poison();
  pk.poison();
  pv.poison();
  QkRopeArgs a;
  a.kv_f32 = f32;
  a.qkv = dqkv.p;
  a.T = T;
  a.n_q_heads = NH;
  a.n_kv_heads = NKV;
  a.rot_dim = rot;
  a.q_norm = dqn.p;
  a.k_norm = dkn.p;
  a.inv_freq = dinv.p;
  a.positions = dpos.p;
  a.slots = dslot.p;
  a.block_size = bs;
  a.q_out = dq.p;
  a.k_cache = dk.p;
  a.v_cache = dv.p;
  CK(qk_norm_rope_kv_write(a, 0));
  QkRopeArgs p = a;  // the previous kernel, every token with a real slot
  p.slots = dslot_all.p;
  p.q_out = pq.p;
  p.k_cache = pk.p;
  p.v_cache = pv.p;
  prev::qk_rope(p, 0);
  CK(cudaDeviceSynchronize());
  const auto q = dq.down(), qp = pq.down();
  const auto kc = dk.down(), vc = dv.down(), kp = pk.down(), vp = pv.down();
  // q: every token, bitwise the previous kernel.
  size_t bad_q = count_diff(q, qp);
  // Cache: the valid tokens' entries bitwise the previous kernel's, everything
  // else untouched.
  std::vector<char> mine(cache_n, 0);
  for (int t = 0; t < T; ++t) {
    if (slots[t] < 0) continue;
    const int blk = slots[t] / bs, off = slots[t] % bs;
    for (int h = 0; h < NKV; ++h)
      for (int d = 0; d < D; ++d) mine[(((size_t)blk * NKV + h) * bs + off) * D + d] = 1;
  }
  size_t bad_c = 0, written = 0;
  for (size_t i = 0; i < cache_n; ++i) {
    for (size_t u = 0; u < ce; ++u) {
      const size_t j = i * ce + u;
      if (mine[i]) {
        bad_c += kc[j] != kp[j];
        bad_c += vc[j] != vp[j];
      } else {
        bad_c += kc[j] != 0xffff;
        bad_c += vc[j] != 0xffff;
      }
    }
    written += mine[i];
  }
  // float64 reference of q.
  std::vector<double> oq, rq;
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < NH; ++h) {
      const float* x = qkv.data() + (size_t)t * W + h * D;
      double ss = 0;
      for (int d = 0; d < D; ++d) ss += (double)x[d] * x[d];
      const double r = 1.0 / std::sqrt(ss / D + 1e-5);
      std::vector<double> y(D);
      for (int d = 0; d < D; ++d) y[d] = qn[d] * x[d] * r;
      for (int d = 0; d < D; ++d) {
        double z = y[d];
        if (d < rot) {
          const int hh = rot / 2;
          const double ang = (double)((float)pos[t] * inv[d % hh]);
          const double rh = d < hh ? -y[d + hh] : y[d - hh];
          z = y[d] * std::cos(ang) + rh * std::sin(ang);
        }
        rq.push_back(z);
        oq.push_back(q[((size_t)t * NH + h) * D + d]);
      }
    }
  const char* dt = f32 ? "fp32 kv" : "bf16 kv";
  report_exact("qk_rope vs previous", fmt("T=%d %dq/%dkv %s: q bits differ %zu", T, NH, NKV, dt, bad_q),
               bad_q);
  report_exact("qk_rope slots<0", fmt("T=%d %s: %d real slots, cache differ/touched %zu", T, dt, n_valid,
                                     bad_c),
               bad_c + (written != (size_t)n_valid * NKV * D));
  report("qk_rope q vs f64", fmt("T=%d %dq/%dkv, pos up to 202751", T, NH, NKV), rel_err(oq, rq), 2e-6);

  // Runs e1 into the second set of outputs (pq, pk, pv) and e2 into the first
  // (as set in a), every output poisoned first; tpc1 / tpc2: tokens a CTA of
  // each launch (0: by T).
  auto run_pair = [&](QkRopeArgs e1, const QkRopeArgs& e2, int tpc1 = 0, int tpc2 = 0) {
    e1.q_out = pq.p;
    e1.k_cache = pk.p;
    e1.v_cache = pv.p;
    dq.poison();
    pq.poison();
    dk.poison();
    pk.poison();
    dv.poison();
    pv.poison();
    qk_rope_set_tokens_per_cta(tpc1);
    CK(qk_norm_rope_kv_write(e1, 0));
    qk_rope_set_tokens_per_cta(tpc2);
    CK(qk_norm_rope_kv_write(e2, 0));
    qk_rope_set_tokens_per_cta(0);
    CK(cudaDeviceSynchronize());
  };
  // The GEMM's epilogue folded in (x_scale / w_scale / bias set, qkv unscaled)
  // against gemm_fp8_epilogue followed by the plain kernel: same q and cache.
  {
    std::vector<float> xs(T), ws(W), bias(W);
    for (auto& v : xs) v = randu(0.5f, 2.f) / 448.f;
    for (auto& v : ws) v = randu(0.5f, 2.f) / 448.f;
    for (auto& v : bias) v = randn() * 0.1f;
    std::vector<float> raw(qkv.size());
    for (size_t i = 0; i < raw.size(); ++i) raw[i] = qkv[i] * 448.f * 448.f / 2.f;
    Dev<float> draw(raw), dscaled(raw.size()), dxs(xs), dws(ws), dbias(bias);
    CK(gemm_fp8_epilogue(draw.p, 1, T, W, dxs.p, dws.p, dbias.p, dscaled.p, W, 0));
    QkRopeArgs e1 = a, e2 = a;
    e1.qkv = dscaled.p;
    e2.qkv = draw.p;
    e2.x_scale = dxs.p;
    e2.w_scale = dws.p;
    e2.bias = dbias.p;
    run_pair(e1, e2);
    auto as_f64 = [&](const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); };
    auto cache_f64 = [&](const std::vector<uint16_t>& c) {
      std::vector<double> out;
      for (size_t i = 0; i < cache_n; ++i) {
        if (f32) {
          float f;
          uint32_t b = (uint32_t)c[2 * i] | ((uint32_t)c[2 * i + 1] << 16);
          memcpy(&f, &b, 4);
          out.push_back(std::isnan(f) ? 0.0 : f);
        } else {
          const float f = bf16_val(c[i]);
          out.push_back(std::isnan(f) ? 0.0 : f);
        }
      }
      return out;
    };
    const double eq = rel_err(as_f64(dq.down()), as_f64(pq.down()));
    const double ek = rel_err(cache_f64(dk.down()), cache_f64(pk.down()));
    const double ev = rel_err(cache_f64(dv.down()), cache_f64(pv.down()));
    report("qk_rope folded epilogue", fmt("T=%d %dq/%dkv %s: q, k cache, v cache vs epilogue kernel", T, NH, NKV, dt),
           std::max(eq, std::max(ek, ev)), f32 ? 1e-6 : 4e-3);
  }
  // Several tokens a CTA (qk_rope_tokens_kernel, prefill-sized steps): q and
  // both caches bit for bit the one-token kernel's, plain and with the GEMM's
  // epilogue folded in (scales and bias; padding tokens among them).
  {
    std::vector<float> xs(T), ws(W), bias(W);
    for (auto& v : xs) v = randu(0.5f, 2.f) / 448.f;
    for (auto& v : ws) v = randu(0.5f, 2.f) / 448.f;
    for (auto& v : bias) v = randn() * 0.1f;
    Dev<float> dxs(xs), dws(ws), dbias(bias);
    QkRopeArgs folded = a;
    folded.x_scale = dxs.p;
    folded.w_scale = dws.p;
    folded.bias = dbias.p;
    for (int tpc : {2, 4, 8})
      for (int form = 0; form < 2; ++form) {
        const QkRopeArgs& base = form ? folded : a;
        run_pair(base, base, 1, tpc);
        const size_t bad = count_diff(dq.down(), pq.down()) + count_diff(dk.down(), pk.down()) +
                           count_diff(dv.down(), pv.down());
        report_exact("qk_rope tokens a CTA",
                     fmt("T=%d %dq/%dkv %s, %d a CTA%s vs 1: %zu differ", T, NH, NKV, dt, tpc,
                         form ? " (epilogue folded)" : "", bad),
                     bad);
      }
  }
  // qkv as K-split slices (QkRopeArgs::qkv_splits): bit for bit the kernel on
  // their sum; refused with the folded epilogue or a stride below T rows.
  for (int S : {2, 5, 9}) {
    const int64_t stride = (int64_t)T * W + 4 * 5;
    std::vector<float> sum;
    const std::vector<float> sl = slices_with_sum((size_t)T * W, S, stride, sum);
    Dev<float> dsl(sl), dsum(sum);
    QkRopeArgs e1 = a, e2 = a;
    e1.qkv = dsum.p;
    e2.qkv = dsl.p;
    e2.qkv_splits = S;
    e2.qkv_split_stride = stride;
    run_pair(e1, e2);
    const size_t bad = count_diff(dq.down(), pq.down()) + count_diff(dk.down(), pk.down()) +
                       count_diff(dv.down(), pv.down());
    report_exact("qk_rope qkv slices", fmt("T=%d %dq/%dkv %s, %d slices = their sum: %zu differ", T, NH, NKV, dt, S, bad),
                 bad);
    if (S == 2) {
      QkRopeArgs r1 = e2, r2 = e2;
      r1.x_scale = dqn.p;  // any pointer: the folded epilogue is not for slices
      r2.qkv_split_stride = (int64_t)T * W - 4;
      const bool ok = qk_norm_rope_kv_write(r1, 0) == cudaErrorInvalidValue &&
                      qk_norm_rope_kv_write(r2, 0) == cudaErrorInvalidValue;
      (void)cudaGetLastError();
      report_exact("qk_rope slices refused", fmt("T=%d: with x_scale, stride < T rows", T), ok ? 0 : 1);
    }
  }
}

// ------------------------------------------------------------ router

struct RouterCase {
  int T, E, H, K, ng, tg;
  int norm = 1;
  float scale = 2.5f;
  int expert_begin = 0, n_local = 0, shared_local = -1, slots = 0;
  int n_valid = -1;  // < 0: null
};

// float64 reference of router_topk's selection from float64 logits: global ids
// in rank order, weights, and whether the decision is within 1e-5 of a tie
// (group boundary, top-k boundary or the order of the selected).
struct RefSel {
  std::vector<int> ids;
  std::vector<double> w;
  std::vector<char> amb;
};
static RefSel router_ref(const std::vector<double>& logits, const std::vector<float>& bias,
                         const RouterCase& c) {
  const int T = c.T, E = c.E, K = c.K;
  const double kTie = 1e-5;
  RefSel r;
  r.ids.assign((size_t)T * K, -1);
  r.w.assign((size_t)T * K, 0);
  r.amb.assign(T, 0);
  for (int t = 0; t < T; ++t) {
    std::vector<double> s(E), sel(E);
    for (int e = 0; e < E; ++e) {
      s[e] = 1.0 / (1.0 + std::exp(-logits[(size_t)t * E + e]));
      sel[e] = s[e] + bias[e];
    }
    if (c.ng > 1) {
      const int gs = E / c.ng;
      std::vector<double> gsc(c.ng);
      for (int g = 0; g < c.ng; ++g) {
        std::vector<double> v(sel.begin() + g * gs, sel.begin() + (g + 1) * gs);
        std::sort(v.rbegin(), v.rend());
        gsc[g] = v[0] + v[1];
      }
      std::vector<int> go(c.ng);
      std::iota(go.begin(), go.end(), 0);
      std::stable_sort(go.begin(), go.end(), [&](int a, int b) { return gsc[a] > gsc[b]; });
      if (c.tg < c.ng && gsc[go[c.tg - 1]] - gsc[go[c.tg]] < kTie) r.amb[t] = 1;
      std::vector<bool> keep(c.ng, false);
      for (int i = 0; i < c.tg; ++i) keep[go[i]] = true;
      for (int e = 0; e < E; ++e)
        if (!keep[e / gs]) sel[e] = -INFINITY;
    }
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return sel[a] > sel[b]; });
    for (int k = 0; k < K && k + 1 < E; ++k)
      if (std::isfinite(sel[order[k + 1]]) && sel[order[k]] - sel[order[k + 1]] < kTie) r.amb[t] = 1;
    double sum = 0;
    for (int k = 0; k < K; ++k) sum += s[order[k]];
    for (int k = 0; k < K; ++k) {
      r.ids[(size_t)t * K + k] = order[k];
      r.w[(size_t)t * K + k] = (c.norm ? s[order[k]] / (sum + 1e-20) : s[order[k]]) * c.scale;
    }
  }
  return r;
}

static int case_slots(const RouterCase& c) {
  return c.slots > 0 ? c.slots : c.K + (c.shared_local >= 0 ? 1 : 0);
}
static int case_groups(const RouterCase& c) { return c.n_local + (c.shared_local >= 0 ? 1 : 0); }

// Checks ids / w (and topk_global if given) of one routed batch against the
// reference; returns (id mismatches, weight rel. error over the unambiguous tokens).
static void check_selection(const RouterCase& c, const RefSel& ref, const std::vector<int>& ids,
                            const std::vector<float>& w, const std::vector<int>* glob, size_t& bad,
                            double& werr, int& n_amb) {
  const int S = case_slots(c), nv = c.n_valid < 0 ? c.T : std::min(c.n_valid, c.T);
  std::vector<double> o, r;
  n_amb = 0;
  for (int t = 0; t < c.T; ++t) {
    if (t >= nv) {  // padding row: -1 / 0 everywhere
      for (int j = 0; j < S; ++j) bad += ids[(size_t)t * S + j] != -1 || w[(size_t)t * S + j] != 0.f;
      if (glob)
        for (int k = 0; k < c.K; ++k) bad += (*glob)[(size_t)t * c.K + k] != -1;
      continue;
    }
    if (ref.amb[t]) {
      ++n_amb;
      for (int j = 0; j < S; ++j) bad += ids[(size_t)t * S + j] == kPoisonInt;  // written at least
      continue;
    }
    for (int k = 0; k < c.K; ++k) {
      const int ge = ref.ids[(size_t)t * c.K + k];
      const int want = (ge >= c.expert_begin && ge < c.expert_begin + c.n_local) ? ge - c.expert_begin : -1;
      bad += ids[(size_t)t * S + k] != want;
      if (glob) bad += (*glob)[(size_t)t * c.K + k] != ge;
      o.push_back(w[(size_t)t * S + k]);
      r.push_back(ref.w[(size_t)t * c.K + k]);
    }
    if (S > c.K) {
      bad += ids[(size_t)t * S + c.K] != c.shared_local;
      if (c.shared_local >= 0) bad += w[(size_t)t * S + c.K] != 1.0f;
    }
  }
  werr = std::max(werr, o.empty() ? 0.0 : rel_err(o, r));
}

// offsets / sorted_rows / inv against the ids they were built from: counts,
// the set of tokens of each group, and inv pointing at the token's position.
static size_t check_align(const std::vector<int>& ids, int T, int S, int G, const std::vector<int>& off,
                          const std::vector<int>& rows, const std::vector<int>& inv) {
  size_t bad = 0;
  std::vector<std::vector<int>> want(G);
  for (int i = 0; i < T * S; ++i)
    if (ids[i] >= 0 && ids[i] < G) want[ids[i]].push_back(i / S);
  if (off[0] != 0) ++bad;
  for (int g = 0; g < G; ++g) {
    if (off[g + 1] - off[g] != (int)want[g].size()) {
      ++bad;
      continue;
    }
    std::vector<int> got(rows.begin() + off[g], rows.begin() + off[g + 1]);
    std::sort(got.begin(), got.end());
    bad += got != want[g];
  }
  for (int i = 0; i < T * S; ++i) {
    const int e = ids[i];
    if (e >= 0 && e < G) {
      const int p = inv[i];
      bad += p < off[e] || p >= off[e + 1] || rows[p] != i / S;
    } else {
      bad += inv[i] != -1;
    }
  }
  return bad;
}

// Device state of one router_fused call.
struct FusedIO {
  Dev<int> ids, glob, off, rows, inv, nv;
  Dev<float> w;
  FusedIO(int T, int K, int S, int G)
      : ids((size_t)T * S), glob((size_t)T * K), off(G + 1), rows((size_t)T * S), inv((size_t)T * S),
        nv(1), w((size_t)T * S) {}
  void poison() {
    ids.poison();
    glob.poison();
    off.poison();
    rows.poison();
    inv.poison();
    w.poison();
  }
  // Poisoned outputs and the case's valid-row count (n_valid >= 0), for a launch.
  void prepare(int n_valid) {
    if (n_valid >= 0) nv.up({n_valid});
    poison();
  }
};

static RouterFusedArgs fused_args(const RouterCase& c, const float* x, const float* W, const float* bias,
                                  FusedIO& io, void* ws) {
  RouterFusedArgs a;
  a.sel.bias = bias;
  a.sel.T = c.T;
  a.sel.E = c.E;
  a.sel.top_k = c.K;
  a.sel.n_group = c.ng;
  a.sel.topk_group = c.tg;
  a.sel.norm_topk = c.norm;
  a.sel.scale = c.scale;
  a.sel.expert_begin = c.expert_begin;
  a.sel.n_local = c.n_local;
  a.sel.shared_local = c.shared_local;
  a.sel.slots = c.slots;
  a.sel.ids = io.ids.p;
  a.sel.w = io.w.p;
  a.sel.topk_global = io.glob.p;
  a.sel.n_valid = c.n_valid >= 0 ? io.nv.p : nullptr;
  a.x = x;
  a.W = W;
  a.H = c.H;
  a.n_groups = case_groups(c);
  a.offsets = io.off.p;
  a.sorted_rows = io.rows.p;
  a.inv = io.inv.p;
  a.workspace = ws;
  return a;
}

struct RouterData {
  std::vector<float> x, W, bias;
  std::vector<double> logits;  // float64 x . W^T
};
static RouterData make_router_data(int T, int E, int H) {
  RouterData d;
  d.x.resize((size_t)T * H);
  d.W.resize((size_t)E * H);
  d.bias.resize(E);
  for (auto& v : d.x) v = randn();
  const float sd = 1.5f / std::sqrt((float)H);  // logits ~ N(0, 1.5^2)
  for (auto& v : d.W) v = randn() * sd;
  for (auto& v : d.bias) v = randn() * 0.1f;
  d.logits.assign((size_t)T * E, 0.0);
  for (int t = 0; t < T; ++t)
    for (int e = 0; e < E; ++e) {
      double s = 0;
      const float* xr = d.x.data() + (size_t)t * H;
      const float* wr = d.W.data() + (size_t)e * H;
      for (int k = 0; k < H; ++k) s += (double)xr[k] * wr[k];
      d.logits[(size_t)t * E + e] = s;
    }
  return d;
}

// Everything of one fused call checked: selection vs the reference, align vs
// the GPU's own ids, and the current path (cuBLAS + router_topk + moe_align)
// giving the same ids.
static void verify_fused(const std::string& name, const RouterCase& c, const RouterData& d, FusedIO& io,
                         const std::vector<int>* ids_unfused) {
  const int S = case_slots(c), G = case_groups(c);
  const RefSel ref = router_ref(d.logits, d.bias, c);
  const auto ids = io.ids.down();
  const auto w = io.w.down();
  const auto glob = io.glob.down();
  size_t bad = 0;
  double werr = 0;
  int n_amb = 0;
  check_selection(c, ref, ids, w, &glob, bad, werr, n_amb);
  const size_t bad_align = check_align(ids, c.T, S, G, io.off.down(), io.rows.down(), io.inv.down());
  size_t bad_un = 0;  // the current path's ids, on the tokens away from a tie
  if (ids_unfused)
    for (int t = 0; t < c.T; ++t)
      if (!ref.amb[t])
        for (int j = 0; j < S; ++j) bad_un += (*ids_unfused)[(size_t)t * S + j] != ids[(size_t)t * S + j];
  std::string det = fmt("T=%d E=%d H=%d k=%d g%d/%d S=%d G=%d nv=%d: ids %zu align %zu", c.T, c.E, c.H,
                        c.K, c.tg, c.ng, S, G, c.n_valid, bad, bad_align);
  if (ids_unfused) det += fmt(" vs cuBLAS path %zu", bad_un);
  if (n_amb) det += fmt(" (%d near-tie)", n_amb);
  report(name, det, (bad || bad_align || bad_un) ? 1.0 : werr, 1e-5);
}

static void run_unfused(cublasHandle_t cb, const RouterCase& c, const float* x, const float* W,
                        const float* bias, float* logits, const int* nv, int* ids, float* w, int* off,
                        int* rows, int* inv, cudaStream_t st) {
  CKS(gemm_f32_nt(cb, x, W, logits, c.T, c.E, c.H, st));
  RouterArgs r;
  r.logits = logits;
  r.bias = bias;
  r.T = c.T;
  r.E = c.E;
  r.top_k = c.K;
  r.n_group = c.ng;
  r.topk_group = c.tg;
  r.norm_topk = c.norm;
  r.scale = c.scale;
  r.expert_begin = c.expert_begin;
  r.n_local = c.n_local;
  r.shared_local = c.shared_local;
  r.slots = c.slots;
  r.ids = ids;
  r.w = w;
  r.n_valid = nv;
  CK(router_topk(r, st));
  CK(moe_align(ids, c.T, case_slots(c), case_groups(c), off, rows, inv, st));
}

static void check_router_fused(cublasHandle_t cb) {
  // One workspace for every case (sized for the largest T and E, zeroed once):
  // the cases run one after the other on it, so each depends on the previous
  // launches having reset the counters.
  const size_t ws_bytes = router_fused_workspace_bytes(256, 160);
  Dev<char> ws(ws_bytes);
  ws.zero();
  std::vector<RouterCase> cases;
  for (int T : {1, 3, 8, 17, 64, 256}) {
    RouterCase c{T, 160, 5120, 8, 1, 1};
    c.n_local = 20;
    c.shared_local = 20;  // rank 0: experts 0..19 + the shared expert
    cases.push_back(c);
  }
  {
    RouterCase c{33, 160, 5120, 8, 1, 1};  // rank 3, no shared expert, extra slot -1
    c.expert_begin = 60;
    c.n_local = 20;
    c.slots = 9;
    cases.push_back(c);
    c.slots = 0;  // 8 slots
    c.T = 5;
    cases.push_back(c);
  }
  for (int T : {1, 2, 4, 16, 64}) {
    RouterCase c{T, 20, 5120, 8, 1, 1};
    c.n_local = 20;
    c.shared_local = 20;
    cases.push_back(c);
  }
  {
    RouterCase c{64, 160, 5120, 8, 1, 1};  // padding rows
    c.n_local = 20;
    c.shared_local = 20;
    c.n_valid = 37;
    cases.push_back(c);
    c.T = 4;
    c.n_valid = 0;
    cases.push_back(c);
  }
  {
    // Tiny models: group-limited routing, small H, norm_topk off.
    RouterCase c{33, 16, 256, 4, 4, 2};
    c.n_local = 8;
    c.expert_begin = 8;
    c.shared_local = 8;
    c.scale = 1.0f;
    cases.push_back(c);
    c = RouterCase{5, 16, 384, 4, 4, 2};
    c.n_local = 16;
    c.shared_local = 16;
    c.norm = 0;
    cases.push_back(c);
    c = RouterCase{200, 16, 128, 2, 4, 2};
    c.n_local = 16;
    c.shared_local = -1;
    c.n_valid = 150;
    cases.push_back(c);
    c = RouterCase{7, 64, 320, 6, 8, 3};  // H not a multiple of 128
    c.n_local = 64;
    c.shared_local = 64;
    cases.push_back(c);
    c = RouterCase{300, 20, 512, 8, 1, 1};  // T > 256: K splits limited by the workspace
    c.n_local = 20;
    c.shared_local = 20;
    cases.push_back(c);
  }
  // router_fused's default on sm_90 is the cluster form where it is the faster
  // (E <= 32, T <= 4: up to 4 tokens in one token tile), the last-CTA form
  // elsewhere: these checks cover both (and check_router_fused_forms the
  // cluster form at every T).
  int cc_major = 0, n_wrong = 0, n_cluster = 0;
  CK(cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, 0));
  for (const RouterCase& c : cases) {
    RouterFusedPlan plan;
    CK(router_fused_plan(c.T, c.E, c.H, &plan));
    const bool want = c.E <= 32 && c.T <= 4;
    n_wrong += (plan.cluster > 0) != want;
    n_cluster += plan.cluster > 0;
  }
  if (cc_major >= 9)
    report_exact("router_fused default form",
                 fmt("%zu cases, %d on the cluster form: %d not where E <= 32, T <= 4 (sm_%d0)", cases.size(),
                     n_cluster, n_wrong, cc_major),
                 n_wrong);
  for (const RouterCase& c : cases) {
    const RouterData d = make_router_data(c.T, c.E, c.H);
    const int S = case_slots(c), G = case_groups(c);
    Dev<float> x(d.x), W(d.W), bias(d.bias), logits((size_t)c.T * c.E);
    FusedIO io(c.T, c.K, S, G), un(c.T, c.K, S, G);
    io.prepare(c.n_valid);
    un.prepare(c.n_valid);
    RouterFusedArgs a = fused_args(c, x.p, W.p, bias.p, io, ws.p);
    CK(router_fused(a, 0));
    run_unfused(cb, c, x.p, W.p, bias.p, logits.p, c.n_valid >= 0 ? un.nv.p : nullptr, un.ids.p, un.w.p,
                un.off.p, un.rows.p, un.inv.p, 0);
    CK(cudaDeviceSynchronize());
    const auto ids_un = un.ids.down();
    verify_fused("router_fused", c, d, io, &ids_un);
    // The current path itself against the same reference.
    {
      const RefSel ref = router_ref(d.logits, d.bias, c);
      size_t bad = 0;
      double werr = 0;
      int n_amb = 0;
      check_selection(c, ref, ids_un, un.w.down(), nullptr, bad, werr, n_amb);
      bad += check_align(ids_un, c.T, S, G, un.off.down(), un.rows.down(), un.inv.down());
      report("cuBLAS+topk+align", fmt("T=%d E=%d H=%d nv=%d: bad %zu", c.T, c.E, c.H, c.n_valid, bad),
             bad ? 1.0 : werr, 1e-5);
    }
  }

  // Back to back without a host sync: three batches of different sizes on the
  // same workspace, then a CUDA graph of one call replayed twice on new inputs.
  {
    std::vector<RouterCase> seq;
    for (int T : {64, 5, 256}) {
      RouterCase c{T, 160, 5120, 8, 1, 1};
      c.n_local = 20;
      c.shared_local = 20;
      seq.push_back(c);
    }
    seq[1].n_valid = 3;
    std::vector<RouterData> data;
    std::vector<std::unique_ptr<Dev<float>>> xs, Ws, bs;
    std::vector<std::unique_ptr<FusedIO>> ios;
    for (const auto& c : seq) {
      data.push_back(make_router_data(c.T, c.E, c.H));
      xs.emplace_back(new Dev<float>(data.back().x));
      Ws.emplace_back(new Dev<float>(data.back().W));
      bs.emplace_back(new Dev<float>(data.back().bias));
      ios.emplace_back(new FusedIO(c.T, c.K, case_slots(c), case_groups(c)));
      if (c.n_valid >= 0) ios.back()->nv.up({c.n_valid});
      ios.back()->poison();
    }
    CK(cudaDeviceSynchronize());
    for (size_t i = 0; i < seq.size(); ++i)
      CK(router_fused(fused_args(seq[i], xs[i]->p, Ws[i]->p, bs[i]->p, *ios[i], ws.p), 0));
    CK(cudaDeviceSynchronize());
    for (size_t i = 0; i < seq.size(); ++i)
      verify_fused(fmt("router_fused b2b #%zu", i), seq[i], data[i], *ios[i], nullptr);
  }
  {
    RouterCase c{16, 160, 5120, 8, 1, 1};
    c.n_local = 20;
    c.shared_local = 20;
    c.n_valid = 16;
    RouterData d = make_router_data(c.T, c.E, c.H);
    Dev<float> x(d.x), W(d.W), bias(d.bias);
    FusedIO io(c.T, c.K, case_slots(c), case_groups(c));
    io.nv.up({c.n_valid});
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    CK(router_fused(fused_args(c, x.p, W.p, bias.p, io, ws.p), s));
    CK(cudaStreamEndCapture(s, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    for (int rep = 0; rep < 2; ++rep) {
      // New inputs (and a new count of live rows) before each replay.
      RouterData dn = make_router_data(c.T, c.E, c.H);
      dn.W = d.W;
      dn.bias = d.bias;
      dn.logits.assign((size_t)c.T * c.E, 0.0);
      for (int t = 0; t < c.T; ++t)
        for (int e = 0; e < c.E; ++e) {
          double sum = 0;
          for (int k = 0; k < c.H; ++k) sum += (double)dn.x[(size_t)t * c.H + k] * dn.W[(size_t)e * c.H + k];
          dn.logits[(size_t)t * c.E + e] = sum;
        }
      RouterCase cr = c;
      cr.n_valid = rep == 0 ? 16 : 11;
      x.up(dn.x);
      io.nv.up({cr.n_valid});
      io.poison();
      CK(cudaDeviceSynchronize());
      CK(cudaGraphLaunch(exec, s));
      CK(cudaStreamSynchronize(s));
      verify_fused(fmt("router_fused graph #%d", rep), cr, dn, io, nullptr);
    }
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    CK(cudaStreamDestroy(s));
  }
  // Workspace left reusable: every counter back at zero (the header: the
  // first 4 KB, ahead of the partial logits).
  {
    const auto h = ws.down();
    size_t nz = 0;
    for (size_t i = 0; i < 4096 && i < h.size(); ++i) nz += h[i] != 0;
    report_exact("router_fused counters", "workspace header zero after all launches", nz);
  }
}

// The two forms of router_fused on one plan: the cluster form (path 1, the
// default) against the last-CTA form on the cluster form's plan (path 2), which
// sum the same partials in the same order: ids, weights, topk_global and
// offsets bit for bit; sorted_rows the same set of tokens per group (their
// order inside a group follows shared-memory atomics) and each form's inv
// consistent with its own rows. Clusters up to the device's limit (16 on an
// H100 / H200) and capped at the portable 8; the cluster form also against
// the float64 reference. One workspace for all, its counters checked zero at
// the end (both forms' counters: the last-CTA form uses the per-tile ones).
// router_logits_normed: the post-attention norm writes its per-row factor
// (out_rstd) instead of its FP32 rows, and the logits are rebuilt from h. The
// factor must reproduce the norm's out_f32 bit for bit (y = w * (h * rstd)),
// the logits must match a float64 sum over those rows (and cuBLAS's SGEMM on
// them, the path they replace) to FP32 rounding, rows past T stay untouched,
// and bad arguments are refused.
// Residual rows as the router checks draw them: each row normal values at
// its own magnitude, 10^-2 .. 10^2.
static std::vector<float> residual_rows(int T, int H) {
  std::vector<float> h((size_t)T * H);
  for (int r = 0; r < T; ++r) {
    const float mag = std::pow(10.f, randu(-2, 2));
    for (int k = 0; k < H; ++k) h[(size_t)r * H + k] = randn() * mag;
  }
  return h;
}

static void check_router_logits_normed(cublasHandle_t cb) {
  const float eps = 1e-5f;
  // Router weights: BF16 values (a checkpoint's, TF32-exact: the tensor-core
  // kernel skips their low halves), full FP32 values, or BF16 values with a
  // few FP32 ones (some 32-column chunks take the three products, the rest
  // two).
  enum WKind { kWBf16, kWF32, kWMixed };
  struct Case {
    int T, E, H;
    WKind wk;
  };
  for (const Case c : {Case{1, 20, 5120, kWBf16}, Case{17, 20, 5120, kWBf16}, Case{300, 20, 5120, kWBf16},
                       Case{2048, 20, 5120, kWBf16}, Case{33, 32, 5120, kWBf16}, Case{16, 8, 5120, kWBf16},
                       Case{5, 1, 132, kWBf16}, Case{40, 17, 4100, kWBf16}, Case{64, 24, 128, kWBf16},
                       Case{17, 20, 5120, kWF32}, Case{2048, 20, 5120, kWF32}, Case{33, 32, 5120, kWF32},
                       Case{300, 20, 5120, kWMixed}, Case{64, 24, 128, kWMixed}}) {
    const int T = c.T, E = c.E, H = c.H;
    const std::vector<float> h = residual_rows(T, H);
    std::vector<float> w(H), W((size_t)E * H);
    for (auto& v : w) v = bf16_round(randu(0.5f, 1.5f));
    for (auto& v : W) v = c.wk == kWF32 ? randn() * 0.02f : bf16_round(randn() * 0.02f);
    if (c.wk == kWMixed)
      for (size_t i = 0; i < W.size(); i += 997) W[i] = randn() * 0.02f;
    const char* wname = c.wk == kWBf16 ? "BF16 W" : c.wk == kWF32 ? "F32 W" : "mixed W";
    Dev<float> dh(h), dw(w), dW(W), dy((size_t)T * H), drs(T), dlog((size_t)(T + 1) * E), dref((size_t)T * E);
    Dev<uint8_t> dq((size_t)T * H);
    Dev<float> ds(T);
    AddNormArgs a = fp8_norm_args(dh.p, dw.p, T, H, dq.p, ds.p);
    a.eps = eps;
    a.out_f32 = dy.p;
    a.out_rstd = drs.p;
    drs.poison();
    dlog.poison();
    CK(add_rmsnorm(a, 0));
    CK(router_logits_normed(dh.p, dw.p, drs.p, dW.p, dlog.p, T, E, H, 0));
    // The FMA kernel on the same rows (the default at H % 32 != 0 only).
    Dev<float> dlog_fma((size_t)(T + 1) * E);
    dlog_fma.poison();
    router_logits_normed_force_fma(true);
    CK(router_logits_normed(dh.p, dw.p, drs.p, dW.p, dlog_fma.p, T, E, H, 0));
    router_logits_normed_force_fma(false);
    const std::string e = gemm_f32_nt(cb, dy.p, dW.p, dref.p, T, E, H, 0);
    if (!e.empty()) {
      report("router_logits_normed", fmt("T=%d E=%d H=%d: cuBLAS %s", T, E, H, e.c_str()), 1, 0);
      continue;
    }
    CK(cudaDeviceSynchronize());
    const auto gy = dy.down(), grs = drs.down(), gl = dlog.down(), gr = dref.down(), gf = dlog_fma.down();
    size_t bad_y = 0;
    for (int r = 0; r < T; ++r)
      for (int k = 0; k < H; ++k) {
        const float y = w[k] * (h[(size_t)r * H + k] * grs[r]);
        bad_y += fbits(y) != fbits(gy[(size_t)r * H + k]);
      }
    report_exact("add_rmsnorm out_rstd", fmt("T=%d H=%d: rows w*(h*rstd) != out_f32: %zu", T, H, bad_y), bad_y);
    // |logit - float64 sum| against the sum of |terms| (the FP32 rounding scale).
    double worst = 0, worst_fma = 0, worst_blas = 0;
    auto err = [](double got, double ref, double mag) {
      return std::isfinite(got) ? std::fabs(got - ref) / (mag + 1e-30) : INFINITY;
    };
    for (int r = 0; r < T; ++r)
      for (int e2 = 0; e2 < E; ++e2) {
        double ref = 0, mag = 0;
        for (int k = 0; k < H; ++k) {
          const double t = (double)gy[(size_t)r * H + k] * W[(size_t)e2 * H + k];
          ref += t;
          mag += std::fabs(t);
        }
        worst = std::max(worst, err(gl[(size_t)r * E + e2], ref, mag));
        worst_fma = std::max(worst_fma, err(gf[(size_t)r * E + e2], ref, mag));
        worst_blas = std::max(worst_blas, err(gr[(size_t)r * E + e2], ref, mag));
      }
    size_t untouched = 0, untouched_fma = 0;
    for (int e2 = 0; e2 < E; ++e2) {
      untouched += fbits(gl[(size_t)T * E + e2]) == 0xffffffffu;
      untouched_fma += fbits(gf[(size_t)T * E + e2]) == 0xffffffffu;
    }
    report("router_logits_normed", fmt("T=%d E=%d H=%d %s %s vs f64 (cuBLAS %.1e), row T kept %zu/%d", T, E, H,
                                       wname, H % 32 == 0 ? "3xTF32" : "FMA", worst_blas, untouched, E),
           untouched == (size_t)E ? worst : INFINITY, 2e-6);
    if (H % 32 == 0)
      report("router_logits_normed", fmt("T=%d E=%d H=%d %s FMA form vs f64, row T kept %zu/%d", T, E, H,
                                         wname, untouched_fma, E),
             untouched_fma == (size_t)E ? worst_fma : INFINITY, 2e-6);
  }
  // Refusals: E past 32, H not a multiple of 4, misaligned rows.
  Dev<float> buf(64 * 1024);
  const bool refused = router_logits_normed(buf.p, buf.p, buf.p, buf.p, buf.p, 4, 33, 128, 0) ==
                           cudaErrorInvalidValue &&
                       router_logits_normed(buf.p, buf.p, buf.p, buf.p, buf.p, 4, 8, 130, 0) ==
                           cudaErrorInvalidValue &&
                       router_logits_normed(buf.p + 1, buf.p, buf.p, buf.p, buf.p, 4, 8, 128, 0) ==
                           cudaErrorInvalidValue &&
                       router_logits_normed(buf.p, buf.p, buf.p, buf.p, buf.p, 0, 8, 128, 0) == cudaSuccess;
  report_exact("router_logits_normed refusals", "E=33, H=130, misaligned h refused; T=0 a no-op", !refused);
}

// rmsnorm_router_logits (the prefill post-attention norm and the router's
// logits in one launch) against add_rmsnorm + router_logits_normed on the same
// rows: 1/rms and the scales within 4e-6 relative (the sum of squares in
// another order; the scale from r max|w h|), every FP8 code within one step of
// add_rmsnorm's and at most 0.1% of them off by that step, the logits within
// 2e-6 of the terms' magnitude of a float64 sum with a float64 r, rows past T
// untouched; bad arguments refused.
static void check_rmsnorm_router_logits() {
  const float eps = 1e-5f;
  struct Case {
    int T, E, H;
  };
  for (const Case c : {Case{1, 20, 5120}, Case{17, 20, 5120}, Case{300, 20, 5120}, Case{2048, 20, 5120},
                       Case{33, 24, 5120}, Case{16, 8, 256}, Case{40, 17, 4096}, Case{5, 1, 128}}) {
    const int T = c.T, E = c.E, H = c.H;
    const std::vector<float> h = residual_rows(T, H);
    std::vector<float> w(H), W((size_t)E * H);
    for (auto& v : w) v = bf16_round(randu(0.5f, 1.5f));
    for (auto& v : W) v = bf16_round(randn() * 0.02f);
    Dev<float> dh(h), dw(w), dW(W), drs(T + 1), dsc(T + 1), dlog((size_t)(T + 1) * E);
    Dev<float> drs0(T), dsc0(T), dlog0((size_t)T * E);
    Dev<uint8_t> dq((size_t)(T + 1) * H), dq0((size_t)T * H);
    AddNormArgs a = fp8_norm_args(dh.p, dw.p, T, H, dq0.p, dsc0.p);
    a.eps = eps;
    a.out_rstd = drs0.p;
    CK(add_rmsnorm(a, 0));  // the two-launch reference
    CK(router_logits_normed(dh.p, dw.p, drs0.p, dW.p, dlog0.p, T, E, H, 0));
    AddNormArgs b = a;
    b.out_q = dq.p;
    b.out_scale = dsc.p;
    b.out_rstd = drs.p;
    drs.poison();
    dsc.poison();
    dlog.poison();
    dq.poison();
    CK(rmsnorm_router_logits(b, dW.p, dlog.p, E, 0));
    CK(cudaDeviceSynchronize());
    const auto rs = drs.down(), sc = dsc.down(), lg = dlog.down(), rs0 = drs0.down(), sc0 = dsc0.down();
    const auto q = dq.down(), q0 = dq0.down();
    double worst_r = 0, worst_s = 0, worst_l = 0;
    size_t far = 0, step = 0, kept = 0;
    for (int r = 0; r < T; ++r) {
      worst_r = std::max(worst_r, std::fabs((double)rs[r] - rs0[r]) / rs0[r]);
      worst_s = std::max(worst_s, std::fabs((double)sc[r] - sc0[r]) / sc0[r]);
      double ss = 0;
      for (int k = 0; k < H; ++k) ss += (double)h[(size_t)r * H + k] * h[(size_t)r * H + k];
      const double r64 = 1.0 / std::sqrt(ss / H + eps);
      for (int k = 0; k < H; ++k) {
        const uint8_t x = q[(size_t)r * H + k], y = q0[(size_t)r * H + k];
        if (x == y) continue;
        // One step: the same sign and magnitude codes one apart.
        const bool one = (x & 0x80) == (y & 0x80) && std::abs((x & 0x7f) - (y & 0x7f)) == 1;
        step += one;
        far += !one;
      }
      for (int e2 = 0; e2 < E; ++e2) {
        double ref = 0, mag = 0;
        for (int k = 0; k < H; ++k) {
          const double t = (double)w[k] * h[(size_t)r * H + k] * r64 * W[(size_t)e2 * H + k];
          ref += t;
          mag += std::fabs(t);
        }
        const double got = lg[(size_t)r * E + e2];
        worst_l = std::max(worst_l, std::isfinite(got) ? std::fabs(got - ref) / (mag + 1e-30) : INFINITY);
      }
    }
    for (int e2 = 0; e2 < E; ++e2) kept += fbits(lg[(size_t)T * E + e2]) == 0xffffffffu;
    kept += fbits(rs[T]) == 0xffffffffu;
    kept += fbits(sc[T]) == 0xffffffffu;
    for (int k = 0; k < H; ++k) kept += q[(size_t)T * H + k] == 0xff;
    const size_t want_kept = (size_t)E + 2 + H;
    const double step_frac = (double)step / ((double)T * H);
    report("rmsnorm_router_logits",
           fmt("T=%d E=%d H=%d: rstd %.1e scale %.1e rel, codes a step off %zu (%.1e) further %zu, row T kept %zu/%zu",
               T, E, H, worst_r, worst_s, step, step_frac, far, kept, want_kept),
           (worst_r > 4e-6 || worst_s > 4e-6 || far || step_frac > 1e-3 || kept != want_kept) ? INFINITY : worst_l,
           2e-6);
  }
  // Refusals: a delta, E past 24, H not a multiple of 32, FP32 rows asked for.
  Dev<float> buf(64 * 1024);
  Dev<uint8_t> qb(64 * 1024);
  const AddNormArgs ok = fp8_norm_args(buf.p, buf.p, 4, 128, qb.p, buf.p + 32 * 1024);
  AddNormArgs with_delta = ok, with_f32 = ok, h130 = ok, zero = ok;
  with_delta.delta = buf.p;
  with_f32.out_f32 = buf.p + 16 * 1024;
  h130.hidden = 130;
  zero.rows = 0;
  const bool refused = rmsnorm_router_logits(with_delta, buf.p, buf.p, 8, 0) == cudaErrorInvalidValue &&
                       rmsnorm_router_logits(with_f32, buf.p, buf.p, 8, 0) == cudaErrorInvalidValue &&
                       rmsnorm_router_logits(h130, buf.p, buf.p, 8, 0) == cudaErrorInvalidValue &&
                       rmsnorm_router_logits(ok, buf.p, buf.p, 25, 0) == cudaErrorInvalidValue &&
                       rmsnorm_router_logits(zero, buf.p, buf.p, 8, 0) == cudaSuccess;
  report_exact("rmsnorm_router_logits refusals", "delta, FP32 rows, H=130, E=25 refused; T=0 a no-op", !refused);
}

static void check_router_fused_forms() {
  int cc_major = 0;
  CK(cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, 0));
  Dev<char> ws(router_fused_workspace_bytes(256, 160));
  ws.zero();
  struct Shape {
    int T, E, nv;
  };
  std::vector<Shape> shapes;
  for (int E : {20, 160})
    for (int T : {1, 3, 16, 64, 200, 256}) shapes.push_back({T, E, -1});
  // Padding rows: a partly padded tile, whole padded tiles, all padded; one
  // token tile (its leader sorts without the counter) padded in part or whole.
  for (Shape sh : {Shape{64, 20, 37}, Shape{64, 160, 37}, Shape{200, 20, 150}, Shape{200, 160, 9},
                   Shape{16, 160, 0}, Shape{3, 20, 1}, Shape{256, 160, 255}, Shape{2, 160, 1},
                   Shape{1, 20, 0}})
    shapes.push_back(sh);
  for (const Shape& sh : shapes) {
    RouterCase c{sh.T, sh.E, 5120, 8, 1, 1};
    c.n_local = 20;
    c.shared_local = 20;
    c.n_valid = sh.nv;
    const RouterData d = make_router_data(c.T, c.E, c.H);
    const int S = case_slots(c), G = case_groups(c);
    Dev<float> x(d.x), W(d.W), bias(d.bias);
    for (int max_cluster : {0, 8}) {
      FusedIO cl(c.T, c.K, S, G), lc(c.T, c.K, S, G);
      cl.prepare(c.n_valid);
      lc.prepare(c.n_valid);
      const std::string what = fmt("T=%d E=%d nv=%d cluster<=%d", c.T, c.E, c.n_valid, max_cluster);
      RouterFusedTuning tu{1, max_cluster};
      router_fused_set_tuning(&tu);
      RouterFusedPlan plan;
      const cudaError_t pe = router_fused_plan(c.T, c.E, c.H, &plan);
      if (pe == cudaErrorNotSupported) {
        router_fused_set_tuning(nullptr);
        // Only an error where the device should launch clusters.
        report("router_fused forms", what + ": the cluster form is not supported here", cc_major >= 9 ? 1.0 : 0.0,
               0.0);
        continue;
      }
      CK(pe);
      CK(router_fused(fused_args(c, x.p, W.p, bias.p, cl, ws.p), 0));
      tu.path = 2;
      router_fused_set_tuning(&tu);
      CK(router_fused(fused_args(c, x.p, W.p, bias.p, lc, ws.p), 0));
      router_fused_set_tuning(nullptr);
      CK(cudaDeviceSynchronize());
      size_t bad = 0;
      const auto ids = cl.ids.down(), ids2 = lc.ids.down(), glob = cl.glob.down(), glob2 = lc.glob.down();
      const auto off = cl.off.down(), off2 = lc.off.down();
      const auto rows = cl.rows.down(), rows2 = lc.rows.down();
      // count_diff compares bytes: the weights bit for bit.
      bad += count_diff(ids, ids2) + count_diff(glob, glob2) + count_diff(off, off2) +
             count_diff(cl.w.down(), lc.w.down());
      // Offsets in range before the rows are sliced by them (poison is not).
      bool off_ok = off == off2 && off[0] == 0 && off[G] <= c.T * S;
      for (int g = 0; g < G && off_ok; ++g) off_ok = off[g] <= off[g + 1];
      size_t bad_sets = off_ok ? 0 : 1;
      for (int g = 0; g < G && off_ok; ++g) {
        std::vector<int> a(rows.begin() + off[g], rows.begin() + off[g + 1]);
        std::vector<int> b(rows2.begin() + off[g], rows2.begin() + off[g + 1]);
        std::sort(a.begin(), a.end());
        std::sort(b.begin(), b.end());
        bad_sets += a != b;
      }
      const size_t bad_inv = check_align(ids, c.T, S, G, off, rows, cl.inv.down()) +
                             check_align(ids2, c.T, S, G, off2, rows2, lc.inv.down());
      report_exact("router_fused forms",
                   fmt("%s: C=%d ks=%d: %zu differ, %zu groups, align %zu", what.c_str(), plan.cluster,
                       plan.n_ks, bad, bad_sets, bad_inv),
                   bad + bad_sets + bad_inv);
      verify_fused(fmt("router_fused cluster<=%d", max_cluster), c, d, cl, nullptr);
    }
  }
  const auto h = ws.down();
  size_t nz = 0;
  for (size_t i = 0; i < 4096 && i < h.size(); ++i) nz += h[i] != 0;
  report_exact("router_fused forms header", "workspace header zero after both forms", nz);
}

// router_topk: the same bits as the previous kernel; n_valid padding rows.
// add_rmsnorm_router against its formulas and against add_rmsnorm +
// router_fused. Per case (every case on one workspace, so each depends on the
// launches before having reset the counter): h bit-identical to the chain's
// (the same adds); y (out_f32) = w * (v * r) exactly for an r within a few
// ulps of the float64 one (norm_row_exact), the FP8 codes and scales exactly
// e4m3(y / s), s = max(amax / 448, min) of y; the selection against float64
// logits of y (and the chain's ids away from near-ties), the sort against the
// ids; y within 1e-6 of the chain's; a second launch without out_f32 /
// out_rstd bit-identical in every output.
// The device state of one norm (+ router) run of check_add_rmsnorm_router:
// the residual rows from h0, poisoned outputs, the router's outputs prepared
// for the case's valid rows.
struct NormRouterRun {
  Dev<float> h, y, s, r;
  Dev<uint8_t> q;
  FusedIO io;
  NormRouterRun(const std::vector<float>& h0, const RouterCase& c, int S, int G)
      : h(h0), y(h0.size()), s(c.T), r(c.T), q(h0.size()), io(c.T, c.K, S, G) {
    y.poison();
    s.poison();
    r.poison();
    q.poison();
    io.prepare(c.n_valid);
  }
  // base with this run's rows and outputs (out_f32 / out_rstd if asked).
  AddNormArgs args(const AddNormArgs& base, bool f32, bool rstd) {
    AddNormArgs a = base;
    a.h = h.p;
    a.out_f32 = f32 ? y.p : nullptr;
    a.out_rstd = rstd ? r.p : nullptr;
    a.out_q = q.p;
    a.out_scale = s.p;
    return a;
  }
};

struct NormRouterCase {
  RouterCase rc;
  int splits;  // 0: no delta; 1: one delta; > 1: K-split slices
};

static void check_add_rmsnorm_router(cublasHandle_t) {
  Dev<char> ws(router_fused_workspace_bytes(256, 32));
  ws.zero();
  std::vector<NormRouterCase> cases;
  for (int T : {2, 3, 4, 8, 9, 16, 33, 64}) {
    RouterCase c{T, 20, 5120, 8, 1, 1};
    c.n_local = 20;
    c.shared_local = 20;
    cases.push_back({c, T % 2 ? 1 : 3});
  }
  {
    RouterCase c{16, 20, 5120, 1, 1, 1};  // top-1 with padding rows
    c.n_local = 20;
    c.shared_local = 20;
    c.n_valid = 11;
    cases.push_back({c, 3});
    c.T = 4;
    c.n_valid = 0;
    cases.push_back({c, 0});
    c.T = 100;  // 13 tiles, no delta (o_proj added into h past 64 rows)
    c.n_valid = -1;
    cases.push_back({c, 0});
    c = RouterCase{64, 32, 8192, 8, 1, 1};  // the largest slice (S = 1024, 8 rows: 2,048 float4)
    c.expert_begin = 0;
    c.n_local = 32;
    c.shared_local = -1;
    cases.push_back({c, 2});
  }
  {
    RouterCase c{7, 16, 256, 4, 4, 2};  // tiny models: group-limited, H 256 (C = 2) and 384 (C = 3)
    c.n_local = 8;
    c.expert_begin = 8;
    c.shared_local = 8;
    c.scale = 1.0f;
    cases.push_back({c, 1});
    c = RouterCase{40, 16, 384, 4, 4, 2};
    c.n_local = 16;
    c.shared_local = 16;
    c.norm = 0;
    cases.push_back({c, 0});
    c = RouterCase{64, 24, 896, 6, 1, 1};  // C = 7, one 128-float step a CTA
    c.n_local = 24;
    c.shared_local = 24;
    c.slots = 7;
    cases.push_back({c, 2});
  }
  const float eps = 1e-5f;
  for (const NormRouterCase& nc : cases) {
    const RouterCase& c = nc.rc;
    const int T = c.T, E = c.E, H = c.H, S = case_slots(c), G = case_groups(c);
    const size_t n = (size_t)T * H;
    const std::string name = fmt("T=%d E=%d H=%d k=%d delta %d", T, E, H, c.K, nc.splits);
    if (!add_rmsnorm_router_supported(T, E, H)) {
      report("add_rmsnorm_router", name + ": not supported here", 1.0, 0.0);
      continue;
    }
    std::vector<float> h0(n), w(H), W((size_t)E * H), bias(E);
    for (int t = 0; t < T; ++t) {
      const float mag = std::pow(10.f, randu(-1, 1));
      for (int k = 0; k < H; ++k) h0[(size_t)t * H + k] = randn() * mag;
    }
    for (auto& v : w) v = bf16_round(randu(0.5f, 1.5f));
    const float sd = 1.5f / std::sqrt((float)H);
    for (auto& v : W) v = randn() * sd;
    for (auto& v : bias) v = randn() * 0.1f;
    const int64_t stride = (int64_t)n + 4 * 13;
    std::vector<float> sum(n, 0.f), sl;
    if (nc.splits > 0) sl = slices_with_sum(n, nc.splits, stride, sum);
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = nc.splits > 0 ? h0[i] + sum[i] : h0[i];
    Dev<float> dw(w), dW(W), db(bias), dsl(sl.empty() ? std::vector<float>(1) : sl);
    AddNormArgs na;
    na.weight = dw.p;
    na.rows = T;
    na.hidden = H;
    na.eps = eps;
    na.delta = nc.splits > 0 ? dsl.p : nullptr;
    na.delta_splits = nc.splits > 1 ? nc.splits : 1;
    na.delta_split_stride = nc.splits > 1 ? stride : 0;
    // The chain: add_rmsnorm (FP32 rows for the router) + router_fused.
    NormRouterRun ch(h0, c, S, G);
    const AddNormArgs a = ch.args(na, true, false);
    CK(add_rmsnorm(a, 0));
    CK(router_fused(fused_args(c, ch.y.p, dW.p, db.p, ch.io, ws.p), 0));
    // The fused launch, every output.
    NormRouterRun fu(h0, c, S, G);
    CK(add_rmsnorm_router(fu.args(na, true, true), fused_args(c, nullptr, dW.p, db.p, fu.io, ws.p), 0));
    // Again without out_f32 / out_rstd (the step's form).
    NormRouterRun st(h0, c, S, G);
    CK(add_rmsnorm_router(st.args(na, false, false), fused_args(c, nullptr, dW.p, db.p, st.io, ws.p), 0));
    CK(cudaDeviceSynchronize());
    const auto gh = fu.h.down(), gy = fu.y.down(), gs = fu.s.down(), gr = fu.r.down();
    const auto gq = fu.q.down();
    // The formulas.
    const NormFormula f = check_norm_formula(v, w, gy, gs, gq, T, H, eps);
    size_t bad_r = 0;
    for (int t = 0; t < T; ++t) {
      double ss = 0;
      for (int i = 0; i < H; ++i) ss += (double)v[(size_t)t * H + i] * v[(size_t)t * H + i];
      bad_r += std::fabs(gr[t] - 1.0 / std::sqrt(ss / H + eps)) > 1e-6 * std::fabs(gr[t]);
    }
    const size_t bad_h = count_diff(gh, ch.h.down());
    report_exact("add_rmsnorm_router norm", fmt("%s: h vs chain %zu, rows no r fits %zu (ss ulps<=%d), rstd %zu, "
                                               "fp8 %zu scale %zu",
                                               name.c_str(), bad_h, f.bad_rows, f.max_ulp, bad_r, f.bad_q, f.bad_s),
                 bad_h + f.bad_rows + bad_r + f.bad_q + f.bad_s);
    // The selection and sort from y, and the chain's ids.
    RouterData d;
    d.x = gy;
    d.W = W;
    d.bias = bias;
    d.logits.assign((size_t)T * E, 0.0);
    for (int t = 0; t < T; ++t)
      for (int e = 0; e < E; ++e) {
        double s = 0;
        for (int k = 0; k < H; ++k) s += (double)gy[(size_t)t * H + k] * W[(size_t)e * H + k];
        d.logits[(size_t)t * E + e] = s;
      }
    const auto ids_chain = ch.io.ids.down();
    verify_fused("add_rmsnorm_router route", c, d, fu.io, &ids_chain);
    {
      std::vector<double> o(gy.begin(), gy.end()), rr;
      for (float x : ch.y.down()) rr.push_back(x);
      report("add_rmsnorm_router y vs chain", name, rel_err(o, rr), 1e-6);
    }
    // The step's form: the same bits everywhere.
    size_t diff = count_diff(st.h.down(), gh) + count_diff(st.s.down(), gs) +
                  count_diff(st.io.ids.down(), fu.io.ids.down()) + count_diff(st.io.w.down(), fu.io.w.down()) +
                  count_diff(st.io.off.down(), fu.io.off.down()) + count_diff(st.io.glob.down(), fu.io.glob.down());
    const auto q2 = st.q.down();
    for (size_t i = 0; i < n; ++i) diff += q2[i] != gq[i];
    diff += check_align(st.io.ids.down(), T, S, G, st.io.off.down(), st.io.rows.down(), st.io.inv.down());
    report_exact("add_rmsnorm_router without f32/rstd", name + ": outputs that differ", diff);
  }
  {
    const auto h = ws.down();
    size_t nz = 0;
    for (size_t i = 0; i < 64; ++i) nz += h[i] != 0;
    report_exact("add_rmsnorm_router counter", "workspace header zero after all launches", nz);
  }
  // A smaller cluster (the bench hook, C = 5 at H 5120): the formulas hold.
  {
    RouterCase c{24, 20, 5120, 8, 1, 1};
    c.n_local = 20;
    c.shared_local = 20;
    const int T = c.T, H = c.H, S = case_slots(c), G = case_groups(c);
    const size_t n = (size_t)T * H;
    std::vector<float> h0(n), w(H), W((size_t)c.E * H), bias(c.E);
    for (auto& x : h0) x = randn();
    for (auto& x : w) x = bf16_round(randu(0.5f, 1.5f));
    for (auto& x : W) x = randn() * 0.02f;
    for (auto& x : bias) x = randn() * 0.1f;
    Dev<float> dh(h0), dw(w), dW(W), db(bias), y(n), s(T);
    Dev<uint8_t> q(n);
    FusedIO io(T, c.K, S, G);
    io.prepare(-1);
    AddNormArgs a;
    a.h = dh.p;
    a.weight = dw.p;
    a.rows = T;
    a.hidden = H;
    a.out_f32 = y.p;
    a.out_q = q.p;
    a.out_scale = s.p;
    add_rmsnorm_router_set_cluster(5);
    const cudaError_t e = add_rmsnorm_router(a, fused_args(c, nullptr, dW.p, db.p, io, ws.p), 0);
    add_rmsnorm_router_set_cluster(0);
    CK(e);
    CK(cudaDeviceSynchronize());
    const auto gy = y.down();
    size_t bad = 0;
    for (int t = 0; t < T; ++t) bad += norm_row_exact(h0.data() + (size_t)t * H, w.data(), gy.data() + (size_t)t * H, H, 1e-5f) < 0;
    bad += check_align(io.ids.down(), T, S, G, io.off.down(), io.rows.down(), io.inv.down());
    report_exact("add_rmsnorm_router C=5", fmt("T=%d: rows no r fits + align errors", T), bad);
  }
  // Refused: 1 or 65 rows, 33 experts, H % 128, rows != T, row_index, keep_h.
  {
    RouterCase c{8, 20, 5120, 8, 1, 1};
    c.n_local = 20;
    c.shared_local = 20;
    Dev<float> h((size_t)113 * 5120), w(5120), W((size_t)33 * 5120), bias(33), s(113);
    Dev<uint8_t> q((size_t)113 * 5120);
    Dev<int> ix(8);
    FusedIO io(113, 8, 9, 21);
    AddNormArgs a;
    a.h = h.p;
    a.weight = w.p;
    a.rows = 8;
    a.hidden = 5120;
    a.out_q = q.p;
    a.out_scale = s.p;
    auto run = [&](const AddNormArgs& n, RouterCase rc) {
      return add_rmsnorm_router(n, fused_args(rc, nullptr, W.p, bias.p, io, ws.p), 0);
    };
    bool ok = !add_rmsnorm_router_supported(1, 20, 5120) && !add_rmsnorm_router_supported(113, 20, 5120) &&
              !add_rmsnorm_router_supported(8, 33, 5120) && !add_rmsnorm_router_supported(8, 20, 5120 + 64);
    RouterCase c1 = c;
    c1.T = 1;
    AddNormArgs a1 = a;
    a1.rows = 1;
    ok = ok && run(a1, c1) == cudaErrorNotSupported;
    AddNormArgs b = a;
    b.rows = 7;
    ok = ok && run(b, c) == cudaErrorInvalidValue;
    b = a;
    b.row_index = ix.p;
    ok = ok && run(b, c) == cudaErrorInvalidValue;
    b = a;
    b.keep_h = true;
    ok = ok && run(b, c) == cudaErrorInvalidValue;
    b = a;
    b.out_q = nullptr;
    ok = ok && run(b, c) == cudaErrorInvalidValue;
    (void)cudaGetLastError();
    report_exact("add_rmsnorm_router refused", "T 1 / 113, E 33, H % 128, rows != T, row_index, keep_h, no out_q",
                 ok ? 0 : 1);
  }
}

static void check_router_topk() {
  struct C {
    int T, E, K, ng, tg, nv;
  };
  for (C c : {C{50, 160, 8, 1, 1, -1}, C{33, 16, 4, 4, 2, 20}, C{9, 256, 8, 8, 4, 0}, C{64, 20, 8, 1, 1, 63}}) {
    std::vector<float> lg((size_t)c.T * c.E), bias(c.E);
    for (auto& v : lg) v = randn() * 2;
    for (auto& v : bias) v = randn() * 0.1f;
    const int K = c.K, S = K + 1, nl = c.E / 2;
    Dev<float> dl(lg), db(bias), w((size_t)c.T * S), pw((size_t)c.T * S);
    Dev<int> ids((size_t)c.T * S), g((size_t)c.T * K), pids((size_t)c.T * S), pg((size_t)c.T * K),
        dnv(std::vector<int>{c.nv});
    ids.poison();
    g.poison();
    w.poison();
    pids.poison();
    pg.poison();
    pw.poison();
    RouterArgs a;
    a.logits = dl.p;
    a.bias = db.p;
    a.T = c.T;
    a.E = c.E;
    a.top_k = K;
    a.n_group = c.ng;
    a.topk_group = c.tg;
    a.scale = 2.5f;
    a.expert_begin = nl;
    a.n_local = nl;
    a.shared_local = nl;
    a.ids = ids.p;
    a.w = w.p;
    a.topk_global = g.p;
    a.n_valid = c.nv >= 0 ? dnv.p : nullptr;
    CK(router_topk(a, 0));
    RouterArgs p = a;
    p.ids = pids.p;
    p.w = pw.p;
    p.topk_global = pg.p;
    p.n_valid = nullptr;
    prev::router_topk(p, 0);
    CK(cudaDeviceSynchronize());
    const auto hi = ids.down(), hp = pids.down(), hg = g.down(), hpg = pg.down();
    const auto hw = w.down(), hpw = pw.down();
    const int nv = c.nv < 0 ? c.T : std::min(c.nv, c.T);
    size_t bad = 0;
    for (int t = 0; t < c.T; ++t) {
      for (int j = 0; j < S; ++j) {
        const size_t i = (size_t)t * S + j;
        if (t < nv) bad += hi[i] != hp[i] || fbits(hw[i]) != fbits(hpw[i]);
        else bad += hi[i] != -1 || hw[i] != 0.f;
      }
      for (int k = 0; k < K; ++k) {
        const size_t i = (size_t)t * K + k;
        bad += t < nv ? hg[i] != hpg[i] : hg[i] != -1;
      }
    }
    report_exact("router_topk vs previous",
                 fmt("T=%d E=%d k=%d g%d/%d n_valid=%d: differ %zu", c.T, c.E, K, c.tg, c.ng, c.nv, bad), bad);
  }
}

// ------------------------------------------------------------ same results as before

static void check_quant_prev() {
  for (int cols : {1536, 5120, 256, 4100, 7000}) {
    for (int rows : {1, 7, 64, 256}) {
      const int64_t ld = cols + (cols == 1536 ? 512 : 0);  // a strided case
      std::vector<float> x((size_t)rows * ld);
      for (int r = 0; r < rows; ++r) {
        const float mag = std::pow(10.f, randu(-4, 3));
        for (int64_t c = 0; c < ld; ++c) x[(size_t)r * ld + c] = r == 3 ? 0.f : randn() * mag;
      }
      Dev<float> dx(x), s1(rows), s2(rows);
      Dev<uint8_t> q1((size_t)rows * ld), q2((size_t)rows * ld);
      Dev<int> live(std::vector<int>{std::max(1, rows - 2)});
      q1.poison();
      q2.poison();
      s1.poison();
      s2.poison();
      const int* rd = rows > 4 ? live.p : nullptr;
      CK(quant_rows_fp8(dx.p, ld, rows, cols, q1.p, ld, s1.p, rd, 0));
      prev::quant_rows(dx.p, ld, rows, cols, q2.p, ld, s2.p, rd, 0);
      CK(cudaDeviceSynchronize());
      // The previous kernel divided by the scale; the codes are now v * (1 / s)
      // (common.cuh pack_e4m3x4): within one E4M3 step, scales bit for bit.
      const std::vector<uint8_t> c1 = q1.down(), c2 = q2.down();
      const size_t bad = count_fp8_far(c1, c2, s1.down(), s2.down(), 0.0);
      report_exact("quant_rows_fp8 vs previous",
                   fmt("%dx%d ld %lld%s: %zu codes moved one step, %zu further or scales apart", rows, cols,
                       (long long)ld, rd ? " rows_dev" : "", count_diff(c1, c2), bad),
                   bad);
    }
  }
  for (int inter : {1536, 256, 2052, 7000}) {
    // (4,000 rows: with rows_dev the CTAs stride over the live rows)
    for (int rows : {1, 64, 576, 4000}) {
      if (rows == 4000 && inter > 1536) continue;
      std::vector<float> gu((size_t)rows * 2 * inter);
      for (auto& v : gu) v = randn() * 3;
      Dev<float> dgu(gu), s1(rows), s2(rows);
      Dev<uint8_t> q1((size_t)rows * inter), q2((size_t)rows * inter);
      Dev<int> live(std::vector<int>{rows * 7 / 8});
      q1.poison();
      q2.poison();
      s1.poison();
      s2.poison();
      const int* rd = rows > 1 ? live.p : nullptr;
      CK(silu_mul_quant_fp8(dgu.p, rows, inter, q1.p, s1.p, rd, 0));
      prev::silu_mul_quant(dgu.p, rows, inter, q2.p, s2.p, rd, 0);
      CK(cudaDeviceSynchronize());
      {
        const std::vector<uint8_t> c1 = q1.down(), c2 = q2.down();  // (as quant_rows above)
        const size_t bad = count_fp8_far(c1, c2, s1.down(), s2.down(), 0.0);
        report_exact("silu_mul_quant vs previous",
                     fmt("%dx%d%s: %zu codes moved one step, %zu further or scales apart", rows, inter,
                         rd ? " rows_dev" : "", count_diff(c1, c2), bad),
                     bad);
      }
      {
        // Unscaled GEMM sums, the scales applied by the kernel: bit for bit
        // gemm_fp8_epilogue then the plain kernel (refused past 4096 columns
        // and for a w_scale that is not 16-byte aligned).
        std::vector<float> xsv(rows), wsv(2 * inter + 4);
        for (auto& v : xsv) v = randu(1e-3f, 2.f);
        for (auto& v : wsv) v = randu(1e-3f, 2.f);
        Dev<float> dxs(xsv), dws(wsv), scaled((size_t)rows * 2 * inter);
        q1.poison();
        q2.poison();
        s1.poison();
        s2.poison();
        const bool sup = silu_mul_quant_fp8_scaled_supported(inter, dws.p);
        const cudaError_t es = silu_mul_quant_fp8_scaled(dgu.p, rows, inter, dxs.p, dws.p, q1.p, s1.p, 0);
        const bool mis_refused = !silu_mul_quant_fp8_scaled_supported(inter, dws.p + 1) &&
                                 silu_mul_quant_fp8_scaled(dgu.p, rows, inter, dxs.p, dws.p + 1, q1.p, s1.p, 0) ==
                                     cudaErrorInvalidValue;
        report_exact("silu_mul_quant scaled refusal", fmt("%dx%d: misaligned w_scale%s", rows, inter,
                                                           sup ? "" : ", too wide"),
                     mis_refused && (sup ? inter <= 4096 : inter > 4096 && es == cudaErrorInvalidValue) ? 0 : 1);
        if (sup) {
          CK(es);
          CK(gemm_fp8_epilogue(dgu.p, 1, rows, 2 * inter, dxs.p, dws.p, nullptr, scaled.p, 2 * inter, 0));
          CK(silu_mul_quant_fp8(scaled.p, rows, inter, q2.p, s2.p, nullptr, 0));
          CK(cudaDeviceSynchronize());
          const size_t bsc = count_diff(q1.down(), q2.down()) + count_diff(s1.down(), s2.down());
          report_exact("silu_mul_quant scaled vs epilogue+silu", fmt("%dx%d: differ %zu", rows, inter, bsc), bsc);
        }
      }
      // BF16 rows: the FP32 kernel on the same values widened, within its
      // fast SiLU (quant.cu silu_fast: every code within one E4M3 step,
      // scales within 1e-5; refused past 4096 columns, where the FP32 form
      // goes scalar).
      std::vector<__nv_bfloat16> g16;
      std::vector<float> gw;
      round_bf16(gu, g16, gw);
      Dev<__nv_bfloat16> dg16(g16);
      Dev<float> dgw(gw);
      q1.poison();
      q2.poison();
      s1.poison();
      s2.poison();
      const cudaError_t e16 = silu_mul_quant_fp8(dg16.p, rows, inter, q1.p, s1.p, rd, 0);
      if (inter > 4096) {
        report_exact("silu_mul_quant BF16 refusal", fmt("%dx%d", rows, inter),
                     e16 == cudaErrorInvalidValue && !silu_mul_quant_bf16_supported(inter) ? 0 : 1);
        continue;
      }
      if (!silu_mul_quant_bf16_supported(inter)) {
        report_exact("silu_mul_quant BF16 supported", fmt("inter %d", inter), 1);
        continue;
      }
      CK(e16);
      CK(silu_mul_quant_fp8(dgw.p, rows, inter, q2.p, s2.p, rd, 0));
      CK(cudaDeviceSynchronize());
      const std::vector<uint8_t> c1 = q1.down(), c2 = q2.down();
      const size_t bad16 = count_fp8_far(c1, c2, s1.down(), s2.down(), 1e-5);
      report_exact("silu_mul_quant BF16 rows vs FP32",
                   fmt("%dx%d%s: %zu codes of %zu moved one step, %zu further or scales apart", rows, inter,
                       rd ? " rows_dev" : "", count_diff(c1, c2), c1.size(), bad16),
                   bad16);
      // BF16 rows that are the activations already ([rows][inter], the
      // SiLU-fused gate|up's output): quant_rows_fp8 on the widened values
      // bit for bit, codes and scales, the rows past rows_dev untouched in both.
      {
        Dev<__nv_bfloat16> da(std::vector<__nv_bfloat16>(g16.begin(), g16.begin() + (size_t)rows * inter));
        Dev<float> daw(std::vector<float>(gw.begin(), gw.begin() + (size_t)rows * inter));
        q1.poison();
        q2.poison();
        s1.poison();
        s2.poison();
        CK(quant_rows_fp8_bf16(da.p, rows, inter, q1.p, s1.p, rd, 0));
        CK(quant_rows_fp8(daw.p, inter, rows, inter, q2.p, inter, s2.p, rd, 0));
        CK(cudaDeviceSynchronize());
        const size_t bq = count_diff(q1.down(), q2.down()) + count_diff(s1.down(), s2.down());
        report_exact("quant_rows_fp8_bf16 vs FP32 rows",
                     fmt("%dx%d%s: codes or scales differ %zu", rows, inter, rd ? " rows_dev" : "", bq), bq);
      }
    }
  }
}

static void check_combine_prev() {
  for (int slots : {2, 9, 20}) {
    for (int T : {1, 64, 256}) {
      const int H = slots == 20 ? 1024 : 5120, R = T * slots;
      std::vector<float> y((size_t)R * H), w((size_t)T * slots);
      for (auto& v : y) v = randn();
      for (auto& v : w) v = randu(0.1f, 2.f);
      std::vector<int> inv(R);
      std::iota(inv.begin(), inv.end(), 0);
      std::shuffle(inv.begin(), inv.end(), rng);
      for (int i = 0; i < R; ++i)
        if (randi(0, 4) == 0) inv[i] = -1;  // non-local slots
      Dev<float> dy(y), dw(w), o1((size_t)T * H), o2((size_t)T * H);
      Dev<int> di(inv);
      o1.poison();
      o2.poison();
      CK(moe_combine(dy.p, di.p, dw.p, T, slots, H, o1.p, 0));
      prev::moe_combine(dy.p, di.p, dw.p, T, slots, H, o2.p, 0);
      CK(cudaDeviceSynchronize());
      const auto a = o1.down();
      size_t nan = 0;
      for (float v : a) nan += std::isnan(v);
      const size_t bad = count_diff(a, o2.down());
      report_exact("moe_combine vs previous", fmt("T=%d slots=%d H=%d: differ %zu unwritten %zu", T, slots, H,
                                                 bad, nan),
                   bad + nan);
    }
  }
}

// combine_add_rmsnorm against moe_combine then add_rmsnorm (the two kernels
// it replaces at the end of a MoE layer): h, the FP8 rows and scales, the
// FP32 / BF16 outputs bit for bit, with and without the shared expert's rows.
static void check_combine_norm() {
  for (int H : {5120, 4096, 132}) {
    for (int slots : {1, 2, 9, 32}) {
      for (int T : {1, 7, 64, 256}) {
        for (int with_add : {0, 1}) {
          const int R = T * slots;
          std::vector<float> y((size_t)R * H), w((size_t)T * slots), h0((size_t)T * H), wn(H),
              add((size_t)T * H);
          for (auto& v : y) v = randn();
          for (auto& v : h0) v = 4.f * randn();
          for (auto& v : add) v = randn();
          for (auto& v : w) v = randu(0.1f, 2.f);
          for (auto& v : wn) v = randu(0.5f, 1.5f);
          std::vector<int> inv(R);
          std::iota(inv.begin(), inv.end(), 0);
          std::shuffle(inv.begin(), inv.end(), rng);
          for (int i = 0; i < R; ++i)
            if (randi(0, 4) == 0) inv[i] = -1;  // non-local slots
          if (T >= 7)
            for (int j = 0; j < slots; ++j) inv[(size_t)3 * slots + j] = -1;  // a token with none
          Dev<float> dy(y), dw(w), dwn(wn), dadd(add), h1(h0), h2(h0), delta((size_t)T * H);
          Dev<float> f1((size_t)T * H), f2((size_t)T * H), s1(T), s2(T);
          Dev<uint8_t> q1((size_t)T * H), q2((size_t)T * H);
          Dev<__nv_bfloat16> b1((size_t)T * H), b2((size_t)T * H);
          Dev<int> di(inv);
          for (auto* d : {&f1, &f2, &s1, &s2}) d->poison();
          const float* ap = with_add ? dadd.p : nullptr;
          AddNormArgs a;
          a.weight = dwn.p;
          a.rows = T;
          a.hidden = H;
          a.eps = 1e-5f;
          a.h = h1.p;
          a.out_q = q1.p;
          a.out_scale = s1.p;
          a.out_f32 = f1.p;
          a.out_bf16 = b1.p;
          CK(combine_add_rmsnorm(dy.p, di.p, dw.p, slots, ap, a, 0));
          CK(moe_combine(dy.p, di.p, dw.p, T, slots, H, delta.p, 0, ap));
          a.h = h2.p;
          a.delta = delta.p;
          a.out_q = q2.p;
          a.out_scale = s2.p;
          a.out_f32 = f2.p;
          a.out_bf16 = b2.p;
          CK(add_rmsnorm(a, 0));
          CK(cudaDeviceSynchronize());
          size_t nan = 0;
          for (float v : f1.down()) nan += std::isnan(v);
          const size_t bad = count_diff(h1.down(), h2.down()) + count_diff(f1.down(), f2.down()) +
                             count_diff(s1.down(), s2.down()) + count_diff(q1.down(), q2.down());
          const auto bb1 = b1.down(), bb2 = b2.down();
          size_t badb = 0;
          for (size_t i = 0; i < bb1.size(); ++i) badb += fbits(__bfloat162float(bb1[i])) != fbits(__bfloat162float(bb2[i]));
          report_exact("combine_add_rmsnorm vs combine + add_rmsnorm",
                       fmt("H=%d slots=%d T=%d add=%d: differ %zu bf16 %zu unwritten %zu", H, slots, T, with_add,
                           bad, badb, nan),
                       bad + badb + nan);
          // BF16 expert rows: bit for bit the FP32 kernel on the same values widened.
          if (slots == 1 || slots == 9) {
            std::vector<__nv_bfloat16> y16;
            std::vector<float> yw;
            round_bf16(y, y16, yw);
            Dev<__nv_bfloat16> dy16(y16);
            Dev<float> dyw(yw), h3(h0), h4(h0), s3(T), s4(T);
            Dev<uint8_t> q3((size_t)T * H), q4((size_t)T * H);
            AddNormArgs c = a;
            c.delta = nullptr;
            c.out_f32 = f1.p;
            c.out_bf16 = nullptr;
            c.h = h3.p;
            c.out_q = q3.p;
            c.out_scale = s3.p;
            CK(combine_add_rmsnorm(dy16.p, di.p, dw.p, slots, ap, c, 0));
            AddNormArgs c2 = c;
            c2.out_f32 = f2.p;
            c2.h = h4.p;
            c2.out_q = q4.p;
            c2.out_scale = s4.p;
            CK(combine_add_rmsnorm(dyw.p, di.p, dw.p, slots, ap, c2, 0));
            CK(cudaDeviceSynchronize());
            const size_t bad16 = count_diff(h3.down(), h4.down()) + count_diff(f1.down(), f2.down()) +
                                 count_diff(s3.down(), s4.down()) + count_diff(q3.down(), q4.down());
            report_exact("combine_add_rmsnorm BF16 rows vs FP32",
                         fmt("H=%d slots=%d T=%d add=%d: differ %zu", H, slots, T, with_add, bad16), bad16);
          }
        }
      }
    }
  }
  {  // refused shapes and arguments
    AddNormArgs a;
    a.rows = 1;
    a.hidden = 5120;
    Dev<float> h(5120), wn(5120);
    a.h = h.p;
    a.weight = wn.p;
    const bool refused = combine_add_rmsnorm(h.p, nullptr, h.p, 33, nullptr, a, 0) == cudaErrorInvalidValue &&
                         !combine_add_rmsnorm_supported(5120, 33) && !combine_add_rmsnorm_supported(5122, 9) &&
                         combine_add_rmsnorm_supported(5120, 9);
    a.delta = h.p;
    const bool refused_delta = combine_add_rmsnorm(h.p, nullptr, h.p, 9, nullptr, a, 0) == cudaErrorInvalidValue;
    report_exact("combine_add_rmsnorm refusals", "slots 33, H 5122, a.delta set", (refused && refused_delta) ? 0 : 1);
  }
}

static void check_embed_prev() {
  for (int H : {5120, 256, 130}) {
    const int V = 1000;
    std::vector<uint16_t> tab((size_t)V * H);
    for (auto& v : tab) v = bf16_bits(randn());
    for (int T : {1, 64, 256}) {
      std::vector<int> ids(T);
      for (auto& v : ids) v = randi(0, V - 1);
      Dev<uint16_t> dt(tab);
      Dev<int> di(ids);
      Dev<float> h1((size_t)T * H), h2((size_t)T * H);
      h1.poison();
      h2.poison();
      CK(embed_gather((const __nv_bfloat16*)dt.p, di.p, T, H, h1.p, 0));
      prev::embed_gather((const __nv_bfloat16*)dt.p, di.p, T, H, h2.p, 0);
      CK(cudaDeviceSynchronize());
      const auto a = h1.down();
      size_t bad = count_diff(a, h2.down());
      for (int t = 0; t < T; ++t)
        for (int c = 0; c < H; ++c)
          bad += fbits(a[(size_t)t * H + c]) != fbits(bf16_val(tab[(size_t)ids[t] * H + c]));
      report_exact("embed_gather vs previous", fmt("T=%d H=%d: differ %zu", T, H, bad), bad);
    }
  }
}

static void check_align_prev() {
  for (int G : {21, 161, 1024}) {
    for (int T : {1, 64, 256, 1000}) {
      const int S = 9, n = T * S;
      std::vector<int> ids(n);
      for (int t = 0; t < T; ++t) {
        for (int j = 0; j < S - 1; ++j) ids[(size_t)t * S + j] = randi(-1, G - 2);
        ids[(size_t)t * S + S - 1] = G - 1;  // the shared expert: every token
      }
      Dev<int> di(ids), o1(G + 1), r1(n), i1(n), o2(G + 1), r2(n), i2(n);
      o1.poison();
      r1.poison();
      i1.poison();
      o2.poison();
      CK(moe_align(di.p, T, S, G, o1.p, r1.p, i1.p, 0));
      prev::moe_align(di.p, T, S, G, o2.p, r2.p, i2.p, 0);
      CK(cudaDeviceSynchronize());
      const auto off = o1.down();
      size_t bad = count_diff(off, o2.down());
      bad += check_align(ids, T, S, G, off, r1.down(), i1.down());
      report_exact("moe_align", fmt("T=%d slots=%d G=%d: offsets vs previous + sets/inv, bad %zu", T, S, G, bad),
                   bad);
    }
  }
}

// ------------------------------------------------------------ bench

// 20 calls captured in one CUDA graph, per-call time, median of 11 replays
// after warm-up.
template <typename F>
static float time_graph_us(F f, int launches = 20, int reps = 11) {
  return graph_replay_ms([&](int, cudaStream_t s) { f(s); }, launches, reps, 3, 3) * 1000.f / launches;
}

static void bench_row(const char* what, int T, float prev_us, float new_us) {
  if (prev_us > 0)
    printf("%-44s T=%-4d prev %8.2f us   new %8.2f us   x%.2f\n", what, T, prev_us, new_us, prev_us / new_us);
  else
    printf("%-44s T=%-4d               new %8.2f us\n", what, T, new_us);
  fflush(stdout);
}

// router_fused's arguments in the benches: top-k of E, rank 0's NL experts and
// the shared expert (group NL), scale 2.5, no padding rows.
static RouterFusedArgs bench_router_args(int T, int E, int K, int NL, int H, const float* x, const float* W,
                                         const float* bias, int* ids, float* w, int* off, int* rows, int* inv,
                                         void* ws) {
  RouterFusedArgs a;
  a.sel.bias = bias;
  a.sel.T = T;
  a.sel.E = E;
  a.sel.top_k = K;
  a.sel.scale = 2.5f;
  a.sel.n_local = NL;
  a.sel.shared_local = NL;
  a.sel.ids = ids;
  a.sel.w = w;
  a.x = x;
  a.W = W;
  a.H = H;
  a.n_groups = NL + 1;
  a.offsets = off;
  a.sorted_rows = rows;
  a.inv = inv;
  a.workspace = ws;
  return a;
}

// The post-attention norm + router at decode sizes: add_rmsnorm (o_proj's 3
// K-split slices summed, FP8 + FP32 rows) + router_fused against
// add_rmsnorm_router (C = 8, and the hook's C = 5 and 4), E = 20, top-1 of the
// rank's 20 experts + the shared one. (--bench-norm-router: this alone.)
static void bench_norm_router() {
  const int H = 5120, NL = 20, S = 2, G = NL + 1, E = 20, splits = 3, Tmax = 64;
  const int64_t stride = (int64_t)Tmax * H;
  std::vector<float> hv((size_t)(splits + 1) * stride), wv(H), W((size_t)E * H), bias(E);
  for (auto& v : hv) v = randn();
  for (auto& v : wv) v = randu(0.5f, 1.5f);
  for (auto& v : W) v = randn() * 0.02f;
  for (auto& v : bias) v = randn() * 0.1f;
  Dev<float> sl(hv), h(stride), wn(wv), outf(stride), sc(Tmax), dW(W), db(bias), w((size_t)Tmax * S);
  CK(cudaMemcpy(h.p, sl.p + splits * stride, stride * 4, cudaMemcpyDeviceToDevice));
  Dev<uint8_t> q(stride);
  Dev<int> ids(Tmax * S), off(G + 1), rows(Tmax * S), inv(Tmax * S);
  Dev<char> ws(router_fused_workspace_bytes(Tmax, E));
  ws.zero();
  for (int T : {2, 4, 8, 16, 32, 64}) {
    AddNormArgs n;
    n.h = h.p;
    n.delta = sl.p;
    n.delta_splits = splits;
    n.delta_split_stride = stride;
    n.weight = wn.p;
    n.rows = T;
    n.hidden = H;
    n.out_q = q.p;
    n.out_scale = sc.p;
    const RouterFusedArgs a = bench_router_args(T, E, 1, NL, H, outf.p, dW.p, db.p, ids.p, w.p, off.p, rows.p, inv.p, ws.p);
    AddNormArgs nc = n;
    nc.out_f32 = outf.p;
    const float tn = time_graph_us([&](cudaStream_t s) { CK(add_rmsnorm(nc, s)); });
    const float tc = time_graph_us([&](cudaStream_t s) {
      CK(add_rmsnorm(nc, s));
      CK(router_fused(a, s));
    });
    const float tf = time_graph_us([&](cudaStream_t s) { CK(add_rmsnorm_router(n, a, s)); });
    float tc5 = -1.f, tc4 = -1.f;
    for (int cl : {5, 4}) {
      if (cl == 4 && T > 4) continue;  // 8 rows of 1,280 columns: past a thread's 8 float4
      add_rmsnorm_router_set_cluster(cl);
      const float t = time_graph_us([&](cudaStream_t s) { CK(add_rmsnorm_router(n, a, s)); });
      (cl == 5 ? tc5 : tc4) = t;
    }
    add_rmsnorm_router_set_cluster(0);
    printf("%-44s T=%-4d norm %6.2f + router = %6.2f us   fused %6.2f us (C=5 %6.2f, C=4 %6.2f)   x%.2f\n",
           "add_rmsnorm(3 slices)+router E=20 top-1", T, tn, tc, tf, tc5, tc4, tc / tf);
    fflush(stdout);
  }
}

// The prefill post-attention norm (no delta; FP8 rows, scales and 1/rms out)
// at H 5,120: one row a CTA against several rows a CTA with the next row's
// loads ahead; the rows rotated over >= 120 MB so they come from HBM. Then
// the prefill's other row kernels of a MoE layer's end: combine_add_rmsnorm
// over BF16 expert rows and the experts' SiLU with rows_dev.
// (--bench-norm-rows: this alone.)
// Random residual rows (n floats) and norm weights (H) for the row benches.
static void random_rows_and_weights(size_t n, int H, std::vector<float>& hv, std::vector<float>& wv) {
  hv.resize(n);
  wv.resize(H);
  for (auto& v : hv) v = randn();
  for (auto& v : wv) v = randu(0.5f, 1.5f);
}

static void bench_norm_rows() {
  const int H = 5120;
  for (int T : {512, 2048, 8192}) {
    const size_t rowsz = (size_t)T * H;
    const int copies = std::max<int>(1, (int)((120u << 20) / (rowsz * 4)) + 1);
    std::vector<float> hv, wv;
    random_rows_and_weights(rowsz * copies, H, hv, wv);
    Dev<float> h(hv), w(wv), sc(T), rs(T);
    Dev<uint8_t> q(rowsz);
    auto args = [&](int i) {
      AddNormArgs a = fp8_norm_args(h.p + (size_t)(i % copies) * rowsz, w.p, T, H, q.p, sc.p);
      a.out_rstd = rs.p;
      return a;
    };
    float us[2];
    for (int form = 0; form < 2; ++form) {
      add_rmsnorm_set_rows_min(form == 0 ? 1 << 30 : 1);
      us[form] = graph_replay_ms([&](int i, cudaStream_t s) { CK(add_rmsnorm(args(i), s)); }, 20, 11, 3, 3) *
                 1000.f / 20;
      add_rmsnorm_set_rows_min(0);
    }
    const double mb = (double)T * (H * 4 + H + 8) / 1e6;
    printf("%-44s T=%-4d one row a CTA %8.2f us (%.0f%% of 4.46 TB/s)   rows a CTA %8.2f us (%.0f%%)\n",
           "add_rmsnorm H=5120 no delta -> fp8+rstd", T, us[0], mb / us[0] / 4.46 * 100, us[1],
           mb / us[1] / 4.46 * 100);
    fflush(stdout);
  }
  // The end of a prefill MoE layer: combine_add_rmsnorm over BF16 expert rows,
  // 9 slots of which two are filled (a routed expert's and the shared one's),
  // h and the expert rows rotated over copies so they come from HBM.
  for (int T : {512, 2048, 8192}) {
    const size_t rowsz = (size_t)T * H;
    const int copies = std::max<int>(1, (int)((160u << 20) / (rowsz * 8)) + 1);
    std::vector<float> hv, wv;
    random_rows_and_weights(rowsz * copies, H, hv, wv);
    std::vector<__nv_bfloat16> yv(2 * rowsz * copies);
    for (auto& v : yv) v = __float2bfloat16(randn());
    std::vector<int> inv((size_t)T * 9, -1);
    std::vector<float> wr((size_t)T * 9, 0.f);
    for (int t = 0; t < T; ++t) {
      inv[(size_t)t * 9 + t % 8] = t, wr[(size_t)t * 9 + t % 8] = 0.7f;
      inv[(size_t)t * 9 + 8] = T + t, wr[(size_t)t * 9 + 8] = 1.f;
    }
    Dev<float> h(hv), w(wv), sc(T), dw(wr);
    Dev<__nv_bfloat16> y(yv);
    Dev<int> di(inv);
    Dev<uint8_t> q(rowsz);
    const float us = graph_replay_ms([&](int i, cudaStream_t s) {
                       const AddNormArgs a = fp8_norm_args(h.p + (size_t)(i % copies) * rowsz, w.p, T, H, q.p, sc.p);
                       CK(combine_add_rmsnorm(y.p + (size_t)(i % copies) * 2 * rowsz, di.p, dw.p, 9, nullptr, a, s));
                     }, 20, 11, 3, 3) * 1000.f / 20;
    const double mb = (double)T * (H * 4 * 2 + H * 2 * 2 + H + 4) / 1e6;
    printf("%-44s T=%-4d %8.2f us (%.0f%% of 4.46 TB/s)\n", "combine_add_rmsnorm H=5120 bf16 rows, 2 of 9", T, us,
           mb / us / 4.46 * 100);
    fflush(stdout);
  }
  // The prefill experts' SiLU: BF16 gate|up rows, 9 slots a token launched,
  // 2 a token live (rows_dev), the rows rotated over copies.
  for (int T : {512, 2048, 8192}) {
    const int I = 1536, live = 2 * T;
    const size_t rowsz = (size_t)live * 2 * I;
    const int copies = std::max<int>(1, (int)((100u << 20) / (rowsz * 2)) + 1);
    std::vector<__nv_bfloat16> gv(rowsz * copies);
    for (auto& v : gv) v = __float2bfloat16(randn());
    Dev<__nv_bfloat16> g(gv);
    Dev<uint8_t> q((size_t)live * I);
    Dev<float> sc(live);
    Dev<int> rd(std::vector<int>{live});
    const float us = graph_replay_ms([&](int i, cudaStream_t s) {
                       CK(silu_mul_quant_fp8(g.p + (size_t)(i % copies) * rowsz, 9 * T, I, q.p, sc.p, rd.p, s));
                     }, 20, 11, 3, 3) * 1000.f / 20;
    const double mb = (double)live * (2 * I * 2 + I + 4) / 1e6;
    printf("%-44s T=%-4d %8.2f us (%.0f%% of 4.46 TB/s)\n", "silu_mul_quant_fp8 bf16 rows 9T launched, 2T", T, us,
           mb / us / 4.46 * 100);
    fflush(stdout);
  }
}

static void bench(cublasHandle_t cb) {
  const int H = 5120, NQ = 12, NKV = 1, D = 128, I = 1536, NL = 20, S = 9, G = NL + 1, K = 8;
  const int Tmax = 256;
  printf("\nbench: us per call, 20 calls in one CUDA graph, median of 11 replays\n");
  // Shared buffers at the largest shape.
  std::vector<float> hv((size_t)Tmax * S * H);
  for (auto& v : hv) v = randn();
  Dev<float> big(hv);                              // generic FP32 input rows
  Dev<float> h((size_t)Tmax * H), delta(hv), wn(H), outf((size_t)Tmax * S * H), sc((size_t)Tmax * S);
  Dev<uint8_t> q((size_t)Tmax * S * H);
  CK(cudaMemcpy(h.p, big.p, (size_t)Tmax * H * 4, cudaMemcpyDeviceToDevice));
  {
    std::vector<float> w(H);
    for (auto& v : w) v = randu(0.5f, 1.5f);
    wn.up(w);
  }
  const int Ts[] = {1, 4, 16, 64, 256};

  for (int T : Ts) {  // add_rmsnorm: residual add, FP8 + FP32 out (the MoE layers' norm)
    AddNormArgs a = fp8_norm_args(h.p, wn.p, T, H, q.p, sc.p);
    a.delta = delta.p;
    a.out_f32 = outf.p;
    const float tp = time_graph_us([&](cudaStream_t s) { prev::add_rmsnorm(a, s); });
    const float tn = time_graph_us([&](cudaStream_t s) { CK(add_rmsnorm(a, s)); });
    bench_row("add_rmsnorm H=5120 +delta -> fp8+f32", T, tp, tn);
  }
  {  // the end of a MoE layer: moe_combine + add_rmsnorm vs combine_add_rmsnorm (one routed slot + shared)
    std::vector<int> inv((size_t)Tmax * S, -1);
    std::vector<float> w((size_t)Tmax * S, 0.5f);
    for (int t = 0; t < Tmax; ++t) inv[(size_t)t * S + t % S] = t, inv[(size_t)t * S + S - 1] = Tmax + t;
    Dev<int> di(inv);
    Dev<float> dw(w);
    for (int T : Ts) {
      const AddNormArgs a = fp8_norm_args(h.p, wn.p, T, H, q.p, sc.p);
      AddNormArgs b = a;
      b.delta = outf.p;
      const float tp = time_graph_us([&](cudaStream_t s) {
        CK(moe_combine(big.p, di.p, dw.p, T, S, H, outf.p, s));
        CK(add_rmsnorm(b, s));
      });
      const float tn = time_graph_us([&](cudaStream_t s) { CK(combine_add_rmsnorm(big.p, di.p, dw.p, S, nullptr, a, s)); });
      bench_row("moe_combine+add_rmsnorm (prev) vs fused, H=5120 9 slots", T, tp, tn);
    }
  }
  for (int T : Ts) {  // fp8 only (the attention input norm)
    AddNormArgs a = fp8_norm_args(h.p, wn.p, T, H, q.p, sc.p);
    a.delta = delta.p;
    const float tp = time_graph_us([&](cudaStream_t s) { prev::add_rmsnorm(a, s); });
    const float tn = time_graph_us([&](cudaStream_t s) { CK(add_rmsnorm(a, s)); });
    bench_row("add_rmsnorm H=5120 +delta -> fp8", T, tp, tn);
  }
  {  // qk rope: 12 q + 1 kv heads, BF16 paged cache
    const int bs = 16, nblocks = 4096;
    std::vector<float> qn(D), kn(D);
    for (auto& v : qn) v = randu(0.5f, 1.5f);
    for (auto& v : kn) v = randu(0.5f, 1.5f);
    auto invf = make_inv_freq(64, 1e6f);
    std::vector<int> pos(Tmax), slots(Tmax);
    for (int t = 0; t < Tmax; ++t) {
      pos[t] = randi(0, 32767);
      slots[t] = t * 37 % (nblocks * bs);
    }
    Dev<float> dqn(qn), dkn(kn), dinv(invf), qo((size_t)Tmax * NQ * D);
    Dev<int> dpos(pos), dslots(slots);
    Dev<uint16_t> kc((size_t)nblocks * bs * D), vc((size_t)nblocks * bs * D);
    QkRopeArgs base;
    base.qkv = big.p;
    base.n_q_heads = NQ;
    base.n_kv_heads = NKV;
    base.q_norm = dqn.p;
    base.k_norm = dkn.p;
    base.inv_freq = dinv.p;
    base.positions = dpos.p;
    base.slots = dslots.p;
    base.block_size = bs;
    base.q_out = qo.p;
    base.k_cache = kc.p;
    base.v_cache = vc.p;
    for (int T : Ts) {
      QkRopeArgs a = base;
      a.T = T;
      const float tp = time_graph_us([&](cudaStream_t s) { prev::qk_rope(a, s); });
      const float tn = time_graph_us([&](cudaStream_t s) { CK(qk_norm_rope_kv_write(a, s)); });
      bench_row("qk_norm_rope_kv_write 12q+1kv bf16", T, tp, tn);
    }
    // Prefill sizes, the GEMM's epilogue folded in (the step's form past the
    // streaming kernels): one token a CTA against the default (4 from 512);
    // three copies of the q|k|v rows rotate (14.7 MB each at 2,048 tokens).
    const int Tp = 2048, copies = 3;
    const size_t rowf = (size_t)(NQ + 2 * NKV) * D;
    std::vector<int> ppos(Tp), pslots(Tp);
    for (int t = 0; t < Tp; ++t) {
      ppos[t] = t;
      pslots[t] = t;
    }
    Dev<int> dppos(ppos), dpslots(pslots);
    Dev<float> xs(Tp), ws(rowf), bias(rowf), qp((size_t)Tp * NQ * D);
    {
      std::vector<float> v(Tp, 1.f / 448.f), w(rowf, 1.f / 448.f), b(rowf, 0.01f);
      xs.up(v);
      ws.up(w);
      bias.up(b);
    }
    auto rope_args = [&](int i) {
      QkRopeArgs a = base;
      a.qkv = big.p + (size_t)(i % copies) * Tp * rowf;
      a.T = Tp;
      a.positions = dppos.p;
      a.slots = dpslots.p;
      a.q_out = qp.p;
      a.x_scale = xs.p;
      a.w_scale = ws.p;
      a.bias = bias.p;
      return a;
    };
    for (int tpc : {1, 2, 4, 8}) {
      qk_rope_set_tokens_per_cta(tpc);
      const float us = graph_replay_ms([&](int i, cudaStream_t s) { CK(qk_norm_rope_kv_write(rope_args(i), s)); },
                                       20, 11, 3, 3) *
                       1000.f / 20;
      qk_rope_set_tokens_per_cta(0);
      const double mb = (double)Tp * (rowf * 4 + NQ * D * 4 + 2 * NKV * D * 2) / 1e6;
      printf("%-44s T=%-4d %d token(s) a CTA %8.2f us (%.1f MB: %.0f%% of 4.46 TB/s)\n",
             "qk_norm_rope_kv_write prefill, epilogue folded", Tp, tpc, us, mb, mb / us / 4.46 * 100);
      fflush(stdout);
    }
  }
  for (int T : Ts) {
    const int cols = NQ * D;
    const float tp = time_graph_us(
        [&](cudaStream_t s) { prev::quant_rows(big.p, cols, T, cols, q.p, cols, sc.p, nullptr, s); });
    const float tn = time_graph_us(
        [&](cudaStream_t s) { CK(quant_rows_fp8(big.p, cols, T, cols, q.p, cols, sc.p, nullptr, s)); });
    bench_row("quant_rows_fp8 cols=1536", T, tp, tn);
  }
  for (int T : Ts) {
    const float tp = time_graph_us([&](cudaStream_t s) { prev::quant_rows(big.p, H, T, H, q.p, H, sc.p, nullptr, s); });
    const float tn =
        time_graph_us([&](cudaStream_t s) { CK(quant_rows_fp8(big.p, H, T, H, q.p, H, sc.p, nullptr, s)); });
    bench_row("quant_rows_fp8 cols=5120", T, tp, tn);
  }
  Dev<int> rows_dev(1);
  for (int T : Ts) {  // shared expert / dense MLP: T rows
    const float tp = time_graph_us([&](cudaStream_t s) { prev::silu_mul_quant(big.p, T, I, q.p, sc.p, nullptr, s); });
    const float tn =
        time_graph_us([&](cudaStream_t s) { CK(silu_mul_quant_fp8(big.p, T, I, q.p, sc.p, nullptr, s)); });
    bench_row("silu_mul_quant_fp8 inter=1536", T, tp, tn);
  }
  for (int T : Ts) {  // routed experts: T*9 rows launched, T*9 live (rows_dev)
    rows_dev.up({T * S});
    const float tp =
        time_graph_us([&](cudaStream_t s) { prev::silu_mul_quant(big.p, T * S, I, q.p, sc.p, rows_dev.p, s); });
    const float tn =
        time_graph_us([&](cudaStream_t s) { CK(silu_mul_quant_fp8(big.p, T * S, I, q.p, sc.p, rows_dev.p, s)); });
    bench_row("silu_mul_quant_fp8 inter=1536 rows=9T", T, tp, tn);
  }
  for (int slots : {2, 9}) {
    for (int T : Ts) {
      std::vector<int> inv(T * slots);
      std::iota(inv.begin(), inv.end(), 0);
      std::shuffle(inv.begin(), inv.end(), rng);
      std::vector<float> w(T * slots, 0.5f);
      Dev<int> di(inv);
      Dev<float> dw(w);
      const float tp = time_graph_us([&](cudaStream_t s) { prev::moe_combine(big.p, di.p, dw.p, T, slots, H, outf.p, s); });
      const float tn =
          time_graph_us([&](cudaStream_t s) { CK(moe_combine(big.p, di.p, dw.p, T, slots, H, outf.p, s)); });
      bench_row(slots == 2 ? "moe_combine slots=2 H=5120" : "moe_combine slots=9 H=5120", T, tp, tn);
    }
  }
  {
    const int V = 8192;
    Dev<uint16_t> tab((size_t)V * H);
    tab.zero();
    std::vector<int> ids(Tmax);
    for (auto& v : ids) v = randi(0, V - 1);
    Dev<int> di(ids);
    for (int T : Ts) {
      const float tp = time_graph_us(
          [&](cudaStream_t s) { prev::embed_gather((const __nv_bfloat16*)tab.p, di.p, T, H, outf.p, s); });
      const float tn = time_graph_us(
          [&](cudaStream_t s) { CK(embed_gather((const __nv_bfloat16*)tab.p, di.p, T, H, outf.p, s)); });
      bench_row("embed_gather H=5120", T, tp, tn);
    }
  }
  {
    std::vector<int> ids(Tmax * S);
    for (int t = 0; t < Tmax; ++t) {
      std::vector<int> e(NL);
      std::iota(e.begin(), e.end(), 0);
      std::shuffle(e.begin(), e.end(), rng);
      for (int j = 0; j < K; ++j) ids[t * S + j] = j < 2 ? e[j] : -1;  // ~1/8 of the experts local
      ids[t * S + K] = NL;
    }
    Dev<int> di(ids), off(G + 1), rows(Tmax * S), inv(Tmax * S);
    for (int T : Ts) {
      const float tp =
          time_graph_us([&](cudaStream_t s) { prev::moe_align(di.p, T, S, G, off.p, rows.p, inv.p, s); });
      const float tn =
          time_graph_us([&](cudaStream_t s) { CK(moe_align(di.p, T, S, G, off.p, rows.p, inv.p, s)); });
      bench_row("moe_align slots=9 G=21", T, tp, tn);
    }
  }
  // Router: fused vs cuBLAS SGEMM + router_topk + moe_align; the fused router's
  // last-CTA form (on its own plan: the kernel before clusters) and cluster
  // form (clusters up to the device's limit, and at most the portable 8).
  const int router_Ts[] = {1, 4, 16, 64, 128, 256};
  for (int E : {20, 160}) {
    std::vector<float> W((size_t)E * H), bias(E);
    for (auto& v : W) v = randn() * 0.02f;
    for (auto& v : bias) v = randn() * 0.1f;
    Dev<float> dW(W), db(bias), logits((size_t)Tmax * E), w((size_t)Tmax * S);
    Dev<int> ids(Tmax * S), off(G + 1), rows(Tmax * S), inv(Tmax * S);
    Dev<char> ws(router_fused_workspace_bytes(Tmax, E));
    ws.zero();
    for (int T : router_Ts) {
      RouterCase c{T, E, H, K, 1, 1};
      c.n_local = NL;
      c.shared_local = NL;
      const RouterFusedArgs a = bench_router_args(T, E, K, NL, H, big.p, dW.p, db.p, ids.p, w.p, off.p, rows.p, inv.p, ws.p);
      const float tu = time_graph_us([&](cudaStream_t s) {
        run_unfused(cb, c, big.p, dW.p, db.p, logits.p, nullptr, ids.p, w.p, off.p, rows.p, inv.p, s);
      });
      const float tg = time_graph_us([&](cudaStream_t s) { CKS(gemm_f32_nt(cb, big.p, dW.p, logits.p, T, E, H, s)); });
      // One form under the hook: its time (-1 where the device cannot run it) and plan.
      auto timed = [&](int path, int max_cluster, RouterFusedPlan* plan) {
        const RouterFusedTuning tn{path, max_cluster};
        router_fused_set_tuning(&tn);
        float t = -1.f;
        const cudaError_t pe = router_fused_plan(T, E, H, plan);
        if (pe == cudaSuccess) t = time_graph_us([&](cudaStream_t s) { CK(router_fused(a, s)); });
        else if (pe != cudaErrorNotSupported) CK(pe);
        router_fused_set_tuning(nullptr);
        return t;
      };
      RouterFusedPlan p_last, p_cl, p_cl8, p_auto;
      const float tf = timed(3, 0, &p_last);
      const float tc = timed(1, 0, &p_cl);
      const float tc8 = timed(1, 8, &p_cl8);
      CK(router_fused_plan(T, E, H, &p_auto));
      printf("%-44s T=%-4d cuBLAS+topk+align %8.2f us (SGEMM alone %6.2f)   fused %8.2f us   x%.2f  "
             "router_fused_supported=%d\n",
             fmt("router E=%d H=%d k=8", E, H).c_str(), T, tu, tg, tf, tu / tf,
             (int)router_fused_supported(T, E, H));
      auto cell = [](float t, const RouterFusedPlan& p) {
        return t < 0 ? std::string("      n/a          ") : fmt("%8.2f us (C=%-2d ks=%-2d)", t, p.cluster, p.n_ks);
      };
      printf("%-44s T=%-4d last-CTA %8.2f us (ks=%-2d)   cluster %s   cluster<=8 %s   default: %s\n",
             fmt("  router_fused forms E=%d", E).c_str(), T, tf, p_last.n_ks, cell(tc, p_cl).c_str(),
             cell(tc8, p_cl8).c_str(), p_auto.cluster ? fmt("cluster C=%d", p_auto.cluster).c_str() : "last-CTA");
      fflush(stdout);
    }
  }
  bench_norm_router();
  bench_norm_rows();
  // Prefill sizes: the post-attention norm (FP8 rows + FP32 rows) and the
  // SGEMM router logits against the norm writing its per-row factors and
  // router_logits_normed reading the residual rows; three copies of the rows
  // rotate so L2 does not hold them (42 MB each at T = 2048).
  for (int T : {512, 1024, 2048, 8192}) {
    const int E = 20, copies = 3;
    const size_t n = (size_t)T * H;
    Dev<float> hh(n * copies), yf(n), lw((size_t)E * H), lw32((size_t)E * H), lg((size_t)T * E), rs(T), scl(T);
    Dev<uint8_t> qq(n);
    {
      std::vector<float> v(n * copies);
      for (auto& x : v) x = randn();
      hh.up(v);
      std::vector<float> w((size_t)E * H);
      for (auto& x : w) x = randn() * 0.02f;
      lw32.up(w);  // FP32 router weights: every chunk takes the three products
      for (auto& x : w) x = bf16_round(x);
      lw.up(w);
    }
    auto norm_args = [&](int i, bool rstd) {
      AddNormArgs a = fp8_norm_args(hh.p + (size_t)(i % copies) * n, wn.p, T, H, qq.p, scl.p);
      if (rstd) a.out_rstd = rs.p;
      else a.out_f32 = yf.p;
      return a;
    };
    const float t_old = graph_replay_ms(
                            [&](int i, cudaStream_t s) {
                              CK(add_rmsnorm(norm_args(i, false), s));
                              CKS(gemm_f32_nt(cb, yf.p, lw.p, lg.p, T, E, H, s));
                            },
                            20, 11, 3, 3) *
                        1000.f / 20;
    // The norm writing its per-row factors, then the logits from the rows
    // with router weights W.
    auto time_norm_logits = [&](const float* W) {
      return graph_replay_ms(
                 [&](int i, cudaStream_t s) {
                   const AddNormArgs a = norm_args(i, true);
                   CK(add_rmsnorm(a, s));
                   CK(router_logits_normed(a.h, wn.p, rs.p, W, lg.p, T, E, H, s));
                 },
                 20, 11, 3, 3) *
             1000.f / 20;
    };
    const float t_new = time_norm_logits(lw.p);
    const float t_norm = graph_replay_ms([&](int i, cudaStream_t s) { CK(add_rmsnorm(norm_args(i, true), s)); },
                                         20, 11, 3, 3) *
                         1000.f / 20;
    const float t_new32 = time_norm_logits(lw32.p);
    router_logits_normed_force_fma(true);
    const float t_fma = time_norm_logits(lw.p);
    router_logits_normed_force_fma(false);
    // Both in one launch (rmsnorm_router_logits), as the runtime runs them.
    const float t_one = graph_replay_ms(
                            [&](int i, cudaStream_t s) {
                              CK(rmsnorm_router_logits(norm_args(i, true), lw.p, lg.p, E, s));
                            },
                            20, 11, 3, 3) *
                        1000.f / 20;
    printf("%-44s T=%-4d norm(fp8+f32)+SGEMM %8.2f us   norm(fp8+rstd)+logits: 3xTF32 %8.2f us (F32 W %8.2f), "
           "FMA %8.2f us (norm alone %6.2f)   one launch %8.2f us   x%.2f\n",
           "prefill router E=20 H=5120", T, t_old, t_new, t_new32, t_fma, t_norm, t_one, t_old / t_new);
    fflush(stdout);
  }
}

// ------------------------------------------------------------ spec_chain_rows

// The rows of chained draft passes j = 2, 3 against a CPU statement of the
// rule (kernels.h): positions from the last valid row, slots through the
// block table, no KV and no keys for padding entries and for entries past
// their propose count or their table, hidden inputs h + delta of the source
// row (bit-exact: one float add).
static void check_spec_chain_rows() {
  const int H = 520, bs = 16, cap = 8, n = 5, T = 24;
  std::vector<int> positions(T), mtp_rows(cap, 0), prev(cap), bt(64);
  for (int t = 0; t < T; ++t) positions[t] = 100 + 7 * t;
  for (int b = 0; b < 64; ++b) bt[b] = (b * 37 + 11) % 97;
  // Entry 2's table ends at its last valid position's block; entry 3 proposes
  // only 2 drafts.
  std::vector<glmk::SpecSeq> seqs(cap);
  for (int i = 0; i < n; ++i) {
    const int row = 3 * i + (i % 2);
    mtp_rows[i] = row;
    const int p = positions[row];
    seqs[i] = glmk::SpecSeq{0, 0, row, 8 * i, p / bs + (i == 2 ? 1 : 2), i == 3 ? 2 : 3, {0, 0}};
    prev[i] = 1000 + i;
  }
  std::vector<float> h((size_t)T * H), d((size_t)T * H);
  for (auto& v : h) v = randn();
  for (auto& v : d) v = randn();
  Dev<glmk::SpecSeq> dseqs(cap);
  dseqs.up(seqs);
  Dev<int> dn(std::vector<int>{n}), dpos(positions), drows(mtp_rows), dbt(bt), dprev(prev);
  Dev<float> dh(h), dd(d), dhid((size_t)cap * H);
  Dev<int> opos(cap), oslot(cap), oq(cap), oc(cap), ob(cap), otok(cap);
  size_t bad = 0;
  for (int j = 2; j <= 3; ++j) {
    for (Dev<int>* o : {&opos, &oslot, &oq, &oc, &ob, &otok}) o->poison();
    dhid.poison();
    glmk::ChainRows out{opos.p, oslot.p, oq.p, oc.p, ob.p, otok.p};
    CK(glmk::spec_chain_rows(dseqs.p, dn.p, cap, j, dpos.p, drows.p, dbt.p, bs, dh.p, dd.p, H, dprev.p, out,
                             dhid.p, 0));
    CK(cudaDeviceSynchronize());
    const auto gp = opos.down(), gs = oslot.down(), gq = oq.down(), gc = oc.down(), gb = ob.down(),
               gt = otok.down();
    const auto gh = dhid.down();
    for (int i = 0; i < cap; ++i) {
      int ep = 0, es = -1, ec = 0, eb = 0, et = 0;
      if (i < n) {
        const glmk::SpecSeq& q = seqs[i];
        ep = positions[mtp_rows[i]] + j - 1;
        const bool ok = j <= q.propose && ep / bs < q.bt_len;
        es = ok ? bt[q.bt_offset + ep / bs] * bs + ep % bs : -1;
        ec = ok ? ep + 1 : 0;
        eb = q.bt_offset;
        et = prev[i];
      }
      bad += (gp[i] != ep) + (gs[i] != es) + (gq[i] != i) + (gc[i] != ec) + (gb[i] != eb) + (gt[i] != et);
      const int src = j == 2 ? mtp_rows[i] : i;
      for (int c = 0; c < H; ++c) {
        const float e = i < n ? h[(size_t)src * H + c] + d[(size_t)src * H + c] : 0.f;
        bad += fbits(gh[(size_t)i * H + c]) != fbits(e);
      }
    }
  }
  report_exact("spec_chain_rows", fmt("H=%d cap=%d n=%d, passes 2 and 3: %zu values differ", H, cap, n, bad),
               bad);
}

int main(int argc, char** argv) {
  uint64_t seed = 0x5eed;
  bool do_bench = false, only_bench = false, only_nr = false, only_rows = false;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], nullptr, 0);
    else if (!strcmp(argv[i], "--bench")) do_bench = true;
    else if (!strcmp(argv[i], "--bench-only")) do_bench = only_bench = true;
    else if (!strcmp(argv[i], "--bench-norm-router")) only_nr = true;
    else if (!strcmp(argv[i], "--bench-norm-rows")) only_rows = true;
    else {
      fprintf(stderr,
              "usage: small_check [--seed N] [--bench] [--bench-only] [--bench-norm-router] [--bench-norm-rows]\n");
      return 2;
    }
  }
  rng.seed(seed);
  init_fp8();
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("device: %s, %d SMs, seed %llu\n", prop.name, prop.multiProcessorCount, (unsigned long long)seed);
  cublasHandle_t cb;
  CKB(cublasCreate(&cb));
  void* cublas_ws = nullptr;  // a fixed workspace, so cuBLAS calls can be graph-captured
  CK(cudaMalloc(&cublas_ws, 32u << 20));
  CKB(cublasSetWorkspace(cb, cublas_ws, 32u << 20));
  if (only_nr) {  // one bench block alone (for ncu)
    bench_norm_router();
    return failed_checks() ? 1 : 0;
  }
  if (only_rows) {
    bench_norm_rows();
    return failed_checks() ? 1 : 0;
  }
  if (!only_bench) {
    for (int H : {128, 132, 512, 5120, 6144, 8192, 8196, 130}) check_norm(H, H >= 5120 ? 9 : 5);
    check_norm_splits(5120, 64);
    for (int H : {5120, 896, 256}) check_norm_rows(H, H == 5120 ? 2048 : 777);
    check_norm_rows(5120, 3);  // fewer rows than CTAs
    check_norm_splits(512, 7);
    check_rope(9, 12, 1, false);
    check_rope(9, 12, 1, true);
    check_rope(256, 12, 1, false);
    check_rope(7, 24, 2, false);
    check_rope(601, 12, 1, false);  // 4 tokens a CTA by default (kRopeTokensMinT)
    check_router_topk();
    check_router_fused(cb);
    check_router_fused_forms();
    check_router_logits_normed(cb);
    check_rmsnorm_router_logits();
    check_add_rmsnorm_router(cb);
    check_quant_prev();
    check_combine_prev();
    check_combine_norm();
    check_embed_prev();
    check_align_prev();
    check_spec_chain_rows();
    CK(cudaDeviceSynchronize());
  }
  const int fails = failed_checks();
  if (do_bench) bench(cb);
  if (!only_bench) {
    print_table("err");
    print_summary("small_check", fails);
  }
  cublasDestroy(cb);
  cudaFree(cublas_ws);
  return fails ? 1 : 0;
}
