// attn_check — checks attention_decode (cuda/kernels/attention.cu) against a
// float64 CPU reference of paged attention on fresh random inputs, and times it.
//
//   attn_check [--seed N] [--bench] [--bench-only] [--sweep] [--forms] [--cold] [--probe] [--json FILE]
//
// Correctness (default): random Q/K/V with per-sequence scales, shuffled block
// ids, unused cache slots filled with NaN (a read past a context shows), ctx 0
// padding rows, q_row a permutation, outputs poisoned (NaN / 0xFF) before each
// launch; relative L2 error against float64 (bf16 operands: tolerance 1e-2),
// FP8 output bit-identical to a CPU re-quantization of the kernel's own FP32
// row, two launches bitwise equal, a CUDA graph replayed with other contexts,
// the workspace shared by every case (zeroed once: counters must be reset).
// After every case the workspace's counter header is read back: a non-zero
// word is a FAIL naming the case, and the header is re-zeroed so that one
// failure cannot cascade into later cases. "shared ws": the runtime's pattern,
// one workspace (sized for the largest batch, zeroed once) used by batch sizes
// in turn with the policy's split counts (the shapes, and so the layouts,
// change from launch to launch).
// --bench: G=12, 1 KV head, block 16 (GLM-4.7 at TP8) over batch x context,
// 20 launches per CUDA graph, KV copies rotated so that L2 never holds them;
// µs per call, KV bytes, TB/s and % of 4.46 TB/s; the old path (attention_paged
// + attention_merge) on a few shapes. --json FILE writes the bench rows.
// --sweep: launch knobs (stages, split policy, min chunk, direct merge) on a
// few shapes, fastest first. --forms: at 16-64 sequences (ATTN_FORMS_BATCHES
// for others) the policy's launch against each form (1 split, or a cluster of
// 2, 4 or 8; 2-4 stages; 4 or 8 warps) forced.
#include <atomic>
#include <numeric>
#include <thread>

#include "kernels.h"

#define CHECK_NAME_W 22
#define CHECK_DETAIL_W 58
#include "check.cuh"

namespace glmk {
// Test hook defined in attention.cu (not part of kernels.h).
struct DecodeAttnTuning {
  int stages, min_chunk, direct_max, ctas_per_sm, cluster;
  int warps;  // warps per CTA: 0 auto, 4 or 8
};
void decode_attention_get_tuning(DecodeAttnTuning* t);
// Phase stamps of a probe build (-DGLMK_DEC_PROBE=1): 13 a CTA (12 stamps, the SM id), cleared
// by the call; 0 otherwise.
int decode_attention_probe(unsigned long long* out, int n);
void decode_attention_set_tuning(const DecodeAttnTuning* t);
// Clusters of the launch's max_splits CTAs the device holds at once for the
// stage count the launch would pick (0: the cluster form does not launch).
int decode_attention_cluster_capacity(const DecodeAttnArgs& a);
// Bytes at the start of every workspace holding the merge counters (zero between launches).
size_t decode_attention_counter_bytes();
}  // namespace glmk

using namespace glmk;

static int g_num_sms = 132;

// One workspace for every correctness case, zeroed only when (re)allocated:
// a launch that leaves a counter non-zero would break a later case, so every
// case checks the counter header after its launches (and re-zeroes it).
static void* g_ws = nullptr;
static size_t g_ws_bytes = 0;
static void* workspace(size_t bytes) {
  if (bytes <= g_ws_bytes) return g_ws;
  if (g_ws) CK(cudaFree(g_ws));
  g_ws_bytes = std::max(bytes, (size_t)1 << 20);
  CK(cudaMalloc(&g_ws, g_ws_bytes));
  CK(cudaMemset(g_ws, 0, g_ws_bytes));
  return g_ws;
}

// Non-zero words in the counter header of a workspace (after a completed
// launch: all zero); re-zeroes the header when it finds any. Synchronizes.
static size_t dirty_counters(void* ws, size_t ws_bytes) {
  if (!ws) return 0;
  CK(cudaDeviceSynchronize());
  const size_t words = std::min(decode_attention_counter_bytes(), ws_bytes) / sizeof(int);
  std::vector<int> h(words);
  CK(cudaMemcpy(h.data(), ws, words * sizeof(int), cudaMemcpyDeviceToHost));
  size_t bad = 0;
  for (int v : h) bad += v != 0;
  if (bad) CK(cudaMemset(ws, 0, words * sizeof(int)));
  return bad;
}

// One row per case: the counter words left non-zero after each of its launches.
static void report_counters(const std::string& what, const std::vector<size_t>& dirty) {
  std::string list;
  size_t total = 0;
  for (size_t d : dirty) {
    list += (list.empty() ? "" : "/") + std::to_string(d);
    total += d;
  }
  report("  counters reset", fmt("%s: non-zero counter words after each launch: %s", what.c_str(), list.c_str()),
         (double)total, 0);
}

// ------------------------------------------------------------ problem

// One decode batch on the host: paged caches, tables, queries.
struct Problem {
  int n = 0, G = 12, n_kv = 1, NH = 12, bs = 16, rows = 0, pool = 0;
  std::vector<int> ctx, q_row, bt, bt_off;
  std::vector<uint16_t> kc, vc;  // [pool][n_kv][bs][128] bf16 bits
  std::vector<float> q;          // [rows][NH][128]
};

static Problem make_problem(const std::vector<int>& ctx, int G, int n_kv, int bs) {
  Problem P;
  P.n = (int)ctx.size();
  P.G = G;
  P.n_kv = n_kv;
  P.NH = G * n_kv;
  P.bs = bs;
  P.ctx = ctx;
  P.rows = P.n + 3;
  // q_row: distinct rows, a random permutation (not the identity).
  std::vector<int> perm(P.rows);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  P.q_row.assign(perm.begin(), perm.begin() + P.n);
  bool ident = true;
  for (int s = 0; s < P.n; ++s) ident &= P.q_row[s] == s;
  if (ident) P.q_row[0] = P.n + 1;
  // Block tables: shuffled pool ids, 0-2 unrelated entries before each table.
  int total = 0;
  for (int c : ctx) total += (c + bs - 1) / bs;
  P.pool = total + 5;
  std::vector<int> ids(P.pool);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  int used = 0;
  P.bt_off.resize(P.n);
  for (int s = 0; s < P.n; ++s) {
    for (int j = randi(0, 2); j > 0; --j) P.bt.push_back(randi(0, P.pool - 1));
    P.bt_off[s] = (int)P.bt.size();
    for (int b = 0; b < (ctx[s] + bs - 1) / bs; ++b) P.bt.push_back(ids[used++]);
  }
  if (P.bt.empty()) P.bt.push_back(0);
  // Caches: NaN everywhere no context reaches, random values elsewhere.
  const size_t cache_n = (size_t)P.pool * n_kv * bs * 128;
  P.kc.assign(cache_n, kBf16NaN);
  P.vc.assign(cache_n, kBf16NaN);
  FastRng fr{rng()};
  P.q.resize((size_t)P.rows * P.NH * 128);
  for (auto& v : P.q) v = fr.nrm();
  for (int s = 0; s < P.n; ++s) {
    const float ks = randu(0.5f, 1.5f);
    const float qs = randu(0.3f, 2.0f) / ks;       // scores ~ N(0, (qs*ks)^2)
    const float vs = std::pow(10.f, randu(-1, 1));  // varied V scales
    float* qr = &P.q[(size_t)P.q_row[s] * P.NH * 128];
    for (int i = 0; i < P.NH * 128; ++i) qr[i] *= qs;
    for (int key = 0; key < ctx[s]; ++key) {
      const int blk = P.bt[P.bt_off[s] + key / bs];
      for (int h = 0; h < n_kv; ++h) {
        const size_t base = (((size_t)blk * n_kv + h) * bs + key % bs) * 128;
        for (int d = 0; d < 128; ++d) {
          P.kc[base + d] = bf16_bits(fr.nrm() * ks);
          P.vc[base + d] = bf16_bits(fr.nrm() * vs);
        }
      }
    }
  }
  return P;
}

