// moe.cu — MoE routing and data movement (docs/model.md §3.6): FP32 router
// selection (sigmoid, correction bias for selection only, group-limited top-k,
// renormalise, scale), the token-by-expert sort that feeds the grouped
// streaming FP8 GEMMs (gemm.cu), and the weighted combine that folds the
// routed experts and the shared expert (the last slot, weight 1) together.
#include <atomic>
#include <type_traits>

#include "common.cuh"
#include "moe_route.cuh"

namespace glmk {
namespace {

constexpr int kRouterWarps = 4;

template <int EPL>
__global__ void router_kernel(RouterArgs a) {
  pdl_launch_dependents();
  const int t = blockIdx.x * kRouterWarps + (threadIdx.x >> 5);
  if (t >= a.T) return;
  const float* lg = a.logits + (int64_t)t * a.E;
  route_token<EPL>(a, t, [&](int e) { return lg[e]; });
}


constexpr int kMaxGroups = 1024;
constexpr int kAlignRegs = 8;  // ids per thread kept in registers between the two passes

// Counting sort of the n = T*slots (token, slot) pairs by group, by one whole
// block (any size, a multiple of 32): offsets[G+1], sorted_rows[pos] = token,
// inv[i] = pos or -1. cnt/cur: shared arrays of G ints. Positions inside a
// group follow shared-memory atomics (any order); counts and offsets are exact.
// CG: read ids through L2 (ids written by other CTAs of the same launch).
template <bool CG>
__device__ void align_block(const int* ids, int n, int slots, int G, int* __restrict__ offsets,
                            int* __restrict__ sorted_rows, int* __restrict__ inv, int* cnt,
                            int* cur) {
  const int tid = threadIdx.x, nt = blockDim.x;
  const int lane = tid & 31, warp = tid >> 5;
  auto ld = [&](int i) { return CG ? __ldcg(ids + i) : ids[i]; };
  for (int i = tid; i < G; i += nt) cnt[i] = 0;
  int my[kAlignRegs];
#pragma unroll
  for (int k = 0; k < kAlignRegs; ++k) {
    const int i = tid + k * nt;
    my[k] = i < n ? ld(i) : -1;
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < kAlignRegs; ++k)
    if (my[k] >= 0 && my[k] < G) atomicAdd(&cnt[my[k]], 1);
  for (int i = tid + kAlignRegs * nt; i < n; i += nt) {
    const int e = ld(i);
    if (e >= 0 && e < G) atomicAdd(&cnt[e], 1);
  }
  __syncthreads();
  if (warp == 0) {  // exclusive scan of the counts, 32 groups at a time
    int carry = 0;
    for (int base = 0; base < G; base += 32) {
      const int g = base + lane;
      const int c = g < G ? cnt[g] : 0;
      int incl = c;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
      }
      if (g < G) {
        offsets[g] = carry + incl - c;
        cur[g] = carry + incl - c;
      }
      carry += __shfl_sync(0xffffffffu, incl, 31);
    }
    if (lane == 0) offsets[G] = carry;
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < kAlignRegs; ++k) {
    const int i = tid + k * nt;
    if (i < n) {
      const int e = my[k];
      if (e >= 0 && e < G) {
        const int pos = atomicAdd(&cur[e], 1);
        sorted_rows[pos] = i / slots;
        inv[i] = pos;
      } else {
        inv[i] = -1;
      }
    }
  }
  for (int i = tid + kAlignRegs * nt; i < n; i += nt) {
    const int e = ld(i);
    if (e >= 0 && e < G) {
      const int pos = atomicAdd(&cur[e], 1);
      sorted_rows[pos] = i / slots;
      inv[i] = pos;
    } else {
      inv[i] = -1;
    }
  }
}

__global__ void align_kernel(const int* __restrict__ ids, int n, int slots, int G,
                             int* __restrict__ offsets, int* __restrict__ sorted_rows,
                             int* __restrict__ inv) {
  pdl_launch_dependents();
  __shared__ int cnt[kMaxGroups];
  __shared__ int cur[kMaxGroups];
  align_block<false>(ids, n, slots, G, offsets, sorted_rows, inv, cnt, cur);
}

// delta[t, c4] = sum_j w_j * y[inv_j, c4] (+ add[t, c4]): one float4 column
// per thread, the row split over gridDim.y CTAs. A warp's lanes all serve token
// t: its slots' rows and weights are loaded once, one per lane, and shared by
// shuffles, and only the filled slots (a ballot) are read, four loads in flight
// at a time; the sum runs over the slots in order with the same FMAs as the
// per-thread form before it (bit-identical). That form kept every slot's
// float4 in registers (16 slots: ~110 per thread), so few warps fit an SM and
// a 2,048-token prefill step's combine ran at 28% of HBM (ncu: 82 us per
// layer on an H200). Slots past 32 use the per-slot loop.
constexpr int kCombineThreads = 128;
constexpr int kCombineWarpSlots = 32;

__global__ void __launch_bounds__(kCombineThreads) combine_kernel(
    const float* __restrict__ y, const int* __restrict__ inv, const float* __restrict__ w,
    int slots, int H, const float* __restrict__ add, float* __restrict__ delta) {
  pdl_launch_dependents();
  const int t = blockIdx.x;
  const int n4 = H / 4;
  const int c = blockIdx.y * kCombineThreads + threadIdx.x;
  const bool live = c < n4;  // no early return: the warp's shuffles need every lane
  const int lane = threadIdx.x & 31;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  float4 extra = make_float4(0.f, 0.f, 0.f, 0.f);
  if (add && live) extra = __ldg(reinterpret_cast<const float4*>(add + (int64_t)t * H) + c);
  auto fma4 = [&](float wj, const float4& v) {
    acc.x += wj * v.x;
    acc.y += wj * v.y;
    acc.z += wj * v.z;
    acc.w += wj * v.w;
  };
  if (slots <= kCombineWarpSlots) {
    const int pl = lane < slots ? __ldg(inv + (int64_t)t * slots + lane) : -1;
    const float wl = lane < slots ? __ldg(w + (int64_t)t * slots + lane) : 0.f;
    unsigned filled = __ballot_sync(0xffffffffu, pl >= 0);
    while (filled) {  // warp-uniform
      int j[4];
      int n = 0;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        j[q] = filled ? __ffs(filled) - 1 : 0;
        if (filled) {
          filled &= filled - 1;
          ++n;
        }
      }
      float4 v[4];
      float wj[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int p = __shfl_sync(0xffffffffu, pl, j[q]);
        wj[q] = __shfl_sync(0xffffffffu, wl, j[q]);
        v[q] = (q < n && live) ? __ldg(reinterpret_cast<const float4*>(y + (int64_t)p * H) + c)
                               : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int q = 0; q < 4; ++q)
        if (q < n) fma4(wj[q], v[q]);
    }
  } else if (live) {
    for (int j = 0; j < slots; ++j) {
      const int p = inv[(int64_t)t * slots + j];
      if (p < 0) continue;
      fma4(w[(int64_t)t * slots + j], reinterpret_cast<const float4*>(y + (int64_t)p * H)[c]);
    }
  }
  if (!live) return;
  if (add) {  // the shared expert's output, computed apart, last (where its slot would be)
    acc.x += extra.x;
    acc.y += extra.y;
    acc.z += extra.z;
    acc.w += extra.w;
  }
  reinterpret_cast<float4*>(delta + (int64_t)t * H)[c] = acc;
}

// ------------------------------------------------------------ fused router
// One launch: logits x·W^T (FP32 FMA, K split over lanes, warps and CTAs),
// selection, and the align sort.
//   Phase 1 (every CTA): a tile of RM tokens x WN*4 experts x one K chunk (WK
//     warps along K, each a 4-expert x RM-token register tile with lanes
//     striding K by float4). Warp sums by a transposed butterfly, warps along
//     K summed in shared memory in fixed order; partial logits to the
//     workspace [ks][t][e].
//   Phase 2 (the last CTA of a token tile, by a counter): partials summed in ks
//     order (deterministic logits), one warp per token runs route_token.
//   Phase 3 (the last token tile, by a second counter): align_block over all
//     ids. Each counter is reset by the CTA that saw it complete, so the next
//     launch (or graph replay) starts from zero.
// Two forms: the last-CTA form (phases as above) and, by default on sm_90, the
// cluster form (router_fused_cluster_kernel below), whose phase-2 hand-off
// goes through distributed shared memory instead of the workspace. The
// workspace hand-offs (partials written, fence, counter, read back) cost more
// than the arithmetic after them (docs/perf.md: 3.4 of 8.1 us at T = 1 with
// E = 20 on an H100).
constexpr int kRfThreads = 256;
constexpr int kRfRN = 4;      // experts per warp tile
constexpr int kRfMaxKs = 32;  // K splits over CTAs
constexpr int kRfMaxRM = 8;

struct RfShape {
  int RM, WN, WK;   // tokens per tile, warps along experts / along K
  int n_tt, n_et, n_ks;
  int kw;           // K elements per warp (multiple of 128)
};

__host__ __device__ inline int rf_rm(int T) { return T <= 1 ? 1 : T <= 4 ? 2 : T <= 16 ? 4 : 8; }
// Partial-logit capacity of a workspace for T tokens, in rows of E floats:
// non-decreasing in T and constant from T = 256 on (4096 rows), so a workspace
// sized for any T_max serves every T <= min(T_max, kRouterFusedMaxT); the plan
// keeps n_ks * T within it.
inline int64_t rf_partial_rows(int T) {
  const int64_t t = T < 256 ? T : 256;
  const int64_t a = 32 * (t < 16 ? t : 16), b = 16 * t;
  return a > b ? a : b;
}
// Workspace: [0] the token-tile completion counter, [1 .. kRfMaxTiles] one
// counter per token tile, then the partial logits. The header has a fixed size
// so that calls with different T can share one workspace.
constexpr int kRfMaxTiles = 1023;
constexpr size_t kRfHeaderBytes = (kRfMaxTiles + 1) * sizeof(int);

// Router weights: read once per step, evicted first from L2 (l2_policy_stream).
__device__ __forceinline__ float4 ld_nc_na_f4(const float* p, uint64_t policy) {
  float4 r;
  asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.f32 {%0,%1,%2,%3}, [%4], %5;"
      : "=f"(r.x), "=f"(r.y), "=f"(r.z), "=f"(r.w)
      : "l"(p), "l"(policy));
  return r;
}

