// norm_rope.cu — RMSNorm with fused residual add (and optional FP8 output), and
// the attention prologue: q/k per-head RMSNorm + partial NeoX RoPE + paged KV
// write in one pass (docs/model.md §3.2, §3.4).
#include <type_traits>

#include "common.cuh"

namespace glmk {
namespace {

constexpr int kNormThreads = 256;

__global__ void add_rmsnorm_kernel(AddNormArgs a) {
  pdl_launch_dependents();
  const int i = blockIdx.x;
  const int src = a.row_index ? a.row_index[i] : i;
  __shared__ float scratch[32];
  float* h = a.h + (int64_t)src * a.hidden;
  const float* d = a.delta ? a.delta + (int64_t)src * a.hidden : nullptr;
  // delta, its slices summed in order (AddNormArgs::delta_splits).
  auto dv = [&](int c) {
    float x = d[c];
    for (int s = 1; s < a.delta_splits; ++s) x += d[s * a.delta_split_stride + c];
    return x;
  };
  float ss = 0.f;
  for (int c = threadIdx.x; c < a.hidden; c += blockDim.x) {
    float v = h[c];
    if (d) {
      v += dv(c);
      if (!a.keep_h) h[c] = v;
    }
    ss += v * v;
  }
  ss = block_reduce(ss, scratch, SumOp());
  const float r = 1.0f / sqrtf(ss / (float)a.hidden + a.eps);
  if (a.out_rstd && threadIdx.x == 0) a.out_rstd[i] = r;
  // keep_h: the sum is recomputed (h was not written).
  auto hv = [&](int c) { return (d && a.keep_h) ? h[c] + dv(c) : h[c]; };
  float amax = 0.f;
  for (int c = threadIdx.x; c < a.hidden; c += blockDim.x) {
    const float y = a.weight[c] * (hv(c) * r);
    if (a.out_f32) a.out_f32[(int64_t)i * a.hidden + c] = y;
    if (a.out_bf16) a.out_bf16[(int64_t)i * a.hidden + c] = __float2bfloat16_rn(y);
    amax = fmaxf(amax, fabsf(y));
  }
  if (!a.out_q) return;
  amax = block_reduce(amax, scratch, MaxOp());
  const float s = fmaxf(amax / kFp8Max, kMinActScale), inv = 1.0f / s;
  for (int c = threadIdx.x; c < a.hidden; c += blockDim.x) {
    const float y = a.weight[c] * (hv(c) * r);
    a.out_q[(int64_t)i * a.hidden + c] = f32_to_e4m3(y * inv);
  }
  if (threadIdx.x == 0) a.out_scale[i] = s;
}

// Fast path: the row lives in registers (NV float4 per thread, hidden <= 8192
// with 256 threads), h, delta and weight are each read once with 16-byte loads,
// one block reduction for the sum of squares and one for the amax. Per element
// the float operations are those of add_rmsnorm_kernel (v = h + delta,
// y = weight * (h * r), s = max(amax / 448, min), q = e4m3(y / s)); only the
// order of the sum of squares differs (r may move by an ulp).
constexpr int kNormVecMax = 8;

// The normalisation of one row held in registers (v = h + delta, NV float4
// per thread, w the weights): sum of squares, y = weight * (h * r), the
// outputs, and with out_q the row quantized to E4M3. Shared by
// add_rmsnorm_vec_kernel and combine_add_rmsnorm_kernel, so both round alike.
template <int NV>
__device__ __forceinline__ void norm_row_tail(const AddNormArgs& a, int i, float4 (&v)[NV],
                                              const float4 (&w)[NV], float* scratch) {
  const int n4 = a.hidden >> 2;
  const int tid = threadIdx.x, nt = blockDim.x;
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int c = tid + k * nt;
    if (c < n4) ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
  }
  ss = block_reduce(ss, scratch, SumOp());
  const float r = 1.0f / sqrtf(ss / (float)a.hidden + a.eps);
  if (a.out_rstd && tid == 0) a.out_rstd[i] = r;
  float amax = 0.f;
  const int64_t orow = (int64_t)i * a.hidden;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int c = tid + k * nt;
    if (c < n4) {
      float4 y;
      y.x = w[k].x * (v[k].x * r);
      y.y = w[k].y * (v[k].y * r);
      y.z = w[k].z * (v[k].z * r);
      y.w = w[k].w * (v[k].w * r);
      v[k] = y;
      if (a.out_f32) reinterpret_cast<float4*>(a.out_f32 + orow)[c] = y;
      if (a.out_bf16) {
        __nv_bfloat162* b = reinterpret_cast<__nv_bfloat162*>(a.out_bf16 + orow) + 2 * c;
        b[0] = __floats2bfloat162_rn(y.x, y.y);
        b[1] = __floats2bfloat162_rn(y.z, y.w);
      }
      amax = fmaxf(amax, fmaxf(fmaxf(fabsf(y.x), fabsf(y.y)), fmaxf(fabsf(y.z), fabsf(y.w))));
    }
  }
  if (!a.out_q) return;
  amax = block_reduce(amax, scratch, MaxOp());
  const float s = fmaxf(amax / kFp8Max, kMinActScale), inv = 1.0f / s;
  uint32_t* q4 = reinterpret_cast<uint32_t*>(a.out_q + orow);
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int c = tid + k * nt;
    if (c < n4) q4[c] = pack_e4m3x4(v[k], inv);
  }
  if (tid == 0) a.out_scale[i] = s;
}