// float64 reference: out[row][head][d] for every sequence row (zeros for ctx 0).
static std::vector<double> reference(const Problem& P, float scale) {
  std::vector<double> ref((size_t)P.rows * P.NH * 128, 0.0);
  std::atomic<int> next{0};
  auto work = [&]() {
    std::vector<double> sc, acc(128);
    for (int s; (s = next++) < P.n;) {
      const int c = P.ctx[s];
      if (c <= 0) continue;
      sc.resize(c);
      for (int h = 0; h < P.NH; ++h) {
        const int kvh = h / P.G;
        const float* qv = &P.q[((size_t)P.q_row[s] * P.NH + h) * 128];
        double mx = -1e300;
        for (int key = 0; key < c; ++key) {
          const size_t base = (((size_t)P.bt[P.bt_off[s] + key / P.bs] * P.n_kv + kvh) * P.bs + key % P.bs) * 128;
          double d0 = 0;
          for (int d = 0; d < 128; ++d) d0 += (double)qv[d] * bf16_val(P.kc[base + d]);
          sc[key] = d0 * (double)scale;
          mx = std::max(mx, sc[key]);
        }
        double l = 0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int key = 0; key < c; ++key) {
          const double p = std::exp(sc[key] - mx);
          l += p;
          const size_t base = (((size_t)P.bt[P.bt_off[s] + key / P.bs] * P.n_kv + kvh) * P.bs + key % P.bs) * 128;
          for (int d = 0; d < 128; ++d) acc[d] += p * bf16_val(P.vc[base + d]);
        }
        double* o = &ref[((size_t)P.q_row[s] * P.NH + h) * 128];
        for (int d = 0; d < 128; ++d) o[d] = acc[d] / l;
      }
    }
  };
  const int nt = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  std::vector<std::thread> th;
  for (int i = 0; i < nt; ++i) th.emplace_back(work);
  for (auto& t : th) t.join();
  return ref;
}

// Device copy of a problem plus outputs.
struct DevProblem {
  Dev<uint16_t> kc, vc;
  Dev<float> q, out, out_scale;
  Dev<uint8_t> out_q;
  Dev<int> ctx, q_row, bt, bt_off;
  explicit DevProblem(const Problem& P)
      : kc(P.kc), vc(P.vc), q(P.q), out((size_t)P.rows * P.NH * 128), out_scale(P.rows),
        out_q((size_t)P.rows * P.NH * 128), ctx(P.ctx.empty() ? std::vector<int>(1) : P.ctx),
        q_row(P.q_row.empty() ? std::vector<int>(1) : P.q_row), bt(P.bt),
        bt_off(P.bt_off.empty() ? std::vector<int>(1) : P.bt_off) {}
  void poison() {
    out.poison();
    out_q.poison();
    out_scale.poison();
  }
  DecodeAttnArgs args(const Problem& P, int max_splits, bool fp8, bool with_out, void* ws) {
    DecodeAttnArgs a;
    a.q = q.p;
    a.k_cache = reinterpret_cast<const __nv_bfloat16*>(kc.p);
    a.v_cache = reinterpret_cast<const __nv_bfloat16*>(vc.p);
    a.block_size = P.bs;
    a.n_q_heads = P.NH;
    a.n_kv_heads = P.n_kv;
    a.scale = 1.0f / std::sqrt(128.0f);
    a.n_seqs = P.n;
    a.q_row = q_row.p;
    a.ctx_len = ctx.p;
    a.bt_offset = bt_off.p;
    a.block_tables = bt.p;
    a.max_splits = max_splits;
    a.out = with_out ? out.p : nullptr;
    a.out_q = fp8 ? out_q.p : nullptr;
    a.out_scale = fp8 ? out_scale.p : nullptr;
    a.workspace = ws;
    return a;
  }
};

static bool same_bits(const void* a, const void* b, size_t n) { return memcmp(a, b, n) == 0; }

// Compares a launch's outputs with the reference; returns the number of failed checks.
static int check_outputs(const std::string& name, const std::string& what, const Problem& P,
                         const std::vector<double>& ref, const std::vector<float>& out,
                         const std::vector<uint8_t>* oq, const std::vector<float>* os) {
  int fails = 0;
  const size_t W = (size_t)P.NH * 128;
  std::vector<char> is_seq_row(P.rows, 0);
  std::vector<double> o, r;
  size_t pad_bad = 0, stray = 0;
  for (int s = 0; s < P.n; ++s) {
    const int row = P.q_row[s];
    is_seq_row[row] = 1;
    for (size_t i = 0; i < W; ++i) {
      const float v = out[row * W + i];
      o.push_back(v);
      r.push_back(ref[row * W + i]);
      if (P.ctx[s] <= 0 && !(v == 0.0f && !std::signbit(v))) ++pad_bad;
    }
  }
  for (int row = 0; row < P.rows; ++row) {
    if (is_seq_row[row]) continue;
    for (size_t i = 0; i < W; ++i) {
      uint32_t u;
      memcpy(&u, &out[row * W + i], 4);
      stray += u != 0xffffffffu;
    }
  }
  const double err = rel_err(o, r);
  report(name, what, err, 1e-2);
  fails += !(std::isfinite(err) && err <= 1e-2);
  if (pad_bad || stray) {
    report(name, fmt("%s: padding rows not zero (%zu) / stray writes (%zu)", what.c_str(), pad_bad, stray), 1, 0);
    ++fails;
  }
  if (oq) {
    // CPU re-quantization of the kernel's own FP32 rows, as quant_rows_fp8 does.
    size_t bad = 0, bad_scale = 0;
    for (int s = 0; s < P.n; ++s) {
      const int row = P.q_row[s];
      float amax = 0;
      for (size_t i = 0; i < W; ++i) amax = std::max(amax, std::fabs(out[row * W + i]));
      const float sc = std::max(amax / 448.0f, 1.0f / (448.0f * 512.0f));
      uint32_t a, b;
      memcpy(&a, &sc, 4);
      memcpy(&b, &(*os)[row], 4);
      bad_scale += a != b;
      for (size_t i = 0; i < W; ++i) bad += fp8_enc(out[row * W + i] * (1.0f / sc)) != (*oq)[row * W + i];
    }
    for (int row = 0; row < P.rows; ++row) {
      if (is_seq_row[row]) continue;
      for (size_t i = 0; i < W; ++i) bad += (*oq)[row * W + i] != 0xff;  // untouched
    }
    report(name + " fp8", fmt("%s: codes/scales differing from quant_rows_fp8: %zu/%zu", what.c_str(), bad, bad_scale),
           (double)(bad + bad_scale), 0);
    fails += (bad + bad_scale) != 0;
  }
  return fails;
}

struct CaseCfg {
  std::string what;
  std::vector<int> ctx;
  int G = 12, n_kv = 1, bs = 16;
  int max_splits = 0;  // 0: decode_attention_splits
  bool fp8 = false;
};

