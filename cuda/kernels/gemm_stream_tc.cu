// gemm_stream_tc.cu — FP8 linears of decode-sized batches on the sm_90 tensor
// cores, weights streamed by TMA: "swap A/B" as in gemm.cu (the weights are the
// 64-row A operand of wgmma m64nNk32 e4m3, the few token rows its N-column B
// operand), but fed by a warp-specialized TMA pipeline instead of per-warp
// cp.async and mma.sync. The runtime uses it for the routed experts' gate|up
// past 8 rows a step (H200, 20 rank experts at top-1: 80-84% of HBM from 16
// to 128 tokens where gemm_fp8_stream reaches 69-77%) and for their down
// projection where the shared expert is a group and from 192 rows (65-72%,
// in narrower token tiles than gate|up's: step.cu down_token_tile), and for
// q|k|v and o_proj at 9-64 rows in K splits stored apart (below). The dense
// decode linears' 14-40 weight blocks leave most SMs idle without a K split,
// and K splits summed here (the workspace below) cost more than they share
// out; stored apart, the next kernel sums them (step.cu split_out_plan).
//
// A CTA is one producer warpgroup and two consumer warpgroups. The CTAs are
// persistent (at most one per SM) and stride over work units: a unit is one
// (token tile of NT rows, block of 128 weight rows, K split). For each 128-byte
// K stage of a unit, one producer thread issues the 128 x 128-byte weight box
// as one TMA (128-byte swizzle, tensor map over W as [groups * N][K]) and the
// producer threads copy the unit's token rows (gathered through x_rows) with
// cp.async; both arrive on the stage's full barrier. Each consumer warpgroup
// runs one chain of four m64nNTk32 from zero per stage on its 64 weight rows
// and adds it to FP32 registers (cuBLASLt's and gemm_grouped.cu's F/W tiles'
// precision: every 128-K chain is promoted to FP32), then frees the slot. A
// tile of rows past a group's end or past M reads no tokens; its columns are
// never stored.
//
// Split K: with S > 1 splits per (token tile, weight block), each split writes
// its FP32 partial [NT][128] to the workspace and counts itself in the tile's
// counter; the CTA that arrives last sums the S partials in split order (so
// the result does not depend on which CTA came last), scales, adds the bias,
// writes Y and resets the counter to zero (the next launch, or a CUDA graph
// replay, finds it zero). The split boundaries depend only on K and S, so a
// launch reproduces itself bit for bit.
//
// Split K stored apart (StreamTcTuning::split_stride): split s writes its
// scaled product (split 0 adds the bias) to its own slice of Y, with the
// unsplit epilogue; the kernel that reads Y sums the S slices in order. No
// workspace, counter or fence: each CTA's epilogue is its stores.
//
// With StreamGemmArgs::pdl the kernel is launched with programmatic dependent
// launch. Dense: each CTA issues its first unit's weight TMAs (up to the
// ring's stages) before waiting for the kernel before, whose output (X) it
// reads only after; the runtime does this for the stored-apart splits of
// q|k|v and o_proj. Grouped (the units follow the router's offsets): it
// prefetches prefetch_group's weights into L2 before waiting (tested in
// stream_tc_check; the runtime does not use it: with the shared expert's
// weights prefetched under the router, decode steps of 16-64 rows were no
// faster on an H100, batch 64 1.9% slower).
#include <algorithm>
#include <atomic>

#include "hopper.cuh"

