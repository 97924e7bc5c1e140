// quant.cu — per-token dynamic FP8 activation quantization (docs/model.md §4.3),
// alone and fused with SiLU(gate)*up (the input of every down projection).
#include <algorithm>
#include <type_traits>

#include "common.cuh"

namespace glmk {
namespace {

constexpr int kThreads = 256;

__global__ void quant_rows_kernel(const float* __restrict__ x, int64_t ldx, int cols,
                                  uint8_t* __restrict__ q, int64_t ldq, float* __restrict__ scale,
                                  const int* __restrict__ rows_dev) {
  pdl_launch_dependents();
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
  const float s = fmaxf(amax / kFp8Max, kMinActScale), inv = 1.0f / s;
  uint32_t* qr = reinterpret_cast<uint32_t*>(q + r * ldq);
  for (int i = threadIdx.x; i < n4; i += blockDim.x) qr[i] = pack_e4m3x4(xr[i], inv);
  if (threadIdx.x == 0) scale[r] = s;
}

__device__ __forceinline__ float silu(float g) { return g / (1.0f + expf(-g)); }

__global__ void silu_mul_quant_kernel(const float* __restrict__ gu, int inter,
                                      uint8_t* __restrict__ q, float* __restrict__ scale,
                                      const int* __restrict__ rows_dev) {
  pdl_launch_dependents();
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
  const float s = fmaxf(amax / kFp8Max, kMinActScale), inv = 1.0f / s;
  uint32_t* qr = reinterpret_cast<uint32_t*>(q + (int64_t)r * inter);
  for (int i = threadIdx.x; i < n4; i += blockDim.x) {
    float4 g = g4[i], u = u4[i];
    qr[i] = pack_e4m3x4(make_float4(silu(g.x) * u.x, silu(g.y) * u.y, silu(g.z) * u.z, silu(g.w) * u.w), inv);
  }
  if (threadIdx.x == 0) scale[r] = s;
}

__global__ void silu_mul_kernel(const float* __restrict__ gu, int inter, float* __restrict__ h,
                                const int* __restrict__ rows_dev) {
  const int r = blockIdx.x;
  if (rows_dev && r >= *rows_dev) return;
  const float* g = gu + (int64_t)r * 2 * inter;
  for (int i = threadIdx.x; i < inter; i += blockDim.x)
    h[(int64_t)r * inter + i] = silu(g[i]) * g[inter + i];
}

// Fast paths (decode shapes: cols / inter up to 4096 / 8192 floats): the row is
// loaded once with 16-byte loads and kept in registers (NV float4 per thread),
// SiLU*up evaluated once per element; one block reduction for the amax. Per
// element the float operations are those of the kernels above, so the codes
// and scales are identical.
constexpr int kVecMax = 8;

__device__ __forceinline__ float amax4(float amax, float4 v) {
  return fmaxf(amax, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
}
// The BF16 (prefill) form's SiLU is common.cuh's silu_fast: the exact form
// above is an IEEE division and an accurate expf an element, and that kernel
// was issue-bound (ncu, H200, a 2k prefill's 4,096 rows: 19.1 us, SM 55%,
// DRAM 27%); the FP32 (decode) forms keep the exact SiLU their fused kernels
// repeat bit for bit.

template <int NV>
__global__ void __launch_bounds__(kThreads) quant_rows_vec_kernel(
    const float* __restrict__ x, int64_t ldx, int cols, uint8_t* __restrict__ q, int64_t ldq,
    float* __restrict__ scale, const int* __restrict__ rows_dev) {
  pdl_launch_dependents();
  const int r = blockIdx.x;
  if (rows_dev && r >= *rows_dev) return;
  __shared__ float scratch[32];
  const float4* xr = reinterpret_cast<const float4*>(x + r * ldx);
  const int n4 = cols / 4, tid = threadIdx.x, nt = blockDim.x;
  float4 v[NV];
  float amax = 0.f;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int c = tid + k * nt;
    if (c < n4) {
      v[k] = __ldg(xr + c);
      amax = amax4(amax, v[k]);
    }
  }
  amax = block_reduce(amax, scratch, MaxOp());
  const float s = fmaxf(amax / kFp8Max, kMinActScale), inv = 1.0f / s;
  uint32_t* qr = reinterpret_cast<uint32_t*>(q + r * ldq);
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int c = tid + k * nt;
    if (c < n4) qr[c] = pack_e4m3x4(v[k], inv);
  }
  if (tid == 0) scale[r] = s;
}

// Four consecutive BF16 values of a row, widened exactly to FP32.
__device__ __forceinline__ float4 load4(const __nv_bfloat16* row, int c) {
  const uint2 u = __ldg(reinterpret_cast<const uint2*>(row) + c);
  const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
  const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}

// GT: the gate|up rows' type, float or __nv_bfloat16. SC (float rows only):
// the rows are a GEMM's unscaled sums; each value is first scaled as
// gemm_fp8_epilogue does, (sum * x_scale[r]) * w_scale[c] (c over 2 * inter).
// Rows blockIdx.x, + gridDim.x, ... below min(rows, *rows_dev): with rows_dev
// (the experts' sorted rows, a bound of rows x slots launched) the grid is a
// few CTAs an SM instead of a CTA a bound row — a 2k prefill launched 18,432
// CTAs for ~4,100 live rows, the rest exiting after reading *rows_dev.
// ACT (BF16 rows only): the rows [rows][inter] hold SiLU·up already (the
// SiLU-fused gate|up, GroupedTcTuning::silu_gate_up), so this is their FP8
// quantization alone.
template <int NV, typename GT = float, bool SC = false, bool ACT = false>
__global__ void __launch_bounds__(kThreads) silu_mul_quant_vec_kernel(
    const GT* __restrict__ gu, int inter, uint8_t* __restrict__ q, float* __restrict__ scale, int rows,
    const int* __restrict__ rows_dev, const float* __restrict__ x_scale = nullptr,
    const float* __restrict__ w_scale = nullptr) {
  pdl_launch_dependents();
  __shared__ float scratch[32];
  const int n_rows = rows_dev ? min(rows, *rows_dev) : rows;
  for (int r = blockIdx.x; r < n_rows; r += gridDim.x) {
    const int n4 = inter / 4, tid = threadIdx.x, nt = blockDim.x;
    float4 h[NV], u[NV];
    if constexpr (std::is_same_v<GT, float>) {  // (as before the BF16 form: the same code)
      const float4* g4 = reinterpret_cast<const float4*>(gu + (int64_t)r * 2 * inter);
      const float4* u4 = g4 + inter / 4;
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        const int c = tid + k * nt;
        if (c < n4) {
          h[k] = __ldg(g4 + c);
          u[k] = __ldg(u4 + c);
        }
      }
      if constexpr (SC) {
        const float xr = __ldg(x_scale + r);
        const float4* wg4 = reinterpret_cast<const float4*>(w_scale);
        const float4* wu4 = wg4 + inter / 4;
#pragma unroll
        for (int k = 0; k < NV; ++k) {
          const int c = tid + k * nt;
          if (c < n4) {
            const float4 a = __ldg(wg4 + c), b = __ldg(wu4 + c);
            const float4 g = h[k], v = u[k];
            h[k] = make_float4(g.x * xr * a.x, g.y * xr * a.y, g.z * xr * a.z, g.w * xr * a.w);
            u[k] = make_float4(v.x * xr * b.x, v.y * xr * b.y, v.z * xr * b.z, v.w * xr * b.w);
          }
        }
      }
    } else if constexpr (ACT) {
      const GT* a_row = gu + (int64_t)r * inter;
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        const int c = tid + k * nt;
        if (c < n4) h[k] = load4(a_row, c);
      }
    } else {
      const GT* g_row = gu + (int64_t)r * 2 * inter;
      const GT* u_row = g_row + inter;
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        const int c = tid + k * nt;
        if (c < n4) {
          h[k] = load4(g_row, c);
          u[k] = load4(u_row, c);
        }
      }
    }
    constexpr bool kFast = std::is_same_v<GT, __nv_bfloat16>;  // (silu_fast's comment)
    float amax = 0.f;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int c = tid + k * nt;
      if (c < n4) {
        if constexpr (!ACT) {  // (with ACT h[k] is the activation already)
          const float4 g = h[k];
          if constexpr (kFast)
            h[k] = make_float4(silu_fast(g.x) * u[k].x, silu_fast(g.y) * u[k].y, silu_fast(g.z) * u[k].z,
                               silu_fast(g.w) * u[k].w);
          else
            h[k] = make_float4(silu(g.x) * u[k].x, silu(g.y) * u[k].y, silu(g.z) * u[k].z, silu(g.w) * u[k].w);
        }
        amax = amax4(amax, h[k]);
      }
    }
    amax = block_reduce(amax, scratch, MaxOp());
    const float s = fmaxf(amax / kFp8Max, kMinActScale);
    const float inv = 1.0f / s;
    uint32_t* qr = reinterpret_cast<uint32_t*>(q + (int64_t)r * inter);
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int c = tid + k * nt;
      if (c < n4) qr[c] = pack_e4m3x4(h[k], inv);
    }
    if (tid == 0) scale[r] = s;
  }
}

