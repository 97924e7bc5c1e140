// kvfp8_check — the FP8 (e4m3, scaled) KV cache (kernels.h, QkRopeArgs::kv_fp8):
//   writer   qk_norm_rope_kv_write with kv_fp8 against the same kernel's FP32
//            cache on the same rows: every scale max(amax / 448, 2^-24) and every
//            code e4m3(value / scale), bit for bit, in the transposed V layout; q
//            unchanged; slots not written (and padding tokens) untouched.
//   decode   attention_decode on the FP8 cache against a float64 reference over
//            the dequantized cache (code * scale), split and unsplit, every
//            stage depth, with NaN codes and scales in the slots past each
//            sequence's end (a block's stale tail must not leak).
//   prefill  attention_prefill (64-row plans) on the FP8 cache against the same
//            reference, causal, with prefixes, several sequences and split items.
//   --bench  the decode kernel on the FP8 cache next to the BF16 cache at the
//            same shapes (GLM-4.7 rank share: 12 query heads, 1 KV head),
//            us per launch, KV bytes read and their rate against 4.46 TB/s.
//   --sweep  the bench with the FP8 launch's knobs swept (stages, CTAs an SM).
// Usage: kvfp8_check [--seed N] [--bench] [--bench-only] [--sweep]
#define CHECK_NAME_W 22
#define CHECK_DETAIL_W 50
#include "check.cuh"
#include "kernels.h"

using namespace glmk;

namespace glmk {
struct DecodeAttnTuning {
  int stages, min_chunk, direct_max, ctas_per_sm, cluster;
};
void decode_attention_get_tuning(DecodeAttnTuning* t);
void decode_attention_set_tuning(const DecodeAttnTuning* t);
void qk_rope_set_tokens_per_cta(int tpc);
}  // namespace glmk

static constexpr int kD = 128, kBS = kKvFp8BlockSize;
static constexpr int kDecMaxSplitsBench = 128;  // workspace for any split count the sweep's policy picks
static int g_sms = 132;

// A host FP8 cache: codes and scales in QkRopeArgs::kv_fp8's layout.
struct HostF8 {
  int blocks = 0, nkv = 0;
  std::vector<uint8_t> k, v;
  std::vector<float> ks, vs;
  void init(int b, int n) {
    blocks = b;
    nkv = n;
    k.assign((size_t)b * n * kBS * kD, 0);
    v.assign(k.size(), 0);
    ks.assign((size_t)b * n * kBS, 0.f);
    vs.assign(ks.size(), 0.f);
  }
  size_t row(int blk, int kvh, int off) const { return ((size_t)blk * nkv + kvh) * kBS + off; }
  double kval(int blk, int kvh, int off, int d) const {
    return fp8_dec(k[row(blk, kvh, off) * kD + d]) * (double)ks[row(blk, kvh, off)];
  }
  double vval(int blk, int kvh, int off, int d) const {
    return fp8_dec(v[(((size_t)blk * nkv + kvh) * kD + d) * kBS + off]) * (double)vs[row(blk, kvh, off)];
  }
  // Random rows: codes of N(0, 1) * 150 (finite), scales a / 448 with a in [0.5, 4].
  void fill_random() {
    for (auto& c : k) c = fp8_enc(randn() * 150.f);
    for (auto& c : v) c = fp8_enc(randn() * 150.f);
    for (auto& s : ks) s = randu(0.5f, 4.f) / 448.f;
    for (auto& s : vs) s = randu(0.5f, 4.f) / 448.f;
  }
  // NaN codes and scales in slot (blk, off) of every KV head.
  void poison(int blk, int off) {
    for (int h = 0; h < nkv; ++h) {
      for (int d = 0; d < kD; ++d) {
        k[row(blk, h, off) * kD + d] = 0x7f;
        v[(((size_t)blk * nkv + h) * kD + d) * kBS + off] = 0xff;
      }
      ks[row(blk, h, off)] = NAN;
      vs[row(blk, h, off)] = NAN;
    }
  }
};