// At least kNormMinBlocks CTAs an SM: left alone ptxas gave the NV = 5 rows
// (H 5120) 97 registers, two CTAs an SM, and a 2,048-row prefill norm ran at
// a third of HBM (ncu on an H200, 2026-11-28: 25% occupancy, latency-bound);
// with 3, 80 registers and no spill. (4 spilled 120 bytes, and so do NV 6-8
// at 3: they keep ptxas's count, as does the combine kernel, which spills at 3.)
constexpr int kNormMinBlocks = 3;

template <int NV>
__global__ void __launch_bounds__(kNormThreads, NV <= 5 ? kNormMinBlocks : 1) add_rmsnorm_vec_kernel(AddNormArgs a) {
  pdl_launch_dependents();
  const int i = blockIdx.x;
  const int src = a.row_index ? a.row_index[i] : i;
  __shared__ float scratch[32];
  const int n4 = a.hidden >> 2;
  const int tid = threadIdx.x, nt = blockDim.x;
  float4* h4 = reinterpret_cast<float4*>(a.h + (int64_t)src * a.hidden);
  const float4* d4 = a.delta ? reinterpret_cast<const float4*>(a.delta + (int64_t)src * a.hidden) : nullptr;
  const float4* w4 = reinterpret_cast<const float4*>(a.weight);
  float4 v[NV], w[NV];
  // Every load is issued before the first store (h is written in place).
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int c = tid + k * nt;
    if (c < n4) v[k] = h4[c];
  }
  if (d4) {
    float4 d[NV];
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int c = tid + k * nt;
      if (c < n4) d[k] = __ldg(d4 + c);
    }
    // delta's further slices (AddNormArgs::delta_splits), added in order.
    for (int sl = 1; sl < a.delta_splits; ++sl) {
      const float4* ds = d4 + sl * (a.delta_split_stride >> 2);
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        const int c = tid + k * nt;
        if (c < n4) {
          const float4 e = __ldg(ds + c);
          d[k].x += e.x;
          d[k].y += e.y;
          d[k].z += e.z;
          d[k].w += e.w;
        }
      }
    }
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int c = tid + k * nt;
      if (c < n4) w[k] = __ldg(w4 + c);
    }
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int c = tid + k * nt;
      if (c < n4) {
        v[k].x = v[k].x + d[k].x;
        v[k].y = v[k].y + d[k].y;
        v[k].z = v[k].z + d[k].z;
        v[k].w = v[k].w + d[k].w;
        if (!a.keep_h) h4[c] = v[k];
      }
    }
  } else {
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int c = tid + k * nt;
      if (c < n4) w[k] = __ldg(w4 + c);
    }
  }
  norm_row_tail<NV>(a, i, v, w, scratch);
}

