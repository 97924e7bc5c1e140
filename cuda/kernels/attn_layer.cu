// attn_layer.cu — the attention half of a one-token decode layer in one
// persistent launch (docs/cuda.md "attn_layer_t1"): q|k|v (FP8 weights, FP32
// bias), q/k RMSNorm + RoPE, the new token's K and V into the paged BF16
// cache, split-KV attention over the sequence's keys, the splits' merge, the
// output's FP8 quantization and o_proj into the residual's delta row.
//
// Why: at batch 1 those stages were four launches a layer (q|k|v, rope + KV
// write, attention with its in-launch merge, o_proj; ~24 us on an H100 in
// the step for ~6 us of weight and KV bytes, docs/perf.md 2026-11-28), each
// paying its start, its first loads and its tail. Here one CTA per SM runs
// them all: every CTA requests its share of the q|k|v weights and its
// split's KV lines at once; values pass between CTAs as (launch epoch, value)
// words (handoff.cuh). In isolation on an H100 (attn_layer_check --bench,
// 2026-11-28): 25.2 -> 21.7 us a layer at 2k keys, 33.5 -> 25.6 at 16k.
//
// Work:
//   q|k|v   units of 8 output rows, two units a 16-row mma A tile (units b,
//           b + G of CTA b, ...); the 16 warps split K in 64-byte chunks
//           and their sums are folded in warp order (deterministic).
//   attn    split s < S of the keys in CTA s (S = ceil(ctx / keys per
//           split), keys per split a multiple of 16, at least ctx / G so
//           that S <= G, and up to a tile to keep S <= kA1Splits). Every
//           split CTA polls the q|k|v row, normalises and rotates q and k
//           itself (the rope kernel's float operations), then 8 warps take
//           the 16-key blocks of its keys in shared memory (BF16, K and V
//           of every KV head of a key, 64 KB tiles) on tensor cores with
//           attention_decode's fragments and arithmetic: q rounded to BF16
//           after scale * log2(e), online softmax in the log2 domain, P in
//           BF16 for P.V; the warps' states are merged in shared memory in
//           warp order. The CTA holding the new token's key takes its K and
//           V from its own q|k|v row (and writes them to the cache).
//   merge   (head, 32 dims) jobs on the last CTAs, one round of polls: m, l
//           and o of every split, weights exp2(m_s - max), the normalised 32
//           dims published.
//   o_proj  every CTA polls the 1 x (heads * 128) output, quantizes it (per
//           row, as the decode kernel's FP8 output), and finishes its o_proj
//           units (8 rows each, two a tile) with the weights it requested
//           once its attention work was done: delta[n] = (acc * x_scale) *
//           w_scale[n].
// Numerics: the GEMMs' products are those of the streaming kernels summed in
// another order; the attention's those of attention_decode over other
// splits. Results match the kernel chain to FP32 rounding, the attention row
// to ~1e-3 (P's BF16 rounding against another running max), and the
// occasional FP8 code of the output one step away.
#include "common.cuh"
#include "handoff.cuh"