struct DevF8 {
  Dev<uint8_t> k, v;
  Dev<float> ks, vs;
  explicit DevF8(const HostF8& h) : k(h.k), v(h.v), ks(h.ks), vs(h.vs) {}
  // This cache and the shape's common fields into an attention launch's arguments.
  template <class Args>
  void into(Args& a, int nq, int nkv, float scale) const {
    a.k_cache8 = k.p;
    a.v_cache8 = v.p;
    a.k_scale = ks.p;
    a.v_scale = vs.p;
    a.block_size = kBS;
    a.n_q_heads = nq;
    a.n_kv_heads = nkv;
    a.scale = scale;
  }
};

// Sequences over a shuffled block pool: table[s] = its blocks in order.
struct Seqs {
  std::vector<int> ctx;                  // keys of each sequence
  std::vector<std::vector<int>> table;   // block ids
  std::vector<int> bt_flat, bt_off;
  int blocks = 0;
};
static Seqs make_seqs(const std::vector<int>& ctx, int spare) {
  Seqs S;
  S.ctx = ctx;
  int need = spare;
  for (int c : ctx) need += (c + kBS - 1) / kBS;
  S.blocks = std::max(need, 1);
  std::vector<int> ids(S.blocks);
  for (int i = 0; i < S.blocks; ++i) ids[i] = i;
  std::shuffle(ids.begin(), ids.end(), rng);
  int next = 0;
  for (int c : ctx) {
    std::vector<int> t;
    for (int b = 0; b < (c + kBS - 1) / kBS; ++b) t.push_back(ids[next++]);
    S.bt_off.push_back((int)S.bt_flat.size());
    S.bt_flat.insert(S.bt_flat.end(), t.begin(), t.end());
    if (t.empty()) S.bt_flat.push_back(0);  // a padding sequence's table: one unused entry
    S.table.push_back(t);
  }
  return S;
}

// Reference attention of one query row (G heads of KV head kvh) of sequence s
// over keys 0 .. n_keys-1 of its table.
static void ref_row(const HostF8& C, const Seqs& S, int s, int kvh, int G, int n_q_heads, const float* q, float scale,
                    int n_keys, double* out) {
  for (int hh = 0; hh < G; ++hh) {
    const float* qh = q + (size_t)(kvh * G + hh) * kD;
    std::vector<double> sc(n_keys);
    double mx = -INFINITY;
    for (int t = 0; t < n_keys; ++t) {
      const int blk = S.table[s][t / kBS], off = t % kBS;
      double dot = 0;
      for (int d = 0; d < kD; ++d) dot += (double)qh[d] * C.kval(blk, kvh, off, d);
      sc[t] = dot * scale;
      mx = std::max(mx, sc[t]);
    }
    double l = 0;
    for (int t = 0; t < n_keys; ++t) l += (sc[t] = std::exp(sc[t] - mx));
    double* o = out + (size_t)(kvh * G + hh) * kD;
    for (int d = 0; d < kD; ++d) o[d] = 0;
    for (int t = 0; t < n_keys; ++t) {
      const int blk = S.table[s][t / kBS], off = t % kBS;
      for (int d = 0; d < kD; ++d) o[d] += sc[t] / l * C.vval(blk, kvh, off, d);
    }
  }
  (void)n_q_heads;
}

// ------------------------------------------------------------ writer

