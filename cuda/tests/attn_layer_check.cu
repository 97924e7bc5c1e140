// attn_layer_check — attn_layer_t1 (the one-token attention half of a decode
// layer in one launch) against the runtime's chain of kernels for the same
// layer: gemm_fp8_stream q|k|v (+ bias) -> qk_norm_rope_kv_write ->
// attention_decode (FP8 output) -> gemm_fp8_stream o_proj. Same inputs, same
// device; compares the new token's K and V in the cache, the attention's
// output row (FP32, and its FP8 codes) and o_proj's delta row, on GLM-4.7's
// rank shape and the tiny models' shapes, over contexts from the new token
// alone to past one 64 KB tile a split, and that two launches give the same
// bits; then the same on the FP8 KV cache (the rope kernel's FP8 write and
// attention_decode's FP8 form against the launch's FP8 path). --bench: both as CUDA graphs of 20 layers each with its own weights
// and KV cache (so L2 never holds them), microseconds per layer at 1k, 2k,
// 4k and 16k keys, next to the weight and KV bytes' time at the HBM floor,
// and the fused launch's phase timeline.
//
//   attn_layer_check [--seed N] [--shape NAME] [--bench | --bench-only]
#define CHECK_NAME_W 24
#define CHECK_DETAIL_W 50
#include <cuda_fp8.h>

#include "check.cuh"
#include "kernels.h"

using namespace glmk;