// Prefill-sized norms without a delta (the post-attention norm, o_proj having
// been added into h): a CTA takes rows blockIdx.x, + gridDim.x, ..., and
// requests the next row's h before reducing the current one, so its loads are
// in flight through the reductions and the stores (the one-row-a-CTA kernel
// idles HBM in those phases: 2,048 rows at ~45% of HBM, ncu 2026-11-28).
// The same per-row operations (norm_row_tail), so the same bits.
template <int NV>
__global__ void __launch_bounds__(kNormThreads, kNormMinBlocks) add_rmsnorm_rows_kernel(AddNormArgs a) {
  pdl_launch_dependents();
  __shared__ float scratch[32];
  const int n4 = a.hidden >> 2;
  const int tid = threadIdx.x, nt = blockDim.x;
  const float4* w4 = reinterpret_cast<const float4*>(a.weight);
  auto load_row = [&](int i, float4 (&v)[NV]) {
    const int src = a.row_index ? a.row_index[i] : i;
    const float4* h4 = reinterpret_cast<const float4*>(a.h + (int64_t)src * a.hidden);
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int c = tid + k * nt;
      if (c < n4) v[k] = h4[c];
    }
  };
  int i = blockIdx.x;
  float4 v[NV];
  if (i < a.rows) load_row(i, v);
  for (; i < a.rows; i += gridDim.x) {
    float4 vn[NV];
    if (i + (int)gridDim.x < a.rows) load_row(i + gridDim.x, vn);
    float4 w[NV];
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int c = tid + k * nt;
      if (c < n4) w[k] = __ldg(w4 + c);
    }
    norm_row_tail<NV>(a, i, v, w, scratch);
#pragma unroll
    for (int k = 0; k < NV; ++k) v[k] = vn[k];
  }
}

// Calls launch(std::integral_constant<int, NV>) for NV = nv, 1..7, and 8
// beyond: the register-row kernels are instantiated per NV.
template <typename F>
void with_norm_vec(int nv, F&& launch) {
  switch (nv) {
    case 1: launch(std::integral_constant<int, 1>{}); break;
    case 2: launch(std::integral_constant<int, 2>{}); break;
    case 3: launch(std::integral_constant<int, 3>{}); break;
    case 4: launch(std::integral_constant<int, 4>{}); break;
    case 5: launch(std::integral_constant<int, 5>{}); break;
    case 6: launch(std::integral_constant<int, 6>{}); break;
    case 7: launch(std::integral_constant<int, 7>{}); break;
    default: launch(std::integral_constant<int, 8>{}); break;
  }
}

// The end of a MoE layer and the next layer's input norm in one launch (one
// GPU: no all-reduce between them). Per token row i: delta = sum over the
// filled slots j, in slot order, of w[j] * y[inv[j]] (+ add, last), with the
// FMAs of combine_kernel (moe.cu), so delta is bit-identical; then h += delta
// and the row is normalised by norm_row_tail as add_rmsnorm does. delta is
// not written. The warp's lanes load the token's slot list once and share it
// by shuffles; each slot's NV float4 per thread are in flight together.
// YT: the expert rows' type, float or __nv_bfloat16 (widened exactly to FP32
// as they are loaded; the sums are the same FP32 FMAs).
template <typename YT>
struct CombineRows {
  const YT* y;
  const int* inv;
  const float* w;
  const float* add;
  int slots;
};

// Four values of an expert row as loaded (RowRaw: float4, or four BF16 in a
// uint2) and widened exactly to FP32 (widen4).
template <typename YT>
struct RowRaw { using type = float4; };
template <>
struct RowRaw<__nv_bfloat16> { using type = uint2; };
__device__ __forceinline__ float4 load_raw4(const float* row, int c) {
  return __ldg(reinterpret_cast<const float4*>(row) + c);
}
__device__ __forceinline__ uint2 load_raw4(const __nv_bfloat16* row, int c) {
  return __ldg(reinterpret_cast<const uint2*>(row) + c);
}
__device__ __forceinline__ float4 widen4(float4 v) { return v; }
__device__ __forceinline__ float4 widen4(uint2 u) {
  const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
  const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}