// Sum of v[0..N) across the warp, N a power of two <= 32: lane l returns the
// total of v[l >> (5 - log2 N)] (N/2 + N/4 + ... shuffles, then a butterfly).
// Stage with n values at xor distance O: the lane with bit O set keeps the upper
// half of its values plus its partner's upper half (compile-time indices only).
template <int n, int O>
__device__ __forceinline__ void wts_stage(float* v, bool upper) {
#pragma unroll
  for (int i = 0; i < n / 2; ++i) {
    const float keep = upper ? v[i + n / 2] : v[i];
    const float send = upper ? v[i] : v[i + n / 2];
    v[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
  }
}
template <int N>
__device__ __forceinline__ float warp_transpose_sum(float (&v)[N]) {
  static_assert(N == 1 || N == 2 || N == 4 || N == 8 || N == 16 || N == 32, "N");
  const int lane = threadIdx.x & 31;
  // The stage with n values exchanges at distance 16 * n / N.
  if constexpr (N >= 32) wts_stage<32, 16 * 32 / N>(v, lane & (16 * 32 / N));
  if constexpr (N >= 16) wts_stage<16, 16 * 16 / N>(v, lane & (16 * 16 / N));
  if constexpr (N >= 8) wts_stage<8, 16 * 8 / N>(v, lane & (16 * 8 / N));
  if constexpr (N >= 4) wts_stage<4, 16 * 4 / N>(v, lane & (16 * 4 / N));
  if constexpr (N >= 2) wts_stage<2, 16 * 2 / N>(v, lane & (16 * 2 / N));
  float r = v[0];
#pragma unroll
  for (int o = 16 / N; o >= 1; o >>= 1) r += __shfl_xor_sync(0xffffffffu, r, o);
  return r;
}

template <int N>
struct Log2 {
  static constexpr int value = N <= 1 ? 0 : 1 + Log2<N / 2>::value;
};
template <>
struct Log2<1> {
  static constexpr int value = 0;
};

// out[it] = the sum over ks < n_ks, in ks order from 0.f, of load(at(it), ks),
// for it < items (at: what an item's loads share, computed once per item): IPR
// items per thread per round, all of a round's loads in flight together. Both
// router forms sum their partials through it (the workspace's, the cluster's
// shared memory), so their logits are the same bits.
template <int IPR, int KS, typename At, typename Load>
__device__ __forceinline__ void rf_sum_items(int n_ks, int items, float* out, At at, Load load) {
  const int nt = blockDim.x;
  for (int base = threadIdx.x; base < items; base += nt * IPR) {
    float v[IPR][KS];
#pragma unroll
    for (int q = 0; q < IPR; ++q) {
      const int it = base + q * nt;
      const auto a = at(it);  // (unused past items)
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) v[q][ks] = (it < items && ks < n_ks) ? load(a, ks) : 0.f;
    }
#pragma unroll
    for (int q = 0; q < IPR; ++q) {
      const int it = base + q * nt;
      if (it < items) {
        float sum = 0.f;
#pragma unroll
        for (int ks = 0; ks < KS; ++ks)
          if (ks < n_ks) sum += v[q][ks];
        out[it] = sum;
      }
    }
  }
}

// Sum the n_ks partials of `items` consecutive logits starting at p (stride
// T*E between splits) into out[].
template <int IPR, int KS>
__device__ __forceinline__ void rf_sum_partials(const float* p, int64_t stride, int n_ks,
                                                int items, float* out) {
  rf_sum_items<IPR, KS>(
      n_ks, items, out, [&](int it) { return p + it; }, [&](const float* q, int ks) { return __ldcg(q + ks * stride); });
}

// One K step of a lane of the router's warp tiles (rf_tile_partials,
// add_rmsnorm_router): acc[m * 4 + n] += x_m . w_n over a float4, the FMAs in
// x, y, z, w order, so both kernels' partials round alike.
template <int RM>
__device__ __forceinline__ void rf_fma_step(float (&acc)[RM * kRfRN], const float4 (&xv)[RM],
                                            const float4 (&wv)[kRfRN]) {
#pragma unroll
  for (int m = 0; m < RM; ++m)
#pragma unroll
    for (int n = 0; n < kRfRN; ++n) {
      float s = acc[m * kRfRN + n];
      s = fmaf(xv[m].x, wv[n].x, s);
      s = fmaf(xv[m].y, wv[n].y, s);
      s = fmaf(xv[m].z, wv[n].z, s);
      s = fmaf(xv[m].w, wv[n].w, s);
      acc[m * kRfRN + n] = s;
    }
}
// The warp's RM x 4 tile summed over its lanes (warp_transpose_sum) into
// out[m * 4 + n].
template <int RM>
__device__ __forceinline__ void rf_warp_tile_out(float (&acc)[RM * kRfRN], float* out) {
  constexpr int N = RM * kRfRN;
  const int lane = threadIdx.x & 31;
  const float tot = warp_transpose_sum<N>(acc);
  constexpr int kShift = 5 - Log2<N>::value;
  if ((lane & ((1 << kShift) - 1)) == 0) out[lane >> kShift] = tot;
}

// Phase 1 of both forms: the partial logits of one CTA's token tile (t0, tn
// live tokens), expert tile et and K chunk ks. out(m, j, v) receives token
// t0 + m's logit of expert et * WN * 4 + j over the chunk, for m < tn and
// experts < E only. Shared by the two kernels so that their partials (and so
// their logits) are the same bits.
template <int RM, typename Out>
__device__ __forceinline__ void rf_tile_partials(const RouterFusedArgs& a, const RfShape& sh, int t0,
                                                 int tn, int et, int ks,
                                                 float (*s_red)[RM * kRfRN], Out out) {
  constexpr int N = RM * kRfRN;
  const int T = a.sel.T, E = a.sel.E, H = a.H;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wn = warp % sh.WN, wk = warp / sh.WN;
  if (wk < sh.WK) {
    float acc[N];
#pragma unroll
    for (int i = 0; i < N; ++i) acc[i] = 0.f;
    const int e0 = (et * sh.WN + wn) * kRfRN;
    const int kb = (ks * sh.WK + wk) * sh.kw;
    const int ke = kb + sh.kw < H ? kb + sh.kw : H;
    const float* xr[RM];
    const float* wr[kRfRN];
#pragma unroll
    for (int m = 0; m < RM; ++m) xr[m] = a.x + (int64_t)(t0 + m < T ? t0 + m : T - 1) * H;
#pragma unroll
    for (int n = 0; n < kRfRN; ++n) wr[n] = a.W + (int64_t)(e0 + n < E ? e0 + n : E - 1) * H;
    // One token tile reads the weights once: evict them first. Several
    // tiles share them through L2.
    const uint64_t wpol = sh.n_tt <= 1 ? l2_policy_stream() : l2_policy_normal();
    constexpr int kUnroll = RM <= 4 ? 2 : 1;
#pragma unroll kUnroll
    for (int k = kb + lane * 4; k < ke; k += 128) {
      float4 wv[kRfRN], xv[RM];
#pragma unroll
      for (int n = 0; n < kRfRN; ++n) wv[n] = ld_nc_na_f4(wr[n] + k, wpol);
#pragma unroll
      for (int m = 0; m < RM; ++m) xv[m] = __ldg(reinterpret_cast<const float4*>(xr[m] + k));
      rf_fma_step<RM>(acc, xv, wv);
    }
    rf_warp_tile_out<RM>(acc, s_red[warp]);
  }
  __syncthreads();
  // Tile outputs: WN x N values, summed over the WK warps along K in order.
  if (tid < sh.WN * N) {
    const int wn = tid / N, idx = tid % N;
    const int m = idx / kRfRN, n = idx % kRfRN;
    const int j = wn * kRfRN + n;
    float sum = s_red[wn][idx];
    for (int wk = 1; wk < sh.WK; ++wk) sum += s_red[wk * sh.WN + wn][idx];
    if (m < tn && et * sh.WN * kRfRN + j < E) out(m, j, sum);
  }
}

// The last-CTA form: partials through the global workspace, two counters
// (phases 2 and 3 above). The fallback where a cluster cannot be launched.
template <int RM, int EPL>
__global__ void __launch_bounds__(kRfThreads, 2) router_fused_kernel(RouterFusedArgs a, RfShape sh) {
  pdl_launch_dependents();
  constexpr int N = RM * kRfRN;
  __shared__ float s_red[kRfThreads / 32][N];
  __shared__ float s_lg[kRfMaxRM * 32 * kMaxExpertsPerLane];
  __shared__ int s_cnt[kMaxGroups], s_cur[kMaxGroups];
  __shared__ int s_last;
  const RouterArgs& r = a.sel;
  const int T = r.T, E = r.E;
  const int tid = threadIdx.x, warp = tid >> 5;
  int* done_cnt = static_cast<int*>(a.workspace);
  int* tile_cnt = done_cnt + 1;
  float* part = reinterpret_cast<float*>(static_cast<char*>(a.workspace) + kRfHeaderBytes);
  const int et = blockIdx.x % sh.n_et;
  const int ks = (blockIdx.x / sh.n_et) % sh.n_ks;
  const int tt = blockIdx.x / (sh.n_et * sh.n_ks);
  int nv = T;
  if (r.n_valid) {
    nv = *r.n_valid;
    nv = nv < 0 ? 0 : nv > T ? T : nv;
  }
  const int t0 = tt * RM;
  const int tn = nv - t0 < RM ? nv - t0 : RM;  // live tokens of this tile (<= 0: none)

  // ---- phase 1: partial logits of the tile
  if (tn > 0) {
    const int e_base = et * sh.WN * kRfRN;
    rf_tile_partials<RM>(a, sh, t0, tn, et, ks, s_red, [&](int m, int j, float v) {
      part[((int64_t)ks * T + t0 + m) * E + e_base + j] = v;
    });
  }
  if (!cta_arrive_last(&tile_cnt[tt], sh.n_et * sh.n_ks, true, &s_last)) return;

  // ---- phase 2: this CTA finished the token tile last: selection
  if (tn > 0) {
    const float* p = part + (int64_t)t0 * E;
    const int64_t stride = (int64_t)T * E;
    const int items = tn * E;
    if (sh.n_ks <= 8) rf_sum_partials<4, 8>(p, stride, sh.n_ks, items, s_lg);
    else if (sh.n_ks <= 16) rf_sum_partials<2, 16>(p, stride, sh.n_ks, items, s_lg);
    else rf_sum_partials<1, kRfMaxKs>(p, stride, sh.n_ks, items, s_lg);
  }
  __syncthreads();
  for (int m = warp; m < RM; m += kRfThreads / 32) {
    const int t = t0 + m;
    if (t >= T) break;
    const float* lg = s_lg + m * E;
    route_token<EPL>(r, t, [&](int e) { return lg[e]; });
  }
  if (!cta_arrive_last(done_cnt, sh.n_tt, true, &s_last)) return;

  // ---- phase 3: every token's ids are written: align
  const int slots = r.slots > 0 ? r.slots : r.top_k + (r.shared_local >= 0 ? 1 : 0);
  align_block<true>(r.ids, T * slots, slots, a.n_groups, a.offsets, a.sorted_rows, a.inv, s_cnt,
                    s_cur);
}

// ---------------------------------------------------- fused router, cluster form
// The same three phases with the first hand-off inside a thread-block cluster
// (sm_90): the n_et * n_ks CTAs of a token tile are one cluster (cluster dims
// (C, 1, 1) over the 1-D grid, so rank = blockIdx.x % C = et + n_et * ks).
// Each CTA leaves its partial logits in its own shared memory; after a
// cluster barrier (arrive.release / wait.acquire) the rank-0 CTA reads all of
// them through distributed shared memory and sums them over ks in order with
// the same float adds as rf_sum_partials, so the logits, and every output,
// are the bits of the last-CTA form on the same plan. No global partials and
// no per-tile counter; the other CTAs wait on a second barrier until the
// leader's reads are done (a CTA's shared memory must outlive every remote
// read of it). Phase 3 as before over token tiles, except that a single
// tile's leader sorts at once. The price: at most 16 CTAs per token tile, so
// fewer K splits where E needs several expert tiles (rf_choose).
constexpr int kRfMaxClusterCtas = 16;  // non-portable cluster size of sm_90
constexpr int kRfClusterMaxT = 2;      // tokens up to which router_fused picks the cluster form
constexpr int kRfPartLd = 8 * kRfRN;   // floats per token row of s_part (WN <= 8)
static_assert(kRfMaxClusterCtas <= kRfMaxKs, "a cluster's K splits fit the plan's bound");