static void check_writer(int T, int nq, int nkv, int tpc) {
  const int n_all = nq + 2 * nkv, rot = 64;
  const int blocks = (T + kBS - 1) / kBS + 3;
  std::vector<float> qkv((size_t)T * n_all * kD);
  for (auto& x : qkv) x = randn() * 2.f;
  std::vector<float> qn(kD), kn(kD);
  for (auto& x : qn) x = randu(0.5f, 1.5f);
  for (auto& x : kn) x = randu(0.5f, 1.5f);
  std::vector<int> pos(T), slots(T);
  std::vector<int> perm(blocks * kBS);
  for (int i = 0; i < (int)perm.size(); ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), rng);
  for (int t = 0; t < T; ++t) {
    pos[t] = randi(0, 100000);
    slots[t] = perm[t];
  }
  if (T > 2) slots[T / 2] = -1;  // a padding token: q only
  // One V row of zeros (its scale must stay finite): the token's V head 0 input.
  if (T > 1)
    for (int d = 0; d < kD; ++d) qkv[((size_t)1 * n_all + nq + nkv) * kD + d] = 0.f;
  const std::vector<float> inv = make_inv_freq(rot, 1e6f);
  Dev<float> d_qkv(qkv), d_qn(qn), d_kn(kn), d_inv(inv);
  Dev<int> d_pos(pos), d_slots(slots);
  Dev<float> q32((size_t)T * nq * kD), q8((size_t)T * nq * kD);
  const size_t cache_n = (size_t)blocks * nkv * kBS * kD;
  Dev<float> k32(cache_n), v32(cache_n);
  Dev<uint8_t> k8(cache_n), v8(cache_n);
  Dev<float> ks((size_t)blocks * nkv * kBS), vs((size_t)blocks * nkv * kBS);
  k32.zero(), v32.zero(), k8.zero(), v8.zero(), ks.zero(), vs.zero();
  qk_rope_set_tokens_per_cta(tpc);
  QkRopeArgs a;
  a.qkv = d_qkv.p;
  a.T = T;
  a.n_q_heads = nq;
  a.n_kv_heads = nkv;
  a.rot_dim = rot;
  a.q_norm = d_qn.p;
  a.k_norm = d_kn.p;
  a.inv_freq = d_inv.p;
  a.positions = d_pos.p;
  a.slots = d_slots.p;
  a.block_size = kBS;
  a.q_out = q32.p;
  a.k_cache = k32.p;
  a.v_cache = v32.p;
  a.kv_f32 = 1;
  CK(qk_norm_rope_kv_write(a, 0));
  a.q_out = q8.p;
  a.k_cache = k8.p;
  a.v_cache = v8.p;
  a.kv_f32 = 0;
  a.kv_fp8 = 1;
  a.k_scale = ks.p;
  a.v_scale = vs.p;
  CK(qk_norm_rope_kv_write(a, 0));
  CK(cudaDeviceSynchronize());
  qk_rope_set_tokens_per_cta(0);
  const auto hk32 = k32.down(), hv32 = v32.down();
  const auto hk8 = k8.down(), hv8 = v8.down();
  const auto hks = ks.down(), hvs = vs.down();
  const auto hq32 = q32.down(), hq8 = q8.down();
  long bad_scale = 0, bad_code = 0, stray = 0;
  std::vector<char> written((size_t)blocks * kBS, 0);
  for (int t = 0; t < T; ++t) {
    if (slots[t] < 0) continue;
    written[slots[t]] = 1;
    const int blk = slots[t] / kBS, off = slots[t] % kBS;
    for (int h = 0; h < nkv; ++h) {
      const size_t r = ((size_t)blk * nkv + h) * kBS + off;
      for (int kv = 0; kv < 2; ++kv) {
        const std::vector<float>& f = kv ? hv32 : hk32;
        float am = 0.f;
        for (int d = 0; d < kD; ++d) am = std::max(am, std::fabs(f[r * kD + d]));
        const float s = std::max(am / 448.0f, 5.9604645e-8f);
        const float got = kv ? hvs[r] : hks[r];
        if (memcmp(&s, &got, 4) != 0) ++bad_scale;
        for (int d = 0; d < kD; ++d) {
          const uint8_t want = fp8_enc(f[r * kD + d] * (1.0f / s));
          const uint8_t c = kv ? hv8[(((size_t)blk * nkv + h) * kD + d) * kBS + off] : hk8[r * kD + d];
          if (c != want) ++bad_code;
        }
      }
    }
  }
  for (int sl = 0; sl < blocks * kBS; ++sl) {
    if (written[sl]) continue;
    const int blk = sl / kBS, off = sl % kBS;
    for (int h = 0; h < nkv; ++h) {
      const size_t r = ((size_t)blk * nkv + h) * kBS + off;
      stray += hks[r] != 0.f || hvs[r] != 0.f;
      for (int d = 0; d < kD; ++d)
        stray += hk8[r * kD + d] != 0 || hv8[(((size_t)blk * nkv + h) * kD + d) * kBS + off] != 0;
    }
  }
  const bool q_same = memcmp(hq32.data(), hq8.data(), hq32.size() * 4) == 0;
  const std::string det = fmt("T %d, %d q / %d kv heads, %d tokens a CTA", T, nq, nkv, tpc);
  report("rope_kv_write fp8", det + ": scales", (double)bad_scale, 0);
  report("rope_kv_write fp8", det + ": codes", (double)bad_code, 0);
  report("rope_kv_write fp8", det + ": other slots, q", (double)(stray + (q_same ? 0 : 1)), 0);
}

