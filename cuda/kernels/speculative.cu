// speculative.cu — the small kernels of speculative decoding with the MTP
// layer (docs/speculative.md): the acceptance that tells the draft pass where
// each sequence's valid positions end, the rows of the chained passes, the
// MTP layer's input rows, and the drafts' argmax. The MTP decoder layer
// itself runs through the ordinary attention and MoE kernels.
#include <climits>

#include "common.cuh"

namespace glmk {
namespace {

__global__ void spec_accept_kernel(const SampleOut* __restrict__ out, const SpecSeq* __restrict__ seqs,
                                   const int* __restrict__ n, int cap, const int* __restrict__ tokens,
                                   int* __restrict__ mtp_next, int* __restrict__ mtp_rows) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= cap) return;
  if (i >= *n) {  // padding entry of a captured pass: a valid row to read
    mtp_rows[i] = 0;
    return;
  }
  const SpecSeq s = seqs[i];
  // The host applies the same rule to the same SampleOut rows (step.cu), so
  // the two agree on the accepted count.
  int a = 0;
  while (a < s.n_drafts) {
    const SampleOut o = out[s.logit_row0 + a];
    if (o.status != 0 || o.token != tokens[s.tok_row0 + 1 + a]) break;
    ++a;
  }
  const SampleOut o = out[s.logit_row0 + a];
  const int row = s.tok_row0 + a;
  mtp_next[row] = (o.status == 0 && o.token >= 0) ? o.token : 0;
  mtp_rows[i] = row;
}

constexpr int kChainThreads = 256;

// One block per entry: thread 0 writes the row's metadata, all threads its
// hidden input.
__global__ void __launch_bounds__(kChainThreads) spec_chain_rows_kernel(
    const SpecSeq* __restrict__ seqs, const int* __restrict__ n, int j, const int* __restrict__ positions,
    const int* __restrict__ mtp_rows, const int* __restrict__ block_tables, int block_size,
    const float* __restrict__ h, const float* __restrict__ delta, int H, const int* __restrict__ prev,
    ChainRows out, float* __restrict__ hid) {
  const int i = blockIdx.x;
  const bool real = i < *n;
  float* dst = hid + (int64_t)i * H;
  if (!real) {
    for (int c = threadIdx.x; c < H; c += blockDim.x) dst[c] = 0.f;
  } else {
    const int src = j == 2 ? mtp_rows[i] : i;
    const float* hs = h + (int64_t)src * H;
    const float* ds = delta + (int64_t)src * H;
    for (int c = threadIdx.x; c < H; c += blockDim.x) dst[c] = hs[c] + ds[c];
  }
  if (threadIdx.x != 0) return;
  out.dec_qrow[i] = i;
  if (!real) {
    out.pos[i] = 0;
    out.slot[i] = -1;
    out.dec_ctx[i] = 0;
    out.dec_bt[i] = 0;
    out.tok[i] = 0;
    return;
  }
  const SpecSeq s = seqs[i];
  const int p = positions[mtp_rows[i]] + j - 1;
  const int blk = p / block_size;
  const bool ok = j <= s.propose && blk < s.bt_len;
  out.pos[i] = p;
  out.slot[i] = ok ? block_tables[s.bt_offset + blk] * block_size + p % block_size : -1;
  out.dec_ctx[i] = ok ? p + 1 : 0;
  out.dec_bt[i] = s.bt_offset;
  out.tok[i] = prev[i];
}

constexpr int kInputThreads = 256;

__global__ void __launch_bounds__(kInputThreads) mtp_input_kernel(
    const __nv_bfloat16* __restrict__ embed, int V, const int* __restrict__ next,
    const float* __restrict__ hid, const float* __restrict__ enorm, const float* __restrict__ hnorm,
    int H, float eps, __nv_bfloat16* __restrict__ out) {
  __shared__ float sh[32];
  const int r = blockIdx.x;
  int tok = next[r];
  if (tok < 0 || tok >= V) tok = 0;
  const __nv_bfloat16* e = embed + (int64_t)tok * H;
  const float* g = hid + (int64_t)r * H;
  float se = 0.f, sg = 0.f;
  for (int i = threadIdx.x; i < H; i += blockDim.x) {
    const float x = __bfloat162float(e[i]), y = g[i];
    se += x * x;
    sg += y * y;
  }
  se = block_reduce(se, sh, SumOp());
  sg = block_reduce(sg, sh, SumOp());
  const float re = rsqrtf(se / (float)H + eps), rg = rsqrtf(sg / (float)H + eps);
  __nv_bfloat16* o = out + (int64_t)r * 2 * H;
  for (int i = threadIdx.x; i < H; i += blockDim.x) {
    o[i] = __float2bfloat16_rn(enorm[i] * (__bfloat162float(e[i]) * re));
    o[H + i] = __float2bfloat16_rn(hnorm[i] * (g[i] * rg));
  }
}