// The norm weights are requested after the slots' sums, not with h: they are
// the same 20 KB for every row (L1 / L2 hits), and held through the slot loop
// they kept the kernel at 112 registers, two CTAs an SM (ncu, H200, a 2k
// prefill: 25% occupancy, 41.9 us at 56% of DRAM); their load latency hides
// behind the sum of squares' reduction, which does not need them.
// (FP32 rows, the decode steps' few: held at 3 CTAs an SM they spilled 96
// bytes, so those keep ptxas's count.)
template <int NV, typename YT>
__global__ void __launch_bounds__(kNormThreads, NV <= 5 && !std::is_same_v<YT, float> ? kNormMinBlocks : 1)
    combine_add_rmsnorm_kernel(CombineRows<YT> cr, AddNormArgs a) {
  pdl_launch_dependents();
  const int i = blockIdx.x;
  __shared__ float scratch[32];
  const int n4 = a.hidden >> 2;
  const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31;
  const int pl = lane < cr.slots ? __ldg(cr.inv + (int64_t)i * cr.slots + lane) : -1;
  const float wl = lane < cr.slots ? __ldg(cr.w + (int64_t)i * cr.slots + lane) : 0.f;
  float4* h4 = reinterpret_cast<float4*>(a.h + (int64_t)i * a.hidden);
  const float4* w4 = reinterpret_cast<const float4*>(a.weight);
  float4 v[NV], w[NV], acc[NV];
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int c = tid + k * nt;
    acc[k] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (c < n4) v[k] = h4[c];
  }
  // Two filled slots a round, both rows' loads in flight together (a 2k
  // prefill step's token has its routed slot and the shared expert's: one
  // load round trip where there were two), the FMAs still slot by slot in
  // slot order, so the same sums.
  using Raw = typename RowRaw<YT>::type;
  unsigned filled = __ballot_sync(0xffffffffu, pl >= 0);
  while (filled) {  // warp-uniform
    const int j0 = __ffs(filled) - 1;
    filled &= filled - 1;
    const int j1 = filled ? __ffs(filled) - 1 : j0;
    const bool two = filled != 0;
    if (two) filled &= filled - 1;
    const int p0 = __shfl_sync(0xffffffffu, pl, j0), p1 = __shfl_sync(0xffffffffu, pl, j1);
    const float w0 = __shfl_sync(0xffffffffu, wl, j0), w1 = __shfl_sync(0xffffffffu, wl, j1);
    const YT* y0 = cr.y + (int64_t)p0 * a.hidden;
    const YT* y1 = cr.y + (int64_t)p1 * a.hidden;
    Raw r0[NV], r1[NV];
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int c = tid + k * nt;
      if (c < n4) {
        r0[k] = load_raw4(y0, c);
        if (two) r1[k] = load_raw4(y1, c);
      }
    }
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int c = tid + k * nt;
      if (c < n4) {
        const float4 y = widen4(r0[k]);
        acc[k].x += w0 * y.x;
        acc[k].y += w0 * y.y;
        acc[k].z += w0 * y.z;
        acc[k].w += w0 * y.w;
        if (two) {
          const float4 z = widen4(r1[k]);
          acc[k].x += w1 * z.x;
          acc[k].y += w1 * z.y;
          acc[k].z += w1 * z.z;
          acc[k].w += w1 * z.w;
        }
      }
    }
  }
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int c = tid + k * nt;
    if (c < n4) {
      if (cr.add) {  // the shared expert's output, computed apart, last
        const float4 e = __ldg(reinterpret_cast<const float4*>(cr.add + (int64_t)i * a.hidden) + c);
        acc[k].x += e.x;
        acc[k].y += e.y;
        acc[k].z += e.z;
        acc[k].w += e.w;
      }
      v[k].x = v[k].x + acc[k].x;
      v[k].y = v[k].y + acc[k].y;
      v[k].z = v[k].z + acc[k].z;
      v[k].w = v[k].w + acc[k].w;
      h4[c] = v[k];
      w[k] = __ldg(w4 + c);
    }
  }
  norm_row_tail<NV>(a, i, v, w, scratch);
}

// One warp per head; lane l holds dims 4l..4l+3 (head_dim 128). A CTA takes one
// token with one warp per head (up to kRopeMaxWarps, looping beyond). The RoPE
// angles depend only on the token and the frequency index, so the CTA evaluates
// each sincosf once (rot/2 of them) into shared memory instead of once per head
// and dim pair (the same call on the same argument: identical values).
constexpr int kRopeMaxWarps = 16;
constexpr float kKvFp8MinScale = 5.9604645e-8f;  // 2^-24: an all-zero row keeps a finite scale
constexpr int kRopeMaxHalf = 64;  // rot_dim <= 128