// ------------------------------------------------------------ decode

static void check_decode(const std::vector<int>& ctx, int G, int nkv, int splits, int stages, const char* what) {
  const int n = (int)ctx.size(), nq = G * nkv;
  Seqs S = make_seqs(ctx, 2);
  HostF8 C;
  C.init(S.blocks, nkv);
  C.fill_random();
  for (int s = 0; s < n; ++s)  // stale NaNs past each sequence's end
    if (ctx[s] % kBS) C.poison(S.table[s].back(), ctx[s] % kBS);
  std::vector<float> q((size_t)n * nq * kD);
  for (auto& x : q) x = randn();
  const float scale = 1.0f / std::sqrt((float)kD);
  std::vector<double> ref((size_t)n * nq * kD, 0.0);
  for (int s = 0; s < n; ++s)
    for (int h = 0; h < nkv; ++h)
      if (ctx[s] > 0) ref_row(C, S, s, h, G, nq, q.data() + (size_t)s * nq * kD, scale, ctx[s], ref.data() + (size_t)s * nq * kD);
  DevF8 dc(C);
  Dev<float> dq(q), out((size_t)n * nq * kD);
  out.poison();
  std::vector<int> rows(n);
  for (int s = 0; s < n; ++s) rows[s] = s;
  Dev<int> d_rows(rows), d_ctx(ctx), d_bto(S.bt_off), d_bt(S.bt_flat);
  DecodeAttnArgs a;
  a.q = dq.p;
  dc.into(a, nq, nkv, scale);
  a.n_seqs = n;
  a.q_row = d_rows.p;
  a.ctx_len = d_ctx.p;
  a.bt_offset = d_bto.p;
  a.block_tables = d_bt.p;
  a.max_splits = splits > 0 ? splits : decode_attention_splits(n, nkv, g_sms, true);
  a.out = out.p;
  const size_t wsb = decode_attention_workspace_bytes(n, nq, nkv, a.max_splits);
  Dev<uint8_t> ws(std::max<size_t>(wsb, 1));
  ws.zero();
  a.workspace = wsb ? ws.p : nullptr;
  DecodeAttnTuning t0, t;
  decode_attention_get_tuning(&t0);
  t = t0;
  t.stages = stages;
  decode_attention_set_tuning(&t);
  CK(attention_decode(a, 0));
  CK(attention_decode(a, 0));  // twice: the workspace's counters left reusable
  CK(cudaDeviceSynchronize());
  decode_attention_set_tuning(&t0);
  const auto h = out.down();
  std::vector<double> o(h.begin(), h.end());
  report("attention_decode fp8",
         fmt("%s: %d seqs, G %d, %d kv, splits %d, stages %d", what, n, G, nkv, a.max_splits, stages),
         rel_err(o, ref), 4e-3);
}

// ------------------------------------------------------------ prefill