static void run_case(const CaseCfg& c) {
  Problem P = make_problem(c.ctx, c.G, c.n_kv, c.bs);
  const int splits = c.max_splits > 0 ? c.max_splits : decode_attention_splits(P.n, P.n_kv, g_num_sms);
  int cmax = 0;
  for (int x : c.ctx) cmax = std::max(cmax, x);
  const std::string what =
      fmt("%s: n=%d G=%d kv=%d bs=%d splits=%d%s ctx<=%d", c.what.c_str(), P.n, P.G, P.n_kv, P.bs, splits,
          c.fp8 ? " fp8" : "", cmax);
  DevProblem D(P);
  void* ws = workspace(decode_attention_workspace_bytes(P.n, P.NH, P.n_kv, splits));
  const std::vector<double> ref = reference(P, 1.0f / std::sqrt(128.0f));

  std::vector<size_t> dirty;
  // One launch on poisoned outputs: its FP32 rows, FP8 codes and scales.
  struct Outs {
    std::vector<float> o;
    std::vector<uint8_t> q;
    std::vector<float> s;
  };
  auto launch = [&](const DecodeAttnArgs& a) {
    D.poison();
    CK(attention_decode(a, 0));
    CK(cudaDeviceSynchronize());
    dirty.push_back(dirty_counters(g_ws, g_ws_bytes));
    return Outs{D.out.down(), D.out_q.down(), D.out_scale.down()};
  };
  const Outs first = launch(D.args(P, splits, c.fp8, true, ws));
  const auto& out1 = first.o;
  const auto& oq1 = first.q;
  const auto& os1 = first.s;
  check_outputs("attention_decode", what, P, ref, out1, c.fp8 ? &oq1 : nullptr, c.fp8 ? &os1 : nullptr);

  // Determinism: a second launch gives the same bits (and, below, the short
  // context class where the shape has one).
  auto same_outs = [&](const Outs& r) {
    bool eq = same_bits(r.o.data(), out1.data(), out1.size() * 4);
    if (c.fp8) eq = eq && same_bits(r.q.data(), oq1.data(), oq1.size()) && same_bits(r.s.data(), os1.data(), os1.size() * 4);
    return eq;
  };
  report("  deterministic", what, same_outs(launch(D.args(P, splits, c.fp8, true, ws))) ? 0 : 1, 0);
  // The two merge forms, workspace and cluster (2, 4, 8 or 16 splits): the
  // same bits. On sm_90 the cluster form must launch.
  const int eff = P.n * P.n_kv > 1024 ? 1 : splits;  // (more pairs than the counters: unsplit)
  if (eff == 2 || eff == 4 || eff == 8 || eff == 16) {
    if (decode_attention_cluster_capacity(D.args(P, splits, c.fp8, true, ws)) <= 0) {
      report("  cluster form", what + ": does not launch", 1, 0);
    } else {
      DecodeAttnTuning cur;
      decode_attention_get_tuning(&cur);
      bool eq = true;
      for (int m = 1; m <= 2; ++m) {  // 1: workspace, 2: cluster
        DecodeAttnTuning t = cur;
        t.cluster = m;
        decode_attention_set_tuning(&t);
        eq = same_outs(launch(D.args(P, splits, c.fp8, true, ws))) && eq;
      }
      decode_attention_set_tuning(&cur);
      report("  cluster = workspace", what, eq ? 0 : 1, 0);
    }
  }
  // The short-context class, whatever the real contexts (the hint chooses the
  // form, never the result): the same bits as without it.
  if (decode_attention_ctx_class(P.n, P.n_kv, splits, false, 0) == kDecCtxShort) {
    const std::string cw = what + " class short";
    DecodeAttnArgs a = D.args(P, splits, c.fp8, true, ws);
    a.ctx_class = kDecCtxShort;
    const Outs r = launch(a);
    check_outputs("attention_decode", cw, P, ref, r.o, c.fp8 ? &r.q : nullptr, c.fp8 ? &r.s : nullptr);
    report("  short class = default", cw, same_outs(r) ? 0 : 1, 0);
  }
  if (c.fp8) {
    // FP8 only (out == nullptr): the same codes and scales, out untouched.
    D.poison();
    CK(attention_decode(D.args(P, splits, true, false, ws), 0));
    CK(cudaDeviceSynchronize());
    dirty.push_back(dirty_counters(g_ws, g_ws_bytes));
    const auto out3 = D.out.down();
    bool ok = same_bits(oq1.data(), D.out_q.down().data(), oq1.size()) &&
              same_bits(os1.data(), D.out_scale.down().data(), os1.size() * 4);
    size_t touched = 0;
    for (float v : out3) {
      uint32_t u;
      memcpy(&u, &v, 4);
      touched += u != 0xffffffffu;
    }
    report("  fp8 without out", fmt("%s: out elements written %zu", what.c_str(), touched), ok && !touched ? 0 : 1, 0);
  }
  report_counters(what, dirty);
}

// Mixed context lengths drawn from `pool`, a few zeros (padding) included.
static std::vector<int> mixed(int n, const std::vector<int>& pool, int zeros) {
  std::vector<int> v(n);
  for (int i = 0; i < n; ++i) v[i] = pool[randi(0, (int)pool.size() - 1)];
  for (int i = 0; i < zeros && i < n; ++i) v[randi(0, n - 1)] = 0;
  return v;
}

