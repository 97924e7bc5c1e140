// handoff.cuh — what the one-launch decode layers (moe_decode.cu,
// attn_layer.cu) share: values passed between the CTAs of one cooperative
// launch as 8-byte (launch epoch, value) words that readers poll, the
// per-CTA phase stamps of their benches, and the one-token FP8 mma chunk of
// their weight streams.
//
// Why tagged words and not a counter + fence: a fence.acq_rel issued while a
// CTA's weight loads are in flight waits for all of them (an H100, 2026-11-28:
// the router's partials left at ~9 us instead of ~3.6). A word carrying this
// launch's epoch is its own "ready" flag; the epoch advances once per launch
// (the last CTA to finish stores it), so words of the previous launch never
// pass as this one's.
#pragma once

#include "common.cuh"

namespace glmk {

// Phase timestamps (benches only): thread 0 of each CTA writes %globaltimer at
// point i to trace[i * gridDim.x + blockIdx.x] when the launch's arguments
// carry a trace buffer (a.trace).
#define T1_MARK(i)                                                              \
  do {                                                                          \
    if (a.trace && threadIdx.x == 0) {                                          \
      unsigned long long t_;                                                    \
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_));                    \
      a.trace[(i) * gridDim.x + blockIdx.x] = t_;                               \
    }                                                                           \
  } while (0)

__device__ __forceinline__ unsigned long long t1_tag(unsigned epoch, float v) {
  return ((unsigned long long)epoch << 32) | __float_as_uint(v);
}
__device__ __forceinline__ unsigned long long ld_relaxed_u64(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
// Four consecutive tagged words (32-byte aligned) once all carry this
// launch's epoch: both 16-byte halves requested together each round.
__device__ __forceinline__ float4 t1_poll4(const unsigned long long* p, unsigned epoch) {
  unsigned long long v0, v1, v2, v3;
  for (;;) {
    asm volatile("ld.relaxed.gpu.global.v2.b64 {%0, %1}, [%2];" : "=l"(v0), "=l"(v1) : "l"(p) : "memory");
    asm volatile("ld.relaxed.gpu.global.v2.b64 {%0, %1}, [%2];" : "=l"(v2), "=l"(v3) : "l"(p + 2) : "memory");
    if ((unsigned)(v0 >> 32) == epoch && (unsigned)(v1 >> 32) == epoch && (unsigned)(v2 >> 32) == epoch &&
        (unsigned)(v3 >> 32) == epoch)
      break;
  }
  return make_float4(__uint_as_float((unsigned)v0), __uint_as_float((unsigned)v1), __uint_as_float((unsigned)v2),
                     __uint_as_float((unsigned)v3));
}
// The value of a tagged word once it carries this launch's epoch.
__device__ __forceinline__ float t1_poll(const unsigned long long* p, unsigned epoch) {
  unsigned long long v = ld_relaxed_u64(p);
  while ((unsigned)(v >> 32) != epoch) v = ld_relaxed_u64(p);
  return __uint_as_float((unsigned)v);
}

// One 64-byte K chunk of a 16-row A tile against 32 bytes of B per lane:
// lane (g, c) holds bytes 16c..16c+15 of the chunk of rows g (a) and g + 8
// (b) and of B column g (x) — the fragment mapping of gemm.cu's streaming
// kernels.
__device__ __forceinline__ void t1_mma_chunk(float (&acc)[4], const uint4& a, const uint4& b, const uint4& x) {
  mma_e4m3_16832(acc, a.x, b.x, a.y, b.y, x.x, x.y);
  mma_e4m3_16832(acc, a.z, b.z, a.w, b.w, x.z, x.w);
}

__device__ __forceinline__ float t1_amax4(const float4& y) { return absmax4(y); }

// Launches kernel(args) as a cooperative grid of `grid` CTAs of `threads`
// with `smem` bytes of dynamic shared memory: every CTA resident at once
// (they wait on each other), or the launch fails instead of hanging.
template <class A>
cudaError_t launch_cooperative(void (*kernel)(A), const A& args, int grid, int threads, size_t smem,
                               cudaStream_t st) {
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (e != cudaSuccess) return e;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  e = cudaLaunchKernelEx(&cfg, kernel, args);
  return e != cudaSuccess ? e : cudaGetLastError();
}

}  // namespace glmk
