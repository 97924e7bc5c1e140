// prefill_check — checks attention_prefill (cuda/kernels/attention.cu: causal
// flash attention on tensor cores over the paged BF16 cache, several new
// tokens per sequence) against a float64 CPU reference, and times it.
//
//   prefill_check [--seed N] [--bench] [--bench-only] [--only SHAPE] [--sweep] [--json FILE]
//
// Correctness (default): random Q/K/V with per-sequence scales; shuffled
// block ids with unrelated entries between tables; cache slots past each
// sequence's last key hold NaN (a read past k_end shows); step rows that
// belong to no sequence (and sequences with no new token) must stay poisoned;
// outputs poisoned (NaN) before each launch. Cases: whole prompts, chunks at
// start_pos > 0 (not a multiple of 64), one-token "chunks", several sequences
// at once, G = 1 .. 16, 1 or 2 KV heads, block sizes 16 .. 64, 64- and
// 128-row items, 2- and 3-stage rings, splits over keys forced on and off, each
// with the mma.sync kernel and (sm_90) the wgmma one.
// Relative L2 against float64 (bf16 Q, K, V and P: tolerance 1e-2); two
// launches bitwise equal; the workspace's counter header zero after every
// launch (one workspace shared by every case, zeroed once); a CUDA graph
// replay equals the eager launch; invalid arguments refused.
// --bench: GLM-4.7 at TP8 (12 query heads on 1 KV head, dim 128, block 16):
// single prompts of 512 .. 32k tokens, a 2k chunk after 14k of context, 8
// prompts of 1k; ms per call (the median of timings of 4-32 back-to-back
// launches, divided), causal TFLOP/s (4 * 128 * heads * visible keys
// summed over tokens), and the old path (attention_paged + attention_merge,
// FP32 on CUDA cores) up to 4k. The peer (PyTorch SDPA, same shapes) is
// scripts/peer_prefill.py. --only SHAPE: that bench shape alone (e.g.
// prompt_8192, for ncu). --sweep: the launch knobs on three shapes.
#include <atomic>
#include <memory>
#include <numeric>
#include <thread>

#include "kernels.h"

#define CHECK_NAME_W 24
#define CHECK_DETAIL_W 60
#include "check.cuh"

namespace glmk {
// Test hooks defined in attention.cu (not part of kernels.h).
struct PrefillAttnTuning {
  int rows, stages, min_split_tiles;
  float split_frac;
  int kernel;            // 0 auto (sm_90: warp-specialized at 128 rows, wgmma at 64), 1 mma.sync, 2 wgmma, 3 as 0
  float underfill_frac;  // the planner's harder split for few items (0: off; the knob sets here leave it off)
};
void prefill_attention_get_tuning(PrefillAttnTuning* t);
void prefill_attention_set_tuning(const PrefillAttnTuning* t);
size_t prefill_attention_counter_bytes();
}  // namespace glmk

using namespace glmk;

static int g_num_sms = 132;
static int g_major = 0;  // compute capability of device 0
// One workspace for every case, zeroed only when (re)allocated.
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
// Non-zero words of the counter header (re-zeroed when found). Synchronizes.
static size_t dirty_counters() {
  if (!g_ws) return 0;
  CK(cudaDeviceSynchronize());
  const size_t words = std::min(prefill_attention_counter_bytes(), g_ws_bytes) / sizeof(int);
  std::vector<int> h(words);
  CK(cudaMemcpy(h.data(), g_ws, words * sizeof(int), cudaMemcpyDeviceToHost));
  size_t bad = 0;
  for (int v : h) bad += v != 0;
  if (bad) CK(cudaMemset(g_ws, 0, words * sizeof(int)));
  return bad;
}

// ------------------------------------------------------------ problem

