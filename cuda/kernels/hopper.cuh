// hopper.cuh — device helpers shared by the sm_90 tensor-core GEMMs
// (gemm_grouped.cu, gemm_stream_tc.cu): shared-memory addresses, cp.async
// waits, the async-proxy fence, wgmma descriptors and the e4m3 m64n128k32
// instruction, mbarriers, TMA tile loads, the grouped-row tile scheduler, and
// the host-side tensor-map encoder. Everything lives in an anonymous namespace:
// each including file gets its own copy.
#pragma once
#include <atomic>
#include <cstdint>

#include <cudaTypedefs.h>  // CUtensorMap, PFN_cuTensorMapEncodeTiled (no -lcuda: the entry point
                            // comes from the runtime, cudaGetDriverEntryPointByVersion)

#include "common.cuh"

namespace glmk {
namespace {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

// cp.async with a compile-time wait depth.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Shared memory written through the generic proxy (cp.async) and read next by
// the tensor cores through the async proxy (wgmma) needs this fence in each
// writing thread, before the barrier that publishes the data.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define GLMK_HAS_WGMMA 1
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// Shared-memory matrix descriptor of a K-major operand tile of 128-byte rows
// with the 128-byte swizzle: start address >> 4, stride between 8-row core
// groups 1024 bytes, layout type 1 (SWIZZLE_128B). The leading-dimension
// offset is unused for this layout. A K step of 32 bytes inside the 128-byte
// row advances the start address by 32 (the swizzle is applied to the
// computed addresses, so the tile base must be 1024-byte aligned).
__device__ __forceinline__ uint64_t wgmma_desc(uint32_t saddr) {
  return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)(1024 >> 4) << 32) | (1ull << 62);
}
// The same for an MN-major operand (transposed B: rows of 128 bytes along K,
// each 64 16-bit elements of N): 8-row groups along K 1024 bytes apart, and
// N's 64-element swizzle atoms `lbo` bytes apart.
__device__ __forceinline__ uint64_t wgmma_desc_mn(uint32_t saddr, uint32_t lbo) {
  return wgmma_desc(saddr) | ((uint64_t)((lbo & 0x3FFFF) >> 4) << 16);
}

// S[64 x 64] (+)= A[64 x 16] * B[64 x 16]^T, bf16, both K-major from shared
// memory. d[j][e]: the m16n8 accumulator layout per warp (row 16 (warp % 4) +
// g + 8 (e >> 1), column 8j + 2 (lane % 4) + (e & 1)).
__device__ __forceinline__ void wgmma_m64n64k16_bf16_ss(float (&d)[8][4], uint64_t desc_a, uint64_t desc_b,
                                                        int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
      "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),
        "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),
        "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),
        "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// O[64 x 128] += A[64 x 16] * B[16 x 128], bf16: A from registers (the warp's
// 16 rows as the m16n8k16 A fragment), B from shared memory, MN-major
// (TNSP_B 1: transposed, rows along K) or K-major (0: rows along N, e.g. V
// stored transposed as [dims][keys]); d[j][e] as above with 16 column tiles.
template <int TNSP_B>
__device__ __forceinline__ void wgmma_m64n128k16_bf16_rs_impl(float (&d)[16][4], const uint32_t (&a)[4],
                                                              uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
      "}, {%64,%65,%66,%67}, %68, p, 1, 1, %70;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),
        "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),
        "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),
        "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]),
        "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]),
        "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
        "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]),
        "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
        "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1), "n"(TNSP_B));
}

__device__ __forceinline__ void wgmma_m64n128k16_bf16_rs_tb(float (&d)[16][4], const uint32_t (&a)[4],
                                                            uint64_t desc_b) {
  wgmma_m64n128k16_bf16_rs_impl<1>(d, a, desc_b);
}
__device__ __forceinline__ void wgmma_m64n128k16_bf16_rs(float (&d)[16][4], const uint32_t (&a)[4], uint64_t desc_b) {
  wgmma_m64n128k16_bf16_rs_impl<0>(d, a, desc_b);
}

// D[64 x 128] (+)= A[64 x 32] * B[128 x 32]^T, e4m3.
__device__ __forceinline__ void wgmma_m64n128k32_e4m3(float (&d)[64], uint64_t desc_a,
                                                     uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
      "}, %64, %65, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

#if defined(GLMK_HAS_WGMMA)
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\nLAB_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@p bra DONE;\nbra LAB_WAIT;\nDONE:\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
// mbar_arrive where p holds, as one predicated instruction: no branch for
// ptxas to see between asynchronous wgmma chains in flight (a divergent
// branch there makes it serialize them, C7518).
__device__ __forceinline__ void mbar_arrive_if(uint32_t bar, bool p) {
  asm volatile(
      "{\n.reg .pred q;\nsetp.ne.b32 q, %1, 0;\n@q mbarrier.arrive.shared::cta.b64 _, [%0];\n}\n" ::"r"(bar),
      "r"((int)p)
      : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
// Arrives on the barrier once this thread's earlier cp.async copies have landed
// (counts as one of the barrier's expected arrivals).
__device__ __forceinline__ void cp_async_mbar_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}
// tma_load_2d under an L2 policy (l2_policy_stream: weights read once per step).
__device__ __forceinline__ void tma_load_2d_hint(uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                                 uint32_t bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, "
      "{%2, %3}], [%4], %5;" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar), "l"(policy)
      : "memory");
}
__device__ __forceinline__ void named_bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N));
}
#endif

