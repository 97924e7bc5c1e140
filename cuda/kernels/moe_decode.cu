// moe_decode.cu — the MoE half of a one-token decode layer in one persistent
// launch (docs/cuda.md "moe_decode_t1"): post-attention add + RMSNorm, the
// router (FP32 logits, selection), the experts' gate|up with SiLU·up, the
// activations' FP8 quantization, the experts' down with the weighted combine
// into the residual row, and the next layer's input add + RMSNorm + FP8.
//
// Why: at batch 1 those stages were seven launches a layer (norm, router,
// gate|up, SiLU, down, combine + next norm; ~41 us on an H100 for ~15 us of
// weight bytes), each paying its start, its first loads and its tail. Here one
// CTA per SM runs them all (batch 1 on an H100, rank share: 6.1 -> 5.5 ms a
// step, docs/perf.md 2026-11-28). The router's partial logits and the
// activations pass between CTAs as (launch epoch, value) words the readers
// poll; one counter finds the last CTA, which normalises the row for the next
// layer. Every CTA requests its next weights before it waits, so the weight
// stream seldom stops between the stages, and row-wide steps (the norms, the
// routing, the activations' scales) are computed redundantly by every CTA
// from L2 instead of by one CTA behind another hand-off.
//
// Work: gate|up in units of 8 intermediate columns of one slot (the 16 rows
// of an mma A tile: 8 gate rows and their 8 up rows, so SiLU·up happens in
// the tile's epilogue), the shared expert's units first (they need no
// routing), spread over the CTAs; down in units of 8 output columns of the
// hidden row, the active slots two at a time as the A tile's two halves (the
// B operand's even columns carry the first slot's activations, the odd ones
// the second's). Inside a CTA the 16 warps split every unit's K in 64-byte
// chunks (warp w takes chunks w, w + 16, ...), and their sums are folded in
// warp order (deterministic). Numerics: the products are those of the
// streaming GEMMs (e4m3 mma, FP32 accumulation, (acc * x_scale) * w_scale),
// summed in another order, so results match the separate kernels to FP32
// rounding, not bit for bit.
#include "common.cuh"
#include "handoff.cuh"
#include "moe_route.cuh"

namespace glmk {
namespace {

constexpr int kT1Threads = 512;
constexpr int kT1Warps = kT1Threads / 32;
constexpr int kT1MaxSlots = 16;
constexpr int kT1RouterChunk = 128;  // K floats of one router partial (one CTA)
constexpr int kT1DownJobs = 4;       // down jobs one round folds (one barrier)
constexpr size_t kT1HeaderBytes = 256;
// Workspace header: the CTAs done (the last one sets it back to zero) and the
// launch epoch. The router's partials and the activations pass between CTAs
// as 8-byte (epoch, value) words that readers poll until the epoch is this
// launch's: no counter, and no fence — a fence.acq_rel after the weight
// copies were issued waited for all of them (the router's partials left at
// ~9 us, after the first 160 KB a CTA had landed).
enum { kCntDone = 0, kEpoch = 1 };

struct T1Shared {
  float red[2][kT1Warps][kT1DownJobs][8][2];  // [round parity][warp][job][row g][half]
  float scratch[32];
  float logit[32 * kMaxExpertsPerLane];
  int ids[kT1MaxSlots];
  float w[kT1MaxSlots];
  int act_slot[kT1MaxSlots];  // slots with an expert on this GPU, in slot order
  int routed_slot[kT1MaxSlots];
  float act_scale[kT1MaxSlots];
  int n_act, n_routed;
  int routed;  // routing known in this CTA
  float x_scale;
};

__device__ __forceinline__ float t1_silu(float g) { return g / (1.0f + expf(-g)); }

// RMSNorm of the row held as NV float4 per thread (v, element tid + k * 512 of
// n4), in place: y = w * (v * r), r = 1/sqrt(mean(v^2) + eps), with the
// float operations of norm_rope.cu's norm_row_tail; y also to y_out (shared,
// optional). Returns the row's FP8 scale max(amax / 448, min).
template <int NV>
__device__ __forceinline__ float t1_norm_row(float4 (&v)[NV], const float4 (&w)[NV], int n4, int H, float eps,
                                             float* scratch, float* y_out) {
  const int tid = threadIdx.x;
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < NV; ++k)
    if (tid + k * kT1Threads < n4) ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
  ss = block_reduce(ss, scratch, SumOp());
  const float r = 1.0f / sqrtf(ss / (float)H + eps);
  float amax = 0.f;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int i = tid + k * kT1Threads;
    if (i < n4) {
      v[k] = make_float4(w[k].x * (v[k].x * r), w[k].y * (v[k].y * r), w[k].z * (v[k].z * r), w[k].w * (v[k].w * r));
      if (y_out) reinterpret_cast<float4*>(y_out)[i] = v[k];
      amax = fmaxf(amax, t1_amax4(v[k]));
    }
  }
  __syncthreads();  // scratch reuse
  amax = block_reduce(amax, scratch, MaxOp());
  return fmaxf(amax / kFp8Max, kMinActScale);
}

