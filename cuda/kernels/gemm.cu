// gemm.cu — FP8 linears. Decode (few rows): weight-streaming tensor-core
// kernels of our own (cuBLASLt FP8 reads weights at only ~2 TB/s for M <= 64,
// docs/hardware.md §2): the weights are fed to mma.sync m16n8k32 e4m3 as the 16-row
// A operand while the (few) tokens are the 8-column B operand ("swap A/B"),
// streamed through a cp.async pipeline in shared memory (dense: up to 32 token
// rows; grouped/MoE: any group size, in row tiles of 8, 16 or 32 rows) and, for
// dense linears of 33..64 rows, through registers. The dense pipelined kernel
// can be launched with programmatic dependent launch (weights stream before
// griddepcontrol.wait); every kernel here triggers its dependents at once.
// Prefill (many rows): cuBLASLt FP8 with FP32 output and the per-row /
// per-column scales applied by gemm_fp8_epilogue. Also the BF16 lm_head and
// FP32 router GEMMs (cuBLAS).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <map>
#include <tuple>

#include "common.cuh"

namespace glmk {
namespace {

constexpr int kTileRows = 16;       // weight rows per warp tile (the mma A operand)
constexpr int kKStep = 128;         // K granularity of the kernel (K % 128 == 0)
constexpr int kMaxBlockWarps = 8;
constexpr int kChunk = 512;         // one 16-byte piece per lane of a warp

// One pipeline stage of one warp covers 128*R bytes of K: the 16 weight rows
// (16 x 128R bytes) and the token tiles (8 rows x 128R bytes each).
__host__ __device__ constexpr int stage_k(int r) { return kKStep * r; }
__host__ __device__ constexpr int stage_bytes(int mt, int r) {
  return kTileRows * stage_k(r) + mt * 2 * r * kChunk;
}

// Kernel forms (a template parameter, so the dense path compiles to the same
// code as before the grouped tiling and PDL were added):
//   kPlain: dense (one group of M rows), or grouped with a block per whole
//           group (the dispatch before row tiles; StreamTuning::legacy);
//   kTiled: grouped, one block per (group, row tile) work item, the blocks
//           striding over the items (gridDim.z items per sweep);
//   kPdl:   dense, launched with programmatic dependent launch: the first
//           weight stages (and an L2 prefetch of more of the slice) are issued
//           before griddepcontrol.wait, everything else after it.
enum StreamMode { kPlain = 0, kTiled = 1, kPdl = 2 };

// Per-launch constants of stream_gemm_kernel (chosen on the host).
struct StreamLaunch {
  int k_per_split;  // K range of one block (multiple of the stage's K)
  int k_warps;      // warps of a block that split that K range (stage-interleaved)
  int stages;       // pipeline depth per warp
  int l2_prefetch;  // 0 / 1 / 2: none / 128 B / 256 B hint on the weight loads
  int pdl_l2;       // kPdl: bytes of each weight row's K range (from its start) to prefetch
                    // into L2 before griddepcontrol.wait (multiple of 16; 0: none)
};

// Programmatic dependent launch (sm_90): every kernel here triggers its
// dependents first thing (pdl_launch_dependents, common.cuh); the PDL-launched
// forms read what the kernel before writes only after pdl_wait.

// Grouped form with a compacted grid: block z serves the z-th non-empty group
// (group_offsets[g+1] > group_offsets[g]). Every warp finds it on its own, so
// no block barrier is needed before the weight stream starts; the offsets of
// up to 256 groups are loaded at once (one L2 round trip for 160 experts).
// Returns the group, or -1 when fewer than z+1 groups are non-empty.
__device__ int nth_active_group(const int* __restrict__ offs, int G, int z, int& row0, int& cnt) {
  const int lane = threadIdx.x & 31;
  const unsigned below = (1u << lane) - 1u;
  int seen = 0;
  for (int g0 = 0; g0 < G; g0 += 32 * 8) {
    int lo[8], hi[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int g = g0 + 32 * u + lane;
      lo[u] = g < G ? offs[g] : 0;
      hi[u] = g < G ? offs[g + 1] : 0;
    }
    // The lane whose group is the z-th non-empty one keeps it (no run-time
    // indexing of lo/hi, which would put them in local memory).
    int mine = -1, my_lo = 0, my_hi = 0;
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const bool ne = hi[u] > lo[u];
      const unsigned m = __ballot_sync(0xffffffffu, ne);
      if (ne && seen + __popc(m & below) == z) {
        mine = g0 + 32 * u + lane;
        my_lo = lo[u];
        my_hi = hi[u];
      }
      seen += __popc(m);
    }
    const unsigned owner = __ballot_sync(0xffffffffu, mine >= 0);
    if (owner) {
      const int src = __ffs(owner) - 1;
      row0 = __shfl_sync(0xffffffffu, my_lo, src);
      cnt = __shfl_sync(0xffffffffu, my_hi, src) - row0;
      return __shfl_sync(0xffffffffu, mine, src);
    }
  }
  return -1;
}

// Grouped form with row tiles: work item z is the z-th (group, tile) pair in
// group order, a group of n > 0 rows giving ceil(n / TR) tiles of TR rows (the
// last one shorter). Like nth_active_group, every warp finds it on its own from
// the offsets of up to 256 groups per round trip (an inclusive warp scan of
// the tile counts). Returns the group, or -1 when there are at most z pairs,
// with the tile's first row and row count; `total` = the number of pairs.
template <int TR>
__device__ int nth_group_tile(const int* __restrict__ offs, int G, int z, int& row0, int& cnt,
                              int& total) {
  const int lane = threadIdx.x & 31;
  int seen = 0, found = -1, f_row0 = 0, f_cnt = 0;
  for (int g0 = 0; g0 < G; g0 += 32 * 8) {
    int lo[8], hi[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int g = g0 + 32 * u + lane;
      lo[u] = g < G ? offs[g] : 0;
      hi[u] = g < G ? offs[g + 1] : 0;
    }
    int mine = -1, my_row0 = 0, my_cnt = 0;
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      if (g0 + 32 * u >= G) break;  // warp-uniform
      const int n = hi[u] - lo[u];
      const int t = n > 0 ? (n + TR - 1) / TR : 0;
      int s = t;  // inclusive scan of the tile counts over the lanes
#pragma unroll
      for (int d = 1; d < 32; d <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, s, d);
        if (lane >= d) s += v;
      }
      const int first = seen + s - t;  // this lane's group's first pair
      if (z >= first && z < first + t) {
        const int j = z - first;
        mine = g0 + 32 * u + lane;
        my_row0 = lo[u] + j * TR;
        my_cnt = min(TR, n - j * TR);
      }
      seen += __shfl_sync(0xffffffffu, s, 31);
    }
    const unsigned owner = __ballot_sync(0xffffffffu, mine >= 0);
    if (owner) {
      const int src = __ffs(owner) - 1;
      found = __shfl_sync(0xffffffffu, mine, src);
      f_row0 = __shfl_sync(0xffffffffu, my_row0, src);
      f_cnt = __shfl_sync(0xffffffffu, my_cnt, src);
    }
  }
  total = seen;
  row0 = f_row0;
  cnt = f_cnt;
  return found;
}