namespace glmk {
namespace {

constexpr int kA1Threads = 512;
constexpr int kA1Warps = kA1Threads / 32;
constexpr int kA1D = 128;
constexpr int kA1MaxQHeads = 16;
constexpr int kA1TileBytes = 64 * 1024;  // one KV tile in shared memory
constexpr int kA1AttnWarps = 8;          // warps with a 16-key block of a tile (KT * nkv / 16)
constexpr int kA1OStride = 132;          // floats a staged O row (padded against bank conflicts)
// The KV region: a tile, or the attention warps' O rows staged for their merge.
constexpr int kA1KvBytes = kA1TileBytes > kA1AttnWarps * 16 * kA1OStride * 4 ? kA1TileBytes
                                                                             : kA1AttnWarps * 16 * kA1OStride * 4;
constexpr int kA1SplitRound = 16;        // keys per split: a multiple of this
// Splits the keys go to while each holds at most one tile (and at least
// ceil(keys / CTAs) keys). Fewer, longer splits cost a split CTA nothing up
// to a tile (its 8 warps take 16-key blocks in parallel) and make the
// merge's hand-off shorter (fewer producers and polls). H200, batch-1 decode
// step, rank share (docs/perf.md 2026-11-28 tenth session, three alternations,
// ms; 16 keys a split or more before, i.e. 64-128 splits): 1k 4.73 -> 4.68,
// 2k 4.80 -> 4.68, 4k / 8k / 16k unchanged (32 splits: 1k 4.66, 2k 4.70, 4k
// 4.84; 64: 4.72 / 4.74 / 4.80); in a second call 2k 4.84 -> 4.77, 4k 4.92 ->
// 4.85.
constexpr int kA1Splits = 48;
constexpr int kA1MaxOTiles = 4;          // o_proj tiles one round holds
constexpr size_t kA1HeaderBytes = 256;
enum { kA1Done = 0, kA1Epoch = 1 };
constexpr float kA1Log2e = 1.4426950408889634f;
constexpr float kA1Fp8MinScale = 5.9604645e-8f;  // 2^-24, the rope kernel's FP8 write's floor
// The FP8 cache: one block of one KV head as copied, 16-byte chunks: K codes
// (2 KB), V codes (2 KB, transposed), 16 K scales, 16 V scales.
constexpr int kA1F8UnitBytes = 2 * 2048 + 2 * 64;
constexpr int kA1F8UnitChunks = kA1F8UnitBytes / 16;
// Shared memory up to the FP8 staging (16-byte aligned).
__host__ __device__ inline int a1_raw_offset(int H, int nq, int nkv) {
  return (((H + 15) & ~15) + kA1KvBytes + (nq + 2 * nkv) * kA1D * 4 + nq * kA1D + 15) & ~15;
}

struct A1Shared {
  float red[kA1MaxOTiles][kA1Warps][16];
  float scratch[32];
  float wm[kA1AttnWarps][16], wl[kA1AttnWarps][16];  // the attention warps' (m, l) per row
  float cs[64], sn[64];
  float4 mo[kA1Warps][8];  // the merge: each warp's sum of 32 dims
  float ml[kA1Warps];      // ... and of l
  float x_scale, o_scale;
};

// Workspace (after the header), 8-byte tagged words: the q|k|v row, the
// splits' unnormalised outputs [G][nq][128], the merged output [nq][128],
// the splits' (m, l) [G][nq][2].
struct A1Ws {
  unsigned long long *qkv, *po, *o, *ml;
};
__host__ __device__ inline A1Ws a1_ws(void* base, int nq, int nkv, int ctas) {
  A1Ws w;
  w.qkv = reinterpret_cast<unsigned long long*>(static_cast<char*>(base) + kA1HeaderBytes);
  w.po = w.qkv + (size_t)(nq + 2 * nkv) * kA1D;
  w.o = w.po + (size_t)ctas * nq * kA1D;
  w.ml = w.o + (size_t)nq * kA1D;
  return w;
}

__device__ __forceinline__ float bf16_round(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

// The SM's clock next to T1_MARK(i) (benches: cycles against nanoseconds).
#define A1_CLK(i)                                                                \
  do {                                                                           \
    if (a.trace && threadIdx.x == 0) a.trace[(11 + (i)) * gridDim.x + blockIdx.x] = clock64(); \
  } while (0)

// Shared-memory byte offset of 16-byte chunk c of KV row r (a key's one KV
// head, 256 bytes): XOR-swizzled so that threads reading the same chunk of
// consecutive rows hit different banks.
__device__ __forceinline__ int a1_chunk(int r, int c) { return r * 256 + ((c ^ (r & 7)) << 4); }

// This lane's weights of a 16-row mma A tile: rows g of unit ua (8 rows of K
// bytes) into ra and of unit ua + du into rb (du 0: no such unit, zeros),
// 64-byte chunks j = warp + i * 16 < nch, streamed (L2 evict-first).
template <int N>
__device__ __forceinline__ void a1_load_tile(uint4 (&ra)[N], uint4 (&rb)[N], const uint8_t* W, int K, int ua, int du,
                                             int nch, uint64_t pol) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint8_t* pa = W + ((int64_t)ua * 8 + (lane >> 2)) * K + 16 * (lane & 3);
  const uint8_t* pb = pa + (int64_t)du * 8 * K;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const int j = warp + i * kA1Warps;
    if (j < nch) {
      ra[i] = ld_stream_v4(pa + 64 * j, pol);
      rb[i] = du ? ld_stream_v4(pb + 64 * j, pol) : make_uint4(0, 0, 0, 0);
    }
  }
}

template <int NQ, int NO, int OT>
__global__ void __launch_bounds__(kA1Threads, 1) attn_t1_kernel(AttnT1Args a) {
  T1_MARK(0); A1_CLK(0);
  extern __shared__ __align__(16) unsigned char dsm[];
  __shared__ A1Shared sh;
  const int H = a.H, nq = a.n_q_heads, nkv = a.n_kv_heads, Gq = nq / nkv;
  const int n_qkv = (nq + 2 * nkv) * kA1D;
  const int KO = nq * kA1D;  // o_proj's K
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, c = lane & 3;
  const int G = gridDim.x, b = blockIdx.x;
  const int KT = kA1TileBytes / (nkv * 2 * 256);  // keys per tile
  uint8_t* xq_s = dsm;                                                   // [H] FP8 input row
  unsigned char* kv_s = dsm + ((H + 15) & ~15);                          // [KT][nkv] K rows, then V rows
  float* qkv_s = reinterpret_cast<float*>(kv_s + kA1KvBytes);           // [n_qkv]
  uint8_t* oq_s = reinterpret_cast<uint8_t*>(qkv_s + n_qkv);             // [KO] FP8 attention output
  // The FP8 cache: a tile's blocks as copied, [KT / 16][nkv] units of
  // kA1F8UnitBytes (K codes, V codes, K scales, V scales).
  const bool f8 = a.k_cache8 != nullptr;
  unsigned char* raw_s = dsm + a1_raw_offset(H, nq, nkv);
  int* cnt = static_cast<int*>(a.workspace);
  const A1Ws ws = a1_ws(a.workspace, nq, nkv, a.ws_ctas);
  const unsigned epoch = (unsigned)__ldcg(cnt + kA1Epoch) + 1u;
  const uint64_t wpol = l2_policy_stream();

  // ---- the split of the keys (the same in every CTA)
  const int ctx = a.ctx_len[0];  // keys, the new token's (ctx - 1) included
  // A row without keys (ctx_len 0: a padding row, as attention_decode takes
  // them) has no split; its output row is zeros (the merge's L is 0).
  auto round_up = [](int k) { return max(kA1SplitRound, (k + kA1SplitRound - 1) / kA1SplitRound * kA1SplitRound); };
  const int kps = max(round_up((ctx + G - 1) / G), min(KT, round_up((ctx + kA1Splits - 1) / kA1Splits)));
  const int S = ctx > 0 ? (ctx + kps - 1) / kps : 0;
  const bool split_cta = b < S;
  const int k0 = b * kps, k1 = min(ctx, k0 + kps);
  const int* bt = a.block_tables + a.bt_offset[0];
  const int bs = a.block_size;
  // Copies keys [t0, t0 + nt) of this split (those in the cache: < ctx - 1)
  // into kv_s; rows r * nkv + h, K rows first, V rows KT * nkv rows later.
  // Rows past nt up to the 16-key block's end are zeroed (the mma reads
  // them; P is 0 there, and 0 x a stale NaN would not be).
  auto kv_issue = [&](int t0, int nt) {
    if (f8) {  // whole blocks (t0 is a multiple of 16), the new token's stale slot included
      const int units = ((nt + 15) >> 4) * nkv;
      const uint32_t rb = (uint32_t)__cvta_generic_to_shared(raw_s);
      for (int i = tid; i < units * kA1F8UnitChunks; i += kA1Threads) {
        const int u = i / kA1F8UnitChunks, ch = i - u * kA1F8UnitChunks;
        const int j = u / nkv, h = u - j * nkv;
        const int64_t bh = (int64_t)bt[(t0 >> 4) + j] * nkv + h;
        const void* src = ch < 128   ? (const void*)(a.k_cache8 + bh * 2048 + ch * 16)
                          : ch < 256 ? (const void*)(a.v_cache8 + bh * 2048 + (ch - 128) * 16)
                          : ch < 260 ? (const void*)(a.k_scale + bh * 16 + (ch - 256) * 4)
                                     : (const void*)(a.v_scale + bh * 16 + (ch - 260) * 4);
        cp_async_cg16(rb + u * kA1F8UnitBytes + ch * 16, src, 0);
      }
      cp_async_commit();
      return;
    }
    const int n = ((nt + 15) & ~15) * nkv * 16;  // 16-byte chunks of K (and as many of V)
    const uint32_t base = (uint32_t)__cvta_generic_to_shared(kv_s);
    for (int i = tid; i < n; i += kA1Threads) {
      const int ch = i & 15, rr = i >> 4, r = rr / nkv, h = rr - r * nkv;
      const int key = t0 + r;
      if (r >= nt) {
        *reinterpret_cast<uint4*>(kv_s + a1_chunk(rr, ch)) = make_uint4(0, 0, 0, 0);
        *reinterpret_cast<uint4*>(kv_s + KT * nkv * 256 + a1_chunk(rr, ch)) = make_uint4(0, 0, 0, 0);
        continue;
      }
      if (key >= ctx - 1) continue;
      const int64_t off = (((int64_t)bt[key / bs] * nkv + h) * bs + key % bs) * kA1D + ch * 8;
      cp_async_cg16(base + a1_chunk(rr, ch), a.k_cache + off, 0);
      cp_async_cg16(base + KT * nkv * 256 + a1_chunk(rr, ch), a.v_cache + off, 0);
    }
    cp_async_commit();
  };
  if (split_cta) kv_issue(k0, min(KT, k1 - k0));
  // What the split's q/k norm + RoPE needs from memory, now (its loads
  // would otherwise wait behind the weight stream): the angles, the norm
  // weights of this lane's 4 dims.
  const int half = a.rot_dim / 2;
  float4 qn_w = make_float4(1.f, 1.f, 1.f, 1.f), kn_w = qn_w;
  if (split_cta) {
    const int pos = a.positions[0];
    for (int j = tid; j < half; j += kA1Threads) {
      float s_, c_;
      sincosf((float)pos * a.inv_freq[j], &s_, &c_);
      sh.sn[j] = s_;
      sh.cs[j] = c_;
    }
    if (a.q_norm) qn_w = reinterpret_cast<const float4*>(a.q_norm)[lane];
    if (a.k_norm) kn_w = reinterpret_cast<const float4*>(a.k_norm)[lane];
  }

  // ---- the input row into shared memory, the q|k|v weights of the first tile
  {
    const uint4* x4 = reinterpret_cast<const uint4*>(a.xq);
    for (int i = tid; i < H / 16; i += kA1Threads) reinterpret_cast<uint4*>(xq_s)[i] = __ldcg(x4 + i);
    if (tid == 0) sh.x_scale = __ldcg(a.xs);
  }
  const int q_units = n_qkv / 8, q_ch = H / 64;
  const int my_q_units = q_units > b ? (q_units - b + G - 1) / G : 0;
  uint4 qa[NQ], qb[NQ];
  auto q_load = [&](int tile) {
    const int ua = b + 2 * tile * G;
    a1_load_tile(qa, qb, a.qkv_w, H, ua, ua + G < q_units ? G : 0, q_ch, wpol);
  };
  const int q_tiles = (my_q_units + 1) / 2;
  if (q_tiles > 0) q_load(0);
  __syncthreads();  // xq_s

  // ---- q|k|v: per tile, mma, fold the warps' sums, publish the rows.
  const float xs = sh.x_scale;
  for (int tile = 0; tile < q_tiles; ++tile) {
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int i = 0; i < NQ; ++i) {
      const int j = warp + i * kA1Warps;
      if (j < q_ch) t1_mma_chunk(acc, qa[i], qb[i], *reinterpret_cast<const uint4*>(xq_s + 64 * j + 16 * c));
    }
    if (tile + 1 < q_tiles) q_load(tile + 1);
    if (c == 0) {
      sh.red[0][warp][g] = acc[0];
      sh.red[0][warp][8 + g] = acc[2];
    }
    __syncthreads();
    if (tid < 16) {
      const int u = b + (2 * tile + (tid >> 3)) * G;
      if (u < q_units) {
        float v = 0.f;
#pragma unroll
        for (int w = 0; w < kA1Warps; ++w) v += sh.red[0][w][tid];  // warp order
        const int n = u * 8 + (tid & 7);
        float y = __fmul_rn(__fmul_rn(v, xs), __ldg(a.qkv_scale + n));
        if (a.qkv_bias) y = __fadd_rn(y, __ldg(a.qkv_bias + n));
        ws.qkv[n] = t1_tag(epoch, y);
      }
    }
    __syncthreads();  // red reuse
  }
  T1_MARK(1); A1_CLK(1);