// The leader's sums: items = tn * E logits, item it = m * E + e from rank
// e / epc + n_et * ks, slot [m][e % epc] of its s_part (epc = WN * 4 experts
// per CTA), summed over ks in order from 0.f exactly as rf_sum_partials sums
// the workspace. IPR items per thread per round, all of a round's remote
// loads in flight together.
template <int IPR, int KS>
__device__ __forceinline__ void rf_sum_cluster(uint32_t s_part, int epc, int n_et, int n_ks, int E,
                                               int items, float* out) {
  struct Slot {
    uint32_t addr;  // the item's slot in every CTA's s_part
    int et;         // its expert tile: rank et + n_et * ks holds split ks
  };
  rf_sum_items<IPR, KS>(
      n_ks, items, out,
      [&](int it) {
        const int m = it / E, e = it - m * E;
        const int et = e / epc;
        return Slot{s_part + (uint32_t)(m * kRfPartLd + e - et * epc) * 4u, et};
      },
      [&](const Slot& a, int ks) { return ld_dsmem_f32(a.addr, a.et + n_et * ks); });
}

template <int RM, int EPL>
__global__ void __launch_bounds__(kRfThreads, 2)
    router_fused_cluster_kernel(RouterFusedArgs a, RfShape sh) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  pdl_launch_dependents();
  constexpr int N = RM * kRfRN;
  __shared__ float s_red[kRfThreads / 32][N];
  __shared__ float s_part[RM * kRfPartLd];  // this CTA's partials, read by the leader
  __shared__ float s_lg[RM * 32 * EPL];     // >= RM * E
  __shared__ int s_cnt[kMaxGroups], s_cur[kMaxGroups];
  __shared__ int s_last;
  const RouterArgs& r = a.sel;
  const int T = r.T, E = r.E;
  const int tid = threadIdx.x, warp = tid >> 5;
  const int C = sh.n_et * sh.n_ks;
  const int rank = blockIdx.x % C;
  const int et = rank % sh.n_et, ks = rank / sh.n_et;
  const int tt = blockIdx.x / C;
  int nv = T;
  if (r.n_valid) {
    nv = *r.n_valid;
    nv = nv < 0 ? 0 : nv > T ? T : nv;
  }
  const int t0 = tt * RM;
  const int tn = nv - t0 < RM ? nv - t0 : RM;  // live tokens of this tile (<= 0: none)

  // ---- phase 1: partial logits of the tile, into this CTA's shared memory
  if (tn > 0)
    rf_tile_partials<RM>(a, sh, t0, tn, et, ks, s_red,
                         [&](int m, int j, float v) { s_part[m * kRfPartLd + j] = v; });
  // Every CTA's partials written (release) and visible to the leader (acquire).
  cluster_arrive_release();
  cluster_wait_acquire();
  if (rank != 0) {
    // Keep this CTA's shared memory alive until the leader has read it: the
    // leader arrives on this second barrier once its remote loads are done.
    cluster_arrive_release();
    cluster_wait_acquire();
    return;
  }

  // ---- phase 2 (the leader): sums over the cluster, selection
  if (tn > 0) {
    const uint32_t sp = (uint32_t)__cvta_generic_to_shared(s_part);
    const int epc = sh.WN * kRfRN, items = tn * E;
    if (sh.n_ks <= 4) rf_sum_cluster<4, 4>(sp, epc, sh.n_et, sh.n_ks, E, items, s_lg);
    else if (sh.n_ks <= 8) rf_sum_cluster<2, 8>(sp, epc, sh.n_et, sh.n_ks, E, items, s_lg);
    else rf_sum_cluster<1, kRfMaxClusterCtas>(sp, epc, sh.n_et, sh.n_ks, E, items, s_lg);
  }
  // Remote reads done (the loads' values are in registers or s_lg): release
  // the other CTAs. This thread's matching wait is at the end.
  cluster_arrive_release();
  __syncthreads();
  for (int m = warp; m < RM; m += kRfThreads / 32) {
    const int t = t0 + m;
    if (t >= T) break;
    const float* lg = s_lg + m * E;
    route_token<EPL>(r, t, [&](int e) { return lg[e]; });
  }

  // ---- phase 3: the last token tile's leader sorts. One tile: this CTA
  // wrote every id itself, so a block barrier orders them before the sort
  // (ld.cg is a cache hint, not a weaker ordering).
  const int slots = r.slots > 0 ? r.slots : r.top_k + (r.shared_local >= 0 ? 1 : 0);
  if (sh.n_tt == 1) {
    __syncthreads();
    align_block<true>(r.ids, T * slots, slots, a.n_groups, a.offsets, a.sorted_rows, a.inv, s_cnt,
                      s_cur);
  } else {
    int* done_cnt = static_cast<int*>(a.workspace);
    if (cta_arrive_last(done_cnt, sh.n_tt, true, &s_last)) {
      align_block<true>(r.ids, T * slots, slots, a.n_groups, a.offsets, a.sorted_rows, a.inv, s_cnt,
                        s_cur);
    }
  }
  cluster_wait_acquire();  // pairs the arrive above; the others arrived long ago
#endif
}

int rf_num_sms() {
  int dev = 0;
  DeviceInfo di;
  return device_info(dev, di) == cudaSuccess && di.sms > 0 ? di.sms : 132;
}

// max_tile_ctas > 0: at most that many CTAs per token tile (n_et * n_ks), the
// cluster form's bound (n_et <= max_tile_ctas, the caller's to check); 0: no
// such bound (the last-CTA form).
// rm > 0: that many tokens per tile (a power of two <= kRfMaxRM) instead of
// rf_rm(T).
RfShape rf_plan(int T, int E, int H, int num_sms, int max_tile_ctas, int rm = 0) {
  RfShape s;
  s.RM = rm > 0 ? rm : rf_rm(T);
  const int et4 = (E + kRfRN - 1) / kRfRN;
  s.WN = et4 < 8 ? et4 : 8;
  s.WK = 8 / s.WN;
  s.n_tt = (T + s.RM - 1) / s.RM;
  s.n_et = (et4 + s.WN - 1) / s.WN;
  const int steps = (H + 127) / 128;  // 128-float steps of a warp along K
  // At most two CTAs per SM (one wave at two resident CTAs per SM); at most
  // 64 / RM splits (bounds the partials the selecting CTA sums; 128 / RM with
  // 8-token tiles) and no more than there are K steps. Rounding the steps per
  // warp up only lowers n_ks. With 8-token tiles (17-256 tokens) 16 splits
  // rather than 8: each warp's K loop, a chain of L2 round trips, 3 steps
  // instead of 5 (H200, E = 20, small_check --bench: T = 64 11.31 -> 10.17 us,
  // 128 11.60 -> 10.92; decode step, rank share, 2k context, A/B, ms: batch
  // 32 15.73 -> 15.57, 64 18.07 -> 17.93, 128 21.13 -> 21.0). Not with 4-token
  // tiles: 32 splits instead of 16 made batch 8 9.05 -> 9.24 ms.
  int ks = 2 * num_sms / (s.n_tt * s.n_et);
  const int ks_rm = s.RM >= 8 ? 128 / s.RM : 64 / s.RM;
  const int ks_cap = kRfMaxKs < ks_rm ? kRfMaxKs : ks_rm;
  const int ks_steps = (steps + s.WK - 1) / s.WK;
  const int64_t ks_ws = rf_partial_rows(T) / T;  // the workspace's room
  if (ks > ks_cap) ks = ks_cap;
  if (ks > ks_ws) ks = (int)ks_ws;
  if (ks > ks_steps) ks = ks_steps;
  if (max_tile_ctas > 0 && ks > max_tile_ctas / s.n_et) ks = max_tile_ctas / s.n_et;
  if (ks < 1) ks = 1;
  const int spw = (steps + ks * s.WK - 1) / (ks * s.WK);  // steps per warp
  s.kw = spw * 128;
  s.n_ks = (steps + spw * s.WK - 1) / (spw * s.WK);
  return s;
}

// Which form router_fused launches (tests and benches choose through the hook
// at the end of this file; the runtime always gets kRfAuto).
enum RfPath {
  kRfAuto = 0,               // the cluster form where the device launches it, else the last-CTA form
  kRfCluster = 1,            // the cluster form or cudaErrorNotSupported, no fallback
  kRfLastCtaClusterPlan = 2, // the last-CTA form on the cluster form's plan: the same bits
  kRfLastCta = 3,            // the last-CTA form on its own plan (the kernel before clusters)
};
struct RfTuning {
  int path = kRfAuto;
  int max_cluster = 0;  // > 0: a cap on the CTAs per cluster (below the device's limit)
};
RfTuning g_rf_tuning;

constexpr int kRfMaxDevices = 64;
using RfKernelFn = void (*)(RouterFusedArgs, RfShape);
struct RfKernels {
  RfKernelFn last_cta, cluster;
  // Per device: 1 + the largest cluster the cluster kernel runs with; 0: not
  // asked yet. Atomic: ranks may launch from several host threads (a race
  // only repeats the same query).
  std::atomic<int>* limit;
};
template <int RM, int EPL>
RfKernels rf_kernels_of() {
  static std::atomic<int> limit[kRfMaxDevices];
  return {router_fused_kernel<RM, EPL>, router_fused_cluster_kernel<RM, EPL>, limit};
}
RfKernels rf_kernels(int RM, int epl) {
#define GLMK_RF_KERNELS(RM)                                      \
  switch (epl) {                                                 \
    case 1: return rf_kernels_of<RM, 1>();                       \
    case 5: return rf_kernels_of<RM, 5>();                       \
    default: return rf_kernels_of<RM, kMaxExpertsPerLane>();     \
  }
  switch (RM) {
    case 1: GLMK_RF_KERNELS(1)
    case 2: GLMK_RF_KERNELS(2)
    case 4: GLMK_RF_KERNELS(4)
    default: GLMK_RF_KERNELS(8)
  }
#undef GLMK_RF_KERNELS
}

// The largest cluster (16 with the non-portable size allowed, else the
// portable 8; 0: none) with which at least one cluster of `fn` fits the
// device (cudaOccupancyMaxActiveClusters accounts for its registers, shared
// memory and the GPC sizes, e.g. under MIG). Errors of the queries are cleared:
// they mean "no cluster", and router_fused returns cudaGetLastError().
int rf_query_cluster_limit(RfKernelFn fn, int dev) {
  int major = 0, can = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&can, cudaDevAttrClusterLaunch, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  if (major < 9 || !can) return 0;
  for (int c = kRfMaxClusterCtas; c >= 8; c /= 2) {
    if (c > 8 && cudaFuncSetAttribute(fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
      (void)cudaGetLastError();
      continue;
    }
    const LaunchConfig lc(dim3(c), dim3(kRfThreads), 0, nullptr, false, c);
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, fn, &lc.cfg) == cudaSuccess && n > 0) return c;
    (void)cudaGetLastError();
  }
  return 0;
}

// Asked once per device and kernel instance (no call in the launch path after
// the first; no synchronisation either way).
int rf_cluster_limit(const RfKernels& k) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  if (dev < 0 || dev >= kRfMaxDevices) return 0;
  int v = k.limit[dev].load(std::memory_order_relaxed);
  if (v == 0) {
    v = 1 + rf_query_cluster_limit(k.cluster, dev);
    k.limit[dev].store(v, std::memory_order_relaxed);
  }
  return v - 1;
}

struct RfLaunch {
  RfKernels k;            // the instantiation for sh.RM
  RfShape sh;
  int cluster = 0;        // CTAs per cluster (n_et * n_ks); 0: the last-CTA form
  bool fallback = false;  // a refused cluster launch runs the last-CTA form on the same plan
};