// The launch captured once in a CUDA graph and replayed with other contexts,
// rows and tables (everything per step is read on the device), then launched
// directly again: the counters must be back at zero after every launch.
static void check_graph() {
  const int n = 16, G = 12, bs = 16;
  const std::vector<int> all = {1, 2, 15, 16, 17, 100, 1000, 2049, 5000, 16384};
  std::vector<int> ctxA = mixed(n, all, 2), ctxB = mixed(n, all, 1);
  ctxA[0] = 16384;
  ctxB[1] = 16384;
  Problem A = make_problem(ctxA, G, 1, bs);
  Problem B = make_problem(ctxB, G, 1, bs);
  const int splits = decode_attention_splits(n, 1, g_num_sms);
  void* ws = workspace(decode_attention_workspace_bytes(n, G, 1, splits));
  const auto refA = reference(A, 1.0f / std::sqrt(128.0f));
  const auto refB = reference(B, 1.0f / std::sqrt(128.0f));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  // The graph's device buffers, big enough for either problem; each step copies
  // one problem into them before the replay.
  const size_t cache_n = std::max(A.kc.size(), B.kc.size());
  Dev<uint16_t> kc(cache_n), vc(cache_n);
  Dev<float> q((size_t)A.rows * A.NH * 128), out((size_t)A.rows * A.NH * 128), osc(A.rows);
  Dev<uint8_t> oq((size_t)A.rows * A.NH * 128);
  Dev<int> dctx(n), drow(n), dbt(std::max(A.bt.size(), B.bt.size())), dbto(n);
  auto load = [&](const Problem& P) {
    CK(cudaMemcpy(kc.p, P.kc.data(), P.kc.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(vc.p, P.vc.data(), P.vc.size() * 2, cudaMemcpyHostToDevice));
    q.up(P.q);
    dctx.up(P.ctx);
    drow.up(P.q_row);
    CK(cudaMemcpy(dbt.p, P.bt.data(), P.bt.size() * 4, cudaMemcpyHostToDevice));
    dbto.up(P.bt_off);
    out.poison();
    oq.poison();
    osc.poison();
  };
  DecodeAttnArgs a;
  a.q = q.p;
  a.k_cache = reinterpret_cast<const __nv_bfloat16*>(kc.p);
  a.v_cache = reinterpret_cast<const __nv_bfloat16*>(vc.p);
  a.block_size = bs;
  a.n_q_heads = G;
  a.n_kv_heads = 1;
  a.scale = 1.0f / std::sqrt(128.0f);
  a.n_seqs = n;
  a.q_row = drow.p;
  a.ctx_len = dctx.p;
  a.bt_offset = dbto.p;
  a.block_tables = dbt.p;
  a.max_splits = splits;
  a.out = out.p;
  a.out_q = oq.p;
  a.out_scale = osc.p;
  a.workspace = ws;
  load(A);
  CK(attention_decode(a, s));  // first launch outside the capture (attributes set)
  CK(cudaStreamSynchronize(s));
  report_counters(fmt("graph first launch: n=%d splits=%d fp8", n, splits), {dirty_counters(g_ws, g_ws_bytes)});
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  CK(attention_decode(a, s));
  CK(cudaStreamEndCapture(s, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  const char* names[4] = {"graph replay A", "graph replay B", "graph replay B x3", "direct launch A"};
  for (int step = 0; step < 4; ++step) {
    const Problem& P = (step == 1 || step == 2) ? B : A;
    const auto& ref = (step == 1 || step == 2) ? refB : refA;
    load(P);
    if (step == 3) {
      CK(attention_decode(a, s));
    } else {
      for (int r = 0; r < (step == 2 ? 3 : 1); ++r) CK(cudaGraphLaunch(exec, s));
    }
    CK(cudaStreamSynchronize(s));
    const auto o = out.down();
    const auto q8 = oq.down();
    const auto sc = osc.down();
    const std::string what = fmt("%s: n=%d splits=%d fp8", names[step], n, splits);
    check_outputs("graph", what, P, ref, o, &q8, &sc);
    report_counters(what, {dirty_counters(g_ws, g_ws_bytes)});
  }
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  CK(cudaStreamDestroy(s));
}

// Programmatic dependent launch: a writer kernel triggers its dependents at
// once, spins ~30 us, then copies the live q and the whole K/V caches from
// "new" buffers; attention_decode launched with pdl = 1 right after must
// compute with the new values (its prologue reads only metadata and block
// tables, and prefetches KV lines into L2, before griddepcontrol.wait). Eager
// and inside a captured graph.
__global__ void pdl_writer_kernel(const float* __restrict__ q_new, float* __restrict__ q, size_t nq,
                                  const uint16_t* __restrict__ k_new, const uint16_t* __restrict__ v_new,
                                  uint16_t* __restrict__ k, uint16_t* __restrict__ v, size_t nkv) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const long long t0 = clock64();
  while (clock64() - t0 < 60000) {
  }
  const size_t i0 = blockIdx.x * (size_t)blockDim.x + threadIdx.x, step = (size_t)gridDim.x * blockDim.x;
  for (size_t i = i0; i < nq; i += step) q[i] = q_new[i];
  for (size_t i = i0; i < nkv; i += step) {
    k[i] = k_new[i];
    v[i] = v_new[i];
  }
}

static void check_pdl() {
  const int n = 4, G = 12;
  std::vector<int> ctx = {2049, 17, 1000, 300};
  Problem P = make_problem(ctx, G, 1, 16);
  const auto ref = reference(P, 1.0f / std::sqrt(128.0f));
  DevProblem D(P);
  // Stale live values: the kernel must never compute with these.
  std::vector<float> q_stale(P.q.size());
  for (auto& x : q_stale) x = randn();
  std::vector<uint16_t> kv_stale(P.kc.size());
  for (auto& x : kv_stale) x = bf16_bits(randn());
  Dev<float> q_new(P.q);
  Dev<uint16_t> k_new(P.kc), v_new(P.vc);
  const int splits = decode_attention_splits(n, 1, g_num_sms);
  void* ws = workspace(decode_attention_workspace_bytes(n, G, 1, splits));
  DecodeAttnArgs a = D.args(P, splits, true, true, ws);
  a.pdl = 1;
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  auto pair = [&]() {
    pdl_writer_kernel<<<132, 256, 0, s>>>(q_new.p, D.q.p, P.q.size(), k_new.p, v_new.p, D.kc.p, D.vc.p, P.kc.size());
    CK(cudaGetLastError());
    CK(attention_decode(a, s));
  };
  auto stale = [&]() {
    D.q.up(q_stale);
    D.kc.up(kv_stale);
    D.vc.up(kv_stale);
    D.poison();
  };
  // (And with the shared memory padded to one CTA per SM, as the runtime
  // launches it early past 8 sequences.)
  for (int mode = 0; mode < 4; ++mode) {
    a.one_per_sm = mode >= 2;
    stale();
    if (mode % 2 == 0) {
      pair();
    } else {
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
      pair();
      CK(cudaStreamEndCapture(s, &graph));
      CK(cudaGraphInstantiate(&exec, graph, 0));
      CK(cudaGraphLaunch(exec, s));
      CK(cudaStreamSynchronize(s));
      stale();
      CK(cudaGraphLaunch(exec, s));
      CK(cudaGraphExecDestroy(exec));
      CK(cudaGraphDestroy(graph));
    }
    CK(cudaStreamSynchronize(s));
    const auto o = D.out.down();
    const auto q8 = D.out_q.down();
    const auto sc = D.out_scale.down();
    const std::string what = fmt("pdl after a writer (%s%s): n=%d splits=%d fp8", mode % 2 ? "graph" : "eager",
                                 a.one_per_sm ? ", one per SM" : "", n, splits);
    check_outputs("pdl", what, P, ref, o, &q8, &sc);
    report_counters(what, {dirty_counters(g_ws, g_ws_bytes)});
  }
  CK(cudaStreamDestroy(s));
}

// The runtime's pattern: one workspace sized for the largest batch (the most
// any batch size's policy split count needs, as cuda/runtime/memory.cu does),
// zeroed once, then batch sizes in turn, each with its policy split count, so
// the shape changes between launches. Every (sequence, KV head) has enough
// keys to split, most enough for the two-level merge.
static void check_shared_workspace() {
  const int G = 12, bs = 16, max_n = 128;
  size_t bytes = 0;
  for (int n = 1; n <= max_n; ++n)
    bytes = std::max(bytes, decode_attention_workspace_bytes(n, G, 1, decode_attention_splits(n, 1, g_num_sms)));
  Dev<uint8_t> ws(std::max<size_t>(bytes, 1));
  CK(cudaMemset(ws.p, 0, ws.n));
  for (int n : {1, 16, 4, 24, 2, 40, 8, 13, 64, 1, 10, 128, 3}) {
    std::vector<int> ctx(n);
    for (auto& c : ctx) c = randi(200, 4000);
    ctx[n - 1] = n <= 16 ? 16384 : ctx[n - 1];
    Problem P = make_problem(ctx, G, 1, bs);
    const int splits = decode_attention_splits(n, 1, g_num_sms);
    const std::string what = fmt("n=%d splits=%d fp8 (workspace %zu bytes)", n, splits, ws.n);
    DevProblem D(P);
    const auto ref = reference(P, 1.0f / std::sqrt(128.0f));
    D.poison();
    CK(attention_decode(D.args(P, splits, true, true, ws.p), 0));
    CK(cudaDeviceSynchronize());
    const auto o = D.out.down();
    const auto q8 = D.out_q.down();
    const auto sc = D.out_scale.down();
    check_outputs("shared ws", what, P, ref, o, &q8, &sc);
    report_counters(what, {dirty_counters(ws.p, ws.n)});
  }
}

static void check_invalid() {
  Problem P = make_problem({40, 0}, 12, 1, 16);
  DevProblem D(P);
  void* ws = workspace(decode_attention_workspace_bytes(2, 32, 2, 8));
  auto expect = [&](const char* what, DecodeAttnArgs a, cudaError_t want) {
    const cudaError_t got = attention_decode(a, 0);
    report("invalid shapes", fmt("%s: %s", what, cudaGetErrorName(got)), got == want ? 0 : 1, 0);
  };
  DecodeAttnArgs a = D.args(P, 4, false, true, ws);
  DecodeAttnArgs b = a;
  b.block_size = 24;
  expect("block_size 24", b, cudaErrorInvalidValue);
  b = a;
  b.n_q_heads = 17;
  expect("G 17", b, cudaErrorInvalidValue);
  b = a;
  b.n_q_heads = 24;
  b.n_kv_heads = 2;
  b.out_q = D.out_q.p;
  b.out_scale = D.out_scale.p;
  expect("out_q with 2 KV heads", b, cudaErrorInvalidValue);
  b = a;
  b.n_q_heads = 13;
  b.n_kv_heads = 2;
  expect("13 heads / 2 KV heads", b, cudaErrorInvalidValue);
  b = a;
  b.n_seqs = 0;
  expect("n_seqs 0", b, cudaSuccess);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
}

// ------------------------------------------------------------ bench

static __global__ void fill_f32_kernel(float* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const uint64_t z = mix64(seed + i * 0x9E3779B97F4A7C15ull);
    p[i] = ((float)(z & 0xffffff) / 16777216.0f - 0.5f) * 3.0f;
  }
}

struct BenchResult {
  std::string shape;
  double us = 0, mb = 0, tbs = 0, old_us = 0;
  int splits = 0;
};

// Paged KV for `batch` sequences of `ctx` keys, `copies` times over (each copy
// its own blocks, tables shuffled), plus queries and outputs.
struct BenchSetup {
  int batch, ctx, copies, bpc;  // blocks per copy
  Dev<uint16_t> kc, vc;
  Dev<int> bt;                  // [copies][bpc]
  std::vector<Dev<int>*> bt_off;  // per copy [batch]
  Dev<int> ctx_len, q_row, positions;
  Dev<float> q, out, out_scale;
  Dev<uint8_t> out_q;
  BenchSetup(int B, int C, int n_copies)
      : batch(B), ctx(C), copies(n_copies), bpc(B * C / 16), kc((size_t)n_copies * B * C * 128),
        vc((size_t)n_copies * B * C * 128), bt((size_t)n_copies * B * C / 16), ctx_len(std::vector<int>(B, C)),
        q_row(B), positions(std::vector<int>(B, C - 1)), q((size_t)B * 12 * 128), out((size_t)B * 12 * 128),
        out_scale(B), out_q((size_t)B * 12 * 128) {
    fill_bf16_kernel<<<2048, 256>>>(kc.p, kc.n, rng());
    fill_bf16_kernel<<<2048, 256>>>(vc.p, vc.n, rng());
    fill_f32_kernel<<<64, 256>>>(q.p, q.n, rng());
    CK(cudaGetLastError());
    std::vector<int> rows(B);
    std::iota(rows.begin(), rows.end(), 0);
    q_row.up(rows);
    std::vector<int> perm(bpc);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<int> h((size_t)copies * bpc);
    for (int c = 0; c < copies; ++c)
      for (int i = 0; i < bpc; ++i) h[(size_t)c * bpc + i] = c * bpc + perm[i];
    bt.up(h);
    for (int c = 0; c < copies; ++c) {
      std::vector<int> off(B);
      for (int s = 0; s < B; ++s) off[s] = c * bpc + s * (C / 16);
      bt_off.push_back(new Dev<int>(off));
    }
    CK(cudaDeviceSynchronize());
  }
  ~BenchSetup() {
    for (auto* p : bt_off) delete p;
  }
};

// Per-call µs: `launch(i, stream)` for i = 0..19 captured in each of `graphs`
// graphs (graph g passes 20g + i), the graphs replayed round-robin `reps`
// times after a warm-up round, median replay / 20.
template <typename F>
static double time_graphs(int graphs, int reps, F launch) {
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (int i = 0; i < 2; ++i) launch(i, s);  // attributes, first-touch
  CK(cudaStreamSynchronize(s));
  std::vector<cudaGraphExec_t> ex(graphs);
  for (int g = 0; g < graphs; ++g) {
    cudaGraph_t gr;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    for (int i = 0; i < 20; ++i) launch(20 * g + i, s);
    CK(cudaStreamEndCapture(s, &gr));
    CK(cudaGraphInstantiate(&ex[g], gr, 0));
    CK(cudaGraphDestroy(gr));
  }
  for (int g = 0; g < graphs; ++g) CK(cudaGraphLaunch(ex[g], s));
  CK(cudaStreamSynchronize(s));
  const float ms = median_ms(reps, s, [&](int r) { CK(cudaGraphLaunch(ex[r % graphs], s)); });
  for (auto& e : ex) CK(cudaGraphExecDestroy(e));
  CK(cudaStreamDestroy(s));
  return ms * 1000.0 / 20.0;
}

static const double kPeakTBs = 4.46;

static int copies_for(double bytes) {
  const double rot = 200e6;  // rotate over at least this many bytes (L2: 50-60 MB)
  return bytes >= rot ? 1 : (int)std::ceil(rot / bytes);
}

// The bench's launch i of a BenchSetup (KV copy i % copies).
static DecodeAttnArgs bench_args(BenchSetup& S, int splits, void* ws, int i) {
  DecodeAttnArgs a;
  a.q = S.q.p;
  a.k_cache = reinterpret_cast<const __nv_bfloat16*>(S.kc.p);
  a.v_cache = reinterpret_cast<const __nv_bfloat16*>(S.vc.p);
  a.block_size = 16;
  a.n_q_heads = 12;
  a.n_kv_heads = 1;
  a.scale = 1.0f / std::sqrt(128.0f);
  a.n_seqs = S.batch;
  a.q_row = S.q_row.p;
  a.ctx_len = S.ctx_len.p;
  a.bt_offset = S.bt_off[i % S.copies]->p;
  a.block_tables = S.bt.p;
  a.max_splits = splits;
  a.out = S.out.p;
  a.out_q = S.out_q.p;
  a.out_scale = S.out_scale.p;
  a.workspace = ws;
  return a;
}

static double time_decode(BenchSetup& S, int splits, void* ws, int reps) {
  const int graphs = (S.copies + 19) / 20;
  return time_graphs(graphs, std::max(reps, graphs),
                     [&](int i, cudaStream_t st) { CK(attention_decode(bench_args(S, splits, ws, i), st)); });
}

// The previous path: plan_attention items (split over keys) + attention_paged + attention_merge.
static double time_old(BenchSetup& S, int reps) {
  std::vector<AttnSeqDesc> sd(S.batch);
  for (int s = 0; s < S.batch; ++s) sd[s] = AttnSeqDesc{s, 1, S.ctx - 1};
  std::vector<AttnItem> items((size_t)S.batch * (kAttnMaxSplits + 1));
  std::vector<AttnMerge> merges(S.batch);
  AttnPlan plan{items.data(), (int)items.size(), 0, merges.data(), (int)merges.size(), 0,
                S.batch * kAttnMaxSplits, 0};
  const char* why = nullptr;
  if (!plan_attention(sd.data(), S.batch, 12, &plan, &why)) {
    fprintf(stderr, "plan_attention: %s\n", why);
    exit(2);
  }
  items.resize(plan.n_items);
  merges.resize(std::max(1, plan.n_merges));
  Dev<AttnItem> di(items);
  Dev<AttnMerge> dm(merges);
  Dev<float> po((size_t)std::max(1, plan.n_parts) * 12 * 128), pml((size_t)std::max(1, plan.n_parts) * 12 * 2);
  const int graphs = (S.copies + 19) / 20;
  return time_graphs(graphs, std::max(reps, graphs), [&](int i, cudaStream_t st) {
    AttnArgs a;
    a.q = S.q.p;
    a.k_cache = S.kc.p;
    a.v_cache = S.vc.p;
    a.block_size = 16;
    a.n_q_heads = 12;
    a.n_kv_heads = 1;
    a.scale = 1.0f / std::sqrt(128.0f);
    a.positions = S.positions.p;
    a.seq_bt_offset = S.bt_off[i % S.copies]->p;
    a.block_tables = S.bt.p;
    a.items = di.p;
    a.n_items = plan.n_items;
    a.out = S.out.p;
    a.part_o = po.p;
    a.part_ml = pml.p;
    CK(attention_paged(a, st));
    CK(attention_merge(dm.p, plan.n_merges, 12, po.p, pml.p, S.out.p, st));
  });
}

// --- Cold-start experiment (--cold): why the kernel takes ~20 us inside a
// decode step at batch 1 but ~10 us back-to-back. In the step, ten other
// kernels (~320 KB of SASS) and gigabytes of weights run between two
// attention launches. Here each attention launch follows an evictor: a kernel
// with ~190 KB of straight-line code (instruction caches), optionally plus a
// 256 MB memset (L2: the kernel's code, metadata, Q and partials then come
// from HBM, as in the step). Attention time = (evictor + attention) - evictor.
template <int N>
__device__ __forceinline__ float chain(float x) {
#pragma unroll
  for (int i = 0; i < N; ++i) x = fmaf(x, 1.0000001f, 0.5f);
  return x;
}
__global__ void __launch_bounds__(128) evict_code_kernel(float* out, float seed) {
  float x = seed + threadIdx.x;
  x = chain<12000>(x);
  if (x == 12345.f) out[threadIdx.x] = x;  // never true: keeps the chain alive
}

static void bench_cold() {
  printf("\ncold-start experiment: per attention launch, after an evictor (20 pairs per graph)\n");
  printf("%-12s %9s %11s %13s %9s %11s\n", "shape", "warm_us", "after_code", "after_code+L2", "code_us", "code+L2_us");
  Dev<float> sink(128);
  Dev<uint8_t> flush((size_t)256 << 20);
  for (auto [B, C] : std::vector<std::pair<int, int>>{{1, 2048}, {1, 16384}, {16, 4096}, {64, 2048}}) {
    const double bytes = (double)B * C * 2 * 128 * 2;
    BenchSetup S(B, C, copies_for(bytes));
    const int splits = decode_attention_splits(B, 1, g_num_sms);
    Dev<uint8_t> ws(std::max<size_t>(1, decode_attention_workspace_bytes(B, 12, 1, splits)));
    CK(cudaMemset(ws.p, 0, ws.n));
    auto attn = [&](int i, cudaStream_t st) { CK(attention_decode(bench_args(S, splits, ws.p, i), st)); };
    auto evict = [&](cudaStream_t st, bool l2) {
      evict_code_kernel<<<g_num_sms, 128, 0, st>>>(sink.p, 1.0f);
      CK(cudaGetLastError());
      if (l2) CK(cudaMemsetAsync(flush.p, 0, flush.n, st));
    };
    const int graphs = (S.copies + 19) / 20, reps = 15;
    const double warm = time_graphs(graphs, std::max(reps, graphs), attn);
    const double code_attn = time_graphs(graphs, std::max(reps, graphs), [&](int i, cudaStream_t st) {
      evict(st, false);
      attn(i, st);
    });
    const double code = time_graphs(1, reps, [&](int, cudaStream_t st) { evict(st, false); });
    const double l2_attn = time_graphs(graphs, std::max(reps, graphs), [&](int i, cudaStream_t st) {
      evict(st, true);
      attn(i, st);
    });
    const double l2 = time_graphs(1, reps, [&](int, cudaStream_t st) { evict(st, true); });
    char name[32];
    snprintf(name, sizeof name, "b%d_c%d", B, C);
    printf("%-12s %9.2f %11.2f %13.2f %9.2f %11.2f\n", name, warm, code_attn - code, l2_attn - l2, code, l2);
  }
}

static std::vector<std::pair<int, int>> bench_shapes() {
  std::vector<std::pair<int, int>> v;
  for (int B : {1, 4, 16, 64, 128, 256}) {
    for (int C : {1024, 2048, 4096, 8192, 16384}) v.push_back({B, C});
    if (B <= 16) v.push_back({B, 32768});
  }
  // Around the short context class's bound (kDecShortMaxCtx).
  for (int C : {3072, 5120, 6144}) v.push_back({16, C});
  return v;
}

static void bench(const char* json) {
  printf("\nattention_decode bench: G=12, 1 KV head, head_dim 128, BF16 KV, block 16, FP32 out + FP8 out;\n"
         "20 launches per CUDA graph, median of replays; KV bytes = batch*ctx*2*128*2; peak %.2f TB/s\n",
         kPeakTBs);
  printf("ws_us: the workspace merge forced; cl_us: the cluster merge forced, with the splits shown (16 where\n"
         "the policy asks more)\n");
  printf("w4_us: the same launch with 4 warps a CTA (the form before 8-warp CTAs)\n");
  printf("cls_us: the launch with the short context class where this shape has one (S), forced\n");
  printf("%-12s %9s %9s %7s %7s %6s %9s %9s %9s %9s %9s\n", "shape", "us", "KV_MB", "TB/s", "%peak", "splits", "w4_us",
         "ws_us", "cl_us(sp)", "cls_us", "old_us");
  const std::vector<std::pair<int, int>> old_shapes = {{1, 2048}, {16, 8192}, {64, 2048},
                                                       {64, 8192}, {256, 2048}, {256, 8192}};
  std::vector<BenchResult> res;
  for (auto [B, C] : bench_shapes()) {
    const double bytes = (double)B * C * 2 * 128 * 2;
    BenchSetup S(B, C, copies_for(bytes));
    const int splits = decode_attention_splits(B, 1, g_num_sms);
    Dev<uint8_t> ws(std::max<size_t>(1, decode_attention_workspace_bytes(B, 12, 1, splits)));
    CK(cudaMemset(ws.p, 0, ws.n));
    BenchResult r;
    r.shape = fmt("b%d_c%d", B, C);
    r.splits = splits;
    r.us = time_decode(S, splits, ws.p, 30);
    r.mb = bytes / 1e6;
    r.tbs = bytes / (r.us * 1e-6) / 1e12;
    // The two merge forms forced (the cluster one with at most 16 splits).
    DecodeAttnTuning cur;
    decode_attention_get_tuning(&cur);
    DecodeAttnTuning t = cur;
    t.cluster = 1;
    decode_attention_set_tuning(&t);
    const double ws_us = splits > 1 ? time_decode(S, splits, ws.p, 30) : 0;
    const int csp = splits > 16 ? 16 : (splits & (splits - 1)) == 0 ? splits : 0;
    double cl_us = 0;
    if (csp > 1) {
      t.cluster = 2;
      decode_attention_set_tuning(&t);
      Dev<uint8_t> ws16(std::max<size_t>(1, decode_attention_workspace_bytes(B, 12, 1, csp)));
      CK(cudaMemset(ws16.p, 0, ws16.n));
      cl_us = time_decode(S, csp, ws16.p, 30);
    }
    t = cur;
    t.warps = 4;
    decode_attention_set_tuning(&t);
    const double w4_us = time_decode(S, splits, ws.p, 30);
    decode_attention_set_tuning(&cur);
    // The short class's form forced where this shape has one (whatever C).
    const int cls = decode_attention_ctx_class(B, 1, splits, false, 0);
    double cls_us = 0;
    if (cls != kDecCtxAny) {
      const int graphs = (S.copies + 19) / 20;
      cls_us = time_graphs(graphs, std::max(30, graphs), [&](int i, cudaStream_t st) {
        DecodeAttnArgs a = bench_args(S, splits, ws.p, i);
        a.ctx_class = cls;
        CK(attention_decode(a, st));
      });
    }
    for (auto& o : old_shapes)
      if (o.first == B && o.second == C) r.old_us = time_old(S, 20);
    printf("%-12s %9.2f %9.1f %7.3f %6.1f%% %6d %9.2f %9.2f %6.2f(%2d) %8.2f%c", r.shape.c_str(), r.us, r.mb, r.tbs,
           100 * r.tbs / kPeakTBs, r.splits, w4_us, ws_us, cl_us, csp, cls_us,
           cls == kDecCtxShort ? 'S' : '-');
    if (r.old_us > 0) printf(" %9.2f", r.old_us);
    printf("\n");
    fflush(stdout);
    res.push_back(r);
  }
  if (json) {
    FILE* f = fopen(json, "w");
    if (!f) {
      fprintf(stderr, "cannot write %s\n", json);
      exit(2);
    }
    fprintf(f, "[\n");
    for (size_t i = 0; i < res.size(); ++i) {
      const auto& r = res[i];
      fprintf(f, "  {\"shape\": \"%s\", \"us\": %.3f, \"kv_mb\": %.3f, \"tbs\": %.4f, \"splits\": %d, \"old_us\": %s}%s\n",
              r.shape.c_str(), r.us, r.mb, r.tbs, r.splits, r.old_us > 0 ? fmt("%.3f", r.old_us).c_str() : "null",
              i + 1 < res.size() ? "," : "");
    }
    fprintf(f, "]\n");
    fclose(f);
  }
}

// --probe (a probe build of attention.cu): per phase, µs from the first CTA's
// start, min / median / max over the CTAs that streamed keys, of one launch
// after warm-up. Stamps: 0 start, 1 metadata + block ids, 2 grid wait, 3 Q
// in registers, 4 first tile landed (warp 0), 5 loop done (warp 0), 6 warps
// merged, 7 exit; merges: cluster 8 the pushed partials landed, 9 slice
// merged, 10 the slice maxima landed; workspace (the last CTA) 8 counted
// last, 9 partials merged.
static void probe() {
  printf("\nattention_decode phases (us from the first CTA's start: min / median / max over CTAs with keys)\n");
  const char* names[11] = {"start", "ids", "wait", "Q", "tile0", "loop", "wmerge", "exit", "m8", "m9", "m10"};
  for (auto [B, C] : std::vector<std::pair<int, int>>{
           {1, 2048}, {1, 16384}, {4, 1024}, {4, 4096}, {16, 1024}, {16, 2048}, {16, 4096}, {64, 1024}, {64, 2048},
           {64, 16384}, {128, 1024}, {128, 16384}, {256, 16384}}) {
    const double bytes = (double)B * C * 2 * 128 * 2;
    BenchSetup S(B, C, copies_for(bytes));
    const int splits = decode_attention_splits(B, 1, g_num_sms);
    Dev<uint8_t> ws(std::max<size_t>(1, decode_attention_workspace_bytes(B, 12, 1, splits)));
    CK(cudaMemset(ws.p, 0, ws.n));
    const double us = time_decode(S, splits, ws.p, 10);
    constexpr int K = 13;
    std::vector<unsigned long long> st((size_t)2048 * K);
    if (decode_attention_probe(st.data(), 2048) == 0) {  // (clears)
      printf("not a probe build (-DGLMK_DEC_PROBE=1)\n");
      return;
    }
    CK(attention_decode(bench_args(S, splits, ws.p, 1), 0));
    CK(cudaDeviceSynchronize());
    const int n = decode_attention_probe(st.data(), 2048);
    unsigned long long t0 = ~0ull;
    std::vector<int> live;
    for (int c = 0; c < n; ++c)
      if (st[c * K + 5] != 0) {
        live.push_back(c);
        t0 = std::min(t0, st[c * K]);
      }
    printf("b%d_c%d (graph %.2f us, %zu CTAs with keys):", B, C, us, live.size());
    for (int k = 0; k < 11; ++k) {
      std::vector<double> v;
      for (int c : live)
        if (st[c * K + k] != 0) v.push_back((double)(st[c * K + k] - t0) / 1000.0);
      if (v.empty()) continue;
      std::sort(v.begin(), v.end());
      printf(" %s %.2f/%.2f/%.2f", names[k], v.front(), v[v.size() / 2], v.back());
    }
    printf("\n");
    if (C >= 16384) {  // the loop's end by SM: the fastest and slowest CTAs (us, SM id)
      std::vector<std::pair<double, int>> e;
      for (int c : live) e.push_back({(double)(st[c * K + 5] - t0) / 1000.0, (int)st[c * K + K - 1]});
      std::sort(e.begin(), e.end());
      printf("  loop end (us@SM): fastest");
      for (size_t i = 0; i < std::min<size_t>(12, e.size()); ++i) printf(" %.0f@%d", e[i].first, e[i].second);
      printf("; slowest");
      for (size_t i = e.size() > 12 ? e.size() - 12 : 0; i < e.size(); ++i) printf(" %.0f@%d", e[i].first, e[i].second);
      printf("\n  by SM (us):");
      std::vector<std::pair<int, double>> bysm;
      for (auto& x : e) bysm.push_back({x.second, x.first});  // (SM id in the last slot)
      std::sort(bysm.begin(), bysm.end());
      for (auto& x : bysm) printf(" %d:%.0f", x.first, x.second);
      printf("\n");
    }
    fflush(stdout);
  }
}

// --forms: at 16-64 sequences (ATTN_FORMS_BATCHES="..." for others), the
// policy's launch against every form (1 split, or a cluster of 2, 4 or 8;
// 2-4 stages; 4 or 8 warps) forced, µs.
static void forms() {
  printf("\nattention_decode forms: policy (splits) | sp/st[w8]: sp splits (a cluster past 1) at st stages, 4 warps (w8: 8)\n");
  DecodeAttnTuning def;
  decode_attention_get_tuning(&def);
  std::vector<int> batches = {16, 24, 32, 40, 48, 56, 64};
  if (const char* e = getenv("ATTN_FORMS_BATCHES")) {  // e.g. "80 128"
    batches.clear();
    for (const char* p = e; *p;) {
      char* end = nullptr;
      const long v = strtol(p, &end, 10);
      if (end == p) break;
      if (v > 0 && v <= 1024) batches.push_back((int)v);
      p = end;
    }
  }
  for (int B : batches)
    for (int C : {1024, 2048, 4096, 8192, 16384}) {
      const double bytes = (double)B * C * 2 * 128 * 2;
      BenchSetup S(B, C, copies_for(bytes));
      const int splits = decode_attention_splits(B, 1, g_num_sms);
      Dev<uint8_t> ws(std::max<size_t>(1, decode_attention_workspace_bytes(B, 12, 1, 16)));
      CK(cudaMemset(ws.p, 0, ws.n));
      printf("b%d_c%d policy %.2f (%d)", B, C, time_decode(S, splits, ws.p, 30), splits);
      for (int w : {4, 8})
        for (int sp : {1, 2, 4, 8})
          for (int st : {2, 3, 4}) {
            if (w == 8 && st == 4) continue;
            DecodeAttnTuning t = def;
            t.cluster = sp > 1 ? 2 : 0;
            t.stages = st;
            t.warps = w;
            decode_attention_set_tuning(&t);
            DecodeAttnArgs probe = bench_args(S, sp, ws.p, 0);
            if (sp == 1 || decode_attention_cluster_capacity(probe) >= B)
              printf(" | %d/%d%s %.2f", sp, st, w == 8 ? "w8" : "", time_decode(S, sp, ws.p, 30));
            decode_attention_set_tuning(&def);
          }
      printf("\n");
      fflush(stdout);
    }
}

// Launch knobs on a few shapes: every combination, the 5 fastest per shape.
static void sweep() {
  printf("\nattention_decode sweep (stages, ctas_per_sm of the split policy, min_chunk, direct_max)\n");
  DecodeAttnTuning def;
  decode_attention_get_tuning(&def);
  const std::vector<std::pair<int, int>> shapes = {{1, 2048}, {1, 16384}, {4, 8192}, {16, 4096},
                                                   {16, 8192}, {64, 2048}, {64, 8192}, {128, 4096},
                                                   {256, 2048}, {256, 8192}};
  for (auto [B, C] : shapes) {
    const double bytes = (double)B * C * 2 * 128 * 2;
    BenchSetup S(B, C, copies_for(bytes));
    struct R {
      DecodeAttnTuning t;
      int splits;
      double us;
    };
    std::vector<R> rs;
    for (int st : {2, 3, 4})
      for (int cps : {1, 2, 3, 4})
        for (int mc : {64, 128, 256})
          for (int dm : {8, 16, 32}) {
            if (B >= 64 && (mc != def.min_chunk || dm != def.direct_max)) continue;  // no effect there
            DecodeAttnTuning t{st, mc, dm, cps, def.cluster, def.warps};
            decode_attention_set_tuning(&t);
            const int splits = decode_attention_splits(B, 1, g_num_sms);
            Dev<uint8_t> ws(std::max<size_t>(1, decode_attention_workspace_bytes(B, 12, 1, splits)));
            CK(cudaMemset(ws.p, 0, ws.n));
            rs.push_back({t, splits, time_decode(S, splits, ws.p, 10)});
          }
    decode_attention_set_tuning(nullptr);
    std::sort(rs.begin(), rs.end(), [](const R& a, const R& b) { return a.us < b.us; });
    double def_us = 0;
    for (auto& r : rs)
      if (r.t.stages == (def.stages ? def.stages : (int64_t)r.splits * B <= g_num_sms ? 4 : 3) &&
          r.t.ctas_per_sm == def.ctas_per_sm && r.t.min_chunk == def.min_chunk &&
          r.t.direct_max == def.direct_max)
        def_us = r.us;
    printf("b%d_c%d (default %.2f us):", B, C, def_us);
    for (size_t i = 0; i < std::min<size_t>(5, rs.size()); ++i)
      printf("  [st%d cps%d mc%d dm%d sp%d] %.2f", rs[i].t.stages, rs[i].t.ctas_per_sm, rs[i].t.min_chunk,
             rs[i].t.direct_max, rs[i].splits, rs[i].us);
    printf("\n");
    fflush(stdout);
  }
}

int main(int argc, char** argv) {
  uint64_t seed = 0xa77e;
  bool do_bench = false, only_bench = false, do_sweep = false, do_cold = false, do_probe = false, do_forms = false;
  const char* json = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], nullptr, 0);
    else if (!strcmp(argv[i], "--bench")) do_bench = true;
    else if (!strcmp(argv[i], "--bench-only")) do_bench = only_bench = true;
    else if (!strcmp(argv[i], "--sweep")) do_sweep = only_bench = true;
    else if (!strcmp(argv[i], "--forms")) do_forms = only_bench = true;
    else if (!strcmp(argv[i], "--probe")) do_probe = only_bench = true;
    else if (!strcmp(argv[i], "--cold")) do_cold = only_bench = true;
    else if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
    else {
      fprintf(stderr, "usage: attn_check [--seed N] [--bench] [--bench-only] [--sweep] [--forms] [--cold] [--probe] [--json FILE]\n");
      return 2;
    }
  }
  rng.seed(seed);
  init_fp8();
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  g_num_sms = prop.multiProcessorCount;
  printf("device: %s, %d SMs, seed %llu\n", prop.name, prop.multiProcessorCount, (unsigned long long)seed);

  if (!only_bench) {
    const std::vector<int> all = {1, 2, 15, 16, 17, 100, 1000, 2049, 5000, 16384};
    const std::vector<int> mid = {1, 2, 15, 16, 17, 100, 1000, 2049, 5000};
    const std::vector<int> shortc = {1, 2, 15, 16, 17, 100, 1000, 2049};
    for (int c : all) run_case({"batch 1", {c}, 12, 1, 16, 0, true});
    run_case({"batch 1 ctx 32768", {32768}, 12, 1, 16, 0, true});
    run_case({"3 seqs, 2 KV heads", {0, 17, 2049}, 4, 2, 32, 0, false});
    {
      const std::vector<int> c16 = [&] {
        auto v = mixed(16, all, 2);
        v[3] = 16384;
        return v;
      }();
      for (int sp : {0, 1, 2, 7, 64}) run_case({"16 mixed", c16, 12, 1, 16, sp, true});
    }
    {
      const auto c64 = mixed(64, mid, 3);
      run_case({"64 mixed", c64, 16, 1, 32, 7, true});
      run_case({"64 mixed", c64, 16, 1, 32, 0, true});
    }
    // The mid batches' forms (decode_attention_splits, dec_shape): 4 splits
    // in clusters of 4 at 3 stages (24), 2 splits of 8 warps at 3 stages (32)
    // and at 2 (40, 48).
    for (int n : {20, 24, 32, 40, 48}) {
      auto c = mixed(n, all, 2);
      c[1] = 16384;
      run_case({fmt("%d mixed", n), c, 12, 1, 16, 0, true});
    }
    {
      auto c257 = mixed(257, shortc, 5);
      c257[10] = 16384;
      c257[200] = 5000;
      run_case({"257 mixed", c257, 12, 1, 16, 0, true});
      run_case({"257 mixed", c257, 12, 1, 16, 2, true});
    }
    // Cluster-sized splits (16, 4) over mixed contexts: sequences with fewer
    // active splits than the cluster, one split, and none (padding).
    run_case({"16 splits mixed", mixed(6, all, 1), 12, 1, 16, 16, true});
    run_case({"16 splits mixed", {16384, 2049, 17, 0, 128, 129}, 12, 1, 16, 16, true});
    run_case({"4 splits mixed", mixed(40, all, 3), 12, 1, 16, 4, true});
    run_case({"G=1, 2 KV heads", {16384, 1, 100}, 1, 2, 16, 64, false});
    run_case({"G=16, 2 KV heads", mixed(16, all, 1), 16, 2, 16, 64, false});
    run_case({"G=16, 2 KV heads", mixed(16, all, 1), 16, 2, 32, 0, false});
    run_case({"G=4, block 48", {1000, 47, 48, 49}, 4, 1, 48, 7, true});
    run_case({"G=12, 2 KV heads", mixed(3, all, 0), 24 / 2, 2, 16, 0, false});
    // More (sequence, KV head) pairs than the counter header holds: runs unsplit.
    run_case({"1025 seqs (unsplit)", mixed(1025, {1, 17, 100, 300, 1000}, 3), 12, 1, 16, 8, true});
    // Other launch knobs: two-level merge with a one-split group, every stage count.
    DecodeAttnTuning def;
    decode_attention_get_tuning(&def);
    const std::vector<DecodeAttnTuning> knobs = {{2, 128, 2, 2, 0, 8}, {4, 64, 4, 1, 0, 4}, {3, 256, 32, 2, 0, 8},
                                                 {2, 16, 1, 3, 0, 4},  {3, 64, 4, 1, 0, 8}, {4, 128, 16, 1, 0, 4}};
    for (const auto& t : knobs) {
      decode_attention_set_tuning(&t);
      const std::string w = fmt("st%d mc%d dm%d w%d", t.stages, t.min_chunk, t.direct_max, t.warps);
      run_case({w, {16384}, 12, 1, 16, 7, true});
      run_case({w, {5000, 0, 100, 16384}, 12, 1, 16, 0, true});
      run_case({w, mixed(16, all, 2), 16, 1, 32, 64, true});
      run_case({w, mixed(5, all, 1), 8, 2, 16, 64, false});
    }
    // Both CTA widths forced on the shapes whose automatic choice is the
    // other (8 warps where the grid fits one wave, else 4): every merge form.
    for (int wv : {4, 8}) {
      DecodeAttnTuning t = def;
      t.warps = wv;
      decode_attention_set_tuning(&t);
      const std::string w = fmt("w%d", wv);
      for (int c : {1, 17, 1000, 2049, 16384}) run_case({w + " batch 1", {c}, 12, 1, 16, 0, true});
      const auto c16 = mixed(16, all, 2);
      for (int sp : {0, 2, 7, 64}) run_case({w + " 16 mixed", c16, 12, 1, 16, sp, true});
      run_case({w + " 64 mixed", mixed(64, mid, 3), 16, 1, 32, 7, true});
      run_case({w + " 257 mixed", mixed(257, shortc, 5), 12, 1, 16, 2, true});
      run_case({w + " G=16, 2 KV heads", mixed(16, all, 1), 16, 2, 16, 64, false});
      run_case({w + " G=4, block 48", {1000, 47, 48, 49}, 4, 1, 48, 7, true});
    }
    decode_attention_set_tuning(nullptr);
    check_shared_workspace();
    check_graph();
    check_pdl();
    check_invalid();
    CK(cudaDeviceSynchronize());
  }
  const int fails = failed_checks();
  if (!only_bench || table.size()) print_summary("attn_check", fails);
  if (do_bench) bench(json);
  if (do_cold) bench_cold();
  if (do_sweep) sweep();
  if (do_forms) forms();
  if (do_probe) probe();
  if (g_ws) cudaFree(g_ws);
  return fails ? 1 : 0;
}