  // ---- o_proj: this CTA's units b, b + G, ... (two a tile). Their weights
  // go into registers once this CTA's attention work is done (split out,
  // or merged), at once in the others. Measured on an H100 (attn_layer_check
  // --bench, 2k keys): requested before the q|k|v poll they held the SM's
  // outstanding requests and the poll waited 3 us behind them; requested
  // right after it, 24.7 against 22.8 us a layer (they slowed the split's
  // arithmetic and held 48 registers through it); prefetched into L2 after
  // q|k|v they slowed the q|k|v stream of the CTAs still in it. Without any
  // o_proj loads at all the launch took 21.1 us: the rest is the hand-offs.
  const int o_units = H / 8, o_ch = KO / 64;
  const int my_o_units = o_units > b ? (o_units - b + G - 1) / G : 0;
  const int o_tiles = (my_o_units + 1) / 2;
  uint4 oa[OT][NO], ob[OT][NO];
  auto o_load = [&](int t0) {
#pragma unroll
    for (int t = 0; t < OT; ++t) {
      const int tile = t0 + t;
      if (tile >= o_tiles) break;
      const int ua = b + 2 * tile * G;
      a1_load_tile(oa[t], ob[t], a.o_w, KO, ua, ua + G < o_units ? G : 0, o_ch, wpol);
    }
  };

