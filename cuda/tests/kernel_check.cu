// kernel_check — compares every kernel family of cuda/kernels against a float64
// CPU reference on fresh random inputs, outputs poisoned (NaN / 0xFF) before
// each run so an unwritten element fails; prints a table and exits non-zero on
// any failure. `kernel_check --bench` times the decode FP8 linear and the MoE
// expert GEMMs on full-size GLM-4.7 shapes and prints achieved GB/s against
// the 4.46 TB/s HBM read ceiling of an H200: the TP1 shapes, one GPU's experts
// at 8-way expert parallelism (grouped dispatch before / after the row tiles),
// and the TP8 dense decode shapes after a small kernel in a CUDA graph, with and
// without programmatic dependent launch. Programmatic dependent launches (dense,
// and grouped row tiles with an L2 prefetch of one group's weights) must give
// the plain launch's bits after a kernel that rewrites their inputs.
//
//   kernel_check [--seed N] [--bench] [--bench-only] [--sweep] [--profile]
//
// --sweep: the bench plus every launch shape of the streaming kernel
// (StreamTuning) on the full-size shapes, the fastest printed per shape.
// --profile: two calls of each decode kernel at M=1 and nothing else (for ncu).
#include <functional>
#include <memory>
#include <numeric>

#include "kernels.h"

#define CHECK_NAME_W 28
#define CHECK_DETAIL_W 44
#include "check.cuh"

using namespace glmk;

static uint8_t rand_fp8() {  // any finite code
  for (;;) {
    uint8_t b = (uint8_t)rng();
    if ((b & 0x7f) != 0x7f) return b;
  }
}

// ------------------------------------------------------------ quant

static void quant_ref(const std::vector<float>& x, int rows, int cols, std::vector<uint8_t>& q,
                      std::vector<float>& s) {
  q.resize((size_t)rows * cols);
  s.resize(rows);
  for (int r = 0; r < rows; ++r) {
    float amax = 0;
    for (int c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(x[(size_t)r * cols + c]));
    const float sc = std::max(amax / 448.0f, 1.0f / (448.0f * 512.0f));
    s[r] = sc;
    for (int c = 0; c < cols; ++c) q[(size_t)r * cols + c] = fp8_enc(x[(size_t)r * cols + c] * (1.0f / sc));
  }
}

static void check_quant() {
  const int rows = 37, cols = 5120;
  std::vector<float> x((size_t)rows * cols);
  for (int r = 0; r < rows; ++r) {
    const float mag = std::pow(10.f, randu(-4, 3));
    for (int c = 0; c < cols; ++c) x[(size_t)r * cols + c] = r == 5 ? 0.f : randn() * mag;
  }
  x[7 * cols + 3] = 1e6f;  // a row with one huge outlier
  std::vector<uint8_t> qr;
  std::vector<float> sr;
  quant_ref(x, rows, cols, qr, sr);
  Dev<float> dx(x), ds(rows);
  Dev<uint8_t> dq((size_t)rows * cols);
  dq.poison();
  ds.poison();
  CK(quant_rows_fp8(dx.p, cols, rows, cols, dq.p, cols, ds.p, nullptr, 0));
  CK(cudaDeviceSynchronize());
  auto q = dq.down();
  auto s = ds.down();
  size_t bad = 0;
  for (size_t i = 0; i < q.size(); ++i) bad += q[i] != qr[i];
  double serr = 0;
  for (int r = 0; r < rows; ++r) serr = std::max(serr, (double)std::fabs(s[r] - sr[r]) / sr[r]);
  if (!std::isfinite(serr)) serr = NAN;
  report("quant_rows_fp8", fmt("37x5120 bytes differing: %zu", bad), bad ? 1.0 : serr, 0.0);

  // SiLU(gate)*up -> FP8, through a rows_dev bound (rows past it untouched).
  const int inter = 1536, rr = 9, live = 7;
  std::vector<float> gu((size_t)rr * 2 * inter);
  for (auto& v : gu) v = randn() * 3;
  std::vector<double> ref, out;
  Dev<float> dgu(gu), dsc(rr);
  Dev<uint8_t> dh((size_t)rr * inter);
  Dev<int> dlive(std::vector<int>{live});
  dh.poison();
  dsc.poison();
  CK(silu_mul_quant_fp8(dgu.p, rr, inter, dh.p, dsc.p, dlive.p, 0));
  auto h = dh.down();
  auto hs = dsc.down();
  size_t touched = 0;
  for (int r = 0; r < rr; ++r) {
    for (int c = 0; c < inter; ++c) {
      const double g = gu[(size_t)r * 2 * inter + c], u = gu[(size_t)r * 2 * inter + inter + c];
      if (r < live) {
        ref.push_back(g / (1 + std::exp(-g)) * u);
        out.push_back(fp8_dec(h[(size_t)r * inter + c]) * hs[r]);
      } else {
        touched += h[(size_t)r * inter + c] != 0xff;
      }
    }
  }
  report("silu_mul_quant_fp8", fmt("9x1536, live 7, rows past bound touched: %zu", touched),
         touched ? 1.0 : rel_err(out, ref), 4e-2);
}

// ------------------------------------------------------------ FP8 linears

struct LinearCase {
  int M, N, K;
  std::vector<uint8_t> W, X;
  std::vector<float> ws, xs, bias;
};
static LinearCase make_linear(int M, int N, int K, int xrows) {
  LinearCase c{M, N, K};
  c.W.resize((size_t)N * K);
  c.X.resize((size_t)xrows * K);
  for (auto& b : c.W) b = rand_fp8();
  for (auto& b : c.X) b = rand_fp8();
  c.ws.resize(N);
  c.bias.resize(N);
  c.xs.resize(xrows);
  for (auto& v : c.ws) v = randu(0.5f, 2.f) / 448.f;
  for (auto& v : c.bias) v = randn();
  for (auto& v : c.xs) v = randu(0.5f, 2.f) / 448.f;
  return c;
}
static double linear_ref(const LinearCase& c, int xrow, int wrow, const uint8_t* W, const float* wsc,
                         const float* bias) {
  double s = 0;
  const uint8_t* w = W + (size_t)wrow * c.K;
  const uint8_t* x = c.X.data() + (size_t)xrow * c.K;
  for (int k = 0; k < c.K; ++k) s += fp8_dec(x[k]) * fp8_dec(w[k]);
  return s * c.xs[xrow] * wsc[wrow] + (bias ? bias[wrow] : 0.0);
}

static std::string tuning_str(const StreamTuning& t) {
  std::string s;
  if (t.k_warps != 0 || t.row_tiles != 0 || t.stages != 0 || t.l2_prefetch >= 0 || t.stage_k != 0)
    s = fmt(" kw%d rt%d s%d pf%d k%d", t.k_warps, t.row_tiles, t.stages, t.l2_prefetch, t.stage_k);
  if (t.tile_rows) s += fmt(" tile%d", t.tile_rows);
  if (t.legacy) s += " legacy";
  if (t.pdl_prefetch >= 0) s += fmt(" pdlpf%d", t.pdl_prefetch);
  return s;
}
static StreamTuning legacy_tuning(StreamTuning t = {}) {
  t.legacy = 1;
  return t;
}
static StreamTuning tile_tuning(int rows, StreamTuning t = {}) {
  t.tile_rows = rows;
  return t;
}

static void check_stream_dense(int M, int N, int K, int ksplit, StreamTuning tune = {}) {
  LinearCase c = make_linear(M, N, K, M);
  Dev<uint8_t> dW(c.W), dX(c.X);
  Dev<float> dws(c.ws), dxs(c.xs), db(c.bias), dY((size_t)M * N), dwk((size_t)std::max(1, ksplit) * M * N);
  dY.poison();
  StreamGemmArgs a;
  a.W = dW.p;
  a.w_scale = dws.p;
  a.bias = db.p;
  a.X = dX.p;
  a.x_scale = dxs.p;
  a.M = M;
  a.N = N;
  a.K = K;
  a.ksplit = ksplit;
  a.Y = dY.p;
  a.ldy = N;
  a.ws = dwk.p;
  CK(gemm_fp8_stream_tuned(a, tune, 0));
  auto y = dY.down();
  std::vector<double> out(y.begin(), y.end()), ref;
  for (int r = 0; r < M; ++r)
    for (int n = 0; n < N; ++n) ref.push_back(linear_ref(c, r, n, c.W.data(), c.ws.data(), c.bias.data()));
  report("gemm_fp8_stream", fmt("M=%d N=%d K=%d ksplit=%d%s", M, N, K, ksplit, tuning_str(tune).c_str()),
         rel_err(out, ref), 1e-5);
}

// max_active_groups: 0 = grid over all groups; otherwise the compacted grid
// (blocks find the z-th non-empty group); 4 groups are non-empty here.
static void check_stream_grouped(int max_active = 0, StreamTuning tune = {}, int big = 70) {
  const int G = 5, N = 272, K = 512, xrows = 40;
  const int counts[G] = {0, 3, std::min(17, big), 1, big};
  std::vector<int> offs(G + 1, 0);
  for (int g = 0; g < G; ++g) offs[g + 1] = offs[g] + counts[g];
  const int rows = offs[G];
  LinearCase c = make_linear(rows, N, K, xrows);
  std::vector<uint8_t> Wg((size_t)G * N * K);
  for (auto& b : Wg) b = rand_fp8();
  std::vector<float> wsg((size_t)G * N), bg((size_t)G * N);
  for (auto& v : wsg) v = randu(0.5f, 2.f) / 448.f;
  for (auto& v : bg) v = randn();
  std::vector<int> xr(rows);
  for (auto& v : xr) v = randi(0, xrows - 1);
  Dev<uint8_t> dW(Wg), dX(c.X);
  Dev<float> dws(wsg), dxs(c.xs), db(bg), dY((size_t)rows * N);
  Dev<int> doff(offs), dxr(xr);
  dY.poison();
  StreamGemmArgs a;
  a.W = dW.p;
  a.w_scale = dws.p;
  a.bias = db.p;
  a.X = dX.p;
  a.x_scale = dxs.p;
  a.x_rows = dxr.p;
  a.group_offsets = doff.p;
  a.groups = G;
  a.N = N;
  a.K = K;
  a.max_rows_per_group = big;
  a.max_active_groups = max_active;
  a.Y = dY.p;
  a.ldy = N;
  CK(gemm_fp8_stream_tuned(a, tune, 0));
  auto y = dY.down();
  std::vector<double> out(y.begin(), y.end()), ref;
  for (int g = 0; g < G; ++g)
    for (int r = offs[g]; r < offs[g + 1]; ++r)
      for (int n = 0; n < N; ++n)
        ref.push_back(linear_ref(c, xr[r], n, Wg.data() + (size_t)g * N * K, wsg.data() + (size_t)g * N,
                                 bg.data() + (size_t)g * N));
  report("gemm_fp8_stream grouped",
         fmt("G=5 rows {0,3,%d,1,%d} N=272 K=512 gather act<=%d%s", std::min(17, big), big, max_active,
             tuning_str(tune).c_str()),
         rel_err(out, ref), 1e-5);
}

// Grouped GEMM with row tiles on groups of many sizes (empty, below, at and
// above each tile height, several tiles), x_rows a permutation of the
// activation rows: every run against the float64 reference, and pairs of runs
// compared bit for bit (the K order of a row must not depend on the tiling, and
// a group that fits one tile must give what the dispatch before the tiling
// gave: StreamTuning::legacy).
struct GroupedRun {
  int max_rows, max_active, typical;
  StreamTuning tune;
};
struct BitwiseCmp {
  int a, b;      // run indices
  int max_cnt;   // compare the rows of groups of at most this many rows (0: all)
};
static void check_grouped_tiles(const char* what, const std::vector<int>& counts, int N, int K,
                                const std::vector<GroupedRun>& runs, const std::vector<BitwiseCmp>& cmps) {
  const int G = (int)counts.size();
  std::vector<int> offs(G + 1, 0);
  int active = 0;
  for (int g = 0; g < G; ++g) {
    offs[g + 1] = offs[g] + counts[g];
    active += counts[g] > 0;
  }
  const int rows = offs[G];
  LinearCase c = make_linear(rows, N, K, rows);
  std::vector<uint8_t> Wg((size_t)G * N * K);
  for (auto& b : Wg) b = rand_fp8();
  std::vector<float> wsg((size_t)G * N), bg((size_t)G * N);
  for (auto& v : wsg) v = randu(0.5f, 2.f) / 448.f;
  for (auto& v : bg) v = randn();
  std::vector<int> xr(rows);
  std::iota(xr.begin(), xr.end(), 0);
  std::shuffle(xr.begin(), xr.end(), rng);
  std::vector<double> ref;
  ref.reserve((size_t)rows * N);
  for (int g = 0; g < G; ++g)
    for (int r = offs[g]; r < offs[g + 1]; ++r)
      for (int n = 0; n < N; ++n)
        ref.push_back(linear_ref(c, xr[r], n, Wg.data() + (size_t)g * N * K, wsg.data() + (size_t)g * N,
                                 bg.data() + (size_t)g * N));
  Dev<uint8_t> dW(Wg), dX(c.X);
  Dev<float> dws(wsg), dxs(c.xs), db(bg), dY((size_t)rows * N);
  Dev<int> doff(offs), dxr(xr);
  std::vector<std::vector<float>> outs;
  for (const GroupedRun& run : runs) {
    dY.poison();
    StreamGemmArgs a;
    a.W = dW.p;
    a.w_scale = dws.p;
    a.bias = db.p;
    a.X = dX.p;
    a.x_scale = dxs.p;
    a.x_rows = dxr.p;
    a.group_offsets = doff.p;
    a.groups = G;
    a.N = N;
    a.K = K;
    a.max_rows_per_group = run.max_rows;
    a.max_active_groups = run.max_active;
    a.typical_rows_per_group = run.typical;
    a.Y = dY.p;
    a.ldy = N;
    CK(gemm_fp8_stream_tuned(a, run.tune, 0));
    outs.push_back(dY.down());
    std::vector<double> out(outs.back().begin(), outs.back().end());
    report("gemm_fp8_stream tiles",
           fmt("%s N=%d K=%d max%d act%d/%d typ%d%s", what, N, K, run.max_rows, run.max_active, active,
               run.typical, tuning_str(run.tune).c_str()),
           rel_err(out, ref), 1e-5);
  }
  for (const BitwiseCmp& cm : cmps) {
    int rows_cmp = 0, rows_bad = 0;
    for (int g = 0; g < G; ++g) {
      if (cm.max_cnt > 0 && counts[g] > cm.max_cnt) continue;
      for (int r = offs[g]; r < offs[g + 1]; ++r) {
        ++rows_cmp;
        rows_bad += memcmp(&outs[cm.a][(size_t)r * N], &outs[cm.b][(size_t)r * N], N * sizeof(float)) != 0;
      }
    }
    report("gemm_fp8_stream tiles bitwise",
           fmt("%s run %d vs %d, groups<=%d: %d/%d rows differ", what, cm.a, cm.b, cm.max_cnt, rows_bad,
               rows_cmp),
           rows_bad ? 1.0 : 0.0, 0.0);
  }
}

