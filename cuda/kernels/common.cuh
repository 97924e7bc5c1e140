// common.cuh — device helpers shared by every kernel family: reductions,
// FP8/BF16 conversions, wide loads and the FP8 tensor-core instruction.
// Host-side launch functions are declared in kernels.h.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <atomic>
#include <utility>

#include "kernels.h"

namespace glmk {

// Largest finite E4M3 value and the lower clamp of the per-token activation
// scale (docs/model.md §4.3): s = max(amax / 448, 1 / (448 * 512)).
constexpr float kFp8Max = 448.0f;
constexpr float kMinActScale = 1.0f / (448.0f * 512.0f);

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Block-wide reductions; scratch must hold 32 values. Every thread gets the
// result. Safe to call repeatedly (barrier before reusing scratch).
template <typename T, typename Op>
__device__ __forceinline__ T block_reduce(T v, T* scratch, Op op) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nwarps = (blockDim.x + 31) >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T r = scratch[0];
  for (int i = 1; i < nwarps; ++i) r = op(r, scratch[i]);
  return r;
}

struct SumOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
  __device__ __forceinline__ double operator()(double a, double b) const { return fmax(a, b); }
  __device__ __forceinline__ int operator()(int a, int b) const { return a > b ? a : b; }
};
struct MinOp {
  __device__ __forceinline__ int operator()(int a, int b) const { return a < b ? a : b; }
};
struct OrOp {
  __device__ __forceinline__ int operator()(int a, int b) const { return a | b; }
};

// v rounded to E4M3 with saturation to +-448 (== clamp then RNE).
__device__ __forceinline__ uint8_t f32_to_e4m3(float v) {
  return (uint8_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
}
// Four values to E4M3 under scale s, given as inv = 1 / s (q = e4m3(v * inv)),
// packed low byte first. Every FP8 quantization here multiplies by the
// inverted scale, as vLLM's does: v / s was an IEEE division an element
// (~10 instructions with its range check), and the norms, the combine and
// the rope kernel spent a good part of their issue slots on it (ncu, H200,
// a 2k prefill, 2026-11-29). v * (1 / s) is within an ulp of v / s before
// E4M3's 3-bit rounding, so a code moves by at most one step, and rarely;
// every kernel (fused or not) and the checks' host references quantize
// this way, so they still agree bit for bit. Two values a cvt.
__device__ __forceinline__ uint32_t pack_e4m3x4(float4 v, float inv) {
  const __nv_fp8x2_storage_t lo =
      __nv_cvt_float2_to_fp8x2(make_float2(v.x * inv, v.y * inv), __NV_SATFINITE, __NV_E4M3);
  const __nv_fp8x2_storage_t hi =
      __nv_cvt_float2_to_fp8x2(make_float2(v.z * inv, v.w * inv), __NV_SATFINITE, __NV_E4M3);
  return (uint32_t)lo | ((uint32_t)hi << 16);
}

// SiLU of the prefill's BF16 paths (quant.cu's BF16 SiLU, the SiLU-fused
// gate|up epilogue of gemm_grouped.cu): g / (1 + e^-g) with the hardware
// exponential and a fast division (~2 ulp; e^-g -> inf gives -0, SiLU's
// limit), far below BF16's 2^-9 and the FP8 codes' 2^-4 steps.
__device__ __forceinline__ float silu_fast(float g) { return __fdividef(g, 1.0f + __expf(-g)); }

// max(|x|, |y|, |z|, |w|): a float4's share of a row's FP8 scale.
__device__ __forceinline__ float absmax4(const float4& v) {
  return fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
}

__device__ __forceinline__ float e4m3_to_f32(uint8_t b) {
  __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)b, __NV_E4M3);
  return __half2float(__half(h));
}

__device__ __forceinline__ float bf16_to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }

// L2 policy for the bytes a decode step reads once (weights, the KV cache):
// their lines are the first L2 evicts. A step streams far more than L2 holds
// (a batch-1 layer ~65 MB, L2 50 MB), so with plain loads each layer's weights
// flush the code, metadata, block tables and activations its small kernels
// need, and every kernel starts with a chain of HBM misses (docs/perf.md,
// 2026-11-24: attention 10 us warm, 20 us after an L2 flush). Created per
// thread (no memory access).
__device__ __forceinline__ uint64_t l2_policy_stream() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  return p;
}