  // ---- attention over this CTA's split
  if (split_cta) {
    const int slot = a.slots[0];
    for (int i = tid; i < n_qkv / 4; i += kA1Threads)
      reinterpret_cast<float4*>(qkv_s)[i] = t1_poll4(ws.qkv + 4 * i, epoch);
    __syncthreads();
    T1_MARK(2); A1_CLK(2);

    // q and k heads: RMSNorm + RoPE (qk_rope_kernel's operations), one warp
    // a head; q then scaled to log2 units and rounded to BF16, k and v
    // rounded to BF16 (what the cache holds).
    const float qsc = a.scale * kA1Log2e;
    for (int hd = warp; hd < nq + 2 * nkv; hd += kA1Warps) {
      float4 v = reinterpret_cast<float4*>(qkv_s + hd * kA1D)[lane];
      const bool is_q = hd < nq, is_k = !is_q && hd < nq + nkv;
      if (is_q || is_k) {
        if (is_q ? a.q_norm != nullptr : a.k_norm != nullptr) v = head_rmsnorm(v, is_q ? qn_w : kn_w, a.eps);
        v = head_rope(v, lane, half, sh.cs, sh.sn);
      }
      if (is_q) {
        v = make_float4(bf16_round(v.x * qsc), bf16_round(v.y * qsc), bf16_round(v.z * qsc), bf16_round(v.w * qsc));
      } else if (f8) {
        // The FP8 cache: the row's scale and codes as the rope kernel's FP8
        // write makes them; attended as code * scale (what the cache holds).
        float am = absmax4(v);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, o));
        const float s = fmaxf(am / 448.0f, kA1Fp8MinScale);
        const uint32_t codes = pack_e4m3x4(v, 1.0f / s);
        const float4 f = e4m3x4_to_f32(codes);
        v = make_float4(f.x * s, f.y * s, f.z * s, f.w * s);
        if (b == S - 1 && slot >= 0) {
          const int kvh = is_k ? hd - nq : hd - nq - nkv;
          const int64_t bh = (int64_t)(slot / bs) * nkv + kvh;
          const int off = slot % bs;
          if (is_k) {
            reinterpret_cast<uint32_t*>(a.k_cache8 + bh * 2048 + off * kA1D)[lane] = codes;
          } else {
#pragma unroll
            for (int i = 0; i < 4; ++i) a.v_cache8[bh * 2048 + (lane * 4 + i) * 16 + off] = (uint8_t)(codes >> (8 * i));
          }
          if (lane == 0) (is_k ? a.k_scale : a.v_scale)[bh * 16 + off] = s;
        }
      } else {
        v = make_float4(bf16_round(v.x), bf16_round(v.y), bf16_round(v.z), bf16_round(v.w));
        // The new token's K / V into the cache, by the CTA that holds its key.
        if (b == S - 1 && slot >= 0) {
          const int kvh = is_k ? hd - nq : hd - nq - nkv;
          const int64_t elem = (((int64_t)(slot / bs) * nkv + kvh) * bs + slot % bs) * kA1D + lane * 4;
          __nv_bfloat16* dst = (is_k ? a.k_cache : a.v_cache) + elem;
          reinterpret_cast<__nv_bfloat162*>(dst)[0] = __floats2bfloat162_rn(v.x, v.y);
          reinterpret_cast<__nv_bfloat162*>(dst)[1] = __floats2bfloat162_rn(v.z, v.w);
        }
      }
      reinterpret_cast<float4*>(qkv_s + hd * kA1D)[lane] = v;
    }
    T1_MARK(3); A1_CLK(3);
    // Tensor cores: warp w < 8 takes KV head w % nkv and the 16-key block
    // w / nkv of every tile (KT * nkv = 128 rows: 8 blocks), the heads of
    // that KV head as the 16 rows of the A operand (zero past G), with its
    // own online softmax: S = Q K^T (8 k-steps x 2 n-tiles of m16n8k16),
    // P = 2^(S - m), O += P(bf16) V (16 n-tiles) — attention_decode's
    // fragments and arithmetic. Then the warps' states are merged in shared
    // memory in a fixed order.
    const bool aw = warp < kA1AttnWarps;
    const int kvh = warp % nkv, kb = (warp / nkv) * 16;
    const int t = c;  // the fragment's column pair
    float o[16][4];
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;  // rows g, g + 8
#pragma unroll
    for (int i = 0; i < 16; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    __syncthreads();  // q, k, v normalised
    // Q's A fragment of k-step kk (dims 16kk..16kk+15), rows = the heads of
    // KV head kvh, from the BF16-rounded FP32 row in shared memory: built per
    // k-step rather than held (32 registers more spilled the warp's state).
    auto q_frag = [&](int kk, uint32_t (&qa)[4]) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
#pragma unroll
        for (int cc = 0; cc < 2; ++cc) {
          const int r = g + 8 * hh;
          float2 v = make_float2(0.f, 0.f);
          if (r < Gq) v = *reinterpret_cast<const float2*>(qkv_s + (kvh * Gq + r) * kA1D + kk * 16 + 8 * cc + 2 * t);
          qa[hh + 2 * cc] = pack_bf16(v.x, v.y);
        }
    };
    const uint32_t kvb = (uint32_t)__cvta_generic_to_shared(kv_s);
    const uint32_t vofs = (uint32_t)(KT * nkv * 256);
    for (int t0 = k0; t0 < k1; t0 += KT) {
      const int nt = min(KT, k1 - t0);
      if (t0 > k0) {
        __syncthreads();  // the previous tile's reads
        kv_issue(t0, nt);
      }
      cp_async_wait_pending(0);
      __syncthreads();  // every thread's copies and zero rows
      if (f8) {
        // Widen the copied blocks into the BF16 tile (code * scale); rows
        // past nt up to the block's end zero. K: consecutive threads on a
        // key's consecutive chunks (8-byte reads of one row); V: on
        // consecutive keys of a chunk (its byte reads, 16 bytes apart by dim,
        // then fall in a few words rather than all in one bank).
        const int n = ((nt + 15) & ~15) * nkv * 16;
        for (int i = tid; i < n; i += kA1Threads) {
          const int ch = i & 15, rr = i >> 4, r = rr / nkv, h = rr - r * nkv;
          const unsigned char* u = raw_s + ((r >> 4) * nkv + h) * kA1F8UnitBytes;
          const int o = r & 15;
          uint4 kw = make_uint4(0, 0, 0, 0);
          if (r < nt) {
            const float ks = reinterpret_cast<const float*>(u + 4096)[o];
            const uint2 kc = *reinterpret_cast<const uint2*>(u + o * kA1D + ch * 8);
            const float4 k0 = e4m3x4_to_f32(kc.x), k1 = e4m3x4_to_f32(kc.y);
            kw = make_uint4(pack_bf16(k0.x * ks, k0.y * ks), pack_bf16(k0.z * ks, k0.w * ks),
                            pack_bf16(k1.x * ks, k1.y * ks), pack_bf16(k1.z * ks, k1.w * ks));
          }
          *reinterpret_cast<uint4*>(kv_s + a1_chunk(rr, ch)) = kw;
        }
        for (int i = tid; i < n; i += kA1Threads) {
          // i = ((block * nkv + h) * 16 + ch) * 16 + o: 16 keys of one chunk in a row of threads
          const int o = i & 15, ch = (i >> 4) & 15, bh = i >> 8, blk = bh / nkv, h = bh - blk * nkv;
          const int r = blk * 16 + o, rr = r * nkv + h;
          const unsigned char* u = raw_s + bh * kA1F8UnitBytes;
          uint4 vw = make_uint4(0, 0, 0, 0);
          if (r < nt) {
            const float vs = reinterpret_cast<const float*>(u + 4096 + 64)[o];
            uint32_t vc[2] = {0u, 0u};
#pragma unroll
            for (int d = 0; d < 8; ++d) vc[d >> 2] |= (uint32_t)u[2048 + (ch * 8 + d) * 16 + o] << (8 * (d & 3));
            const float4 v0 = e4m3x4_to_f32(vc[0]), v1 = e4m3x4_to_f32(vc[1]);
            vw = make_uint4(pack_bf16(v0.x * vs, v0.y * vs), pack_bf16(v0.z * vs, v0.w * vs),
                            pack_bf16(v1.x * vs, v1.y * vs), pack_bf16(v1.z * vs, v1.w * vs));
          }
          *reinterpret_cast<uint4*>(kv_s + KT * nkv * 256 + a1_chunk(rr, ch)) = vw;
        }
        __syncthreads();
      }
      // The new token's key from the q|k|v row (BF16 values, as cached).
      if (ctx - 1 >= t0 && ctx - 1 < t0 + nt) {
        const int r = ctx - 1 - t0;
        for (int i = tid; i < nkv * 32; i += kA1Threads) {
          const int h = i >> 5, q = i & 31;  // 4 dims 4q..4q+3 of KV head h
          const float4 kf = reinterpret_cast<const float4*>(qkv_s + (nq + h) * kA1D)[q];
          const float4 vf = reinterpret_cast<const float4*>(qkv_s + (nq + nkv + h) * kA1D)[q];
          const int rr = r * nkv + h;
          const int off = a1_chunk(rr, q >> 1) + (q & 1) * 8;
          __nv_bfloat162* kd = reinterpret_cast<__nv_bfloat162*>(kv_s + off);
          __nv_bfloat162* vd = reinterpret_cast<__nv_bfloat162*>(kv_s + vofs + off);
          kd[0] = __floats2bfloat162_rn(kf.x, kf.y);
          kd[1] = __floats2bfloat162_rn(kf.z, kf.w);
          vd[0] = __floats2bfloat162_rn(vf.x, vf.y);
          vd[1] = __floats2bfloat162_rn(vf.z, vf.w);
        }
        __syncthreads();
      }
      if (aw && kb < nt) {
        float s0[4] = {0.f, 0.f, 0.f, 0.f}, s1[4] = {0.f, 0.f, 0.f, 0.f};
        {
          const int krow = (kb + ((lane >> 4) << 3) + (lane & 7)) * nkv + kvh;
#pragma unroll
          for (int kk = 0; kk < 8; ++kk) {
            const int ch = 2 * kk + ((lane >> 3) & 1);
            uint32_t b0, b1, b2, b3, qa[4];
            ldsm_x4(kvb + krow * 256 + ((ch ^ (krow & 7)) << 4), b0, b1, b2, b3);
            q_frag(kk, qa);
            mma_bf16_16816(s0, qa, b0, b1);
            mma_bf16_16816(s1, qa, b2, b3);
          }
        }
        uint32_t pa[4];
        attn_block_softmax(s0, s1, min(16, nt - kb), t, m0, m1, l0, l1, o, pa);
        const int vrow = (kb + (((lane >> 3) & 1) << 3) + (lane & 7)) * nkv + kvh;
#pragma unroll
        for (int nd2 = 0; nd2 < 8; ++nd2) {
          const int ch = 2 * nd2 + (lane >> 4);
          uint32_t b0, b1, b2, b3;
          ldsm_x4_trans(kvb + vofs + vrow * 256 + ((ch ^ (vrow & 7)) << 4), b0, b1, b2, b3);
          mma_bf16_16816(o[2 * nd2], pa, b0, b1);
          mma_bf16_16816(o[2 * nd2 + 1], pa, b2, b3);
        }
      }
    }
    T1_MARK(4); A1_CLK(4);
    // The warps' states -> this split's partial: per head row, m = the
    // warps' max, l and O their sums weighted 2^(m_w - m), in warp order.
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    __syncthreads();  // every warp is done with the tile: kv_s stages O
    float* ost = reinterpret_cast<float*>(kv_s);  // [warp][16 rows][kA1OStride]
    if (aw) {
      if (t == 0) {
        sh.wm[warp][g] = m0;
        sh.wm[warp][g + 8] = m1;
        sh.wl[warp][g] = l0;
        sh.wl[warp][g + 8] = l1;
      }
      float* ow = ost + warp * 16 * kA1OStride;
#pragma unroll
      for (int nd = 0; nd < 16; ++nd) {
        *reinterpret_cast<float2*>(ow + g * kA1OStride + nd * 8 + 2 * t) = make_float2(o[nd][0], o[nd][1]);
        *reinterpret_cast<float2*>(ow + (g + 8) * kA1OStride + nd * 8 + 2 * t) = make_float2(o[nd][2], o[nd][3]);
      }
    }
    __syncthreads();
    if (tid < nq * 32) {
      const int hq = tid >> 5, kh = hq / Gq, r = hq - kh * Gq, nw = kA1AttnWarps / nkv;
      float M = -INFINITY;
      for (int j = 0; j < nw; ++j) M = fmaxf(M, sh.wm[kh + nkv * j][r]);
      float L = 0.f;
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int j = 0; j < nw; ++j) {  // warp order
        const int w = kh + nkv * j;
        const float mw = sh.wm[w][r];
        const float f = mw == -INFINITY ? 0.f : ex2(mw - M);  // a warp without keys: weight 0
        L += sh.wl[w][r] * f;
        const float4 v = *reinterpret_cast<const float4*>(ost + (w * 16 + r) * kA1OStride + 4 * lane);
        acc.x += f * v.x;
        acc.y += f * v.y;
        acc.z += f * v.z;
        acc.w += f * v.w;
      }
      ulonglong2* dst = reinterpret_cast<ulonglong2*>(ws.po + ((size_t)b * nq + hq) * kA1D + 4 * lane);
      dst[0] = make_ulonglong2(t1_tag(epoch, acc.x), t1_tag(epoch, acc.y));
      dst[1] = make_ulonglong2(t1_tag(epoch, acc.z), t1_tag(epoch, acc.w));
      if (lane == 0)
        *reinterpret_cast<ulonglong2*>(ws.ml + ((size_t)b * nq + hq) * 2) =
            make_ulonglong2(t1_tag(epoch, M), t1_tag(epoch, L));
    }
    T1_MARK(5); A1_CLK(5);
  }
  const int job = G - 1 - b;  // the merge's job of this CTA (below)
  if (job >= nq * 4) o_load(0);

  // ---- the merge: job (head, 32 dims) on CTA G - 1 - job, in one round of
  // polls: thread (split group sg, float4 f) merges splits sg, sg + 64, ...
  // online, then the groups are folded (max, rescale, a fixed tree).
  if (job < nq * 4) {
    const int h = job >> 2, d0 = (job & 3) * 32;
    const int f = tid & 7, sg = tid >> 3;
    constexpr int kGroups = kA1Threads / 8, kR = 3;
    float m_t = -INFINITY, l_t = 0.f;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s0 = sg; s0 < S; s0 += kGroups * kR) {
      unsigned long long w[kR][6];
      for (;;) {
        bool ready = true;
#pragma unroll
        for (int r = 0; r < kR; ++r) {
          const int s = s0 + kGroups * r;
          if (s >= S) break;
          const unsigned long long* pm = ws.ml + ((size_t)s * nq + h) * 2;
          const unsigned long long* po = ws.po + ((size_t)s * nq + h) * kA1D + d0 + 4 * f;
          asm volatile("ld.relaxed.gpu.global.v2.b64 {%0, %1}, [%2];" : "=l"(w[r][0]), "=l"(w[r][1]) : "l"(pm) : "memory");
          asm volatile("ld.relaxed.gpu.global.v2.b64 {%0, %1}, [%2];" : "=l"(w[r][2]), "=l"(w[r][3]) : "l"(po) : "memory");
          asm volatile("ld.relaxed.gpu.global.v2.b64 {%0, %1}, [%2];" : "=l"(w[r][4]), "=l"(w[r][5]) : "l"(po + 2) : "memory");
        }
#pragma unroll
        for (int r = 0; r < kR; ++r) {
          if (s0 + kGroups * r >= S) break;
#pragma unroll
          for (int k = 0; k < 6; ++k) ready = ready && (unsigned)(w[r][k] >> 32) == epoch;
        }
        if (ready) break;
      }
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        if (s0 + kGroups * r >= S) break;
        const float m = __uint_as_float((unsigned)w[r][0]), l = __uint_as_float((unsigned)w[r][1]);
        const float mn = fmaxf(m_t, m), ao = exp2f(m_t - mn), an = exp2f(m - mn);
        l_t = l_t * ao + l * an;
        acc.x = acc.x * ao + an * __uint_as_float((unsigned)w[r][2]);
        acc.y = acc.y * ao + an * __uint_as_float((unsigned)w[r][3]);
        acc.z = acc.z * ao + an * __uint_as_float((unsigned)w[r][4]);
        acc.w = acc.w * ao + an * __uint_as_float((unsigned)w[r][5]);
        m_t = mn;
      }
    }
    T1_MARK(6); A1_CLK(6);
    const float M = block_reduce(m_t, sh.scratch, MaxOp());
    const float sc = m_t == -INFINITY ? 0.f : exp2f(m_t - M);
    float l = l_t * sc;
    acc = make_float4(acc.x * sc, acc.y * sc, acc.z * sc, acc.w * sc);