static void check_grouped_tiles_all() {
  // Mixed sizes {0, 1, 7, 8, 9, 17, 31, 33, 64, 100}; 9 non-empty groups.
  const std::vector<int> mix = {17, 0, 100, 1, 8, 33, 0, 7, 64, 9, 31};
  const StreamTuning dflt;
  // K = 512: 4 stages of 128, so the default policy keeps one K-warp and the
  // register kernel (the previous dispatch above 32 rows) sums K in the same
  // order: every row must then match it bit for bit.
  check_grouped_tiles("mix", mix, 272, 512,
                      {{100, 0, 32, dflt},                                   // 0: 32-row tiles
                       {100, 9, 3, dflt},                                    // 1: 8-row tiles
                       {100, 9, 13, dflt},                                   // 2: 16-row tiles
                       {100, 2, 3, dflt},                                    // 3: bound too low: sweeps
                       {100, 9, 3, tile_tuning(8, {2, 2, 3, 2, 128})},       // 4
                       {100, 9, 0, tile_tuning(8, {1, 1, 3, 0, 256})},       // 5
                       {100, 9, 0, tile_tuning(8, {2, 2, 2, 0, 512})},       // 6
                       {100, 9, 0, tile_tuning(16, {4, 1, 4, 2, 128})},      // 7
                       {100, 9, 0, tile_tuning(32, {1, 2, 2, 1, 128})},      // 8
                       {100, 9, 0, legacy_tuning()},                         // 9: register kernel
                       {32, 9, 0, legacy_tuning()},                          // 10: legacy 32-row chunks
                       {8, 9, 0, legacy_tuning()},                           // 11: legacy 8-row chunks
                       {0, 0, 0, dflt},                                      // 12: no bounds at all
                       {100, 9, 0, tile_tuning(32, {2, 1, 2, 2, 128})},      // 13
                       {16, 9, 0, legacy_tuning({2, 1, 3, 0, 128})},         // 14
                       {100, 9, 40, dflt}},                                  // 15: > 32: whole groups
                      {{0, 9, 32}, {0, 9, 0}, {1, 11, 8}, {2, 10, 16}, {1, 9, 0}, {4, 13, 0}, {4, 14, 0},
                       {3, 1, 0}, {12, 0, 0}, {15, 9, 0}});
  // K = 1536 (12 stages: two K-warps by default), N = 200 (a partial last
  // weight tile); the previous dispatch with the same K-warps is the legacy
  // pipelined kernel (bound <= 32, chunk loop over taller groups).
  check_grouped_tiles("mix2", {100, 33, 0, 0, 1, 64, 9, 17, 31, 8, 7}, 200, 1536,
                      {{100, 11, 20, dflt},                                  // 0: 32-row tiles
                       {32, 11, 0, legacy_tuning()},                         // 1
                       {100, 9, 5, dflt},                                    // 2
                       {8, 9, 0, legacy_tuning()},                           // 3
                       {100, 9, 0, tile_tuning(16, {8, 1, 2, 2, 128})}},     // 4
                      {{0, 1, 0}, {2, 3, 0}});
  // 300 groups (more than one 256-group pass of the device search), mostly empty.
  std::vector<int> sparse(300, 0);
  sparse[3] = 9, sparse[140] = 40, sparse[256] = 1, sparse[257] = 33, sparse[299] = 17;
  check_grouped_tiles("300 groups", sparse, 48, 256,
                      {{40, 5, 32, dflt},                                    // 0: 32-row tiles
                       {40, 5, 1, dflt},                                     // 1
                       {40, 1, 1, dflt},                                     // 2: sweeps
                       {40, 5, 0, legacy_tuning()},                          // 3: register kernel
                       {32, 5, 0, legacy_tuning()},                          // 4
                       {40, 0, 0, tile_tuning(16)},                          // 5
                       {40, 5, 0, dflt}},                                    // 6: whole groups
                      {{0, 3, 0}, {1, 4, 0}, {2, 1, 0}, {5, 0, 0}, {6, 3, 0}});
}

// ------------------------------------------------------------ PDL

// Stands in for the kernel before a linear in a decode step (norm + quant):
// writes X [M, K] (FP8 codes from `seed`) and xs [M]. trigger: executes
// griddepcontrol.launch_dependents first, so a linear launched with PDL may
// start under it; spin_ns: every block first waits that long, so such a linear
// is resident and past its weight prologue when X is written (a read of X or xs
// before its griddepcontrol.wait would see the previous contents).
static __global__ void write_x_kernel(uint8_t* __restrict__ X, float* __restrict__ xs, int K,
                                      uint64_t seed, int trigger, long long spin_ns) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (trigger) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  spin_for_ns(spin_ns);
  const int r = blockIdx.x;
  uint32_t* row = reinterpret_cast<uint32_t*>(X + (size_t)r * K);
  for (int i = threadIdx.x; i < K / 4; i += blockDim.x) {
    uint32_t v = (uint32_t)mix64(seed + (uint64_t)r * K + 4 * i);
    // No NaN codes (0x7f / 0xff in any byte).
    for (int b = 0; b < 4; ++b)
      if (((v >> (8 * b)) & 0x7f) == 0x7f) v ^= 1u << (8 * b);
    row[i] = v;
  }
  if (threadIdx.x == 0) xs[r] = (1.f + (float)(mix64(seed ^ (0x51ull + r)) & 255) / 256.f) / 448.f;
}

// Edges of a captured graph that are programmatic (PDL) dependencies.
static int programmatic_edges(cudaGraph_t graph) {
  size_t n = 256;  // more than the graphs below have (the call writes the true count)
  std::vector<cudaGraphNode_t> from(n), to(n);
  std::vector<cudaGraphEdgeData> ed(n);
  CK(cudaGraphGetEdges(graph, from.data(), to.data(), ed.data(), &n));
  int p = 0;
  for (size_t i = 0; i < n; ++i) p += ed[i].type == cudaGraphDependencyTypeProgrammatic;
  return p;
}

// What a run of PDL launches gave against the plain launches' outputs.
struct PdlRun {
  size_t bad_eager = 0, bad_graph = 0;  // floats that differ
  int prog_edges = 0;                   // programmatic edges of the two captured graphs
};

// The output buffers of a PDL check: iters of n floats for the plain
// launches (ref) and as many for the PDL ones (out).
struct PdlBuffers {
  std::vector<std::unique_ptr<Dev<float>>> ref, out;
  PdlBuffers(int iters, size_t n) {
    for (int i = 0; i < iters; ++i) {
      ref.emplace_back(new Dev<float>(n));
      out.emplace_back(new Dev<float>(n));
    }
  }
};

// The plain launches run_pdl_calls compares against, one at a time:
// writer(i, 0, 0), gemm(i, ref[i]), a sync; after the first call, first()
// (to save the inputs of the float64 reference). ref[] is poisoned first.
static void run_plain_calls(cudaStream_t s, int iters, const PdlBuffers& b,
                            const std::function<void(int, int, long long)>& writer,
                            const std::function<void(int, float*)>& gemm, const std::function<void()>& first) {
  // (Poison goes through the legacy default stream, which a non-blocking stream
  // does not wait for: synchronise the device after it.)
  for (int i = 0; i < iters; ++i) b.ref[i]->poison();
  CK(cudaDeviceSynchronize());
  for (int i = 0; i < iters; ++i) {
    writer(i, 0, 0);
    gemm(i, b.ref[i]->p);
    CK(cudaStreamSynchronize(s));
    if (i == 0) first();
  }
}

// The calls i = 0..iters-1 of writer(i, trigger, spin_ns) then gemm(i, Y) with
// Y = out[i]: eagerly (writers triggering their dependents at once, then
// spinning), then captured in a graph (writers with and without the early
// trigger) replayed twice; each time out[] against ref[] bit for bit.
static PdlRun run_pdl_calls(cudaStream_t s, int iters, const std::vector<std::unique_ptr<Dev<float>>>& ref,
                            const std::vector<std::unique_ptr<Dev<float>>>& out,
                            const std::function<void(int, int, long long)>& writer,
                            const std::function<void(int, float*)>& gemm) {
  auto differ = [&]() {
    size_t bad = 0;
    for (int i = 0; i < iters; ++i) {
      auto u = ref[i]->down(), v = out[i]->down();
      for (size_t j = 0; j < u.size(); ++j) bad += memcmp(&u[j], &v[j], sizeof(float)) != 0;
    }
    return bad;
  };
  PdlRun r;
  for (int i = 0; i < iters; ++i) out[i]->poison();
  CK(cudaDeviceSynchronize());
  for (int i = 0; i < iters; ++i) {
    writer(i, 1, 20000);
    gemm(i, out[i]->p);
  }
  CK(cudaStreamSynchronize(s));
  r.bad_eager = differ();
  for (int trig = 0; trig < 2; ++trig) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < iters; ++i) {
      writer(i, trig, 20000);
      gemm(i, out[i]->p);
    }
    CK(cudaStreamEndCapture(s, &graph));
    r.prog_edges += programmatic_edges(graph);
    CK(cudaGraphInstantiate(&exec, graph, 0));
    for (int rep = 0; rep < 2; ++rep) {
      for (int i = 0; i < iters; ++i) out[i]->poison();
      CK(cudaDeviceSynchronize());
      CK(cudaGraphLaunch(exec, s));
      CK(cudaStreamSynchronize(s));
      r.bad_graph += differ();
    }
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
  }
  return r;
}

// PDL-launched dense GEMM: bit for bit the plain launch, eagerly on a stream
// and inside a captured graph, each call right after a kernel that rewrites X
// and xs (so a read before griddepcontrol.wait would show); the float64
// reference on the first X.
static void check_stream_pdl(int M, int N, int K, int ksplit, StreamTuning tune = {}) {
  const int iters = 4;
  LinearCase c = make_linear(M, N, K, M);
  Dev<uint8_t> dW(c.W), dX((size_t)M * K);
  Dev<float> dws(c.ws), dxs(M), db(c.bias), dwk((size_t)std::max(1, ksplit) * M * N);
  const PdlBuffers bufs(iters, (size_t)M * N);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  StreamGemmArgs a;
  a.W = dW.p;
  a.w_scale = dws.p;
  a.bias = db.p;
  a.X = dX.p;
  a.x_scale = dxs.p;
  a.M = M;
  a.N = N;
  a.K = K;
  a.ksplit = ksplit;
  a.ldy = N;
  a.ws = dwk.p;
  const uint64_t seed0 = rng();
  auto writer = [&](int i, int trigger, long long spin) {
    write_x_kernel<<<M, 128, 0, s>>>(dX.p, dxs.p, K, seed0 + 7919 * i, trigger, spin);
    CK(cudaGetLastError());
  };
  // Plain launches, one at a time: the expected outputs.
  std::vector<uint8_t> x0;
  std::vector<float> xs0;
  a.pdl = 0;
  run_plain_calls(
      s, iters, bufs, writer,
      [&](int, float* Y) {
        a.Y = Y;
        CK(gemm_fp8_stream_tuned(a, tune, s));
      },
      [&] {
        x0 = dX.down();
        xs0 = dxs.down();
      });
  // Float64 reference on the first X.
  LinearCase c0 = c;
  c0.X = x0;
  c0.xs = xs0;
  std::vector<double> r0;
  for (int r = 0; r < M; ++r)
    for (int n = 0; n < N; ++n) r0.push_back(linear_ref(c0, r, n, c.W.data(), c.ws.data(), c.bias.data()));
  auto y0 = bufs.ref[0]->down();
  const double err = rel_err(std::vector<double>(y0.begin(), y0.end()), r0);
  a.pdl = 1;
  const PdlRun run = run_pdl_calls(s, iters, bufs.ref, bufs.out, writer, [&](int, float* Y) {
    a.Y = Y;
    CK(gemm_fp8_stream_tuned(a, tune, s));
  });
  CK(cudaStreamDestroy(s));
  // PDL applies to the pipelined kernel (<= 32 rows): one programmatic edge
  // writer -> GEMM per call and graph; the register kernel is launched plainly.
  const int want_edges = M <= 32 ? 2 * iters : 0;
  report("gemm_fp8_stream pdl",
         fmt("M=%d N=%d K=%d ksplit=%d%s: differ eager %zu graph %zu, prog. edges %d/%d", M, N, K, ksplit,
             tuning_str(tune).c_str(), run.bad_eager, run.bad_graph, run.prog_edges, want_edges),
         (run.bad_eager || run.bad_graph || run.prog_edges != want_edges) ? 1.0 : err, 1e-5);
}

// Writes X / xs as write_x_kernel does (block r: row r) and, from block 0,
// the group offsets of iteration `it`: the counts `base` rotated by it.
static __global__ void write_grouped_kernel(uint8_t* __restrict__ X, float* __restrict__ xs, int K,
                                            int* __restrict__ offs, const int* __restrict__ base, int G,
                                            int it, uint64_t seed, int trigger, long long spin_ns) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (trigger) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  spin_for_ns(spin_ns);
  const int r = blockIdx.x;
  uint32_t* row = reinterpret_cast<uint32_t*>(X + (size_t)r * K);
  for (int i = threadIdx.x; i < K / 4; i += blockDim.x) {
    uint32_t v = (uint32_t)mix64(seed + (uint64_t)r * K + 4 * i);
    for (int b = 0; b < 4; ++b)
      if (((v >> (8 * b)) & 0x7f) == 0x7f) v ^= 1u << (8 * b);
    row[i] = v;
  }
  if (threadIdx.x == 0) xs[r] = (1.f + (float)(mix64(seed ^ (0x51ull + r)) & 255) / 256.f) / 448.f;
  if (r == 0 && threadIdx.x == 0) {
    int o = 0;
    for (int g = 0; g < G; ++g) {
      offs[g] = o;
      o += base[(g + it) % G];
    }
    offs[G] = o;
  }
}