__device__ __forceinline__ uint64_t l2_policy_normal() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(p));
  return p;
}

// 16-byte load of streamed data read once (weights): bypass L1, evict first from L2.
__device__ __forceinline__ uint4 ld_stream_v4(const void* p, uint64_t policy) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p), "l"(policy));
  return r;
}

// 16-byte load of data reused by many warps (activations): through L1.
__device__ __forceinline__ uint4 ld_reuse_v4(const void* p) {
  return __ldg(reinterpret_cast<const uint4*>(p));
}

// cp.async (sm_80+): 16-byte global -> shared copies that need no registers,
// so a warp can keep many stages of a weight stream in flight. .cg bypasses L1
// (weights, read once); .ca allocates in L1 (activations, read by many warps).
// The L2 prefetch hint (0: none, 1: 128 B, 2: 256 B) asks L2 to fetch the
// whole surrounding segment from HBM at once (weight rows are read in 128-byte
// stages, so the next stage of the row is then an L2 hit).
__device__ __forceinline__ void cp_async_cg16(uint32_t smem_addr, const void* src, int l2_prefetch) {
  if (l2_prefetch == 2)
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(smem_addr), "l"(src));
  else if (l2_prefetch == 1)
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;" ::"r"(smem_addr), "l"(src));
  else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr), "l"(src));
}
// cp_async_cg16 for streamed weights: the same copy under an L2 policy
// (l2_policy_stream).
__device__ __forceinline__ void cp_async_cg16_hint(uint32_t smem_addr, const void* src, int l2_prefetch,
                                                   uint64_t policy) {
  if (l2_prefetch == 2)
    asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::256B [%0], [%1], 16, %2;" ::"r"(smem_addr),
                 "l"(src), "l"(policy));
  else if (l2_prefetch == 1)
    asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::128B [%0], [%1], 16, %2;" ::"r"(smem_addr),
                 "l"(src), "l"(policy));
  else
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(smem_addr), "l"(src),
                 "l"(policy));
}
__device__ __forceinline__ void cp_async_ca16(uint32_t smem_addr, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" ::"r"(smem_addr), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Wait until at most n of this thread's committed groups are pending. The
// instruction takes an immediate, so a run-time depth dispatches over 0..15.
__device__ __forceinline__ void cp_async_wait_pending(int n) {
  switch (n) {
#define GLMK_CP_WAIT(N) \
  case N: asm volatile("cp.async.wait_group " #N ";" ::: "memory"); break;
    GLMK_CP_WAIT(1) GLMK_CP_WAIT(2) GLMK_CP_WAIT(3) GLMK_CP_WAIT(4) GLMK_CP_WAIT(5)
    GLMK_CP_WAIT(6) GLMK_CP_WAIT(7) GLMK_CP_WAIT(8) GLMK_CP_WAIT(9) GLMK_CP_WAIT(10)
    GLMK_CP_WAIT(11) GLMK_CP_WAIT(12) GLMK_CP_WAIT(13) GLMK_CP_WAIT(14)
#undef GLMK_CP_WAIT
    default: asm volatile("cp.async.wait_group 0;" ::: "memory"); break;
  }
}

// D += A(16x32 e4m3, row) * B(32x8 e4m3, col), FP32 accumulate.
__device__ __forceinline__ void mma_e4m3_16832(float (&d)[4], uint32_t a0, uint32_t a1,
                                               uint32_t a2, uint32_t a3, uint32_t b0,
                                               uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// BF16 tensor-core attention pieces (attention.cu, attn_layer.cu): 2^x in
// the log2-domain softmax, two floats as a bf16x2 fragment word, ldmatrix
// (plain and transposed) and the m16n8k16 BF16 mma.
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (low half) = lo
  return *reinterpret_cast<uint32_t*>(&v);
}

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                        uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                              uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr)
               : "memory");
}