struct Seq {
  int n_q, start_pos;
};
// One step on the host: T step rows (the sequences' new tokens in order, then
// `pad` rows of no sequence), paged caches, tables, queries.
struct Problem {
  int G = 12, n_kv = 1, NH = 12, bs = 16, T = 0, pool = 0;
  std::vector<Seq> seqs;
  std::vector<int> q_begin, positions, bt, bt_off;
  std::vector<uint16_t> kc, vc;  // [pool][n_kv][bs][128] bf16 bits
  std::vector<float> q;          // [T][NH][128]
};

static Problem make_problem(const std::vector<Seq>& seqs, int G, int n_kv, int bs, int pad, bool fill = true) {
  Problem P;
  P.G = G;
  P.n_kv = n_kv;
  P.NH = G * n_kv;
  P.bs = bs;
  P.seqs = seqs;
  int total_pages = 0;
  for (const Seq& s : seqs) {
    P.q_begin.push_back(P.T);
    for (int i = 0; i < s.n_q; ++i) P.positions.push_back(s.start_pos + i);
    P.T += s.n_q;
    total_pages += (s.start_pos + s.n_q + bs - 1) / bs;
  }
  for (int i = 0; i < pad; ++i) P.positions.push_back(0);
  P.T += pad;
  P.pool = total_pages + 3;
  std::vector<int> ids(P.pool);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  int used = 0;
  for (const Seq& s : seqs) {
    for (int j = randi(0, 2); j > 0; --j) P.bt.push_back(randi(0, P.pool - 1));
    P.bt_off.push_back((int)P.bt.size());
    for (int b = 0; b < (s.start_pos + s.n_q + bs - 1) / bs; ++b) P.bt.push_back(ids[used++]);
  }
  if (P.bt.empty()) P.bt.push_back(0);
  const size_t cache_n = (size_t)P.pool * n_kv * bs * 128;
  P.kc.assign(cache_n, kBf16NaN);
  P.vc.assign(cache_n, kBf16NaN);
  P.q.resize((size_t)P.T * P.NH * 128);
  FastRng fr{rng()};
  for (auto& v : P.q) v = fr.nrm();
  if (!fill) return P;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const float ks = randu(0.5f, 1.5f);
    const float qs = randu(0.3f, 2.5f) / ks;       // scores ~ N(0, (qs*ks)^2): flat to peaked
    const float vs = std::pow(10.f, randu(-1, 1));  // varied V scales
    for (int i = 0; i < seqs[s].n_q; ++i) {
      float* qr = &P.q[(size_t)(P.q_begin[s] + i) * P.NH * 128];
      for (int j = 0; j < P.NH * 128; ++j) qr[j] *= qs;
    }
    const int keys = seqs[s].start_pos + seqs[s].n_q;
    for (int key = 0; key < keys; ++key) {
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

// The step rows the reference checks: every row of a sequence when the
// sequence is small, else a sample (its first and last 40 rows and 120 more).
static std::vector<int> checked_rows(const Problem& P) {
  std::vector<int> rows;
  for (size_t s = 0; s < P.seqs.size(); ++s) {
    const int n = P.seqs[s].n_q, q0 = P.q_begin[s];
    const double work = (double)n * (P.seqs[s].start_pos + n);
    if (work <= 3e6) {
      for (int i = 0; i < n; ++i) rows.push_back(q0 + i);
      continue;
    }
    std::vector<int> pick;
    for (int i = 0; i < std::min(n, 40); ++i) pick.push_back(i);
    for (int i = std::max(0, n - 40); i < n; ++i) pick.push_back(i);
    for (int i = 0; i < 120; ++i) pick.push_back(randi(0, n - 1));
    std::sort(pick.begin(), pick.end());
    pick.erase(std::unique(pick.begin(), pick.end()), pick.end());
    for (int i : pick) rows.push_back(q0 + i);
  }
  return rows;
}

// float64 reference of the given step rows: [rows.size()][NH][128].
static std::vector<double> reference(const Problem& P, const std::vector<int>& rows, float scale) {
  std::vector<int> seq_of(P.T, -1);
  for (size_t s = 0; s < P.seqs.size(); ++s)
    for (int i = 0; i < P.seqs[s].n_q; ++i) seq_of[P.q_begin[s] + i] = (int)s;
  std::vector<double> ref(rows.size() * P.NH * 128, 0.0);
  std::atomic<size_t> next{0};
  auto work = [&]() {
    std::vector<double> sc, acc(128);
    for (size_t i; (i = next++) < rows.size();) {
      const int t = rows[i], s = seq_of[t];
      const int c = P.positions[t] + 1;
      sc.resize(c);
      for (int h = 0; h < P.NH; ++h) {
        const int kvh = h / P.G;
        const float* qv = &P.q[((size_t)t * P.NH + h) * 128];
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
        double* o = &ref[(i * P.NH + h) * 128];
        for (int d = 0; d < 128; ++d) o[d] = acc[d] / l;
      }
    }
  };
  const int nt = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  std::vector<std::thread> th;
  for (int k = 0; k < nt; ++k) th.emplace_back(work);
  for (auto& x : th) x.join();
  return ref;
}

struct DevProblem {
  Dev<uint16_t> kc, vc;
  Dev<float> q, out;
  Dev<int> positions, bt, bt_off;
  std::unique_ptr<Dev<PrefillItem>> items;
  PrefillPlan plan;
  std::vector<PrefillItem> host_items;
  explicit DevProblem(const Problem& P)
      : kc(P.kc), vc(P.vc), q(P.q), out((size_t)P.T * P.NH * 128), positions(P.positions), bt(P.bt),
        bt_off(P.bt_off.empty() ? std::vector<int>(1) : P.bt_off) {}
  // Plans the step with the current tuning and max_parts slots; false: *why.
  bool make_plan(const Problem& P, int max_parts, const char** why) {
    std::vector<AttnSeqDesc> sd;
    for (size_t s = 0; s < P.seqs.size(); ++s) sd.push_back({P.q_begin[s], P.seqs[s].n_q, P.seqs[s].start_pos});
    host_items.resize(attention_prefill_max_items(P.T, (int)P.seqs.size(), P.G, max_parts));
    plan = PrefillPlan{};
    plan.items = host_items.data();
    plan.max_items = (int)host_items.size();
    plan.max_parts = max_parts;
    if (!plan_prefill(sd.data(), (int)sd.size(), P.G, P.n_kv, g_num_sms, &plan, why)) return false;
    std::vector<PrefillItem> v(host_items.begin(), host_items.begin() + std::max(1, plan.n_items));
    items = std::make_unique<Dev<PrefillItem>>(v);
    return true;
  }
  PrefillAttnArgs args(const Problem& P) {
    PrefillAttnArgs a;
    a.q = q.p;
    a.k_cache = reinterpret_cast<const __nv_bfloat16*>(kc.p);
    a.v_cache = reinterpret_cast<const __nv_bfloat16*>(vc.p);
    a.block_size = P.bs;
    a.n_q_heads = P.NH;
    a.n_kv_heads = P.n_kv;
    a.scale = 1.0f / std::sqrt(128.0f);
    a.positions = positions.p;
    a.seq_bt_offset = bt_off.p;
    a.block_tables = bt.p;
    a.items = items->p;
    a.n_items = plan.n_items;
    a.rows = plan.rows;
    a.n_parts = plan.n_parts;
    a.out = out.p;
    a.workspace = plan.max_parts > 0 ? workspace(attention_prefill_workspace_bytes(plan.max_parts, P.n_kv)) : nullptr;
    return a;
  }
};

struct CaseCfg {
  std::string name;
  std::vector<Seq> seqs;
  int G = 12, n_kv = 1, bs = 16, pad = 0;
  int max_parts = 256;  // 0: no split
};

static void run_case(const CaseCfg& c) {
  const Problem P = make_problem(c.seqs, c.G, c.n_kv, c.bs, c.pad);
  DevProblem D(P);
  const char* why = "";
  std::string sh;
  for (size_t i = 0; i < c.seqs.size() && i < 4; ++i) sh += fmt("%s%d@%d", i ? "," : "", c.seqs[i].n_q, c.seqs[i].start_pos);
  if (c.seqs.size() > 4) sh += fmt(",..(%zu)", c.seqs.size());
  if (!D.make_plan(P, c.max_parts, &why)) {
    report(c.name, sh + ": plan", NAN, 0);
    printf("  plan_prefill: %s\n", why);
    return;
  }
  PrefillAttnTuning tu;
  prefill_attention_get_tuning(&tu);
  const std::string detail = fmt("%s G%d kv%d bs%d r%d s%d items %d parts %d", sh.c_str(), c.G, c.n_kv, c.bs,
                                 D.plan.rows, tu.stages, D.plan.n_items, D.plan.n_parts);
  const std::vector<int> rows = checked_rows(P);
  const std::vector<double> ref = reference(P, rows, 1.0f / std::sqrt(128.0f));
  const size_t W = (size_t)P.NH * 128;
  std::vector<float> first;
  std::vector<size_t> dirty;
  for (int launch = 0; launch < 2; ++launch) {
    D.out.poison();
    CK(attention_prefill(D.args(P), 0));
    CK(cudaDeviceSynchronize());
    dirty.push_back(dirty_counters());
    const std::vector<float> out = D.out.down();
    if (launch == 0) {
      std::vector<double> got(ref.size());
      for (size_t i = 0; i < rows.size(); ++i)
        for (size_t j = 0; j < W; ++j) got[i * W + j] = out[(size_t)rows[i] * W + j];
      report(c.name, detail, rel_err(got, ref), 1e-2);
      // Rows of no sequence stay poisoned.
      int touched = 0;
      const int seq_rows = P.T - c.pad;
      for (int t = seq_rows; t < P.T; ++t)
        for (size_t j = 0; j < W; ++j) touched += !std::isnan(out[(size_t)t * W + j]);
      if (c.pad) report("  rows of no sequence", fmt("%d padding rows: values written", c.pad), touched, 0);
      first = out;
    } else {
      report("  deterministic", "second launch bitwise equal",
             memcmp(first.data(), out.data(), out.size() * 4) == 0 ? 0 : 1, 0);
    }
  }
  if (D.plan.n_parts > 0)
    report("  counters reset", fmt("non-zero counter words after each launch: %zu/%zu", dirty[0], dirty[1]),
           (double)(dirty[0] + dirty[1]), 0);
}

// A launch captured in a graph and replayed equals the eager one.
static void check_graph() {
  const Problem P = make_problem({{700, 0}, {300, 1000}, {1, 77}}, 12, 1, 16, 0);
  DevProblem D(P);
  const char* why = "";
  if (!D.make_plan(P, 64, &why)) {
    report("graph", why, NAN, 0);
    return;
  }
  D.out.poison();
  CK(attention_prefill(D.args(P), 0));
  const std::vector<float> eager = D.out.down();
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  PrefillAttnArgs a = D.args(P);
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  CK(attention_prefill(a, s));
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  D.out.poison();
  for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(ge, s));
  CK(cudaStreamSynchronize(s));
  const std::vector<float> rep = D.out.down();
  report("graph replay", fmt("3 seqs, %d items, %d parts: equal to eager", D.plan.n_items, D.plan.n_parts),
         memcmp(eager.data(), rep.data(), rep.size() * 4) == 0 ? 0 : 1, 0);
  report("  counters reset", "after 3 replays", (double)dirty_counters(), 0);
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  CK(cudaStreamDestroy(s));
}

static void check_invalid() {
  const Problem P = make_problem({{20, 3}}, 12, 1, 16, 0);
  DevProblem D(P);
  const char* why = "";
  if (!D.make_plan(P, 0, &why)) {
    report("invalid", why, NAN, 0);
    return;
  }
  int refused = 0, n = 0;
  auto expect = [&](PrefillAttnArgs a) {
    ++n;
    refused += attention_prefill(a, 0) == cudaErrorInvalidValue;
    (void)cudaGetLastError();
  };
  PrefillAttnArgs a = D.args(P);
  a.block_size = 8, expect(a);
  a = D.args(P), a.n_kv_heads = 5, expect(a);  // 12 query heads over 5 KV heads
  a = D.args(P), a.rows = 96, expect(a);
  a = D.args(P), a.out = nullptr, expect(a);
  a = D.args(P), a.n_parts = 1, a.workspace = nullptr, expect(a);
  report("invalid arguments", fmt("%d of %d refused with cudaErrorInvalidValue", refused, n), n - refused, 0);
  // A plan over capacity fails with a reason.
  std::vector<AttnSeqDesc> sd{{0, 20, 3}};
  std::vector<PrefillItem> few(1);
  PrefillPlan pl;
  pl.items = few.data();
  pl.max_items = 1;
  const bool ok = plan_prefill(sd.data(), 1, 12, 1, g_num_sms, &pl, &why);
  report("plan over capacity", fmt("240 rows in 1 item slot: %s", ok ? "accepted" : why), ok ? 1 : 0, 0);
  CK(cudaDeviceSynchronize());
}

// ------------------------------------------------------------ bench

struct BenchShape {
  std::string name;
  std::vector<Seq> seqs;
  bool old_path;
};
static std::vector<BenchShape> bench_shapes() {
  std::vector<BenchShape> v;
  for (int L : {512, 1024, 2048, 4096, 8192, 16384, 32768}) v.push_back({fmt("prompt_%d", L), {{L, 0}}, L <= 4096});
  v.push_back({"chunk_2048_at_14336", {{2048, 14336}}, false});
  v.push_back({"batch8_prompt_1024", std::vector<Seq>(8, Seq{1024, 0}), true});
  return v;
}
static double causal_flops(const std::vector<Seq>& seqs, int NH) {
  double keys = 0;
  for (const Seq& s : seqs)
    for (int i = 0; i < s.n_q; ++i) keys += s.start_pos + i + 1;
  return 4.0 * 128 * NH * keys;
}

// Launches a bench timing spans: enough for ~0.2 TFLOP of causal attention,
// 4 to 32 (scripts/peer_prefill.py bench_inner: the same rule).
static int bench_inner(double flops) { return (int)std::min(32.0, std::max(4.0, std::ceil(2e11 / flops))); }

struct BenchOut {
  double ms, tflops, old_ms, mma_ms, ws_ms[2] = {NAN, NAN}, wg_ms = NAN;
  int items, parts;
};
static BenchOut bench_one(const BenchShape& b, bool with_old) {
  // Device-filled caches (the host fill is slow at 32k); values do not matter.
  Problem P = make_problem(b.seqs, 12, 1, 16, 0, false);
  DevProblem D(P);
  fill_bf16_kernel<<<1024, 256>>>(D.kc.p, D.kc.n, 11);
  fill_bf16_kernel<<<1024, 256>>>(D.vc.p, D.vc.n, 12);
  const char* why = "";
  if (!D.make_plan(P, 1024, &why)) {
    fprintf(stderr, "plan_prefill %s: %s\n", b.name.c_str(), why);
    exit(2);
  }
  PrefillAttnArgs a = D.args(P);
  for (int i = 0; i < 3; ++i) CK(attention_prefill(a, 0));
  const double fl = causal_flops(b.seqs, 12);
  const int reps = fl > 2e11 ? 5 : 20;
  // Each timing spans bench_inner(fl) launches back to back, so that no launch
  // waits on the host (scripts/peer_prefill.py times SDPA the same way).
  const int inner = bench_inner(fl);
  auto time_launches = [&]() {
    return median_ms(reps, 0, [&](int) {
             for (int i = 0; i < inner; ++i) CK(attention_prefill(a, 0));
           }) / inner;
  };
  const double ms = time_launches();
  BenchOut r{ms, fl / (ms * 1e-3) / 1e12, NAN, NAN, {NAN, NAN}, NAN, D.plan.n_items, D.plan.n_parts};
  if (g_major == 9) {  // the other kernels on the same plan (the default there: ws at 128 rows, wgmma at 64)
    PrefillAttnTuning t, keep;
    prefill_attention_get_tuning(&keep);
    t = keep;
    t.kernel = 1;
    prefill_attention_set_tuning(&t);
    CK(attention_prefill(a, 0));
    r.mma_ms = time_launches();
    t = keep;
    t.kernel = 2;  // the wgmma kernel without warp specialization
    prefill_attention_set_tuning(&t);
    CK(attention_prefill(a, 0));
    r.wg_ms = time_launches();
    for (int st : {3, 4}) {  // the warp-specialized kernel (128-row items; 64-row ones run the wgmma kernel)
      t = keep;
      t.kernel = 3;
      t.stages = st;
      prefill_attention_set_tuning(&t);
      CK(attention_prefill(a, 0));
      r.ws_ms[st - 3] = time_launches();
    }
    prefill_attention_set_tuning(&keep);
  }
  if (with_old && b.old_path) {
    std::vector<AttnSeqDesc> sd;
    for (size_t s = 0; s < P.seqs.size(); ++s) sd.push_back({P.q_begin[s], P.seqs[s].n_q, P.seqs[s].start_pos});
    std::vector<AttnItem> items((size_t)P.T * 12 / 1 + 64);
    std::vector<AttnMerge> merges(1);
    AttnPlan plan{items.data(), (int)items.size(), 0, merges.data(), 1, 0, 0, 0};
    if (!plan_attention(sd.data(), (int)sd.size(), 12, &plan, &why)) {
      fprintf(stderr, "plan_attention %s: %s\n", b.name.c_str(), why);
      exit(2);
    }
    items.resize(plan.n_items);
    Dev<AttnItem> di(items);
    AttnArgs o;
    o.q = D.q.p;
    o.k_cache = D.kc.p;
    o.v_cache = D.vc.p;
    o.block_size = 16;
    o.n_q_heads = 12;
    o.n_kv_heads = 1;
    o.scale = 1.0f / std::sqrt(128.0f);
    o.positions = D.positions.p;
    o.seq_bt_offset = D.bt_off.p;
    o.block_tables = D.bt.p;
    o.items = di.p;
    o.n_items = plan.n_items;
    o.out = D.out.p;
    CK(attention_paged(o, 0));
    r.old_ms = median_ms(3, 0, [&](int) { CK(attention_paged(o, 0)); });
  }
  return r;
}

static const char* g_only = nullptr;  // --only: one bench shape

static void bench(const char* json) {
  printf("\nattention_prefill bench: 12 q heads / 1 KV head, dim 128, block 16 (GLM-4.7 at TP8)\n");
  printf("ms: the default kernel (sm_90: warp-specialized at 128 rows, wgmma at 64), per launch of 4-32 back to "
         "back; mma_ms: the mma.sync kernel, same plan; old_ms: FP32 cores; wg / ws: the wgmma and warp-specialized "
         "kernels, same plan\n");
  printf("%-22s %10s %8s %10s %8s %10s %8s %7s %6s\n", "shape", "ms", "TFLOP/s", "mma_ms", "TFLOP/s", "old_ms",
         "speedup", "items", "parts");
  FILE* jf = json ? fopen(json, "w") : nullptr;
  if (jf) fprintf(jf, "[\n");
  bool firstj = true;
  for (const BenchShape& b : bench_shapes()) {
    if (g_only && b.name != g_only) continue;
    const BenchOut r = bench_one(b, true);
    const double mtf = std::isnan(r.mma_ms) ? NAN : r.tflops * r.ms / r.mma_ms;
    printf("%-22s %10.4f %8.1f %10s %8s %10s %8s %7d %6d | wg %.4f ws s3 %.4f s4 %.4f\n", b.name.c_str(), r.ms, r.tflops,
           std::isnan(r.mma_ms) ? "-" : fmt("%.4f", r.mma_ms).c_str(), std::isnan(mtf) ? "-" : fmt("%.1f", mtf).c_str(),
           std::isnan(r.old_ms) ? "-" : fmt("%.3f", r.old_ms).c_str(),
           std::isnan(r.old_ms) ? "-" : fmt("%.0fx", r.old_ms / r.ms).c_str(), r.items, r.parts, r.wg_ms,
           r.ws_ms[0], r.ws_ms[1]);
    if (jf) {
      fprintf(jf, "%s  {\"shape\": \"%s\", \"ms\": %.5f, \"tflops\": %.2f, \"old_ms\": %s}", firstj ? "" : ",\n",
              b.name.c_str(), r.ms, r.tflops, std::isnan(r.old_ms) ? "null" : fmt("%.4f", r.old_ms).c_str());
      firstj = false;
    }
    fflush(stdout);
  }
  if (jf) {
    fprintf(jf, "\n]\n");
    fclose(jf);
  }
}

static void sweep() {
  printf("\nattention_prefill knob sweep (ms)\n");
  const std::vector<BenchShape> shapes = {{"prompt_512", {{512, 0}}, false},
                                          {"prompt_1024", {{1024, 0}}, false},
                                          {"prompt_1536", {{1536, 0}}, false},
                                          {"prompt_2048", {{2048, 0}}, false},
                                          {"chunk_2048_at_2048", {{2048, 2048}}, false},
                                          {"prompt_4096", {{4096, 0}}, false},
                                          {"prompt_8192", {{8192, 0}}, false},
                                          {"chunk_2048_at_14336", {{2048, 14336}}, false},
                                          {"batch8_prompt_1024", std::vector<Seq>(8, Seq{1024, 0}), false}};
  printf("%-26s", "rows st mst frac");
  for (auto& s : shapes) printf(" %19s", s.name.c_str());
  printf("\n");
  for (int rows : {0, 128, 64})  // 0: the planner's choice
    for (int st : {2, 3})
      for (float frac : {0.f, 0.5f, 1.0f, 2.0f}) {
        PrefillAttnTuning t{rows, st, 8, frac, 0};  // (8: the planner's min_split_tiles)
        prefill_attention_set_tuning(&t);
        printf("%-26s", fmt("%d %d %d %.1f", rows, st, 8, frac).c_str());
        for (auto& s : shapes) printf(" %19.4f", bench_one(s, false).ms);
        printf("\n");
        fflush(stdout);
      }
  prefill_attention_set_tuning(nullptr);
}

int main(int argc, char** argv) {
  uint64_t seed = 0x9fe1;
  bool do_bench = false, only_bench = false, do_sweep = false;
  const char* json = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], nullptr, 0);
    else if (!strcmp(argv[i], "--bench")) do_bench = true;
    else if (!strcmp(argv[i], "--bench-only")) do_bench = only_bench = true;
    else if (!strcmp(argv[i], "--only") && i + 1 < argc) g_only = argv[++i];
    else if (!strcmp(argv[i], "--sweep")) do_sweep = only_bench = true;
    else if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
    else {
      fprintf(stderr, "usage: prefill_check [--seed N] [--bench] [--bench-only] [--only SHAPE] [--sweep] [--json FILE]\n");
      return 2;
    }
  }
  if (g_only) {  // a name no bench shape has is an error, not an empty table
    bool known = false;
    for (const BenchShape& b : bench_shapes()) known = known || b.name == g_only;
    if (!known) {
      fprintf(stderr, "prefill_check: --only %s: no such bench shape (prompt_512 .. prompt_32768, "
              "chunk_2048_at_14336, batch8_prompt_1024)\n", g_only);
      return 2;
    }
  }
  rng.seed(seed);
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  g_num_sms = prop.multiProcessorCount;
  g_major = prop.major;
  printf("device: %s, %d SMs, seed %llu\n", prop.name, prop.multiProcessorCount, (unsigned long long)seed);

  if (!only_bench) {
    std::vector<PrefillAttnTuning> knobs;
    for (int kernel : {1, 2}) {
      if (kernel == 2 && g_major != 9) continue;
      for (PrefillAttnTuning t : {PrefillAttnTuning{128, 2, 4, 0.5f, 0}, PrefillAttnTuning{64, 2, 4, 0.5f, 0},
                                  PrefillAttnTuning{128, 3, 1, 4.0f, 0}, PrefillAttnTuning{64, 3, 1, 4.0f, 0}}) {
        t.kernel = kernel;
        knobs.push_back(t);
      }
    }
    if (g_major == 9)  // the warp-specialized kernel: 128-row items, 3 and 4 stages
      for (PrefillAttnTuning t : {PrefillAttnTuning{128, 4, 4, 0.5f, 3}, PrefillAttnTuning{128, 3, 1, 4.0f, 3},
                                  PrefillAttnTuning{128, 4, 4, 0.0f, 3}})
        knobs.push_back(t);
    for (const auto& t : knobs) {
      prefill_attention_set_tuning(&t);
      const std::string w =
          fmt("%s r%d s%d", t.kernel == 3 ? "ws" : t.kernel == 2 ? "wg" : "mma", t.rows, t.stages);
      run_case({w + " prompt", {{1, 0}}, 12, 1, 16, 0});
      run_case({w + " prompt", {{17, 0}}, 12, 1, 16, 0});
      run_case({w + " prompt", {{200, 0}}, 12, 1, 16, 2});
      run_case({w + " prompt", {{1000, 0}}, 12, 1, 16, 0});
      run_case({w + " prompt", {{2048, 0}}, 12, 1, 16, 0});
      run_case({w + " prompt no split", {{2048, 0}}, 12, 1, 16, 0, 0});
      run_case({w + " chunk", {{300, 1000}}, 12, 1, 16, 0});
      run_case({w + " chunk", {{64, 4099}}, 12, 1, 16, 0});
      run_case({w + " chunk", {{1, 5000}, {2, 77}}, 12, 1, 16, 0});
      run_case({w + " mixed", {{100, 0}, {0, 50}, {1, 333}, {513, 2000}, {7, 0}}, 12, 1, 16, 3});
      run_case({w + " G1 kv2", {{130, 40}, {1, 9}}, 1, 2, 16, 0});
      run_case({w + " G4 kv2 bs32", {{333, 100}, {65, 0}}, 4, 2, 32, 1});
      run_case({w + " G16 kv1 bs64", {{129, 63}, {1, 200}}, 16, 1, 64, 0});
      run_case({w + " G3 kv1 bs48", {{77, 5}, {40, 0}}, 3, 1, 48, 0});
      run_case({w + " G12 kv2", {{400, 700}}, 12, 2, 16, 0});
    }
    prefill_attention_set_tuning(nullptr);
    run_case({"default long chunk", {{4096, 12288}}, 12, 1, 16, 0});
    // 192 items of 128 rows (< 2 CTAs per SM on a 132-SM GPU): split by the underfill rule.
    run_case({"default chunk after 14k", {{2048, 14336}}, 12, 1, 16, 0});
    run_case({"default 16 prompts", std::vector<Seq>(16, Seq{160, 0}), 12, 1, 16, 0});
    check_graph();
    check_invalid();
    CK(cudaDeviceSynchronize());
    print_table("rel_err");
  }
  const int fails = failed_checks();
  if (!only_bench || table.size()) print_summary("prefill_check", fails);
  if (do_bench) bench(json);
  if (do_sweep) sweep();
  if (g_ws) cudaFree(g_ws);
  return fails ? 1 : 0;
}