// PDL-launched grouped GEMM (row tiles) with an L2 prefetch of one group's
// weights: bit for bit the plain launch, eagerly and inside a captured graph,
// each call right after a kernel that rewrites X, xs and the group offsets
// (another routing every call), so a read of any of them before
// griddepcontrol.wait would show; the float64 reference on the first call.
static void check_stream_grouped_pdl(int tile_rows, int prefetch_group) {
  const int iters = 4, G = 6, N = 272, K = 1536;
  const std::vector<int> base = {2, 0, 5, 1, 0, 3};
  const int rows = 11;  // sum of base: every rotation routes the same number of rows
  std::vector<int> xr(rows);
  for (int r = 0; r < rows; ++r) xr[r] = (r * 7) % rows;
  std::vector<uint8_t> Wg((size_t)G * N * K);
  for (auto& b : Wg) b = rand_fp8();
  std::vector<float> wsg((size_t)G * N), bg((size_t)G * N);
  for (auto& v : wsg) v = randu(0.5f, 2.f) / 448.f;
  for (auto& v : bg) v = randn();
  Dev<uint8_t> dW(Wg), dX((size_t)rows * K);
  Dev<float> dws(wsg), dxs(rows), db(bg);
  Dev<int> doff(std::vector<int>(G + 1, 0)), dbase(base), dxr(xr);
  const PdlBuffers bufs(iters, (size_t)rows * N);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  StreamGemmArgs a;
  a.W = dW.p;
  a.w_scale = dws.p;
  a.bias = db.p;
  a.X = dX.p;
  a.x_scale = dxs.p;
  a.x_rows = dxr.p;
  a.group_offsets = doff.p;
  a.groups = G;
  a.M = rows;
  a.N = N;
  a.K = K;
  a.ldy = N;
  a.max_rows_per_group = 5;
  a.typical_rows_per_group = 2;
  StreamTuning tune;
  tune.tile_rows = tile_rows;
  const uint64_t seed0 = rng();
  auto writer = [&](int i, int trigger, long long spin) {
    write_grouped_kernel<<<rows, 128, 0, s>>>(dX.p, dxs.p, K, doff.p, dbase.p, G, i, seed0 + 7919 * i, trigger,
                                              spin);
    CK(cudaGetLastError());
  };
  std::vector<uint8_t> x0;
  std::vector<float> xs0;
  std::vector<int> off0;
  a.pdl = 0;
  a.prefetch_group = -1;
  run_plain_calls(
      s, iters, bufs, writer,
      [&](int, float* Y) {
        a.Y = Y;
        CK(gemm_fp8_stream_tuned(a, tune, s));
      },
      [&] {
        x0 = dX.down();
        xs0 = dxs.down();
        off0 = doff.down();
      });
  // Float64 reference of the first call.
  std::vector<double> r0, y0d;
  const std::vector<float> y0 = bufs.ref[0]->down();
  for (int g = 0; g < G; ++g)
    for (int r = off0[g]; r < off0[g + 1]; ++r)
      for (int n = 0; n < N; ++n) {
        double acc = 0;
        const uint8_t* w = &Wg[((size_t)g * N + n) * K];
        const uint8_t* x = &x0[(size_t)xr[r] * K];
        for (int k = 0; k < K; ++k) acc += fp8_dec(x[k]) * fp8_dec(w[k]);
        r0.push_back(acc * xs0[xr[r]] * wsg[(size_t)g * N + n] + bg[(size_t)g * N + n]);
        y0d.push_back(y0[(size_t)r * N + n]);
      }
  const double err = rel_err(y0d, r0);
  a.pdl = 1;
  a.prefetch_group = prefetch_group;
  const PdlRun run = run_pdl_calls(s, iters, bufs.ref, bufs.out, writer, [&](int, float* Y) {
    a.Y = Y;
    CK(gemm_fp8_stream_tuned(a, tune, s));
  });
  CK(cudaStreamDestroy(s));
  report("gemm_fp8_stream grouped pdl",
         fmt("G=6 rows 11 N=272 K=1536 tile %d prefetch group %d: differ eager %zu graph %zu, prog. edges %d/%d",
             tile_rows, prefetch_group, run.bad_eager, run.bad_graph, run.prog_edges, 2 * iters),
         (run.bad_eager || run.bad_graph || run.prog_edges != 2 * iters) ? 1.0 : err, 1e-5);
  // A prefetch group outside the groups is refused.
  a.prefetch_group = G;
  const cudaError_t e = gemm_fp8_stream_tuned(a, tune, 0);
  (void)cudaGetLastError();
  report("gemm_fp8_stream grouped pdl", "prefetch group past the groups refused",
         e == cudaErrorInvalidValue ? 0 : 1, 0);
}

// FP32-activation (exactness-check) path, dense and grouped with gather.
static void check_f32act() {
  const int G = 3, N = 200, K = 384, xrows = 30;
  const int counts[G] = {9, 0, 21};
  std::vector<int> offs(G + 1, 0);
  for (int g = 0; g < G; ++g) offs[g + 1] = offs[g] + counts[g];
  const int rows = offs[G];
  std::vector<uint8_t> W((size_t)G * N * K);
  for (auto& b : W) b = rand_fp8();
  std::vector<float> ws((size_t)G * N), bias((size_t)G * N), X((size_t)xrows * K);
  for (auto& v : ws) v = randu(0.5f, 2.f) / 448.f;
  for (auto& v : bias) v = randn();
  for (auto& v : X) v = randn();
  std::vector<int> xr(rows);
  for (auto& v : xr) v = randi(0, xrows - 1);
  Dev<uint8_t> dW(W);
  Dev<float> dws(ws), db(bias), dX(X), dY((size_t)rows * N), dY1((size_t)xrows * N);
  Dev<int> doff(offs), dxr(xr);
  dY.poison();
  dY1.poison();
  StreamGemmArgs a;
  a.W = dW.p;
  a.w_scale = dws.p;
  a.bias = db.p;
  a.Xf = dX.p;
  a.x_rows = dxr.p;
  a.group_offsets = doff.p;
  a.groups = G;
  a.N = N;
  a.K = K;
  a.Y = dY.p;
  a.ldy = N;
  CK(gemm_fp8_stream(a, 0));
  StreamGemmArgs d1 = a;  // dense: all activation rows, group 0's weights
  d1.x_rows = nullptr;
  d1.group_offsets = nullptr;
  d1.groups = 1;
  d1.M = xrows;
  d1.Y = dY1.p;
  CK(gemm_fp8_stream(d1, 0));
  auto y = dY.down();
  auto y1 = dY1.down();
  auto ref_at = [&](int g, int xrow, int n) {
    double s = 0;
    for (int k = 0; k < K; ++k) s += (double)X[(size_t)xrow * K + k] * fp8_dec(W[((size_t)g * N + n) * K + k]);
    return s * ws[(size_t)g * N + n] + bias[(size_t)g * N + n];
  };
  std::vector<double> o(y.begin(), y.end()), r, o1(y1.begin(), y1.end()), r1;
  for (int g = 0; g < G; ++g)
    for (int row = offs[g]; row < offs[g + 1]; ++row)
      for (int n = 0; n < N; ++n) r.push_back(ref_at(g, xr[row], n));
  for (int row = 0; row < xrows; ++row)
    for (int n = 0; n < N; ++n) r1.push_back(ref_at(0, row, n));
  report("gemm f32-activation", "grouped G=3 rows {9,0,21} N=200 K=384 gather", rel_err(o, r), 1e-5);
  report("gemm f32-activation", "dense M=30 N=200 K=384", rel_err(o1, r1), 1e-5);

  const int inter = 256, rr = 5;
  std::vector<float> gu((size_t)rr * 2 * inter);
  for (auto& v : gu) v = randn() * 3;
  Dev<float> dgu(gu), dh((size_t)rr * inter);
  dh.poison();
  CK(silu_mul_f32(dgu.p, rr, inter, dh.p, nullptr, 0));
  auto h = dh.down();
  std::vector<double> oh(h.begin(), h.end()), rh;
  for (int row = 0; row < rr; ++row)
    for (int c = 0; c < inter; ++c) {
      const double g = gu[(size_t)row * 2 * inter + c], u = gu[(size_t)row * 2 * inter + inter + c];
      rh.push_back(g / (1 + std::exp(-g)) * u);
    }
  report("silu_mul_f32", "5x256", rel_err(oh, rh), 1e-6);
}

static void check_lt(const LtGemm& lt, int M, int N, int K) {
  LinearCase c = make_linear(M, N, K, M);
  Dev<uint8_t> dW(c.W), dX(c.X);
  Dev<float> dws(c.ws), dxs(c.xs), db(c.bias), dD((size_t)M * N), dY((size_t)M * N);
  dD.poison();
  dY.poison();
  CKS(lt_gemm_fp8(lt, dW.p, dX.p, dD.p, M, N, K, 0));
  CK(gemm_fp8_epilogue(dD.p, 1, M, N, dxs.p, dws.p, db.p, dY.p, N, 0));
  auto y = dY.down();
  std::vector<double> out(y.begin(), y.end()), ref;
  for (int r = 0; r < M; ++r)
    for (int n = 0; n < N; ++n) ref.push_back(linear_ref(c, r, n, c.W.data(), c.ws.data(), c.bias.data()));
  // Hopper FP8 tensor cores accumulate with reduced precision inside cuBLASLt's
  // k-blocks (measured 1.7e-4 - 2.1e-4 on H200), hence not 1e-5.
  report("lt_gemm_fp8 + epilogue", fmt("M=%d N=%d K=%d", M, N, K), rel_err(out, ref), 1e-3);
  // Scales (and bias) inside cuBLASLt: the same function.
  for (int with_bias = 0; with_bias < 2; ++with_bias) {
    Dev<float> dS((size_t)M * N);
    dS.poison();
    bool unsupported = false;
    CKS(lt_gemm_fp8_scaled(lt, dW.p, dX.p, dS.p, M, N, K, dxs.p, dws.p, with_bias ? db.p : nullptr,
                           &unsupported, 0));
    if (unsupported) {
      printf("lt_gemm_fp8_scaled: no outer-vector-scaled FP8 algorithm here (the runtime uses the epilogue)\n");
      return;
    }
    auto ys = dS.down();
    std::vector<double> os(ys.begin(), ys.end()), refs;
    for (int r = 0; r < M; ++r)
      for (int n = 0; n < N; ++n)
        refs.push_back(linear_ref(c, r, n, c.W.data(), c.ws.data(), with_bias ? c.bias.data() : nullptr));
    report("lt_gemm_fp8_scaled", fmt("M=%d N=%d K=%d%s", M, N, K, with_bias ? " +bias" : ""),
           rel_err(os, refs), 1e-3);
    if (with_bias) continue;
    // accumulate (the runtime's o_proj into the residual rows): Y0 + the same
    // product, against Y0 + the product written apart above (FP32 sums of the
    // same values: at most a rounding apart).
    std::vector<float> y0((size_t)M * N);
    for (auto& v : y0) v = randn() * 4.f;
    Dev<float> dA(y0);
    CKS(lt_gemm_fp8_scaled(lt, dW.p, dX.p, dA.p, M, N, K, dxs.p, dws.p, nullptr, &unsupported, 0, true));
    if (unsupported) {
      printf("lt_gemm_fp8_scaled: no algorithm that accumulates into Y here (the runtime writes apart)\n");
      continue;
    }
    auto ya = dA.down();
    std::vector<double> oa(ya.begin(), ya.end()), ra;
    for (size_t i = 0; i < ya.size(); ++i) ra.push_back((double)y0[i] + (double)ys[i]);
    report("lt_gemm_fp8_scaled accumulate", fmt("M=%d N=%d K=%d", M, N, K), rel_err(oa, ra), 1e-6);
  }
}

static void check_cublas(cublasHandle_t h) {
  const int M = 5, N = 1040, K = 256;
  std::vector<uint16_t> A((size_t)M * K), B((size_t)N * K);
  for (auto& v : A) v = bf16_bits(randn());
  for (auto& v : B) v = bf16_bits(randn() * 0.05f);
  Dev<uint16_t> dA(A), dB(B);
  Dev<float> dC((size_t)M * N);
  dC.poison();
  CKS(gemm_bf16_nt(h, (const __nv_bfloat16*)dA.p, (const __nv_bfloat16*)dB.p, dC.p, M, N, K, 0));
  auto C = dC.down();
  std::vector<double> out(C.begin(), C.end()), ref;
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double s = 0;
      for (int k = 0; k < K; ++k) s += (double)bf16_val(A[(size_t)m * K + k]) * bf16_val(B[(size_t)n * K + k]);
      ref.push_back(s);
    }
  report("gemm_bf16_nt (lm_head)", "M=5 N=1040 K=256", rel_err(out, ref), 1e-5);

  const int T = 9, E = 160, H = 512;
  std::vector<float> X((size_t)T * H), Wr((size_t)E * H);
  for (auto& v : X) v = randn();
  for (auto& v : Wr) v = randn() * 0.05f;
  Dev<float> dX(X), dW(Wr), dL((size_t)T * E);
  dL.poison();
  CKS(gemm_f32_nt(h, dX.p, dW.p, dL.p, T, E, H, 0));
  auto L = dL.down();
  std::vector<double> o2(L.begin(), L.end()), r2;
  for (int t = 0; t < T; ++t)
    for (int e = 0; e < E; ++e) {
      double s = 0;
      for (int k = 0; k < H; ++k) s += (double)X[(size_t)t * H + k] * Wr[(size_t)e * H + k];
      r2.push_back(s);
    }
  report("gemm_f32_nt (router)", "T=9 E=160 H=512", rel_err(o2, r2), 1e-5);
}

