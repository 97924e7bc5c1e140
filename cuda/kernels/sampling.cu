// sampling.cu — GPU sampling mirroring pkg/sample (see kernels.h for the rules).
// The raw-logit statistics (max, log-sum-exp, the NaN / finite / allowed
// flags, a greedy row's best) in chunks of kChunk ids, one CTA each, merged
// per row by one warp; greedy rows that no penalty changes take their token
// there; the penalties, the temperature transform and the draw one block per
// row. The descending sort for top-k / top-p is cub's stable segmented radix
// sort, so equal weights stay in ascending id order, exactly the CPU's tie
// rule.
#include <cub/device/device_segmented_radix_sort.cuh>

#include "common.cuh"

namespace glmk {
namespace {

constexpr int kThreads = 1024;
constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
// pkg/sample.AcceptUniform: Uniform with the seed XORed by this constant.
constexpr uint64_t kAcceptKeyXor = 0x5851F42D4C957F2Dull;

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// pkg/sample.Uniform: float64(Bits(seed, i) >> 11) * 2^-53.
__device__ __forceinline__ double uniform01(uint64_t seed, int64_t index) {
  const uint64_t key = mix64(seed + kGolden);
  const uint64_t bits = mix64(key + ((uint64_t)index + 1ull) * kGolden);
  return (double)(bits >> 11) * (1.0 / 9007199254740992.0);
}

// The raw-logit statistics of a row are gathered in chunks of kChunk ids, one
// CTA of kChunkThreads each (prep_chunk_kernel): one CTA a row took 22 us for
// an 18,944-id row on an H200 (2026-11-28 timeline of a batch-1 step), its
// float64 exps running on one SM's FP64 units.
constexpr int kChunkThreads = 256;
constexpr int kChunk = 8 * kChunkThreads;

// One chunk's statistics: max and sum of exp(l - max) over its raw logits
// (sum 0 when the max is -Inf), its flags (bit 0: NaN or +Inf, bit 1: a
// finite logit, bit 2: an allowed finite logit) and, for a greedy row without
// penalties (greedy_direct), its best allowed (logit, id).
struct ChunkStats {
  double max, sum, best_v;
  int flags, best_id;
};

__host__ __device__ inline int n_chunks(int V) { return (V + kChunk - 1) / kChunk; }

struct Workspace {
  double* w;       // [rows][V] working weights
  double* keys;    // [rows][V] sorted weights
  int* vals_in;    // [rows][V] token ids (iota per row)
  int* vals;       // [rows][V] sorted token ids
  double* lse;     // [rows]
  ChunkStats* chunks;  // [rows][n_chunks(V)]
  void* cub_temp;
  size_t cub_bytes;
};

size_t align256(size_t x) { return (x + 255) & ~(size_t)255; }

size_t cub_temp_bytes(int rows, int V) {
  size_t bytes = 0;
  const int n = rows * V;
  cub::DeviceSegmentedRadixSort::SortPairsDescending(
      nullptr, bytes, (const double*)nullptr, (double*)nullptr, (const int*)nullptr,
      (int*)nullptr, n, rows, (const int*)nullptr, (const int*)nullptr);
  return bytes;
}

Workspace carve(void* base, int rows, int V) {
  Workspace w{};
  char* p = static_cast<char*>(base);
  const size_t n = (size_t)rows * V;
  w.w = reinterpret_cast<double*>(p);
  p += align256(n * sizeof(double));
  w.keys = reinterpret_cast<double*>(p);
  p += align256(n * sizeof(double));
  w.vals_in = reinterpret_cast<int*>(p);
  p += align256(n * sizeof(int));
  w.vals = reinterpret_cast<int*>(p);
  p += align256(n * sizeof(int));
  w.lse = reinterpret_cast<double*>(p);
  p += align256((size_t)rows * sizeof(double));
  w.chunks = reinterpret_cast<ChunkStats*>(p);
  p += align256((size_t)rows * n_chunks(V) * sizeof(ChunkStats));
  w.cub_temp = p;
  w.cub_bytes = cub_temp_bytes(rows, V);
  return w;
}

// ---- block helpers (kThreads threads) ----

template <typename T>
__device__ T bsum(T v, T* sh) {
  return block_reduce(v, sh, SumOp());
}

// Best (value, id): larger value, ties to the lower id.
struct Best {
  double v;
  int id;
};
__device__ __forceinline__ Best best_of(Best a, Best b) {
  if (b.v > a.v || (b.v == a.v && b.id < a.id)) return b;
  return a;
}
__device__ Best block_best(Best b, double* shv, int* shi) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    Best c{__shfl_xor_sync(0xffffffffu, b.v, o), __shfl_xor_sync(0xffffffffu, b.id, o)};
    b = best_of(b, c);
  }
  __syncthreads();
  if (lane == 0) {
    shv[warp] = b.v;
    shi[warp] = b.id;
  }
  __syncthreads();
  Best r{shv[0], shi[0]};
  for (int i = 1; i < (int)(blockDim.x >> 5); ++i) r = best_of(r, Best{shv[i], shi[i]});
  return r;
}