// D += A(16x16 bf16, row) * B(16x8 bf16, col), FP32 accumulate.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// D += A(16x16 f16, row) * B(16x8 f16, col), FP32 accumulate (the FP8 KV
// cache's attention: e4m3 widens to f16 exactly).
__device__ __forceinline__ void mma_f16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// Two e4m3 codes (low byte first) -> f16x2 (low half first), exact (sm_89+).
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t two) {
  uint32_t r;
  asm("{\n.reg .b16 lo;\ncvt.u16.u32 lo, %1;\ncvt.rn.f16x2.e4m3x2 %0, lo;\n}" : "=r"(r) : "r"(two));
  return r;
}
// Two floats -> f16x2 (low half first), round to nearest.
__device__ __forceinline__ uint32_t pack_f16(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}
// Four e4m3 codes (low byte first) -> floats, exact.
__device__ __forceinline__ float4 e4m3x4_to_f32(uint32_t four) {
  const uint32_t lo = e4m3x2_to_f16x2(four), hi = e4m3x2_to_f16x2(four >> 16);
  const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&lo));
  const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&hi));
  return make_float4(a.x, a.y, b.x, b.y);
}

// One head of 128 dims held by a warp, lane l dims 4l..4l+3 (norm_rope.cu's
// rope kernel, attn_layer.cu): RMSNorm with weight w (this lane's 4), then
// rotate_half RoPE of the first 2 * half dims with the angles' cos / sin in
// cs / sn [half] (q4 = half / 4 lanes apart). The FMAs are spelled out, in
// the rope kernel's order before these helpers (small_check compares its
// bits with that kernel's): left to the compiler, the contraction changed
// with the code around it.
__device__ __forceinline__ float4 head_rmsnorm(float4 v, const float4& w, float eps) {
  const float ss = warp_sum(__fmaf_rn(v.w, v.w, __fmaf_rn(v.z, v.z, __fmaf_rn(v.x, v.x, __fmul_rn(v.y, v.y)))));
  const float r = 1.0f / sqrtf(ss / 128.0f + eps);
  return make_float4(w.x * (v.x * r), w.y * (v.y * r), w.z * (v.z * r), w.w * (v.w * r));
}
__device__ __forceinline__ float4 head_rope(float4 v, int lane, int half, const float* cs, const float* sn) {
  const int q4 = half / 4;  // lane distance between a dim and its RoPE partner
  // Partner lane for the rotate_half pairing (j <-> j +- rot/2).
  int src = lane;
  if (lane < q4) src = lane + q4;
  else if (lane < 2 * q4) src = lane - q4;
  const float px = __shfl_sync(0xffffffffu, v.x, src);
  const float py = __shfl_sync(0xffffffffu, v.y, src);
  const float pz = __shfl_sync(0xffffffffu, v.z, src);
  const float pw = __shfl_sync(0xffffffffu, v.w, src);
  if (lane < 2 * q4) {
    const bool first = lane < q4;  // dims in [0, half): rotate_half gives -x[j+half]
    const float sgn = first ? -1.0f : 1.0f;
    float xs[4] = {v.x, v.y, v.z, v.w};
    const float ps[4] = {px, py, pz, pw};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int j = (lane * 4 + i) % half;
      xs[i] = __fmaf_rn(xs[i], cs[j], __fmul_rn(__fmul_rn(sgn, ps[i]), sn[j]));
    }
    v = make_float4(xs[0], xs[1], xs[2], xs[3]);
  }
  return v;
}