constexpr int kArgmaxThreads = 512;

__global__ void __launch_bounds__(kArgmaxThreads) argmax_rows_kernel(const float* __restrict__ x,
                                                                     int64_t ld, int V,
                                                                     int* __restrict__ out) {
  __shared__ float sv[32];
  __shared__ int si[32];
  const float* row = x + (int64_t)blockIdx.x * ld;
  float best = -INFINITY;
  int bi = INT_MAX;
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    const float v = row[i];
    if (v > best || (v == best && bi == INT_MAX)) {  // ascending i: the first of equals wins
      best = v;
      bi = i;
    }
  }
  // (value, id) pairs: larger value, then lower id; NaN never compared true.
  for (int o = 16; o > 0; o >>= 1) {
    const float v2 = __shfl_xor_sync(0xffffffffu, best, o);
    const int i2 = __shfl_xor_sync(0xffffffffu, bi, o);
    if (v2 > best || (v2 == best && i2 < bi)) {
      best = v2;
      bi = i2;
    }
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    sv[warp] = best;
    si[warp] = bi;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < (int)(blockDim.x >> 5); ++w)
      if (sv[w] > best || (sv[w] == best && si[w] < bi)) {
        best = sv[w];
        bi = si[w];
      }
    out[blockIdx.x] = bi == INT_MAX ? 0 : bi;
  }
}

}  // namespace

cudaError_t spec_accept(const SampleOut* out, const SpecSeq* seqs, const int* n, int cap,
                        const int* tokens, int* mtp_next, int* mtp_rows, cudaStream_t st) {
  if (cap <= 0) return cudaSuccess;
  spec_accept_kernel<<<(cap + 127) / 128, 128, 0, st>>>(out, seqs, n, cap, tokens, mtp_next, mtp_rows);
  return cudaGetLastError();
}

cudaError_t spec_chain_rows(const SpecSeq* seqs, const int* n, int cap, int j, const int* positions,
                            const int* mtp_rows, const int* block_tables, int block_size,
                            const float* h, const float* delta, int H, const int* prev, ChainRows out,
                            float* hid, cudaStream_t st) {
  if (cap <= 0) return cudaSuccess;
  if (j < 2 || H <= 0 || block_size <= 0) return cudaErrorInvalidValue;
  spec_chain_rows_kernel<<<cap, kChainThreads, 0, st>>>(seqs, n, j, positions, mtp_rows, block_tables,
                                                        block_size, h, delta, H, prev, out, hid);
  return cudaGetLastError();
}

cudaError_t mtp_input(const __nv_bfloat16* embed, int V, const int* next, const float* hid,
                      const float* enorm, const float* hnorm, int rows, int H, float eps,
                      __nv_bfloat16* out, cudaStream_t st) {
  if (rows <= 0) return cudaSuccess;
  if (H <= 0 || V <= 0) return cudaErrorInvalidValue;
  mtp_input_kernel<<<rows, kInputThreads, 0, st>>>(embed, V, next, hid, enorm, hnorm, H, eps, out);
  return cudaGetLastError();
}

cudaError_t argmax_rows(const float* x, int64_t ld, int rows, int V, int* out, cudaStream_t st) {
  if (rows <= 0) return cudaSuccess;
  if (V <= 0 || ld < V) return cudaErrorInvalidValue;
  argmax_rows_kernel<<<rows, kArgmaxThreads, 0, st>>>(x, ld, V, out);
  return cudaGetLastError();
}

}  // namespace glmk