// One warp owns one 16-row weight tile and every k_warps-th stage of the
// block's K range; a block holds row_tiles x k_warps warps (warp = tile *
// k_warps + kw). Weights: each copy instruction of a warp moves 512 contiguous
// bytes (one or more whole 128-byte lines of one to four rows), so HBM sees long
// runs per row; the 16-byte piece q of row r lands at q ^ 4*(r & 1) of the
// row's shared copy, which makes the fragment reads below conflict-free. Tokens:
// each lane copies exactly the bytes it later feeds to the mma. A warp reads
// other lanes' weight copies, so a __syncwarp follows each wait; there is no
// block barrier inside the pipeline. Shared layout per warp and stage:
// [16 rows][128R bytes] weights, then [token tile t][64-byte half j][lane][16 B].
//
// Fragment mapping. K is a sum, so any permutation of K applied to both
// operands is allowed: for the 64-byte half j of the stage, lane (g = lane/4,
// c = lane%4) holds bytes 64j+16c .. +15 of weight rows g and g+8 and of token
// row g; the first mma takes bytes 0..7 of each lane's 16 (a0/a2/b0/b1 = words
// 0 and 1), the second bytes 8..15.
//
// Determinism: a row's result depends only on K, the stage width (R), the
// K-warps (k_warps) and ksplit, never on the row's position in its group, the
// group's size or the row tiling (each output element is its own dot product,
// summed per warp in stage order and folded over the K-warps in kw order).
//
// Stores one warp's mma accumulators: accumulator (t, e) is weight row nA
// (e < 2) or nB, token row chunk + 8t + 2c + (e & 1) of the group. With
// split-K the raw partial sums go to the workspace for the epilogue kernel;
// otherwise the output is scaled (s_act · s_w), biased and written.
template <int MT>
struct EpiScales {
  float xs[MT][2];  // x_scale of token rows 2c, 2c+1 of each token tile
  float w[2], b[2];  // w_scale and bias of weight rows nA, nB
  __device__ __forceinline__ void load(const StreamGemmArgs& a, int nt, int chunk, int c, int nA, int nB, int cnt,
                                       int row0, const float* wsc, const float* bias) {
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = chunk + t * 8 + 2 * c + h;
        xs[t][h] = 0.f;
        if (t < nt && r < cnt) {
          const int orow = row0 + r;
          xs[t][h] = a.x_scale[a.x_rows ? a.x_rows[orow] : orow];
        }
      }
    w[0] = nA < a.N ? wsc[nA] : 0.f;
    w[1] = nB < a.N ? wsc[nB] : 0.f;
    b[0] = bias && nA < a.N ? bias[nA] : 0.f;
    b[1] = bias && nB < a.N ? bias[nB] : 0.f;
  }
};

// Writes a warp tile's accumulators: the unscaled partial of its K split
// (ksplit > 1), or y = acc * x_scale * w_scale (+ bias) with the scales of es.
template <int MT>
__device__ __forceinline__ void store_acc(const StreamGemmArgs& a, const float (&acc)[MT][4], int nt,
                                          int chunk, int c, int nA, int nB, int cnt, int row0,
                                          const EpiScales<MT>& es) {
#pragma unroll
  for (int t = 0; t < MT; ++t) {
    if (t >= nt) continue;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = chunk + t * 8 + 2 * c + (e & 1);
      const int n = (e < 2) ? nA : nB;
      if (r >= cnt || n >= a.N) continue;
      const int orow = row0 + r;
      if (a.ksplit > 1) {
        a.ws[((int64_t)blockIdx.y * a.M + orow) * a.N + n] = acc[t][e];
      } else {
        // Spelled out (one rounding per step, the bias by FMA) so that every
        // instance of both kernels rounds alike: whether the compiler fused
        // the bias add depended on the instance once the operands were
        // preloaded (kernel_check's bitwise tile comparisons).
        const float p = __fmul_rn(acc[t][e], es.xs[t][e & 1]);
        a.Y[(int64_t)orow * a.ldy + n] = a.bias ? __fmaf_rn(p, es.w[e >> 1], es.b[e >> 1]) : __fmul_rn(p, es.w[e >> 1]);
      }
    }
  }
}