// ------------------------------------------------------------ norm + rope

static void check_norm() {
  const int rows = 11, H = 5120;
  std::vector<float> h((size_t)rows * H), d((size_t)rows * H), w(H);
  for (auto& v : h) v = randn() * 4;
  for (auto& v : d) v = randn();
  for (auto& v : w) v = bf16_round(randu(0.5f, 1.5f));
  const float eps = 1e-5f;
  Dev<float> dh(h), dd(d), dw(w), dout((size_t)rows * H), ds(rows);
  Dev<uint8_t> dq((size_t)rows * H);
  Dev<uint16_t> db((size_t)rows * H);
  dout.poison();
  dq.poison();
  ds.poison();
  db.poison();
  AddNormArgs a;
  a.h = dh.p;
  a.delta = dd.p;
  a.weight = dw.p;
  a.rows = rows;
  a.hidden = H;
  a.eps = eps;
  a.out_f32 = dout.p;
  a.out_q = dq.p;
  a.out_scale = ds.p;
  a.out_bf16 = (__nv_bfloat16*)db.p;
  CK(add_rmsnorm(a, 0));
  auto ho = dh.down();
  auto o = dout.down();
  auto q = dq.down();
  auto s = ds.down();
  auto b = db.down();
  std::vector<double> rh, oh, ry, oy, oq, ob, rb;
  for (int r = 0; r < rows; ++r) {
    double ss = 0;
    for (int c = 0; c < H; ++c) {
      const double v = (double)h[(size_t)r * H + c] + d[(size_t)r * H + c];
      rh.push_back(v);
      oh.push_back(ho[(size_t)r * H + c]);
      ss += v * v;
    }
    const double inv = 1.0 / std::sqrt(ss / H + eps);
    for (int c = 0; c < H; ++c) {
      const double y = w[c] * rh[(size_t)r * H + c] * inv;
      ry.push_back(y);
      oy.push_back(o[(size_t)r * H + c]);
      oq.push_back(fp8_dec(q[(size_t)r * H + c]) * s[r]);
      ob.push_back(bf16_val(b[(size_t)r * H + c]));
    }
  }
  report("add_rmsnorm residual", "11x5120 h += delta", rel_err(oh, rh), 1e-6);
  report("add_rmsnorm f32", "11x5120", rel_err(oy, ry), 1e-5);
  report("add_rmsnorm bf16", "11x5120", rel_err(ob, ry), 5e-3);
  report("add_rmsnorm fp8", "11x5120 (FP8 rounding)", rel_err(oq, ry), 4e-2);

  // Indexed rows, no delta (the final norm of the logits rows).
  std::vector<int> idx = {3, 0, 10};
  Dev<int> didx(idx);
  Dev<float> dh2(h), dout2(idx.size() * H);
  dout2.poison();
  AddNormArgs a2;
  a2.h = dh2.p;
  a2.weight = dw.p;
  a2.rows = (int)idx.size();
  a2.hidden = H;
  a2.eps = eps;
  a2.row_index = didx.p;
  a2.out_f32 = dout2.p;
  CK(add_rmsnorm(a2, 0));
  auto o2 = dout2.down();
  std::vector<double> r2, x2(o2.begin(), o2.end());
  for (int i : idx) {
    double ss = 0;
    for (int c = 0; c < H; ++c) ss += (double)h[(size_t)i * H + c] * h[(size_t)i * H + c];
    const double inv = 1.0 / std::sqrt(ss / H + eps);
    for (int c = 0; c < H; ++c) r2.push_back(w[c] * h[(size_t)i * H + c] * inv);
  }
  report("add_rmsnorm indexed", "rows {3,0,10} of 11, no delta", rel_err(x2, r2), 1e-5);
}

static void check_rope(bool f32) {
  const int T = 7, NH = 24, NKV = 2, D = 128, rot = 64, bs = 16, nblocks = 64;
  const int W = (NH + 2 * NKV) * D;
  std::vector<float> qkv((size_t)T * W), qn(D), kn(D);
  for (auto& v : qkv) v = randn() * 2 + 0.5f;
  for (auto& v : qn) v = bf16_round(randu(0.5f, 1.5f));
  for (auto& v : kn) v = bf16_round(randu(0.5f, 1.5f));
  std::vector<int> pos = {0, 1, 17, 255, 4095, 100000, 202751};
  std::vector<int> slots(T);
  for (int t = 0; t < T; ++t) slots[t] = randi(0, nblocks * bs - 1) / T * T + t;  // distinct
  auto inv = make_inv_freq(rot, 1e6f);
  const size_t cache_n = (size_t)nblocks * NKV * bs * D;
  Dev<float> dqkv(qkv), dqn(qn), dkn(kn), dinv(inv), dq((size_t)T * NH * D);
  Dev<int> dpos(pos), dslot(slots);
  const size_t ce = f32 ? 2 : 1;  // cache elements as uint16 units
  Dev<uint16_t> dk(cache_n * ce), dv(cache_n * ce);
  dq.poison();
  dk.poison();
  dv.poison();
  QkRopeArgs a;
  a.kv_f32 = f32;
  a.qkv = dqkv.p;
  a.T = T;
  a.n_q_heads = NH;
  a.n_kv_heads = NKV;
  a.rot_dim = rot;
  a.q_norm = dqn.p;
  a.k_norm = dkn.p;
  a.inv_freq = dinv.p;
  a.positions = dpos.p;
  a.slots = dslot.p;
  a.block_size = bs;
  a.q_out = dq.p;
  a.k_cache = dk.p;
  a.v_cache = dv.p;
  CK(qk_norm_rope_kv_write(a, 0));
  auto q = dq.down();
  auto kc = dk.down();
  auto vc = dv.down();
  auto cval = [&](const std::vector<uint16_t>& c, size_t i) -> double {
    if (!f32) return bf16_val(c[i]);
    float v;
    memcpy(&v, &c[2 * i], 4);
    return v;
  };
  auto cwritten = [&](const std::vector<uint16_t>& c, size_t i) {
    return f32 ? !std::isnan(cval(c, i)) : c[i] != 0xffff;
  };
  std::vector<double> oq, rq, ok, rk, ov, rv;
  auto norm_rope = [&](const float* x, const std::vector<float>& w, int p, std::vector<double>& out) {
    double ss = 0;
    for (int d = 0; d < D; ++d) ss += (double)x[d] * x[d];
    const double r = 1.0 / std::sqrt(ss / D + 1e-5);
    std::vector<double> y(D);
    for (int d = 0; d < D; ++d) y[d] = w[d] * x[d] * r;
    std::vector<double> z = y;
    for (int j = 0; j < rot; ++j) {
      const int h = rot / 2;
      const double ang = (double)((float)p * inv[j % h]);  // FP32 angle, as HF
      const double rh = j < h ? -y[j + h] : y[j - h];
      z[j] = y[j] * std::cos(ang) + rh * std::sin(ang);
    }
    out.insert(out.end(), z.begin(), z.end());
  };
  size_t written = 0;
  for (int t = 0; t < T; ++t) {
    const float* row = qkv.data() + (size_t)t * W;
    for (int h = 0; h < NH; ++h) {
      norm_rope(row + h * D, qn, pos[t], rq);
      for (int d = 0; d < D; ++d) oq.push_back(q[((size_t)t * NH + h) * D + d]);
    }
    const int blk = slots[t] / bs, off = slots[t] % bs;
    for (int h = 0; h < NKV; ++h) {
      norm_rope(row + (NH + h) * D, kn, pos[t], rk);
      const size_t base = (((size_t)blk * NKV + h) * bs + off) * D;
      for (int d = 0; d < D; ++d) {
        ok.push_back(cval(kc, base + d));
        ov.push_back(cval(vc, base + d));
        rv.push_back(row[(NH + NKV + h) * D + d]);
      }
    }
  }
  for (size_t i = 0; i < cache_n; ++i) written += cwritten(kc, i) + cwritten(vc, i);
  const char* dt = f32 ? "fp32" : "bf16";
  const double ctol = f32 ? 2e-6 : 5e-3;
  report("qk_norm_rope q", "T=7 24q/2kv heads pos up to 202751", rel_err(oq, rq), 2e-6);
  report("qk_norm_rope k cache", dt, rel_err(ok, rk), ctol);
  report("qk_norm_rope v cache", fmt("%s, slots written %zu (want %d)", dt, written, 2 * T * NKV * D),
         written == (size_t)2 * T * NKV * D ? rel_err(ov, rv) : 1.0, ctol);
}

// ------------------------------------------------------------ attention

static void check_attention(int NH, int NKV, std::vector<int> n_q, std::vector<int> start, const char* what,
                            bool f32 = false) {
  const int D = 128, bs = 16;
  const int S = (int)n_q.size();
  const int G = NH / NKV;
  int T = 0;
  std::vector<int> q_begin(S), ctx(S);
  for (int s = 0; s < S; ++s) {
    q_begin[s] = T;
    T += n_q[s];
    ctx[s] = start[s] + n_q[s];
  }
  // Block tables: a random permutation of the pool.
  int total_blocks = 0;
  for (int s = 0; s < S; ++s) total_blocks += (ctx[s] + bs - 1) / bs;
  const int pool = total_blocks + 7;
  std::vector<int> perm(pool);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int> bt, bt_off(S);
  int used = 0;
  for (int s = 0; s < S; ++s) {
    bt_off[s] = (int)bt.size();
    for (int b = 0; b < (ctx[s] + bs - 1) / bs; ++b) bt.push_back(perm[used++]);
  }
  const size_t cache_n = (size_t)pool * NKV * bs * D;
  std::vector<uint16_t> kc(cache_n), vc(cache_n);
  for (auto& v : kc) v = bf16_bits(randn());
  for (auto& v : vc) v = bf16_bits(randn());
  std::vector<float> q((size_t)T * NH * D);
  for (auto& v : q) v = randn();
  std::vector<int> pos(T);
  for (int s = 0; s < S; ++s)
    for (int i = 0; i < n_q[s]; ++i) pos[q_begin[s] + i] = start[s] + i;

  std::vector<AttnSeqDesc> sd(S);
  for (int s = 0; s < S; ++s) sd[s] = AttnSeqDesc{q_begin[s], n_q[s], start[s]};
  std::vector<AttnItem> items(4096);
  std::vector<AttnMerge> merges(512);
  AttnPlan plan{items.data(), (int)items.size(), 0, merges.data(), (int)merges.size(), 0, 1024, 0};
  const char* why = nullptr;
  if (!plan_attention(sd.data(), S, G, &plan, &why)) {
    report("attention", why, NAN, 0);
    return;
  }
  items.resize(plan.n_items);
  merges.resize(plan.n_merges);
  // FP32 caches hold the same (BF16-representable) values.
  std::vector<float> kf(cache_n), vf(cache_n);
  for (size_t i = 0; i < cache_n; ++i) {
    kf[i] = bf16_val(kc[i]);
    vf[i] = bf16_val(vc[i]);
  }
  Dev<uint16_t> dk(kc), dv(vc);
  Dev<float> dkf(f32 ? kf : std::vector<float>(1)), dvf(f32 ? vf : std::vector<float>(1));
  Dev<float> dq(q), dout((size_t)T * NH * D), dpo((size_t)std::max(1, plan.n_parts) * NH * D),
      dpml((size_t)std::max(1, plan.n_parts) * NH * 2);
  Dev<int> dpos(pos), dbt(bt), dbto(bt_off);
  Dev<AttnItem> ditems(items);
  Dev<AttnMerge> dmerge(merges.empty() ? std::vector<AttnMerge>(1) : merges);
  dout.poison();
  AttnArgs a;
  a.q = dq.p;
  a.k_cache = f32 ? (const void*)dkf.p : (const void*)dk.p;
  a.v_cache = f32 ? (const void*)dvf.p : (const void*)dv.p;
  a.kv_f32 = f32;
  a.block_size = bs;
  a.n_q_heads = NH;
  a.n_kv_heads = NKV;
  a.scale = 1.0f / std::sqrt((float)D);
  a.positions = dpos.p;
  a.seq_bt_offset = dbto.p;
  a.block_tables = dbt.p;
  a.items = ditems.p;
  a.n_items = plan.n_items;
  a.out = dout.p;
  a.part_o = dpo.p;
  a.part_ml = dpml.p;
  CK(attention_paged(a, 0));
  CK(attention_merge(dmerge.p, plan.n_merges, NH, dpo.p, dpml.p, dout.p, 0));
  auto out = dout.down();
  std::vector<double> o(out.begin(), out.end()), ref((size_t)T * NH * D);
  for (int s = 0; s < S; ++s) {
    for (int i = 0; i < n_q[s]; ++i) {
      const int t = q_begin[s] + i, p = pos[t];
      for (int h = 0; h < NH; ++h) {
        const int kvh = h / G;
        std::vector<double> sc(p + 1);
        double mx = -1e300;
        for (int j = 0; j <= p; ++j) {
          const size_t base = (((size_t)bt[bt_off[s] + j / bs] * NKV + kvh) * bs + j % bs) * D;
          double d0 = 0;
          for (int d = 0; d < D; ++d) d0 += (double)q[((size_t)t * NH + h) * D + d] * bf16_val(kc[base + d]);
          sc[j] = d0 / std::sqrt((double)D);
          mx = std::max(mx, sc[j]);
        }
        double l = 0;
        for (int j = 0; j <= p; ++j) l += (sc[j] = std::exp(sc[j] - mx));
        for (int d = 0; d < D; ++d) {
          double acc = 0;
          for (int j = 0; j <= p; ++j) {
            const size_t base = (((size_t)bt[bt_off[s] + j / bs] * NKV + kvh) * bs + j % bs) * D;
            acc += sc[j] * bf16_val(vc[base + d]);
          }
          ref[((size_t)t * NH + h) * D + d] = acc / l;
        }
      }
    }
  }
  report("attention_paged", fmt("%s%s: %d items, %d merges", what, f32 ? " fp32 KV" : "", plan.n_items, plan.n_merges),
         rel_err(o, ref), 1e-5);
}