// One 16-key block of decode attention on tensor cores (attention.cu,
// attn_layer.cu), after S = Q K^T: the thread holds keys 2t, 2t+1 (s0) and
// 8+2t, 9+2t (s1) of rows g ([0], [1]) and g+8 ([2], [3]) in log2 units; keys
// from `valid` on get -inf. Updates the rows' running max (m0, m1) and sum
// (l0, l1: this thread's columns), rescales O, and leaves P in s0 / s1.
__device__ __forceinline__ void attn_block_softmax_p(float (&s0)[4], float (&s1)[4], int valid, int t, float& m0,
                                                     float& m1, float& l0, float& l1, float (&o)[16][4]) {
  if (valid < 16) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int kc0 = 2 * t + (e & 1);
      if (kc0 >= valid) s0[e] = -INFINITY;
      if (kc0 + 8 >= valid) s1[e] = -INFINITY;
    }
  }
  float mx0 = fmaxf(fmaxf(s0[0], s0[1]), fmaxf(s1[0], s1[1]));
  float mx1 = fmaxf(fmaxf(s0[2], s0[3]), fmaxf(s1[2], s1[3]));
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
  const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);  // finite: the block has a valid key
  const float al0 = ex2(m0 - mn0), al1 = ex2(m1 - mn1);    // 0 on the first block
  m0 = mn0;
  m1 = mn1;
  s0[0] = ex2(s0[0] - mn0);
  s0[1] = ex2(s0[1] - mn0);
  s1[0] = ex2(s1[0] - mn0);
  s1[1] = ex2(s1[1] - mn0);
  s0[2] = ex2(s0[2] - mn1);
  s0[3] = ex2(s0[3] - mn1);
  s1[2] = ex2(s1[2] - mn1);
  s1[3] = ex2(s1[3] - mn1);
  l0 = l0 * al0 + ((s0[0] + s0[1]) + (s1[0] + s1[1]));
  l1 = l1 * al1 + ((s0[2] + s0[3]) + (s1[2] + s1[3]));
#pragma unroll
  for (int nd = 0; nd < 16; ++nd) {
    o[nd][0] *= al0;
    o[nd][1] *= al0;
    o[nd][2] *= al1;
    o[nd][3] *= al1;
  }
}
// attn_block_softmax_p, then P packed as the bf16 A fragment of O += P V.
__device__ __forceinline__ void attn_block_softmax(float (&s0)[4], float (&s1)[4], int valid, int t, float& m0,
                                                   float& m1, float& l0, float& l1, float (&o)[16][4],
                                                   uint32_t (&pa)[4]) {
  attn_block_softmax_p(s0, s1, valid, t, m0, m1, l0, l1, o);
  pa[0] = pack_bf16(s0[0], s0[1]);
  pa[1] = pack_bf16(s0[2], s0[3]);
  pa[2] = pack_bf16(s1[0], s1[1]);
  pa[3] = pack_bf16(s1[2], s1[3]);
}

// Programmatic dependent launch (sm_90): lets the next kernel of the stream, if
// it was launched with cudaLaunchAttributeProgrammaticStreamSerialization,
// start its prologue (e.g. streaming weights) while this one runs; the
// dependent still waits (griddepcontrol.wait) for this grid to finish before
// it touches anything this grid writes. A no-op for ordinary dependents.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// griddepcontrol.wait: returns once the grids this one depends on
// (programmatic dependent launch) have completed and their writes are
// visible; at once in a kernel launched without PDL.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Cluster barrier halves (every thread of every CTA of the cluster arrives,
// then waits). Not the .aligned forms: the SASS is the same (cooperative
// groups' cluster.sync() emits these), and nothing then depends on the
// compiler reconverging a warp first. On sm_90 the release is a
// MEMBAR.ALL.GPU and the acquire an L1 invalidation (cuobjdump), cheaper than
// the last-CTA form's fence + atomic + L2 round trip but not free.
__device__ __forceinline__ void cluster_arrive_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release;" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_wait_acquire() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.acquire;" ::: "memory");
#endif
}
// The shared::cluster address of CTA `rank`'s shared memory at the offset of
// local shared address `addr`.
__device__ __forceinline__ uint32_t dsmem_addr(uint32_t addr, int rank) {
  uint32_t remote = addr;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(addr), "r"(rank));
#endif
  return remote;
}

// 4 bytes of CTA `rank`'s shared memory at the offset of local shared address
// `addr` (volatile: not moved across the cluster barriers).
__device__ __forceinline__ float ld_dsmem_f32(uint32_t addr, int rank) {
  float v = 0.f;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(dsmem_addr(addr, rank)) : "memory");
#endif
  return v;
}

// Stores v into CTA `rank`'s shared memory at the offset of local shared
// address `addr` (as ld_dsmem_f32; ordered before a later
// barrier.cluster.arrive.release).
__device__ __forceinline__ void st_dsmem_f32(uint32_t addr, int rank, float v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(dsmem_addr(addr, rank)), "f"(v) : "memory");
#endif
}