// Lane lane's four values of KV head kvh's K (is_k) or V row into the paged
// cache at (block blk, offset off): FP32, or BF16 rounded to nearest.
__device__ __forceinline__ void rope_store_kv(const QkRopeArgs& a, bool is_k, int kvh, int blk, int off, int lane,
                                              float4 v) {
  const int64_t elem = (((int64_t)blk * a.n_kv_heads + kvh) * a.block_size + off) * 128 + lane * 4;
  void* cache = is_k ? a.k_cache : a.v_cache;
  if (a.kv_fp8) {  // whole warp: the row's scale from its amax (QkRopeArgs::kv_fp8)
    float am = absmax4(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, o));
    const float s = fmaxf(am / 448.0f, kKvFp8MinScale);
    const uint32_t codes = pack_e4m3x4(v, 1.0f / s);
    const int64_t bh = (int64_t)blk * a.n_kv_heads + kvh;  // block-head (16 tokens)
    uint8_t* c8 = static_cast<uint8_t*>(cache) + bh * (kKvFp8BlockSize * 128);
    if (is_k) {
      reinterpret_cast<uint32_t*>(c8 + off * 128)[lane] = codes;
    } else {  // transposed: dim d at byte d * 16 + off
#pragma unroll
      for (int i = 0; i < 4; ++i) c8[(lane * 4 + i) * kKvFp8BlockSize + off] = (uint8_t)(codes >> (8 * i));
    }
    if (lane == 0) (is_k ? a.k_scale : a.v_scale)[bh * kKvFp8BlockSize + off] = s;
    return;
  }
  if (a.kv_f32) {
    *reinterpret_cast<float4*>(static_cast<float*>(cache) + elem) = v;
  } else {
    __nv_bfloat16* dst = static_cast<__nv_bfloat16*>(cache) + elem;
    reinterpret_cast<__nv_bfloat162*>(dst)[0] = __floats2bfloat162_rn(v.x, v.y);
    reinterpret_cast<__nv_bfloat162*>(dst)[1] = __floats2bfloat162_rn(v.z, v.w);
  }
}

__global__ void qk_rope_kernel(QkRopeArgs a) {
  pdl_launch_dependents();
  __shared__ float s_cos[kRopeMaxHalf], s_sin[kRopeMaxHalf];
  const int t = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nwarps = blockDim.x >> 5;
  const int pos = a.positions[t];
  const int slot = a.slots[t];
  const int half = a.rot_dim / 2;
  // A padding token (slot < 0) writes q only: the cache is left untouched.
  const int n_heads = slot < 0 ? a.n_q_heads : a.n_q_heads + 2 * a.n_kv_heads;
  const float* row = a.qkv + (int64_t)t * (a.n_q_heads + 2 * a.n_kv_heads) * 128;
  // Head hd's four values of this lane, qkv's slices summed in order
  // (QkRopeArgs::qkv_splits): every slice's load issued before the adds.
  auto load_head = [&](int hd) {
    const float4* p = reinterpret_cast<const float4*>(row + hd * 128) + lane;
    float4 v = *p;
    if (a.qkv_splits > 1) {
      constexpr int kBatch = 4;
      const int64_t st4 = a.qkv_split_stride >> 2;
      for (int s0 = 1; s0 < a.qkv_splits; s0 += kBatch) {
        float4 e[kBatch];
#pragma unroll
        for (int j = 0; j < kBatch; ++j)
          if (s0 + j < a.qkv_splits) e[j] = p[(s0 + j) * st4];
#pragma unroll
        for (int j = 0; j < kBatch; ++j)
          if (s0 + j < a.qkv_splits) v.x += e[j].x, v.y += e[j].y, v.z += e[j].z, v.w += e[j].w;
      }
    }
    return v;
  };
  // The first head's row is loaded before the angle table, to overlap the two.
  float4 v_next = make_float4(0.f, 0.f, 0.f, 0.f);
  if (warp < n_heads) v_next = load_head(warp);
  for (int j = threadIdx.x; j < half; j += blockDim.x) {
    const float ang = (float)pos * a.inv_freq[j];
    float sn, cs;
    sincosf(ang, &sn, &cs);
    s_sin[j] = sn;
    s_cos[j] = cs;
  }
  __syncthreads();
  const int blk = slot / a.block_size, off = slot % a.block_size;
  const float xs_t = a.x_scale ? a.x_scale[t] : 1.f;
  for (int hd = warp; hd < n_heads; hd += nwarps) {
    float4 v = v_next;
    if (hd + nwarps < n_heads) v_next = load_head(hd + nwarps);
    if (a.x_scale) {  // the GEMM's epilogue, as gemm_fp8_epilogue computes it
      const int n = hd * 128 + lane * 4;
      float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float y = e[i] * xs_t * a.w_scale[n + i];
        if (a.bias) y += a.bias[n + i];
        e[i] = y;
      }
      v = make_float4(e[0], e[1], e[2], e[3]);
    }
    const bool is_q = hd < a.n_q_heads;
    const bool is_k = !is_q && hd < a.n_q_heads + a.n_kv_heads;
    if (is_q || is_k) {
      const float* w = is_q ? a.q_norm : a.k_norm;
      if (w) v = head_rmsnorm(v, reinterpret_cast<const float4*>(w)[lane], a.eps);
      v = head_rope(v, lane, half, s_cos, s_sin);
      if (is_q) {
        reinterpret_cast<float4*>(a.q_out + ((int64_t)t * a.n_q_heads + hd) * 128)[lane] = v;
        continue;
      }
    }
    rope_store_kv(a, is_k, is_k ? hd - a.n_q_heads : hd - a.n_q_heads - a.n_kv_heads, blk, off, lane, v);
  }
}