// Sequences (start, n_new): keys 0 .. start + n_new - 1, the new tokens'
// K/V already in the cache.
static void check_prefill(const std::vector<std::pair<int, int>>& seqs, int G, int nkv, int rows, const char* what) {
  const int n = (int)seqs.size(), nq = G * nkv;
  std::vector<int> ctx;
  int T = 0;
  for (auto& p : seqs) {
    ctx.push_back(p.first + p.second);
    T += p.second;
  }
  Seqs S = make_seqs(ctx, 1);
  HostF8 C;
  C.init(S.blocks, nkv);
  C.fill_random();
  for (int s = 0; s < n; ++s)
    if (ctx[s] % kBS) C.poison(S.table[s].back(), ctx[s] % kBS);
  std::vector<float> q((size_t)T * nq * kD);
  for (auto& x : q) x = randn();
  const float scale = 1.0f / std::sqrt((float)kD);
  std::vector<int> pos(T);
  std::vector<AttnSeqDesc> desc;
  std::vector<double> ref((size_t)T * nq * kD, 0.0);
  int tok = 0;
  for (int s = 0; s < n; ++s) {
    desc.push_back(AttnSeqDesc{tok, seqs[s].second, seqs[s].first});
    for (int i = 0; i < seqs[s].second; ++i, ++tok) {
      pos[tok] = seqs[s].first + i;
      for (int h = 0; h < nkv; ++h)
        ref_row(C, S, s, h, G, nq, q.data() + (size_t)tok * nq * kD, scale, pos[tok] + 1,
                ref.data() + (size_t)tok * nq * kD);
    }
  }
  const int max_parts = 512;
  std::vector<PrefillItem> items(attention_prefill_max_items(T, n, G, max_parts));
  PrefillPlan plan;
  plan.items = items.data();
  plan.max_items = (int)items.size();
  plan.max_parts = max_parts;
  plan.rows_in = rows;
  const char* why = "";
  if (!plan_prefill(desc.data(), n, G, nkv, g_sms, &plan, &why)) {
    report("attention_prefill fp8", fmt("%s: plan: %s", what, why), NAN, 0);
    return;
  }
  items.resize(plan.n_items);
  DevF8 dc(C);
  Dev<float> dq(q), out((size_t)T * nq * kD);
  out.poison();
  Dev<int> d_pos(pos), d_bto(S.bt_off), d_bt(S.bt_flat);
  Dev<PrefillItem> d_items(items);
  const size_t wsb = attention_prefill_workspace_bytes(max_parts, nkv);
  Dev<uint8_t> ws(std::max<size_t>(wsb, 1));
  ws.zero();
  PrefillAttnArgs a;
  a.q = dq.p;
  dc.into(a, nq, nkv, scale);
  a.positions = d_pos.p;
  a.seq_bt_offset = d_bto.p;
  a.block_tables = d_bt.p;
  a.items = d_items.p;
  a.n_items = plan.n_items;
  a.rows = plan.rows;
  a.n_parts = plan.n_parts;
  a.out = out.p;
  a.workspace = ws.p;
  CK(attention_prefill(a, 0));
  CK(cudaDeviceSynchronize());
  const auto h = out.down();
  std::vector<double> o(h.begin(), h.end());
  report("attention_prefill fp8",
         fmt("%s: %d seqs, %d tok, G %d, %d kv, %d x %d rows (%d pc)", what, n, T, G, nkv, plan.n_items, plan.rows,
             plan.n_parts),
         rel_err(o, ref), 4e-3);
}

// A bad FP8 launch is refused (block size, missing scales, a 128-row plan).
static void check_invalid() {
  Dev<uint8_t> c(4096);
  Dev<float> s(64), q(12 * 128), out(12 * 128);
  Dev<int> one(std::vector<int>{0}), ctx(std::vector<int>{1});
  DecodeAttnArgs a;
  a.q = q.p;
  a.k_cache8 = c.p;
  a.v_cache8 = c.p;
  a.k_scale = s.p;
  a.v_scale = s.p;
  a.block_size = 32;
  a.n_q_heads = 12;
  a.n_kv_heads = 1;
  a.scale = 0.1f;
  a.n_seqs = 1;
  a.q_row = one.p;
  a.ctx_len = ctx.p;
  a.bt_offset = one.p;
  a.block_tables = one.p;
  a.out = out.p;
  int refused = attention_decode(a, 0) == cudaErrorInvalidValue;
  a.block_size = kBS;
  a.v_scale = nullptr;
  refused += attention_decode(a, 0) == cudaErrorInvalidValue;
  PrefillAttnArgs p;
  p.q = q.p;
  p.k_cache8 = c.p;
  p.v_cache8 = c.p;
  p.k_scale = s.p;
  p.v_scale = s.p;
  p.block_size = kBS;
  p.n_q_heads = 12;
  p.n_kv_heads = 1;
  p.positions = one.p;
  p.seq_bt_offset = one.p;
  p.block_tables = one.p;
  p.items = reinterpret_cast<const PrefillItem*>(one.p);
  p.n_items = 1;
  p.rows = 64;
  p.block_size = 32;
  p.out = out.p;
  refused += attention_prefill(p, 0) == cudaErrorInvalidValue;
  (void)cudaGetLastError();
  report("fp8 launches refused", "decode: block 32, no V scales; prefill: block 32", 3 - refused, 0);
}