// ------------------------------------------------------------ router + MoE

static void router_ref(const std::vector<float>& logits, const std::vector<float>& bias, int T, int E, int K,
                       int ng, int tg, float scale, std::vector<int>& ids, std::vector<double>& w) {
  ids.assign((size_t)T * K, -1);
  w.assign((size_t)T * K, 0);
  for (int t = 0; t < T; ++t) {
    std::vector<double> s(E), sel(E);
    for (int e = 0; e < E; ++e) {
      s[e] = 1.0 / (1.0 + std::exp(-(double)logits[(size_t)t * E + e]));
      sel[e] = s[e] + bias[e];
    }
    if (ng > 1) {
      const int gs = E / ng;
      std::vector<double> gsc(ng);
      for (int g = 0; g < ng; ++g) {
        std::vector<double> v(sel.begin() + g * gs, sel.begin() + (g + 1) * gs);
        std::sort(v.rbegin(), v.rend());
        gsc[g] = v[0] + v[1];
      }
      std::vector<int> go(ng);
      std::iota(go.begin(), go.end(), 0);
      std::stable_sort(go.begin(), go.end(), [&](int a, int b) { return gsc[a] > gsc[b]; });
      std::vector<bool> keep(ng, false);
      for (int i = 0; i < tg; ++i) keep[go[i]] = true;
      for (int e = 0; e < E; ++e)
        if (!keep[e / gs]) sel[e] = -INFINITY;
    }
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return sel[a] > sel[b]; });
    double sum = 0;
    for (int k = 0; k < K; ++k) sum += s[order[k]];
    for (int k = 0; k < K; ++k) {
      ids[(size_t)t * K + k] = order[k];
      w[(size_t)t * K + k] = s[order[k]] / (sum + 1e-20) * scale;
    }
  }
}

static void check_router(int T, int E, int K, int ng, int tg) {
  std::vector<float> lg((size_t)T * E), bias(E);
  for (auto& v : lg) v = randn() * 2;
  for (auto& v : bias) v = randn() * 0.1f;
  std::vector<int> rid;
  std::vector<double> rw;
  router_ref(lg, bias, T, E, K, ng, tg, 2.5f, rid, rw);
  // Two ranks' views: experts [0, E/2) and [E/2, E); rank 0 holds the shared expert.
  size_t bad = 0;
  double werr = 0;
  for (int rank = 0; rank < 2; ++rank) {
    const int nl = E / 2, eb = rank * nl, slots = K + 1;
    Dev<float> dl(lg), db(bias), dw((size_t)T * slots);
    Dev<int> did((size_t)T * slots), dg((size_t)T * K);
    did.poison();
    dw.poison();
    dg.poison();
    RouterArgs a;
    a.logits = dl.p;
    a.bias = db.p;
    a.T = T;
    a.E = E;
    a.top_k = K;
    a.n_group = ng;
    a.topk_group = tg;
    a.scale = 2.5f;
    a.expert_begin = eb;
    a.n_local = nl;
    a.shared_local = rank == 0 ? nl : -1;
    a.ids = did.p;
    a.w = dw.p;
    a.topk_global = dg.p;
    if (rank == 1) {  // rank 1 has no shared expert: K slots
      a.shared_local = -1;
    }
    CK(router_topk(a, 0));
    auto id = did.down();
    auto w = dw.down();
    auto g = dg.down();
    const int sl = K + (a.shared_local >= 0 ? 1 : 0);
    std::vector<double> o, r;
    for (int t = 0; t < T; ++t) {
      for (int k = 0; k < K; ++k) {
        const int ge = rid[(size_t)t * K + k];
        bad += g[(size_t)t * K + k] != ge;
        const int want = (ge >= eb && ge < eb + nl) ? ge - eb : -1;
        bad += id[(size_t)t * sl + k] != want;
        o.push_back(w[(size_t)t * sl + k]);
        r.push_back(rw[(size_t)t * K + k]);
      }
      if (a.shared_local >= 0) {
        bad += id[(size_t)t * sl + K] != nl;
        bad += w[(size_t)t * sl + K] != 1.0f;
      }
    }
    werr = std::max(werr, rel_err(o, r));
  }
  report("router_topk", fmt("T=%d E=%d k=%d groups %d/%d, 2 ranks, id mismatches %zu", T, E, K, tg, ng, bad),
         bad ? 1.0 : werr, 1e-6);
}

// Whole MoE block: router ids/weights given; align, grouped gate|up, SiLU*up
// quant, grouped down, combine (+ shared expert as the last slot).
static void check_moe(int T, int H, int I, int E, int K) {
  const int G = E + 1, slots = K + 1;
  std::vector<uint8_t> wgu((size_t)G * 2 * I * H), wd((size_t)G * H * I), xq((size_t)T * H);
  for (auto& b : wgu) b = fp8_enc(randn() * 100);
  for (auto& b : wd) b = fp8_enc(randn() * 100);
  std::vector<float> sgu((size_t)G * 2 * I), sd((size_t)G * H), xs(T);
  for (auto& v : sgu) v = randu(0.5f, 1.5f) / 448.f;
  for (auto& v : sd) v = randu(0.5f, 1.5f) / 448.f;
  std::vector<float> x((size_t)T * H);
  for (auto& v : x) v = randn();
  {
    std::vector<uint8_t> q;
    quant_ref(x, T, H, q, xs);
    xq = q;
  }
  std::vector<int> ids((size_t)T * slots);
  std::vector<float> w((size_t)T * slots);
  for (int t = 0; t < T; ++t) {
    std::vector<int> e(E);
    std::iota(e.begin(), e.end(), 0);
    std::shuffle(e.begin(), e.end(), rng);
    for (int k = 0; k < K; ++k) {
      // Bias towards expert 0 so one group gets many rows.
      ids[(size_t)t * slots + k] = (k == 0 && t % 2 == 0) ? 0 : e[k] == 0 ? e[K] : e[k];
      w[(size_t)t * slots + k] = randu(0.1f, 1.f);
    }
    ids[(size_t)t * slots + K] = E;
    w[(size_t)t * slots + K] = 1.f;
    // k==0 forced to 0 may duplicate; dedupe by replacement with an unused expert.
    std::vector<bool> seen(E, false);
    for (int k = 0; k < K; ++k) {
      int& id = ids[(size_t)t * slots + k];
      if (seen[id])
        for (int c = 0; c < E; ++c)
          if (!seen[c]) {
            id = c;
            break;
          }
      seen[id] = true;
    }
  }
  const int R = T * slots;
  Dev<uint8_t> dwgu(wgu), dwd(wd), dxq(xq), dhq((size_t)R * I);
  Dev<float> dsgu(sgu), dsd(sd), dxs(xs), dw(w), dgu((size_t)R * 2 * I), dhs(R), dy((size_t)R * H),
      ddelta((size_t)T * H);
  Dev<int> dids(ids), doff(G + 1), drows(R), dinv(R);
  dgu.poison();
  dy.poison();
  ddelta.poison();
  CK(moe_align(dids.p, T, slots, G, doff.p, drows.p, dinv.p, 0));
  StreamGemmArgs a;
  a.W = dwgu.p;
  a.w_scale = dsgu.p;
  a.X = dxq.p;
  a.x_scale = dxs.p;
  a.x_rows = drows.p;
  a.group_offsets = doff.p;
  a.groups = G;
  a.N = 2 * I;
  a.K = H;
  a.max_rows_per_group = T;
  a.max_active_groups = std::min(G, T * slots);  // as the runtime: each token hits <= slots groups
  a.Y = dgu.p;
  a.ldy = 2 * I;
  CK(gemm_fp8_stream(a, 0));
  CK(silu_mul_quant_fp8(dgu.p, R, I, dhq.p, dhs.p, doff.p + G, 0));
  StreamGemmArgs b;
  b.W = dwd.p;
  b.w_scale = dsd.p;
  b.X = dhq.p;
  b.x_scale = dhs.p;
  b.group_offsets = doff.p;
  b.groups = G;
  b.N = H;
  b.K = I;
  b.max_rows_per_group = T;
  b.max_active_groups = std::min(G, T * slots);
  b.Y = dy.p;
  b.ldy = H;
  CK(gemm_fp8_stream(b, 0));
  CK(moe_combine(dy.p, dinv.p, dw.p, T, slots, H, ddelta.p, 0));
  auto out = ddelta.down();
  auto off = doff.down();
  // Reference (float64, the same FP8 quantization of the intermediate).
  std::vector<double> ref((size_t)T * H, 0.0), o(out.begin(), out.end());
  for (int t = 0; t < T; ++t) {
    for (int k = 0; k < slots; ++k) {
      const int e = ids[(size_t)t * slots + k];
      std::vector<float> h(I);
      for (int i = 0; i < I; ++i) {
        double g = 0, u = 0;
        for (int c = 0; c < H; ++c) {
          const double xv = fp8_dec(xq[(size_t)t * H + c]);
          g += xv * fp8_dec(wgu[((size_t)e * 2 * I + i) * H + c]);
          u += xv * fp8_dec(wgu[((size_t)e * 2 * I + I + i) * H + c]);
        }
        g *= (double)xs[t] * sgu[(size_t)e * 2 * I + i];
        u *= (double)xs[t] * sgu[(size_t)e * 2 * I + I + i];
        h[i] = (float)(g / (1 + std::exp(-g)) * u);
      }
      std::vector<uint8_t> hq;
      std::vector<float> hs;
      quant_ref(h, 1, I, hq, hs);
      for (int c = 0; c < H; ++c) {
        double y = 0;
        for (int i = 0; i < I; ++i) y += fp8_dec(hq[i]) * fp8_dec(wd[((size_t)e * H + c) * I + i]);
        ref[(size_t)t * H + c] += w[(size_t)t * slots + k] * y * hs[0] * sd[(size_t)e * H + c];
      }
    }
  }
  report("moe align+gemms+combine",
         fmt("T=%d H=%d I=%d E=%d+1 k=%d rows(e0)=%d", T, H, I, E, K, off[1] - off[0]), rel_err(o, ref),
         2e-2);
}

// ------------------------------------------------------------ embed

static void check_embed() {
  const int V = 1040, H = 256, T = 13;
  std::vector<uint16_t> tab((size_t)V * H);
  for (auto& v : tab) v = bf16_bits(randn());
  std::vector<int> ids(T);
  for (auto& v : ids) v = randi(0, V - 1);
  Dev<uint16_t> dt(tab);
  Dev<int> di(ids);
  Dev<float> dh((size_t)T * H);
  dh.poison();
  CK(embed_gather((const __nv_bfloat16*)dt.p, di.p, T, H, dh.p, 0));
  auto h = dh.down();
  std::vector<double> o(h.begin(), h.end()), r;
  for (int t = 0; t < T; ++t)
    for (int c = 0; c < H; ++c) r.push_back(bf16_val(tab[(size_t)ids[t] * H + c]));
  report("embed_gather", "T=13 V=1040 H=256", rel_err(o, r), 0.0);

  const int tp = 3, rows = 4, vl = 50;
  std::vector<float> parts((size_t)tp * rows * vl);
  for (auto& v : parts) v = randn();
  Dev<float> dp(parts), dout((size_t)rows * tp * vl);
  dout.poison();
  CK(logits_interleave(dp.p, tp, rows, vl, dout.p, 0));
  auto out = dout.down();
  std::vector<double> o2(out.begin(), out.end()), r2((size_t)rows * tp * vl);
  for (int p = 0; p < tp; ++p)
    for (int r = 0; r < rows; ++r)
      for (int v = 0; v < vl; ++v) r2[(size_t)r * tp * vl + p * vl + v] = parts[((size_t)p * rows + r) * vl + v];
  report("logits_interleave", "tp=3 rows=4 v_local=50", rel_err(o2, r2), 0.0);
}

// ------------------------------------------------------------ sampling (port of pkg/sample)

// mix64: SplitMix64's finaliser (defined with the host numerics above).
static double uniform_ref(uint64_t seed, int64_t idx) {
  const uint64_t g = 0x9E3779B97F4A7C15ull;
  const uint64_t key = mix64(seed + g);
  return (double)(mix64(key + ((uint64_t)idx + 1) * g) >> 11) * (1.0 / 9007199254740992.0);
}

struct RefSample {
  int token;
  float logprob;
  std::vector<int> top;
  std::vector<float> top_lp;
};
// pkg/sample.Sample, line for line (float64).
// mask: nullptr, or the row's token bitmask (pkg/sample: disallowed tokens to
// -Inf after the penalties).
static RefSample sample_ref(const float* lg, int V, const SampleRow& p, const std::vector<int>& pt,
                            const std::vector<int>& pp, const std::vector<int>& po,
                            const uint32_t* mask = nullptr) {
  std::vector<double> w(V);
  for (int i = 0; i < V; ++i) w[i] = lg[i];
  const bool rep = p.repetition_penalty > 0 && p.repetition_penalty != 1;
  for (size_t e = 0; e < pt.size(); ++e) {
    double& x = w[pt[e]];
    if (rep && pp[e] + po[e] > 0) x = x > 0 ? x / (double)p.repetition_penalty : x * (double)p.repetition_penalty;
    if ((p.frequency_penalty != 0 || p.presence_penalty != 0) && po[e] > 0)
      x -= (double)po[e] * p.frequency_penalty + p.presence_penalty;
  }
  if (mask)
    for (int i = 0; i < V; ++i)
      if (!(mask[i >> 5] >> (i & 31) & 1u)) w[i] = -INFINITY;
  RefSample r{};
  if (p.temperature <= 0) {
    int best = 0;
    for (int i = 0; i < V; ++i)
      if (w[i] > w[best]) best = i;
    r.token = best;
  } else {
    const double inv = 1 / (double)p.temperature;
    double mx = -INFINITY;
    for (auto& x : w) mx = std::max(mx, x *= inv);
    for (auto& x : w) x = std::exp(x - mx);
    if (p.min_p > 0)
      for (auto& x : w)
        if (x < (double)p.min_p) x = 0;
    if (p.top_k > 0 && p.top_k < V) {
      std::vector<double> pos;
      for (double x : w)
        if (x > 0) pos.push_back(x);
      if ((int)pos.size() >= p.top_k) {
        std::nth_element(pos.begin(), pos.begin() + (p.top_k - 1), pos.end(), std::greater<double>());
        const double kth = pos[p.top_k - 1];
        for (auto& x : w)
          if (x < kth) x = 0;
      }
    }
    if (p.top_p > 0 && p.top_p < 1) {
      std::vector<int> ids;
      double total = 0;
      for (int i = 0; i < V; ++i)
        if (w[i] > 0) {
          ids.push_back(i);
          total += w[i];
        }
      std::stable_sort(ids.begin(), ids.end(), [&](int a, int b) { return w[a] > w[b]; });
      const double limit = (double)p.top_p * total;
      double mass = 0;
      size_t n = 0;
      while (n < ids.size() && mass < limit) mass += w[ids[n++]];
      for (size_t i = n; i < ids.size(); ++i) w[ids[i]] = 0;
    }
    double total = 0;
    for (double x : w) total += x;
    const double target = uniform_ref(p.seed, p.sample_index) * total;
    double acc = 0;
    int last = -1;
    r.token = -1;
    for (int i = 0; i < V; ++i) {
      if (w[i] <= 0) continue;
      acc += w[i];
      last = i;
      if (acc > target) {
        r.token = i;
        break;
      }
    }
    if (r.token < 0) r.token = last;
  }
  double mx = -INFINITY;
  for (int i = 0; i < V; ++i) mx = std::max(mx, (double)lg[i]);
  double s = 0;
  for (int i = 0; i < V; ++i) s += std::exp((double)lg[i] - mx);
  const double lse = mx + std::log(s);
  r.logprob = (float)((double)lg[r.token] - lse);
  std::vector<int> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return lg[a] > lg[b]; });
  for (int k = 0; k < p.n_top; ++k) {
    r.top.push_back(order[k]);
    r.top_lp.push_back((float)((double)lg[order[k]] - lse));
  }
  return r;
}