// Prefill-sized steps: TPC tokens a CTA, one warp a head for all of them. The
// one-token kernel above kept one 512-byte row a warp in flight, its angle
// table, the epilogue's scales and the head's norm weights a CTA's whole life
// (a 2,048-token step ran at ~16% of HBM). Here every token's row of the
// warp's head is requested at once, and the head's scales, bias and norm
// weights are loaded once for the CTA's tokens. Same operations per value as
// qk_rope_kernel (bit for bit); no qkv slices.
template <int TPC>
__global__ void __launch_bounds__(kRopeMaxWarps * 32) qk_rope_tokens_kernel(QkRopeArgs a) {
  pdl_launch_dependents();
  __shared__ float s_cos[TPC][kRopeMaxHalf], s_sin[TPC][kRopeMaxHalf];
  const int t0 = blockIdx.x * TPC;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nwarps = blockDim.x >> 5;
  const int half = a.rot_dim / 2;
  const int n_all = a.n_q_heads + 2 * a.n_kv_heads;
  for (int i = threadIdx.x; i < TPC * half; i += blockDim.x) {
    const int k = i / half, j = i - k * half;
    const int t = min(t0 + k, a.T - 1);
    const float ang = (float)a.positions[t] * a.inv_freq[j];
    float sn, cs;
    sincosf(ang, &sn, &cs);
    s_sin[k][j] = sn;
    s_cos[k][j] = cs;
  }
  int slot[TPC];
  float xs[TPC];
#pragma unroll
  for (int k = 0; k < TPC; ++k) {
    const int t = t0 + k;
    slot[k] = t < a.T ? a.slots[t] : -1;
    xs[k] = (a.x_scale && t < a.T) ? a.x_scale[t] : 1.f;
  }
  __syncthreads();
  for (int hd = warp; hd < n_all; hd += nwarps) {
    const bool is_q = hd < a.n_q_heads;
    const bool is_k = !is_q && hd < a.n_q_heads + a.n_kv_heads;
    float4 v[TPC];
#pragma unroll
    for (int k = 0; k < TPC; ++k) {
      const int t = t0 + k;
      // A padding token (slot < 0) writes q only; a token past T nothing.
      if (t < a.T && (is_q || slot[k] >= 0))
        v[k] = reinterpret_cast<const float4*>(a.qkv + ((int64_t)t * n_all + hd) * 128)[lane];
    }
    const int n = hd * 128 + lane * 4;
    float ws[4] = {0.f, 0.f, 0.f, 0.f}, bs[4] = {0.f, 0.f, 0.f, 0.f};
    if (a.x_scale) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        ws[i] = a.w_scale[n + i];
        if (a.bias) bs[i] = a.bias[n + i];
      }
    }
    const float* nwp = is_q ? a.q_norm : is_k ? a.k_norm : nullptr;
    const float4 nw = nwp ? reinterpret_cast<const float4*>(nwp)[lane] : make_float4(0.f, 0.f, 0.f, 0.f);
    const int kvh = is_k ? hd - a.n_q_heads : hd - a.n_q_heads - a.n_kv_heads;