// Transaction barriers and asynchronous remote stores (sm_90; any sm_90
// target, unlike hopper.cuh's wgmma-guarded pipeline helpers). st.async
// writes into CTA `rank`'s shared memory at the offset of local `addr` and
// counts its bytes on that CTA's mbarrier at the offset of local `bar`; the
// receiver, having posted the bytes it expects (tx_bar_expect), waits for
// them (tx_bar_wait_cluster: acquire at cluster scope, the stores' release
// side). No fence and no cluster barrier on the data's way.
__device__ __forceinline__ void tx_bar_init(uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
#endif
}
__device__ __forceinline__ void tx_bar_expect(uint32_t bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
#endif
}
__device__ __forceinline__ void tx_bar_wait_cluster(uint32_t bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n.reg .pred p;\nTXB_WAIT:\n"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%0], %1;\n"
      "@p bra TXB_DONE;\nbra TXB_WAIT;\nTXB_DONE:\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
#endif
}
__device__ __forceinline__ void st_async_f4(uint32_t addr, int rank, uint32_t bar, float4 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(
                   dsmem_addr(addr, rank)),
               "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "r"(dsmem_addr(bar, rank))
               : "memory");
#endif
}
__device__ __forceinline__ void st_async_f2(uint32_t addr, int rank, uint32_t bar, float2 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];" ::"r"(
                   dsmem_addr(addr, rank)),
               "f"(v.x), "f"(v.y), "r"(dsmem_addr(bar, rank))
               : "memory");
#endif
}
__device__ __forceinline__ void st_async_f32(uint32_t addr, int rank, uint32_t bar, float v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.f32 [%0], %1, [%2];" ::"r"(
                   dsmem_addr(addr, rank)),
               "f"(v), "r"(dsmem_addr(bar, rank))
               : "memory");
#endif
}

// Limits of the current device, asked once per device (launch functions run
// for every layer of every eager step; concurrent first calls store the same
// values). One cache for the library: an inline function's statics are shared
// by every file that includes this header.
struct DeviceInfo {
  int major = 0, sms = 0, smem_optin = 0, smem_per_sm = 0, smem_reserved = 0, regs_per_sm = 0;
  int max_warps = 0, max_blocks = 0, l2_bytes = 0;
};
inline cudaError_t device_info(int& dev, DeviceInfo& info) {
  constexpr int kDevices = 64;
  static DeviceInfo cached[kDevices];
  static std::atomic<bool> ready[kDevices];
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  if (dev < 0 || dev >= kDevices) return cudaErrorInvalidDevice;
  if (ready[dev].load(std::memory_order_acquire)) {
    info = cached[dev];
    return cudaSuccess;
  }
  DeviceInfo d;
  int threads = 0;
  const struct {
    int* v;
    cudaDeviceAttr a;
  } attrs[] = {{&d.major, cudaDevAttrComputeCapabilityMajor},
               {&d.sms, cudaDevAttrMultiProcessorCount},
               {&d.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin},
               {&d.smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor},
               {&d.smem_reserved, cudaDevAttrReservedSharedMemoryPerBlock},
               {&d.regs_per_sm, cudaDevAttrMaxRegistersPerMultiprocessor},
               {&threads, cudaDevAttrMaxThreadsPerMultiProcessor},
               {&d.max_blocks, cudaDevAttrMaxBlocksPerMultiprocessor},
               {&d.l2_bytes, cudaDevAttrL2CacheSize}};
  for (const auto& at : attrs) {
    e = cudaDeviceGetAttribute(at.v, at.a, dev);
    if (e != cudaSuccess) return e;
  }
  d.max_warps = threads / 32;
  cached[dev] = d;
  ready[dev].store(true, std::memory_order_release);
  info = d;
  return cudaSuccess;
}