// Tokens up to which the automatic choice runs every token in one cluster
// (one token tile of 4 rows): the leader routes and sorts them itself, so no
// hand-off goes through global memory. Decode step on an H200 (rank share,
// 2k context, A/B, ms): batch 4 6.98 -> 6.87; up to 8 tokens (8-row tiles, 8
// K splits a cluster) batch 8 went 9.04 -> 9.31, so not past 4.
constexpr int kRfOneTileMaxT = 4;

// The form and plan of a call. The cluster form's plan caps the K splits at
// limit / n_et (E = 20: n_et = 1, up to 16 splits; E = 160: n_et = 5, up to 3);
// where that cap binds, the logits are summed in other K chunks than the
// last-CTA form's own plan would use (ids may then differ from it at a near
// tie), but never between the cluster form and its fallback.
cudaError_t rf_choose(int T, int E, int H, RfLaunch* out) {
  const RfTuning tu = g_rf_tuning;
  const int sms = rf_num_sms();
  const int epl = router_epl(E);
  // 3-4 tokens of one expert tile: one token tile of 4 rows in one cluster
  // (rf_rm's 2-row tiles need the global hand-off before the sort).
  // (Also under the tuning hook's cluster-only and last-CTA-on-the-cluster-plan
  // paths, so that small_check compares the two forms on this plan too.)
  if (tu.path != kRfLastCta && T > kRfClusterMaxT && T <= kRfOneTileMaxT) {
    const int rm = 4;
    RfLaunch l;
    l.k = rf_kernels(rm, epl);
    int limit = rf_cluster_limit(l.k);
    if (tu.max_cluster > 0 && limit > tu.max_cluster) limit = tu.max_cluster;
    l.sh = rf_plan(T, E, H, sms, limit, rm);
    if (limit > 0 && l.sh.n_et == 1 && l.sh.n_tt == 1) {
      l.cluster = tu.path == kRfLastCtaClusterPlan ? 0 : l.sh.n_et * l.sh.n_ks;
      l.fallback = tu.path == kRfAuto;
      *out = l;
      return cudaSuccess;
    }
  }
  const RfKernels k = rf_kernels(rf_rm(T), epl);
  int limit = 0;
  if (tu.path != kRfLastCta) {
    limit = rf_cluster_limit(k);
    if (tu.max_cluster > 0 && limit > tu.max_cluster) limit = tu.max_cluster;
  }
  RfLaunch l;
  l.k = k;
  l.sh = rf_plan(T, E, H, sms, 0);
  const bool can = limit > 0 && l.sh.n_et <= limit;  // the cap changes n_ks only
  // Where the cluster form is the faster. In isolation (small_check
  // --bench-only, H100, 2026-11-27, E = 20, H = 5120, us, last-CTA -> cluster):
  // T = 1 8.23 -> 7.19, 4 8.44 -> 8.12, 16 9.04 -> 8.52, 64 11.28 -> 10.89,
  // but 128 11.80 -> 12.22 and 256 14.70 -> 18.36; E = 160 (five expert tiles,
  // so at most 3 K splits in a cluster of 16) slower at every T (T = 1 9.82 ->
  // 11.84, 64 19.29 -> 22.90). In the decode step (rank share, 2k context, A/B
  // on one H100, three alternations, ms): batch 1 6.19 -> 6.11, 2 6.52 ->
  // 6.33, but 4 7.81 -> 7.83 and 8 10.87 -> 11.0 (16 to 256 within 0.1 ms):
  // so one expert tile (E <= 32) and up to 2 tokens.
  const bool worth = l.sh.n_et == 1 && T <= kRfClusterMaxT;
  if (tu.path == kRfLastCta || (tu.path == kRfAuto && (!can || !worth))) {
    *out = l;
    return cudaSuccess;
  }
  if (!can) return cudaErrorNotSupported;
  l.sh = rf_plan(T, E, H, sms, limit);
  l.cluster = tu.path == kRfLastCtaClusterPlan ? 0 : l.sh.n_et * l.sh.n_ks;
  l.fallback = tu.path == kRfAuto;
  *out = l;
  return cudaSuccess;
}

// One launch of fn over grid CTAs of kRfThreads, in clusters of `cluster`
// CTAs when > 0 (grid is a multiple of it).
cudaError_t rf_launch(RfKernelFn fn, int grid, int cluster, cudaStream_t st, const RouterFusedArgs& a,
                      const RfShape& sh) {
  const LaunchConfig lc(dim3(grid), dim3(kRfThreads), 0, st, false, cluster);
  return cudaLaunchKernelEx(&lc.cfg, fn, a, sh);
}

}  // namespace

cudaError_t router_topk(const RouterArgs& a, cudaStream_t st) {
  if (a.T <= 0) return cudaSuccess;
  if (a.E <= 0 || a.E > 32 * kMaxExpertsPerLane || a.top_k <= 0 || a.top_k > 32 ||
      a.top_k > a.E || a.slots < 0 || (a.slots > 0 && a.slots != a.top_k && a.slots != a.top_k + 1) ||
      a.n_group <= 0 || a.n_group > 32 || a.E % a.n_group != 0 ||
      a.topk_group <= 0 || a.topk_group > a.n_group ||
      (a.n_group > 1 && a.E / a.n_group < 2))
    return cudaErrorInvalidValue;
  const int grid = ceil_div(a.T, kRouterWarps), threads = kRouterWarps * 32;
  switch (router_epl(a.E)) {
    case 1: router_kernel<1><<<grid, threads, 0, st>>>(a); break;
    case 5: router_kernel<5><<<grid, threads, 0, st>>>(a); break;
    default: router_kernel<kMaxExpertsPerLane><<<grid, threads, 0, st>>>(a); break;
  }
  return cudaGetLastError();
}

// A guess from the design (one launch and no logits round trip against three
// launches; the SGEMM tail at T >= ~128 favours cuBLAS): small_check --bench
// prints both paths for E = 20 and E = 160.
// Measured on an H200 (small_check --bench, H = 5120, 2026-11-24): fused vs
// cuBLAS SGEMM + router_topk + moe_align, E=20: 7.5 vs 8.5 us at T=1, 13.6 vs
// 21.6 at T=256; E=160: 9.5 vs 11.1 at T=1, 18.7 vs 23.6 at T=64, 40.4 vs 32.0
// at T=256 (the FP32 FMA loop re-reads the larger router per token tile).
// Those numbers are the last-CTA form's; the cluster form, where it runs
// (E <= 32, T <= 4: rf_choose), is ~1 us faster.
bool router_fused_supported(int T, int E, int H) {
  const int max_t = E <= 32 ? 256 : 128;
  return T >= 1 && T <= max_t && T <= kRouterFusedMaxT && E >= 1 && E <= 32 * kMaxExpertsPerLane &&
         H >= 4 && H % 4 == 0;
}

size_t router_fused_workspace_bytes(int T, int E) {
  if (T < 1) T = 1;
  if (E < 1) E = 1;
  return kRfHeaderBytes + (size_t)rf_partial_rows(T) * E * sizeof(float);
}

cudaError_t router_fused(const RouterFusedArgs& a, cudaStream_t st) {
  const RouterArgs& r = a.sel;
  if (r.T <= 0) return cudaSuccess;
  if (r.T > kRouterFusedMaxT) return cudaErrorInvalidValue;
  if (r.E <= 0 || r.E > 32 * kMaxExpertsPerLane || r.top_k <= 0 || r.top_k > 32 ||
      r.top_k > r.E || r.slots < 0 || (r.slots > 0 && r.slots != r.top_k && r.slots != r.top_k + 1) ||
      r.n_group <= 0 || r.n_group > 32 || r.E % r.n_group != 0 ||
      r.topk_group <= 0 || r.topk_group > r.n_group ||
      (r.n_group > 1 && r.E / r.n_group < 2) || !r.bias || !r.ids || !r.w)
    return cudaErrorInvalidValue;
  if (a.H <= 0 || a.H % 4 != 0 || !a.x || !a.W || (uintptr_t)a.x % 16 || (uintptr_t)a.W % 16 ||
      a.n_groups <= 0 || a.n_groups > kMaxGroups || !a.offsets || !a.sorted_rows || !a.inv ||
      !a.workspace || (uintptr_t)a.workspace % 16)
    return cudaErrorInvalidValue;
  RfLaunch l;
  const cudaError_t ce = rf_choose(r.T, r.E, a.H, &l);
  if (ce != cudaSuccess) return ce;
  const RfKernels& k = l.k;
  const RfShape& sh = l.sh;
  if (sh.n_tt > kRfMaxTiles) return cudaErrorInvalidValue;  // T > ~8000: not a decode batch
  if ((int64_t)sh.n_ks * r.T > rf_partial_rows(r.T)) return cudaErrorInvalidValue;  // cannot happen
  const int grid = sh.n_tt * sh.n_et * sh.n_ks;
  if (l.cluster > 0) {
    const cudaError_t e = rf_launch(k.cluster, grid, l.cluster, st, a, sh);
    if (e == cudaSuccess) return cudaGetLastError();
    // Refused for its cluster shape despite the occupancy query (which of the
    // two codes a cluster that cannot be placed gets is not documented): the
    // last-CTA form on the same plan gives the same bits. The refusal is not a
    // sticky error; clear it so it is not reported after the fallback's launch.
    if (!l.fallback || (e != cudaErrorInvalidClusterSize && e != cudaErrorLaunchOutOfResources)) return e;
    (void)cudaGetLastError();
  }
  const cudaError_t e = rf_launch(k.last_cta, grid, 0, st, a, sh);
  return e != cudaSuccess ? e : cudaGetLastError();
}