#pragma unroll
    for (int o = 8; o < 32; o <<= 1) {  // the warp's 4 split groups (lane bits 3, 4)
      acc.x += __shfl_xor_sync(0xffffffffu, acc.x, o);
      acc.y += __shfl_xor_sync(0xffffffffu, acc.y, o);
      acc.z += __shfl_xor_sync(0xffffffffu, acc.z, o);
      acc.w += __shfl_xor_sync(0xffffffffu, acc.w, o);
      l += __shfl_xor_sync(0xffffffffu, l, o);
    }
    if (lane < 8) sh.mo[warp][lane] = acc;
    if (lane == 0) sh.ml[warp] = l;
    __syncthreads();
    if (tid < 8) {
      float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
      float L = 0.f;
#pragma unroll
      for (int w = 0; w < kA1Warps; ++w) {  // warp order
        const float4 v = sh.mo[w][tid];
        o.x += v.x;
        o.y += v.y;
        o.z += v.z;
        o.w += v.w;
        L += sh.ml[w];
      }
      const float il = L > 0.f ? 1.0f / L : 0.f;  // no keys: zeros
      unsigned long long* dst = ws.o + h * kA1D + d0 + 4 * tid;
      reinterpret_cast<ulonglong2*>(dst)[0] = make_ulonglong2(t1_tag(epoch, o.x * il), t1_tag(epoch, o.y * il));
      reinterpret_cast<ulonglong2*>(dst)[1] = make_ulonglong2(t1_tag(epoch, o.z * il), t1_tag(epoch, o.w * il));
    }
    T1_MARK(7); A1_CLK(7);
  }

  if (job < nq * 4) o_load(0);
  T1_MARK(8); A1_CLK(8);

  // ---- the attention output, quantized (per row, the decode kernel's FP8
  // output), then o_proj.
  {
    float amax = 0.f;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (tid < KO / 4) {
      v = t1_poll4(ws.o + 4 * tid, epoch);
      amax = t1_amax4(v);
    }
    amax = block_reduce(amax, sh.scratch, MaxOp());
    const float s = fmaxf(amax / kFp8Max, kMinActScale);
    if (tid < KO / 4) reinterpret_cast<uint32_t*>(oq_s)[tid] = pack_e4m3x4(v, 1.0f / s);
    if (tid == 0) sh.o_scale = s;
    __syncthreads();
  }
  T1_MARK(9); A1_CLK(9);
  const float os = sh.o_scale;
  for (int t0 = 0; t0 < o_tiles; t0 += OT) {
    if (t0 > 0) o_load(t0);
    float acc[OT][4];
#pragma unroll
    for (int t = 0; t < OT; ++t) {
      acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.f;
      if (t0 + t >= o_tiles) continue;
#pragma unroll
      for (int i = 0; i < NO; ++i) {
        const int j = warp + i * kA1Warps;
        if (j < o_ch) t1_mma_chunk(acc[t], oa[t][i], ob[t][i], *reinterpret_cast<const uint4*>(oq_s + 64 * j + 16 * c));
      }
    }
    if (c == 0) {
#pragma unroll
      for (int t = 0; t < OT; ++t) {
        sh.red[t][warp][g] = acc[t][0];
        sh.red[t][warp][8 + g] = acc[t][2];
      }
    }
    __syncthreads();
    if (tid < OT * 16) {
      const int t = tid >> 4, r = tid & 15;
      const int u = b + (2 * (t0 + t) + (r >> 3)) * G;
      if (t0 + t < o_tiles && u < o_units) {
        float v = 0.f;
#pragma unroll
        for (int w = 0; w < kA1Warps; ++w) v += sh.red[t][w][r];  // warp order
        const int n = u * 8 + (r & 7);
        a.delta[n] = __fmul_rn(__fmul_rn(v, os), __ldg(a.o_scale + n));
      }
    }
    __syncthreads();  // red reuse
  }
  T1_MARK(10); A1_CLK(10);

  // ---- the last CTA to finish advances the epoch for the next launch.
  if (tid == 0) {
    const bool last = atomicAdd(cnt + kA1Done, 1) == G - 1;
    if (last) {
      cnt[kA1Done] = 0;
      asm volatile("st.relaxed.gpu.global.b32 [%0], %1;" ::"l"(cnt + kA1Epoch), "r"((int)epoch) : "memory");
    }
  }
}