template <int MT, int R, int MODE>
__global__ void __launch_bounds__(kMaxBlockWarps * 32, 1)
    stream_gemm_kernel(StreamGemmArgs a, StreamLaunch L) {
  constexpr int KS = stage_k(R);            // K bytes per stage
  constexpr int CR = KS / 16;               // 16-byte pieces per weight row and stage
  constexpr int ROWS_PER_COPY = 32 / CR;    // weight rows one warp-wide copy covers
  constexpr int W_COPIES = kTileRows / ROWS_PER_COPY;
  constexpr int SBYTES = stage_bytes(MT, R);
  constexpr int TR = 8 * MT;                // kTiled: rows per work item (one token chunk)
  extern __shared__ __align__(16) uint8_t smem[];
  pdl_launch_dependents();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, c = lane & 3;
  const int KW = L.k_warps, S = L.stages;
  const int kw = warp % KW, tile = warp / KW;
  const int row_tiles = (int)(blockDim.x >> 5) / KW;
  int grp = blockIdx.z, row0 = 0, cnt = a.M;
  int item = blockIdx.z, n_items = 1;
  if (MODE == kTiled) {
    if (a.pdl) {
      // Launched early (programmatic dependent launch): until the wait, only
      // weights, which no kernel writes — this block's share of the group
      // that is sure to have rows, into L2 in 4 KB pieces.
      if (a.prefetch_group >= 0 && a.prefetch_group < a.groups)
        prefetch_l2_block_share(a.W + (int64_t)a.prefetch_group * a.N * a.K, (int64_t)a.N * a.K);
      pdl_wait();
    }
    grp = nth_group_tile<TR>(a.group_offsets, a.groups, item, row0, cnt, n_items);
    if (grp < 0) return;  // block-uniform
  } else if (MODE == kPlain && a.group_offsets) {
    if ((int)gridDim.z == a.groups) {
      row0 = a.group_offsets[grp];
      cnt = a.group_offsets[grp + 1] - row0;
    } else {
      grp = nth_active_group(a.group_offsets, a.groups, blockIdx.z, row0, cnt);
      if (grp < 0) return;  // block-uniform
    }
  }
  if (cnt <= 0) return;  // block-uniform
  const int n0 = (blockIdx.x * row_tiles + tile) * kTileRows;
  const bool live = n0 < a.N;  // a dead tile still joins the block's barriers
  const int64_t K = a.K;
  const int kbeg = blockIdx.y * L.k_per_split;
  // This lane's weight copies: rows n0 + lane/CR + u*ROWS_PER_COPY, piece lane%CR.
  const int crow = lane / CR, cpiece = lane % CR;
  const int64_t wstep = (int64_t)ROWS_PER_COPY * K;
  // Rows past N (last tile) are not copied; their outputs are not written.
  const int rows_left = a.N - n0 - crow;  // copy u is valid if u*ROWS_PER_COPY < rows_left
  const int n_stages = L.k_per_split / KS;
  const int my_n = (live && n_stages > kw) ? (n_stages - kw + KW - 1) / KW : 0;
  const int nA = n0 + g, nB = n0 + g + 8;
  uint8_t* wbuf = smem + (size_t)warp * S * SBYTES;
  const uint32_t wbuf_s = (uint32_t)__cvta_generic_to_shared(wbuf);
  const int pf = L.l2_prefetch;
  const int swz = (g & 1) << 2;  // the swizzle of fragment rows g and g+8
  const uint64_t wpol = l2_policy_stream();

  for (;;) {  // work items: one for kPlain / kPdl, gridDim.z apart for kTiled
    const uint8_t* wsrc = a.W + ((int64_t)grp * a.N + n0 + crow) * K + kbeg + cpiece * 16;
    const float* wsc = a.w_scale + (int64_t)grp * a.N;
    const float* bias = a.bias ? a.bias + (int64_t)grp * a.N : nullptr;
    // Weight copies of this warp's i-th stage into pipeline slot `slot`.
    auto issue_w = [&](int i, int slot) {
      const int koff = (kw + i * KW) * KS;
      const uint32_t d = wbuf_s + slot * SBYTES;
#pragma unroll
      for (int u = 0; u < W_COPIES; ++u) {
        const int row = crow + u * ROWS_PER_COPY;
        if (u * ROWS_PER_COPY < rows_left)
          cp_async_cg16_hint(d + row * KS + ((cpiece ^ ((row & 1) << 2)) * 16), wsrc + u * wstep + koff, pf,
                             wpol);
      }
    };
    bool w_issued = false;  // kPdl: the prologue's weight stages are already in flight
    if (MODE == kPdl) {
      // Weights are never written by a kernel: stream the first stages (and
      // prefetch more of this tile's rows into L2) while the previous kernel
      // finishes; activations, scales and outputs only after the wait.
      for (int i = 0; i < S - 1; ++i)
        if (i < my_n) issue_w(i, i);
      if (L.pdl_l2 > 0 && live && lane < kTileRows && lane % KW == kw && n0 + lane < a.N) {
        const int done = min(L.k_per_split, (S - 1) * KW * KS);  // covered by the prologue
        const int bytes = L.pdl_l2 - done;
        if (bytes > 0) prefetch_l2_bulk(a.W + (int64_t)(n0 + lane) * K + kbeg + done, (uint32_t)bytes);
      }
      pdl_wait();
      w_issued = true;
    }

    for (int chunk = 0; chunk < cnt; chunk += 8 * MT) {
      const int nt = min(MT, (cnt - chunk + 7) / 8);
      const uint8_t* xp[MT];
#pragma unroll
      for (int t = 0; t < MT; ++t) {
        const int r = chunk + t * 8 + g;
        xp[t] = nullptr;
        if (t < nt && r < cnt) {
          const int xr = a.x_rows ? a.x_rows[row0 + r] : row0 + r;
          xp[t] = a.X + (int64_t)xr * K + kbeg + 16 * c;
        }
      }
      float acc[MT][4];
#pragma unroll
      for (int t = 0; t < MT; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.f;
      // The epilogue's scales (and bias), loaded now: their L2 round trips
      // then overlap the K loop instead of following it on the block's
      // critical path (at batch 1 every GEMM of the step is one such path).
      EpiScales<MT> es;
      if (kw == 0 && live && a.ksplit == 1) es.load(a, nt, chunk, c, nA, nB, cnt, row0, wsc, bias);

      // Token copies of this warp's i-th stage into pipeline slot `slot`.
      auto issue_x = [&](int i, int slot) {
        const int koff = (kw + i * KW) * KS;
        const uint32_t dx = wbuf_s + slot * SBYTES + kTileRows * KS + lane * 16;
#pragma unroll
        for (int t = 0; t < MT; ++t)
          if (xp[t])
#pragma unroll
            for (int j = 0; j < 2 * R; ++j)
              cp_async_ca16(dx + (t * 2 * R + j) * kChunk, xp[t] + koff + 64 * j);
      };
      // Prologue: S-1 stages in flight. One commit group per stage (empty
      // groups past the end keep the count uniform for wait_group). With PDL
      // the first group also holds every prologue weight stage (issued before
      // the wait), so stage 0 waits for those too: they had the head start.
      for (int i = 0; i < S - 1; ++i) {
        if (i < my_n) {
          if (!(MODE == kPdl && w_issued)) issue_w(i, i);
          issue_x(i, i);
        }
        cp_async_commit();
      }
      w_issued = false;
      int slot = 0, fill = S - 1;
      for (int i = 0; i < my_n; ++i) {
        cp_async_wait_pending(S - 2);  // this lane's copies of stage i have landed
        __syncwarp();                  // ... and every lane's; slot `fill` was read by all
        if (i + S - 1 < my_n) {
          issue_w(i + S - 1, fill);
          issue_x(i + S - 1, fill);
        }
        cp_async_commit();
        if (++fill == S) fill = 0;
        const uint8_t* sw = wbuf + slot * SBYTES;
        const uint8_t* sx = sw + kTileRows * KS + lane * 16;
        if (++slot == S) slot = 0;
#pragma unroll
        for (int j = 0; j < 2 * R; ++j) {
          const int q = ((4 * j + c) ^ swz) * 16;
          const uint4 A = *reinterpret_cast<const uint4*>(sw + g * KS + q);
          const uint4 B = *reinterpret_cast<const uint4*>(sw + (g + 8) * KS + q);
#pragma unroll
          for (int t = 0; t < MT; ++t) {
            if (t < nt) {
              uint4 x = make_uint4(0, 0, 0, 0);
              if (xp[t]) x = *reinterpret_cast<const uint4*>(sx + (t * 2 * R + j) * kChunk);
              mma_e4m3_16832(acc[t], A.x, B.x, A.y, B.y, x.x, x.y);
              mma_e4m3_16832(acc[t], A.z, B.z, A.w, B.w, x.z, x.w);
            }
          }
        }
      }
      cp_async_wait_pending(0);  // only empty groups can remain
      __syncwarp();              // every lane is done with the buffer

      if (KW > 1) {
        // Fold the K-warps of each tile into its kw == 0 warp, in kw order
        // (deterministic). Each warp parks its partials in its own (idle) buffer.
        float* red = reinterpret_cast<float*>(wbuf);
#pragma unroll
        for (int t = 0; t < MT; ++t)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (t < nt) red[(t * 4 + e) * 32 + lane] = acc[t][e];
        __syncthreads();
        if (kw == 0) {
          for (int w = 1; w < KW; ++w) {
            const float* o = reinterpret_cast<const float*>(smem + (size_t)(warp + w) * S * SBYTES);
#pragma unroll
            for (int t = 0; t < MT; ++t)
#pragma unroll
              for (int e = 0; e < 4; ++e)
                if (t < nt) acc[t][e] += o[(t * 4 + e) * 32 + lane];
          }
        }
      }

      // Accumulator (t): c0 = (weight row g, token 2c), c1 = (g, 2c+1),
      // c2 = (g+8, 2c), c3 = (g+8, 2c+1).
      if (kw == 0 && live) {
        store_acc<MT>(a, acc, nt, chunk, c, nA, nB, cnt, row0, es);
      }
      if (KW > 1) __syncthreads();  // partner buffers are read before the next chunk refills them
    }
    if (MODE != kTiled) break;
    item += gridDim.z;  // more pairs than the grid covers (a skewed routing): next sweep
    if (item >= n_items) break;
    grp = nth_group_tile<TR>(a.group_offsets, a.groups, item, row0, cnt, n_items);
  }
}

// Register-pipelined variant for dense linears of 33..64 token rows per pass
// and the grouped dispatch before row tiles above 32 rows (StreamTuning::legacy;
// the first design): 8 warps x 16 rows per block, each lane loading 16 bytes of rows g
// and g+8 per 64-byte half with the next 128-byte stage in flight in
// registers, tokens read through L1 (every warp of the block reads the same
// ones). Same fragment mapping as above (R = 1, no swizzle).
constexpr int kRegRowsPerBlock = kMaxBlockWarps * kTileRows;
template <int MT>
__global__ void __launch_bounds__(kMaxBlockWarps * 32)
    reg_stream_gemm_kernel(StreamGemmArgs a, int k_per_split) {
  pdl_launch_dependents();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, c = lane & 3;
  int grp = blockIdx.z, row0 = 0, cnt = a.M;
  if (a.group_offsets) {
    if ((int)gridDim.z == a.groups) {
      row0 = a.group_offsets[grp];
      cnt = a.group_offsets[grp + 1] - row0;
    } else {
      grp = nth_active_group(a.group_offsets, a.groups, blockIdx.z, row0, cnt);
      if (grp < 0) return;
    }
  }
  if (cnt <= 0) return;
  const int n0 = blockIdx.x * kRegRowsPerBlock + warp * kTileRows;
  if (n0 >= a.N) return;  // no block barrier in this kernel
  const int nA = n0 + g, nB = n0 + g + 8;
  const int64_t K = a.K;
  const uint8_t* Wg = a.W + (int64_t)grp * a.N * K;
  const uint8_t* wA = Wg + (int64_t)min(nA, a.N - 1) * K;
  const uint8_t* wB = Wg + (int64_t)min(nB, a.N - 1) * K;
  const int kbeg = blockIdx.y * k_per_split;
  const int kend = kbeg + k_per_split;
  const float* wsc = a.w_scale + (int64_t)grp * a.N;
  const float* bias = a.bias ? a.bias + (int64_t)grp * a.N : nullptr;
  const uint64_t pol = l2_policy_stream();

  for (int chunk = 0; chunk < cnt; chunk += 8 * MT) {
    const int nt = min(MT, (cnt - chunk + 7) / 8);
    const uint8_t* xp[MT];
#pragma unroll
    for (int t = 0; t < MT; ++t) {
      const int r = chunk + t * 8 + g;
      xp[t] = nullptr;
      if (t < nt && r < cnt) {
        const int xr = a.x_rows ? a.x_rows[row0 + r] : row0 + r;
        xp[t] = a.X + (int64_t)xr * K + 16 * c;
      }
    }
    float acc[MT][4];
#pragma unroll
    for (int t = 0; t < MT; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.f;
    uint4 curA0 = ld_stream_v4(wA + kbeg + 16 * c, pol), curA1 = ld_stream_v4(wA + kbeg + 64 + 16 * c, pol);
    uint4 curB0 = ld_stream_v4(wB + kbeg + 16 * c, pol), curB1 = ld_stream_v4(wB + kbeg + 64 + 16 * c, pol);
    for (int k = kbeg; k < kend; k += kKStep) {
      uint4 nxA0, nxA1, nxB0, nxB1;
      const bool more = k + kKStep < kend;
      if (more) {
        const int kn = k + kKStep + 16 * c;
        nxA0 = ld_stream_v4(wA + kn, pol);
        nxA1 = ld_stream_v4(wA + kn + 64, pol);
        nxB0 = ld_stream_v4(wB + kn, pol);
        nxB1 = ld_stream_v4(wB + kn + 64, pol);
      }
#pragma unroll
      for (int t = 0; t < MT; ++t) {
        if (t < nt) {
          uint4 x0 = make_uint4(0, 0, 0, 0), x1 = make_uint4(0, 0, 0, 0);
          if (xp[t]) {
            x0 = ld_reuse_v4(xp[t] + k);
            x1 = ld_reuse_v4(xp[t] + k + 64);
          }
          mma_e4m3_16832(acc[t], curA0.x, curB0.x, curA0.y, curB0.y, x0.x, x0.y);
          mma_e4m3_16832(acc[t], curA0.z, curB0.z, curA0.w, curB0.w, x0.z, x0.w);
          mma_e4m3_16832(acc[t], curA1.x, curB1.x, curA1.y, curB1.y, x1.x, x1.y);
          mma_e4m3_16832(acc[t], curA1.z, curB1.z, curA1.w, curB1.w, x1.z, x1.w);
        }
      }
      if (more) {
        curA0 = nxA0; curA1 = nxA1; curB0 = nxB0; curB1 = nxB1;
      }
    }
    EpiScales<MT> es;
    if (a.ksplit == 1) es.load(a, nt, chunk, c, nA, nB, cnt, row0, wsc, bias);
    store_acc<MT>(a, acc, nt, chunk, c, nA, nB, cnt, row0, es);
  }
}

// Exactness-check path: FP32 activations x FP8 weights on CUDA cores. One warp
// per weight row n, 8 activation rows at a time; lane l covers k = 4l + 128i.
constexpr int kF32Rows = 8;
constexpr int kWarps = 8;
__global__ void __launch_bounds__(kWarps * 32) f32act_gemm_kernel(StreamGemmArgs a) {
  pdl_launch_dependents();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int grp = blockIdx.y;
  int row0 = 0, cnt = a.M;
  if (a.group_offsets) {
    row0 = a.group_offsets[grp];
    cnt = a.group_offsets[grp + 1] - row0;
  }
  const int n = blockIdx.x * kWarps + warp;
  if (cnt <= 0 || n >= a.N) return;
  const uint8_t* w = a.W + ((int64_t)grp * a.N + n) * a.K;
  const float ws = a.w_scale[(int64_t)grp * a.N + n];
  const float b = a.bias ? a.bias[(int64_t)grp * a.N + n] : 0.f;
  for (int c0 = 0; c0 < cnt; c0 += kF32Rows) {
    const float* xr[kF32Rows];
    float acc[kF32Rows];
#pragma unroll
    for (int r = 0; r < kF32Rows; ++r) {
      acc[r] = 0.f;
      xr[r] = nullptr;
      if (c0 + r < cnt) {
        const int lr = row0 + c0 + r;
        xr[r] = a.Xf + (int64_t)(a.x_rows ? a.x_rows[lr] : lr) * a.K;
      }
    }
    for (int k = lane * 4; k < a.K; k += 128) {
      const uint32_t wb = *reinterpret_cast<const uint32_t*>(w + k);
      const float w0 = e4m3_to_f32(wb & 0xff), w1 = e4m3_to_f32((wb >> 8) & 0xff),
                  w2 = e4m3_to_f32((wb >> 16) & 0xff), w3 = e4m3_to_f32(wb >> 24);
#pragma unroll
      for (int r = 0; r < kF32Rows; ++r) {
        if (!xr[r]) continue;
        const float4 x = *reinterpret_cast<const float4*>(xr[r] + k);
        acc[r] += x.x * w0 + x.y * w1 + x.z * w2 + x.w * w3;
      }
    }
#pragma unroll
    for (int r = 0; r < kF32Rows; ++r) {
      const float v = warp_sum(acc[r]);
      if (lane == 0 && xr[r]) a.Y[(int64_t)(row0 + c0 + r) * a.ldy + n] = v * ws + b;
    }
  }
}

__global__ void epilogue_kernel(const float* __restrict__ ws, int ksplit, int M, int N,
                                const float* __restrict__ xs, const float* __restrict__ wsc,
                                const float* __restrict__ bias, float* __restrict__ Y,
                                int64_t ldy) {
  pdl_launch_dependents();
  const int64_t total = (int64_t)M * N;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int r = (int)(i / N), n = (int)(i % N);
    float s = 0.f;
    for (int k = 0; k < ksplit; ++k) s += ws[(int64_t)k * total + i];
    float y = s * xs[r] * wsc[n];
    if (bias) y += bias[n];
    Y[(int64_t)r * ldy + n] = y;
  }
}

}  // namespace