// ------------------------------------------------- post-attention norm + router
// add_rmsnorm_router (kernels.h): add_rmsnorm's residual add, RMSNorm and FP8
// rows and router_fused's selection and sort in one launch, for 2..112 decode
// rows. One thread-block cluster of C CTAs (512 threads) per tile of RM rows;
// CTA c of a cluster owns the columns [c*S, (c+1)*S) of the hidden size
// (S = H / C, a multiple of 128):
//   1. the rows' slice v = h + delta (delta's slices, their loads in flight
//      together, summed in order first, as add_rmsnorm), h stored back; then
//      the router's slice (E x S floats) and the norm weights' slice on their
//      way into shared memory by cp.async (the rows are needed first); each
//      row's partial sum of squares (a warp a row).
//   2. cluster barrier; every CTA sums a row's C partials in rank order (the
//      same float adds in every CTA, so one r a row), makes y = w * (v * r)
//      (add_rmsnorm's operations on each element), its partial amax, and its
//      partial logits y . W^T over the slice (rf_tile_partials' warp tiles,
//      16 warps, from shared memory).
//   3. cluster barrier; every CTA takes a row's amax over the cluster and
//      writes its FP8 slice with the row's scale; first, the leader sums the
//      logit partials in rank order, selects every row of the tile
//      (route_token) and sorts (align_block): one tile's ids from its shared
//      memory; past one tile, the leader that finishes last (a counter in the
//      workspace) sorts every id, as router_fused does.
// Partials travel by remote stores before each barrier's arrive (each CTA
// writes its sums of squares and amaxes into every CTA's shared memory, its
// logits into the leader's), so after a barrier every read is local and no
// CTA touches another's shared memory after the second barrier.
// So the post-attention norm and the router are one launch, the FP32 rows
// are not written and read back, and one hand-off goes through global memory
// instead of two (none for one tile). r may differ from add_rmsnorm's by an
// ulp (another order of the sum of squares), so the FP8 rows may differ from
// its in a few codes; every formula is add_rmsnorm's and router_topk's.
// docs/perf.md (2026-11-28, eighth session): where its ~12 us go.
namespace {

constexpr int kNrThreads = 512;
constexpr int kNrMaxRM = 8;        // rows a cluster
constexpr int kNrMaxItems = 4;     // float4 of the rows' slice a thread (RM * S / 4 <= 2048)
constexpr int kNrSliceGroup = 3;   // delta slices loaded together (o_proj: 3 K splits)
constexpr int kNrMaxE = 32;        // experts: one warp tile row of rf's plan
constexpr int kNrMaxCluster = 8;   // portable cluster size
// Rows up to which add_rmsnorm_router_supported holds: 14 clusters of 8. In
// the decode step (H200, rank share, 2k context, A/B, ms) up to 128 rows
// against 64: batch 80 19.6 -> 19.5, 96 20.23 -> 20.1, 112 20.67 -> 20.47,
// but 128 21.07 -> 21.47 (16 clusters of 8 CTAs of 512 threads).
constexpr int kNrMaxT = 112;
constexpr size_t kNrMaxSmem = 200 * 1024;  // dynamic: (E + RM + 1) * S floats

struct NrShape {
  int RM, C, S, n_tt;  // rows a tile, CTAs a cluster, columns a CTA, tiles
  int WN, WK;          // warps along experts (4 each) and along K
};

__host__ __device__ inline int nr_rm(int T) { return T <= 2 ? 2 : T <= 4 ? 4 : 8; }

// C: the largest divisor of H / 128 up to max_c (every slice a whole number
// of the warps' 128-float K steps).
inline NrShape nr_plan(int T, int E, int H, int max_c) {
  NrShape s{};
  s.RM = nr_rm(T);
  s.n_tt = (T + s.RM - 1) / s.RM;
  const int steps = H / 128;
  s.C = 1;
  for (int c = max_c; c >= 1; --c)
    if (steps % c == 0) {
      s.C = c;
      break;
    }
  s.S = H / s.C;
  s.WN = (E + kRfRN - 1) / kRfRN;
  s.WK = (kNrThreads / 32) / s.WN;
  return s;
}
inline size_t nr_smem_bytes(const NrShape& s, int E) {
  return ((size_t)E + s.RM + 1) * s.S * sizeof(float);  // W slice, rows' slice, norm weights' slice
}

template <int RM>
__global__ void __launch_bounds__(kNrThreads, 1)
    add_rmsnorm_router_kernel(AddNormArgs n, RouterFusedArgs a, NrShape sh) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int N = RM * kRfRN;
  extern __shared__ float4 nr_smem[];
  // [rank][m]: every CTA's partial sums of squares and amaxes, pushed here by
  // their CTAs; [rank][m * kNrMaxE + e]: every CTA's partial logits (the
  // leader's copy is the one read).
  __shared__ float s_ss[kNrMaxCluster][kNrMaxRM], s_amax[kNrMaxCluster][kNrMaxRM];
  __shared__ float s_part[kNrMaxCluster][kNrMaxRM * kNrMaxE];
  __shared__ float s_r[kNrMaxRM], s_inv_scale[kNrMaxRM];  // (1 / the FP8 scale: pack_e4m3x4)
  __shared__ float s_red[kNrThreads / 32][N];
  __shared__ float s_lg[kNrMaxRM * kNrMaxE];
  __shared__ int s_cnt[kMaxGroups], s_cur[kMaxGroups];
  __shared__ int s_ids[kNrMaxRM * 33];  // the tile's ids (slots <= 33)
  __shared__ int s_last;
  const RouterArgs& r = a.sel;
  const int T = r.T, E = r.E, H = n.hidden, S = sh.S, S4 = S >> 2;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int rank = blockIdx.x % sh.C, tt = blockIdx.x / sh.C;
  const int t0 = tt * RM, k0 = rank * S;
  const int live = T - t0 < RM ? T - t0 : RM;  // rows of this tile (>= 1)
  float* s_w = reinterpret_cast<float*>(nr_smem);  // [E][S]
  float* s_y = s_w + (size_t)E * S;                 // [RM][S]: v, then y
  float* s_g = s_y + (size_t)RM * S;                // [S]: the norm weights

  // ---- 1. v = h + delta; the router's and the norm weights' slices on their way
  // (requested after the rows, which are needed first).
  const int items = RM * S4;
  {
    auto row_at = [&](int k, int& off) {  // item k of this thread: its offset in a row-major [T][H], live?
      const int i = tid + k * kNrThreads, m = i / S4, c4 = i - m * S4;
      off = (t0 + m) * H + k0 + 4 * c4;
      return i < items && m < live;
    };
    float4 v[kNrMaxItems];
#pragma unroll
    for (int k = 0; k < kNrMaxItems; ++k) {
      int off;
      v[k] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (row_at(k, off)) v[k] = *reinterpret_cast<const float4*>(n.h + off);
    }
    if (n.delta) {
      // delta's slices in groups of kNrSliceGroup, each group's loads in
      // flight together, summed in slice order.
      float4 d[kNrMaxItems];
      for (int s0 = 0; s0 < n.delta_splits; s0 += kNrSliceGroup) {
        float4 e[kNrSliceGroup][kNrMaxItems];
#pragma unroll
        for (int g = 0; g < kNrSliceGroup; ++g)
#pragma unroll
          for (int k = 0; k < kNrMaxItems; ++k) {
            int off;
            if (s0 + g < n.delta_splits && row_at(k, off))
              e[g][k] = __ldg(reinterpret_cast<const float4*>(n.delta + (s0 + g) * n.delta_split_stride + off));
          }
#pragma unroll
        for (int g = 0; g < kNrSliceGroup; ++g)
#pragma unroll
          for (int k = 0; k < kNrMaxItems; ++k) {
            int off;
            if (s0 + g < n.delta_splits && row_at(k, off)) {
              if (s0 + g == 0) {
                d[k] = e[g][k];
              } else {
                d[k].x += e[g][k].x;
                d[k].y += e[g][k].y;
                d[k].z += e[g][k].z;
                d[k].w += e[g][k].w;
              }
            }
          }
      }
#pragma unroll
      for (int k = 0; k < kNrMaxItems; ++k) {
        int off;
        if (row_at(k, off)) {
          v[k].x = v[k].x + d[k].x;
          v[k].y = v[k].y + d[k].y;
          v[k].z = v[k].z + d[k].z;
          v[k].w = v[k].w + d[k].w;
          *reinterpret_cast<float4*>(n.h + off) = v[k];
        }
      }
    }
    {
      const uint32_t sw = (uint32_t)__cvta_generic_to_shared(s_w);
      for (int i = tid; i < E * S4; i += kNrThreads) {
        const int e = i / S4, c4 = i - e * S4;
        cp_async_cg16(sw + (uint32_t)(e * S + 4 * c4) * 4u, a.W + (int64_t)e * H + k0 + 4 * c4, 0);
      }
      const uint32_t sg = (uint32_t)__cvta_generic_to_shared(s_g);
      for (int c4 = tid; c4 < S4; c4 += kNrThreads)
        cp_async_cg16(sg + (uint32_t)c4 * 16u, n.weight + k0 + 4 * c4, 0);
      cp_async_commit();
    }
#pragma unroll
    for (int k = 0; k < kNrMaxItems; ++k) {
      const int i = tid + k * kNrThreads;
      if (i < items) reinterpret_cast<float4*>(s_y)[i] = v[k];  // [m][S] in float4s: i = m * S4 + c4
    }
  }
  __syncthreads();
  if (warp < RM) {  // the row's partial sum of squares (zero past the live rows)
    const float4* y4 = reinterpret_cast<const float4*>(s_y) + warp * S4;
    float ss = 0.f;
    for (int c4 = lane; c4 < S4; c4 += 32) {
      const float4 v = y4[c4];
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    ss = warp_sum(ss);
    // Into slot [rank][warp] of every CTA of the cluster (lane c: CTA c).
    if (lane < sh.C) st_dsmem_f32((uint32_t)__cvta_generic_to_shared(&s_ss[rank][warp]), lane, ss);
  }
  cluster_arrive_release();
  cluster_wait_acquire();
  // The next launch may start now (programmatic dependent launch: at 2-8 rows
  // the experts' gate|up, which fetches the shared expert's weights into L2
  // before it waits for this grid). Triggered here rather than at the top, so
  // that its fetch does not compete with the rows' loads above. H200, decode
  // step, rank share, 2k context, A/B, ms, at the top -> here: batch 2 5.79 ->
  // 5.65, 4 6.96 -> 6.84, 8 9.16 -> 8.97 (after the second barrier: 5.66 /
  // 6.85 / 9.07).
  pdl_launch_dependents();

  // ---- 2. r a row (the C partials in rank order), y, partial amax and logits
  if (tid < RM) {
    float ss = 0.f;
    for (int c = 0; c < sh.C; ++c) ss += s_ss[c][tid];
    s_r[tid] = 1.0f / sqrtf(ss / (float)H + n.eps);
  }
  cp_async_wait_pending(0);
  __syncthreads();
  if (warp < RM) {
    float4* y4 = reinterpret_cast<float4*>(s_y) + warp * S4;
    const float4* g4 = reinterpret_cast<const float4*>(s_g);
    const float rr = s_r[warp];
    const bool out_f32 = n.out_f32 && warp < live;
    float amax = 0.f;
    for (int c4 = lane; c4 < S4; c4 += 32) {
      const float4 v = y4[c4], w = g4[c4];
      float4 y;
      y.x = w.x * (v.x * rr);
      y.y = w.y * (v.y * rr);
      y.z = w.z * (v.z * rr);
      y.w = w.w * (v.w * rr);
      y4[c4] = y;
      if (out_f32) reinterpret_cast<float4*>(n.out_f32 + (int64_t)(t0 + warp) * H + k0)[c4] = y;
      amax = fmaxf(amax, absmax4(y));
    }
    amax = warp_max(amax);
    if (lane < sh.C) st_dsmem_f32((uint32_t)__cvta_generic_to_shared(&s_amax[rank][warp]), lane, amax);
    if (n.out_rstd && rank == 0 && lane == 0 && warp < live) n.out_rstd[t0 + warp] = rr;
  }
  __syncthreads();
  {  // partial logits: warp (wn, wk) = experts wn*4.. x K steps wk, wk + WK, ...
    const int wn = warp % sh.WN, wk = warp / sh.WN;
    if (wk < sh.WK) {
      float acc[N];
#pragma unroll
      for (int i = 0; i < N; ++i) acc[i] = 0.f;
      const int e0 = wn * kRfRN;
      int eo[kRfRN];
#pragma unroll
      for (int j = 0; j < kRfRN; ++j) eo[j] = (e0 + j < E ? e0 + j : E - 1) * S;
      for (int k = wk * 128 + lane * 4; k < S; k += sh.WK * 128) {
        float4 wv[kRfRN], xv[RM];
#pragma unroll
        for (int j = 0; j < kRfRN; ++j) wv[j] = *reinterpret_cast<const float4*>(s_w + eo[j] + k);
#pragma unroll
        for (int m = 0; m < RM; ++m) xv[m] = *reinterpret_cast<const float4*>(s_y + m * S + k);
        rf_fma_step<RM>(acc, xv, wv);
      }
      rf_warp_tile_out<RM>(acc, s_red[warp]);
    }
    __syncthreads();
    if (tid < sh.WN * N) {  // summed over the warps along K in order
      const int wn = tid / N, idx = tid % N, m = idx / kRfRN, j = idx % kRfRN, e = wn * kRfRN + j;
      float sum = s_red[wn][idx];
      for (int wk = 1; wk < sh.WK; ++wk) sum += s_red[wk * sh.WN + wn][idx];
      if (e < E && m < live)  // into the leader's slot [rank]
        st_dsmem_f32((uint32_t)__cvta_generic_to_shared(&s_part[rank][m * kNrMaxE + e]), 0, sum);
    }
  }
  // Every remote store of the cluster is done once this barrier completes; no
  // CTA touches another's shared memory after it.
  cluster_arrive_release();
  cluster_wait_acquire();

  // ---- 3. the rows' scales, the leader's logits; then FP8 rows, selection, sort
  if (tid < RM) {
    float amax = 0.f;
    for (int c = 0; c < sh.C; ++c) amax = fmaxf(amax, s_amax[c][tid]);
    const float s = fmaxf(amax / kFp8Max, kMinActScale);
    s_inv_scale[tid] = 1.0f / s;
    if (rank == 0 && tid < live) n.out_scale[t0 + tid] = s;
  }
  if (rank == 0 && tid < live * E) {
    const int m = tid / E, e = tid - m * E;
    float sum = 0.f;
    for (int c = 0; c < sh.C; ++c) sum += s_part[c][m * kNrMaxE + e];
    s_lg[m * kNrMaxE + e] = sum;
  }
  __syncthreads();
  // The leader selects and sorts before its FP8 stores, so that a release
  // fence (past one tile) waits for its ids only. One tile: the ids are
  // sorted from shared memory.
  if (rank == 0) {
    const int slots = r.slots > 0 ? r.slots : r.top_k + (r.shared_local >= 0 ? 1 : 0);
    if (warp < live)
      route_token<1>(r, t0 + warp, [&](int e) { return s_lg[warp * kNrMaxE + e]; }, s_ids + warp * slots);
    if (sh.n_tt == 1) {
      __syncthreads();
      align_block<false>(s_ids, T * slots, slots, a.n_groups, a.offsets, a.sorted_rows, a.inv, s_cnt, s_cur);
    } else if (cta_arrive_last(static_cast<int*>(a.workspace), sh.n_tt, true, &s_last)) {
      align_block<true>(r.ids, T * slots, slots, a.n_groups, a.offsets, a.sorted_rows, a.inv, s_cnt, s_cur);
    }
  }
  for (int i = tid; i < live * S4; i += kNrThreads) {
    const int m = i / S4, c4 = i - m * S4;
    const float4 y = reinterpret_cast<const float4*>(s_y)[i];
    reinterpret_cast<uint32_t*>(n.out_q + (int64_t)(t0 + m) * H + k0)[c4] = pack_e4m3x4(y, s_inv_scale[m]);
  }
#endif
}

using NrKernelFn = void (*)(AddNormArgs, RouterFusedArgs, NrShape);
NrKernelFn nr_kernel(int RM) {
  return RM <= 2 ? add_rmsnorm_router_kernel<2> : RM <= 4 ? add_rmsnorm_router_kernel<4> : add_rmsnorm_router_kernel<8>;
}

// Test / bench hook (add_rmsnorm_router_set_cluster below): the largest
// cluster nr_plan may take (0: kNrMaxCluster).
int g_nr_max_cluster = 0;

// Per device: 1 + whether the device launches the kernel's clusters of 8
// (asked once: cluster launch, sm_90, an active cluster by the occupancy
// query); 0: not asked yet.
std::atomic<int> g_nr_ok[kRfMaxDevices];

bool nr_device_ok() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  if (dev < 0 || dev >= kRfMaxDevices) return false;
  int v = g_nr_ok[dev].load(std::memory_order_relaxed);
  if (v == 0) {
    int major = 0, can = 0;
    bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
              cudaDeviceGetAttribute(&can, cudaDevAttrClusterLaunch, dev) == cudaSuccess && major >= 9 && can;
    // Every instantiation may take the largest dynamic shared memory a plan asks.
    for (int rm : {2, 4, 8})
      ok = ok && cudaFuncSetAttribute(nr_kernel(rm), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      (int)kNrMaxSmem) == cudaSuccess;
    if (ok) {
      const LaunchConfig lc(dim3(kNrMaxCluster), dim3(kNrThreads), kNrMaxSmem, nullptr, false, kNrMaxCluster);
      int nc = 0;
      ok = cudaOccupancyMaxActiveClusters(&nc, nr_kernel(8), &lc.cfg) == cudaSuccess && nc > 0;
    }
    if (!ok) (void)cudaGetLastError();
    v = ok ? 2 : 1;
    g_nr_ok[dev].store(v, std::memory_order_relaxed);
  }
  return v == 2;
}

}  // namespace

