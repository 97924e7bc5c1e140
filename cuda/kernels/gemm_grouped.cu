// gemm_grouped.cu — the grouped (MoE) FP8 GEMM for many rows per group
// (prefill): every non-empty group is cut into m-tiles of BM sorted rows, and
// one CTA computes one (m-tile, n-tile) of BM rows x BN output channels on the
// tensor cores, the activations being the A operand (rows gathered through
// x_rows) and the group's weights the B operand. gemm_fp8_stream (gemm.cu)
// streams weights past few token rows; here each weight byte loaded into
// shared memory feeds up to BM rows, so the work is bounded by the tensor
// cores (or, for small groups, by the one pass over the weights), not by
// per-row weight traffic.
//
// Operand tiles arrive as FP8 [rows][128 bytes] per 128-byte K stage through a
// multi-stage cp.async pipeline, the 16-byte piece q of row r stored at piece
// q ^ (r & 7) (the 128-byte swizzle wgmma's descriptors describe; it also
// makes ldmatrix conflict-free). Three compute cores share the tile
// scheduler, the loads and the epilogue:
//   F16 (exact, sm_90a; the default): E4M3 is a subset of FP16, so the warps
//     convert the weights of each FP8 stage, 64 K at a time, into a ring of
//     swizzled FP16 buffers in shared memory and their own activation rows
//     into FP16 registers (ldmatrix from the FP8 stage), and two warpgroups
//     run wgmma m64nNk16 f16 (A from registers, B from shared memory) with
//     FP32 accumulation: exact products, FP32 sums (measured 6e-6 relative to
//     a float64 reference at K = 5120, 2e-6 at K = 1536, random codes).
//   FP8 (sm_90a): wgmma m64nNk32 e4m3 straight from the FP8 stages, twice the
//     tensor rate. Hopper's FP8 tensor cores align each k32 step's 32 products
//     and the incoming accumulator to their largest exponent with only ~13
//     fraction bits (DeepSeek-V3 §3.3.2; measured here 1.3e-3 relative at
//     K = 5120 on random codes), so, as cuBLASLt does, every 128-K stage runs
//     as its own chain from zero and is added to FP32 registers on the CUDA
//     cores: ~2e-4 relative on random codes, cuBLASLt's precision (lt_gemm_fp8).
//     W128x256Fast keeps the 1.3e-3 instead (no promotion, CUTLASS's
//     FP8FastAccum numerics, which vLLM uses on sm_90): the tensor cores never
//     wait for a chain to retire (gate|up 2,048 + shared rows 0.205 -> 0.188 ms
//     on an H200); the prefill steps use it.
//   mma.sync m16n8k32 e4m3 (sm_89+, exact): ldmatrix fragments, 8 warps; on
//     sm_90 the instruction runs as FP16 HMMA (converts, two HMMA and FP32 adds
//     per instruction): the kernel for other GPUs, and on sm_90 for groups of
//     <= 32 rows, where streaming the weights is the whole cost.
//
// Determinism: each output element is one CTA's dot product, summed in a fixed
// order (K stage by stage, the tensor core's own order inside); no atomics, no
// split-K, so a launch reproduces itself bit for bit.
#include <algorithm>
#include <atomic>
#include <type_traits>

#include "hopper.cuh"