template <int NQ, int NO, int OT>
cudaError_t a1_launch(const AttnT1Args& a, int grid, size_t smem, cudaStream_t st) {
  return launch_cooperative(attn_t1_kernel<NQ, NO, OT>, a, grid, kA1Threads, smem, st);
}

size_t a1_smem(int H, int nq, int nkv, bool f8) {
  const int KT = kA1TileBytes / (nkv * 2 * 256);
  return (size_t)a1_raw_offset(H, nq, nkv) + (f8 ? (size_t)(KT / 16) * nkv * kA1F8UnitBytes : 0);
}

bool a1_shape_ok(int H, int nq, int nkv, int rot_dim) {
  return H >= 64 && H % 64 == 0 && H <= 8192 && nkv >= 1 && nkv <= 8 && kA1AttnWarps % nkv == 0 && nq >= nkv &&
         nq % nkv == 0 &&
         nq <= kA1MaxQHeads && rot_dim >= 8 && rot_dim <= 128 && rot_dim % 8 == 0;
}

}  // namespace

bool attn_layer_t1_supported(int H, int n_q_heads, int n_kv_heads, int rot_dim) {
  if (!a1_shape_ok(H, n_q_heads, n_kv_heads, rot_dim)) return false;
  int dev = 0;
  DeviceInfo di;
  if (device_info(dev, di) != cudaSuccess) return false;
  // sm_90; the merge's jobs (4 a head) on distinct CTAs; the shared memory.
  return di.major >= 9 && di.sms >= 4 * n_q_heads &&
         a1_smem(H, n_q_heads, n_kv_heads, true) + sizeof(A1Shared) <= (size_t)di.smem_optin;
}