bool add_rmsnorm_router_supported(int T, int E, int H) {
  if (T < 2 || T > kNrMaxT || E < 1 || E > kNrMaxE || H < 128 || H % 128 != 0) return false;
  const NrShape s = nr_plan(T, E, H, kNrMaxCluster);
  if (s.RM * s.S / 4 > kNrThreads * kNrMaxItems || nr_smem_bytes(s, E) > kNrMaxSmem) return false;
  return nr_device_ok();
}

cudaError_t add_rmsnorm_router(const AddNormArgs& n, const RouterFusedArgs& a, cudaStream_t st) {
  const RouterArgs& r = a.sel;
  if (r.T <= 0) return cudaSuccess;
  if (!add_rmsnorm_router_supported(r.T, r.E, n.hidden)) return cudaErrorNotSupported;
  if (n.rows != r.T || a.H != n.hidden || !n.h || !n.weight || !n.out_q || !n.out_scale || n.row_index ||
      n.keep_h || n.out_bf16 || n.delta_splits < 1 || (n.delta_splits > 1 && !n.delta) ||
      (n.delta_splits > 1 && (n.delta_split_stride < (int64_t)n.rows * n.hidden || n.delta_split_stride % 4)) ||
      (uintptr_t)n.h % 16 || (uintptr_t)n.delta % 16 || (uintptr_t)n.weight % 16 || (uintptr_t)n.out_f32 % 16 ||
      (uintptr_t)n.out_q % 4)
    return cudaErrorInvalidValue;
  if (r.top_k <= 0 || r.top_k > 32 || r.top_k > r.E || r.slots < 0 ||
      (r.slots > 0 && r.slots != r.top_k && r.slots != r.top_k + 1) || r.n_group <= 0 || r.n_group > 32 ||
      r.E % r.n_group != 0 || r.topk_group <= 0 || r.topk_group > r.n_group ||
      (r.n_group > 1 && r.E / r.n_group < 2) || !r.bias || !r.ids || !r.w)
    return cudaErrorInvalidValue;
  if (!a.W || (uintptr_t)a.W % 16 || a.n_groups <= 0 || a.n_groups > kMaxGroups || !a.offsets ||
      !a.sorted_rows || !a.inv || !a.workspace || (uintptr_t)a.workspace % 16)
    return cudaErrorInvalidValue;
  const int max_c = g_nr_max_cluster > 0 && g_nr_max_cluster < kNrMaxCluster ? g_nr_max_cluster : kNrMaxCluster;
  const NrShape sh = nr_plan(r.T, r.E, n.hidden, max_c);
  if (sh.RM * sh.S / 4 > kNrThreads * kNrMaxItems || nr_smem_bytes(sh, r.E) > kNrMaxSmem)
    return cudaErrorNotSupported;  // (a smaller cluster under the hook)
  const LaunchConfig lc(dim3(sh.n_tt * sh.C), dim3(kNrThreads), nr_smem_bytes(sh, r.E), st, false, sh.C);
  const cudaError_t e = cudaLaunchKernelEx(&lc.cfg, nr_kernel(sh.RM), n, a, sh);
  return e != cudaSuccess ? e : cudaGetLastError();
}

// Test / bench hook (not in kernels.h; small_check declares it): the largest
// cluster add_rmsnorm_router's plan may take (0 or >= 8: the portable 8).
void add_rmsnorm_router_set_cluster(int max_c) { g_nr_max_cluster = max_c; }

// ------------------------------------------------------------ router logits from h
// router_logits_normed (kernels.h): kRlRows token rows per CTA, so every CTA
// reads the router (E x H FP32, L2-resident after the first) once for 16 rows;
// 8 warps split K in 64-float4 strides, a warp's lanes are 4 row groups (rows
// g, g+4, g+8, g+12) x 8 K lanes (consecutive float4: 128-byte pieces of a
// row). Each lane rebuilds y = w * (h * rstd) as add_rmsnorm does and keeps 4
// rows x EMAX partial logits; the 8 K lanes are summed by xor shuffles, the 8
// warps in smem in warp order. The residual rows are read once (evict-first
// loads) with the next stride's rows loaded ahead.
namespace {

// Measured on an H100 (small_check --bench, T = 2,048, E = 20): the norm and
// this kernel 62.7 us against the norm writing FP32 rows and cuBLAS's SGEMM
// 73.1; 2 rows a lane in 512 threads (99 registers instead of 254) 122.9;
// the CTA's rows prefetched into L2 first (cp.async.bulk.prefetch) 69.3.
constexpr int kRlRows = 16;
constexpr int kRlRowsPerLane = 4;
constexpr int kRlRowGroups = kRlRows / kRlRowsPerLane;  // lanes at one K position
constexpr int kRlKLanes = 32 / kRlRowGroups;            // consecutive float4 of a row per warp
constexpr int kRlThreads = 256;
constexpr int kRlWarps = kRlThreads / 32;

// A CTA's logits: the warps' partials (after a barrier) summed in warp order
// (deterministic), rows past T not stored.
// finish(row, sum) is what is stored (rmsnorm_router_logits: the row's 1/rms
// times the sum).
template <int WARPS, int ROWS, int EM, typename Finish>
__device__ __forceinline__ void rl_sum_warps(const float (&part)[WARPS][ROWS][EM], int t0, int T, int E,
                                             float* __restrict__ logits, Finish finish) {
  for (int idx = threadIdx.x; idx < ROWS * E; idx += blockDim.x) {
    const int row = idx / E, e = idx - row * E, t = t0 + row;
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) sum += part[w][row][e];
    if (t < T) logits[(int64_t)t * E + e] = finish(row, sum);
  }
}
template <int WARPS, int ROWS, int EM>
__device__ __forceinline__ void rl_sum_warps(const float (&part)[WARPS][ROWS][EM], int t0, int T, int E,
                                             float* __restrict__ logits) {
  rl_sum_warps(part, t0, T, E, logits, [](int, float sum) { return sum; });
}