namespace glmk {
namespace {

constexpr int kSwBK = 128;     // K bytes per stage
constexpr int kSwWRows = 128;  // weight rows per unit (two consumer warpgroups of 64)
// Ring bytes: 12 stages for the 16-row tile (the experts' down projection), 9
// for the 64-row one. H200 with the 128-byte L2 promotion (2026-11-28, A/B,
// three alternations, ms; 200 KB -> 216 KB): batch 64 17.67 -> 17.47, 256
// 26.07 -> 25.9, 16-128 unchanged within 0.1 (224 KB: 32 and 128 slower).
// (With 256-byte promotion one more stage had not paid: 2026-11-28 fifth session.)
constexpr int kSwSmemBudget = 216 * 1024;
constexpr int kSwMaxOffsets = 257;  // group offsets kept in shared memory (groups <= 256)

template <int NT_>
struct SwapConfig {
  static constexpr int NT = NT_;
  static constexpr int W_BYTES = kSwWRows * kSwBK, X_BYTES = NT * kSwBK;
  static constexpr int STAGE_BYTES = W_BYTES + X_BYTES;
  static constexpr int STAGES = kSwSmemBudget / STAGE_BYTES;
  static constexpr int THREADS = 384;
  static constexpr int X_PER = NT * (kSwBK / 16) / 128;  // token pieces per producer thread and stage
  static constexpr int SMEM = 1024 + STAGES * STAGE_BYTES + 16 * STAGES + 16;
  static_assert(NT == 16 || NT == 32 || NT == 64 || NT == 128, "token tile");
  static_assert(STAGE_BYTES % 1024 == 0, "stages at 1024-byte boundaries (the swizzle)");
  static_assert(X_PER >= 1, "every producer thread copies token pieces");
  static_assert(SMEM <= 227 * 1024, "shared memory");
};

#if defined(GLMK_HAS_WGMMA)
// D[64 x 16] (+)= A[64 x 32] * B[16 x 32]^T, e4m3.
__device__ __forceinline__ void wgmma_m64n16k32_e4m3(float (&d)[8], uint64_t desc_a, uint64_t desc_b,
                                                    int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 {"
      "%0,%1,%2,%3,%4,%5,%6,%7"
      "}, %8, %9, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// D[64 x 32] (+)= A[64 x 32] * B[32 x 32]^T, e4m3.
__device__ __forceinline__ void wgmma_m64n32k32_e4m3(float (&d)[16], uint64_t desc_a, uint64_t desc_b,
                                                    int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15"
      "}, %16, %17, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// D[64 x 64] (+)= A[64 x 32] * B[64 x 32]^T, e4m3.
__device__ __forceinline__ void wgmma_m64n64k32_e4m3(float (&d)[32], uint64_t desc_a, uint64_t desc_b,
                                                    int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
      "}, %32, %33, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

template <int NT>
__device__ __forceinline__ void wgmma_e4m3(float (&d)[NT / 2], uint64_t da, uint64_t db, int scale_d) {
  if constexpr (NT == 16) wgmma_m64n16k32_e4m3(d, da, db, scale_d);
  else if constexpr (NT == 32) wgmma_m64n32k32_e4m3(d, da, db, scale_d);
  else if constexpr (NT == 64) wgmma_m64n64k32_e4m3(d, da, db, scale_d);
  else wgmma_m64n128k32_e4m3(d, da, db, scale_d);
}
#endif

// Per-launch constants chosen on the host.
struct SwapLaunch {
  int n_wb;     // weight blocks of 128 rows: ceil(N / 128)
  int splits;   // K splits per (token tile, weight block)
  int m_bound;  // bound on the token tiles (the workspace's tile slots)
  float* partials;  // [m_bound * n_wb][splits][NT][128] when splits > 1
  int* counters;    // [m_bound * n_wb], zero between launches, when splits > 1
  // > 0: split s writes its scaled product to Y + s * split_stride (split 0
  // adds the bias) and the kernel after sums the slices (StreamTcTuning).
  int64_t split_stride;
};

template <class C>
__global__ void __launch_bounds__(C::THREADS, 1)
    stream_tc_kernel(const __grid_constant__ CUtensorMap wmap, StreamGemmArgs a, SwapLaunch L) {
#if defined(GLMK_HAS_WGMMA)
  constexpr int NT = C::NT;
  extern __shared__ uint8_t smem_raw[];
  __shared__ int s_offs[kSwMaxOffsets];
  pdl_launch_dependents();
  const uint32_t sbase = (smem_u32(smem_raw) + 1023u) & ~1023u;
  uint8_t* const sgen = smem_raw + (sbase - smem_u32(smem_raw));
  const uint32_t bar_full = sbase + C::STAGES * C::STAGE_BYTES, bar_empty = bar_full + 8 * C::STAGES;
  int* const s_last = reinterpret_cast<int*>(sgen + C::STAGES * C::STAGE_BYTES + 16 * C::STAGES);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wg = warp >> 2;
  if (tid == 0) {
    for (int s = 0; s < C::STAGES; ++s) {
      mbar_init(bar_full + 8 * s, 128 + 1);  // the producers' cp.async arrivals + the TMA's
      mbar_init(bar_empty + 8 * s, 8);       // one per consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  const int S = L.splits;
  const int KT = a.K / kSwBK;
  // Unit u: split fastest, then the weight block, then the token tile (CTAs
  // running together share the tile's token rows in L2).
  auto unit_of = [&](int u, int& item, int& wb, int& s) {
    s = u % S;
    const int r = u / S;
    wb = r % L.n_wb;
    item = r / L.n_wb;
  };
  // Split s's K stages [kb, ke): they depend only on KT and S, so a launch
  // reproduces itself bit for bit.
  auto k_range = [&](int s, int& kb, int& ke) {
    kb = (int)((int64_t)s * KT / S);
    ke = (int)((int64_t)(s + 1) * KT / S);
  };
  // Weight stages whose TMA thread 0 issued before griddepcontrol.wait (its
  // producer loop then skips them).
  int early = 0;
  if (a.pdl) {
    // Launched early (programmatic dependent launch): until the wait only
    // weights, which no kernel writes. Dense: this CTA's first unit depends
    // on nothing else, so its first stages' weight TMAs go out now, straight
    // into the ring (a dense decode linear's unit is a few stages: with the K
    // splits stored apart most of a CTA's weights are in flight before the
    // kernel before has finished). Grouped: the units follow the router's
    // offsets; this CTA's share of the group sure to have rows (the shared
    // expert) into L2.
    if (!a.group_offsets) {
      if (tid == 0 && blockIdx.x < min(L.m_bound, count_m_tiles<NT>(nullptr, 0, a.M)) * L.n_wb * S) {
        int item, wb, s, kb, ke;
        unit_of(blockIdx.x, item, wb, s);
        k_range(s, kb, ke);
        early = min(ke - kb, C::STAGES);
        const uint64_t wpol = l2_policy_stream();
        for (int i = 0; i < early; ++i) {
          const uint32_t full = bar_full + 8 * i;
          mbar_arrive_expect_tx(full, C::W_BYTES);
          tma_load_2d_hint(sbase + i * C::STAGE_BYTES, &wmap, (kb + i) * kSwBK, wb * kSwWRows, full, wpol);
        }
      }
    } else if (a.prefetch_group >= 0 && a.prefetch_group < a.groups) {
      prefetch_l2_block_share(a.W + (int64_t)a.prefetch_group * a.N * a.K, (int64_t)a.N * a.K);
    }
    pdl_wait();
  }
  // The group offsets, read at every unit by both warpgroups, from shared
  // memory: a unit's first weight stage then waits for no L2 round trip.
  const bool offs_shared = a.group_offsets && a.groups < kSwMaxOffsets;
  if (offs_shared)
    for (int g = tid; g <= a.groups; g += C::THREADS) s_offs[g] = a.group_offsets[g];
  const int* const offs = offs_shared ? s_offs : a.group_offsets;
  __syncthreads();

  const int items = min(L.m_bound, count_m_tiles<NT>(offs, a.groups, a.M));
  const int total = items * L.n_wb * S;
  const int64_t K = a.K;

  if (wg == 0) {
    // Producer warpgroup: thread tid copies piece (tid & 7) of token rows
    // (tid >> 3) + 16 i.
    const int piece = tid & 7, prow = tid >> 3;
    const uint64_t wpol = l2_policy_stream();  // weights: read once per step
    int stage = 0, issued = 0;
    uint32_t phase = 0;
    for (int u = blockIdx.x; u < total; u += gridDim.x) {
      int item, wb, s, grp = 0, row0 = 0, rows = 0;
      unit_of(u, item, wb, s);
      find_m_tile<NT>(offs, a.groups, a.M, item, grp, row0, rows);
      int xr[C::X_PER];
#pragma unroll
      for (int i = 0; i < C::X_PER; ++i) {
        const int r = prow + 16 * i;
        xr[i] = r < rows ? (a.x_rows ? a.x_rows[row0 + r] : row0 + r) : -1;
      }
      const int wrow = grp * a.N + wb * kSwWRows;
      int kb, ke;
      k_range(s, kb, ke);
      for (int kt = kb; kt < ke; ++kt) {
        mbar_wait(bar_empty + 8 * stage, phase ^ 1);
        const uint32_t sw = sbase + stage * C::STAGE_BYTES, full = bar_full + 8 * stage;
        if (tid == 0 && issued++ >= early) {
          mbar_arrive_expect_tx(full, C::W_BYTES);
          tma_load_2d_hint(sw, &wmap, kt * kSwBK, wrow, full, wpol);
        }
#pragma unroll
        for (int i = 0; i < C::X_PER; ++i) {
          const int r = prow + 16 * i;
          if (xr[i] >= 0)
            cp_async_cg16(sw + C::W_BYTES + r * kSwBK + ((piece ^ (r & 7)) << 4),
                          a.X + xr[i] * K + piece * 16 + kt * kSwBK, 0);
        }
        cp_async_mbar_arrive(full);
        if (++stage == C::STAGES) stage = 0, phase ^= 1;
      }
    }
    cp_async_wait<0>();
  } else {
    // Consumer warpgroup cw: weight rows [64 cw, +64) of the unit's block.
    const int cw = wg - 1, ctid = tid - 128;  // ctid: 0..255 over both consumers
    const int g = lane >> 2, c4 = lane & 3;
    const uint32_t a_off = cw * 64 * kSwBK;
    int stage = 0;
    uint32_t phase = 0;
    for (int u = blockIdx.x; u < total; u += gridDim.x) {
      int item, wb, s, grp = 0, row0 = 0, rows = 0;
      unit_of(u, item, wb, s);
      find_m_tile<NT>(offs, a.groups, a.M, item, grp, row0, rows);
      int kb, ke;
      k_range(s, kb, ke);
      // Accumulator 4j + e: weight row 64 cw + 16 (warp % 4) + g + 8 (e >> 1)
      // of the block, token 8j + 2 c4 + (e & 1) of the tile.
      const int wl0 = 64 * cw + 16 * (warp & 3) + g;
      const int n_base = wb * kSwWRows;
      const float* wsc = a.w_scale + (int64_t)grp * a.N;
      const float* bias = a.bias ? a.bias + (int64_t)grp * a.N : nullptr;
      // The unsplit epilogue's operands are loaded while the unit's K loop
      // runs (their rows here, the scales after its first stage), not after
      // it: a consumer in its epilogue frees no stage, so the producer could
      // issue no weight load for that long (~6 units per CTA for the experts'
      // down projection). Not with 128-token tiles, whose 64 + 64 accumulator
      // registers leave no room for 64 more.
      constexpr bool kPre = NT <= 64;
      // Unsplit, or split with every slice stored apart: the same epilogue.
      const bool direct = S == 1 || L.split_stride > 0;
      int xrow[NT / 4];
      float xsv[NT / 4], wsv[2], bv[2];
      if (kPre && direct) {
#pragma unroll
        for (int j = 0; j < NT / 8; ++j)
#pragma unroll
          for (int b = 0; b < 2; ++b) {
            const int t = 8 * j + 2 * c4 + b;
            xrow[2 * j + b] = t < rows ? (a.x_rows ? a.x_rows[row0 + t] : row0 + t) : -1;
          }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int n = n_base + wl0 + 8 * h;
          wsv[h] = n < a.N ? wsc[n] : 0.f;
          bv[h] = bias && n < a.N ? bias[n] : 0.f;
        }
      }
      float acc[NT / 2], part[NT / 2];
#pragma unroll
      for (int i = 0; i < NT / 2; ++i) acc[i] = 0.f;
      for (int kt = kb; kt < ke; ++kt) {
        mbar_wait(bar_full + 8 * stage, phase);
        // The token rows were written by cp.async (generic proxy); the tensor
        // cores read them through the async proxy.
        fence_proxy_async();
        const uint32_t st = sbase + stage * C::STAGE_BYTES;
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < kSwBK / 32; ++k)
          wgmma_e4m3<NT>(part, wgmma_desc(st + a_off + 32 * k), wgmma_desc(st + C::W_BYTES + 32 * k), k);
        wgmma_commit();
        if (kPre && direct && kt == kb) {
#pragma unroll
          for (int i = 0; i < NT / 4; ++i) xsv[i] = xrow[i] >= 0 ? a.x_scale[xrow[i]] : 0.f;
        }
        wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < NT / 2; ++i) acc[i] += part[i];
        __syncwarp();
        if (lane == 0) mbar_arrive(bar_empty + 8 * stage);
        if (++stage == C::STAGES) stage = 0, phase ^= 1;
      }
      auto xscale = [&](int t) { return a.x_scale[a.x_rows ? a.x_rows[row0 + t] : row0 + t]; };
      if (direct) {
        float* const Ys = a.Y + (int64_t)s * L.split_stride;
        const bool add_bias = bias && s == 0;
#pragma unroll
        for (int j = 0; j < NT / 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int t = 8 * j + 2 * c4 + (e & 1), n = n_base + wl0 + 8 * (e >> 1);
            if (t < rows && n < a.N) {
              float y;
              if constexpr (kPre) {
                y = acc[4 * j + e] * xsv[2 * j + (e & 1)] * wsv[e >> 1];
                if (add_bias) y += bv[e >> 1];
              } else {
                y = acc[4 * j + e] * xscale(t) * wsc[n];
                if (add_bias) y += bias[n];
              }
              Ys[(int64_t)(row0 + t) * a.ldy + n] = y;
            }
          }
        continue;
      }
      const int tile = item * L.n_wb + wb;
      float* const part_base = L.partials + (int64_t)tile * S * NT * kSwWRows;
      float* const mine = part_base + (int64_t)s * NT * kSwWRows;
#pragma unroll
      for (int j = 0; j < NT / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int t = 8 * j + 2 * c4 + (e & 1);
          if (t < rows) mine[t * kSwWRows + wl0 + 8 * (e >> 1)] = acc[4 * j + e];
        }
      __threadfence();  // this thread's partials are visible before the count below
      named_bar_sync(1, 256);
      if (ctid == 0) *s_last = atomicAdd(&L.counters[tile], 1) == S - 1;
      named_bar_sync(1, 256);
      if (*s_last) {
        __threadfence();  // the other splits' partials (they counted after writing)
        // Four channels per thread and step, every split's load issued before
        // the sums (one L2 round trip per step, not one per split).
        for (int i4 = ctid; i4 < rows * (kSwWRows / 4); i4 += 256) {
          const int t = i4 / (kSwWRows / 4), wl = 4 * (i4 % (kSwWRows / 4)), n = n_base + wl;
          const float4* src = reinterpret_cast<const float4*>(part_base) + i4;
          float4 sum = __ldcg(src);
          int q = 1;
          for (; q + 4 <= S; q += 4) {
            float4 v[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) v[j] = __ldcg(src + (int64_t)(q + j) * NT * (kSwWRows / 4));
#pragma unroll
            for (int j = 0; j < 4; ++j) sum.x += v[j].x, sum.y += v[j].y, sum.z += v[j].z, sum.w += v[j].w;
          }
          for (; q < S; ++q) {
            const float4 v = __ldcg(src + (int64_t)q * NT * (kSwWRows / 4));
            sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
          }
          const float xs = xscale(t);
          const float sv[4] = {sum.x, sum.y, sum.z, sum.w};
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            if (n + j >= a.N) break;
            float y = sv[j] * xs * wsc[n + j];
            if (bias) y += bias[n + j];
            a.Y[(int64_t)(row0 + t) * a.ldy + n + j] = y;
          }
        }
        if (ctid == 0) L.counters[tile] = 0;
      }
      named_bar_sync(1, 256);  // s_last is read by every consumer before the next unit rewrites it
    }
  }
#endif
}

constexpr int kMaxDevices = 64;

template <class C>
cudaError_t launch_stream_tc(const StreamGemmArgs& a, const StreamTcWorkspace& ws, int splits_req,
                             int64_t split_stride, int sms, cudaStream_t st) {
  static std::atomic<bool> ready[kMaxDevices];
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  if (dev < 0 || dev >= kMaxDevices) return cudaErrorInvalidDevice;
  if (!ready[dev].load(std::memory_order_acquire)) {
    e = cudaFuncSetAttribute(stream_tc_kernel<C>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM);
    if (e != cudaSuccess) return e;
    ready[dev].store(true, std::memory_order_release);
  }
  CUtensorMap map;
  e = encode_weight_map(&map, a.W, a.K, (int64_t)a.groups * a.N, kSwWRows);
  if (e != cudaSuccess) return e;
  // Token tiles: a bound for the workspace and the grid (ceil(M / NT) plus one
  // partial tile per non-empty group), and the count a typical launch has.
  int active = a.group_offsets ? std::min(a.groups, a.M) : 1;
  if (a.group_offsets && a.max_active_groups > 0) active = std::min(active, a.max_active_groups);
  const int64_t m_bound = (int64_t)ceil_div(a.M, C::NT) + (a.group_offsets ? active : 0);
  int64_t m_typ = m_bound;
  if (a.group_offsets) {
    const int u = a.typical_rows_per_group > 0 ? a.typical_rows_per_group : ceil_div(a.M, active);
    m_typ = std::min<int64_t>(m_bound, (int64_t)active * ceil_div(u, C::NT));
  }
  const int n_wb = ceil_div(a.N, kSwWRows);
  const int KT = a.K / kSwBK;
  int S = splits_req;
  // Automatic: no split. On an H200 (stream_tc_check --sweep, rank shapes) every
  // split made the launch slower, also where it was the only way to give every
  // SM work (o_proj 5120 x 1536 at 16 rows: 7.4 us with 40 CTAs, 8.6 with 80):
  // the partials' write, the fence and the counter's round trip cost a
  // consumer ~3 us per unit, more than the stream it shares out.
  if (S <= 0) S = 1;
  if (split_stride <= 0) {
    S = std::min(S, KT);
    // Shrink the split until its partials fit the workspace.
    const size_t per_split = (size_t)m_bound * n_wb * C::NT * kSwWRows;
    while (S > 1 && (per_split * S > ws.partial_floats || m_bound * n_wb > ws.n_counters)) --S;
  }  // else exactly the splits asked for (<= KT, checked): the caller sums that many slices
  if (m_bound * n_wb * (int64_t)S > 0x7fffffff) return cudaErrorInvalidValue;
  SwapLaunch L{n_wb, S, (int)m_bound, ws.partials, ws.counters, split_stride};
  const int grid = (int)std::min<int64_t>((int64_t)m_bound * n_wb * S, sms);
  // With a.pdl the CTAs may start while the previous kernel runs (StreamGemmArgs::pdl).
  return launch_kernel(a.pdl != 0, stream_tc_kernel<C>, dim3(grid), dim3(C::THREADS), C::SMEM, st, map, a, L);
}

}  // namespace

bool gemm_fp8_stream_tc_supported(int N, int K) { return N > 0 && K > 0 && K % kSwBK == 0; }

int gemm_fp8_stream_tc_token_tile(const StreamGemmArgs& a) {
  int u = a.max_rows_per_group > 0 ? a.max_rows_per_group : a.M;
  // Grouped: a group's rows scatter around the typical count (multinomial
  // routing); a tile of twice it holds nearly every group in one tile, so
  // the weights stream once (H200, 20 experts: 256 tokens, 13 typical rows,
  // ran gate|up in 91 us with 32-row tiles, 101 with 16-row ones).
  if (a.group_offsets && a.typical_rows_per_group > 0) u = std::min(u, 2 * a.typical_rows_per_group);
  return u <= 16 ? 16 : u <= 32 ? 32 : u <= 64 ? 64 : 128;
}

cudaError_t gemm_fp8_stream_tc(const StreamGemmArgs& a, const StreamTcWorkspace& ws,
                               const StreamTcTuning& tu, cudaStream_t st) {
  if (a.Xf || a.ksplit != 1 || a.K <= 0 || a.K % kSwBK != 0 || a.N < 0 || a.M < 0 || a.groups <= 0 ||
      a.prefetch_group < -1 || a.prefetch_group >= a.groups ||
      (!a.group_offsets && a.groups != 1) || a.max_active_groups < 0 || a.typical_rows_per_group < 0 ||
      tu.splits < 0 || tu.splits > 64 || tu.split_stride < 0 || tu.max_ctas < 0 ||
      (tu.split_stride > 0 && (tu.splits < 1 || tu.splits > a.K / kSwBK || tu.split_stride < (int64_t)a.M * a.ldy)) ||
      (tu.token_tile != 0 && tu.token_tile != 16 && tu.token_tile != 32 && tu.token_tile != 64 &&
       tu.token_tile != 128))
    return cudaErrorInvalidValue;
  if (a.N == 0 || a.M == 0) return cudaSuccess;
  if (!a.W || !a.w_scale || !a.X || !a.x_scale || !a.Y || a.ldy < a.N || !is_aligned(a.W, 16) || !is_aligned(a.X, 16) ||
      (ws.partial_floats > 0 && (!ws.partials || !is_aligned(ws.partials, 16))) || (ws.n_counters > 0 && !ws.counters))
    return cudaErrorInvalidValue;
  int dev = 0;
  DeviceInfo di;
  const cudaError_t e = device_info(dev, di);
  if (e != cudaSuccess) return e;
  if (di.major != 9) return cudaErrorNotSupported;  // wgmma: sm_90 only
  const int sms = tu.max_ctas > 0 ? std::min(tu.max_ctas, di.sms) : di.sms;
  const int nt = tu.token_tile > 0 ? tu.token_tile : gemm_fp8_stream_tc_token_tile(a);
  switch (nt) {
    case 16: return launch_stream_tc<SwapConfig<16>>(a, ws, tu.splits, tu.split_stride, sms, st);
    case 32: return launch_stream_tc<SwapConfig<32>>(a, ws, tu.splits, tu.split_stride, sms, st);
    case 64: return launch_stream_tc<SwapConfig<64>>(a, ws, tu.splits, tu.split_stride, sms, st);
    default: return launch_stream_tc<SwapConfig<128>>(a, ws, tu.splits, tu.split_stride, sms, st);
  }
}

}  // namespace glmk