#pragma unroll
    for (int k = 0; k < TPC; ++k) {
      const int t = t0 + k;
      if (t >= a.T || (!is_q && slot[k] < 0)) continue;  // warp-uniform
      float4 x = v[k];
      if (a.x_scale) {  // the GEMM's epilogue, as gemm_fp8_epilogue computes it
        float e[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          float y = e[i] * xs[k] * ws[i];
          if (a.bias) y += bs[i];
          e[i] = y;
        }
        x = make_float4(e[0], e[1], e[2], e[3]);
      }
      if (is_q || is_k) {
        if (nwp) x = head_rmsnorm(x, nw, a.eps);
        x = head_rope(x, lane, half, s_cos[k], s_sin[k]);
        if (is_q) {
          reinterpret_cast<float4*>(a.q_out + ((int64_t)t * a.n_q_heads + hd) * 128)[lane] = x;
          continue;
        }
      }
      rope_store_kv(a, is_k, kvh, slot[k] / a.block_size, slot[k] % a.block_size, lane, x);
    }
  }
}

// Tokens a CTA of qk_norm_rope_kv_write (0: by T; tests force 1, 2, 4 or 8).
int g_rope_tpc = 0;
// From this many tokens (and one qkv slice) a CTA takes 4 of them. H200,
// small_check --bench, 2,048 tokens with the epilogue folded (28.3 MB): 1 a
// CTA 20.8 us, 2 14.3, 4 13.3 (48% of HBM), 8 17.8.
constexpr int kRopeTokensMinT = 512;
// From this many rows a norm without a delta runs add_rmsnorm_rows_kernel.
#ifndef GLMK_NORM_ROWS_MIN_ROWS
#define GLMK_NORM_ROWS_MIN_ROWS 512
#endif
constexpr int kNormRowsMinRows = GLMK_NORM_ROWS_MIN_ROWS;
// Tests and benches: the rows kernel from this many rows instead (0: the
// default; a huge value: never).
int g_norm_rows_min = 0;

// One float4 per thread up to 256 of them (whole warps), else 256 threads x NV.
int norm_vec_per_thread(int hidden) { return (hidden / 4 + kNormThreads - 1) / kNormThreads; }
int norm_vec_threads(int hidden) {
  const int n4 = hidden / 4;
  return norm_vec_per_thread(hidden) == 1 ? (n4 + 31) / 32 * 32 : kNormThreads;
}

}  // namespace

cudaError_t add_rmsnorm(const AddNormArgs& a, cudaStream_t st) {
  if (a.rows <= 0) return cudaSuccess;
  if (a.out_q && !a.out_scale) return cudaErrorInvalidValue;
  if (a.delta_splits < 1 || (a.delta_splits > 1 && (!a.delta || a.delta_split_stride < (int64_t)a.hidden ||
                                                    a.delta_split_stride % 4 != 0)))
    return cudaErrorInvalidValue;
  auto aligned = [](const void* p, uintptr_t n) { return ((uintptr_t)p & (n - 1)) == 0; };
  const int n4 = a.hidden / 4;
  const bool vec = a.hidden > 0 && a.hidden % 4 == 0 && n4 <= kNormThreads * kNormVecMax &&
                   aligned(a.h, 16) && aligned(a.delta, 16) && aligned(a.weight, 16) &&
                   aligned(a.out_f32, 16) && aligned(a.out_bf16, 8) && aligned(a.out_q, 4);
  if (!vec) {
    add_rmsnorm_kernel<<<a.rows, kNormThreads, 0, st>>>(a);
    return cudaGetLastError();
  }
  const int nv = norm_vec_per_thread(a.hidden);
  const int threads = norm_vec_threads(a.hidden);
  if (!a.delta && a.rows >= (g_norm_rows_min > 0 ? g_norm_rows_min : kNormRowsMinRows) && nv <= 5) {
    int dev = 0;
    DeviceInfo di;
    const cudaError_t e = device_info(dev, di);
    if (e != cudaSuccess) return e;
    const int grid = std::min(a.rows, di.sms * kNormMinBlocks);
    with_norm_vec(nv, [&](auto NV) {
      if constexpr (decltype(NV)::value <= 5) add_rmsnorm_rows_kernel<decltype(NV)::value><<<grid, threads, 0, st>>>(a);
    });
    return cudaGetLastError();
  }
  with_norm_vec(nv, [&](auto NV) { add_rmsnorm_vec_kernel<decltype(NV)::value><<<a.rows, threads, 0, st>>>(a); });
  return cudaGetLastError();
}

bool combine_add_rmsnorm_supported(int hidden, int slots) {
  return hidden > 0 && hidden % 4 == 0 && hidden / 4 <= kNormThreads * kNormVecMax && slots > 0 &&
         slots <= 32;
}