namespace glmk {
namespace {

constexpr int kBK = 128;           // K bytes per pipeline stage (one swizzled 128-byte row)
constexpr int kPieces = kBK / 16;  // 16-byte cp.async pieces per row and stage

// ------------------------------------------------------------ tile configs

enum TcMode { kModeMma = 0, kModeF16 = 1, kModeFp8 = 2 };

// BM x BN CTA tile; WARPS_M x WARPS_N warps (mma.sync) or warpgroups (wgmma)
// split it; STAGES-deep FP8 cp.async pipeline.
template <int BM_, int BN_, int WARPS_M_, int WARPS_N_, int STAGES_, int MODE_, int MINB_ = 1,
          int RING_ = 3, bool LATE_ = false>
struct TcConfig {
  static constexpr int BM = BM_, BN = BN_, WARPS_M = WARPS_M_, WARPS_N = WARPS_N_;
  static constexpr int STAGES = STAGES_, MODE = MODE_;
  // CTAs per SM (launch bounds). With 2, one CTA's barriers, prologue and
  // epilogue overlap the other's math.
  static constexpr int MINB = MINB_;
  // The epilogue's scales are loaded after the main loop into the freed stage
  // memory when the stages and the FP16 ring leave no room for them.
  static constexpr bool LATE_SCALES = LATE_;
  static constexpr bool kWgmma = MODE != kModeMma;
  static constexpr int THREADS = (kWgmma ? 128 : 32) * WARPS_M * WARPS_N;
  static constexpr int TM = BM / WARPS_M, TN = BN / WARPS_N;  // one warp's (warpgroup's) tile
  static constexpr int A_BYTES = BM * kBK, STAGE_BYTES = (BM + BN) * kBK;
  static constexpr int A_PER = BM * kPieces / THREADS;  // A pieces a thread copies per stage
  static constexpr int B_PER = BN * kPieces / THREADS;
  static constexpr int ROW_STEP = THREADS / kPieces;    // rows between a thread's pieces
  // F16: a stage is converted in two units of 64 K (k16 steps 0-3 and 4-7)
  // into a ring of RING buffers of the B operand, [BN rows][64 halves = 128
  // bytes] each, swizzled like an FP8 stage (A goes to registers); RING - 2
  // chains stay in flight and the A fragments rotate over RING - 1 register
  // sets.
  static constexpr int RING = RING_;
  static_assert(RING == 3 || RING == 4, "ring depth");
  static constexpr int F16_BYTES = MODE == kModeF16 ? BN * kBK : 0;
  // FP8 stages loaded ahead of the one computed (the slot refilled at
  // iteration kt held stage kt-1, consumed before the barrier of kt).
  static constexpr int AHEAD = STAGES - 1;
  // Shared memory: the FP8 stages, the FP16 ring (F16), all at 1024-byte
  // boundaries (the swizzle pattern repeats every 8 rows of 128 bytes and
  // wgmma computes it from address bits 7..9), then the per-row activation
  // scales and the per-channel weight scales and bias.
  static constexpr int SCALE_BYTES = (BM + 2 * BN) * 4;
  static constexpr int SMEM =
      1024 + STAGES * STAGE_BYTES + RING * F16_BYTES + (LATE_SCALES ? 0 : SCALE_BYTES);
  static_assert(!LATE_SCALES || SCALE_BYTES <= STAGES * STAGE_BYTES, "late scales fit the stages");
  static_assert(MINB == 1 || SMEM <= 113 * 1024, "two CTAs per SM");
  static_assert(BM * kPieces % THREADS == 0 && BN * kPieces % THREADS == 0, "pieces per thread");
  static_assert(MODE != kModeF16 || (TM == 64 && (TN == 64 || TN == 128 || TN == 256)), "f16 wgmma tile");
  static_assert(MODE != kModeFp8 || (TM == 64 && (TN == 128 || TN == 256)), "fp8 wgmma tile");
  static_assert(MODE != kModeMma || (TM % 16 == 0 && TN % 16 == 0), "mma.sync warp tile");
  static_assert(AHEAD >= 1, "pipeline depth");
  static_assert(SMEM <= 227 * 1024, "shared memory");
};

// The variants gemm_fp8_grouped_tc_tuned can run (GroupedTcTile).
// F16 configs: <..., CTAs per SM, FP16 ring depth, late scales>.
using CfgE128x256 = TcConfig<128, 256, 2, 1, 2, kModeF16, 1, 4, true>;  // 2 warpgroups x m64n256 f16
using CfgE128x128 = TcConfig<128, 128, 2, 1, 4, kModeF16, 1, 4>;        // 2 warpgroups x m64n128 f16
using CfgE64x128 = TcConfig<64, 128, 1, 2, 2, kModeF16, 2, 3, true>;    // 2 warpgroups x m64n64 f16,
                                                                        // 2 CTAs per SM
using CfgF128x256 = TcConfig<128, 256, 2, 1, 4, kModeFp8>;  // 2 warpgroups x m64n256 e4m3
using CfgF64x256 = TcConfig<64, 256, 1, 2, 5, kModeFp8>;    // 2 warpgroups x m64n128 e4m3
using CfgM64x128 = TcConfig<64, 128, 2, 4, 4, kModeMma>;    // 8 warps x 32x32 mma.sync

// ------------------------------------------------------------ device helpers

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

#if defined(GLMK_HAS_WGMMA)
// D[64 x N] (+)= A[64 x 16] * B[N x 16]^T, f16: A from registers (this warp's 16 rows as the
// m16n8k16 A fragment: a0 row g k 2c..2c+1, a1 row g+8, a2 row g k 2c+8.., a3 row g+8 k 2c+8..),
// B from a shared-memory descriptor, FP32 accumulators; scale_d == 0: D = A * B.
__device__ __forceinline__ void wgmma_m64n64k16_f16_rs(float (&d)[32], const uint32_t (&a)[4],
                                                       uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
      "}, {%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}

__device__ __forceinline__ void wgmma_m64n128k16_f16_rs(float (&d)[64], const uint32_t (&a)[4],
                                                       uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
      "}, {%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}

__device__ __forceinline__ void wgmma_m64n256k16_f16_rs(float (&d)[128], const uint32_t (&a)[4],
                                                       uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,"
      "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,"
      "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,"
      "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,"
      "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"
      "}, {%128,%129,%130,%131}, %132, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}

template <int N>
__device__ __forceinline__ void wgmma_f16_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t db,
                                             int scale_d) {
  static_assert(N == 64 || N == 128 || N == 256, "f16 wgmma width");
  if constexpr (N == 256) wgmma_m64n256k16_f16_rs(d, a, db, scale_d);
  else if constexpr (N == 128) wgmma_m64n128k16_f16_rs(d, a, db, scale_d);
  else wgmma_m64n64k16_f16_rs(d, a, db, scale_d);
}
#endif  // GLMK_HAS_WGMMA

// Two FP8 E4M3 values (the low 16 bits, lowest byte first) to an FP16 pair (exact).
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t v) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(v & 0xffffu), __NV_E4M3);
  return (uint32_t)h.x | ((uint32_t)h.y << 16);
}

// Two adjacent outputs at element offset i of Y, or of y16 (when set) rounded to BF16.
__device__ __forceinline__ void store_pair(float* Y, __nv_bfloat16* y16, int64_t i, float2 y) {
  if (y16)
    *reinterpret_cast<__nv_bfloat162*>(y16 + i) = __floats2bfloat162_rn(y.x, y.y);
  else
    *reinterpret_cast<float2*>(Y + i) = y;
}

// ------------------------------------------------------------ the kernel

// Grid: one CTA per (m-tile, n-tile) of a bound on the m-tiles (the host's
// ceil(M/BM) + non-empty groups). Raster: panels of `panel` consecutive
// m-tiles; inside a panel the n-tile varies slowest, so the CTAs launched
// together share an n-tile's weights across the panel's m-tiles (a group of
// several m-tiles streams its weights from HBM about once) and the panel's
// activations across every n-tile (re-read from L2).
template <class C>
__global__ void __launch_bounds__(C::THREADS, C::MINB)
    grouped_tc_kernel(StreamGemmArgs a, __nv_bfloat16* y16, int n_tiles, int panel) {
  extern __shared__ uint8_t smem_raw[];
  pdl_launch_dependents();
  const int tid = threadIdx.x;
  const int span = panel * n_tiles;
  const int pid = blockIdx.x / span, rem = blockIdx.x % span;
  const int nt = rem / panel, t = pid * panel + rem % panel;
  int grp, row0, rows;
  if (!find_m_tile<C::BM>(a.group_offsets, a.groups, a.M, t, grp, row0, rows)) return;  // block-uniform

  const uint32_t sbase = (smem_u32(smem_raw) + 1023u) & ~1023u;
  uint8_t* const sgen = smem_raw + (sbase - smem_u32(smem_raw));
  float* const s_xs = reinterpret_cast<float*>(
      sgen + (C::LATE_SCALES ? 0 : C::STAGES * C::STAGE_BYTES + C::RING * C::F16_BYTES));  // [BM]
  float* const s_ws = s_xs + C::BM;                                                  // [BN]
  float* const s_bias = s_ws + C::BN;                                                // [BN]

  const int64_t K = a.K;
  const int n0 = nt * C::BN;
  const int piece = tid % kPieces, prow = tid / kPieces;

  // This thread's copies: B rows n0 + prow + i*ROW_STEP of the group's
  // weights (rows past N are not copied: their stale shared bytes only reach
  // channels that are never stored), A rows prow + i*ROW_STEP of the tile
  // (rows past the tile's end likewise: each output row is its own A row's
  // products).
  const uint8_t* const wsrc = a.W + ((int64_t)grp * a.N + n0 + prow) * K + piece * 16;
  const int b_rows_left = a.N - n0 - prow;  // copy i is in range if i * ROW_STEP < this
  auto load_b = [&](int kt, int slot) {
    const uint32_t sb = sbase + slot * C::STAGE_BYTES + C::A_BYTES;
#pragma unroll
    for (int i = 0; i < C::B_PER; ++i) {
      const int r = prow + i * C::ROW_STEP;
      if (i * C::ROW_STEP < b_rows_left)
        cp_async_cg16(sb + r * kBK + ((piece ^ (r & 7)) << 4), wsrc + (int64_t)i * C::ROW_STEP * K + kt * kBK, 2);
    }
  };
  const int KT = a.K / kBK;
  // The prologue's weight copies go out before the activation row lookups
  // (x_rows, one more dependent round trip): they are the long HBM reads.
  // Group s of the prologue then holds A of stage s (and group 0 every
  // prologue B), so "group s complete" still means "stage s complete".
  for (int s = 0; s < C::AHEAD; ++s)
    if (s < KT) load_b(s, s);

  const uint8_t* xsrc[C::A_PER];
#pragma unroll
  for (int i = 0; i < C::A_PER; ++i) {
    const int r = prow + i * C::ROW_STEP;
    xsrc[i] = nullptr;
    if (r < rows) {
      const int p = row0 + r;
      const int xr = a.x_rows ? a.x_rows[p] : p;
      xsrc[i] = a.X + (int64_t)xr * K + piece * 16;
    }
  }
  auto load_a = [&](int kt, int slot) {
    const uint32_t sa = sbase + slot * C::STAGE_BYTES;
#pragma unroll
    for (int i = 0; i < C::A_PER; ++i) {
      const int r = prow + i * C::ROW_STEP;
      if (xsrc[i]) cp_async_cg16(sa + r * kBK + ((piece ^ (r & 7)) << 4), xsrc[i] + kt * kBK, 0);
    }
  };
  auto load_stage = [&](int kt, int slot) {
    load_a(kt, slot);
    load_b(kt, slot);
  };
  for (int s = 0; s < C::AHEAD; ++s) {
    if (s < KT) load_a(s, s);
    cp_async_commit();
  }

  // Per-row activation scales and per-channel weight scales / bias for the
  // epilogue: here (published by the main loop's barriers), or after the
  // main loop into the freed stage memory (LATE_SCALES).
  auto load_scales = [&] {
    for (int r = tid; r < C::BM; r += C::THREADS) {
      float v = 0.f;
      if (r < rows) {
        const int p = row0 + r;
        v = a.x_scale[a.x_rows ? a.x_rows[p] : p];
      }
      s_xs[r] = v;
    }
    for (int c = tid; c < C::BN; c += C::THREADS) {
      const int n = n0 + c;
      const bool in = n < a.N;
      s_ws[c] = in ? a.w_scale[(int64_t)grp * a.N + n] : 0.f;
      s_bias[c] = in && a.bias ? a.bias[(int64_t)grp * a.N + n] : 0.f;
    }
  };
  if constexpr (!C::LATE_SCALES) load_scales();
  // LATE_SCALES: every thread is past its last read of the stage memory (the
  // main loop's last barrier came after them; only empty cp.async groups are
  // pending), then the scales are published.
  auto late_scales = [&] {
    if constexpr (C::LATE_SCALES) {
      cp_async_wait<0>();
      __syncthreads();
      load_scales();
      __syncthreads();
    }
  };

  const int warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, c4 = lane & 3;
  const int64_t ldy = a.ldy;
  // Stores an accumulator pair (row r of the tile, channels c, c+1 of the tile).
  auto store2 = [&](int r, int c, float v0, float v1) {
    if (r >= rows || n0 + c >= a.N) return;
    const float xs = s_xs[r];
    float2 y;
    y.x = v0 * xs * s_ws[c] + s_bias[c];
    y.y = v1 * xs * s_ws[c + 1] + s_bias[c + 1];
    store_pair(a.Y, y16, (int64_t)(row0 + r) * ldy + n0 + c, y);
  };

  if constexpr (C::kWgmma) {
#if defined(GLMK_HAS_WGMMA)
    // Warpgroup wg owns tile rows [64 * wgm, +64) x channels [TN * wgn, +TN).
    const int wg = warp >> 2, wgm = wg / C::WARPS_N, wgn = wg % C::WARPS_N;
    const uint32_t a_off = wgm * 64 * kBK, b_off = C::A_BYTES + wgn * C::TN * kBK;  // in a stage
    // Waits for FP8 stage kt (every thread's copies), then refills the slot
    // freed by the previous iterations with stage kt + AHEAD.
    auto next_stage = [&](int kt) {
      cp_async_wait<C::AHEAD - 1>();
      if constexpr (C::MODE == kModeFp8) fence_proxy_async();  // the tensor cores read the stage
      __syncthreads();
      const int nk = kt + C::AHEAD;
      if (nk < KT) load_stage(nk, nk % C::STAGES);
      cp_async_commit();
    };
    // F16: the accumulators are wgmma's own (the first chain starts from zero,
    // scale-d 0: written by anything else they would serialize the wgmma);
    // FP8: the FP32 sum of the chains, on the CUDA cores.
    float acc[C::TN / 2];
    if constexpr (C::MODE == kModeFp8) {
#pragma unroll
      for (int i = 0; i < C::TN / 2; ++i) acc[i] = 0.f;
    }

    if constexpr (C::MODE == kModeF16) {
      // Each 128-K stage runs as two units of 64 K. Unit j: the warps convert
      // the stage's B unit to FP16 into ring buffer j % RING and load their A
      // fragments (ldmatrix from the FP8 stage, converted in registers) into
      // register set j % NSETS, publish the buffer (proxy fence + barrier),
      // issue a chain of four k16 wgmma (A from registers) and wait until
      // at most RING - 2 chains are in flight. Buffer j % RING was last read
      // by the chain of j - RING, which every warpgroup retired (its wait
      // after issuing j - 2) before the barrier of j - 1 that this thread has
      // passed; register set j % NSETS was last read by the chain of j - NSETS,
      // retired by this warpgroup's own wait after issuing j - 1. (Register
      // sets are template arguments: registers cannot be indexed at run
      // time.) The FP8 slot refilled at iteration kt (stage kt-1's) was last
      // read before the barrier of kt-1's last unit.
      //
      // K order: a sum may permute K as long as A and B agree. The A fragment
      // of m16n8k16 wants k {2c, 2c+1} (a0/a1) and {2c+8, 2c+9} (a2/a3) of each
      // k16 step from thread c; ldmatrix on FP8 bytes gives thread c bytes
      // 4c..4c+3 of a 16-byte piece. So k16 step s takes FP8 piece s of the
      // unit, with logical k 2c+i <- byte 4c+i and 2c+8+i <- byte 4c+2+i
      // (i < 2); the B conversion writes each piece's FP16 in that same order.
      constexpr int STEPS = 4;                // k16 steps per unit
      constexpr int NSETS = C::RING - 1;      // A fragment register sets
      constexpr int PIECES = C::BN * STEPS;   // 16-byte FP8 pieces of B in a unit
      uint8_t* const f16 = sgen + C::STAGES * C::STAGE_BYTES;
      const uint32_t f16_s = sbase + C::STAGES * C::STAGE_BYTES;
      static_assert(PIECES % C::THREADS == 0, "conversion pieces per thread");
      // ldmatrix.x4 lanes: matrices (rows 0-7, piece p), (rows 8-15, p),
      // (rows 0-7, p+1), (rows 8-15, p+1) of this warp's 16 rows.
      const int a_row = wgm * 64 + 16 * (warp & 3) + (lane & 7) + (((lane >> 3) & 1) << 3);
      const uint32_t a_lane = a_row * kBK;
      const int a_hi = lane >> 4, x7 = lane & 7;
      uint32_t af[NSETS][STEPS][4];  // [register set][k16 step][fragment register]
      int buf = 0;
      auto unit = [&](auto set_c, int kt, int h) {
        constexpr int SET = decltype(set_c)::value;
        const uint8_t* const src_b = sgen + (kt % C::STAGES) * C::STAGE_BYTES + C::A_BYTES;
        const uint32_t src_a = sbase + (kt % C::STAGES) * C::STAGE_BYTES + a_lane;
        uint8_t* const dst = f16 + buf * C::F16_BYTES;
#pragma unroll
        for (int i = 0; i < PIECES / C::THREADS; ++i) {
          // Consecutive threads take consecutive rows: the swizzle then puts
          // each 8-row phase of a 16-byte access in 8 distinct bank groups.
          const int idx = tid + i * C::THREADS, r = idx % C::BN, ql = idx / C::BN;
          const uint4 v =
              *reinterpret_cast<const uint4*>(src_b + r * kBK + (((STEPS * h + ql) ^ (r & 7)) << 4));
          uint8_t* const row = dst + r * kBK;
          const int c0 = 2 * ql;
          *reinterpret_cast<uint4*>(row + ((c0 ^ (r & 7)) << 4)) =
              make_uint4(e4m3x2_to_f16x2(v.x), e4m3x2_to_f16x2(v.y), e4m3x2_to_f16x2(v.z),
                         e4m3x2_to_f16x2(v.w));
          *reinterpret_cast<uint4*>(row + (((c0 + 1) ^ (r & 7)) << 4)) =
              make_uint4(e4m3x2_to_f16x2(v.x >> 16), e4m3x2_to_f16x2(v.y >> 16),
                         e4m3x2_to_f16x2(v.z >> 16), e4m3x2_to_f16x2(v.w >> 16));
        }
#pragma unroll
        for (int p = 0; p < STEPS / 2; ++p) {
          uint32_t r[4];
          ldmatrix_x4(r, src_a + (((STEPS * h + 2 * p + a_hi) ^ x7) << 4));
#pragma unroll
          for (int q = 0; q < 2; ++q) {
            uint32_t (&f)[4] = af[SET][2 * p + q];
            f[0] = e4m3x2_to_f16x2(r[2 * q]);            // row g,   k 2c, 2c+1
            f[1] = e4m3x2_to_f16x2(r[2 * q + 1]);        // row g+8, k 2c, 2c+1
            f[2] = e4m3x2_to_f16x2(r[2 * q] >> 16);      // row g,   k 2c+8, 2c+9
            f[3] = e4m3x2_to_f16x2(r[2 * q + 1] >> 16);  // row g+8, k 2c+8, 2c+9
          }
        }
        fence_proxy_async();
        __syncthreads();
        const uint32_t fb = f16_s + buf * C::F16_BYTES + wgn * C::TN * kBK;
        wgmma_fence();
#pragma unroll
        for (int s = 0; s < STEPS; ++s)
          wgmma_f16_rs<C::TN>(acc, af[SET][s], wgmma_desc(fb + 32 * s), (kt | h | s) != 0);
        wgmma_commit();
        wgmma_wait<C::RING - 2>();
        buf = buf + 1 == C::RING ? 0 : buf + 1;
      };
      auto run_unit = [&](auto set_c, int j) {
        const int kt = j >> 1, h = j & 1;
        if (h == 0) next_stage(kt);  // block-uniform
        unit(set_c, kt, h);
      };
      using Set0 = std::integral_constant<int, 0>;
      using Set1 = std::integral_constant<int, 1>;
      using Set2 = std::integral_constant<int, 2>;
      // Units in rounds of NSETS, then the rest in nested conditions: ptxas
      // must see straight-line code in which a register set is rewritten only
      // after its chain's wait, else it serializes every wgmma (C7513).
      const int units = 2 * KT;
      int j = 0;
      if constexpr (NSETS == 2) {
        for (; j + 2 <= units; j += 2) {
          run_unit(Set0{}, j);
          run_unit(Set1{}, j + 1);
        }
        if (j < units) run_unit(Set0{}, j);
      } else {
        for (; j + 3 <= units; j += 3) {
          run_unit(Set0{}, j);
          run_unit(Set1{}, j + 1);
          run_unit(Set2{}, j + 2);
        }
        if (j < units) {
          run_unit(Set0{}, j);
          if (j + 1 < units) run_unit(Set1{}, j + 1);
        }
      }
      wgmma_wait<0>();
    } else {
      // FP8: per stage, each 128-channel half of the warpgroup's tile is one
      // chain of four k32 steps from zero into a partial buffer, retired
      // (wait 0) and added to acc on the CUDA cores, in stage order. ptxas
      // serializes every wgmma (C7514) when registers of a chain still in
      // flight are read, so a chain cannot overlap the previous one's adds
      // inside a warpgroup; the other warpgroup's chains fill those gaps.
      float part[64];
      for (int kt = 0; kt < KT; ++kt) {
        next_stage(kt);
        const uint32_t st = sbase + (kt % C::STAGES) * C::STAGE_BYTES;
#pragma unroll
        for (int half = 0; half < C::TN / 128; ++half) {
          wgmma_fence();
#pragma unroll
          for (int s = 0; s < kBK / 32; ++s)
            wgmma_m64n128k32_e4m3(part, wgmma_desc(st + a_off + 32 * s),
                                  wgmma_desc(st + b_off + half * 128 * kBK + 32 * s), s);
          wgmma_commit();
          wgmma_wait<0>();
#pragma unroll
          for (int i = 0; i < 64; ++i) acc[64 * half + i] += part[i];
        }
      }
    }
    late_scales();
    // Accumulator 4j + e: row 16 * (warp % 4) + g + 8 * (e >> 1), channel 8j + 2 * c4 + (e & 1).
    const int rbase = wgm * 64 + 16 * (warp & 3) + g;
    const int cbase = wgn * C::TN + 2 * c4;
#pragma unroll
    for (int j = 0; j < C::TN / 8; ++j) {
      store2(rbase, cbase + 8 * j, acc[4 * j], acc[4 * j + 1]);
      store2(rbase + 8, cbase + 8 * j, acc[4 * j + 2], acc[4 * j + 3]);
    }
#endif
  } else {
    // mma.sync: warp (wm, wn) owns tile rows [TM * wm, +TM) x channels
    // [TN * wn, +TN): MF x NF fragments of 16 x 8. ldmatrix.x4 gives an A
    // fragment (rows 0-7 / 8-15 x bytes 0-15 / 16-31 of a 32-byte K step:
    // a0..a3 of m16n8k32) or the b0/b1 pairs of two adjacent 8-channel
    // fragments. A warp whose rows all lie past the tile's end skips its mma.
    constexpr int MF = C::TM / 16, NF = C::TN / 8;
    const int wm = warp / C::WARPS_N, wn = warp % C::WARPS_N;
    const bool active = wm * C::TM < rows;  // warp-uniform
    const int x7 = lane & 7;
    const uint32_t a_row = (wm * C::TM + (lane & 15)) * kBK;
    const int a_hi = lane >> 4;
    const uint32_t b_row = (wn * C::TN + x7 + ((lane >> 4) << 3)) * kBK;
    const int b_hi = (lane >> 3) & 1;
    float acc[MF][NF][4];
#pragma unroll
    for (int i = 0; i < MF; ++i)
#pragma unroll
      for (int j = 0; j < NF; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;

    for (int kt = 0; kt < KT; ++kt) {
      cp_async_wait<C::AHEAD - 1>();
      __syncthreads();  // stage kt landed for every thread; slot (kt-1) % S is free
      const int nk = kt + C::AHEAD;
      if (nk < KT) load_stage(nk, nk % C::STAGES);
      cp_async_commit();
      if (!active) continue;
      const uint32_t sa = sbase + (kt % C::STAGES) * C::STAGE_BYTES;
      const uint32_t sb = sa + C::A_BYTES;
      uint32_t af[2][MF][4], bf[2][NF][2];
      // Fragments of K step s into buffer s & 1 (the next step's are loaded
      // before this step's mma, so shared-memory latency overlaps the math).
      auto load_frags = [&](int s, int buf) {
#pragma unroll
        for (int i = 0; i < MF; ++i)
          ldmatrix_x4(af[buf][i], sa + a_row + i * 16 * kBK + (((2 * s + a_hi) ^ x7) << 4));
#pragma unroll
        for (int j = 0; j < NF; j += 2) {
          uint32_t r[4];
          ldmatrix_x4(r, sb + b_row + j * 8 * kBK + (((2 * s + b_hi) ^ x7) << 4));
          bf[buf][j][0] = r[0];
          bf[buf][j][1] = r[1];
          bf[buf][j + 1][0] = r[2];
          bf[buf][j + 1][1] = r[3];
        }
      };
      load_frags(0, 0);
#pragma unroll
      for (int s = 0; s < kBK / 32; ++s) {
        if (s + 1 < kBK / 32) load_frags(s + 1, (s + 1) & 1);
#pragma unroll
        for (int i = 0; i < MF; ++i)
#pragma unroll
          for (int j = 0; j < NF; ++j)
            mma_e4m3_16832(acc[i][j], af[s & 1][i][0], af[s & 1][i][1], af[s & 1][i][2], af[s & 1][i][3],
                           bf[s & 1][j][0], bf[s & 1][j][1]);
      }
    }
    cp_async_wait<0>();
    late_scales();
    if (active) {
#pragma unroll
      for (int i = 0; i < MF; ++i)
#pragma unroll
        for (int j = 0; j < NF; ++j) {
          const int r = wm * C::TM + i * 16 + g, c = wn * C::TN + j * 8 + 2 * c4;
          store2(r, c, acc[i][j][0], acc[i][j][1]);
          store2(r + 8, c, acc[i][j][2], acc[i][j][3]);
        }
    }
  }
}

// ------------------------------------------------------------ warp-specialized F tiles

// W tiles: the F tiles' numerics (FP8 wgmma, every 128-K stage its own chain
// from zero, chains added to FP32 registers in stage order: bit for bit what
// F128x256 computes) with the work split by role instead of in lockstep. A
// producer warpgroup fills a ring of STAGES FP8 stages: one thread issues the
// weight tile as one TMA (cp.async.bulk.tensor, 128-byte swizzle, from a
// tensor map over W as [groups * N][K] built on the host per call), and the
// 128 threads copy the gathered activation rows (x_rows) with cp.async, each
// signalling the stage's full barrier with cp.async.mbarrier.arrive.noinc.
// Two consumer warpgroups (64 rows x BN channels each) wait on a stage's full
// barrier, run their chains and arrive on its empty barrier, which the
// producer waits on before refilling the slot. The CTAs are persistent (one
// per SM), taking the (m-tile, n-tile) list in raster order by a fixed stride
// or from a queue (tile_ctr), so the producer loads the next tile's first
// stages during a tile's last chains and epilogue. The producer also finds
// each tile's group and rows and gathers its epilogue factors (x scales, w
// scales, bias) into shared memory a tile ahead, so the consumers go from one
// tile's epilogue to the next tile's chains without a global load. setmaxnreg
// gives the producer's registers to the consumers (128 x 72 + 256 x 216 =
// 384 x 168). The producer needs ~72: at 40 (the
// consumers at 232) ptxas kept its eight gathered row indices and addresses in
// local memory, ~8 spill loads a thread per stage (ncu: 1.2 M local requests
// in a 2k prefill's gate|up), and the consumers' chains fit 216 unspilled.
//
// Measured (H200, GLM shapes): W128x256 is 12-30% faster than F128x256 from
// 2048 to 16384 rows (gate|up 2048: 0.112 vs 0.129 ms; 16384: 0.571 vs 0.748).
// What bounds it: at 2048 rows the 315 MB of gate|up weights stream at ~2.8
// TB/s; at 16384 the consumers keep the tensor cores ~45% busy (900 TFLOP/s)
// because each 128-K chain must be retired (wait 0) and added before the next
// one can use the partial registers (acc 128 + part 64 per thread leaves no
// room for a second partial set). Tried and dropped: W128x128 with two
// partial sets (ptxas spills and serializes the wgmma, C7514/C7517), per-CTA
// contiguous unit ranges (better balanced, but slower: neighbouring CTAs no
// longer share a group's weights in L2 / DRAM pages), splitting a last round
// of few tiles into 128-channel units (no gain: a nearly empty last round
// streams faster per CTA).
// FAST: no promotion (kGroupedTcW128x256Fast): each stage's chains run
// straight into the output registers, the next stage's are issued before
// this one's retire (wait_group 1), and a stage's slot is released once the
// chains after it are issued, the pattern of CUTLASS's FP8FastAccum
// mainloops. The weights arrive as 128-row TMA boxes, BN / 128 a stage: BN
// consecutive rows, or with `silu` (GroupedTcTuning::silu_gate_up, BN 256)
// 128 gate rows and their up rows N / 2 further, so that one thread holds a
// gate sum and its up sum and the epilogue writes silu(gate) * up (prefill,
// H200, 2026-11-29: TTFT 2,048 45.8 -> 45.0 ms, 8,192 173 -> 169.5).
// Groups of at least kHeavyMTiles m-tiles are "heavy": their weight tiles are
// reused over several m-tiles (from L2), so their tiles wait on the tensor
// cores; a one-m-tile group's tiles (a routed expert at a 2k prefill: ~100
// rows) stream their weights from HBM once and wait on it. The W tiles take
// the two kinds interleaved (interleave_m_tile) so that both are busy in every
// round. H200, 2026-11-29: a 2k prefill's gate|up + shared 0.184 -> 0.170 ms
// (grouped_check), TTFT 48.2 -> 47.8 ms; with 4 as the threshold (3a of the
// eleventh session's light / heavy split) the 4k and 8k prompts, whose routed
// experts hold 2-4 m-tiles, were 0.5% slower.
constexpr int kHeavyMTiles = 2;

// The m-tiles of the light (heavy = false) or heavy groups, warp-uniform.
template <int BM>
__device__ int count_m_tiles_of(const int* __restrict__ offs, int groups, bool heavy) {
  const int lane = threadIdx.x & 31;
  int s = 0;
  for (int g = lane; g < groups; g += 32) {
    const int n = offs[g + 1] - offs[g];
    const int tiles = n > 0 ? (n + BM - 1) / BM : 0;
    s += (tiles >= kHeavyMTiles) == heavy ? tiles : 0;
  }
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) s += __shfl_xor_sync(0xffffffffu, s, d);
  return s;
}

// find_m_tile over the light or the heavy groups only: the k-th m-tile of that
// kind, in group order (a warp-wide search, as find_m_tile).
template <int BM>
__device__ bool find_m_tile_of(const int* __restrict__ offs, int groups, bool heavy, int k, int& grp, int& row0,
                               int& rows) {
  const int lane = threadIdx.x & 31;
  int seen = 0;
  for (int g0 = 0; g0 < groups; g0 += 32) {
    const int g = g0 + lane;
    const int lo = g < groups ? offs[g] : 0, hi = g < groups ? offs[g + 1] : 0;
    const int n = hi - lo;
    int tiles = n > 0 ? (n + BM - 1) / BM : 0;
    if ((tiles >= kHeavyMTiles) != heavy) tiles = 0;
    int s = tiles;  // inclusive scan over the lanes
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, s, d);
      if (lane >= d) s += v;
    }
    const int first = seen + s - tiles;
    const unsigned owner = __ballot_sync(0xffffffffu, k >= first && k < first + tiles);
    if (owner) {
      const int src = __ffs(owner) - 1;
      const int j = k - __shfl_sync(0xffffffffu, first, src);
      grp = g0 + src;
      row0 = __shfl_sync(0xffffffffu, lo, src) + j * BM;
      rows = min(BM, __shfl_sync(0xffffffffu, n, src) - j * BM);
      return true;
    }
    seen += __shfl_sync(0xffffffffu, s, 31);
  }
  return false;
}