namespace {

struct Shape {
  const char* name;
  int H, nq, nkv, rot;
  bool bias, qk_norm;
};

constexpr int kBlock = 16;  // the runtime's KV block size
// The FP8 KV cache (QkRopeArgs::kv_fp8's layout) instead of the BF16 one:
// the chain's rope and decode kernels and the fused launch all on it.
static bool g_f8 = false;

int sms() {
  int dev = 0, n = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
  return n;
}

// One layer's weights and KV cache (max_ctx keys of one sequence, blocks in a
// shuffled order) on the device.
struct Layer {
  int n_qkv, blocks;
  Dev<uint8_t> qkv_w, o_w;
  Dev<float> qkv_scale, qkv_bias, q_norm, k_norm, o_scale;
  Dev<uint16_t> k_cache, v_cache;
  Dev<uint8_t> k8, v8;    // the FP8 cache's codes (g_f8)
  Dev<float> ks, vs;      // ... and scales
  Layer(const Shape& s, int max_ctx, uint64_t seed)
      : n_qkv((s.nq + 2 * s.nkv) * 128), blocks((max_ctx + kBlock - 1) / kBlock + 1),
        qkv_w((size_t)n_qkv * s.H), o_w((size_t)s.H * s.nq * 128), qkv_scale(n_qkv), qkv_bias(n_qkv),
        q_norm(128), k_norm(128), o_scale(s.H), k_cache((size_t)blocks * s.nkv * kBlock * 128),
        v_cache((size_t)blocks * s.nkv * kBlock * 128), k8((size_t)blocks * s.nkv * kBlock * 128),
        v8((size_t)blocks * s.nkv * kBlock * 128), ks((size_t)blocks * s.nkv * kBlock),
        vs((size_t)blocks * s.nkv * kBlock) {
    FastRng r{seed};
    fill_e4m3_normal_kernel<<<1024, 256>>>(k8.p, k8.n, r.next());
    fill_e4m3_normal_kernel<<<1024, 256>>>(v8.p, v8.n, r.next());
    {
      std::vector<float> sc(ks.n);
      for (auto& v : sc) v = 0.5f + 0.25f * std::fabs(r.nrm());
      ks.up(sc);
      for (auto& v : sc) v = 0.5f + 0.25f * std::fabs(r.nrm());
      vs.up(sc);
    }
    fill_e4m3_normal_kernel<<<1024, 256>>>(qkv_w.p, qkv_w.n, r.next());
    fill_e4m3_normal_kernel<<<1024, 256>>>(o_w.p, o_w.n, r.next());
    fill_bf16_kernel<<<1024, 256>>>(k_cache.p, k_cache.n, r.next());
    fill_bf16_kernel<<<1024, 256>>>(v_cache.p, v_cache.n, r.next());
    CK(cudaGetLastError());
    std::vector<float> qs(n_qkv), qb(n_qkv), qn(128), kn(128), os(s.H);
    for (auto& v : qs) v = (0.5f + 0.1f * std::fabs(r.nrm())) / (2.0f * std::sqrt((float)s.H));
    for (auto& v : qb) v = 0.1f * r.nrm();
    for (auto& v : qn) v = 1.0f + 0.1f * r.nrm();
    for (auto& v : kn) v = 1.0f + 0.1f * r.nrm();
    for (auto& v : os) v = (0.5f + 0.1f * std::fabs(r.nrm())) / (2.0f * std::sqrt((float)s.nq * 128));
    qkv_scale.up(qs);
    qkv_bias.up(qb);
    q_norm.up(qn);
    k_norm.up(kn);
    o_scale.up(os);
  }
};

// The step's buffers and one sequence's metadata.
struct Bufs {
  Dev<uint8_t> xq, attn_q;
  Dev<float> xs, qkv, q, attn, attn_s, delta, split_ws;
  Dev<float> inv_freq;
  Dev<int> pos, slot, ctx, bt_off, q_row, bt;
  Dev<unsigned char> dec_ws, t1_ws;
  int ctas;
  Bufs(const Shape& s, int max_ctx)
      : xq(s.H), attn_q(s.nq * 128), xs(1), qkv((s.nq + 2 * s.nkv) * 128), q(s.nq * 128), attn(s.nq * 128),
        attn_s(1), delta(s.H), split_ws((size_t)64 * std::max(s.H, (s.nq + 2 * s.nkv) * 128)),
        inv_freq(make_inv_freq(s.rot, 1e6f)), pos(1), slot(1), ctx(1), bt_off(1), q_row(1),
        bt((max_ctx + kBlock - 1) / kBlock + 1),
        dec_ws(std::max<size_t>(1, decode_attention_workspace_bytes(
                                       1, s.nq, s.nkv, decode_attention_splits(1, s.nkv, sms())))),
        t1_ws(attn_layer_t1_workspace_bytes(s.nq, s.nkv, sms())), ctas(sms()) {
    dec_ws.zero();
    t1_ws.zero();
    q_row.up({0});
    bt_off.up({0});
  }
  // The sequence at n keys (the new token's the last): its slot from the
  // block table (shuffled blocks of the layer's cache).
  void at(int n, const std::vector<int>& table) {
    pos.up({n - 1});
    ctx.up({n});
    slot.up({table[(n - 1) / kBlock] * kBlock + (n - 1) % kBlock});
    bt.up(table);
  }
};

std::vector<int> shuffled_table(int blocks, uint64_t seed) {
  std::vector<int> t(blocks);
  for (int i = 0; i < blocks; ++i) t[i] = i;
  std::mt19937_64 g(seed);
  std::shuffle(t.begin(), t.end(), g);
  return t;
}

// One row through the streaming GEMM as the runtime's linear() runs it at
// batch 1 (split K over the SMs).
void one_row_linear(const uint8_t* W, const float* ws, const float* bias, const uint8_t* X, const float* xs, int N,
                    int K, float* Y, Bufs& b, cudaStream_t st, bool pdl) {
  StreamGemmArgs g;
  g.W = W;
  g.w_scale = ws;
  g.bias = bias;
  g.X = X;
  g.x_scale = xs;
  g.M = 1;
  g.N = N;
  g.K = K;
  g.Y = Y;
  g.ldy = N;
  g.max_rows_per_group = 1;
  g.ksplit = gemm_fp8_stream_splits(1, N, K, b.ctas);
  g.ws = b.split_ws.p;
  g.pdl = pdl;
  CK(gemm_fp8_stream(g, st));
}

// The layer's cache into an attention launch's arguments: BF16, or (g_f8)
// the FP8 codes and scales.
template <class Args>
void set_cache(const Layer& L, Args& a) {
  if (g_f8) {
    a.k_cache8 = L.k8.p;
    a.v_cache8 = L.v8.p;
    a.k_scale = L.ks.p;
    a.v_scale = L.vs.p;
  } else {
    a.k_cache = reinterpret_cast<decltype(a.k_cache)>(L.k_cache.p);
    a.v_cache = reinterpret_cast<decltype(a.v_cache)>(L.v_cache.p);
  }
}

void run_chain(const Shape& s, const Layer& L, Bufs& b, cudaStream_t st, bool pdl) {
  const int n_qkv = (s.nq + 2 * s.nkv) * 128, ko = s.nq * 128;
  one_row_linear(L.qkv_w.p, L.qkv_scale.p, s.bias ? L.qkv_bias.p : nullptr, b.xq.p, b.xs.p, n_qkv, s.H, b.qkv.p, b,
                 st, pdl);
  QkRopeArgs q;
  q.qkv = b.qkv.p;
  q.T = 1;
  q.n_q_heads = s.nq;
  q.n_kv_heads = s.nkv;
  q.rot_dim = s.rot;
  q.q_norm = s.qk_norm ? L.q_norm.p : nullptr;
  q.k_norm = s.qk_norm ? L.k_norm.p : nullptr;
  q.eps = 1e-5f;
  q.inv_freq = b.inv_freq.p;
  q.positions = b.pos.p;
  q.slots = b.slot.p;
  q.block_size = kBlock;
  q.q_out = b.q.p;
  q.k_cache = L.k_cache.p;
  q.v_cache = L.v_cache.p;
  if (g_f8) {
    q.k_cache = L.k8.p;
    q.v_cache = L.v8.p;
    q.kv_fp8 = 1;
    q.k_scale = L.ks.p;
    q.v_scale = L.vs.p;
  }
  CK(qk_norm_rope_kv_write(q, st));
  DecodeAttnArgs a;
  a.q = b.q.p;
  set_cache(L, a);
  a.block_size = kBlock;
  a.n_q_heads = s.nq;
  a.n_kv_heads = s.nkv;
  a.scale = 1.0f / std::sqrt(128.0f);
  a.n_seqs = 1;
  a.q_row = b.q_row.p;
  a.ctx_len = b.ctx.p;
  a.bt_offset = b.bt_off.p;
  a.block_tables = b.bt.p;
  a.max_splits = decode_attention_splits(1, s.nkv, b.ctas, g_f8);
  a.out = b.attn.p;
  if (s.nkv == 1) {
    a.out_q = b.attn_q.p;
    a.out_scale = b.attn_s.p;
  }
  a.workspace = b.dec_ws.p;
  a.pdl = pdl;
  CK(attention_decode(a, st));
  if (s.nkv != 1) CK(quant_rows_fp8(b.attn.p, ko, 1, ko, b.attn_q.p, ko, b.attn_s.p, nullptr, st));
  one_row_linear(L.o_w.p, L.o_scale.p, nullptr, b.attn_q.p, b.attn_s.p, s.H, ko, b.delta.p, b, st, pdl);
}

AttnT1Args fused_args(const Shape& s, const Layer& L, Bufs& b) {
  AttnT1Args a;
  a.xq = b.xq.p;
  a.xs = b.xs.p;
  a.H = s.H;
  a.n_q_heads = s.nq;
  a.n_kv_heads = s.nkv;
  a.rot_dim = s.rot;
  a.qkv_w = L.qkv_w.p;
  a.qkv_scale = L.qkv_scale.p;
  a.qkv_bias = s.bias ? L.qkv_bias.p : nullptr;
  a.q_norm = s.qk_norm ? L.q_norm.p : nullptr;
  a.k_norm = s.qk_norm ? L.k_norm.p : nullptr;
  a.eps = 1e-5f;
  a.inv_freq = b.inv_freq.p;
  a.positions = b.pos.p;
  a.slots = b.slot.p;
  a.ctx_len = b.ctx.p;
  a.bt_offset = b.bt_off.p;
  a.block_tables = b.bt.p;
  a.block_size = kBlock;
  set_cache(L, a);
  a.scale = 1.0f / std::sqrt(128.0f);
  a.o_w = L.o_w.p;
  a.o_scale = L.o_scale.p;
  a.delta = b.delta.p;
  a.workspace = b.t1_ws.p;
  a.ws_ctas = b.ctas;
  return a;
}

void run_fused(const Shape& s, const Layer& L, Bufs& b, cudaStream_t st, unsigned long long* trace = nullptr) {
  AttnT1Args a = fused_args(s, L, b);
  a.trace = trace;
  CK(attn_layer_t1(a, st));
}

// The FP8 cache's new K and V rows of every KV head at the slot, as values
// (code * scale).
std::vector<double> new_kv8(const Shape& s, const Layer& L, int slot) {
  std::vector<double> out;
  const auto k8 = L.k8.down(), v8 = L.v8.down();
  const auto ks = L.ks.down(), vs = L.vs.down();
  for (int h = 0; h < s.nkv; ++h) {
    const size_t bh = (size_t)(slot / kBlock) * s.nkv + h, o = slot % kBlock;
    for (int d = 0; d < 128; ++d) out.push_back(fp8_dec(k8[(bh * kBlock + o) * 128 + d]) * ks[bh * kBlock + o]);
    for (int d = 0; d < 128; ++d) out.push_back(fp8_dec(v8[(bh * 128 + d) * kBlock + o]) * vs[bh * kBlock + o]);
  }
  return out;
}

// The new token's K and V rows (BF16 bits) of every KV head at its slot.
std::vector<uint16_t> new_kv(const Shape& s, const Layer& L, int slot) {
  std::vector<uint16_t> out;
  const auto kc = L.k_cache.down(), vc = L.v_cache.down();
  for (int h = 0; h < s.nkv; ++h)
    for (const auto* c : {&kc, &vc}) {
      const size_t base = (((size_t)(slot / kBlock) * s.nkv + h) * kBlock + slot % kBlock) * 128;
      out.insert(out.end(), c->begin() + base, c->begin() + base + 128);
    }
  return out;
}

// The merged attention row the fused launch published (its workspace's
// tagged words after the q|k|v row and the splits' partials).
std::vector<float> fused_attn_row(const Shape& s, Bufs& b) {
  const auto w = b.t1_ws.down();
  const size_t off = 256 + ((size_t)(s.nq + 2 * s.nkv) * 128 + (size_t)b.ctas * s.nq * 128) * 8;
  std::vector<float> o(s.nq * 128);
  for (int i = 0; i < s.nq * 128; ++i) memcpy(&o[i], w.data() + off + 8 * i, 4);
  return o;
}

void check_shape(const Shape& s, const std::vector<int>& ctxs) {
  const int max_ctx = *std::max_element(ctxs.begin(), ctxs.end());
  Layer L(s, max_ctx, rng());
  Bufs b(s, max_ctx);
  const auto table = shuffled_table(L.blocks, rng());
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  const auto kc0 = L.k_cache.down(), vc0 = L.v_cache.down();
  const auto k80 = L.k8.down(), v80 = L.v8.down();
  const auto ks0 = L.ks.down(), vs0 = L.vs.down();
  for (int n : ctxs) {
    b.at(n, table);
    std::vector<uint8_t> xq(s.H);
    FastRng r{rng()};
    for (auto& v : xq) v = fp8_enc(2.0f * r.nrm());
    b.xq.up(xq);
    b.xs.up({0.02f});
    const int slot = table[(n - 1) / kBlock] * kBlock + (n - 1) % kBlock;
    run_chain(s, L, b, st, false);
    CK(cudaStreamSynchronize(st));
    const auto ref_kv = new_kv(s, L, slot);
    const auto ref_kv8 = new_kv8(s, L, slot);
    const auto ref_attn = b.attn.down();
    const auto ref_q = b.attn_q.down();
    const float ref_qs = b.attn_s.down()[0];
    const auto ref_delta = b.delta.down();
    // The same cache as before the chain's write (the slot poisoned: the
    // fused launch must write it), the outputs poisoned.
    L.k_cache.up(kc0);
    L.v_cache.up(vc0);
    if (g_f8) {  // the slot's codes NaN, its scales NaN
      auto k8 = k80, v8 = v80;
      auto ks = ks0, vs = vs0;
      for (int h = 0; h < s.nkv; ++h) {
        const size_t bh = (size_t)(slot / kBlock) * s.nkv + h, o = slot % kBlock;
        for (int d = 0; d < 128; ++d) {
          k8[(bh * kBlock + o) * 128 + d] = 0x7f;
          v8[(bh * 128 + d) * kBlock + o] = 0x7f;
        }
        ks[bh * kBlock + o] = NAN;
        vs[bh * kBlock + o] = NAN;
      }
      L.k8.up(k8);
      L.v8.up(v8);
      L.ks.up(ks);
      L.vs.up(vs);
    }
    {
      std::vector<uint16_t> nan(128, kBf16NaN);
      for (int h = 0; h < s.nkv; ++h) {
        const size_t base = (((size_t)(slot / kBlock) * s.nkv + h) * kBlock + slot % kBlock) * 128;
        CK(cudaMemcpy(L.k_cache.p + base, nan.data(), 256, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(L.v_cache.p + base, nan.data(), 256, cudaMemcpyHostToDevice));
      }
    }
    b.delta.poison();
    run_fused(s, L, b, st);
    CK(cudaStreamSynchronize(st));
    const auto got_kv = new_kv(s, L, slot);
    const auto got_kv8 = new_kv8(s, L, slot);
    const auto got_attn = fused_attn_row(s, b);
    const auto got_delta = b.delta.down();
    run_fused(s, L, b, st);  // again: the same bits
    CK(cudaStreamSynchronize(st));
    const auto again = b.delta.down();
    L.k_cache.up(kc0);
    L.v_cache.up(vc0);
    L.k8.up(k80);
    L.v8.up(v80);
    L.ks.up(ks0);
    L.vs.up(vs0);
    const std::string det = fmt("%s%s H=%d q%d kv%d ctx %d", s.name, g_f8 ? " fp8kv" : "", s.H, s.nq, s.nkv, n);
    if (g_f8) {
      // The rope kernel's FP8 write and the launch's of the same FP32 values
      // up to summation order: a code a step away at most, here and there.
      report("attn_layer_t1 new K|V", det, rel_err(got_kv8, ref_kv8), 1e-2);
    } else {
      std::vector<double> g(got_kv.size()), rr(got_kv.size());
      for (size_t i = 0; i < g.size(); ++i) {
        g[i] = bf16_val(got_kv[i]);
        rr[i] = bf16_val(ref_kv[i]);
      }
      // BF16 of the same FP32 values up to summation order: a last bit at most.
      report("attn_layer_t1 new K|V", det, rel_err(g, rr), 4e-3);
    }
    std::vector<double> ga(got_attn.begin(), got_attn.end()), ra(ref_attn.begin(), ref_attn.end());
    // P rounded to BF16 against another running max (other splits) moves
    // terms by ~2^-9; the row's error averages them. On the FP8 cache the
    // chain's decode kernel keeps Q and P in f16 (2^-11) on exact e4m3 codes,
    // ~3e-4 of float64 (kvfp8_check), where this launch rounds Q, P and code
    // x scale to BF16 (2^-9) as the BF16 paths do: H200, 2026-11-29, up to
    // 5.7e-3 at the rank shape and 1.0e-2 at the tiny one (4 heads, 20,000 keys).
    const double row_tol = g_f8 ? 1.5e-2 : 4e-3;
    report("attn_layer_t1 attention row", det, rel_err(ga, ra), row_tol);
    {
      // FP8 codes of the row: the fused launch's own quantization of its row
      // against the chain's of its row; one step apart at a rounding boundary
      // for |v| >= 16 x the scale (steps there are at most 1/16 relative; the
      // rows differ by ~1e-3 of their norm, which below that spans several
      // of the finer steps of small values).
      float amax = 0.f;
      for (float v : got_attn) amax = std::max(amax, std::fabs(v));
      const float sc = std::max(amax / 448.0f, 1.0f / (448.0f * 512.0f));
      size_t far = 0;
      auto code = [](uint8_t c) { return (c & 0x80) ? -(int)(c & 0x7f) : (int)(c & 0x7f); };
      for (int i = 0; i < s.nq * 128; ++i)
        if (std::fabs(ref_attn[i]) >= 16 * ref_qs)
          far += std::abs(code(fp8_enc(got_attn[i] * (1.0f / sc))) - code(ref_q[i])) > 1;
      report("attn_layer_t1 output codes", det + " (>1 step, |v| >= 16 s)", (double)far, 0);
      report("attn_layer_t1 output scale", det, std::fabs(sc - ref_qs) / ref_qs, g_f8 ? 1.5e-2 : 5e-3);
    }
    std::vector<double> gd(got_delta.begin(), got_delta.end()), rd(ref_delta.begin(), ref_delta.end());
    report("attn_layer_t1 delta", det, rel_err(gd, rd), g_f8 ? 4e-2 : 2e-2);
    size_t diff = 0;
    for (int i = 0; i < s.H; ++i) diff += memcmp(&again[i], &got_delta[i], 4) != 0;
    report("attn_layer_t1 repeat", det + " (bits differ)", (double)diff, 0);
  }
  CK(cudaStreamDestroy(st));
}

// A padding row (no keys: ctx_len 0, slot -1): the chain writes a zero
// attention row and leaves the cache alone; so must the launch, its delta
// o_proj's of zeros.
void check_no_keys(const Shape& s) {
  Layer L(s, 64, rng());
  Bufs b(s, 64);
  b.bt.up(shuffled_table(L.blocks, rng()));
  b.pos.up({0});
  b.ctx.up({0});
  b.slot.up({-1});
  std::vector<uint8_t> xq(s.H);
  FastRng r{rng()};
  for (auto& v : xq) v = fp8_enc(2.0f * r.nrm());
  b.xq.up(xq);
  b.xs.up({0.02f});
  const auto kc0 = L.k_cache.down(), vc0 = L.v_cache.down();
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  run_chain(s, L, b, st, false);
  CK(cudaStreamSynchronize(st));
  const auto ref = b.delta.down();
  b.delta.poison();
  run_fused(s, L, b, st);
  CK(cudaStreamSynchronize(st));
  const auto got = b.delta.down();
  CK(cudaStreamDestroy(st));
  std::vector<double> g(got.begin(), got.end()), rr(ref.begin(), ref.end());
  const std::string det = fmt("%s H=%d q%d kv%d ctx 0", s.name, s.H, s.nq, s.nkv);
  report("attn_layer_t1 no keys delta", det, rel_err(g, rr), 1e-6);
  const bool cache_same = L.k_cache.down() == kc0 && L.v_cache.down() == vc0;
  report("attn_layer_t1 no keys cache", det + " (cache changed)", cache_same ? 0.0 : 1.0, 0);
}

void bench_shape(const Shape& s, int n, int layers) {
  std::vector<Layer*> Ls;
  for (int i = 0; i < layers; ++i) Ls.push_back(new Layer(s, n, rng()));
  Bufs b(s, n);
  b.at(n, shuffled_table(Ls[0]->blocks, rng()));
  {
    std::vector<uint8_t> xq(s.H);
    FastRng r{rng()};
    for (auto& v : xq) v = fp8_enc(2.0f * r.nrm());
    b.xq.up(xq);
    b.xs.up({0.02f});
  }
  const float chain = graph_replay_ms([&](int i, cudaStream_t st) { run_chain(s, *Ls[i % layers], b, st, true); },
                                      layers, 21, 1, 3);
  const float fused = graph_replay_ms([&](int i, cudaStream_t st) { run_fused(s, *Ls[i % layers], b, st); },
                                      layers, 21, 1, 3);
  const double wbytes = (double)(s.nq + 2 * s.nkv) * 128 * s.H + (double)s.H * s.nq * 128;
  const double kvbytes = (double)n * s.nkv * 128 * 2 * 2;
  printf("bench %-8s ctx %6d: chain %6.2f us/layer, one launch %6.2f us/layer (%.1f MB weights + %.2f MB KV: "
         "%.2f us at 3.11 TB/s)\n",
         s.name, n, 1e3 * chain / layers, 1e3 * fused / layers, wbytes / 1e6, kvbytes / 1e6,
         (wbytes + kvbytes) / 3.11e6);
  if (n == 2048) {
    const int G = sms();
    constexpr int kMarks = 11;
    Dev<unsigned long long> tr((size_t)2 * kMarks * G);
    tr.zero();
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    for (int i = 0; i < layers; ++i) run_fused(s, *Ls[i], b, st, i == layers - 1 ? tr.p : nullptr);
    CK(cudaStreamSynchronize(st));
    CK(cudaStreamDestroy(st));
    const auto t = tr.down();
    const char* names[kMarks] = {"start",         "q|k|v out",     "q|k|v polled", "norm+rope done",
                                 "attention done", "split out",     "merge polled", "merge out",
                                 "o_proj issued",  "output polled", "o_proj done"};
    print_phases(t, G, names, kMarks);
    // SM clock over each phase interval (cycles / ns), median over CTAs.
    for (int i = 1; i < kMarks; ++i) {
      std::vector<double> v;
      for (int c = 0; c < G; ++c) {
        const auto ta = t[(size_t)(i - 1) * G + c], tb = t[(size_t)i * G + c];
        const auto ca = t[(size_t)(kMarks + i - 1) * G + c], cb = t[(size_t)(kMarks + i) * G + c];
        if (ta && tb && ca && cb && tb > ta) v.push_back((double)(cb - ca) / (double)(tb - ta));
      }
      if (v.empty()) continue;
      std::sort(v.begin(), v.end());
      printf("clock %-15s -> %-15s %.2f GHz (median of %zu CTAs)\n", names[i - 1], names[i], v[v.size() / 2],
             v.size());
    }
  }
  for (auto* l : Ls) delete l;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t seed = 1;
  bool do_bench = false, only_bench = false;
  const char* only_shape = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], nullptr, 0);
    else if (!strcmp(argv[i], "--bench")) do_bench = true;
    else if (!strcmp(argv[i], "--bench-only")) do_bench = only_bench = true;
    else if (!strcmp(argv[i], "--shape") && i + 1 < argc) only_shape = argv[++i];
    else {
      fprintf(stderr, "usage: attn_layer_check [--seed N] [--shape NAME] [--bench | --bench-only]\n");
      return 2;
    }
  }
  rng.seed(seed);
  init_fp8();
  const Shape rank{"rank0/8", 5120, 12, 1, 64, true, true};
  const Shape shapes[] = {
      rank,
      {"tiny", 256, 4, 2, 64, true, true},
      {"gqa8", 4096, 16, 2, 128, false, false},
  };
  if (!only_bench) {
    {
      const bool sup = attn_layer_t1_supported(5120, 17, 1, 64) || attn_layer_t1_supported(5100, 12, 1, 64) ||
                       attn_layer_t1_supported(5120, 12, 5, 64) || attn_layer_t1_supported(5120, 12, 1, 60);
      report("attn_layer_t1 refusal", "supported(): 17 heads, H 5100, 5 KV heads, rot 60", sup ? 1.0 : 0.0, 0);
      AttnT1Args a;
      a.H = 5120;
      a.n_q_heads = 17;
      a.n_kv_heads = 1;
      report("attn_layer_t1 refusal", "launch with 17 heads -> cudaErrorInvalidValue",
             attn_layer_t1(a, 0) == cudaErrorInvalidValue ? 0.0 : 1.0, 0);
      CK(cudaGetLastError());
    }
    const std::vector<int> ctxs = {1, 2, 17, 100, 1000, 2048, 4095, 16384, 20000};
    for (const Shape& s : shapes)
      if (!only_shape || !strcmp(only_shape, s.name)) {
        check_shape(s, ctxs);
        check_no_keys(s);
      }
    // The FP8 KV cache: the chain on it (rope's FP8 write, attention_decode's
    // FP8 form) against the launch's FP8 path.
    g_f8 = true;
    for (const Shape& s : shapes)
      if (!only_shape || !strcmp(only_shape, s.name)) check_shape(s, {1, 17, 100, 2048, 4095, 20000});
    g_f8 = false;
  }
  if (do_bench)
    for (int n : {1024, 2048, 4096, 16384}) bench_shape(rank, n, 20);
  const int fails = failed_checks();
  if (!only_bench) print_table("err");
  print_summary("attn_layer_check", fails);
  return fails ? 1 : 0;
}