// ------------------------------------------------------------ bench

static __global__ void fill_codes_kernel(uint8_t* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const float v = (float)(int32_t)(mix64(seed + i) >> 40 & 0xFFFFFF) / 8388608.0f - 1.0f;
    p[i] = (uint8_t)__nv_cvt_float_to_fp8(v * 448.f, __NV_SATFINITE, __NV_E4M3);
  }
}
static __global__ void fill_const_kernel(float* p, size_t n, float v) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = v;
}

// sweep: the FP8 kernel's launch knobs too (stages 2-4 x the tuning's CTAs an
// SM 1-3, which the FP8 policy doubles).
static void bench(bool sweep) {
  const int nkv = 1, nq = 12;
  const std::vector<std::pair<int, int>> shapes = {{1, 2048},  {1, 16384}, {4, 4096},  {16, 4096},  {64, 2048},
                                                   {64, 4096}, {128, 4096}, {256, 2048}, {64, 16384}};
  printf("\n%-8s %-8s %12s %12s %12s %12s %10s %10s\n", "batch", "context", "bf16 us", "fp8 us", "bf16 GB/s",
         "fp8 GB/s", "bf16 %HBM", "fp8 %HBM");
  for (const auto& sh : shapes) {
    const int b = sh.first, L = sh.second;
    const int bpseq = L / kBS;
    const double tokens = (double)b * L;
    const double bytes8 = tokens * nkv * (2 * kD + 8), bytes16 = tokens * nkv * 4 * kD;
    // Copies of the batch's blocks so that consecutive launches miss L2.
    const int copies = (int)std::min<double>(32, std::max(1.0, std::ceil(400e6 / bytes16)));
    const size_t blocks = (size_t)b * bpseq * copies;
    Dev<uint8_t> k8(blocks * kBS * kD), v8(blocks * kBS * kD);
    Dev<float> ks(blocks * kBS), vs(blocks * kBS);
    Dev<uint16_t> k16(blocks * kBS * kD), v16(blocks * kBS * kD);
    fill_codes_kernel<<<1024, 256>>>(k8.p, k8.n, 1);
    fill_codes_kernel<<<1024, 256>>>(v8.p, v8.n, 2);
    fill_const_kernel<<<256, 256>>>(ks.p, ks.n, 1.f / 448.f);
    fill_const_kernel<<<256, 256>>>(vs.p, vs.n, 1.f / 448.f);
    fill_bf16_kernel<<<1024, 256>>>(k16.p, k16.n, 3);
    fill_bf16_kernel<<<1024, 256>>>(v16.p, v16.n, 4);
    std::vector<int> bt(blocks), bto((size_t)b * copies), ctx(b, L), rows(b);
    for (size_t i = 0; i < blocks; ++i) bt[i] = (int)i;
    std::shuffle(bt.begin(), bt.end(), rng);
    for (int c = 0; c < copies; ++c)
      for (int s = 0; s < b; ++s) bto[(size_t)c * b + s] = (c * b + s) * bpseq;
    for (int s = 0; s < b; ++s) rows[s] = s;
    Dev<int> d_bt(bt), d_bto(bto), d_ctx(ctx), d_rows(rows);
    Dev<float> q((size_t)b * nq * kD), out((size_t)b * nq * kD);
    fill_const_kernel<<<64, 256>>>(q.p, q.n, 0.01f);
    int splits = decode_attention_splits(b, nkv, g_sms, true);  // the FP8 launch's (the sweep changes it)
    const int splits16 = decode_attention_splits(b, nkv, g_sms);
    const size_t wsb = decode_attention_workspace_bytes(b, nq, nkv, kDecMaxSplitsBench);
    Dev<uint8_t> ws(std::max<size_t>(wsb, 1));
    ws.zero();
    CK(cudaDeviceSynchronize());
    auto args = [&](bool f8, int i) {
      DecodeAttnArgs a;
      a.q = q.p;
      if (f8) {
        a.k_cache8 = k8.p, a.v_cache8 = v8.p, a.k_scale = ks.p, a.v_scale = vs.p;
      } else {
        a.k_cache = reinterpret_cast<const __nv_bfloat16*>(k16.p);
        a.v_cache = reinterpret_cast<const __nv_bfloat16*>(v16.p);
      }
      a.block_size = kBS;
      a.n_q_heads = nq;
      a.n_kv_heads = nkv;
      a.scale = 0.088f;
      a.n_seqs = b;
      a.q_row = d_rows.p;
      a.ctx_len = d_ctx.p;
      a.bt_offset = d_bto.p + (size_t)(i % copies) * b;
      a.block_tables = d_bt.p;
      a.max_splits = f8 ? splits : splits16;
      a.out = out.p;
      a.workspace = wsb ? ws.p : nullptr;
      return a;
    };
    auto time_us = [&](bool f8) {
      const int launches = 4 * copies;
      const float ms = graph_replay_ms([&](int i, cudaStream_t s) { CK(attention_decode(args(f8, i), s)); },
                                       launches, 9, copies, 2);
      return ms * 1e3 / launches;
    };
    double us[2] = {time_us(false), time_us(true)};
    if (sweep) {
      DecodeAttnTuning t0, t;
      decode_attention_get_tuning(&t0);
      std::string line = fmt("sweep b%d/%d fp8 us (stages x tuning ctas/SM, doubled for FP8):", b, L);
      for (int st : {2, 3, 4})
        for (int c : {1, 2, 3}) {
          t = t0;
          t.stages = st;
          t.ctas_per_sm = c;
          decode_attention_set_tuning(&t);
          splits = decode_attention_splits(b, nkv, g_sms, true);
          line += fmt(" %dx%d=%.2f", st, c, time_us(true));
        }
      decode_attention_set_tuning(&t0);
      splits = decode_attention_splits(b, nkv, g_sms, true);
      printf("%s\n", line.c_str());
    }
    const double g16 = bytes16 / us[0] * 1e-3, g8 = bytes8 / us[1] * 1e-3;
    printf("%-8d %-8d %12.2f %12.2f %12.0f %12.0f %9.1f%% %9.1f%%\n", b, L, us[0], us[1], g16, g8,
           100 * g16 / 4460, 100 * g8 / 4460);
  }
}