namespace {

// Launch-shape policy of the pipelined kernel, from the sweeps of
// `kernel_check --sweep` on an H200 (docs/perf.md, 2026-11-22): weights move
// in 128-byte K stages (wider stages were no faster), about 16 warps per SM
// (K split over the warps of a block when the tiles are fewer), 3 stages per
// warp (2 when that is what keeps the whole grid resident: a second wave of
// blocks costs more than the shallower pipeline); the 256-byte L2 prefetch
// hint only with several token tiles (one tile: it cost ~1%). Grouped form:
// the K-warps are chosen for the groups (max_active_groups), the grid for the
// (group, row tile) pairs (tiled_items).
constexpr int kTargetWarpsPerSM = 16;
constexpr int kDefaultStages = 3;
constexpr int kMinStagesPerWarp = 4;
constexpr int default_l2_prefetch(int mt) { return mt == 1 ? 0 : 2; }
constexpr int kSmemBudgetPerSM = 216 * 1024;  // multi-wave grids: depth for 16 warps per SM

constexpr int kMaxDevices = 64;
// <MT, R> = <1,1> <1,2> <1,4> <2,1> <4,1>, each in the three StreamModes.
constexpr int kStreamShapes = 5;
constexpr int kStreamKernels = kStreamShapes * 3;
// kPdl: at most this share of L2 is filled by the prefetch of weights that
// runs before griddepcontrol.wait (the rest of the slice streams as usual).
constexpr int kPdlL2Share = 2;  // 1/2

std::atomic<int> g_kernel_regs[kMaxDevices][kStreamKernels];  // 0: attributes not set yet

// Blocks of `warps` warps with `smem` dynamic shared bytes that fit on one SM.
int blocks_per_sm(const DeviceInfo& d, int warps, int regs, size_t smem) {
  const int regs_per_warp = (regs * 32 + 255) / 256 * 256;
  int n = std::min(d.max_blocks, d.max_warps / warps);
  n = std::min<int64_t>(n, d.regs_per_sm / std::max(1, regs_per_warp * warps));
  n = std::min<int64_t>(n, d.smem_per_sm / (int64_t)(smem + d.smem_reserved));
  return n;
}

struct StreamPlan {
  StreamLaunch launch;
  dim3 grid;
  int threads = 0;
  size_t smem = 0;
};

// Groups the grid is sized for: at most max_active_groups of them non-empty.
int group_slots(const StreamGemmArgs& a) {
  if (!a.group_offsets) return 1;
  return a.max_active_groups > 0 ? std::min(a.groups, a.max_active_groups) : a.groups;
}

// kTiled: (group, row tile) work items one sweep of the grid covers. The
// blocks stride over all the pairs there are, so this is a size, not a bound
// results depend on: at most A groups (group_slots) of at most B rows
// (max_rows_per_group, else M) give at most A * ceil(B / tr) pairs; a routing
// with U rows per group gives about A + A * U / tr (U = typical_rows_per_group,
// else B): the smaller of the two, so the usual step needs one sweep and the
// grid holds few blocks that find no pair.
int tiled_items(const StreamGemmArgs& a, int tr) {
  const int64_t A = group_slots(a);
  const int bound = a.max_rows_per_group > 0 ? a.max_rows_per_group : a.M;
  const int64_t B = bound > 0 ? bound : tr;  // unknown: one tile per group, the sweeps do the rest
  const int64_t U = std::max<int64_t>(1, std::min<int64_t>(B, a.typical_rows_per_group > 0
                                                                   ? a.typical_rows_per_group
                                                                   : B));
  const int64_t items = std::min(A * ((B + tr - 1) / tr), A + (A * U + tr - 1) / tr);
  return (int)std::max<int64_t>(1, std::min<int64_t>(items, 65535));
}

// Launch shape (see the policy above). Returns false for an impossible tuning.
bool plan_stream(const StreamGemmArgs& a, int mt, int r, int mode, const StreamTuning& tu,
                 const DeviceInfo& d, int regs, StreamPlan& p) {
  const int tiles = ceil_div(a.N, kTileRows);
  // The K-warps follow the groups, not the row tiles: a row's summation order
  // (K-warps) is then the same whatever the tiling (and as in the dispatch before it).
  const int slots = group_slots(a);
  const int zdim = mode == kTiled ? tiled_items(a, 8 * mt) : slots;
  const int kps = a.K / a.ksplit;
  if (kps % stage_k(r) != 0) return false;
  const int n_stages = kps / stage_k(r);
  const int64_t units = (int64_t)tiles * slots * a.ksplit;
  int kw = tu.k_warps;
  if (kw <= 0) {
    kw = 1;
    while (kw < kMaxBlockWarps && n_stages >= 2 * kw * kMinStagesPerWarp &&
           units * kw < (int64_t)kTargetWarpsPerSM * d.sms)
      kw *= 2;
  }
  const int rt = tu.row_tiles > 0 ? tu.row_tiles : 1;
  if (kw < 1 || rt < 1 || kw * rt > kMaxBlockWarps) return false;
  const int warps = kw * rt;
  const int sbytes = stage_bytes(mt, r);
  const int64_t blocks = (int64_t)ceil_div(tiles, rt) * a.ksplit * zdim;
  int stages = tu.stages;
  if (stages <= 0) {
    for (int st = kDefaultStages; st >= 2 && stages == 0; --st) {
      const size_t smem = (size_t)warps * st * sbytes;
      if (smem <= (size_t)d.smem_optin && (int64_t)blocks_per_sm(d, warps, regs, smem) * d.sms >= blocks)
        stages = st;  // the whole grid is resident at once
    }
    if (stages == 0) {
      stages = std::max(2, std::min(kDefaultStages, kSmemBudgetPerSM / (kTargetWarpsPerSM * sbytes)));
      while (stages > 2 && (size_t)warps * stages * sbytes > (size_t)d.smem_optin) --stages;
    }
    stages = std::min(stages, std::max(2, ceil_div(n_stages, kw) + 1));
  }
  if (stages < 2 || stages > 16) return false;
  const int pf = tu.l2_prefetch >= 0 ? tu.l2_prefetch : default_l2_prefetch(mt);
  if (pf > 2) return false;
  p.smem = (size_t)warps * stages * sbytes;
  if (p.smem > (size_t)d.smem_optin) return false;
  int pdl_l2 = 0;
  if (mode == kPdl) {
    // Bytes of each weight row's K range prefetched into L2 before the wait:
    // the whole range while the weights fill at most 1/kPdlL2Share of L2,
    // else the leading part that does.
    const int64_t rows = (int64_t)a.N * a.ksplit;
    int64_t b = tu.pdl_prefetch >= 0 ? tu.pdl_prefetch
                                     : (int64_t)d.l2_bytes / kPdlL2Share / std::max<int64_t>(1, rows);
    b = std::min<int64_t>(b, kps) / 128 * 128;
    pdl_l2 = (int)std::max<int64_t>(0, b);
  }
  p.launch = StreamLaunch{kps, kw, stages, pf, pdl_l2};
  p.grid = dim3(ceil_div(tiles, rt), a.ksplit, zdim);
  p.threads = warps * 32;
  return true;
}

template <int MT, int R, int MODE>
cudaError_t launch_stream(const StreamGemmArgs& a, const StreamTuning& tu, cudaStream_t st) {
  constexpr int shape = MT == 1 ? (R == 1 ? 0 : R == 2 ? 1 : 2) : MT == 2 ? 3 : 4;
  constexpr int ID = MODE * kStreamShapes + shape;
  static_assert(ID >= 0 && ID < kStreamKernels, "kernel id");
  int dev = 0;
  DeviceInfo d;
  cudaError_t e = device_info(dev, d);
  if (e != cudaSuccess) return e;
  int regs = g_kernel_regs[dev][ID].load(std::memory_order_relaxed);
  if (regs == 0) {
    e = cudaFuncSetAttribute(stream_gemm_kernel<MT, R, MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             d.smem_optin);
    cudaFuncAttributes fa;
    if (e == cudaSuccess) e = cudaFuncGetAttributes(&fa, stream_gemm_kernel<MT, R, MODE>);
    if (e != cudaSuccess) return e;
    regs = std::max(1, fa.numRegs);
    g_kernel_regs[dev][ID].store(regs, std::memory_order_relaxed);
  }
  StreamPlan p;
  if (!plan_stream(a, MT, R, MODE, tu, d, regs, p)) return cudaErrorInvalidValue;
  // kPdl, and kTiled with a.pdl: programmatic dependent launch (the kernel
  // reads what the previous kernel writes only after pdl_wait).
  return launch_kernel(MODE == kPdl || (MODE == kTiled && a.pdl), stream_gemm_kernel<MT, R, MODE>, p.grid,
                       dim3(p.threads), p.smem, st, a, p.launch);
}

// Up to 32 token rows per pass: the pipelined kernel (K bytes per stage from
// the tuning, else 128; wider stages only with one token tile).
template <int MT, int MODE>
cudaError_t launch_pipelined(const StreamGemmArgs& a, const StreamTuning& tu, cudaStream_t st) {
  const int sk = tu.stage_k > 0 ? tu.stage_k : kKStep;
  if (MT == 1 && sk == 256) return launch_stream<1, 2, MODE>(a, tu, st);
  if (MT == 1 && sk == 512) return launch_stream<1, 4, MODE>(a, tu, st);
  if (sk != kKStep) return cudaErrorInvalidValue;
  return launch_stream<MT, 1, MODE>(a, tu, st);
}

template <int MT>
cudaError_t launch_pipelined_mode(const StreamGemmArgs& a, const StreamTuning& tu, int mode,
                                  cudaStream_t st) {
  if (mode == kTiled) return launch_pipelined<MT, kTiled>(a, tu, st);
  if (mode == kPdl) return launch_pipelined<MT, kPdl>(a, tu, st);
  return launch_pipelined<MT, kPlain>(a, tu, st);
}

// Row-tile height of the grouped form: 8, 16 or 32 (the 1, 2, 4 token tiles
// of the kernel), from the tuning, else from the rows a group typically has;
// 0 when that is above 32 (prefill-sized groups): the whole-group dispatch,
// whose register kernel shares each token row among the 8 warps of a block
// (a 32-row tile moves twice its weight bytes of tokens into shared memory).
int group_tile_rows(const StreamGemmArgs& a, const StreamTuning& tu) {
  if (tu.tile_rows != 0) return tu.tile_rows;
  const int bound = a.max_rows_per_group > 0 ? a.max_rows_per_group : a.M;
  int u = a.typical_rows_per_group > 0 ? a.typical_rows_per_group : bound;
  if (bound > 0) u = std::min(u, bound);
  return u <= 8 ? 8 : u <= 16 ? 16 : u <= 32 ? 32 : 0;
}

}  // namespace