// Position p of the W tiles' m-tile order -> (kind, index among that kind):
// the n_light light m-tiles spread evenly among the n_heavy heavy ones
// (Bresenham), each kind in group order.
__device__ __forceinline__ void interleave_m_tile(int p, int n_light, int n_heavy, bool& heavy, int& k) {
  const int64_t n = (int64_t)n_light + n_heavy;
  const int before = (int)((int64_t)p * n_light / n);  // light m-tiles before position p
  heavy = (int)((int64_t)(p + 1) * n_light / n) == before;
  k = heavy ? p - before : before;
}

template <int BN_, int STAGES_, bool FAST_ = false>
struct WsConfig {
  static constexpr int BM = 128, BN = BN_, STAGES = STAGES_;
  static constexpr bool FAST = FAST_;
  static constexpr int CONSUMERS = 2;  // warpgroups of 64 rows
  static constexpr int THREADS = 128 * (1 + CONSUMERS);
  static constexpr int A_BYTES = BM * kBK, B_BYTES = BN * kBK, STAGE_BYTES = A_BYTES + B_BYTES;
  static constexpr int A_PER = BM * kPieces / 128;  // A pieces a producer thread copies per stage
  static constexpr int BAR_BYTES = 16 * STAGES;     // full[STAGES], empty[STAGES]
  // A tile's epilogue factors (x scales, w scales, bias), two tiles' worth:
  // the producer gathers them while the consumers run the mainloop.
  static constexpr int SCALE_FLOATS = BM + 2 * BN;
  // mbarriers q_full[2], q_empty[2] (the tile queue), sc_full[2], sc_empty[2]
  // (the scale slots), then the queue's two tile slots (int4: tile, group,
  // first row, rows).
  static constexpr int QUEUE_BYTES = 96;
  static constexpr int SMEM = 1024 + STAGES * STAGE_BYTES + BAR_BYTES + 2 * SCALE_FLOATS * 4 + QUEUE_BYTES;
  static constexpr int PRODUCER_REGS = 72, CONSUMER_REGS = 216;
  static_assert(BN == 128 || BN == 256, "consumer tile: chains of m64n128k32");
  static_assert(BN <= 256, "TMA box rows");
  static_assert(PRODUCER_REGS * 128 + CONSUMER_REGS * 128 * CONSUMERS <= 65536 / THREADS / 8 * 8 * THREADS,
                "register split");
  static_assert(SMEM <= 227 * 1024, "shared memory");
};
using CfgW128x256 = WsConfig<256, 4>;
using CfgW128x128 = WsConfig<128, 6>;
using CfgW128x256Fast = WsConfig<256, 4, true>;