__device__ int block_min_int(int v, int* sh) {
  return block_reduce(v, sh, MinOp());
}
__device__ int block_max_int(int v, int* sh) {
  return block_reduce(v, sh, MaxOp());
}

// Inclusive scan of v over the block; returns this thread's inclusive value and
// the block total in *total.
__device__ double block_incl_scan(double v, double* sh, double* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  double x = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const double y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  __syncthreads();
  if (lane == 31) sh[warp] = x;
  __syncthreads();
  if (warp == 0) {
    const int nw = blockDim.x >> 5;
    double s = lane < nw ? sh[lane] : 0.0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const double y = __shfl_up_sync(0xffffffffu, s, o);
      if (lane >= o) s += y;
    }
    if (lane < nw) sh[lane] = s;  // inclusive warp prefix
  }
  __syncthreads();
  const double before = warp > 0 ? sh[warp - 1] : 0.0;
  *total = sh[(blockDim.x >> 5) - 1];
  return x + before;
}

// A greedy row that no penalty changes: its token, the best allowed raw logit
// (ties to the lower id), comes from the chunks' bests (prep_kernel) and
// transform_kernel leaves it alone — the same token transform_kernel's pass
// over the working copy finds (best_of is a total order: any grouping of the
// ids gives the same best), without a second pass by one CTA over V doubles.
__device__ __forceinline__ bool greedy_direct(const SampleRow& p) {
  return p.temperature <= 0.f && !(p.repetition_penalty > 0.f && p.repetition_penalty != 1.f) &&
         p.frequency_penalty == 0.f && p.presence_penalty == 0.f;
}

// ---- K1a: per chunk of ids, the working copy and the raw-logit statistics ----
__global__ void __launch_bounds__(kChunkThreads) prep_chunk_kernel(SampleArgs a, Workspace ws) {
  const int row = blockIdx.y, c = blockIdx.x;
  const int V = a.V;
  const SampleRow p = a.params[row];
  if (p.skip) return;
  const float* lg = a.logits + (int64_t)row * a.ld;
  double* w = ws.w + (int64_t)row * V;
  int* vin = ws.vals_in + (int64_t)row * V;
  __shared__ double shd[32];
  __shared__ int sh_int[32];
  const uint32_t* mask = (p.mask_row >= 0 && a.masks) ? a.masks + (int64_t)p.mask_row * a.mask_words : nullptr;
  const int i0 = c * kChunk, i1 = min(V, i0 + kChunk);
  float l[kChunk / kChunkThreads];
  int flags = 0;
  double mx = -INFINITY;
  Best b{-INFINITY, 0x7fffffff};
#pragma unroll
  for (int k = 0; k < kChunk / kChunkThreads; ++k) {
    const int i = i0 + threadIdx.x + k * kChunkThreads;
    l[k] = -INFINITY;
    if (i < i1) {
      l[k] = lg[i];
      if (isnan(l[k]) || (isinf(l[k]) && l[k] > 0)) flags |= 1;
      const bool allowed = !mask || (mask[i >> 5] >> (i & 31) & 1u);
      if (!isinf(l[k])) flags |= allowed ? 6 : 2;
      const double wi = allowed ? (double)l[k] : -INFINITY;
      w[i] = wi;
      vin[i] = i;
      b = best_of(b, Best{wi, i});
      mx = fmax(mx, (double)l[k]);
    }
  }
  flags = block_reduce(flags, sh_int, OrOp());
  mx = block_reduce(mx, shd, MaxOp());
  double sum = 0.0;
  if (mx > -INFINITY) {
#pragma unroll
    for (int k = 0; k < kChunk / kChunkThreads; ++k) sum += exp((double)l[k] - mx);
    sum = block_reduce(sum, shd, SumOp());
  }
  if (greedy_direct(p)) b = block_best(b, shd, sh_int);  // block-uniform
  if (threadIdx.x == 0) ws.chunks[(int64_t)row * gridDim.x + c] = ChunkStats{mx, sum, b.v, flags, b.id};
}