int gemm_fp8_stream_splits(int M, int N, int K, int num_sms) {
  if (K % kKStep != 0 || num_sms <= 0) return 1;
  const int n_stages = K / kKStep;
  if (M > 32) {
    // The register-pipelined kernel (128 rows per block, no K-warps): split
    // until there are two blocks per SM.
    const int64_t blocks = ceil_div(N, kRegRowsPerBlock);
    int best = 1;
    for (int s = 1; s <= 16; ++s) {
      if (n_stages % s != 0) continue;
      best = s;
      if (blocks * s >= 2LL * num_sms) break;
    }
    return best;
  }
  const int64_t tiles = ceil_div(N, kTileRows);
  // A split over blocks costs a second launch (the epilogue) and a round trip
  // through ws; splitting K over the warps of a block is free. Split over
  // blocks only when even 8 K-warps per tile would leave SMs idle.
  const int64_t want = 2LL * num_sms;
  if (tiles * kMaxBlockWarps >= want) return 1;
  int best = 1;
  for (int s = 2; s <= 16; ++s) {
    if (n_stages % s != 0 || n_stages / s < kMaxBlockWarps) continue;
    best = s;
    if (tiles * kMaxBlockWarps * s >= want) break;
  }
  return best;
}

cudaError_t gemm_fp8_stream(const StreamGemmArgs& a, cudaStream_t st) {
  return gemm_fp8_stream_tuned(a, StreamTuning{}, st);
}