template <int EMAX>  // a multiple of 8
__global__ void __launch_bounds__(kRlThreads) router_logits_normed_kernel(
    const float* __restrict__ h, const float* __restrict__ norm_w, const float* __restrict__ rstd,
    const float* __restrict__ W, float* __restrict__ logits, int T, int E, int H) {
  constexpr int RPL = kRlRowsPerLane, RG = kRlRowGroups, KL = kRlKLanes;
  __shared__ float part[kRlWarps][kRlRows][EMAX];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int rg = lane / KL, kl = lane % KL;
  const int t0 = blockIdx.x * kRlRows;
  const int H4 = H >> 2;
  const float4* hr[RPL];
  float r[RPL];
#pragma unroll
  for (int i = 0; i < RPL; ++i) {
    const int t = t0 + rg + RG * i;
    // A row past T reads row T - 1 with a zero factor: y = 0, never stored.
    hr[i] = reinterpret_cast<const float4*>(h + (int64_t)min(t, T - 1) * H);
    r[i] = t < T ? rstd[t] : 0.f;
  }
  const float4* w4 = reinterpret_cast<const float4*>(W);
  const float4* n4 = reinterpret_cast<const float4*>(norm_w);
  float acc[RPL][EMAX];
#pragma unroll
  for (int i = 0; i < RPL; ++i)
#pragma unroll
    for (int e = 0; e < EMAX; ++e) acc[i][e] = 0.f;
  constexpr int kStride = KL * kRlWarps;  // float4 columns per pass of the CTA
  int c = kl + KL * warp;
  float4 v[RPL];
  if (c < H4) {
#pragma unroll
    for (int i = 0; i < RPL; ++i) v[i] = __ldcs(hr[i] + c);
  }
  for (; c < H4; c += kStride) {
    const int cn = c + kStride;
    float4 vn[RPL];
    if (cn < H4) {
#pragma unroll
      for (int i = 0; i < RPL; ++i) vn[i] = __ldcs(hr[i] + cn);
    }
    const float4 wn = __ldg(n4 + c);
    float4 y[RPL];
#pragma unroll
    for (int i = 0; i < RPL; ++i) {
      y[i].x = wn.x * (v[i].x * r[i]);
      y[i].y = wn.y * (v[i].y * r[i]);
      y[i].z = wn.z * (v[i].z * r[i]);
      y[i].w = wn.w * (v[i].w * r[i]);
    }
    // Eight experts' weights at a time, loaded unconditionally (experts past
    // E repeat the last one into accumulators never stored): predicated
    // loads were issued one at a time, each waiting out its L2 latency.
#pragma unroll
    for (int e0 = 0; e0 < EMAX; e0 += 8) {
      float4 w[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) w[j] = __ldg(w4 + (int64_t)min(e0 + j, E - 1) * H4 + c);
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int i = 0; i < RPL; ++i) {
          float a = acc[i][e0 + j];
          a = fmaf(y[i].x, w[j].x, a);
          a = fmaf(y[i].y, w[j].y, a);
          a = fmaf(y[i].z, w[j].z, a);
          a = fmaf(y[i].w, w[j].w, a);
          acc[i][e0 + j] = a;
        }
    }
#pragma unroll
    for (int i = 0; i < RPL; ++i) v[i] = vn[i];
  }
#pragma unroll
  for (int i = 0; i < RPL; ++i)
#pragma unroll
    for (int e = 0; e < EMAX; ++e) {
      if (e < E) {
        float a = acc[i][e];
#pragma unroll
        for (int o = 1; o < KL; o <<= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
        if (kl == 0) part[warp][rg + RG * i][e] = a;
      }
    }
  __syncthreads();
  rl_sum_warps(part, t0, T, E, logits);
}

// The same logits on the tensor cores in 3xTF32 (H % 32 == 0): each FP32
// operand x is split into hi = tf32(x) and lo = tf32(x - hi) and the product
// taken as hi*hi + hi*lo + lo*hi (the dropped lo*lo is ~2^-22 of it), summed
// in FP32 by mma.sync m16n8k8; where a chunk's router weights are already
// TF32 (BF16 checkpoint values) their lo is zero and the weights' split and
// the hi*lo product are skipped (the same sums; the kernel was bound by
// issuing the splits: at 2,048 rows ~450 instructions a warp and chunk, of
// which 36 mma) — the FMA kernel above was bound by its own
// instruction latency (~30 us a CTA, one CTA of 8 warps per SM at 252
// registers). A CTA takes 16 rows; its 16 warps split K in 32-column chunks
// (warp w: chunks w, w + 16, ...), the next chunk's rows loaded while this
// one's are multiplied. In a chunk lane (g, c) holds columns
// [8c, 8c + 8) of rows g and g + 8 and of experts g + 8n; k-step j pairs
// column 8c + j (mma k index c) with 8c + 4 + j (k index c + 4), the same
// columns for A and B, so the chunk's 32 columns are summed in a permuted
// order. The warps' partial logits are summed in warp order (deterministic).
constexpr int kRlTcRows = 16;
constexpr int kRlTcWarps = 16;
constexpr int kRlTcThreads = 32 * kRlTcWarps;

// cvt.rna.tf32.f32 of a finite x: round the magnitude to 10 mantissa bits,
// ties away from zero. ptxas expands the cvt into these two integer
// operations plus a compare and select that keep Inf and NaN as they are
// (here a NaN whose payload is all in the dropped bits would become Inf;
// the rows and weights are finite), 4 instructions against 2, and the split
// below does two a value.
__device__ __forceinline__ uint32_t tf32_rna(float x) { return (__float_as_uint(x) + 0x1000u) & 0xffffe000u; }

__device__ __forceinline__ void mma_tf32_16x8x8(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The outputs of the post-attention norm that rmsnorm_router_logits writes
// with the logits (NORM): its FP8 rows, their scales and 1/rms.
struct RlNormOut {
  float eps;
  uint8_t* q;
  float* scale;
  float* rstd;
};

// NORM (rmsnorm_router_logits): no rstd yet. The first pass takes u = w * h
// (r = 1) and also sums each row's squares and its largest |u|; then r = 1 /
// rms, the logits are r times the sums of u * W, the scale max(r max|u| /
// 448, min), and a second pass over the CTA's rows (from L2: the first pass
// read them with the normal cache policy) writes the FP8 codes of y = w * (h
// * r) — add_rmsnorm's y — four chunks' rows requested at once. H200
// (small_check --bench, 2026-11-29, us at 1,024 / 2,048 / 8,192 rows): one
// chunk ahead 19.01 / 26.87 / 99.76, four 19.02 / 24.53 / 91.07; with the
// first pass's rows marked evict_last in L2 as well, 28.38 at 2,048.
template <int NTL, bool NORM = false>  // 8-expert tiles: E <= 8 * NTL
__global__ void __launch_bounds__(kRlTcThreads, 1) router_logits_normed_tc_kernel(
    const float* __restrict__ h, const float* __restrict__ norm_w, const float* __restrict__ rstd,
    const float* __restrict__ W, float* __restrict__ logits, int T, int E, int H, RlNormOut no = {}) {
  __shared__ float part[kRlTcWarps][kRlTcRows][8 * NTL];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, c = lane & 3;
  const int t0 = blockIdx.x * kRlTcRows;
  // Rows g and g + 8 of the tile; a row past T reads row T - 1 with a zero
  // factor (y = 0, never stored). Experts past E repeat E - 1 (never stored).
  const float4* hr[2];
  float r[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int t = t0 + g + 8 * i;
    hr[i] = reinterpret_cast<const float4*>(h + (int64_t)min(t, T - 1) * H) + 2 * c;
    if constexpr (NORM) r[i] = t < T ? 1.f : 0.f;
    else r[i] = t < T ? rstd[t] : 0.f;
  }
  float ss[2] = {0.f, 0.f}, am[2] = {0.f, 0.f};  // NORM: sums of h^2, max |w * h|
  const float4* wr[NTL];
#pragma unroll
  for (int n = 0; n < NTL; ++n) wr[n] = reinterpret_cast<const float4*>(W + (int64_t)min(g + 8 * n, E - 1) * H) + 2 * c;
  const float4* nw = reinterpret_cast<const float4*>(norm_w) + 2 * c;
  float d[NTL][4];
#pragma unroll
  for (int n = 0; n < NTL; ++n) d[n][0] = d[n][1] = d[n][2] = d[n][3] = 0.f;
  const int chunks = H / 32;
  // The rows (HBM, read once) one chunk ahead; the router and norm weights
  // (L2-resident) at the chunk. Measured on an H200 (small_check --bench,
  // 2,048 rows): one chunk ahead in registers they spilled at 128; two chunks
  // ahead by cp.async into a lane's own shared-memory slots, 79 us against 20.
  // Up to 24 experts the router's and norm's weights go one chunk ahead too
  // (the registers the weights' split freed where they are TF32; at 32
  // experts they would spill).
  constexpr bool kWeightsAhead = NTL <= 3;
  float4 hv[2][2], wv[NTL][2], nv[2];
  auto load_rows = [&](int k) {  // chunk k's float4 column offset is 8k
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      if constexpr (NORM) {  // read again by the second pass: kept in L2
        hv[i][0] = __ldg(hr[i] + 8 * k);
        hv[i][1] = __ldg(hr[i] + 8 * k + 1);
      } else {
        hv[i][0] = __ldcs(hr[i] + 8 * k);
        hv[i][1] = __ldcs(hr[i] + 8 * k + 1);
      }
    }
  };
  auto load_weights = [&](int k) {
#pragma unroll
    for (int n = 0; n < NTL; ++n) {
      wv[n][0] = __ldg(wr[n] + 8 * k);
      wv[n][1] = __ldg(wr[n] + 8 * k + 1);
    }
    nv[0] = __ldg(nw + 8 * k);
    nv[1] = __ldg(nw + 8 * k + 1);
  };
  int k = warp;
  if (k < chunks) {
    load_rows(k);
    if constexpr (kWeightsAhead) load_weights(k);
  }
  for (; k < chunks; k += kRlTcWarps) {
    if constexpr (!kWeightsAhead) load_weights(k);
    // This chunk's values as 8 floats a row / expert: column 8c + q.
    float y[2][8], wf[NTL][8];
    {
      const float nf[8] = {nv[0].x, nv[0].y, nv[0].z, nv[0].w, nv[1].x, nv[1].y, nv[1].z, nv[1].w};
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const float hf[8] = {hv[i][0].x, hv[i][0].y, hv[i][0].z, hv[i][0].w,
                             hv[i][1].x, hv[i][1].y, hv[i][1].z, hv[i][1].w};
#pragma unroll
        for (int q = 0; q < 8; ++q) y[i][q] = nf[q] * (hf[q] * r[i]);  // add_rmsnorm's y, bit for bit
        if constexpr (NORM) {
#pragma unroll
          for (int q = 0; q < 8; ++q) {
            ss[i] += hf[q] * hf[q];
            am[i] = fmaxf(am[i], fabsf(y[i][q]));
          }
        }
      }
#pragma unroll
      for (int n = 0; n < NTL; ++n) {
        const float f[8] = {wv[n][0].x, wv[n][0].y, wv[n][0].z, wv[n][0].w,
                            wv[n][1].x, wv[n][1].y, wv[n][1].z, wv[n][1].w};
#pragma unroll
        for (int q = 0; q < 8; ++q) wf[n][q] = f[q];
      }
    }
    if (k + kRlTcWarps < chunks) {
      load_rows(k + kRlTcWarps);
      if constexpr (kWeightsAhead) load_weights(k + kRlTcWarps);
    }
    // Router weights already TF32 (a BF16 checkpoint's, widened: the low 13
    // bits zero in every lane's values of this chunk) have lo = 0, so the
    // hi*lo product adds exact zeros: skipped, with the weights' split, which
    // gives the same sums. Otherwise the three products.
    uint32_t wlow = 0;
#pragma unroll
    for (int n = 0; n < NTL; ++n)
#pragma unroll
      for (int q = 0; q < 8; ++q) wlow |= __float_as_uint(wf[n][q]) & 0x1fffu;
    auto chunk_mma = [&](auto w_tf32) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint32_t ah[4], al[4];
        const float av[4] = {y[0][j], y[1][j], y[0][4 + j], y[1][4 + j]};
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          ah[q] = tf32_rna(av[q]);
          al[q] = tf32_rna(av[q] - __uint_as_float(ah[q]));
        }