// ---- K1b: the row's status and log-sum-exp from its chunks, top-n ----
__global__ void __launch_bounds__(kThreads) prep_kernel(SampleArgs a, Workspace ws) {
  const int row = blockIdx.x;
  const int V = a.V;
  const SampleRow p = a.params[row];
  const float* lg = a.logits + (int64_t)row * a.ld;
  __shared__ double shd[32];
  __shared__ int shi[32];
  __shared__ double sh_lse;
  __shared__ int sh_flags;
  if (p.skip) {
    if (threadIdx.x == 0) a.out[row] = SampleOut{-1, NAN, 0, 0};
    for (int k = threadIdx.x; k < kMaxTop; k += blockDim.x) {
      a.top_ids[row * kMaxTop + k] = -1;
      a.top_lp[row * kMaxTop + k] = NAN;
    }
    return;
  }
  // The chunks by warp 0, lane j taking chunks j, j + 32, ...: the flags,
  // the max M, the sum of each chunk's sum rescaled to M (log-sum-exp,
  // float64; lane partials in chunk order, then a fixed shuffle tree), and a
  // greedy_direct row's best.
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x, nc = n_chunks(V);
    const ChunkStats* cs = ws.chunks + (int64_t)row * nc;
    int flags = 0;
    double mx = -INFINITY;
    Best b{-INFINITY, 0x7fffffff};
    for (int c = lane; c < nc; c += 32) {
      flags |= cs[c].flags;
      mx = fmax(mx, cs[c].max);
      b = best_of(b, Best{cs[c].best_v, cs[c].best_id});
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      flags |= __shfl_xor_sync(0xffffffffu, flags, o);
      mx = fmax(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      b = best_of(b, Best{__shfl_xor_sync(0xffffffffu, b.v, o), __shfl_xor_sync(0xffffffffu, b.id, o)});
    }
    const bool bad = flags & 1, finite = flags & 2, alive = flags & 4;
    const bool ok = !bad && finite && alive;
    double s = 0.0;
    if (ok)
      for (int c = lane; c < nc; c += 32)
        if (cs[c].max > -INFINITY) s += cs[c].sum * exp(cs[c].max - mx);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    const double lse = mx + log(s);
    if (lane == 0) {
      a.out[row].token = -1;
      a.out[row].logprob = NAN;
      a.out[row].status = bad ? 1 : (!finite ? 2 : (!alive ? 5 : 0));
      sh_flags = ok ? 1 : 0;
      sh_lse = lse;
      if (ok) ws.lse[row] = lse;
      if (ok && greedy_direct(p)) {
        a.out[row].token = b.id;
        a.out[row].logprob = (float)((double)lg[b.id] - lse);
      }
    }
  }
  __syncthreads();
  if (!sh_flags) return;
  const double lse = sh_lse;
  // Top-n by raw logit: n passes, each the best strictly after the previous
  // pick in the order (value desc, id asc).
  double pv = INFINITY;
  int pid = -1;
  for (int k = 0; k < kMaxTop; ++k) {
    if (k >= p.n_top || k >= V) {
      if (threadIdx.x == 0) {
        a.top_ids[row * kMaxTop + k] = -1;
        a.top_lp[row * kMaxTop + k] = NAN;
      }
      continue;
    }
    Best b{-INFINITY, 0x7fffffff};
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
      const double v = (double)lg[i];
      const bool after = v < pv || (v == pv && i > pid);
      if (after) b = best_of(b, Best{v, i});
    }
    b = block_best(b, shd, shi);
    if (threadIdx.x == 0) {
      a.top_ids[row * kMaxTop + k] = b.id;
      a.top_lp[row * kMaxTop + k] = (float)((double)lg[b.id] - lse);
    }
    pv = b.v;
    pid = b.id;
  }
}

// ---- K2: penalties (one thread per distinct (row, token) entry) ----
__global__ void penalty_kernel(SampleArgs a, Workspace ws) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= a.n_pen) return;
  const int row = a.pen_row[e];
  const SampleRow p = a.params[row];
  if (p.skip) return;
  double* w = ws.w + (int64_t)row * a.V + a.pen_token[e];
  double x = *w;
  const bool rep_on = p.repetition_penalty > 0.f && p.repetition_penalty != 1.f;
  if (rep_on && a.pen_prompt[e] + a.pen_output[e] > 0) {
    const double r = (double)p.repetition_penalty;
    x = x > 0 ? x / r : x * r;
  }
  const int c = a.pen_output[e];
  if ((p.frequency_penalty != 0.f || p.presence_penalty != 0.f) && c > 0)
    x -= (double)c * (double)p.frequency_penalty + (double)p.presence_penalty;
  *w = x;
}