// Split-K style hand-off between the CTAs of a launch: every thread of the CTA
// has stored its share of a partial result; counts the CTA on *counter and
// returns (to every thread) whether it arrived last of `expected`. The last
// one's later loads see every earlier CTA's stores (through L2: ld.cg, or
// plain loads, the acquire fence invalidating L1), and with reset it sets the
// counter back to zero for the next launch. One thread fences, after a block
// barrier: a release fence is cumulative over the stores the barrier ordered
// before it (the pattern of CUTLASS's split-K semaphore), where a
// __threadfence() in every thread costs each a MEMBAR.SC.GPU and an L1
// invalidate. flag: a shared int of the caller's.
__device__ __forceinline__ bool cta_arrive_last(int* counter, int expected, bool reset, int* flag) {
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("fence.acq_rel.gpu;" ::: "memory");  // release: the CTA's stores before the count
    const bool last = atomicAdd(counter, 1) == expected - 1;
    if (last) {
      asm volatile("fence.acq_rel.gpu;" ::: "memory");  // acquire: the others' stores before our loads
      if (reset) atomicExch(counter, 0);
    }
    *flag = last;
  }
  __syncthreads();
  return *flag != 0;
}

// Asks L2 to fetch [p, p + bytes) from HBM (no registers, no completion to
// wait for); p 16-byte aligned, bytes a multiple of 16.
__device__ __forceinline__ void prefetch_l2_bulk(const void* p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#endif
}

// This block's share of [base, base + bytes) into L2, in 4 KB pieces over its
// threads, the shares of the grid's blocks covering the range (base 16-byte
// aligned, bytes a multiple of 16). For a kernel launched early by
// programmatic dependent launch: weights it is sure to read, fetched while
// the kernel before runs.
__device__ __forceinline__ void prefetch_l2_block_share(const uint8_t* base, int64_t bytes) {
  const int64_t blocks = (int64_t)gridDim.x * gridDim.y * gridDim.z;
  const int64_t bid = blockIdx.x + (int64_t)gridDim.x * (blockIdx.y + (int64_t)gridDim.y * blockIdx.z);
  const int64_t share = ((bytes + blocks - 1) / blocks + 4095) / 4096 * 4096;
  const int64_t beg = bid * share, end = beg + share < bytes ? beg + share : bytes;
  for (int64_t o = beg + 4096 * (int64_t)threadIdx.x; o < end; o += 4096 * (int64_t)blockDim.x)
    prefetch_l2_bulk(base + o, (uint32_t)(end - o < 4096 ? end - o : 4096));
}

// A launch configuration with programmatic dependent launch (pdl:
// ProgrammaticStreamSerialization: the kernel may start while the previous
// kernel of the stream runs, once that one triggers its dependents, and must
// pdl_wait before touching what it writes; inside stream capture the launch
// becomes a programmatic edge when the previous node is a kernel) and/or
// thread-block clusters of `cluster` CTAs along x (cluster > 0; 0: no cluster
// attribute). Not copyable: cfg points at attr.
struct LaunchConfig {
  cudaLaunchAttribute attr[2];
  cudaLaunchConfig_t cfg = {};
  LaunchConfig(dim3 grid, dim3 block, size_t smem, cudaStream_t st, bool pdl, int cluster) {
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    unsigned n = 0;
    if (pdl) {
      attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster > 0) {
      attr[n].id = cudaLaunchAttributeClusterDimension;
      attr[n].val.clusterDim.x = cluster;
      attr[n].val.clusterDim.y = 1;
      attr[n++].val.clusterDim.z = 1;
    }
    cfg.attrs = attr;
    cfg.numAttrs = n;
  }
  LaunchConfig(const LaunchConfig&) = delete;
  LaunchConfig& operator=(const LaunchConfig&) = delete;
};

// Launches kernel on st (LaunchConfig: pdl, cluster). Returns the launch
// error or cudaGetLastError().
template <class... P, class... A>
cudaError_t launch_kernel(bool pdl, int cluster, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem,
                          cudaStream_t st, A&&... args) {
  const LaunchConfig lc(grid, block, smem, st, pdl, cluster);
  const cudaError_t e = cudaLaunchKernelEx(&lc.cfg, kernel, std::forward<A>(args)...);
  return e != cudaSuccess ? e : cudaGetLastError();
}
template <class... P, class... A>
cudaError_t launch_kernel(bool pdl, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                          A&&... args) {
  return launch_kernel(pdl, 0, kernel, grid, block, smem, st, std::forward<A>(args)...);
}

inline int ceil_div(int a, int b) { return (a + b - 1) / b; }

}  // namespace glmk