// m_bound: the host's bound on the m-tiles (the grid of the F kernel); tiles
// past it are dropped as there, so both kernels read the same bounds.
// tile_ctr (GroupedTcTuning::tile_counter): null — CTA c takes tiles c,
// c + grid, ... in raster order; else CTA c takes tile c first and each
// further tile from tile_ctr[0] (atomicAdd, offset by the grid), so a CTA
// whose tiles were cheap (the shared expert's, computed from L2) takes more of
// them than one streaming a routed expert's weights from HBM, and the launch
// ends when the work does rather than after the static stride's last round
// (a 2k prefill's gate|up: 432 tiles, 3.27 rounds of 132). Producer thread 0
// fetches the index and hands it to the CTA's 12 warps through a two-slot
// queue in shared memory (next_tile: a full mbarrier, one arrival, and an empty
// one, one arrival a warp); the CTA that fetches the last index past the end resets
// tile_ctr[0..1] to zero for the next launch (tile_ctr[1] counts the CTAs
// done fetching). Every tile is still one CTA's whole-K sum: the same bits in
// either mode.
template <class C>
__global__ void __launch_bounds__(C::THREADS, 1)
    grouped_ws_kernel(const __grid_constant__ CUtensorMap wmap, StreamGemmArgs a, __nv_bfloat16* y16,
                      int n_tiles, int panel, int m_bound, int* tile_ctr, int silu) {
#if defined(GLMK_HAS_WGMMA)
  extern __shared__ uint8_t smem_raw[];
  pdl_launch_dependents();
  const uint32_t sbase = (smem_u32(smem_raw) + 1023u) & ~1023u;
  uint8_t* const sgen = smem_raw + (sbase - smem_u32(smem_raw));
  const uint32_t bar_full = sbase + C::STAGES * C::STAGE_BYTES, bar_empty = bar_full + 8 * C::STAGES;
  float* const s_scales = reinterpret_cast<float*>(sgen + C::STAGES * C::STAGE_BYTES + C::BAR_BYTES);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wg = warp >> 2;
  const uint32_t q_base = bar_full + C::BAR_BYTES + 2 * C::SCALE_FLOATS * 4;
  const uint32_t q_full = q_base, q_empty = q_base + 16, sc_full = q_base + 32, sc_empty = q_base + 48;  // [2] each
  const uint32_t q_slot = q_base + 64;                                                                   // [2] int4
  if (tid == 0) {
    for (int s = 0; s < C::STAGES; ++s) {
      mbar_init(bar_full + 8 * s, 128 + 1);           // the producers' cp.async arrivals + the TMA's
      mbar_init(bar_empty + 8 * s, 4 * C::CONSUMERS);  // one per consumer warp
    }
    for (int s = 0; s < 2; ++s) {
      mbar_init(q_full + 8 * s, 1);
      mbar_init(q_empty + 8 * s, C::THREADS / 32);
      mbar_init(sc_full + 8 * s, 128);                // every producer thread, after its stores
      mbar_init(sc_empty + 8 * s, 4 * C::CONSUMERS);  // one per consumer warp, after the epilogue
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  // Light and heavy groups' m-tiles interleaved when there are both.
  const int n_light = a.group_offsets ? count_m_tiles_of<C::BM>(a.group_offsets, a.groups, false) : 0;
  const int n_heavy = a.group_offsets ? count_m_tiles_of<C::BM>(a.group_offsets, a.groups, true) : 0;
  const bool mix = n_light > 0 && n_heavy > 0;
  const int m_total = min(m_bound, mix ? n_light + n_heavy : count_m_tiles<C::BM>(a.group_offsets, a.groups, a.M));
  const int total = m_total * n_tiles;
  const int span = panel * n_tiles;
  // Linear tile L -> (m-tile t, n-tile nt): panels of `panel` m-tiles (the
  // last one possibly shorter), the n-tile varying slowest inside a panel.
  auto tile_of = [&](int L, int& t, int& nt) {
    const int p = L / span, rem = L % span;
    const int ps = min(panel, m_total - p * panel);
    nt = rem / ps;
    t = p * panel + rem % ps;
  };
  const int KT = a.K / kBK;
  const int64_t K = a.K;
  // The CTA's i-th tile (block-uniform), handed to all 12 warps through tile
  // slot i % 2: producer warp 0 takes the index (the fixed stride, or with
  // tile_ctr the queue), finds its m-tile's group and rows (a warp-wide
  // search of group_offsets) and publishes them once the slot's previous tile
  // has been read by every warp, a tile ahead of the consumers, so no
  // consumer waits on a global load between its tiles.
  struct TileInfo {
    int L, grp, row0, rows;
  };
  auto next_tile = [&](int i) -> TileInfo {
    const int slot = i & 1;
    const uint32_t par = (uint32_t)(i >> 1) & 1u;
    if (warp == 0) {
      if (i >= 2) mbar_wait(q_empty + 8 * slot, par ^ 1u);
      int L = 0;
      if (lane == 0)
        L = !tile_ctr || i == 0 ? (int)blockIdx.x + i * (int)gridDim.x : (int)gridDim.x + atomicAdd(tile_ctr, 1);
      L = __shfl_sync(0xffffffffu, L, 0);
      int grp = 0, row0 = 0, rows = 0;
      if (L < total) {
        int t, nt;
        tile_of(L, t, nt);
        if (mix) {
          bool heavy;
          int k;
          interleave_m_tile(t, n_light, n_heavy, heavy, k);
          find_m_tile_of<C::BM>(a.group_offsets, a.groups, heavy, k, grp, row0, rows);
        } else {
          find_m_tile<C::BM>(a.group_offsets, a.groups, a.M, t, grp, row0, rows);
        }
      }
      if (lane == 0) {
        asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(q_slot + 16 * slot), "r"(L), "r"(grp),
                     "r"(row0), "r"(rows)
                     : "memory");
        mbar_arrive(q_full + 8 * slot);
        if (tile_ctr && L >= total) {
          // This CTA fetches no more; the last one to get here resets the
          // counters (every CTA's fetches precede its count).
          __threadfence();
          if (atomicAdd(tile_ctr + 1, 1) == (int)gridDim.x - 1) {
            atomicExch(tile_ctr, 0);
            atomicExch(tile_ctr + 1, 0);
          }
        }
      }
    }
    mbar_wait(q_full + 8 * slot, par);
    TileInfo ti;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(ti.L), "=r"(ti.grp), "=r"(ti.row0), "=r"(ti.rows)
                 : "r"(q_slot + 16 * slot)
                 : "memory");
    __syncwarp();
    if (lane == 0) mbar_arrive(q_empty + 8 * slot);
    return ti;
  };

  if (wg == 0) {
    // Producer warpgroup.
    setmaxnreg_dec<C::PRODUCER_REGS>();
    const int piece = tid & 7, prow = tid >> 3;  // A rows prow + 16 i, 16-byte piece `piece`
    int stage = 0;
    uint32_t phase = 0;
    for (int it = 0;; ++it) {  // the CTA's it-th tile
      const TileInfo ti = next_tile(it);
      if (ti.L >= total) break;
      int t, nt;
      tile_of(ti.L, t, nt);
      const int grp = ti.grp, row0 = ti.row0, rows = ti.rows;
      int xr[C::A_PER];
#pragma unroll
      for (int i = 0; i < C::A_PER; ++i) {
        const int r = prow + 16 * i;
        xr[i] = r < rows ? (a.x_rows ? a.x_rows[row0 + r] : row0 + r) : -1;
      }
      // The epilogue's factors, requested now (the loads are in flight while
      // the stages below are issued) and stored into scale slot it % 2 after
      // the last stage: the consumers read them only after their mainloop.
      // (Loaded by the consumers at the tile's start, their dependent loads
      // kept the tensor cores waiting at every tile boundary.)
      constexpr int WPT = C::BN / 128;
      // The tile's weight rows: BN consecutive ones, or (silu) 128 gate rows
      // and their 128 up rows N / 2 further, as two 128-row boxes a stage.
      const int half_step = silu ? a.N / 2 : 128;
      const int wrow = grp * a.N + nt * (silu ? 128 : C::BN);
      float xs_v[C::A_PER], ws_v[WPT], bias_v[WPT];
#pragma unroll
      for (int i = 0; i < C::A_PER; ++i) xs_v[i] = piece == 0 && xr[i] >= 0 ? a.x_scale[xr[i]] : 0.f;
#pragma unroll
      for (int j = 0; j < WPT; ++j) {
        const int n = wrow - grp * a.N + half_step * j + tid;
        const bool in = n < a.N;
        ws_v[j] = in ? a.w_scale[(int64_t)grp * a.N + n] : 0.f;
        bias_v[j] = in && a.bias ? a.bias[(int64_t)grp * a.N + n] : 0.f;
      }
      for (int kt = 0; kt < KT; ++kt) {
        mbar_wait(bar_empty + 8 * stage, phase ^ 1);
        const uint32_t sa = sbase + stage * C::STAGE_BYTES, full = bar_full + 8 * stage;
        if (tid == 0) {
          mbar_arrive_expect_tx(full, C::B_BYTES);
#pragma unroll
          for (int j = 0; j < WPT; ++j)
            tma_load_2d(sa + C::A_BYTES + j * 128 * kBK, &wmap, kt * kBK, wrow + half_step * j, full);
        }
#pragma unroll
        for (int i = 0; i < C::A_PER; ++i) {
          const int r = prow + 16 * i;
          if (xr[i] >= 0)
            cp_async_cg16(sa + r * kBK + ((piece ^ (r & 7)) << 4), a.X + xr[i] * K + piece * 16 + kt * kBK, 0);
        }
        cp_async_mbar_arrive(full);
        if (++stage == C::STAGES) stage = 0, phase ^= 1;
      }
      {
        const int b = it & 1;
        if (it >= 2) mbar_wait(sc_empty + 8 * b, ((uint32_t)(it >> 1) & 1u) ^ 1u);  // tile it - 2's epilogue done
        float* const sx = s_scales + b * C::SCALE_FLOATS;
        if (piece == 0) {
#pragma unroll
          for (int i = 0; i < C::A_PER; ++i) sx[prow + 16 * i] = xs_v[i];
        }
#pragma unroll
        for (int j = 0; j < WPT; ++j) {
          sx[C::BM + tid + 128 * j] = ws_v[j];
          sx[C::BM + C::BN + tid + 128 * j] = bias_v[j];
        }
        mbar_arrive(sc_full + 8 * b);
      }
    }
    cp_async_wait<0>();
  } else {
    // Consumer warpgroup cw: tile rows [64 cw, +64) x all BN channels, as
    // BN / 128 chains of four m64n128k32 per stage.
    setmaxnreg_inc<C::CONSUMER_REGS>();
    const int cw = wg - 1;
    const int g = lane >> 2, c4 = lane & 3;
    const uint32_t a_off = cw * 64 * kBK;
    int stage = 0;
    uint32_t phase = 0;
    for (int it = 0;; ++it) {  // the CTA's it-th tile
      const TileInfo ti = next_tile(it);
      if (ti.L >= total) break;
      int t, nt;
      tile_of(ti.L, t, nt);
      const int row0 = ti.row0, rows = ti.rows;
      const int n0 = nt * C::BN;
      const bool active = 64 * cw < rows;  // warpgroup-uniform
      // acc[half][i]: channels 128 half + (the m64n128 layout's index i).
      float acc[C::BN / 128][64];
#pragma unroll
      for (int h = 0; h < C::BN / 128; ++h)
#pragma unroll
        for (int i = 0; i < 64; ++i) acc[h][i] = 0.f;
      if constexpr (C::FAST) {
        if (active) {
          int held = 0;  // the slot whose chains may still be in flight (none before kt 1)
          for (int kt = 0; kt < KT; ++kt) {
            mbar_wait(bar_full + 8 * stage, phase);
            fence_proxy_async();  // as below
            const uint32_t st = sbase + stage * C::STAGE_BYTES;
            wgmma_fence();
#pragma unroll
            for (int half = 0; half < C::BN / 128; ++half)
#pragma unroll
              for (int s = 0; s < kBK / 32; ++s)
                wgmma_m64n128k32_e4m3(acc[half], wgmma_desc(st + a_off + 32 * s),
                                      wgmma_desc(st + C::A_BYTES + half * 128 * kBK + 32 * s), 1);
            wgmma_commit();
            wgmma_wait<1>();  // the previous stage's chains have retired
            __syncwarp();
            mbar_arrive_if(bar_empty + 8 * held, lane == 0 && kt > 0);
            held = stage;
            if (++stage == C::STAGES) stage = 0, phase ^= 1;
          }
          wgmma_wait<0>();
          __syncwarp();
          mbar_arrive_if(bar_empty + 8 * held, lane == 0 && KT > 0);
        } else {
          for (int kt = 0; kt < KT; ++kt) {
            mbar_wait(bar_full + 8 * stage, phase);
            __syncwarp();
            if (lane == 0) mbar_arrive(bar_empty + 8 * stage);
            if (++stage == C::STAGES) stage = 0, phase ^= 1;
          }
        }
      } else {
        float part[64];
        for (int kt = 0; kt < KT; ++kt) {
          mbar_wait(bar_full + 8 * stage, phase);
          if (active) {
            // The A rows were written by cp.async (generic proxy); the tensor
            // cores read them through the async proxy.
            fence_proxy_async();
            const uint32_t st = sbase + stage * C::STAGE_BYTES;
#pragma unroll
            for (int half = 0; half < C::BN / 128; ++half) {
              wgmma_fence();
#pragma unroll
              for (int s = 0; s < kBK / 32; ++s)
                wgmma_m64n128k32_e4m3(part, wgmma_desc(st + a_off + 32 * s),
                                      wgmma_desc(st + C::A_BYTES + half * 128 * kBK + 32 * s), s);
              wgmma_commit();
              wgmma_wait<0>();
#pragma unroll
              for (int i = 0; i < 64; ++i) acc[half][i] += part[i];
            }
          }
          __syncwarp();
          if (lane == 0) mbar_arrive(bar_empty + 8 * stage);
          if (++stage == C::STAGES) stage = 0, phase ^= 1;
        }
      }
      const int b = it & 1;
      mbar_wait(sc_full + 8 * b, (uint32_t)(it >> 1) & 1u);  // the producer has stored this tile's factors
      const float* const s_xs = s_scales + b * C::SCALE_FLOATS + 64 * cw;  // [64] this warpgroup's rows
      const float* const s_ws = s_scales + b * C::SCALE_FLOATS + C::BM;    // [BN]
      const float* const s_bias = s_ws + C::BN;                            // [BN]
      if (active) {
        // Accumulator 4j + e (acc[j / 16][4 (j % 16) + e]): row 16 * (warp % 4) + g + 8 * (e >> 1),
        // channel 8j + 2 * c4 + (e & 1).
        const int rl = 16 * (warp & 3) + g;
        auto store2 = [&](int r, int c, float v0, float v1) {
          if (64 * cw + r >= rows || n0 + c >= a.N) return;
          const float xs = s_xs[r];
          float2 y;
          y.x = v0 * xs * s_ws[c] + s_bias[c];
          y.y = v1 * xs * s_ws[c + 1] + s_bias[c + 1];
          store_pair(a.Y, y16, (int64_t)(row0 + 64 * cw + r) * a.ldy + n0 + c, y);
        };
        if constexpr (C::BN == 256) {
          if (silu) {
            // Channel c of the first half is gate channel nt * 128 + c and
            // the same index of the second half its up channel: one thread
            // holds both (acc[0][i], acc[1][i]). Each is scaled as store2
            // scales it, then silu(gate) * up into output column nt * 128 + c.
            auto store_act = [&](int r, int c, float g0, float g1, float u0, float u1) {
              if (64 * cw + r >= rows) return;
              const float xs = s_xs[r];
              const float ga = g0 * xs * s_ws[c] + s_bias[c], gb = g1 * xs * s_ws[c + 1] + s_bias[c + 1];
              const float ua = u0 * xs * s_ws[128 + c] + s_bias[128 + c];
              const float ub = u1 * xs * s_ws[128 + c + 1] + s_bias[128 + c + 1];
              store_pair(nullptr, y16, (int64_t)(row0 + 64 * cw + r) * a.ldy + nt * 128 + c,
                         make_float2(silu_fast(ga) * ua, silu_fast(gb) * ub));
            };
#pragma unroll
            for (int j = 0; j < 16; ++j) {
              const float* v = &acc[0][4 * j];
              const float* u = &acc[1][4 * j];
              store_act(rl, 8 * j + 2 * c4, v[0], v[1], u[0], u[1]);
              store_act(rl + 8, 8 * j + 2 * c4, v[2], v[3], u[2], u[3]);
            }
          }
        }
        if (!silu) {
#pragma unroll
          for (int j = 0; j < C::BN / 8; ++j) {
            const float* v = &acc[j / 16][4 * (j % 16)];
            store2(rl, 8 * j + 2 * c4, v[0], v[1]);
            store2(rl + 8, 8 * j + 2 * c4, v[2], v[3]);
          }
        }
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(sc_empty + 8 * b);  // this warp is done with the slot
    }
  }
#endif
}

// ------------------------------------------------------------ host side

constexpr int kMaxDevices = 64;

// Rows of a non-empty group the launch should expect: typical_rows_per_group
// when given, else M spread over the groups that can be non-empty.
int expected_rows(const StreamGemmArgs& a) {
  if (a.typical_rows_per_group > 0) return a.typical_rows_per_group;
  int active = a.group_offsets ? a.groups : 1;
  if (a.max_active_groups > 0) active = std::min(active, a.max_active_groups);
  return std::max(1, ceil_div(a.M, std::max(1, active)));
}

template <class C>
cudaError_t launch_grouped(const StreamGemmArgs& a, __nv_bfloat16* y16, int panel, cudaStream_t st) {
  // The dynamic shared-memory limit is raised once per device.
  static std::atomic<bool> ready[kMaxDevices];
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  if (dev < 0 || dev >= kMaxDevices) return cudaErrorInvalidDevice;
  if (!ready[dev].load(std::memory_order_acquire)) {
    e = cudaFuncSetAttribute(grouped_tc_kernel<C>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM);
    if (e != cudaSuccess) return e;
    ready[dev].store(true, std::memory_order_release);
  }
  // m-tiles: sum over groups of ceil(count / BM) <= ceil(rows / BM) + (non-empty
  // groups), rows <= M; the non-empty groups are at most groups, M and
  // max_active_groups (when given).
  int active = a.group_offsets ? std::min(a.groups, a.M) : 1;
  if (a.group_offsets && a.max_active_groups > 0) active = std::min(active, a.max_active_groups);
  const int64_t m_tiles = (int64_t)ceil_div(a.M, C::BM) + (a.group_offsets ? active : 0);
  const int n_tiles = ceil_div(a.N, C::BN);
  if (panel <= 0) panel = 1;
  const int64_t panels = (m_tiles + panel - 1) / panel;
  const int64_t blocks = panels * panel * n_tiles;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  grouped_tc_kernel<C><<<(unsigned)blocks, C::THREADS, C::SMEM, st>>>(a, y16, n_tiles, panel);
  return cudaGetLastError();
}

template <class C>
cudaError_t launch_ws(const StreamGemmArgs& a, __nv_bfloat16* y16, int panel, int* tile_ctr, int silu,
                      cudaStream_t st) {
  static std::atomic<bool> ready[kMaxDevices];  // the smem limit raised
  int dev = 0;
  DeviceInfo di;
  cudaError_t e = device_info(dev, di);
  if (e != cudaSuccess) return e;
  if (dev >= kMaxDevices) return cudaErrorInvalidDevice;
  if (!ready[dev].load(std::memory_order_acquire)) {
    e = cudaFuncSetAttribute(grouped_ws_kernel<C>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM);
    if (e != cudaSuccess) return e;
    ready[dev].store(true, std::memory_order_release);
  }
  const int num_sms = di.sms;
  // A box is one stage of 128 weight rows (x 128 bytes), BN / 128 of them a
  // stage (the silu form's two halves are N / 2 rows apart); rows of a box
  // past N (a partial n-tile) only reach channels that are never stored.
  CUtensorMap map;
  e = encode_weight_map(&map, a.W, a.K, (int64_t)a.groups * a.N, 128);
  if (e != cudaSuccess) return e;
  // The same m-tile bound as launch_grouped.
  int active = a.group_offsets ? std::min(a.groups, a.M) : 1;
  if (a.group_offsets && a.max_active_groups > 0) active = std::min(active, a.max_active_groups);
  const int64_t m_tiles = (int64_t)ceil_div(a.M, C::BM) + (a.group_offsets ? active : 0);
  const int n_tiles = ceil_div(a.N, C::BN);
  if (m_tiles * n_tiles > 0x7fffffff) return cudaErrorInvalidValue;  // tiles are int in the kernel
  const int grid = (int)std::min<int64_t>(m_tiles * n_tiles, num_sms);
  grouped_ws_kernel<C><<<grid, C::THREADS, C::SMEM, st>>>(map, a, y16, n_tiles, panel <= 0 ? 1 : panel,
                                                          (int)m_tiles, tile_ctr, silu);
  return cudaGetLastError();
}

}  // namespace