cudaError_t gemm_fp8_stream_tuned(const StreamGemmArgs& a, const StreamTuning& tu, cudaStream_t st) {
  if (a.N <= 0 || a.groups <= 0) return cudaSuccess;
  if (!a.group_offsets && a.M <= 0) return cudaSuccess;
  if (a.Xf) {
    if (a.K % 4 != 0) return cudaErrorInvalidValue;
    f32act_gemm_kernel<<<dim3(ceil_div(a.N, kWarps), a.groups), kWarps * 32, 0, st>>>(a);
    return cudaGetLastError();
  }
  if (a.K <= 0 || a.ksplit < 1 || a.K % (a.ksplit * kKStep) != 0) return cudaErrorInvalidValue;
  if (a.ksplit > 1 && (a.group_offsets || !a.ws)) return cudaErrorInvalidValue;
  if (a.groups > 65535 || a.max_active_groups < 0 || a.typical_rows_per_group < 0 ||
      a.prefetch_group < -1 || a.prefetch_group >= a.groups)
    return cudaErrorInvalidValue;
  if (tu.tile_rows != 0 && (tu.legacy || !a.group_offsets ||
                            (tu.tile_rows != 8 && tu.tile_rows != 16 && tu.tile_rows != 32)))
    return cudaErrorInvalidValue;
  const int bound = a.max_rows_per_group > 0 ? a.max_rows_per_group : a.M;
  cudaError_t e;
  const int tr = a.group_offsets && !tu.legacy ? group_tile_rows(a, tu) : 0;
  if (tr > 0) {
    // Grouped: row tiles of 8, 16 or 32 rows through the pipelined kernel,
    // whatever the group sizes (a group taller than a tile streams its
    // weights once per tile).
    return tr == 8 ? launch_pipelined_mode<1>(a, tu, kTiled, st)
                   : tr == 16 ? launch_pipelined_mode<2>(a, tu, kTiled, st)
                              : launch_pipelined_mode<4>(a, tu, kTiled, st);  // no ksplit with groups
  }
  const int mode = (a.pdl && !a.group_offsets) ? kPdl : kPlain;
  if (bound <= 8) {
    e = launch_pipelined_mode<1>(a, tu, mode, st);
  } else if (bound <= 16) {
    e = launch_pipelined_mode<2>(a, tu, mode, st);
  } else if (bound <= 32) {
    e = launch_pipelined_mode<4>(a, tu, mode, st);
  } else {
    const StreamTuning dflt;
    if (tu.k_warps != dflt.k_warps || tu.row_tiles != dflt.row_tiles || tu.stages != dflt.stages ||
        tu.l2_prefetch != dflt.l2_prefetch || tu.stage_k != dflt.stage_k ||
        tu.pdl_prefetch != dflt.pdl_prefetch)
      return cudaErrorInvalidValue;  // the register-pipelined kernel has no launch options
    // 64 token rows per pass: the token copies would crowd the weights out of
    // a shared-memory pipeline, so the register-pipelined kernel (tokens
    // through L1, shared by the block's 8 warps) streams the weights. Plain
    // launch (no PDL) in every case.
    dim3 grid(ceil_div(a.N, kRegRowsPerBlock), a.ksplit, group_slots(a));
    reg_stream_gemm_kernel<8><<<grid, kMaxBlockWarps * 32, 0, st>>>(a, a.K / a.ksplit);
    e = cudaGetLastError();
  }
  if (e != cudaSuccess || a.ksplit == 1) return e;
  return gemm_fp8_epilogue(a.ws, a.ksplit, a.M, a.N, a.x_scale, a.w_scale, a.bias, a.Y, a.ldy, st);
}