// ---- K3: greedy, or temperature + softmax numerators + min-p ----
__global__ void __launch_bounds__(kThreads) transform_kernel(SampleArgs a, Workspace ws) {
  const int row = blockIdx.x;
  const SampleRow p = a.params[row];
  if (p.skip || a.out[row].status != 0 || greedy_direct(p)) return;  // greedy_direct: prep_kernel chose
  const int V = a.V;
  double* w = ws.w + (int64_t)row * V;
  __shared__ double shd[32];
  __shared__ int shi[32];
  if (p.temperature <= 0.f) {
    Best b{-INFINITY, 0x7fffffff};
    for (int i = threadIdx.x; i < V; i += blockDim.x) b = best_of(b, Best{w[i], i});
    b = block_best(b, shd, shi);
    if (threadIdx.x == 0) {
      a.out[row].token = b.id;
      a.out[row].logprob = (float)((double)a.logits[(int64_t)row * a.ld + b.id] - ws.lse[row]);
    }
    return;
  }
  const double inv = 1.0 / (double)p.temperature;
  double mx = -INFINITY;
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    const double x = w[i] * inv;
    w[i] = x;
    mx = fmax(mx, x);
  }
  mx = block_reduce(mx, shd, MaxOp());
  if (mx == -INFINITY) {
    if (threadIdx.x == 0) a.out[row].status = 3;
    return;
  }
  const bool minp = p.min_p > 0.f;
  const double min_p = (double)p.min_p;
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    double x = exp(w[i] - mx);
    if (minp && x < min_p) x = 0.0;
    w[i] = x;
  }
}