namespace {
template <typename YT>
cudaError_t launch_combine_add_rmsnorm(const YT* y, const int* inv, const float* w, int slots,
                                       const float* add, const AddNormArgs& a, cudaStream_t st) {
  if (a.rows <= 0) return cudaSuccess;
  if (!combine_add_rmsnorm_supported(a.hidden, slots) || a.row_index || a.delta || a.delta_splits != 1 || !a.weight ||
      (a.out_q && !a.out_scale))
    return cudaErrorInvalidValue;
  auto aligned = [](const void* p, uintptr_t n) { return ((uintptr_t)p & (n - 1)) == 0; };
  if (!aligned(a.h, 16) || !aligned(y, 4 * sizeof(YT)) || !aligned(add, 16) || !aligned(a.weight, 16) ||
      !aligned(a.out_f32, 16) || !aligned(a.out_bf16, 8) || !aligned(a.out_q, 4))
    return cudaErrorInvalidValue;
  const CombineRows<YT> cr{y, inv, w, add, slots};
  const int threads = norm_vec_threads(a.hidden);
  with_norm_vec(norm_vec_per_thread(a.hidden), [&](auto NV) {
    combine_add_rmsnorm_kernel<decltype(NV)::value, YT><<<a.rows, threads, 0, st>>>(cr, a);
  });
  return cudaGetLastError();
}
}  // namespace

cudaError_t combine_add_rmsnorm(const float* y, const int* inv, const float* w, int slots,
                                const float* add, const AddNormArgs& a, cudaStream_t st) {
  return launch_combine_add_rmsnorm(y, inv, w, slots, add, a, st);
}

cudaError_t combine_add_rmsnorm(const __nv_bfloat16* y, const int* inv, const float* w, int slots,
                                const float* add, const AddNormArgs& a, cudaStream_t st) {
  return launch_combine_add_rmsnorm(y, inv, w, slots, add, a, st);
}

cudaError_t qk_norm_rope_kv_write(const QkRopeArgs& a, cudaStream_t st) {
  if (a.T <= 0) return cudaSuccess;
  if (a.head_dim != 128 || a.rot_dim % 8 != 0 || a.rot_dim > 128 || a.rot_dim < 8)
    return cudaErrorInvalidValue;
  if (a.kv_fp8 && (a.kv_f32 || a.block_size != kKvFp8BlockSize || !a.k_scale || !a.v_scale))
    return cudaErrorInvalidValue;
  const int64_t row_floats = (int64_t)(a.n_q_heads + 2 * a.n_kv_heads) * 128;
  if (a.qkv_splits < 1 || (a.qkv_splits > 1 && (a.x_scale || a.qkv_split_stride < (int64_t)a.T * row_floats ||
                                                a.qkv_split_stride % 4 != 0 ||
                                                ((uintptr_t)a.qkv & 15) != 0)))
    return cudaErrorInvalidValue;
  const int n_heads = a.n_q_heads + 2 * a.n_kv_heads;
  const int warps = n_heads < 1 ? 1 : n_heads < kRopeMaxWarps ? n_heads : kRopeMaxWarps;
  const int tpc = a.qkv_splits > 1 ? 1 : g_rope_tpc > 0 ? g_rope_tpc : a.T >= kRopeTokensMinT ? 4 : 1;
  if (tpc == 8)
    qk_rope_tokens_kernel<8><<<(a.T + 7) / 8, warps * 32, 0, st>>>(a);
  else if (tpc == 4)
    qk_rope_tokens_kernel<4><<<(a.T + 3) / 4, warps * 32, 0, st>>>(a);
  else if (tpc == 2)
    qk_rope_tokens_kernel<2><<<(a.T + 1) / 2, warps * 32, 0, st>>>(a);
  else
    qk_rope_kernel<<<a.T, warps * 32, 0, st>>>(a);
  return cudaGetLastError();
}

// Test / bench hook (not in kernels.h; small_check declares it): tokens a CTA
// of qk_norm_rope_kv_write — 1 (the one-token kernel), 2, 4 or 8 — or 0 (by T).
void qk_rope_set_tokens_per_cta(int tpc) { g_rope_tpc = tpc; }
// Test / bench hook (small_check declares it): add_rmsnorm_rows_kernel from
// this many rows (0: kNormRowsMinRows).
void add_rmsnorm_set_rows_min(int rows) { g_norm_rows_min = rows; }

}  // namespace glmk