cudaError_t gemm_fp8_epilogue(const float* ws, int ksplit, int M, int N, const float* x_scale,
                              const float* w_scale, const float* bias, float* Y, int64_t ldy,
                              cudaStream_t st) {
  if (M <= 0 || N <= 0) return cudaSuccess;
  const int64_t total = (int64_t)M * N;
  const int blocks = (int)std::min<int64_t>((total + 255) / 256, 4096);
  epilogue_kernel<<<blocks, 256, 0, st>>>(ws, ksplit, M, N, x_scale, w_scale, bias, Y, ldy);
  return cudaGetLastError();
}

// ------------------------------------------------------------- cuBLAS(Lt)

namespace {
std::string lt_err(const char* what, cublasStatus_t s) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s: %s (%d)", what, cublasGetStatusString(s), (int)s);
  return buf;
}
}  // namespace

#define LT_CHECK(call)                                  \
  do {                                                  \
    cublasStatus_t s_ = (call);                         \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                  \
      err = lt_err(#call, s_);                          \
      goto done;                                        \
    }                                                   \
  } while (0)

struct LtAlgoCache {
  std::map<std::tuple<int, int, int, int>, cublasLtMatmulAlgo_t> algos;
};

LtAlgoCache* lt_algo_cache_create() { return new LtAlgoCache(); }
void lt_algo_cache_destroy(LtAlgoCache* c) { delete c; }

namespace {
std::tuple<int, int, int, int> lt_key(const LtShape& s) {
  return {s.M, s.N, s.K, (s.scaled ? 1 : 0) | (s.bias ? 2 : 0) | (s.accumulate ? 4 : 0)};
}

// One cuBLASLt FP8 call of shape s. Column-major view: D^T[N, M] = W[N, K] (as
// op(A) = A^T with A stored K x N) * X^T[K, M] (B stored K x M); FP8 needs
// "TN". Scaled: cuBLASLt's m is N (weight rows: the A scale vector, w_scale)
// and its n is M (tokens: the B scale vector, x_scale); the bias runs along m.
// pick -1: the algorithm lt.algos keeps for s, else the heuristic's first;
// pick >= 0: the heuristic's candidate pick. run false: only *count (the
// heuristic's candidates, up to kLtMaxCandidates). *used: the algorithm run.
// A scaled shape this cuBLASLt cannot do sets *unsupported and returns "".
std::string lt_call(const LtGemm& lt, const LtShape& s, int pick, bool run, const uint8_t* W,
                    const uint8_t* X, float* Y, const float* x_scale, const float* w_scale,
                    const float* bias, cudaStream_t st, bool* unsupported, int* count,
                    cublasLtMatmulAlgo_t* used) {
  *unsupported = false;
  if (count) *count = 0;
  std::string err;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  cublasLtMatmulHeuristicResult_t heur[kLtMaxCandidates] = {};
  const cublasLtMatmulAlgo_t* algo = nullptr;
  int found = 0;
  const float alpha = 1.0f, beta = s.scaled && s.accumulate ? 1.0f : 0.0f;
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  const int32_t vec = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
  const bool with_bias = s.scaled && s.bias;
  const cublasLtEpilogue_t epi = with_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  const cudaDataType_t bias_type = CUDA_R_32F;
  size_t wsb = lt.workspace_bytes;
  const int want = pick >= 0 || !run ? kLtMaxCandidates : 1;
  cublasStatus_t st_s;
  LT_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  if (s.scaled) {
    // An older cuBLASLt refuses the attribute itself: that is "unsupported" too.
    st_s = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &vec, sizeof vec);
    if (st_s == CUBLAS_STATUS_SUCCESS)
      st_s = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &vec, sizeof vec);
    if (st_s != CUBLAS_STATUS_SUCCESS) {
      *unsupported = true;
      goto done;
    }
    LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scale, sizeof w_scale));
    LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_scale, sizeof x_scale));
    LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    if (with_bias) {
      LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
      LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                              sizeof bias_type));
    }
  }
  LT_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, s.K, s.N, s.K));
  LT_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, s.K, s.M, s.K));
  LT_CHECK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, s.N, s.M, s.N));
  if (pick < 0 && run && lt.algos) {
    auto it = lt.algos->algos.find(lt_key(s));
    if (it != lt.algos->algos.end()) algo = &it->second;
  }
  if (!algo) {
    LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &wsb, sizeof wsb));
    st_s = cublasLtMatmulAlgoGetHeuristic(lt.handle, op, la, lb, lc, lc, pref, want, heur, &found);
    if (s.scaled && (st_s != CUBLAS_STATUS_SUCCESS || found == 0)) {
      *unsupported = true;
      goto done;
    }
    if (st_s != CUBLAS_STATUS_SUCCESS) {
      err = lt_err("cublasLtMatmulAlgoGetHeuristic", st_s);
      goto done;
    }
    if (count) *count = found;
    if (!run) goto done;
    if (found == 0 || pick >= found) {
      char buf[160];
      snprintf(buf, sizeof buf, "cublasLtMatmulAlgoGetHeuristic: no FP8 algorithm %d for M=%d N=%d K=%d",
               pick < 0 ? 0 : pick, s.M, s.N, s.K);
      err = buf;
      goto done;
    }
    algo = &heur[pick < 0 ? 0 : pick].algo;
  }
  if (used) *used = *algo;
  // (With accumulate, C is Y itself: D = scaled product + Y, in place.)
  st_s = cublasLtMatmul(lt.handle, op, &alpha, W, la, X, lb, &beta, Y, lc, Y, lc, algo, lt.workspace,
                        lt.workspace_bytes, st);
  if (st_s == CUBLAS_STATUS_NOT_SUPPORTED && s.scaled && s.accumulate) {
    *unsupported = true;  // no such algorithm with a C operand: the caller writes apart
    goto done;
  }
  if (st_s != CUBLAS_STATUS_SUCCESS) {
    err = lt_err(s.scaled ? "cublasLtMatmul (outer-vector scales)" : "cublasLtMatmul", st_s);
    goto done;
  }
done:
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  if (lc) cublasLtMatrixLayoutDestroy(lc);
  if (lb) cublasLtMatrixLayoutDestroy(lb);
  if (la) cublasLtMatrixLayoutDestroy(la);
  if (op) cublasLtMatmulDescDestroy(op);
  return err;
}
}  // namespace