int main(int argc, char** argv) {
  uint64_t seed = 1;
  bool do_bench = false, only = false, sweep = false;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], nullptr, 10);
    else if (!strcmp(argv[i], "--bench")) do_bench = true;
    else if (!strcmp(argv[i], "--bench-only")) do_bench = only = true;
    else if (!strcmp(argv[i], "--sweep")) do_bench = only = sweep = true;
    else {
      fprintf(stderr, "usage: kvfp8_check [--seed N] [--bench] [--bench-only] [--sweep]\n");
      return 2;
    }
  }
  rng.seed(seed);
  init_fp8();
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  g_sms = prop.multiProcessorCount;
  if (!only) {
    check_writer(37, 12, 1, 1);
    check_writer(600, 12, 1, 4);
    check_writer(19, 16, 2, 1);
    for (int st : {2, 3, 4}) {
      check_decode({1, 15, 16, 17, 100, 1000}, 12, 1, 0, st, "policy");
      check_decode({5000}, 12, 1, 0, st, "one long");
    }
    check_decode({33, 0, 4097, 250}, 12, 1, 1, 3, "unsplit, padding");
    check_decode({33, 2000, 4097, 250}, 12, 1, 16, 3, "16 splits");
    check_decode({700, 31, 2048}, 8, 2, 0, 3, "two kv heads");
    check_decode(std::vector<int>(64, 300), 12, 1, 0, 0, "batch 64");
    for (int rows : {64, 128}) {
      check_prefill({{0, 300}}, 12, 1, rows, "one prompt");
      check_prefill({{0, 1000}}, 12, 1, rows, "a 1k prompt");
      check_prefill({{2000, 257}}, 12, 1, rows, "a chunk after 2000");
      check_prefill({{0, 17}, {100, 64}, {4000, 5}, {0, 130}}, 12, 1, rows, "four sequences");
      check_prefill({{3000, 100}, {0, 333}}, 8, 2, rows, "two kv heads");
    }
    check_invalid();
  }
  if (do_bench) bench(sweep);
  const int fails = failed_checks();
  if (!only) print_table("err");
  print_summary("kvfp8_check", fails);
  return fails ? 1 : 0;
}