// ---- K4 (after the sort): top-k, top-p, inverse-CDF draw ----
__global__ void __launch_bounds__(kThreads) draw_kernel(SampleArgs a, Workspace ws) {
  const int row = blockIdx.x;
  const SampleRow p = a.params[row];
  if (p.skip || a.out[row].status != 0 || p.temperature <= 0.f) return;
  const int V = a.V;
  double* w = ws.w + (int64_t)row * V;
  __shared__ double shd[32];
  __shared__ int sh_int[32];
  if (p.sort_segment >= 0) {
    const double* keys = ws.keys + (int64_t)row * V;
    const int* vals = ws.vals + (int64_t)row * V;
    int n_kept = 0;  // sorted prefix still kept
    // Count positive weights: keys are descending, so it is a prefix length.
    {
      int cnt = 0;
      for (int i = threadIdx.x; i < V; i += blockDim.x) cnt += keys[i] > 0.0;
      n_kept = block_reduce(cnt, sh_int, SumOp());
    }
    const bool topk = p.top_k > 0 && p.top_k < V;
    if (topk && n_kept >= p.top_k) {
      const double kth = keys[p.top_k - 1];
      int cnt = 0;
      for (int i = threadIdx.x; i < V; i += blockDim.x) {
        if (w[i] < kth) w[i] = 0.0;
        cnt += keys[i] >= kth;
      }
      n_kept = block_reduce(cnt, sh_int, SumOp());
      __syncthreads();
    }
    const bool topp = p.top_p > 0.f && p.top_p < 1.f;
    if (topp) {
      double tot = 0.0;
      for (int i = threadIdx.x; i < V; i += blockDim.x) tot += w[i];
      tot = bsum(tot, shd);
      const double limit = (double)p.top_p * tot;
      // Keep sorted position j iff the mass strictly before it is < limit.
      double carry = 0.0;
      int cut = n_kept;
      for (int base = 0; base < n_kept; base += blockDim.x) {
        const int j = base + threadIdx.x;
        const double v = j < n_kept ? keys[j] : 0.0;
        double chunk_total;
        const double incl = block_incl_scan(v, shd, &chunk_total);
        const double before = carry + incl - v;
        int first = (j < n_kept && before >= limit) ? j : 0x7fffffff;
        first = block_min_int(first, sh_int);
        if (first != 0x7fffffff) {
          cut = first;
          break;
        }
        carry += chunk_total;
      }
      for (int j = cut + threadIdx.x; j < n_kept; j += blockDim.x) w[vals[j]] = 0.0;
      __syncthreads();
    }
  }
  // Inverse CDF over ascending ids.
  double tot = 0.0;
  for (int i = threadIdx.x; i < V; i += blockDim.x) tot += w[i];
  tot = bsum(tot, shd);
  if (!(tot > 0.0) || isinf(tot)) {
    if (threadIdx.x == 0) a.out[row].status = 4;
    return;
  }
  if (p.draft >= 0 && p.draft < V) {
    // Speculative verification (pkg/sample/verify.go): accept the draft with
    // probability p[draft], else draw from p without it. The residual's mass
    // is summed again, not taken as tot - w[draft] (cancellation when the
    // draft held almost all of it).
    const double pd = w[p.draft] / tot;
    if (uniform01(p.seed ^ kAcceptKeyXor, p.sample_index) < pd) {
      if (threadIdx.x == 0) {
        a.out[row].token = p.draft;
        a.out[row].logprob = (float)((double)a.logits[(int64_t)row * a.ld + p.draft] - ws.lse[row]);
      }
      return;
    }
    __syncthreads();  // every thread has read w[draft]
    if (threadIdx.x == 0) w[p.draft] = 0.0;
    __syncthreads();
    tot = 0.0;
    for (int i = threadIdx.x; i < V; i += blockDim.x) tot += w[i];
    tot = bsum(tot, shd);
    if (!(tot > 0.0) || isinf(tot)) {
      if (threadIdx.x == 0) a.out[row].status = 4;
      return;
    }
  }
  const double target = uniform01(p.seed, p.sample_index) * tot;
  double carry = 0.0;
  int tok = -1;
  for (int base = 0; base < V; base += blockDim.x) {
    const int i = base + threadIdx.x;
    const double v = i < V ? w[i] : 0.0;
    double chunk_total;
    const double incl = block_incl_scan(v, shd, &chunk_total);
    int first = (i < V && v > 0.0 && carry + incl > target) ? i : 0x7fffffff;
    first = block_min_int(first, sh_int);
    if (first != 0x7fffffff) {
      tok = first;
      break;
    }
    carry += chunk_total;
  }
  if (tok < 0) {  // rounding left the sum short: the last kept id
    int last = -1;
    for (int i = threadIdx.x; i < V; i += blockDim.x)
      if (w[i] > 0.0) last = i;
    tok = block_max_int(last, sh_int);
  }
  if (threadIdx.x == 0) {
    a.out[row].token = tok;
    a.out[row].logprob = (float)((double)a.logits[(int64_t)row * a.ld + tok] - ws.lse[row]);
  }
}

}  // namespace

size_t sample_workspace_bytes(int rows, int V) {
  const size_t n = (size_t)rows * V;
  return align256(n * sizeof(double)) * 2 + align256(n * sizeof(int)) * 2 +
         align256((size_t)rows * sizeof(double)) + align256((size_t)rows * n_chunks(V) * sizeof(ChunkStats)) +
         align256(cub_temp_bytes(rows, V));
}

cudaError_t sample_rows(const SampleArgs& a, cudaStream_t st) {
  if (a.rows <= 0) return cudaSuccess;
  // (rows: the chunk kernel's grid y, at most 65,535)
  if (a.V <= 0 || a.rows > 65535 || a.workspace_bytes < sample_workspace_bytes(a.rows, a.V))
    return cudaErrorInvalidValue;
  Workspace ws = carve(a.workspace, a.rows, a.V);
  prep_chunk_kernel<<<dim3(n_chunks(a.V), a.rows), kChunkThreads, 0, st>>>(a, ws);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  prep_kernel<<<a.rows, kThreads, 0, st>>>(a, ws);
  e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  if (a.n_pen > 0) {
    penalty_kernel<<<ceil_div(a.n_pen, 256), 256, 0, st>>>(a, ws);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
  }
  transform_kernel<<<a.rows, kThreads, 0, st>>>(a, ws);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  if (a.n_seg > 0) {
    size_t bytes = ws.cub_bytes;
    e = cub::DeviceSegmentedRadixSort::SortPairsDescending(
        ws.cub_temp, bytes, ws.w, ws.keys, ws.vals_in, ws.vals, a.rows * a.V, a.n_seg,
        a.seg_begin, a.seg_end, 0, (int)(sizeof(double) * 8), st);
    if (e != cudaSuccess) return e;
  }
  draw_kernel<<<a.rows, kThreads, 0, st>>>(a, ws);
  return cudaGetLastError();
}

}  // namespace glmk