// The m-tile t of the grouped rows: group g (sorted positions [off[g],
// off[g+1])) holds ceil(count / BM) m-tiles, the groups in order. Every warp
// finds it on its own (a warp scan of the tile counts; the offsets of up to
// 256 groups are loaded at once, so 160 experts cost one L2 round trip), so
// the answer is block-uniform without a barrier. Without offsets: one group of
// M rows. Returns false when there are at most t m-tiles.
template <int BM>
__device__ bool find_m_tile(const int* __restrict__ offs, int groups, int M, int t, int& grp,
                            int& row0, int& rows) {
  if (!offs) {
    if ((int64_t)t * BM >= M) return false;
    grp = 0;
    row0 = t * BM;
    rows = min(BM, M - row0);
    return true;
  }
  const int lane = threadIdx.x & 31;
  int seen = 0;  // m-tiles of the groups before g0
  for (int g0 = 0; g0 < groups; g0 += 32 * 8) {
    int lo[8], hi[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int g = g0 + 32 * u + lane;
      lo[u] = g < groups ? offs[g] : 0;
      hi[u] = g < groups ? offs[g + 1] : 0;
    }
    int found = 0, f_src = 0, f_first = 0, f_lo = 0, f_n = 0, f_u = 0;
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      if (found || g0 + 32 * u >= groups) continue;  // warp-uniform
      const int n = hi[u] - lo[u];
      const int tiles = n > 0 ? (n + BM - 1) / BM : 0;
      int s = tiles;  // inclusive scan over the lanes
#pragma unroll
      for (int d = 1; d < 32; d <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, s, d);
        if (lane >= d) s += v;
      }
      const int first = seen + s - tiles;
      const unsigned owner = __ballot_sync(0xffffffffu, t >= first && t < first + tiles);
      if (owner) {
        found = 1;
        f_src = __ffs(owner) - 1;
        f_first = __shfl_sync(0xffffffffu, first, f_src);
        f_lo = __shfl_sync(0xffffffffu, lo[u], f_src);
        f_n = __shfl_sync(0xffffffffu, n, f_src);
        f_u = u;
      }
      seen += __shfl_sync(0xffffffffu, s, 31);
    }
    if (found) {
      const int j = t - f_first;
      grp = g0 + 32 * f_u + f_src;
      row0 = f_lo + j * BM;
      rows = min(BM, f_n - j * BM);
      return true;
    }
  }
  return false;
}

// The m-tiles of the grouped rows (what find_m_tile walks), warp-uniform.
template <int BM>
__device__ int count_m_tiles(const int* __restrict__ offs, int groups, int M) {
  if (!offs) return (M + BM - 1) / BM;
  const int lane = threadIdx.x & 31;
  int s = 0;
  for (int g = lane; g < groups; g += 32) {
    const int n = offs[g + 1] - offs[g];
    s += n > 0 ? (n + BM - 1) / BM : 0;
  }
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) s += __shfl_xor_sync(0xffffffffu, s, d);
  return s;
}

bool is_aligned(const void* p, uintptr_t n) { return ((uintptr_t)p & (n - 1)) == 0; }

// cuTensorMapEncodeTiled through the runtime's driver entry point (the
// library does not link libcuda); null if the driver does not have it.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static std::atomic<int> state{0};  // 0 unknown, 1 found, 2 missing
  static std::atomic<void*> fn{nullptr};
  const int s = state.load(std::memory_order_acquire);
  if (s == 0) {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q);
    if (e != cudaSuccess) (void)cudaGetLastError();  // ours: not left for the caller to see
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess) p = nullptr;
    fn.store(p, std::memory_order_relaxed);
    state.store(p ? 1 : 2, std::memory_order_release);
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }
  return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn.load(std::memory_order_relaxed));
}

// A TMA tensor map over grouped FP8 weights W as one 2-D tensor [groups * N
// rows][K bytes], boxes of box_rows rows x 128 bytes, 128-byte swizzled (the
// layout the wgmma descriptors above read). Rows of a box past a group's N
// belong to the next group or lie past the end (zero-filled). Returns
// cudaErrorInvalidValue when the rows exceed TMA's 32-bit coordinates or the
// encoder refuses, cudaErrorNotSupported without the driver entry point.
// L2 fetches the 128 bytes of each box row it is asked for, not 256: a box
// row is one 128-byte K stage of a weight row, and the next stage's bytes are
// asked for ~0.5 us later. H200 (2026-11-28): stream_tc_check --experts at 64
// tokens + the shared group, down 49.5 -> 47.7 us, gate|up 83.0 -> 80.6; at
// 256 tokens 48.6 -> 46.3, 82.9 -> 81.7; decode steps of 16-64 rows 1.5-2%
// faster, 128-256 unchanged to -0.5%; with the prefill grouped GEMM's map too,
// a 2,048-token TTFT 51.4 -> 51.2 ms.
inline cudaError_t encode_weight_map(CUtensorMap* map, const uint8_t* W, int64_t K, int64_t rows, int box_rows) {
  if (rows + box_rows > 0x7fffffff) return cudaErrorInvalidValue;  // TMA coordinates are 32-bit
  PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (!encode) return cudaErrorNotSupported;
  const cuuint64_t dims[2] = {(cuuint64_t)K, (cuuint64_t)rows};
  const cuuint64_t strides[1] = {(cuuint64_t)K};
  const cuuint32_t box[2] = {128u, (cuuint32_t)box_rows};
  const cuuint32_t estr[2] = {1, 1};
  if (encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<uint8_t*>(W), dims, strides, box, estr,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
    return cudaErrorInvalidValue;
  return cudaSuccess;
}

}  // namespace
}  // namespace glmk