// The SiLU launches' grid: a CTA a row, or with rows_dev (most of the bound
// rows empty) at most kSiluCtasPerSm CTAs an SM striding over the live rows.
constexpr int kSiluCtasPerSm = 8;
static int silu_grid(int rows, const int* rows_dev) {
  if (!rows_dev) return rows;
  int dev = 0;
  DeviceInfo di;
  if (device_info(dev, di) != cudaSuccess || di.sms <= 0) return rows;
  return std::min(rows, di.sms * kSiluCtasPerSm);
}

// Vectors per thread and threads per row for n4 float4 columns: 0 if the row
// does not fit the register path.
static int vec_shape(int n4, int* threads) {
  if (n4 <= 0 || n4 > kThreads * kVecMax) return 0;
  int nv = (n4 + kThreads - 1) / kThreads;
  if (nv == 7) nv = 8;  // (no NV = 7 instance: ptxas spills it)
  *threads = ((n4 + nv - 1) / nv + 31) / 32 * 32;
  return nv;
}

#define GLMK_VEC_DISPATCH(NV, KERNEL, GRID, THREADS, ST, ...)          \
  switch (NV) {                                                         \
    case 1: KERNEL<1><<<GRID, THREADS, 0, ST>>>(__VA_ARGS__); break;    \
    case 2: KERNEL<2><<<GRID, THREADS, 0, ST>>>(__VA_ARGS__); break;    \
    case 3: KERNEL<3><<<GRID, THREADS, 0, ST>>>(__VA_ARGS__); break;    \
    case 4: KERNEL<4><<<GRID, THREADS, 0, ST>>>(__VA_ARGS__); break;    \
    case 5: KERNEL<5><<<GRID, THREADS, 0, ST>>>(__VA_ARGS__); break;    \
    case 6: KERNEL<6><<<GRID, THREADS, 0, ST>>>(__VA_ARGS__); break;    \
    default: KERNEL<8><<<GRID, THREADS, 0, ST>>>(__VA_ARGS__); break;   \
  }

}  // namespace