template <int EPL, int NG, int ND>
__global__ void __launch_bounds__(kT1Threads, 1) moe_t1_kernel(MoeT1Args a) {
  pdl_launch_dependents();
  T1_MARK(0);
  extern __shared__ __align__(16) unsigned char dsm[];
  __shared__ T1Shared sh;
  const int H = a.H, MI = a.MI, E = a.sel.E;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, c = lane & 3;
  const int G = gridDim.x, b = blockIdx.x;
  float* hsum_s = reinterpret_cast<float*>(dsm);   // [H] h + delta
  float* xf_s = hsum_s + H;                         // [H] normed row (router input)
  uint8_t* xq_s = reinterpret_cast<uint8_t*>(xf_s + H);  // [H] FP8 normed row
  uint8_t* actq_s = xq_s + H;                       // [slots][MI] FP8 activations
  int* cnt = static_cast<int*>(a.workspace);
  auto* part = reinterpret_cast<unsigned long long*>(static_cast<char*>(a.workspace) + kT1HeaderBytes);
  const int nk = H / kT1RouterChunk;
  unsigned long long* act = part + (size_t)nk * E;  // [slots][MI] tagged FP32 SiLU·up
  // Every CTA reads the epoch before any CTA can count itself done (the
  // last one advances it after all have).
  const unsigned epoch = (unsigned)__ldcg(cnt + kEpoch) + 1u;
  const RouterArgs& ra = a.sel;
  const int slots = ra.slots > 0 ? ra.slots : ra.top_k + (ra.shared_local >= 0 ? 1 : 0);
  if (tid == 0) sh.routed = 0;

  // ---- gate|up units: u < n_sh are the shared expert's (slot top_k), then
  // the routed slots' in slot order. This CTA takes u = b, b + G, ...
  const int ups = MI / 8;  // units per slot
  const int n_sh = (ra.shared_local >= 0 && slots > ra.top_k) ? ups : 0;
  const int gu_ch = H / 64;

  // Routing (every CTA, once): the logits summed over the router partials in
  // chunk order, then route_token's selection, as the router kernels do.
  auto ensure_routing = [&]() {
    if (sh.routed) return;  // uniform: written before a barrier
    // The nk x E partials polled by all threads at once into xf_s (the
    // router's input, done with: routing follows this CTA's own partials),
    // H / E chunks a pass, then summed in chunk order (thread e, expert e).
    const int kp = H / E < nk ? H / E : nk;
    float s_e = 0.f;
    for (int k0 = 0; k0 < nk; k0 += kp) {
      const int kn = nk - k0 < kp ? nk - k0 : kp;
      for (int i = tid; i < kn * E; i += kT1Threads) xf_s[i] = t1_poll(part + (size_t)k0 * E + i, epoch);
      __syncthreads();
      if (tid < E)
        for (int k = 0; k < kn; ++k) s_e += xf_s[k * E + tid];
      __syncthreads();
    }
    if (tid < E) sh.logit[tid] = s_e;
    __syncthreads();
    if (warp == 0) {
      RouterArgs r = ra;
      r.T = 1;
      r.ids = sh.ids;
      r.w = sh.w;
      r.n_valid = nullptr;
      r.topk_global = nullptr;
      route_token<EPL>(r, 0, [&](int e) { return sh.logit[e]; });
    }
    __syncthreads();
    if (tid == 0) {
      int na = 0, nr = 0;
      for (int s = 0; s < slots; ++s) {
        if (sh.ids[s] < 0) continue;
        sh.act_slot[na++] = s;
        if (s < ra.top_k) sh.routed_slot[nr++] = s;
      }
      sh.n_act = na;
      sh.n_routed = nr;
      sh.routed = 1;
      if (b == 0 && a.offsets) {  // moe_align's group offsets (profiling counts them)
        for (int gi = 0; gi <= a.n_groups; ++gi) {
          int n = 0;
          for (int s = 0; s < slots; ++s) n += (sh.ids[s] >= 0 && sh.ids[s] < gi) ? 1 : 0;
          a.offsets[gi] = n;
        }
      }
    }
    if (b == 0 && tid < slots) {
      if (ra.ids) ra.ids[tid] = sh.ids[tid];
      if (ra.w) ra.w[tid] = sh.w[tid];
    }
    __syncthreads();
  };

  // The rows of gate|up unit u for this lane (gate row g, up row g), its slot
  // and column block; false when there is no such unit. May route (uniform).
  struct GuUnit {
    const uint8_t* pa;
    const uint8_t* pb;
    const float* sc;  // gate|up scales of the expert
    int slot, t;
  };
  auto gu_unit = [&](int u, GuUnit& o) -> bool {
    int s, grp, t;
    if (u < n_sh) {
      s = ra.top_k;
      grp = ra.shared_local;
      t = u;
    } else {
      ensure_routing();
      const int v = u - n_sh, ai = v / ups;
      if (ai >= sh.n_routed) return false;
      s = sh.routed_slot[ai];
      grp = sh.ids[s];
      t = v - ai * ups;
    }
    o.pa = a.e_gu + ((int64_t)grp * 2 * MI + t * 8 + g) * H + 16 * c;
    o.pb = o.pa + (int64_t)MI * H;
    o.sc = a.e_gu_scale + (int64_t)grp * 2 * MI;
    o.slot = s;
    o.t = t;
    return true;
  };

  // Weights stream into registers with the L2 evict-first hint (read once
  // a step; they must not flush what the other kernels keep in L2 — copies
  // into shared memory, cp.async, took 8 us more a layer in the step on an
  // H100 for that, since ptxas 13.0 miscompiled their hinted form). A
  // gate|up unit is loaded in two halves (each warp's chunks [0, NH) and
  // [NH, NG)), each in its own registers, so that while one half is
  // consumed the next unit's other half is in flight.
  const uint64_t wpol = l2_policy_stream();
  constexpr int NH = (NG + 1) / 2;
  uint4 ga0[NH], gb0[NH], ga1[NH], gb1[NH];
  float gsc_next = 0.f;  // lane l < 16 of warp 0: the unit's scale of row l / 2, gate (l even) or up
  auto gu_load = [&](const GuUnit& o, int h, uint4 (&ra)[NH], uint4 (&rb)[NH]) {
#pragma unroll
    for (int i = 0; i < NH; ++i) {
      const int ci = h * NH + i, j = warp + ci * kT1Warps;
      if (ci < NG && j < gu_ch) {
        ra[i] = ld_stream_v4(o.pa + 64 * j, wpol);
        rb[i] = ld_stream_v4(o.pb + 64 * j, wpol);
      }
    }
    if (h == 0 && warp == 0 && lane < 16) gsc_next = __ldg(o.sc + (lane & 1) * MI + o.t * 8 + (lane >> 1));
  };
  auto gu_mma = [&](float (&acc)[4], int h, const uint4 (&ra)[NH], const uint4 (&rb)[NH]) {
#pragma unroll
    for (int i = 0; i < NH; ++i) {
      const int ci = h * NH + i, j = warp + ci * kT1Warps;
      if (ci < NG && j < gu_ch)
        t1_mma_chunk(acc, ra[i], rb[i], *reinterpret_cast<const uint4*>(xq_s + 64 * j + 16 * c));
    }
  };
  GuUnit cur{};
  bool have = false;

  // ---- post-attention add + RMSNorm, FP32 (router) and FP8 (experts), in
  // every CTA. Router weights of this CTA's chunk requested first.
  const bool router_cta = b < nk;
  constexpr int kRw = 4;  // router rows in flight per warp
  float4 rw[kRw];
  if (router_cta) {
#pragma unroll
    for (int i = 0; i < kRw; ++i) {
      const int e = warp + i * kT1Warps;
      if (e < E)
        rw[i] = __ldg(reinterpret_cast<const float4*>(a.router_W + (int64_t)e * H + b * kT1RouterChunk) + lane);
    }
  }
  {
    constexpr int NV = 4;  // H <= 8192
    const int n4 = H / 4;
    float4 v[NV], wn[NV];
    const float4* h4 = reinterpret_cast<const float4*>(a.h);
    const float4* d4 = reinterpret_cast<const float4*>(a.delta);
    const float4* w4 = reinterpret_cast<const float4*>(a.post_norm);
    float4 dv[NV];
    // The row's loads first: queued behind the weight copies below they
    // waited for ~160 KB a CTA of weights (8 us on an H100).
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int i = tid + k * kT1Threads;
      if (i < n4) {
        v[k] = __ldcg(h4 + i);
        wn[k] = __ldg(w4 + i);
        dv[k] = d4 ? __ldcg(d4 + i) : make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
    // The first half of the shared expert's first unit (it needs nothing
    // this kernel computes) — not in the router's CTAs: a load that finds
    // the SM's outstanding requests full stalls the warp at issue, and their
    // norm and partials gate every CTA's routing — and the next layer's
    // norm weights into L2 for the last CTA.
    if (b < n_sh && !router_cta) {
      have = gu_unit(b, cur);
      gu_load(cur, 0, ga0, gb0);
    }
    if (tid < (H * 4 + 4095) / 4096 && b == G - 1)
      prefetch_l2_bulk(reinterpret_cast<const char*>(a.next_norm) + tid * 4096,
                       (uint32_t)min(4096, H * 4 - tid * 4096));
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int i = tid + k * kT1Threads;
      if (i < n4) {
        if (d4) {
          v[k].x = v[k].x + dv[k].x;
          v[k].y = v[k].y + dv[k].y;
          v[k].z = v[k].z + dv[k].z;
          v[k].w = v[k].w + dv[k].w;
        }
        reinterpret_cast<float4*>(hsum_s)[i] = v[k];
      }
    }
    const float s = t1_norm_row<NV>(v, wn, n4, H, a.eps, sh.scratch, xf_s);
    const float inv = 1.0f / s;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int i = tid + k * kT1Threads;
      if (i < n4) reinterpret_cast<uint32_t*>(xq_s)[i] = pack_e4m3x4(v[k], inv);
    }
    if (tid == 0) sh.x_scale = s;
  }
  __syncthreads();

  // ---- router partial logits: CTA b < nk sums K chunk b for every expert.
  if (router_cta) {
    const float4 x = reinterpret_cast<const float4*>(xf_s + b * kT1RouterChunk)[lane];
    for (int e0 = 0; e0 < E; e0 += kRw * kT1Warps) {
#pragma unroll
      for (int i = 0; i < kRw; ++i) {
        const int e = e0 + warp + i * kT1Warps;
        if (e0 > 0 && e < E)
          rw[i] = __ldg(reinterpret_cast<const float4*>(a.router_W + (int64_t)e * H + b * kT1RouterChunk) + lane);
      }
#pragma unroll
      for (int i = 0; i < kRw; ++i) {
        const int e = e0 + warp + i * kT1Warps;
        if (e < E) {  // warp-uniform
          float p = x.x * rw[i].x;
          p = fmaf(x.y, rw[i].y, p);
          p = fmaf(x.z, rw[i].z, p);
          p = fmaf(x.w, rw[i].w, p);
          p = warp_sum(p);
          if (lane == 0) part[(size_t)b * E + e] = t1_tag(epoch, p);
        }
      }
    }
    T1_MARK(1);
  }

  // ---- gate|up: per unit, consume a half, request the next unit's same
  // half into its registers, then fold the warps' sums, SiLU·up into act.
  if (have) {
    gu_load(cur, 1, ga1, gb1);  // after the router's stores, not ahead of them
  } else if ((have = gu_unit(b, cur))) {  // a router CTA's, or a routed first unit (may route)
    gu_load(cur, 0, ga0, gb0);
    gu_load(cur, 1, ga1, gb1);
  }
  const float xs = sh.x_scale;
  T1_MARK(2);
  int par = 0;
  for (int k = 0; have; ++k) {
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    const float dsc = gsc_next;
    gu_mma(acc, 0, ga0, gb0);
    GuUnit nxt;
    const bool more = gu_unit(b + (k + 1) * G, nxt);  // may route (uniform)
    if (more) gu_load(nxt, 0, ga0, gb0);
    gu_mma(acc, 1, ga1, gb1);
    if (more) gu_load(nxt, 1, ga1, gb1);
    // Every B column carries the token: acc[0] = gate row g, acc[2] = up row g.
    if (c == 0) {
      sh.red[par][warp][0][g][0] = acc[0];
      sh.red[par][warp][0][g][1] = acc[2];
    }
    __syncthreads();
    if (warp == 0) {
      // Lane l < 16 finishes row l / 2's gate (l even) or up (odd).
      float v = 0.f;
      if (lane < 16) {
        float pr[kT1Warps];
#pragma unroll
        for (int w = 0; w < kT1Warps; ++w) pr[w] = sh.red[par][w][0][lane >> 1][lane & 1];
#pragma unroll
        for (int w = 0; w < kT1Warps; ++w) v += pr[w];  // warp order
        v = __fmul_rn(__fmul_rn(v, xs), dsc);
      }
      const float up = __shfl_down_sync(0xffffffffu, v, 1);
      if (lane < 16 && !(lane & 1))
        act[(size_t)cur.slot * MI + cur.t * 8 + (lane >> 1)] = t1_tag(epoch, t1_silu(v) * up);
    }
    par ^= 1;
    cur = nxt;
    have = more;
  }
  T1_MARK(3);
  ensure_routing();  // a CTA without a routed unit still needs the slots

  // ---- down: units of 8 hidden columns, the active slots in pairs. Jobs
  // (unit, pair) of this CTA in order, RJ of them a round in registers; the
  // first round requested before the activations are ready.
  const int n_act = sh.n_act;
  const int n_pairs = (n_act + 1) / 2;
  const int my_units = (H / 8 > b) ? (H / 8 - b + G - 1) / G : 0;
  const int n_jobs = my_units * n_pairs;
  const int dn_ch = MI / 64;
  constexpr int RJ = ND <= 2 ? kT1DownJobs : 1;
  uint4 da[RJ][ND], db[RJ][ND];
  float jd_next[RJ];  // lane l < 16 of warp 0: job's down scale of row l / 2, slot half l & 1
  auto dn_load = [&](int q0) {
#pragma unroll
    for (int jr = 0; jr < RJ; ++jr) {
      const int q = q0 + jr;
      if (q >= n_jobs) break;
      const int ui = q / n_pairs, p = q - ui * n_pairs;
      const int t = b + ui * G;
      const int sa = sh.act_slot[2 * p];
      const int sb = 2 * p + 1 < n_act ? sh.act_slot[2 * p + 1] : sa;
      const uint8_t* pa = a.e_down + ((int64_t)sh.ids[sa] * H + t * 8 + g) * MI + 16 * c;
      const uint8_t* pb = a.e_down + ((int64_t)sh.ids[sb] * H + t * 8 + g) * MI + 16 * c;
#pragma unroll
      for (int i = 0; i < ND; ++i) {
        const int j = warp + i * kT1Warps;
        if (j < dn_ch) {
          da[jr][i] = ld_stream_v4(pa + 64 * j, wpol);
          db[jr][i] = ld_stream_v4(pb + 64 * j, wpol);
        }
      }
      if (warp == 0 && lane < 16)
        jd_next[jr] = __ldg(a.e_down_scale + (int64_t)sh.ids[(lane & 1) ? sb : sa] * H + t * 8 + (lane >> 1));
    }
  };
  if (n_jobs > 0) dn_load(0);

  T1_MARK(4);
  // The activations of the active slots, quantized per slot row as
  // silu_mul_quant_fp8 does (s = max(amax / 448, min), q = e4m3(a * (1 / s))).
  for (int ai = 0; ai < n_act; ++ai) {
    const unsigned long long* row = act + (size_t)sh.act_slot[ai] * MI;
    const int n4 = MI / 4;
    constexpr int NV = 2;  // MI <= 4096
    float4 v[NV];
    float amax = 0.f;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int i = tid + k * kT1Threads;
      if (i < n4) {
        v[k] = t1_poll4(row + 4 * i, epoch);
        amax = fmaxf(amax, t1_amax4(v[k]));
      }
    }
    amax = block_reduce(amax, sh.scratch, MaxOp());
    const float s = fmaxf(amax / kFp8Max, kMinActScale);
    const float inv = 1.0f / s;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int i = tid + k * kT1Threads;
      if (i < n4)
        reinterpret_cast<uint32_t*>(actq_s + (size_t)ai * MI)[i] = pack_e4m3x4(v[k], inv);
    }
    if (tid == 0) sh.act_scale[ai] = s;
    __syncthreads();  // scratch reuse
  }

  float comb = 0.f;  // lanes 2g < 16 of warp 0: the running combine of column t * 8 + g
  T1_MARK(5);
  for (int q0 = 0; q0 < n_jobs; q0 += RJ) {
    float acc[RJ][4];
    float jd[RJ];
#pragma unroll
    for (int jr = 0; jr < RJ; ++jr) {
      acc[jr][0] = acc[jr][1] = acc[jr][2] = acc[jr][3] = 0.f;
      jd[jr] = jd_next[jr];
      const int q = q0 + jr;
      if (q >= n_jobs) continue;
      const int p = q % n_pairs;
      // B column g: the activations of the pair's first slot (g even) or
      // second (g odd; zeros when the pair has one slot).
      const int ai = 2 * p + (g & 1);
      const bool live = ai < n_act;
#pragma unroll
      for (int i = 0; i < ND; ++i) {
        const int j = warp + i * kT1Warps;
        if (j < dn_ch) {
          const uint4 x = live ? *reinterpret_cast<const uint4*>(actq_s + (size_t)ai * MI + 64 * j + 16 * c)
                               : make_uint4(0, 0, 0, 0);
          t1_mma_chunk(acc[jr], da[jr][i], db[jr][i], x);
        }
      }
    }
    if (q0 + RJ < n_jobs) dn_load(q0 + RJ);  // the next round, into the registers just read
    // acc[0] = row g of the first slot x its activations (column 2c), acc[3] =
    // row g of the second x its (column 2c + 1).
    if (c == 0) {
#pragma unroll
      for (int jr = 0; jr < RJ; ++jr) {
        sh.red[par][warp][jr][g][0] = acc[jr][0];
        sh.red[par][warp][jr][g][1] = acc[jr][3];
      }
    }
    __syncthreads();
    if (warp == 0) {
      // Lane l < 16: row l / 2's product for the pair's slot l & 1; lanes 2g
      // then fold the pair into the row's combine in slot order.
#pragma unroll
      for (int jr = 0; jr < RJ; ++jr) {
        const int q = q0 + jr;
        if (q >= n_jobs) break;
        const int ui = q / n_pairs, p = q - ui * n_pairs;
        const int i0 = 2 * p;
        float y = 0.f;
        if (lane < 16) {
          float pr[kT1Warps];
#pragma unroll
          for (int w = 0; w < kT1Warps; ++w) pr[w] = sh.red[par][w][jr][lane >> 1][lane & 1];
          float sum = 0.f;
#pragma unroll
          for (int w = 0; w < kT1Warps; ++w) sum += pr[w];  // warp order
          const int ai = i0 + (lane & 1);
          if (ai < n_act) y = __fmul_rn(__fmul_rn(sum, sh.act_scale[ai]), jd[jr]);
        }
        const float y1 = __shfl_down_sync(0xffffffffu, y, 1);
        if (lane < 16 && !(lane & 1)) {
          if (p == 0) comb = 0.f;
          comb = __fmaf_rn(sh.w[sh.act_slot[i0]], y, comb);
          if (i0 + 1 < n_act) comb = __fmaf_rn(sh.w[sh.act_slot[i0 + 1]], y1, comb);
          if (p == n_pairs - 1) {
            const int n = (b + ui * G) * 8 + (lane >> 1);
            a.h[n] = hsum_s[n] + comb;
          }
        }
      }
    }
    par ^= 1;
  }
  if (n_pairs == 0) {  // no expert on this GPU for the token: h = h + delta
    for (int ui = 0; ui < my_units; ++ui)
      if (tid < 8) {
        const int n = (b + ui * G) * 8 + tid;
        a.h[n] = hsum_s[n] + 0.f;
      }
  }

  T1_MARK(6);
  // ---- the next layer's input norm, by the last CTA to finish.
  __syncthreads();
  __shared__ int last;
  if (tid == 0) {
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
    last = atomicAdd(cnt + kCntDone, 1) == G - 1;
    if (last) asm volatile("fence.acq_rel.gpu;" ::: "memory");
  }
  __syncthreads();
  if (!last) return;
  T1_MARK(7);
  if (tid == 0) {
    cnt[kCntDone] = 0;
    cnt[kEpoch] = (int)epoch;
  }
  {
    constexpr int NV = 4;
    const int n4 = H / 4;
    float4 v[NV], wn[NV];
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int i = tid + k * kT1Threads;
      if (i < n4) {
        v[k] = __ldcg(reinterpret_cast<const float4*>(a.h) + i);
        wn[k] = __ldg(reinterpret_cast<const float4*>(a.next_norm) + i);
      }
    }
    const float s = t1_norm_row<NV>(v, wn, n4, H, a.eps, sh.scratch, nullptr);
    const float inv = 1.0f / s;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int i = tid + k * kT1Threads;
      if (i < n4) reinterpret_cast<uint32_t*>(a.out_q)[i] = pack_e4m3x4(v[k], inv);
    }
    if (tid == 0) a.out_scale[0] = s;
    T1_MARK(8);
  }
}