std::string lt_gemm_fp8(const LtGemm& lt, const uint8_t* W, const uint8_t* X, float* D, int M,
                        int N, int K, cudaStream_t st) {
  LtShape s;
  s.M = M, s.N = N, s.K = K;
  bool unsupported = false;
  return lt_call(lt, s, -1, true, W, X, D, nullptr, nullptr, nullptr, st, &unsupported, nullptr, nullptr);
}

std::string lt_gemm_fp8_scaled(const LtGemm& lt, const uint8_t* W, const uint8_t* X, float* Y,
                               int M, int N, int K, const float* x_scale, const float* w_scale,
                               const float* bias, bool* unsupported, cudaStream_t st, bool accumulate) {
  LtShape s;
  s.M = M, s.N = N, s.K = K, s.scaled = true, s.bias = bias != nullptr, s.accumulate = accumulate;
  return lt_call(lt, s, -1, true, W, X, Y, x_scale, w_scale, bias, st, unsupported, nullptr, nullptr);
}

std::string lt_tune_fp8(const LtGemm& lt, const LtShape& s, const uint8_t* const* Ws, int nW,
                        const uint8_t* X, float* Y, const float* x_scale, const float* w_scale,
                        const float* bias, cudaStream_t st, int reps, LtTuneReport* rep) {
  LtTuneReport dummy;
  if (!rep) rep = &dummy;
  *rep = LtTuneReport{};
  if (!lt.algos) return "lt_tune_fp8: no algorithm cache";
  if (!Ws || nW < 1) return "lt_tune_fp8: no weights";
  if (reps < 1) reps = 1;
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(st, &cap) != cudaSuccess || cap != cudaStreamCaptureStatusNone)
    return "lt_tune_fp8: the stream is capturing (tuning times calls and synchronizes)";
  int n = 0;
  bool none = false;
  std::string err = lt_call(lt, s, -1, false, Ws[0], X, Y, x_scale, w_scale, bias, st, &none, &n, nullptr);
  rep->candidates = n;
  if (!err.empty() || n == 0) return err;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  cudaError_t ce = cudaEventCreate(&e0);
  if (ce == cudaSuccess) ce = cudaEventCreate(&e1);
  float best_t = INFINITY;
  cublasLtMatmulAlgo_t best_algo{};
  int best_i = -1;
  for (int i = 0; i < n && ce == cudaSuccess && err.empty(); ++i) {
    bool unsupported = false;
    cublasLtMatmulAlgo_t algo{};
    // A candidate that fails to run (e.g. no C operand with accumulate) is skipped.
    std::string e1s = lt_call(lt, s, i, true, Ws[0], X, Y, x_scale, w_scale, bias, st, &unsupported, nullptr, &algo);
    if (!e1s.empty() || unsupported) {
      (void)cudaGetLastError();
      continue;
    }
    // Timed as a CUDA graph of reps calls, the weights rotated over Ws (as the
    // decode step runs them: from a graph, weights not in L2), so that
    // cuBLASLt's host work per call is not what is measured.
    cudaGraph_t g = nullptr;
    cudaGraphExec_t gx = nullptr;
    ce = cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal);
    for (int r = 0; r < reps && ce == cudaSuccess && err.empty(); ++r)
      err = lt_call(lt, s, i, true, Ws[r % nW], X, Y, x_scale, w_scale, bias, st, &unsupported, nullptr, nullptr);
    const cudaError_t ec = cudaStreamEndCapture(st, &g);
    if (ce == cudaSuccess) ce = ec;
    if (ce == cudaSuccess && err.empty()) ce = cudaGraphInstantiate(&gx, g, 0);
    float ms = 0;
    if (ce == cudaSuccess && err.empty()) {
      ce = cudaGraphLaunch(gx, st);  // warm-up
      if (ce == cudaSuccess) ce = cudaEventRecord(e0, st);
      if (ce == cudaSuccess) ce = cudaGraphLaunch(gx, st);
      if (ce == cudaSuccess) ce = cudaEventRecord(e1, st);
      if (ce == cudaSuccess) ce = cudaEventSynchronize(e1);
      if (ce == cudaSuccess) ce = cudaEventElapsedTime(&ms, e0, e1);
    }
    if (gx) cudaGraphExecDestroy(gx);
    if (g) cudaGraphDestroy(g);
    if (ce != cudaSuccess || !err.empty()) break;
    const float us = 1e3f * ms / reps;
    if (i == 0) rep->first_us = us;
    // Another algorithm replaces the heuristic's first only when clearly faster
    // (3%), so that timing noise does not change the algorithm run to run.
    if (best_i < 0 || us < best_t * (best_i == 0 ? 0.97f : 1.0f)) {
      best_t = us;
      best_algo = algo;
      best_i = i;
    }
  }
  if (e0) cudaEventDestroy(e0);
  if (e1) cudaEventDestroy(e1);
  if (err.empty() && ce != cudaSuccess) err = std::string("lt_tune_fp8: ") + cudaGetErrorString(ce);
  if (!err.empty()) return err;
  if (best_i < 0) return "";  // nothing ran: calls keep the heuristic's first
  lt.algos->algos[lt_key(s)] = best_algo;
  rep->best_us = best_t;
  rep->best = best_i;
  return "";
}

namespace {
// cublasSetStream also resets the handle's workspace to cuBLAS's own pool, so
// it is called only when the stream changes: a workspace set with
// cublasSetWorkspace (the runtime's, so that nothing is allocated while a step
// is captured into a CUDA graph) then stays.
cublasStatus_t use_stream(cublasHandle_t h, cudaStream_t st) {
  cudaStream_t cur = nullptr;
  cublasStatus_t s = cublasGetStream(h, &cur);
  if (s != CUBLAS_STATUS_SUCCESS || cur == st) return s;
  return cublasSetStream(h, st);
}
}  // namespace

std::string gemm_bf16_nt(cublasHandle_t h, const __nv_bfloat16* A, const __nv_bfloat16* B,
                         float* C, int M, int N, int K, cudaStream_t st) {
  // Column-major: C^T[N, M] = B[N,K] (stored K x N, op T) * A^T (stored K x M, op N).
  const float alpha = 1.0f, beta = 0.0f;
  cublasStatus_t s = use_stream(h, st);
  if (s != CUBLAS_STATUS_SUCCESS) return lt_err("cublasSetStream", s);
  s = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &alpha, B, CUDA_R_16BF, K, A,
                   CUDA_R_16BF, K, &beta, C, CUDA_R_32F, N, CUBLAS_COMPUTE_32F,
                   CUBLAS_GEMM_DEFAULT);
  if (s != CUBLAS_STATUS_SUCCESS) return lt_err("cublasGemmEx(bf16 lm_head)", s);
  return "";
}

std::string gemm_f32_nt(cublasHandle_t h, const float* A, const float* B, float* C, int M, int N,
                        int K, cudaStream_t st) {
  const float alpha = 1.0f, beta = 0.0f;
  cublasStatus_t s = use_stream(h, st);
  if (s != CUBLAS_STATUS_SUCCESS) return lt_err("cublasSetStream", s);
  s = cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &alpha, B, K, A, K, &beta, C, N);
  if (s != CUBLAS_STATUS_SUCCESS) return lt_err("cublasSgemm(FP32 NT)", s);
  return "";
}

}  // namespace glmk