cudaError_t silu_mul_f32(const float* gu, int rows, int inter, float* h, const int* rows_dev,
                         cudaStream_t st) {
  if (rows <= 0) return cudaSuccess;
  silu_mul_kernel<<<rows, kThreads, 0, st>>>(gu, inter, h, rows_dev);
  return cudaGetLastError();
}

cudaError_t quant_rows_fp8(const float* x, int64_t ldx, int rows, int cols, uint8_t* q,
                           int64_t ldq, float* scale, const int* rows_dev, cudaStream_t st) {
  if (rows <= 0) return cudaSuccess;
  if (cols % 4 != 0 || ldx % 4 != 0 || ldq % 4 != 0) return cudaErrorInvalidValue;
  int threads = 0;
  const int nv = ((uintptr_t)x % 16 == 0 && (uintptr_t)q % 4 == 0) ? vec_shape(cols / 4, &threads) : 0;
  if (nv > 0) {
    GLMK_VEC_DISPATCH(nv, quant_rows_vec_kernel, rows, threads, st, x, ldx, cols, q, ldq, scale,
                      rows_dev)
  } else {
    quant_rows_kernel<<<rows, kThreads, 0, st>>>(x, ldx, cols, q, ldq, scale, rows_dev);
  }
  return cudaGetLastError();
}

// The SiLU vector forms instantiated for BF16 and scaled rows: launch(NV) for
// nv = 1..4 float4 per thread; false for any other nv.
template <typename F>
static bool with_silu_vec4(int nv, F&& launch) {
  switch (nv) {
    case 1: launch(std::integral_constant<int, 1>{}); return true;
    case 2: launch(std::integral_constant<int, 2>{}); return true;
    case 3: launch(std::integral_constant<int, 3>{}); return true;
    case 4: launch(std::integral_constant<int, 4>{}); return true;
    default: return false;
  }
}