template <int EPL, int NG, int ND>
cudaError_t t1_launch(const MoeT1Args& a, int grid, size_t smem, cudaStream_t st) {
  return launch_cooperative(moe_t1_kernel<EPL, NG, ND>, a, grid, kT1Threads, smem, st);
}

template <int NG, int ND>
cudaError_t t1_launch_epl(const MoeT1Args& a, int grid, size_t smem, cudaStream_t st) {
  switch (router_epl(a.sel.E)) {
    case 1: return t1_launch<1, NG, ND>(a, grid, smem, st);
    case 5: return t1_launch<5, NG, ND>(a, grid, smem, st);
    default: return t1_launch<kMaxExpertsPerLane, NG, ND>(a, grid, smem, st);
  }
}

// Dynamic shared memory: h + delta and the normed row (FP32), the FP8 row,
// the slots' FP8 activations.
size_t t1_smem(int H, int MI, int slots) {
  return (size_t)H * (2 * sizeof(float) + 1) + (((size_t)slots * MI + 15) & ~(size_t)15);
}

// The instantiation's gate|up chunks per warp (NG; down: 1, 2, 4 with it).
int t1_ng(int H, int MI) {
  const int ng = (H + 1023) / 1024, nd = (MI + 1023) / 1024;
  return ng <= 1 && nd <= 1 ? 1 : ng <= 5 && nd <= 2 ? 5 : 8;
}