size_t attn_layer_t1_workspace_bytes(int n_q_heads, int n_kv_heads, int ctas) {
  if (n_q_heads <= 0 || n_kv_heads <= 0 || ctas <= 0) return 0;
  const size_t words = (size_t)(n_q_heads + 2 * n_kv_heads) * kA1D + (size_t)ctas * n_q_heads * kA1D +
                       (size_t)n_q_heads * kA1D + (size_t)ctas * n_q_heads * 2;
  return kA1HeaderBytes + words * sizeof(unsigned long long);
}

cudaError_t attn_layer_t1(const AttnT1Args& a, cudaStream_t st) {
  if (!a1_shape_ok(a.H, a.n_q_heads, a.n_kv_heads, a.rot_dim) || a.block_size <= 0 || !a.xq || !a.xs ||
      !a.qkv_w || !a.qkv_scale || !a.inv_freq || !a.positions || !a.slots || !a.ctx_len || !a.bt_offset ||
      !a.block_tables || !a.o_w || !a.o_scale || !a.delta || !a.workspace ||
      (uintptr_t)a.xq % 16 || (uintptr_t)a.qkv_w % 16 || (uintptr_t)a.o_w % 16 || (uintptr_t)a.k_cache % 16 ||
      (uintptr_t)a.v_cache % 16 || (uintptr_t)a.workspace % 32 || (a.q_norm && (uintptr_t)a.q_norm % 16) ||
      (a.k_norm && (uintptr_t)a.k_norm % 16))
    return cudaErrorInvalidValue;
  const bool f8 = a.k_cache8 != nullptr;
  if (f8 ? (!a.v_cache8 || !a.k_scale || !a.v_scale || a.k_cache || a.v_cache || a.block_size != kKvFp8BlockSize ||
            (uintptr_t)a.k_cache8 % 16 || (uintptr_t)a.v_cache8 % 16 || (uintptr_t)a.k_scale % 16 ||
            (uintptr_t)a.v_scale % 16)
         : (!a.k_cache || !a.v_cache))
    return cudaErrorInvalidValue;
  int dev = 0;
  DeviceInfo di;
  cudaError_t e = device_info(dev, di);
  if (e != cudaSuccess) return e;
  const int grid = di.sms;
  if (grid > a.ws_ctas) return cudaErrorInvalidValue;  // workspace sized for fewer CTAs
  const size_t smem = a1_smem(a.H, a.n_q_heads, a.n_kv_heads, f8);
  if (di.major < 9 || grid < 4 * a.n_q_heads || smem + sizeof(A1Shared) > (size_t)di.smem_optin)
    return cudaErrorNotSupported;
  // Chunks of 64 bytes per warp: q|k|v's K = H, o_proj's K = heads * 128;
  // o_proj tiles (two units of 8 rows) a CTA holds in one round.
  const int nq_ch = (a.H / 64 + kA1Warps - 1) / kA1Warps;
  const int no_ch = (a.n_q_heads * 2 + kA1Warps - 1) / kA1Warps;
  const int units = (a.H / 8 + grid - 1) / grid;
  const int ot = std::min((units + 1) / 2, kA1MaxOTiles);
  if (nq_ch <= 1 && no_ch <= 1 && ot <= 1) return a1_launch<1, 1, 1>(a, grid, smem, st);
  if (nq_ch <= 5 && no_ch <= 2 && ot <= 3) return a1_launch<5, 2, 3>(a, grid, smem, st);
  return a1_launch<8, 2, 4>(a, grid, smem, st);
}

}  // namespace glmk