#pragma unroll
        for (int n = 0; n < NTL; ++n) {
          if constexpr (decltype(w_tf32)::value) {
            const uint32_t bh0 = __float_as_uint(wf[n][j]), bh1 = __float_as_uint(wf[n][4 + j]);
            mma_tf32_16x8x8(d[n], al, bh0, bh1);
            mma_tf32_16x8x8(d[n], ah, bh0, bh1);
          } else {
            const uint32_t bh0 = tf32_rna(wf[n][j]), bh1 = tf32_rna(wf[n][4 + j]);
            const uint32_t bl0 = tf32_rna(wf[n][j] - __uint_as_float(bh0));
            const uint32_t bl1 = tf32_rna(wf[n][4 + j] - __uint_as_float(bh1));
            mma_tf32_16x8x8(d[n], al, bh0, bh1);
            mma_tf32_16x8x8(d[n], ah, bl0, bl1);
            mma_tf32_16x8x8(d[n], ah, bh0, bh1);
          }
        }
      }
    };
    if (__any_sync(0xffffffffu, wlow != 0))
      chunk_mma(std::false_type{});
    else
      chunk_mma(std::true_type{});
  }
  // d[n]: rows g (0, 1) and g + 8 (2, 3), experts 8n + 2c (+1).
#pragma unroll
  for (int n = 0; n < NTL; ++n) {
    part[warp][g][8 * n + 2 * c] = d[n][0];
    part[warp][g][8 * n + 2 * c + 1] = d[n][1];
    part[warp][g + 8][8 * n + 2 * c] = d[n][2];
    part[warp][g + 8][8 * n + 2 * c + 1] = d[n][3];
  }
  if constexpr (!NORM) {
    __syncthreads();
    rl_sum_warps(part, t0, T, E, logits);
  } else {
    // Each row's sums over its 4 lanes, then over the warps in warp order.
    __shared__ float s_ss[kRlTcWarps][kRlTcRows], s_am[kRlTcWarps][kRlTcRows], s_r[kRlTcRows], s_inv[kRlTcRows];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int o = 1; o < 4; o <<= 1) {
        ss[i] += __shfl_xor_sync(0xffffffffu, ss[i], o);
        am[i] = fmaxf(am[i], __shfl_xor_sync(0xffffffffu, am[i], o));
      }
      if (c == 0) {
        s_ss[warp][g + 8 * i] = ss[i];
        s_am[warp][g + 8 * i] = am[i];
      }
    }
    __syncthreads();
    if (threadIdx.x < kRlTcRows) {
      const int row = threadIdx.x, t = t0 + row;
      float sum = 0.f, mx = 0.f;
#pragma unroll
      for (int w = 0; w < kRlTcWarps; ++w) {
        sum += s_ss[w][row];
        mx = fmaxf(mx, s_am[w][row]);
      }
      const float rr = 1.0f / sqrtf(sum / (float)H + no.eps);
      const float sc = fmaxf(mx * rr / kFp8Max, kMinActScale);
      s_r[row] = rr;
      s_inv[row] = 1.0f / sc;
      if (t < T) {
        no.scale[t] = sc;
        if (no.rstd) no.rstd[t] = rr;
      }
    }
    __syncthreads();
    rl_sum_warps(part, t0, T, E, logits, [&](int row, float sum) { return s_r[row] * sum; });
    // The FP8 rows: y = w * (h * r) (add_rmsnorm's operations), this warp's
    // chunks again (from L2), four chunks' rows requested before their codes.
    float rq[2], inv[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      rq[i] = s_r[g + 8 * i];
      inv[i] = s_inv[g + 8 * i];
    }
    constexpr int kAhead = 4;
    for (int k0 = warp; k0 < chunks; k0 += kAhead * kRlTcWarps) {
      float4 hq[kAhead][2][2];
#pragma unroll
      for (int j = 0; j < kAhead; ++j) {
        const int k2 = k0 + j * kRlTcWarps;
        if (k2 >= chunks) continue;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          hq[j][i][0] = __ldcs(hr[i] + 8 * k2);
          hq[j][i][1] = __ldcs(hr[i] + 8 * k2 + 1);
        }
      }
#pragma unroll
      for (int j = 0; j < kAhead; ++j) {
        const int k2 = k0 + j * kRlTcWarps;
        if (k2 >= chunks) continue;
        const float4 n0 = __ldg(nw + 8 * k2), n1 = __ldg(nw + 8 * k2 + 1);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int t = t0 + g + 8 * i;
          if (t >= T) continue;
          const float4(&hc)[2] = hq[j][i];
          float4 y0, y1;
          y0.x = n0.x * (hc[0].x * rq[i]);
          y0.y = n0.y * (hc[0].y * rq[i]);
          y0.z = n0.z * (hc[0].z * rq[i]);
          y0.w = n0.w * (hc[0].w * rq[i]);
          y1.x = n1.x * (hc[1].x * rq[i]);
          y1.y = n1.y * (hc[1].y * rq[i]);
          y1.z = n1.z * (hc[1].z * rq[i]);
          y1.w = n1.w * (hc[1].w * rq[i]);
          *reinterpret_cast<uint2*>(no.q + (int64_t)t * H + 32 * k2 + 8 * c) =
              make_uint2(pack_e4m3x4(y0, inv[i]), pack_e4m3x4(y1, inv[i]));
        }
      }
    }
  }
}

bool g_rl_fma_only = false;  // router_logits_normed_force_fma (tests / benches)

}  // namespace

// Test / bench hook (not in kernels.h; small_check declares it): true makes
// router_logits_normed take the FMA kernel at every H (the tensor-core
// kernel's peer); false restores the default (tensor cores when H % 32 == 0).
void router_logits_normed_force_fma(bool on) { g_rl_fma_only = on; }

bool router_logits_normed_supported(int E, int H) { return E >= 1 && E <= 32 && H >= 4 && H % 4 == 0; }

cudaError_t router_logits_normed(const float* h, const float* norm_w, const float* rstd, const float* W,
                                 float* logits, int T, int E, int H, cudaStream_t st) {
  if (T <= 0) return cudaSuccess;
  if (!router_logits_normed_supported(E, H) || !h || !norm_w || !rstd || !W || !logits ||
      (uintptr_t)h % 16 || (uintptr_t)norm_w % 16 || (uintptr_t)W % 16)
    return cudaErrorInvalidValue;
  // Experts in tiles of 8 (at most 4): the tensor-core kernel's NTL, the FMA
  // kernel's EMAX = 8 NTL.
  const bool tc = H % 32 == 0 && !g_rl_fma_only;
  auto launch = [&](auto ntl) {
    constexpr int N = decltype(ntl)::value;
    if (tc)
      router_logits_normed_tc_kernel<N><<<(T + kRlTcRows - 1) / kRlTcRows, kRlTcThreads, 0, st>>>(
          h, norm_w, rstd, W, logits, T, E, H);
    else
      router_logits_normed_kernel<8 * N><<<(T + kRlRows - 1) / kRlRows, kRlThreads, 0, st>>>(
          h, norm_w, rstd, W, logits, T, E, H);
    return cudaGetLastError();
  };
  if (E <= 8) return launch(std::integral_constant<int, 1>{});
  if (E <= 16) return launch(std::integral_constant<int, 2>{});
  if (E <= 24) return launch(std::integral_constant<int, 3>{});
  return launch(std::integral_constant<int, 4>{});
}

bool rmsnorm_router_logits_supported(int E, int H) { return E >= 1 && E <= 24 && H >= 32 && H % 32 == 0; }

cudaError_t rmsnorm_router_logits(const AddNormArgs& n, const float* W, float* logits, int E, cudaStream_t st) {
  if (n.rows <= 0) return cudaSuccess;
  if (!rmsnorm_router_logits_supported(E, n.hidden) || !n.h || !n.weight || !W || !logits || !n.out_q ||
      !n.out_scale || n.delta || n.row_index || n.out_f32 || n.out_bf16 || n.keep_h || (uintptr_t)n.h % 16 ||
      (uintptr_t)n.weight % 16 || (uintptr_t)W % 16 || (uintptr_t)n.out_q % 8)
    return cudaErrorInvalidValue;
  const RlNormOut no{n.eps, n.out_q, n.out_scale, n.out_rstd};
  auto launch = [&](auto ntl) {
    constexpr int N = decltype(ntl)::value;
    router_logits_normed_tc_kernel<N, true><<<(n.rows + kRlTcRows - 1) / kRlTcRows, kRlTcThreads, 0, st>>>(
        n.h, n.weight, nullptr, W, logits, n.rows, E, n.hidden, no);
    return cudaGetLastError();
  };
  if (E <= 8) return launch(std::integral_constant<int, 1>{});
  if (E <= 16) return launch(std::integral_constant<int, 2>{});
  return launch(std::integral_constant<int, 3>{});
}

cudaError_t moe_align(const int* ids, int T, int slots, int n_groups, int* offsets,
                      int* sorted_rows, int* inv, cudaStream_t st) {
  if (n_groups <= 0 || n_groups > kMaxGroups) return cudaErrorInvalidValue;
  const int n = T * slots;
  // Decode sizes: a 256-thread block (its ids fit the registers); prefill: 1024.
  const int threads = n <= 256 * kAlignRegs ? 256 : 1024;
  align_kernel<<<1, threads, 0, st>>>(ids, n, slots, n_groups, offsets, sorted_rows, inv);
  return cudaGetLastError();
}

cudaError_t moe_combine(const float* y, const int* inv, const float* w, int T, int slots, int H,
                        float* delta, cudaStream_t st, const float* add) {
  if (T <= 0) return cudaSuccess;
  if (H % 4 != 0) return cudaErrorInvalidValue;
  // One float4 of a row per thread, the row spread over CTAs. (One looping CTA
  // per row of 128 threads was tried for T >= 128: in the decode step on an
  // H200 it doubled the combine's time at T=256, 28 vs 14 us per layer; so did
  // a loop over the row inside this kernel, 23 us.)
  const dim3 grid(T, (H / 4 + kCombineThreads - 1) / kCombineThreads);
  combine_kernel<<<grid, kCombineThreads, 0, st>>>(y, inv, w, slots, H, add, delta);
  return cudaGetLastError();
}


// Test / bench hook (not in kernels.h; small_check declares it): which form
// of router_fused runs (path: 0 auto, 1 the cluster form only, 2 the last-CTA
// form on the cluster form's plan, 3 the last-CTA form on its own plan; see
// RfPath) and a cap on the cluster size (0: the device's limit). Not
// thread-safe; the runtime never calls it.
struct RouterFusedTuning {
  int path, max_cluster;
};
void router_fused_get_tuning(RouterFusedTuning* t) { *t = {g_rf_tuning.path, g_rf_tuning.max_cluster}; }
void router_fused_set_tuning(const RouterFusedTuning* t) {
  if (!t) {
    g_rf_tuning = RfTuning{};
    return;
  }
  g_rf_tuning.path = t->path;
  g_rf_tuning.max_cluster = t->max_cluster;
}
// The launch router_fused makes for (T, E, H) under the current tuning:
// cluster = CTAs per cluster (0: the last-CTA form), the plan's tiles and
// splits. cudaErrorNotSupported where the tuning asks for a cluster the
// device cannot run.
struct RouterFusedPlan {
  int cluster, n_tt, n_et, n_ks, kw, grid;
};
cudaError_t router_fused_plan(int T, int E, int H, RouterFusedPlan* p) {
  if (T < 1 || E < 1 || E > 32 * kMaxExpertsPerLane || H < 4) return cudaErrorInvalidValue;
  RfLaunch l;
  const cudaError_t e = rf_choose(T, E, H, &l);
  if (e != cudaSuccess) return e;
  *p = {l.cluster, l.sh.n_tt, l.sh.n_et, l.sh.n_ks, l.sh.kw, l.sh.n_tt * l.sh.n_et * l.sh.n_ks};
  return cudaSuccess;
}

}  // namespace glmk