int t1_slots(const RouterArgs& r) { return r.slots > 0 ? r.slots : r.top_k + (r.shared_local >= 0 ? 1 : 0); }

}  // namespace

bool moe_decode_t1_supported(int H, int MI, int E, int slots) {
  if (!(H >= kT1RouterChunk && H % kT1RouterChunk == 0 && H <= 8192 && MI >= 64 && MI % 64 == 0 && MI <= 4096 &&
        E >= 1 && E <= 32 * kMaxExpertsPerLane && E <= H && slots >= 1 && slots <= kT1MaxSlots))
    return false;
  // The current device: sm_90, an SM per router chunk, the shared memory.
  int dev = 0;
  DeviceInfo di;
  if (device_info(dev, di) != cudaSuccess) return false;
  return di.major >= 9 && di.sms >= H / kT1RouterChunk &&
         t1_smem(H, MI, slots) + sizeof(T1Shared) <= (size_t)di.smem_optin;
}

size_t moe_decode_t1_workspace_bytes(int H, int MI, int E, int slots) {
  return kT1HeaderBytes + ((size_t)(H / kT1RouterChunk) * E + (size_t)slots * MI) * sizeof(unsigned long long);
}

cudaError_t moe_decode_t1(const MoeT1Args& a, cudaStream_t st) {
  const RouterArgs& r = a.sel;
  const int slots = t1_slots(r);
  if (!moe_decode_t1_supported(a.H, a.MI, r.E, slots) || r.T != 1 || r.top_k < 1 || r.top_k > r.E ||
      slots < r.top_k || slots > r.top_k + 1 || r.n_group < 1 || r.n_group > 32 || r.E % r.n_group != 0 ||
      r.topk_group < 1 || r.topk_group > r.n_group || (r.n_group > 1 && r.E / r.n_group < 2) || !r.bias ||
      !a.h || !a.post_norm || !a.router_W || !a.e_gu || !a.e_gu_scale || !a.e_down || !a.e_down_scale ||
      !a.next_norm || !a.out_q || !a.out_scale || !a.workspace || (a.offsets && a.n_groups < 1) ||
      (uintptr_t)a.h % 16 || (uintptr_t)a.delta % 16 || (uintptr_t)a.post_norm % 16 ||
      (uintptr_t)a.next_norm % 16 || (uintptr_t)a.router_W % 16 || (uintptr_t)a.e_gu % 16 ||
      (uintptr_t)a.e_down % 16 || (uintptr_t)a.out_q % 4 || (uintptr_t)a.workspace % 16)
    return cudaErrorInvalidValue;
  int dev = 0;
  DeviceInfo di;
  cudaError_t e = device_info(dev, di);
  if (e != cudaSuccess) return e;
  const int grid = di.sms;
  const int NG = t1_ng(a.H, a.MI);
  if (di.major < 9 || grid < a.H / kT1RouterChunk || t1_smem(a.H, a.MI, slots) + sizeof(T1Shared) > (size_t)di.smem_optin)
    return cudaErrorNotSupported;
  const size_t smem = t1_smem(a.H, a.MI, slots);
  if (NG == 1) return t1_launch_epl<1, 1>(a, grid, smem, st);
  if (NG == 5) return t1_launch_epl<5, 2>(a, grid, smem, st);
  return t1_launch_epl<8, 4>(a, grid, smem, st);
}

}  // namespace glmk