static void check_sampling(int V, int rows, const char* what) {
  std::vector<float> lg((size_t)rows * V);
  for (int r = 0; r < rows; ++r) {
    const float sc = randu(0.5f, 6.f);
    for (int i = 0; i < V; ++i) lg[(size_t)r * V + i] = randn() * sc;
    // Ties: duplicate a few values (greedy and top-n tie rule), and -inf entries.
    lg[(size_t)r * V + 7] = lg[(size_t)r * V + 3];
    lg[(size_t)r * V + 11] = -INFINITY;
  }
  lg[2 * (size_t)V + 100] = lg[2 * (size_t)V + 200] = 50.f;  // exact top tie in row 2
  std::vector<SampleRow> ps(rows);
  std::vector<int> pen_row, pen_tok, pen_p, pen_o;
  std::vector<int> seg_b, seg_e;
  // Token masks (structured outputs): every third row allows ~5% of the
  // tokens, always including its top raw logit's neighbour so the mask
  // matters; the last row allows only token 11, which is -Inf: status 5.
  const int mw = (V + 31) / 32;
  std::vector<uint32_t> masks;
  for (int r = 0; r < rows; ++r) {
    SampleRow& p = ps[r];
    p = SampleRow{};
    if (r % 3 == 1 || r == rows - 1) {
      p.mask_row = (int)(masks.size() / mw);
      masks.resize(masks.size() + mw, 0u);
      uint32_t* m = masks.data() + (size_t)p.mask_row * mw;
      if (r == rows - 1) {
        m[11 >> 5] |= 1u << (11 & 31);
      } else {
        for (int i = 0; i < V; ++i)
          if (randu(0, 1) < 0.05f) m[i >> 5] |= 1u << (i & 31);
        m[5 >> 5] |= 1u << 5;
      }
    }
    const int kind = r % 8;
    p.temperature = (kind == 0 || r == 2) ? 0.f : randu(0.3f, 1.5f);
    p.top_k = (kind == 2 || kind == 5) ? randi(1, 50) : 0;
    p.top_p = (kind == 3 || kind == 5) ? randu(0.3f, 0.97f) : 1.f;
    p.min_p = (kind == 4 || kind == 5) ? randu(0.01f, 0.3f) : 0.f;
    p.repetition_penalty = (kind == 6 || kind == 0) ? randu(1.05f, 1.6f) : 1.f;
    p.frequency_penalty = kind == 6 ? randu(-1, 1) : 0.f;
    p.presence_penalty = kind == 6 ? randu(-1, 1) : 0.f;
    p.n_top = randi(0, kMaxTop);
    p.seed = rng();
    p.sample_index = randi(0, 1000);
    p.sort_segment = -1;
    const bool needs_sort = p.temperature > 0 && ((p.top_k > 0 && p.top_k < V) || (p.top_p > 0 && p.top_p < 1));
    if (needs_sort) {
      p.sort_segment = (int)seg_b.size();
      seg_b.push_back(r * V);
      seg_e.push_back((r + 1) * V);
    }
    if (kind == 6 || kind == 0) {
      std::vector<int> toks(V);
      std::iota(toks.begin(), toks.end(), 0);
      std::shuffle(toks.begin(), toks.end(), rng);
      const int n = randi(1, std::min(V, 300));
      for (int i = 0; i < n; ++i) {
        pen_row.push_back(r);
        pen_tok.push_back(toks[i]);
        const int pc = randi(0, 2), oc = pc == 0 ? randi(1, 3) : randi(0, 3);
        pen_p.push_back(pc);
        pen_o.push_back(oc);
      }
    }
  }
  const size_t wsb = sample_workspace_bytes(rows, V);
  Dev<float> dl(lg);
  Dev<SampleRow> dps(ps);
  Dev<uint32_t> dmask(masks);
  Dev<int> dpr(pen_row), dpt(pen_tok), dpp(pen_p), dpo(pen_o), dsb(seg_b), dse(seg_e);
  Dev<char> dws(wsb);
  Dev<SampleOut> dout(rows);
  Dev<int> dti((size_t)rows * kMaxTop);
  Dev<float> dtl((size_t)rows * kMaxTop);
  dout.poison();
  dti.poison();
  dtl.poison();
  SampleArgs a;
  a.logits = dl.p;
  a.ld = V;
  a.rows = rows;
  a.V = V;
  a.params = dps.p;
  a.pen_row = dpr.p;
  a.pen_token = dpt.p;
  a.pen_prompt = dpp.p;
  a.pen_output = dpo.p;
  a.n_pen = (int)pen_row.size();
  a.seg_begin = dsb.p;
  a.seg_end = dse.p;
  a.n_seg = (int)seg_b.size();
  a.masks = dmask.p;
  a.mask_words = mw;
  a.workspace = dws.p;
  a.workspace_bytes = wsb;
  a.out = dout.p;
  a.top_ids = dti.p;
  a.top_lp = dtl.p;
  CK(sample_rows(a, 0));
  auto out = dout.down();
  auto ti = dti.down();
  auto tl = dtl.down();
  int tok_bad = 0, top_bad = 0;
  double lp_err = 0;
  for (int r = 0; r < rows; ++r) {
    std::vector<int> pt, pp, po;
    for (size_t e = 0; e < pen_row.size(); ++e)
      if (pen_row[e] == r) {
        pt.push_back(pen_tok[e]);
        pp.push_back(pen_p[e]);
        po.push_back(pen_o[e]);
      }
    const uint32_t* mask = ps[r].mask_row >= 0 ? masks.data() + (size_t)ps[r].mask_row * mw : nullptr;
    if (r == rows - 1) {  // the mask leaves only a -Inf logit: status 5, no token
      if (out[r].status != 5 || out[r].token != -1) {
        ++tok_bad;
        printf("  row %d: masked to a -Inf logit: token %d status %d, want -1 / 5\n", r, out[r].token, out[r].status);
      }
      continue;
    }
    RefSample ref = sample_ref(lg.data() + (size_t)r * V, V, ps[r], pt, pp, po, mask);
    if (mask && !(mask[out[r].token >> 5] >> (out[r].token & 31) & 1u)) {
      ++tok_bad;
      printf("  row %d: token %d is not allowed by its mask\n", r, out[r].token);
    }
    if (out[r].status != 0 || out[r].token != ref.token) {
      ++tok_bad;
      printf("  row %d: token %d status %d, reference %d (T=%.3f k=%d p=%.3f minp=%.3f)\n", r, out[r].token,
             out[r].status, ref.token, ps[r].temperature, ps[r].top_k, ps[r].top_p, ps[r].min_p);
    }
    lp_err = std::max(lp_err, (double)std::fabs(out[r].logprob - ref.logprob));
    for (int k = 0; k < ps[r].n_top; ++k) {
      top_bad += ti[(size_t)r * kMaxTop + k] != ref.top[k];
      lp_err = std::max(lp_err, (double)std::fabs(tl[(size_t)r * kMaxTop + k] - ref.top_lp[k]));
    }
    for (int k = ps[r].n_top; k < kMaxTop; ++k) top_bad += ti[(size_t)r * kMaxTop + k] != -1;
  }
  report("sample_rows", fmt("%s V=%d rows=%d: token mismatches %d, top-n %d", what, V, rows, tok_bad, top_bad),
         (tok_bad || top_bad) ? 1.0 : lp_err, 1e-5);
}

// ------------------------------------------------------------ bench

static __global__ void fill_fp8_kernel(uint8_t* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint64_t z = mix64(seed + i * 0x9E3779B97F4A7C15ull);
    uint8_t b = (uint8_t)z;
    if ((b & 0x7f) == 0x7f) b ^= 1;  // no NaN codes
    p[i] = b;
  }
}
static void fill_fp8(uint8_t* p, size_t n) {
  fill_fp8_kernel<<<1024, 256>>>(p, n, rng());
  CK(cudaGetLastError());
}

template <typename F>
static float time_ms(F f, int iters = 50) {
  for (int i = 0; i < 5; ++i) f(i, (cudaStream_t)0);
  CK(cudaDeviceSynchronize());
  return median_ms(iters, (cudaStream_t)0, [&](int i) { f(i, (cudaStream_t)0); });
}

// Back-to-back: `launches` calls between two events (the GPU never waits for
// the host, as in a decode step or a CUDA graph), per-call time, median of
// `reps`. time_ms above times one synchronised call, host launch latency included.
template <typename F>
static float time_b2b_ms(F f, int launches = 20, int reps = 11) {
  for (int i = 0; i < 5; ++i) f(i, (cudaStream_t)0);
  CK(cudaDeviceSynchronize());
  return median_ms(reps, (cudaStream_t)0, [&](int r) {
           for (int i = 0; i < launches; ++i) f(r * launches + i, (cudaStream_t)0);
         }) / launches;
}

// CUDA graph of `launches` calls (the launch gaps a decode step would have
// once it is captured), per-call time, median of `reps` replays.
template <typename F>
static float time_graph_ms(F f, int launches = 20, int reps = 11) {
  return graph_replay_ms(f, launches, reps, 5, 1) / launches;
}

struct BenchRow {
  std::string what;
  int m;
  double us, gbs;      // one synchronised call
  double us_b2b = 0;   // back-to-back
  double us_graph = 0; // CUDA graph
};

// Launch shapes tried by --sweep (invalid ones, e.g. over the shared-memory
// limit, are skipped).
static std::vector<StreamTuning> sweep_tunings() {
  std::vector<StreamTuning> v;
  for (int kw : {1, 2, 4, 8})
    for (int rt : {1, 2})
      for (int st : {2, 3, 4, 6, 8})
        for (int pf : {0, 2})
          for (int sk : {128, 256, 512}) {
            if (kw * rt > 8) continue;
            v.push_back({kw, rt, st, pf, sk});
          }
  return v;
}

