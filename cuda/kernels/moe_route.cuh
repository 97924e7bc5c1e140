// moe_route.cuh — the MoE router's selection for one token (docs/model.md
// §3.6): sigmoid scores, the correction bias for selection only, group-limited
// top-k, renormalise, scale. Shared by the router kernels of moe.cu and the
// one-token MoE layer of moe_decode.cu, so that both select alike.
#pragma once

#include "common.cuh"

namespace glmk {
namespace {

constexpr int kMaxExpertsPerLane = 16;  // E <= 512

// (v, i) beats (w, j) if larger, ties to the lower index.
__device__ __forceinline__ bool better(float v, int i, float w, int j) {
  return v > w || (v == w && i < j);
}

__device__ __forceinline__ void warp_argmax(float& v, int& i) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    const int j = __shfl_xor_sync(0xffffffffu, i, o);
    if (better(w, j, v, i)) {
      v = w;
      i = j;
    }
  }
}

// Router selection of token t by one warp (all lanes): lg(e) returns the FP32
// logit of expert e (only called for e < E). Rows t >= *n_valid get ids -1 and
// weight 0 in every slot. EPL: experts per lane the loops cover (E <= 32 * EPL);
// a smaller EPL only drops loop iterations that have no expert, the arithmetic
// and its order are the same for every EPL. ids_copy (optional): the token's
// ids also into ids_copy[0 .. slots) (shared memory of a caller that sorts
// them next, without a round trip through global memory).
template <int EPL, typename Logit>
__device__ __forceinline__ void route_token(const RouterArgs& a, int t, Logit lg, int* ids_copy = nullptr) {
  const int lane = threadIdx.x & 31;
  const int slots = a.slots > 0 ? a.slots : a.top_k + (a.shared_local >= 0 ? 1 : 0);
  if (a.n_valid && t >= *a.n_valid) {
    for (int j = lane; j < slots; j += 32) {
      a.ids[(int64_t)t * slots + j] = -1;
      a.w[(int64_t)t * slots + j] = 0.f;
      if (ids_copy) ids_copy[j] = -1;
    }
    if (a.topk_global)
      for (int j = lane; j < a.top_k; j += 32) a.topk_global[(int64_t)t * a.top_k + j] = -1;
    return;
  }
  float sc[EPL], sel[EPL];
#pragma unroll
  for (int j = 0; j < EPL; ++j) {
    const int e = lane + 32 * j;
    sc[j] = 0.f;
    sel[j] = -INFINITY;
    if (e < a.E) {
      sc[j] = 1.0f / (1.0f + expf(-lg(e)));
      sel[j] = sc[j] + a.bias[e];
    }
  }
  if (a.n_group > 1) {
    const int gsz = a.E / a.n_group;
    float gscore = -INFINITY;  // lane gi holds group gi's score
    for (int gi = 0; gi < a.n_group; ++gi) {
      float top2 = 0.f;
      int taken = -1;
      for (int pass = 0; pass < 2; ++pass) {
        float v = -INFINITY;
        int idx = 0x7fffffff;
#pragma unroll
        for (int j = 0; j < EPL; ++j) {
          const int e = lane + 32 * j;
          if (e < a.E && e / gsz == gi && e != taken && better(sel[j], e, v, idx)) {
            v = sel[j];
            idx = e;
          }
        }
        warp_argmax(v, idx);
        top2 += v;
        taken = idx;
      }
      if (lane == gi) gscore = top2;
    }
    uint32_t keep = 0;
    for (int k = 0; k < a.topk_group; ++k) {
      float v = (lane < a.n_group && !((keep >> lane) & 1)) ? gscore : -INFINITY;
      int idx = lane < a.n_group ? lane : 0x7fffffff;
      warp_argmax(v, idx);
      keep |= 1u << idx;
    }
#pragma unroll
    for (int j = 0; j < EPL; ++j) {
      const int e = lane + 32 * j;
      if (e < a.E && !((keep >> (e / gsz)) & 1)) sel[j] = -INFINITY;  // transformers 5.x: -inf
    }
  }
  // Top-k by the (biased, group-masked) selection score.
  uint32_t taken = 0;  // bit j: expert lane+32j already selected
  float wsum = 0.f, my_w = 0.f;
  int my_e = -1;
  for (int k = 0; k < a.top_k; ++k) {
    float v = -INFINITY;
    int idx = 0x7fffffff;
    float s_of = 0.f;
#pragma unroll
    for (int j = 0; j < EPL; ++j) {
      const int e = lane + 32 * j;
      if (e < a.E && !((taken >> j) & 1) && better(sel[j], e, v, idx)) {
        v = sel[j];
        idx = e;
        s_of = sc[j];
      }
    }
    float vb = v;
    int ib = idx;
    warp_argmax(vb, ib);
    if (ib == idx) {
      taken |= 1u << (idx / 32);  // only the owning lane marks it
    }
    const float w = __shfl_sync(0xffffffffu, s_of, ib & 31);
    wsum += w;
    if (lane == k) {
      my_w = w;
      my_e = ib;
    }
  }
  if (lane < a.top_k) {
    float w = my_w;
    if (a.norm_topk) w = w / (wsum + 1e-20f);
    w *= a.scale;
    const int local = (my_e >= a.expert_begin && my_e < a.expert_begin + a.n_local)
                          ? my_e - a.expert_begin
                          : -1;
    a.ids[(int64_t)t * slots + lane] = local;
    a.w[(int64_t)t * slots + lane] = w;
    if (ids_copy) ids_copy[lane] = local;
    if (a.topk_global) a.topk_global[(int64_t)t * a.top_k + lane] = my_e;
  }
  if (lane == 0 && slots > a.top_k) {
    a.ids[(int64_t)t * slots + a.top_k] = a.shared_local;
    a.w[(int64_t)t * slots + a.top_k] = 1.0f;
    if (ids_copy) ids_copy[a.top_k] = a.shared_local;
  }
}

// Experts per lane of the router loops: 1 (E <= 32), 5 (E <= 160), 16 (E <= 512).
inline int router_epl(int E) { return E <= 32 ? 1 : E <= 160 ? 5 : kMaxExpertsPerLane; }

}  // namespace
}  // namespace glmk