cudaError_t gemm_fp8_grouped_tc(const StreamGemmArgs& a, cudaStream_t st) {
  return gemm_fp8_grouped_tc_tuned(a, GroupedTcTuning{}, st);
}

bool gemm_fp8_grouped_tc_supported(int N, int K) {
  return N > 0 && K > 0 && N % 128 == 0 && K % kBK == 0;
}

bool gemm_fp8_grouped_tc_silu_supported(int N, int K) {
  int dev = 0;
  DeviceInfo di;
  return N > 0 && K > 0 && N % 256 == 0 && K % kBK == 0 && device_info(dev, di) == cudaSuccess && di.major == 9;
}

namespace {
// Y: FP32 into a.Y (y16 null) or BF16 into y16 (a.Y null).
cudaError_t grouped_tc_dispatch(const StreamGemmArgs& a, __nv_bfloat16* y16, const GroupedTcTuning& tu,
                                cudaStream_t st) {
  if (a.Xf || a.ksplit != 1 || a.K <= 0 || a.K % kBK != 0 || a.N < 0 || a.N % 128 != 0 ||
      a.M < 0 || a.groups <= 0 || (!a.group_offsets && a.groups != 1) || a.max_active_groups < 0 ||
      a.typical_rows_per_group < 0 || tu.tile < 0 || tu.tile >= kGroupedTcTiles || tu.panel < 0 ||
      tu.fp8_accum < 0 || tu.fp8_accum > 2)
    return cudaErrorInvalidValue;
  // The SiLU-fused gate|up: BF16 rows of N / 2 activations, the W128x256Fast
  // tile, whole 256-channel tiles of 128 gate + 128 up rows.
  if (tu.silu_gate_up && (!y16 || a.N % 256 != 0 || a.ldy < a.N / 2 ||
                          (tu.tile != kGroupedTcAuto && tu.tile != kGroupedTcW128x256Fast)))
    return cudaErrorInvalidValue;
  if (a.N == 0 || a.M == 0) return cudaSuccess;
  // Exactly one of Y (FP32) and y16 (BF16).
  if (!a.W || !a.w_scale || !a.X || !a.x_scale || !a.Y == !y16 || (!tu.silu_gate_up && a.ldy < a.N) ||
      a.ldy % 2 != 0 ||
      !is_aligned(a.W, 16) || !is_aligned(a.X, 16) || !is_aligned(a.Y, 8) || !is_aligned(y16, 4))
    return cudaErrorInvalidValue;
  int dev = 0;
  DeviceInfo di;
  const cudaError_t e = device_info(dev, di);
  if (e != cudaSuccess) return e;
  // wgmma exists on sm_90 only (this file builds it for the sm_90a target).
  const bool wgmma = di.major == 9;
  int tile = tu.tile;
  if (tu.silu_gate_up) {
    if (!wgmma) return cudaErrorInvalidValue;
    tile = kGroupedTcW128x256Fast;
  }
  if (tile == kGroupedTcAuto) {
    // From grouped_check --sweep on an H200 (GLM-4.7 rank shapes, 20 experts):
    // up to ~32 rows a group the weights are the cost and the mma.sync kernel
    // streams them best; up to 64, 64-row tiles (two CTAs per SM); above,
    // 128 rows x 256 channels.
    const int rows = expected_rows(a);
    if (!wgmma) tile = kGroupedTcM64x128;
    // fp8_accum: the warp-specialized W128x256, 12-30% faster than F128x256
    // on both GLM shapes from 2048 to 16384 rows and ~10% faster than
    // F64x256 at <= 64 rows a group with a short K (down, K 1536: its
    // persistent CTAs hide the per-tile pipeline fill), but ~5% slower there
    // with a long K (gate|up, K 5120), which keeps F64x256.
    else if (tu.fp8_accum) tile = rows <= 64 && a.K > 2048 ? kGroupedTcF64x256
                                  : tu.fp8_accum == 2        ? kGroupedTcW128x256Fast
                                                             : kGroupedTcW128x256;
    else if (rows <= 32) tile = kGroupedTcM64x128;
    else if (rows <= 64) tile = kGroupedTcE64x128;
    else tile = kGroupedTcE128x256;
  }
  const int panel = tu.panel > 0 ? tu.panel : 1;
  if (tile != kGroupedTcM64x128 && !wgmma) return cudaErrorInvalidValue;
  switch (tile) {
    case kGroupedTcE128x256: return launch_grouped<CfgE128x256>(a, y16, panel, st);
    case kGroupedTcE128x128: return launch_grouped<CfgE128x128>(a, y16, panel, st);
    case kGroupedTcE64x128: return launch_grouped<CfgE64x128>(a, y16, panel, st);
    case kGroupedTcF128x256: return launch_grouped<CfgF128x256>(a, y16, panel, st);
    case kGroupedTcF64x256: return launch_grouped<CfgF64x256>(a, y16, panel, st);
    case kGroupedTcM64x128: return launch_grouped<CfgM64x128>(a, y16, panel, st);
    case kGroupedTcW128x256: return launch_ws<CfgW128x256>(a, y16, panel, tu.tile_counter, 0, st);
    case kGroupedTcW128x128: return launch_ws<CfgW128x128>(a, y16, panel, tu.tile_counter, 0, st);
    case kGroupedTcW128x256Fast:
      return launch_ws<CfgW128x256Fast>(a, y16, panel, tu.tile_counter, tu.silu_gate_up ? 1 : 0, st);
    default: return cudaErrorInvalidValue;
  }
}
}  // namespace

cudaError_t gemm_fp8_grouped_tc_tuned(const StreamGemmArgs& a, const GroupedTcTuning& tu, cudaStream_t st) {
  return grouped_tc_dispatch(a, nullptr, tu, st);
}

cudaError_t gemm_fp8_grouped_tc_bf16(const StreamGemmArgs& a, __nv_bfloat16* Y16, const GroupedTcTuning& tu,
                                     cudaStream_t st) {
  if (!Y16) return cudaErrorInvalidValue;
  return grouped_tc_dispatch(a, Y16, tu, st);
}

}  // namespace glmk