static void bench(const LtGemm& lt, int num_sms, bool sweep) {
  const double ceiling = 4460.0;  // GB/s, HBM read (docs/hardware.md §2, H200)
  std::vector<BenchRow> rows;
  // Dense decode linears: rotate over copies so the weights never sit in L2.
  struct Shape {
    const char* name;
    int N, K;
  } shapes[] = {{"linear N=12288 K=5120", 12288, 5120},
                {"linear qkv N=14336 K=5120", 14336, 5120},
                {"linear o N=5120 K=12288", 5120, 12288}};
  const int copies = 6;
  const int Ms[] = {1, 2, 4, 8, 16, 32, 64};
  for (auto& sh : shapes) {
    const size_t wbytes = (size_t)sh.N * sh.K;
    Dev<uint8_t> W(wbytes * copies), X((size_t)64 * sh.K);
    Dev<float> ws((size_t)sh.N * copies), xs(64), Y((size_t)64 * sh.N), wk((size_t)16 * 64 * sh.N),
        D((size_t)64 * sh.N);
    fill_fp8(W.p, W.n);
    fill_fp8(X.p, X.n);
    std::vector<float> one((size_t)sh.N * copies, 1.f / 448), onex(64, 1.f / 448);
    ws.up(one);
    xs.up(onex);
    for (int M : Ms) {
      StreamGemmArgs a;
      a.w_scale = ws.p;
      a.X = X.p;
      a.x_scale = xs.p;
      a.M = M;
      a.N = sh.N;
      a.K = sh.K;
      a.ksplit = gemm_fp8_stream_splits(M, sh.N, sh.K, num_sms);
      a.Y = Y.p;
      a.ldy = sh.N;
      a.ws = wk.p;
      auto run = [&](int i, cudaStream_t s) {
        a.W = W.p + (i % copies) * wbytes;
        a.w_scale = ws.p + (i % copies) * sh.N;
        CK(gemm_fp8_stream(a, s));
      };
      const float ms = time_ms(run);
      const float mb = time_b2b_ms(run);
      const float mgr = time_graph_ms(run);
      rows.push_back({fmt("%s (stream, ksplit %d)", sh.name, a.ksplit), M, ms * 1e3, wbytes / (ms * 1e-3) / 1e9,
                      mb * 1e3, mgr * 1e3});
      auto run_lt = [&](int i, cudaStream_t s) {
        CKS(lt_gemm_fp8(lt, W.p + (i % copies) * wbytes, X.p, D.p, M, sh.N, sh.K, s));
      };
      const float ml = time_ms(run_lt);
      const float mlb = time_b2b_ms(run_lt);
      const float mlg = time_graph_ms(run_lt);
      rows.push_back({fmt("%s (cuBLASLt)", sh.name), M, ml * 1e3, wbytes / (ml * 1e-3) / 1e9, mlb * 1e3, mlg * 1e3});
      if (sweep && (M == 1 || M == 4 || M == 8)) {
        // Every launch shape, back-to-back; the 5 fastest and the automatic one.
        std::vector<std::pair<float, std::string>> res;
        for (const StreamTuning& tu : sweep_tunings()) {
          StreamGemmArgs b = a;
          b.ksplit = 1;
          if (gemm_fp8_stream_tuned(b, tu, 0) != cudaSuccess) {
            (void)cudaGetLastError();
            continue;
          }
          const float t = time_b2b_ms([&](int i, cudaStream_t s) {
            b.W = W.p + (i % copies) * wbytes;
            b.w_scale = ws.p + (i % copies) * sh.N;
            CK(gemm_fp8_stream_tuned(b, tu, s));
          }, 10, 5);
          res.push_back({t, tuning_str(tu)});
        }
        std::sort(res.begin(), res.end());
        printf("sweep %s M=%d auto %.1f us (%.1f%%):", sh.name, M, mb * 1e3, 100.0 * wbytes / (mb * 1e-3) / 1e9 / 4460.0);
        for (size_t i = 0; i < res.size() && i < 6; ++i)
          printf(" [%s] %.1f us %.1f%%", res[i].second.c_str(), res[i].first * 1e3,
                 100.0 * wbytes / (res[i].first * 1e-3) / 1e9 / 4460.0);
        printf("\n");
        fflush(stdout);
      }
    }
  }
  // MoE: 160 experts, top-8, gate|up [3072, 5120] and down [5120, 1536].
  {
    const int E = 160, K = 8, H = 5120, I = 1536;
    const size_t gu_b = (size_t)2 * I * H, d_b = (size_t)H * I;
    Dev<uint8_t> Wgu(gu_b * E), Wd(d_b * E), X((size_t)64 * H), Hq((size_t)64 * K * I);
    Dev<float> sgu((size_t)E * 2 * I), sd((size_t)E * H), xs(64), hs(64 * K), Ygu((size_t)64 * K * 2 * I),
        Yd((size_t)64 * K * H);
    fill_fp8(Wgu.p, Wgu.n);
    fill_fp8(Wd.p, Wd.n);
    fill_fp8(X.p, X.n);
    fill_fp8(Hq.p, Hq.n);
    sgu.up(std::vector<float>((size_t)E * 2 * I, 1.f / 448));
    sd.up(std::vector<float>((size_t)E * H, 1.f / 448));
    xs.up(std::vector<float>(64, 1.f / 448));
    hs.up(std::vector<float>(64 * K, 1.f / 448));
    for (int M : Ms) {
      // Random routing: M tokens x 8 distinct experts, sorted by expert.
      std::vector<int> cnt(E, 0), rowsx;
      std::vector<std::vector<int>> per(E);
      for (int t = 0; t < M; ++t) {
        std::vector<int> e(E);
        std::iota(e.begin(), e.end(), 0);
        std::shuffle(e.begin(), e.end(), rng);
        for (int k = 0; k < K; ++k) per[e[k]].push_back(t);
      }
      std::vector<int> off(E + 1, 0);
      int active = 0;
      for (int e = 0; e < E; ++e) {
        off[e + 1] = off[e] + (int)per[e].size();
        active += !per[e].empty();
        for (int t : per[e]) rowsx.push_back(t);
      }
      Dev<int> doff(off), drows(rowsx);
      StreamGemmArgs g;
      g.W = Wgu.p;
      g.w_scale = sgu.p;
      g.X = X.p;
      g.x_scale = xs.p;
      g.x_rows = drows.p;
      g.group_offsets = doff.p;
      g.groups = E;
      g.N = 2 * I;
      g.K = H;
      g.max_rows_per_group = M;
      g.max_active_groups = std::min(E, M * K);  // as the runtime (tokens x slots)
      g.typical_rows_per_group = (M * K + E - 1) / E;  // rows per hit expert, as the runtime
      g.Y = Ygu.p;
      g.ldy = 2 * I;
      StreamGemmArgs d = g;
      d.W = Wd.p;
      d.w_scale = sd.p;
      d.X = Hq.p;
      d.x_scale = hs.p;
      d.x_rows = nullptr;
      d.N = H;
      d.K = I;
      d.Y = Yd.p;
      d.ldy = H;
      // The expert weights (1.9 GB) are far larger than L2, but one call reads
      // only the hit experts; back-to-back calls read the same ones (L2 holds
      // at most a fraction of them: 126 MB at M=1).
      auto rg = [&](int, cudaStream_t s) { CK(gemm_fp8_stream(g, s)); };
      auto rd = [&](int, cudaStream_t s) { CK(gemm_fp8_stream(d, s)); };
      const float mg = time_ms(rg), mgb = time_b2b_ms(rg), mgg = time_graph_ms(rg);
      const float md = time_ms(rd), mdb = time_b2b_ms(rd), mdg = time_graph_ms(rd);
      rows.push_back({fmt("moe gate|up 160x[3072,5120] (%d experts hit)", active), M, mg * 1e3,
                      active * gu_b / (mg * 1e-3) / 1e9, mgb * 1e3, mgg * 1e3});
      rows.push_back({fmt("moe down 160x[5120,1536] (%d experts hit)", active), M, md * 1e3,
                      active * d_b / (md * 1e-3) / 1e9, mdb * 1e3, mdg * 1e3});
      if (sweep && (M <= 4 || M == 16 || M == 32)) {
        for (int which = 0; which < 2; ++which) {
          StreamGemmArgs& base = which == 0 ? g : d;
          const double bytes = (double)active * (which == 0 ? gu_b : d_b);
          std::vector<std::pair<float, std::string>> res;
          for (const StreamTuning& tu : sweep_tunings()) {
            if (gemm_fp8_stream_tuned(base, tu, 0) != cudaSuccess) {
              (void)cudaGetLastError();
              continue;
            }
            const float t = time_b2b_ms([&](int, cudaStream_t s) { CK(gemm_fp8_stream_tuned(base, tu, s)); }, 10, 5);
            res.push_back({t, tuning_str(tu)});
          }
          std::sort(res.begin(), res.end());
          const float au = which == 0 ? mgb : mdb;
          printf("sweep moe %s M=%d auto %.1f us (%.1f%%):", which == 0 ? "gate|up" : "down", M, au * 1e3,
                 100.0 * bytes / (au * 1e-3) / 1e9 / 4460.0);
          for (size_t i = 0; i < res.size() && i < 6; ++i)
            printf(" [%s] %.1f us %.1f%%", res[i].second.c_str(), res[i].first * 1e3,
                   100.0 * bytes / (res[i].first * 1e-3) / 1e9 / 4460.0);
          printf("\n");
          fflush(stdout);
        }
      }
    }
  }
  // MoE of one GPU at 8-way expert parallelism (GLM-4.7 TP8/EP8): 20 local
  // experts of 160; each token's top-8 is drawn over all 160 and the local ones
  // kept (~1 hit per token, "top-1"), plus the shared expert as group 20 with
  // every token (21 groups: how the runtime runs it up to 8 rows) or not (20
  // groups: beyond 8 rows it is a dense linear). before = the dispatch before the
  // row tiles (StreamTuning::legacy with max_rows_per_group = T: the register
  // kernel above 32 rows); after = typical_rows_per_group = ceil(T * 8 / 160)
  // = ceil(T / 20) as the runtime should pass it (row tiles up to 32 typical
  // rows; T = 1024, prefill-sized: the whole-group dispatch again); "after, no
  // typical" = without it (from T); "after, tile R" = the other tile heights. The
  // expert weights rotate over 3 copies (never in L2); % of 4.46 TB/s on the
  // bytes of the groups hit.
  {
    const int E = 160, TOPK = 8, LOCAL = 20, H = 5120, I = 1536, slots = TOPK + 1, copies = 3;
    const int GMAX = LOCAL + 1, Tmax = 1024, RMAX = 2 * Tmax + 64;  // rows: local hits (~T) + shared (T)
    const size_t gu_b = (size_t)2 * I * H, d_b = (size_t)H * I;
    Dev<uint8_t> Wgu(gu_b * GMAX * copies), Wd(d_b * GMAX * copies), X((size_t)Tmax * H), Hq((size_t)RMAX * I);
    Dev<float> sgu((size_t)GMAX * copies * 2 * I), sd((size_t)GMAX * copies * H), xs(Tmax), hs(RMAX),
        Ygu((size_t)RMAX * 2 * I), Yd((size_t)RMAX * H);
    fill_fp8(Wgu.p, Wgu.n);
    fill_fp8(Wd.p, Wd.n);
    fill_fp8(X.p, X.n);
    fill_fp8(Hq.p, Hq.n);
    sgu.up(std::vector<float>(sgu.n, 1.f / 448));
    sd.up(std::vector<float>(sd.n, 1.f / 448));
    xs.up(std::vector<float>(xs.n, 1.f / 448));
    hs.up(std::vector<float>(hs.n, 1.f / 448));
    for (int T : {1, 8, 16, 64, 128, 256, 1024}) {
      std::vector<std::vector<int>> per(GMAX);
      for (int t = 0; t < T; ++t) {
        std::vector<int> e(E);
        std::iota(e.begin(), e.end(), 0);
        std::shuffle(e.begin(), e.end(), rng);
        for (int k = 0; k < TOPK; ++k)
          if (e[k] < LOCAL) per[e[k]].push_back(t);
        per[LOCAL].push_back(t);  // the shared expert (used with 21 groups)
      }
      for (int G : {GMAX, LOCAL}) {
        if ((T > 256 && G == GMAX) || (T <= 8 && G == LOCAL)) continue;  // as the runtime groups them
        std::vector<int> off(G + 1, 0), rowsx;
        int active = 0, maxc = 0;
        for (int e = 0; e < G; ++e) {
          off[e + 1] = off[e] + (int)per[e].size();
          active += !per[e].empty();
          maxc = std::max(maxc, (int)per[e].size());
          for (int t : per[e]) rowsx.push_back(t);
        }
        if ((int)rowsx.size() > RMAX) {
          fprintf(stderr, "bench: %zu routed rows > %d\n", rowsx.size(), RMAX);
          exit(2);
        }
        Dev<int> doff(off), drows(rowsx);
        StreamGemmArgs g;
        g.X = X.p;
        g.x_scale = xs.p;
        g.x_rows = drows.p;
        g.group_offsets = doff.p;
        g.groups = G;
        g.N = 2 * I;
        g.K = H;
        g.max_rows_per_group = T;
        g.max_active_groups = std::min(G, T * slots);  // as the runtime (rows x slots)
        g.Y = Ygu.p;
        g.ldy = 2 * I;
        StreamGemmArgs d = g;
        d.X = Hq.p;
        d.x_scale = hs.p;
        d.x_rows = nullptr;
        d.N = H;
        d.K = I;
        d.Y = Yd.p;
        d.ldy = H;
        const int typical = (T * TOPK + E - 1) / E;
        struct Variant {
          std::string name;
          int typical;
          StreamTuning tune;
        };
        std::vector<Variant> variants = {{"before (legacy)", 0, legacy_tuning()}, {"after", typical, {}}};
        if (G == LOCAL) {
          // The tile-height policy (typical_rows_per_group) against the other heights.
          variants.push_back({"after, no typical", 0, {}});
          const int auto_tr = typical <= 8 ? 8 : typical <= 16 ? 16 : typical <= 32 ? 32 : 0;
          for (int tr : {8, 16, 32})
            if (tr != auto_tr) variants.push_back({fmt("after, tile %d", tr), typical, tile_tuning(tr)});
        }
        for (const Variant& v : variants) {
          g.typical_rows_per_group = d.typical_rows_per_group = v.typical;
          auto rg = [&](int i, cudaStream_t s) {
            const int cp = i % copies;
            g.W = Wgu.p + (size_t)cp * GMAX * gu_b;
            g.w_scale = sgu.p + (size_t)cp * GMAX * 2 * I;
            CK(gemm_fp8_stream_tuned(g, v.tune, s));
          };
          auto rd = [&](int i, cudaStream_t s) {
            const int cp = i % copies;
            d.W = Wd.p + (size_t)cp * GMAX * d_b;
            d.w_scale = sd.p + (size_t)cp * GMAX * H;
            CK(gemm_fp8_stream_tuned(d, v.tune, s));
          };
          const float mg = time_ms(rg, 20), mgb = time_b2b_ms(rg), mgg = time_graph_ms(rg);
          const float md = time_ms(rd, 20), mdb = time_b2b_ms(rd), mdg = time_graph_ms(rd);
          rows.push_back({fmt("rank gate|up %dx[3072,5120] %d hit <=%d %s", G, active, maxc, v.name.c_str()), T,
                          mg * 1e3, active * gu_b / (mg * 1e-3) / 1e9, mgb * 1e3, mgg * 1e3});
          rows.push_back({fmt("rank down %dx[5120,1536] %d hit <=%d %s", G, active, maxc, v.name.c_str()), T,
                          md * 1e3, active * d_b / (md * 1e-3) / 1e9, mdb * 1e3, mdg * 1e3});
        }
      }
    }
  }
  // Dense decode linears of one GPU at TP8 with programmatic dependent launch.
  // Each call sits in a CUDA graph right after a small kernel that writes its X
  // (20 pairs per graph; us per pair): plain launches; PDL with a writer that
  // does not trigger (the linear may start only as the writer ends); PDL with a
  // writer that triggers at its start (the weight prologue and L2 prefetch
  // overlap the writer); the same without the L2 prefetch (the pipeline stages
  // only). "writer" = a graph of the writers alone. Weights rotate over copies
  // (>= 160 MB in all, never in L2).
  struct PdlRow {
    std::string what;
    int m;
    double writer, plain, pdl_late, pdl, pdl_nopf;
    size_t bytes;
  };
  std::vector<PdlRow> pdl_rows;
  {
    struct DShape {
      const char* name;
      int N, K;
    } dshapes[] = {{"qkv [1792,5120]", 1792, 5120},
                   {"o_proj [5120,1536]", 5120, 1536},
                   {"shared gate|up [3072,5120]", 3072, 5120},
                   {"shared down [5120,1536]", 5120, 1536}};
    for (const DShape& sh : dshapes) {
      const size_t wbytes = (size_t)sh.N * sh.K;
      const int dcopies = (int)std::max<size_t>(6, (160u << 20) / wbytes + 1);
      Dev<uint8_t> W(wbytes * dcopies), X((size_t)8 * sh.K);
      Dev<float> ws((size_t)sh.N * dcopies), xs(8), Y((size_t)8 * sh.N), wk((size_t)16 * 8 * sh.N);
      fill_fp8(W.p, W.n);
      ws.up(std::vector<float>(ws.n, 1.f / 448));
      for (int M : {1, 4, 8}) {
        StreamGemmArgs a;
        a.X = X.p;
        a.x_scale = xs.p;
        a.M = M;
        a.N = sh.N;
        a.K = sh.K;
        a.ksplit = gemm_fp8_stream_splits(M, sh.N, sh.K, num_sms);
        a.Y = Y.p;
        a.ldy = sh.N;
        a.ws = wk.p;
        auto pair = [&](int pdl, int trigger, int pdl_prefetch) {
          return [&, pdl, trigger, pdl_prefetch](int i, cudaStream_t s) {
            write_x_kernel<<<M, 128, 0, s>>>(X.p, xs.p, sh.K, 1000 + i, trigger, 0);
            CK(cudaGetLastError());
            if (pdl < 0) return;  // the writer alone
            StreamTuning tu;
            tu.pdl_prefetch = pdl_prefetch;
            a.W = W.p + (size_t)(i % dcopies) * wbytes;
            a.w_scale = ws.p + (size_t)(i % dcopies) * sh.N;
            a.pdl = pdl;
            CK(gemm_fp8_stream_tuned(a, tu, s));
          };
        };
        PdlRow r{fmt("%s ksplit %d", sh.name, a.ksplit), M};
        r.writer = time_graph_ms(pair(-1, 0, -1)) * 1e3;
        r.plain = time_graph_ms(pair(0, 0, -1)) * 1e3;
        r.pdl_late = time_graph_ms(pair(1, 0, -1)) * 1e3;
        r.pdl = time_graph_ms(pair(1, 1, -1)) * 1e3;
        r.pdl_nopf = time_graph_ms(pair(1, 1, 0)) * 1e3;
        r.bytes = wbytes;
        pdl_rows.push_back(r);
      }
    }
  }
  // "1 call": one call between events, synchronised (host launch latency
  // included, as in the first figures); "b2b": 20 calls queued on a stream;
  // "graph": 20 calls in a CUDA graph. Per call; % = bytes / time / 4.46 TB/s.
  printf("\n%-58s %4s %9s %9s %7s %8s %7s %8s %7s\n", "kernel (FP8 weights read once)", "M", "us 1call",
         "GB/s", "of 4.46", "us b2b", "of 4.46", "us graph", "of 4.46");
  for (auto& r : rows) {
    const double bytes = r.gbs * r.us * 1e3;  // GB/s x us = kB
    printf("%-58s %4d %9.1f %9.0f %6.1f%% %8.1f %6.1f%% %8.1f %6.1f%%\n", r.what.c_str(), r.m, r.us, r.gbs,
           100.0 * r.gbs / ceiling, r.us_b2b, 100.0 * bytes / (r.us_b2b * 1e3) / ceiling, r.us_graph,
           100.0 * bytes / (r.us_graph * 1e3) / ceiling);
  }
  // PDL table: us per (writer, linear) pair in a CUDA graph; "linear %" = the
  // weight bytes / (pair - writer alone) / 4.46 TB/s (an upper estimate of the
  // linear's own rate once it overlaps the writer).
  printf("\n%-40s %4s %8s %8s %9s %8s %9s %7s %8s %8s\n", "dense linear after a writer (graph)", "M", "writer",
         "plain", "pdl-late", "pdl", "pdl-nopf", "gain", "plain %", "pdl %");
  for (auto& r : pdl_rows) {
    auto pct = [&](double pair) {
      return pair > r.writer ? 100.0 * r.bytes / ((pair - r.writer) * 1e-6) / 1e9 / ceiling : 0.0;
    };
    printf("%-40s %4d %8.1f %8.1f %9.1f %8.1f %9.1f %7.1f %7.1f%% %7.1f%%\n", r.what.c_str(), r.m, r.writer,
           r.plain, r.pdl_late, r.pdl, r.pdl_nopf, r.plain - r.pdl, pct(r.plain), pct(r.pdl));
  }
}

