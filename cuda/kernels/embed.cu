// embed.cu — embedding gather (BF16 table -> FP32 residual stream) and the
// reordering of vocab-parallel lm_head outputs after the all-gather.
#include "common.cuh"

namespace glmk {
namespace {

__global__ void embed_kernel(const __nv_bfloat16* __restrict__ table, const int* __restrict__ ids,
                             int H, float* __restrict__ h) {
  pdl_launch_dependents();
  const int t = blockIdx.x;
  const __nv_bfloat162* row = reinterpret_cast<const __nv_bfloat162*>(table + (int64_t)ids[t] * H);
  float2* out = reinterpret_cast<float2*>(h + (int64_t)t * H);
  for (int c = threadIdx.x; c < H / 2; c += blockDim.x) out[c] = __bfloat1622float2(row[c]);
}

// 16-byte path (H % 8 == 0): 8 BF16 per thread -> two float4 stores, the row
// split over gridDim.y CTAs of kEmbedThreads threads (one chunk each).
constexpr int kEmbedThreads = 128;

__global__ void __launch_bounds__(kEmbedThreads) embed_vec_kernel(
    const __nv_bfloat16* __restrict__ table, const int* __restrict__ ids, int H,
    float* __restrict__ h) {
  pdl_launch_dependents();
  const int t = blockIdx.x;
  const int c = blockIdx.y * kEmbedThreads + threadIdx.x;  // 8-element chunk
  if (c >= H / 8) return;
  const uint4 raw = __ldg(reinterpret_cast<const uint4*>(table + (int64_t)ids[t] * H) + c);
  const __nv_bfloat162* b = reinterpret_cast<const __nv_bfloat162*>(&raw);
  const float2 f0 = __bfloat1622float2(b[0]), f1 = __bfloat1622float2(b[1]);
  const float2 f2 = __bfloat1622float2(b[2]), f3 = __bfloat1622float2(b[3]);
  float4* out = reinterpret_cast<float4*>(h + (int64_t)t * H) + 2 * c;
  out[0] = make_float4(f0.x, f0.y, f1.x, f1.y);
  out[1] = make_float4(f2.x, f2.y, f3.x, f3.y);
}

__global__ void interleave_kernel(const float* __restrict__ parts, int tp, int rows, int vl,
                                  float* __restrict__ out) {
  const int64_t total = (int64_t)tp * rows * vl;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t v = i % vl;
    const int64_t r = (i / vl) % rows;
    const int64_t p = i / ((int64_t)vl * rows);
    out[r * (int64_t)tp * vl + p * vl + v] = parts[i];
  }
}

}  // namespace

cudaError_t embed_gather(const __nv_bfloat16* table, const int* ids, int T, int H, float* h,
                         cudaStream_t st) {
  if (T <= 0) return cudaSuccess;
  if (H % 2 != 0) return cudaErrorInvalidValue;
  if (H % 8 == 0 && (uintptr_t)table % 16 == 0 && (uintptr_t)h % 16 == 0) {
    const dim3 grid(T, (H / 8 + kEmbedThreads - 1) / kEmbedThreads);
    embed_vec_kernel<<<grid, kEmbedThreads, 0, st>>>(table, ids, H, h);
  } else {
    embed_kernel<<<T, 256, 0, st>>>(table, ids, H, h);
  }
  return cudaGetLastError();
}

cudaError_t logits_interleave(const float* parts, int tp, int rows, int v_local, float* out,
                              cudaStream_t st) {
  const int64_t total = (int64_t)tp * rows * v_local;
  if (total <= 0) return cudaSuccess;
  const int blocks = (int)std::min<int64_t>((total + 255) / 256, 4096);
  interleave_kernel<<<blocks, 256, 0, st>>>(parts, tp, rows, v_local, out);
  return cudaGetLastError();
}

}  // namespace glmk