// Whether rows of `inter` columns fit the SiLU's vector forms instantiated for
// BF16 and scaled rows (one to four float4 per thread; no scalar fallback).
static bool silu_vec4_fits(int inter) {
  int threads = 0;
  if (inter <= 0 || inter % 4 != 0) return false;
  const int nv = vec_shape(inter / 4, &threads);
  return nv >= 1 && nv <= 4;
}

bool silu_mul_quant_bf16_supported(int inter) { return silu_vec4_fits(inter); }

// BF16 rows into FP8: SiLU·up of [gate | up] rows (ACT false) or rows that
// are the activations already (ACT true).
template <bool ACT>
static cudaError_t bf16_rows_fp8(const __nv_bfloat16* x, int rows, int inter, uint8_t* q, float* scale,
                                 const int* rows_dev, cudaStream_t st) {
  if (rows <= 0) return cudaSuccess;
  int threads = 0;
  const int nv = inter % 4 == 0 && (uintptr_t)x % 8 == 0 && (uintptr_t)q % 4 == 0
                     ? vec_shape(inter / 4, &threads)
                     : 0;
  if (nv <= 0) return cudaErrorInvalidValue;  // no scalar form: the runtime's shapes fit
  const int grid = silu_grid(rows, rows_dev);
  if (!with_silu_vec4(nv, [&](auto NV) {
        silu_mul_quant_vec_kernel<decltype(NV)::value, __nv_bfloat16, false, ACT>
            <<<grid, threads, 0, st>>>(x, inter, q, scale, rows, rows_dev);
      }))
    return cudaErrorInvalidValue;
  return cudaGetLastError();
}

cudaError_t silu_mul_quant_fp8(const __nv_bfloat16* gu, int rows, int inter, uint8_t* q, float* scale,
                               const int* rows_dev, cudaStream_t st) {
  return bf16_rows_fp8<false>(gu, rows, inter, q, scale, rows_dev, st);
}

cudaError_t quant_rows_fp8_bf16(const __nv_bfloat16* x, int rows, int cols, uint8_t* q, float* scale,
                                const int* rows_dev, cudaStream_t st) {
  return bf16_rows_fp8<true>(x, rows, cols, q, scale, rows_dev, st);
}

cudaError_t silu_mul_quant_fp8_scaled(const float* gu, int rows, int inter, const float* x_scale,
                                      const float* w_scale, uint8_t* q, float* scale, cudaStream_t st) {
  if (rows <= 0) return cudaSuccess;
  int threads = 0;
  const int nv = inter % 4 == 0 && (uintptr_t)gu % 16 == 0 && (uintptr_t)q % 4 == 0 && x_scale && w_scale &&
                         (uintptr_t)w_scale % 16 == 0
                     ? vec_shape(inter / 4, &threads)
                     : 0;
  if (nv <= 0) return cudaErrorInvalidValue;  // no scalar form: the runtime checks first
  if (!with_silu_vec4(nv, [&](auto NV) {
        silu_mul_quant_vec_kernel<decltype(NV)::value, float, true>
            <<<rows, threads, 0, st>>>(gu, inter, q, scale, rows, nullptr, x_scale, w_scale);
      }))
    return cudaErrorInvalidValue;
  return cudaGetLastError();
}

bool silu_mul_quant_fp8_scaled_supported(int inter, const float* w_scale) {
  return (uintptr_t)w_scale % 16 == 0 && silu_vec4_fits(inter);
}

cudaError_t silu_mul_quant_fp8(const float* gu, int rows, int inter, uint8_t* q, float* scale,
                               const int* rows_dev, cudaStream_t st) {
  if (rows <= 0) return cudaSuccess;
  if (inter % 4 != 0) return cudaErrorInvalidValue;
  int threads = 0;
  const int nv = ((uintptr_t)gu % 16 == 0 && (uintptr_t)q % 4 == 0) ? vec_shape(inter / 4, &threads) : 0;
  if (nv > 0) {
    GLMK_VEC_DISPATCH(nv, silu_mul_quant_vec_kernel, silu_grid(rows, rows_dev), threads, st, gu, inter, q, scale,
                      rows, rows_dev)
  } else {
    silu_mul_quant_kernel<<<rows, kThreads, 0, st>>>(gu, inter, q, scale, rows_dev);
  }
  return cudaGetLastError();
}

}  // namespace glmk