// --profile: two calls of each decode kernel at M=1 (dense shapes: ours and
// cuBLASLt; MoE gate|up and down, 8 experts) and nothing else, for
// `ncu --clock-control none -k regex:gemm ...` (kernel time without launch gaps).
static void profile_calls(const LtGemm& lt) {
  const int shapes[3][2] = {{12288, 5120}, {14336, 5120}, {5120, 12288}};
  for (const auto& sh : shapes) {
    const int N = sh[0], K = sh[1];
    Dev<uint8_t> W((size_t)N * K), X(K);
    Dev<float> ws(N), xs(1), Y(N), D(N);
    fill_fp8(W.p, W.n);
    fill_fp8(X.p, X.n);
    ws.up(std::vector<float>(N, 1.f / 448));
    xs.up(std::vector<float>(1, 1.f / 448));
    StreamGemmArgs a;
    a.W = W.p;
    a.w_scale = ws.p;
    a.X = X.p;
    a.x_scale = xs.p;
    a.M = 1;
    a.N = N;
    a.K = K;
    a.Y = Y.p;
    a.ldy = N;
    for (int i = 0; i < 2; ++i) CK(gemm_fp8_stream(a, 0));
    for (int i = 0; i < 2; ++i) CKS(lt_gemm_fp8(lt, W.p, X.p, D.p, 1, N, K, 0));
    CK(cudaDeviceSynchronize());
  }
  const int E = 160, TOPK = 8, H = 5120, I = 1536;
  Dev<uint8_t> Wgu((size_t)2 * I * H * E), Wd((size_t)H * I * E), X(H), Hq((size_t)TOPK * I);
  Dev<float> sgu((size_t)E * 2 * I), sd((size_t)E * H), xs(1), hs(TOPK), Ygu((size_t)TOPK * 2 * I),
      Yd((size_t)TOPK * H);
  fill_fp8(Wgu.p, Wgu.n);
  fill_fp8(Wd.p, Wd.n);
  fill_fp8(X.p, X.n);
  fill_fp8(Hq.p, Hq.n);
  sgu.up(std::vector<float>((size_t)E * 2 * I, 1.f / 448));
  sd.up(std::vector<float>((size_t)E * H, 1.f / 448));
  xs.up(std::vector<float>(1, 1.f / 448));
  hs.up(std::vector<float>(TOPK, 1.f / 448));
  std::vector<int> off(E + 1, 0), rows(TOPK, 0);
  for (int e = 0; e < E; ++e) off[e + 1] = off[e] + (e % 20 == 3 ? 1 : 0);  // 8 experts, one row each
  Dev<int> doff(off), drows(rows);
  StreamGemmArgs g;
  g.W = Wgu.p;
  g.w_scale = sgu.p;
  g.X = X.p;
  g.x_scale = xs.p;
  g.x_rows = drows.p;
  g.group_offsets = doff.p;
  g.groups = E;
  g.N = 2 * I;
  g.K = H;
  g.max_rows_per_group = 1;
  g.max_active_groups = TOPK;
  g.Y = Ygu.p;
  g.ldy = 2 * I;
  StreamGemmArgs d = g;
  d.W = Wd.p;
  d.w_scale = sd.p;
  d.X = Hq.p;
  d.x_scale = hs.p;
  d.x_rows = nullptr;
  d.N = H;
  d.K = I;
  d.Y = Yd.p;
  d.ldy = H;
  for (int i = 0; i < 2; ++i) CK(gemm_fp8_stream(g, 0));
  for (int i = 0; i < 2; ++i) CK(gemm_fp8_stream(d, 0));
  CK(cudaDeviceSynchronize());
}

int main(int argc, char** argv) {
  uint64_t seed = 0x5eed;
  bool do_bench = false, only_bench = false, sweep = false, profile = false;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], nullptr, 0);
    else if (!strcmp(argv[i], "--bench")) do_bench = true;
    else if (!strcmp(argv[i], "--bench-only")) do_bench = only_bench = true;
    else if (!strcmp(argv[i], "--sweep")) do_bench = only_bench = sweep = true;
    else if (!strcmp(argv[i], "--profile")) only_bench = profile = true;
    else {
      fprintf(stderr, "usage: kernel_check [--seed N] [--bench] [--bench-only] [--sweep] [--profile]\n");
      return 2;
    }
  }
  rng.seed(seed);
  init_fp8();
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("device: %s, %d SMs, seed %llu\n", prop.name, prop.multiProcessorCount, (unsigned long long)seed);
  LtGemm lt;
  if (cublasLtCreate(&lt.handle) != CUBLAS_STATUS_SUCCESS) {
    fprintf(stderr, "cublasLtCreate failed\n");
    return 2;
  }
  lt.workspace_bytes = 32u << 20;
  CK(cudaMalloc(&lt.workspace, lt.workspace_bytes));
  cublasHandle_t cb;
  if (cublasCreate(&cb) != CUBLAS_STATUS_SUCCESS) {
    fprintf(stderr, "cublasCreate failed\n");
    return 2;
  }
  if (!only_bench) {
    check_quant();
    for (int M : {1, 5, 8, 16, 33, 64, 130}) check_stream_dense(M, 1000, 1536, 1);
    check_stream_dense(7, 2048, 5120, 4);
    check_stream_dense(64, 520, 12288, gemm_fp8_stream_splits(64, 520, 12288, prop.multiProcessorCount));
    check_stream_grouped();
    // Every launch shape of the streaming kernel: K split over 2..8 warps of a
    // block (odd counts, K stages not divisible), several 16-row tiles per block
    // with a dead last tile (N=1000), pipeline depths 2..16, L2 prefetch hints,
    // token chunks (M=70: two passes) and a block split with warp splits.
    check_stream_dense(1, 1000, 1536, 1, {2, 1, 3, 0, 512});
    check_stream_dense(3, 1000, 1664, 1, {3, 2, 4, 2, 128});
    check_stream_dense(8, 1000, 1536, 1, {8, 1, 2, 1, 128});
    check_stream_dense(5, 1000, 1536, 1, {1, 4, 16, 2, 128});
    check_stream_dense(6, 1000, 2560, 1, {3, 1, 5, 2, 256});
    check_stream_dense(7, 1000, 3072, 1, {2, 3, 2, 0, 512});
    check_stream_dense(16, 1000, 1536, 1, {1, 2, 4, 2, 128});
    check_stream_dense(20, 1000, 1536, 1, {4, 2, 3, 0, 128});
    check_stream_dense(32, 1000, 1536, 1, {2, 1, 2, 2, 128});
    check_stream_dense(2, 2048, 5120, 4, {2, 2, 6, 2, 256});
    check_stream_dense(40, 1000, 1536, 2);  // register-pipelined kernel, split over blocks
    check_stream_grouped(4);                // row tiles, compacted grid
    check_stream_grouped(5, {2, 2, 2, 2, 128}, 30);
    check_stream_grouped(4, {1, 1, 8, 1, 128}, 8);
    check_stream_grouped(0, {}, 8);
    check_stream_grouped(4, {4, 1, 3, 2, 512}, 5);
    // The dispatch before the row tiles: register kernel (compacted and full
    // grid), pipelined kernel over whole groups.
    check_stream_grouped(4, legacy_tuning());
    check_stream_grouped(0, legacy_tuning());
    check_stream_grouped(5, legacy_tuning({2, 2, 2, 2, 128}), 30);
    check_grouped_tiles_all();
    // Programmatic dependent launch of the dense pipelined kernel (the last
    // two: split-K + plain epilogue, and the register kernel, launched plainly).
    check_stream_pdl(1, 1000, 1536, 1);
    check_stream_pdl(8, 1792, 5120, 1);
    check_stream_pdl(5, 1000, 2560, 1, [] { StreamTuning t{3, 1, 5, 2, 256}; t.pdl_prefetch = 0; return t; }());
    check_stream_pdl(16, 520, 1536, 1, [] { StreamTuning t{2, 2, 3, 2, 128}; t.pdl_prefetch = 640; return t; }());
    check_stream_pdl(32, 1000, 1536, 1);
    check_stream_pdl(7, 2048, 5120, 4);
    check_stream_pdl(40, 1000, 1536, 2);
    check_stream_grouped_pdl(8, 2);
    check_stream_grouped_pdl(16, 5);
    check_stream_grouped_pdl(8, -1);
    check_f32act();
    check_lt(lt, 200, 1024, 1536);
    check_lt(lt, 65, 272, 256);
    check_cublas(cb);
    check_norm();
    check_rope(false);
    check_rope(true);
    check_attention(24, 2, {20, 1, 1, 3}, {5, 700, 1500, 40}, "G=12 prefill+decode+split");
    check_attention(4, 2, {70, 1}, {0, 2100}, "G=2 prefill 70 tok + split");
    check_attention(4, 2, {9, 1}, {3, 1100}, "G=2", true);
    check_router(50, 160, 8, 1, 1);
    check_router(33, 16, 4, 4, 2);
    check_router(9, 256, 8, 8, 4);
    check_moe(1, 256, 128, 8, 2);
    check_moe(19, 512, 256, 16, 4);
    check_moe(70, 256, 128, 8, 2);
    check_embed();
    check_sampling(1040, 64, "tiny vocab");
    check_sampling(151552, 24, "GLM vocab");
    CK(cudaDeviceSynchronize());
  }
  const int fails = failed_checks();
  if (do_bench) bench(lt, prop.multiProcessorCount, sweep);
  if (profile) profile_calls(lt);
  if (!only_bench) {
    print_table("rel.err");
    print_summary("kernel_check", fails);
  }
  return fails ? 1 : 0;
}
