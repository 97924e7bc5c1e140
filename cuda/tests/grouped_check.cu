// grouped_check — correctness and speed of gemm_fp8_grouped_tc (gemm_grouped.cu),
// the tensor-core grouped FP8 GEMM for MoE prefill.
//
//   grouped_check [--seed N] [--bench] [--bench-only] [--sweep] [--profile | --profile-at P]
//
// Correctness: random FP8 inputs (any finite E4M3 code), a float64 CPU
// reference computed from the same bytes (fp8_dec), relative L2 error per
// launch (tolerance 1e-4: FP32 sums of exact FP8 products; 1e-3 for the F
// tiles, whose sums run through Hopper's FP8 tensor accumulation as
// cuBLASLt's do, see kernels.h). Group-count
// distributions: all rows in one group, empty groups first / last / in the
// middle, counts that are not multiples of any tile, a 1-row group, total rows
// below the bound M, groups = 1, 20, 160 and 300 (more than one pass of the
// device search), no offsets (dense); x_rows permuted and identity, bias on
// and off; the GLM-4.7 rank shapes (N 3072 K 5120, N 5120 K 1536) and small
// odd ones (N 256 K 384; N 384 K 256: a partial 256-channel tile, ldy > N).
// Every launch shape (GroupedTcTile) and raster panel runs on each case; Y is
// poisoned first, and its rows past off[groups] (and columns past N) must
// stay untouched. The warp-specialized W tiles run F128x256's chains in the
// same order and must match it bit for bit; a W launch (its tensor map in the
// kernel parameters) must replay identically from a CUDA graph. W128x256Fast
// (and auto with fp8_accum 2) sums all of K on the FP8 tensor path, no
// promotion (CUTLASS FP8FastAccum's precision): tolerance 4e-3. The default
// launch must repeat bit for bit, replay identically from a CUDA graph and
// agree with gemm_fp8_stream's grouped form
// to 1e-5 relative (measured up to 6e-6 at K = 5120: both sum exact products
// in FP32, in different orders); invalid arguments are refused. The SiLU-fused
// gate|up (GroupedTcTuning::silu_gate_up) against silu(g) * u of the
// W128x256Fast launch's FP32 g and u, within a BF16 step.
// Prints one row per check and "grouped_check: N checks, M failed"; exits 1 on
// any failure.
//
// --bench: the GLM-4.7 rank shapes (gate|up 20 x [3072, 5120], down
// 20 x [5120, 1536]) for M = 512 .. 16384 rows spread multinomially over the
// 20 experts: ms (median of 20 calls, CUDA events), TFLOP/s (2 * rows * N * K),
// weight TB/s, for the default (exact) launch and the FP8-accumulation one
// (fp8_accum), next to gemm_fp8_stream's grouped form (the current path) on
// the same inputs, and the F128x256, W128x256, W128x128 and W128x256Fast tiles forced;
// the weights rotate over copies (>= 200 MB in all) so L2
// never holds them. The "M+sh" points add the shared expert as a 21st group
// of all M rows, as the runtime's prefill steps run it. --sweep: also every launch shape and panel per point.
// --profile: one launch of the main variants at M = 2048 and nothing else (for ncu);
// --profile-at P: the same at bench point P (0-5: M = 512 .. 16384 routed rows;
// 6-8: 2048, 8192, 16384 routed rows + the shared expert's).
#include <numeric>
#include <thread>

#include "kernels.h"

#define CHECK_NAME_W 24
#define CHECK_DETAIL_W 66
#include "check.cuh"

using namespace glmk;

// Random FP8 bytes, any finite E4M3 code (0x7f / 0xff are NaN: flipped to 0x7e / 0xfe).
static void fill_fp8_host(std::vector<uint8_t>& v) {
  for (size_t i = 0; i < v.size(); i += 8) {
    const uint64_t z = rng();
    for (size_t j = 0; j < 8 && i + j < v.size(); ++j) {
      uint8_t b = (uint8_t)(z >> (8 * j));
      if ((b & 0x7f) == 0x7f) b ^= 1;
      v[i + j] = b;
    }
  }
}

static int g_major = 0;  // compute capability of device 0
static int* g_tile_ctr = nullptr;  // two zeroed ints: the W tiles' tile queue (GroupedTcTuning::tile_counter)

static const char* tile_name(int t) {
  static const char* names[] = {"auto",    "E128x256", "E128x128", "E64x128",  "F128x256",
                                "F64x256", "M64x128",  "W128x256", "W128x128", "W128x256Fast"};
  static_assert(sizeof(names) / sizeof(names[0]) == kGroupedTcTiles, "tile names");
  return t >= 0 && t < kGroupedTcTiles ? names[t] : "?";
}
static bool tile_runs_here(int t) { return t == kGroupedTcAuto || t == kGroupedTcM64x128 || g_major == 9; }
// The F tiles accumulate on Hopper's FP8 tensor path (cuBLASLt's numerics:
// ~2e-4 relative on random codes; kernel_check holds lt_gemm_fp8 to 1e-3 for
// the same reason); every other launch sums exact products in FP32.
static bool is_w_tile(int t) { return t == kGroupedTcW128x256 || t == kGroupedTcW128x128; }
static bool fp8_accum(const GroupedTcTuning& t) {
  return t.tile == kGroupedTcF128x256 || t.tile == kGroupedTcF64x256 || is_w_tile(t.tile) ||
         t.tile == kGroupedTcW128x256Fast || (t.tile == kGroupedTcAuto && t.fp8_accum && g_major == 9);
}
// W128x256Fast (and auto with fp8_accum 2, which picks it) accumulates all
// of K on the FP8 tensor path, no promotion: CUTLASS FP8FastAccum's
// precision, ~1.3e-3 relative at K = 5120 on random codes (their exponents
// span 2^-9..448, the worst case for the tensor core's alignment; real
// activations span far less).
static bool fast_accum(const GroupedTcTuning& t) {
  return t.tile == kGroupedTcW128x256Fast || (t.tile == kGroupedTcAuto && t.fp8_accum == 2 && g_major == 9);
}
static double tolerance(const GroupedTcTuning& t) { return fast_accum(t) ? 4e-3 : fp8_accum(t) ? 1e-3 : 1e-4; }
static std::string tuning_name(const GroupedTcTuning& t) {
  return fmt("%s%s p%d", tile_name(t.tile),
             t.tile == kGroupedTcAuto && t.fp8_accum ? (t.fp8_accum == 2 ? "/fast" : "/fp8acc") : "", t.panel);
}

// ------------------------------------------------------------ correctness

struct GroupedCase {
  std::string what;
  int G, N, K;
  std::vector<int> counts;  // rows per group (dense: one entry, group_offsets null)
  bool dense = false;
  int M_extra = 0;          // M = total rows + M_extra (the bound the launch is given)
  bool permute = true;      // x_rows: a permutation of a larger X (else null: identity)
  bool bias = true;
  int ldy_pad = 0;          // ldy = N + ldy_pad
};

// y[p][n] in float64 from the FP8 bytes, sorted order, threads over the rows.
static std::vector<double> grouped_ref(const GroupedCase& c, const std::vector<int>& offs,
                                       const std::vector<int>& xr, const std::vector<uint8_t>& W,
                                       const std::vector<float>& ws, const std::vector<float>& bias,
                                       const std::vector<uint8_t>& X, const std::vector<float>& xs) {
  const int total = offs[c.G];
  std::vector<double> ref((size_t)total * c.N);
  double lut[256];
  for (int b = 0; b < 256; ++b) lut[b] = fp8_dec((uint8_t)b);
  std::vector<int> grp_of(total);
  for (int g = 0; g < c.G; ++g)
    for (int p = offs[g]; p < offs[g + 1]; ++p) grp_of[p] = g;
  auto work = [&](int p0, int p1) {
    for (int p = p0; p < p1; ++p) {
      const int g = grp_of[p], x = xr.empty() ? p : xr[p];
      const uint8_t* xp = X.data() + (size_t)x * c.K;
      for (int n = 0; n < c.N; ++n) {
        const uint8_t* wp = W.data() + ((size_t)g * c.N + n) * c.K;
        double s = 0;
        for (int k = 0; k < c.K; ++k) s += lut[xp[k]] * lut[wp[k]];
        const size_t gn = (size_t)g * c.N + n;
        ref[(size_t)p * c.N + n] = s * xs[x] * ws[gn] + (c.bias ? bias[gn] : 0.0);
      }
    }
  };
  const int nth = std::max(1, std::min<int>(32, (int)std::thread::hardware_concurrency()));
  std::vector<std::thread> th;
  const int per = (total + nth - 1) / nth;
  for (int i = 0; i < nth; ++i) {
    const int p0 = i * per, p1 = std::min(total, p0 + per);
    if (p0 < p1) th.emplace_back(work, p0, p1);
  }
  for (auto& t : th) t.join();
  return ref;
}

// Bytes of Y outside the written region [0, total) x [0, N) that changed from
// the poison (0xff); Y is [M][ldy].
static size_t touched_outside(const std::vector<float>& y, int total, int M, int N, int64_t ldy) {
  size_t bad = 0;
  for (int r = 0; r < M; ++r)
    for (int64_t n = 0; n < ldy; ++n) {
      if (r < total && n < N) continue;
      uint32_t u;
      memcpy(&u, &y[(size_t)r * ldy + n], 4);
      bad += u != 0xffffffffu;
    }
  return bad;
}

static std::vector<double> written(const std::vector<float>& y, int total, int N, int64_t ldy) {
  std::vector<double> o((size_t)total * N);
  for (int r = 0; r < total; ++r)
    for (int n = 0; n < N; ++n) o[(size_t)r * N + n] = y[(size_t)r * ldy + n];
  return o;
}

// A BF16 output [max(1, M)][ldy] poisoned with 0xffff before its launch:
// inside(row, column, index, bits) for each element of rows < total and
// columns < cols; returns how many elements outside that were written.
template <class F>
static size_t visit_bf16_out(const std::vector<__nv_bfloat16>& y, int M, int64_t ldy, int total, int64_t cols,
                             F&& inside) {
  size_t touched = 0;
  for (int r = 0; r < std::max(1, M); ++r)
    for (int64_t n = 0; n < ldy; ++n) {
      const size_t i = (size_t)r * ldy + n;
      uint16_t got;
      memcpy(&got, &y[i], 2);
      if (r < total && n < cols) inside(r, n, i, got);
      else touched += got != 0xffffu;
    }
  return touched;
}

static void check_case(const GroupedCase& c) {
  const int G = c.G, N = c.N, K = c.K;
  std::vector<int> offs(G + 1, 0);
  for (int g = 0; g < G; ++g) offs[g + 1] = offs[g] + c.counts[g];
  const int total = offs[G], M = total + c.M_extra;
  const int xrows = c.permute ? total + 13 : total;
  const int64_t ldy = N + c.ldy_pad;
  std::vector<uint8_t> W((size_t)G * N * K), X((size_t)std::max(1, xrows) * K);
  fill_fp8_host(W);
  fill_fp8_host(X);
  std::vector<float> ws((size_t)G * N), bias((size_t)G * N), xs(std::max(1, xrows));
  for (auto& v : ws) v = randu(0.5f, 2.f) / 448.f;
  for (auto& v : bias) v = randn();
  for (auto& v : xs) v = randu(0.5f, 2.f) / 448.f;
  std::vector<int> xr;
  if (c.permute) {
    std::vector<int> perm(xrows);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    xr.assign(perm.begin(), perm.begin() + total);
  }
  const std::vector<double> ref = grouped_ref(c, offs, xr, W, ws, bias, X, xs);

  Dev<uint8_t> dW(W), dX(X);
  Dev<float> dws(ws), dbias(bias), dxs(xs), dY((size_t)std::max(1, M) * ldy);
  Dev<int> doff(offs), dxr(xr.empty() ? std::vector<int>{0} : xr);
  StreamGemmArgs a;
  a.W = dW.p;
  a.w_scale = dws.p;
  a.bias = c.bias ? dbias.p : nullptr;
  a.X = dX.p;
  a.x_scale = dxs.p;
  a.x_rows = c.permute ? dxr.p : nullptr;
  a.group_offsets = c.dense ? nullptr : doff.p;
  a.groups = G;
  a.M = M;
  a.N = N;
  a.K = K;
  a.Y = dY.p;
  a.ldy = ldy;
  const std::string shape =
      fmt("%s G%d N%d K%d rows%d/M%d%s%s", c.what.c_str(), G, N, K, total, M, c.permute ? " perm" : "",
          c.bias ? " bias" : "");

  auto run = [&](const GroupedTcTuning& tu) {
    dY.poison();
    CK(gemm_fp8_grouped_tc_tuned(a, tu, 0));
    CK(cudaDeviceSynchronize());
    return dY.down();
  };
  // The BF16-output launch of b into y16 (poisoned first), read back.
  auto run_bf16 = [&](const StreamGemmArgs& b, Dev<__nv_bfloat16>& y16, const GroupedTcTuning& tu) {
    y16.poison();
    CK(gemm_fp8_grouped_tc_bf16(b, y16.p, tu, 0));
    CK(cudaDeviceSynchronize());
    return y16.down();
  };
  std::vector<GroupedTcTuning> tunings;
  for (int t = 0; t < kGroupedTcTiles; ++t)
    if (tile_runs_here(t)) tunings.push_back({t, 0, 0});
  tunings.push_back({kGroupedTcAuto, 0, 1});
  tunings.push_back({kGroupedTcAuto, 0, 2});
  tunings.push_back({g_major == 9 ? kGroupedTcE128x256 : kGroupedTcM64x128, 3, 0});
  tunings.push_back({g_major == 9 ? kGroupedTcF64x256 : kGroupedTcM64x128, 2, 0});
  if (g_major == 9) {
    tunings.push_back({kGroupedTcW128x256, 2, 0});
    tunings.push_back({kGroupedTcW128x128, 3, 0});
    tunings.push_back({kGroupedTcW128x256Fast, 2, 0});
  }
  // The W tiles run F128x256's chains in the same order: bit for bit its result.
  std::vector<float> y_f;
  for (const GroupedTcTuning& tu : tunings) {
    const std::vector<float> y = run(tu);
    if (tu.tile == kGroupedTcF128x256 && tu.panel == 0) y_f = y;
    if (is_w_tile(tu.tile) && !y_f.empty())
      report("grouped_tc W vs F", fmt("%s %s bitwise", shape.c_str(), tuning_name(tu).c_str()),
             memcmp(y.data(), y_f.data(), y.size() * 4) ? 1.0 : 0.0, 0.0);
    if (is_w_tile(tu.tile) || tu.tile == kGroupedTcW128x256Fast) {
      // The tile queue: the same bits as the fixed stride, twice in a row
      // (the launch leaves its counters zero for the next).
      GroupedTcTuning tq = tu;
      tq.tile_counter = g_tile_ctr;
      for (int rep = 0; rep < 2; ++rep) {
        const std::vector<float> yq = run(tq);
        int ctr[2] = {-1, -1};
        CK(cudaMemcpy(ctr, g_tile_ctr, sizeof ctr, cudaMemcpyDeviceToHost));
        report("grouped_tc tile queue",
               fmt("%s %s launch %d bitwise, counters %d %d", shape.c_str(), tuning_name(tu).c_str(), rep + 1, ctr[0],
                   ctr[1]),
               memcmp(y.data(), yq.data(), y.size() * 4) || ctr[0] || ctr[1] ? 1.0 : 0.0, 0.0);
      }
    }
    const size_t outside = touched_outside(y, total, M, N, ldy);
    const double err = rel_err(written(y, total, N, ldy), ref);
    report("gemm_fp8_grouped_tc",
           fmt("%s %s%s", shape.c_str(), tuning_name(tu).c_str(),
               outside ? fmt(" touched %zu outside", outside).c_str() : ""),
           outside ? 1.0 : err, tolerance(tu));
  }

  // The default launch: twice (bit for bit), from a CUDA graph, and against
  // gemm_fp8_stream's grouped form.
  const std::vector<float> y1 = run({}), y2 = run({});
  report("grouped_tc repeat", fmt("%s bitwise", shape.c_str()),
         memcmp(y1.data(), y2.data(), y1.size() * 4) ? 1.0 : 0.0, 0.0);
  // From a CUDA graph: the default launch and (sm_90) a W tile, whose tensor
  // map travels in the captured kernel parameters.
  std::vector<GroupedTcTuning> graphed = {GroupedTcTuning{}};
  if (g_major == 9) {
    graphed.push_back({kGroupedTcW128x256, 0, 0});
    graphed.push_back({kGroupedTcW128x256Fast, 0, 0});
    GroupedTcTuning tq{kGroupedTcW128x256Fast, 0, 0};
    tq.tile_counter = g_tile_ctr;  // replayed twice: the counters reset inside the graph
    graphed.push_back(tq);
  }
  for (const GroupedTcTuning& tu : graphed) {
    const std::vector<float> yd = tu.tile == kGroupedTcAuto ? y1 : run(tu);
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    CK(gemm_fp8_grouped_tc_tuned(a, tu, s));
    CK(cudaStreamEndCapture(s, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    dY.poison();
    CK(cudaGraphLaunch(exec, s));
    CK(cudaGraphLaunch(exec, s));
    CK(cudaStreamSynchronize(s));
    const std::vector<float> yg = dY.down();
    report("grouped_tc graph", fmt("%s %s%s replay bitwise", shape.c_str(), tuning_name(tu).c_str(),
                                   tu.tile_counter ? " queue" : ""),
           memcmp(yd.data(), yg.data(), yd.size() * 4) ? 1.0 : 0.0, 0.0);
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    CK(cudaStreamDestroy(s));
  }
  {
    StreamGemmArgs b = a;
    int maxc = 0;
    for (int v : c.counts) maxc = std::max(maxc, v);
    b.max_rows_per_group = c.dense ? 0 : maxc;
    dY.poison();
    CK(gemm_fp8_stream(b, 0));
    CK(cudaDeviceSynchronize());
    const std::vector<float> ys = dY.down();
    report("grouped_tc vs stream", shape,
           rel_err(written(y1, total, N, ldy), written(ys, total, N, ldy)), 1e-5);
  }
  // BF16 output (gemm_fp8_grouped_tc_bf16): every written element is the
  // FP32 output of the same launch shape rounded to nearest even, nothing
  // else is touched; refused with a.Y set or without Y16.
  {
    Dev<__nv_bfloat16> dY16((size_t)std::max(1, M) * ldy);
    std::vector<GroupedTcTuning> t16 = {GroupedTcTuning{}, GroupedTcTuning{kGroupedTcAuto, 0, 1},
                                        GroupedTcTuning{kGroupedTcAuto, 0, 2}};
    if (g_major == 9) t16.push_back({kGroupedTcF128x256, 0, 0});
    StreamGemmArgs b = a;
    b.Y = nullptr;
    for (const GroupedTcTuning& tu : t16) {
      const std::vector<float> yf = run(tu);
      const std::vector<__nv_bfloat16> yb = run_bf16(b, dY16, tu);
      size_t bad = 0;
      const size_t touched = visit_bf16_out(yb, M, ldy, total, N, [&](int, int64_t, size_t i, uint16_t got) {
        const __nv_bfloat16 want = __float2bfloat16_rn(yf[i]);
        uint16_t w16;
        memcpy(&w16, &want, 2);
        bad += got != w16;
      });
      report("grouped_tc BF16 out", fmt("%s %s: differ %zu touched %zu", shape.c_str(), tuning_name(tu).c_str(),
                                        bad, touched),
             bad + touched ? 1.0 : 0.0, 0.0);
    }
    const bool refused = gemm_fp8_grouped_tc_bf16(a, dY16.p, GroupedTcTuning{}, 0) == cudaErrorInvalidValue &&
                         gemm_fp8_grouped_tc_bf16(b, nullptr, GroupedTcTuning{}, 0) == cudaErrorInvalidValue;
    report("grouped_tc BF16 out refusals", shape, refused ? 0.0 : 1.0, 0.0);
  }
  // The SiLU-fused gate|up (GroupedTcTuning::silu_gate_up, sm_90): each group's
  // rows [0, N/2) are gate and [N/2, N) up; Y16 [rows][N/2 + 2] gets
  // silu(g) * u, g and u the W128x256Fast launch's FP32 outputs (the same
  // tile code: the same sums), within a BF16 step and silu_fast's ~2 ulp of
  // the host's; the two padding columns and the rows past the groups stay
  // untouched; the tile queue gives the same bits; refused without Y16, with
  // N % 256 != 0 or with another tile.
  if (g_major == 9) {
    const int NH = N / 2;
    const int64_t ldh = NH + 2;
    StreamGemmArgs b = a;
    b.Y = nullptr;
    b.ldy = ldh;
    Dev<__nv_bfloat16> dA((size_t)std::max(1, M) * ldh);
    GroupedTcTuning ts;
    ts.silu_gate_up = 1;
    if (N % 256 == 0) {
      GroupedTcTuning tf{kGroupedTcW128x256Fast, 0, 0};
      const std::vector<float> yf = run(tf);
      const std::vector<__nv_bfloat16> ya = run_bf16(b, dA, ts);
      size_t far = 0;
      double worst = 0;
      const size_t touched = visit_bf16_out(ya, M, ldh, total, NH, [&](int r, int64_t n, size_t i, uint16_t) {
        const double g = yf[(size_t)r * ldy + n], u = yf[(size_t)r * ldy + NH + n];
        const double want = g / (1.0 + std::exp(-g)) * u;
        const double got = (double)__bfloat162float(ya[i]);
        const double e = std::fabs(got - want) / (std::fabs(want) + 1e-30);
        if (std::fabs(want) > 1e-30) worst = std::max(worst, e);
        far += !(e <= 1.0 / 128) && std::fabs(got - want) > 1e-30;
      });
      report("grouped_tc SiLU gate|up", fmt("%s: worst rel %.1e, beyond 2^-7 %zu, touched %zu", shape.c_str(), worst,
                                            far, touched),
             far + touched ? 1.0 : 0.0, 0.0);
      GroupedTcTuning tq = ts;
      tq.tile_counter = g_tile_ctr;
      const std::vector<__nv_bfloat16> yq = run_bf16(b, dA, tq);
      report("grouped_tc SiLU gate|up queue", fmt("%s bitwise", shape.c_str()),
             memcmp(yq.data(), ya.data(), ya.size() * 2) ? 1.0 : 0.0, 0.0);
    }
    StreamGemmArgs bf = b;
    bf.Y = dY.p;
    GroupedTcTuning tw{kGroupedTcW128x256, 0, 0};
    tw.silu_gate_up = 1;
    const bool refused = gemm_fp8_grouped_tc_bf16(b, nullptr, ts, 0) == cudaErrorInvalidValue &&
                         gemm_fp8_grouped_tc_tuned(bf, ts, 0) == cudaErrorInvalidValue &&
                         gemm_fp8_grouped_tc_bf16(b, dA.p, tw, 0) == cudaErrorInvalidValue &&
                         (N % 256 == 0 || gemm_fp8_grouped_tc_bf16(b, dA.p, ts, 0) == cudaErrorInvalidValue);
    report("grouped_tc SiLU refusals", shape, refused ? 0.0 : 1.0, 0.0);
  }
}

// Rows per group drawn around `avg` (0 .. 3 avg), with the given groups forced empty.
static std::vector<int> uneven_counts(int G, int avg, std::vector<int> empty) {
  std::vector<int> c(G);
  for (int g = 0; g < G; ++g) c[g] = randi(0, 3 * avg);
  for (int g : empty) c[g] = 0;
  return c;
}

static void check_all() {
  // GLM-4.7 rank shapes: 20 experts, uneven (empty first / middle / last, a
  // 1-row group, one at 3x the average), then every row in one group.
  {
    std::vector<int> cnt = uneven_counts(20, 35, {0, 9, 19});
    cnt[4] = 1;
    cnt[11] = 105;
    cnt[6] = 129;
    check_case({"glm gate|up", 20, 3072, 5120, cnt, false, 37, true, true});
  }
  {
    std::vector<int> cnt = uneven_counts(20, 40, {0, 10, 19});
    cnt[3] = 1;
    cnt[7] = 64;
    cnt[8] = 65;
    check_case({"glm down", 20, 5120, 1536, cnt, false, 0, false, false});
  }
  {
    std::vector<int> cnt(20, 0);
    cnt[7] = 300;
    check_case({"one group", 20, 3072, 5120, cnt, false, 0, true, false});
  }
  // Counts around every tile height, total well below M.
  check_case({"tile edges", 20, 256, 384, {64, 128, 65, 127, 129, 0, 1, 63, 256, 0, 192, 2, 191, 193, 0, 31, 33, 95, 97, 7},
              false, 500, true, true});
  // Light groups (< 4 m-tiles of 128) among heavy ones (the shared expert of a
  // prefill step, a hot expert): the W tiles take the two kinds interleaved.
  {
    std::vector<int> cnt(21, 0);
    for (int g = 0; g < 20; ++g) cnt[g] = randi(0, 130);
    cnt[5] = 520;
    cnt[20] = 600;
    check_case({"light + heavy", 21, 256, 384, cnt, false, 100, true, true});
  }
  check_case({"groups=1", 1, 256, 384, {77}, false, 23, true, true});
  check_case({"dense", 1, 256, 384, {150}, true, 0, false, true});
  {
    std::vector<int> cnt(160, 0);
    for (int i = 0; i < 40; ++i) cnt[randi(0, 159)] = randi(1, 90);
    cnt[0] = 0;
    cnt[159] = 200;
    check_case({"160 groups", 160, 256, 384, cnt, false, 11, true, true});
  }
  {
    std::vector<int> cnt(300, 0);
    cnt[3] = 9, cnt[140] = 40, cnt[256] = 1, cnt[257] = 133, cnt[299] = 17;
    check_case({"300 groups", 300, 384, 256, cnt, false, 5, true, false, 4});
  }
}

// Arguments the launcher must refuse (cudaErrorInvalidValue, nothing launched).
static void check_invalid() {
  Dev<uint8_t> W(256 * 512 + 16), X(64 * 512 + 16);
  Dev<float> ws(256), xs(64), Y(64 * 260);
  Dev<int> off(std::vector<int>{0, 30, 64});
  StreamGemmArgs ok;
  ok.W = W.p;
  ok.w_scale = ws.p;
  ok.X = X.p;
  ok.x_scale = xs.p;
  ok.group_offsets = off.p;
  ok.groups = 2;
  ok.M = 64;
  ok.N = 128;
  ok.K = 512;
  ok.Y = Y.p;
  ok.ldy = 128;
  CK(gemm_fp8_grouped_tc(ok, 0));  // the baseline is accepted
  CK(cudaDeviceSynchronize());
  struct Bad {
    const char* what;
    StreamGemmArgs a;
    GroupedTcTuning t;
  };
  std::vector<Bad> bad;
  auto add = [&](const char* what, auto edit, GroupedTcTuning t = {}) {
    StreamGemmArgs a = ok;
    edit(a);
    bad.push_back({what, a, t});
  };
  add("K % 128", [](StreamGemmArgs& a) { a.K = 448; });
  add("N % 128", [](StreamGemmArgs& a) { a.N = 200; a.ldy = 200; });
  add("Xf", [&](StreamGemmArgs& a) { a.Xf = reinterpret_cast<const float*>(Y.p); });
  add("ksplit 2", [&](StreamGemmArgs& a) { a.ksplit = 2; a.ws = Y.p; });
  add("W misaligned", [&](StreamGemmArgs& a) { a.W = W.p + 8; });
  add("X misaligned", [&](StreamGemmArgs& a) { a.X = X.p + 4; });
  add("Y misaligned", [&](StreamGemmArgs& a) { a.Y = Y.p + 1; });
  add("ldy < N", [](StreamGemmArgs& a) { a.ldy = 64; });
  add("ldy odd", [](StreamGemmArgs& a) { a.ldy = 129; });
  add("null W", [](StreamGemmArgs& a) { a.W = nullptr; });
  add("null x_scale", [](StreamGemmArgs& a) { a.x_scale = nullptr; });
  add("null Y", [](StreamGemmArgs& a) { a.Y = nullptr; });
  add("no offsets, groups 2", [](StreamGemmArgs& a) { a.group_offsets = nullptr; });
  add("groups 0", [](StreamGemmArgs& a) { a.groups = 0; });
  add("M < 0", [](StreamGemmArgs& a) { a.M = -1; });
  add("tile 99", [](StreamGemmArgs&) {}, GroupedTcTuning{99, 0, 0});
  add("panel < 0", [](StreamGemmArgs&) {}, GroupedTcTuning{0, -1, 0});
  add("fp8_accum 3", [](StreamGemmArgs&) {}, GroupedTcTuning{0, 0, 3});
  add("fp8_accum -1", [](StreamGemmArgs&) {}, GroupedTcTuning{0, 0, -1});
  if (g_major != 9) add("wgmma tile off sm_90", [](StreamGemmArgs&) {}, GroupedTcTuning{kGroupedTcE128x256, 0, 0});
  int wrong = 0;
  std::string which;
  for (const Bad& b : bad) {
    const cudaError_t e = gemm_fp8_grouped_tc_tuned(b.a, b.t, 0);
    if (e != cudaErrorInvalidValue) {
      ++wrong;
      which += fmt(" [%s: %s]", b.what, cudaGetErrorString(e));
    }
  }
  CK(cudaGetLastError());  // nothing sticky
  report("grouped_tc invalid", fmt("%zu bad argument sets refused%s", bad.size() - wrong, which.c_str()),
         wrong ? 1.0 : 0.0, 0.0);
  // The shape predicate agrees with the launcher.
  const bool pred_ok = gemm_fp8_grouped_tc_supported(3072, 5120) && gemm_fp8_grouped_tc_supported(5120, 1536) &&
                       gemm_fp8_grouped_tc_supported(128, 128) && !gemm_fp8_grouped_tc_supported(200, 512) &&
                       !gemm_fp8_grouped_tc_supported(128, 448) && !gemm_fp8_grouped_tc_supported(0, 128);
  report("grouped_tc supported", "shape predicate: N, K multiples of 128", pred_ok ? 0.0 : 1.0, 0.0);
  // M == 0 and N == 0 are empty launches (success, nothing written).
  StreamGemmArgs e0 = ok, e1 = ok;
  e0.M = 0;
  e1.N = 0;
  Y.poison();
  const cudaError_t r0 = gemm_fp8_grouped_tc(e0, 0), r1 = gemm_fp8_grouped_tc(e1, 0);
  CK(cudaDeviceSynchronize());
  const std::vector<float> y = Y.down();
  report("grouped_tc empty", "M = 0 and N = 0: success, Y untouched",
         (r0 != cudaSuccess || r1 != cudaSuccess || touched_outside(y, 0, 64, 0, 260)) ? 1.0 : 0.0, 0.0);
}

// ------------------------------------------------------------ bench

static __global__ void fill_fp8_kernel(uint8_t* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint8_t b = (uint8_t)mix64(seed + i * 0x9E3779B97F4A7C15ull);
    if ((b & 0x7f) == 0x7f) b ^= 1;  // no NaN codes
    p[i] = b;
  }
}

static void bench(bool sweep, bool profile, int profile_point) {
  // E routed experts, plus (the "+sh" rows) the shared expert as group E with
  // a row for every token, as the runtime runs prefill steps.
  const int E = 20, H = 5120, I = 1536, MMAX = 16384;
  struct Shape {
    const char* name;
    int N, K, copies;
  };
  // Copies so that the weights rotated over are >= 200 MB in all (L2 is 50-60 MB).
  const Shape shapes[] = {{"gate|up", 2 * I, H, 2}, {"down", H, I, 2}};
  Dev<uint8_t> X((size_t)MMAX * H);
  Dev<float> xs(2 * MMAX), Y((size_t)2 * MMAX * H);
  fill_fp8_kernel<<<1024, 256>>>(X.p, X.n, rng());
  CK(cudaGetLastError());
  xs.up(std::vector<float>(xs.n, 1.f / 448));
  printf("\nbench: GLM-4.7 rank MoE GEMMs, %d experts, rows multinomial over them; ms = median of 20\n", E);
  printf("exact = gemm_fp8_grouped_tc (default), fp8acc = fast_accum-style F tiles, stream = gemm_fp8_stream\n");
  printf("F128x256 / W128x256 / W128x128 / W256F (W128x256Fast): the lockstep F tile and the warp-specialized\n"
         "ones, forced\n");
  printf("M+sh: M routed rows plus the shared expert's M rows as a 21st group (TFLOP/s over all 2M rows)\n");
  printf("W256F q: W256F taking its tiles from a queue (GroupedTcTuning::tile_counter), as the runtime does\n");
  printf("%-8s %8s %5s | %9s %8s %7s | %9s %8s | %9s %8s %7s | %7s | %8s %7s | %8s %7s %7s | %8s %7s | %8s %7s %7s | %8s "
         "%7s\n",
         "gemm",
         "M", "maxg", "exact ms", "TFLOP/s", "w TB/s", "fp8acc ms", "TFLOP/s", "stream ms", "TFLOP/s", "w TB/s",
         "speedup", "F256 ms", "TFLOP/s", "W256 ms", "TFLOP/s", "w TB/s", "W128 ms", "TFLOP/s", "W256F ms", "TFLOP/s",
         "w TB/s", "W256F q", "TFLOP/s");
  for (const Shape& sh : shapes) {
    const size_t wbytes = (size_t)E * sh.N * sh.K, wstride = (size_t)(E + 1) * sh.N * sh.K;
    Dev<uint8_t> W(wstride * sh.copies);
    Dev<float> ws((size_t)(E + 1) * sh.N * sh.copies);
    fill_fp8_kernel<<<1024, 256>>>(W.p, W.n, rng());
    CK(cudaGetLastError());
    ws.up(std::vector<float>(ws.n, 1.f / 448));
    static const int kPointRows[] = {512, 1024, 2048, 4096, 8192, 16384, 2048, 8192, 16384};
    for (int point = 0; point < 9; ++point) {
      const int M = kPointRows[point];
      const bool shared = point >= 6;
      if (profile && point != profile_point) continue;
      const int G = shared ? E + 1 : E;
      std::vector<int> cnt(G, 0);
      for (int r = 0; r < M; ++r) ++cnt[randi(0, E - 1)];
      if (shared) cnt[E] = M;
      std::vector<int> off(G + 1, 0);
      int maxc = 0;
      for (int e = 0; e < G; ++e) {
        off[e + 1] = off[e] + cnt[e];
        maxc = std::max(maxc, cnt[e]);
      }
      const int R = off[G];  // sorted rows: M, or 2M with the shared group
      std::vector<int> rows(R);
      std::iota(rows.begin(), rows.begin() + M, 0);
      std::shuffle(rows.begin(), rows.begin() + M, rng);
      for (int r = M; r < R; ++r) rows[r] = r - M;
      Dev<int> doff(off), drows(rows);
      StreamGemmArgs a;
      a.X = X.p;
      a.x_scale = xs.p;
      a.x_rows = drows.p;
      a.group_offsets = doff.p;
      a.groups = G;
      a.M = R;
      a.N = sh.N;
      a.K = sh.K;
      a.Y = Y.p;
      a.ldy = sh.N;
      // As the runtime passes them: every token hits one local expert on average.
      a.max_rows_per_group = M;
      a.max_active_groups = G;
      a.typical_rows_per_group = (M + E - 1) / E;
      auto timed = [&](auto launch) {
        int i = 0;
        auto call = [&](int) {
          const int cp = i++ % sh.copies;
          a.W = W.p + (size_t)cp * wstride;
          a.w_scale = ws.p + (size_t)cp * (E + 1) * sh.N;
          launch();
        };
        for (int w = 0; w < 3; ++w) call(0);
        CK(cudaDeviceSynchronize());
        return median_ms(20, 0, call);
      };
      const double flop = 2.0 * R * sh.N * sh.K;
      const size_t wread = shared ? wstride : wbytes;
      auto tc_ms = [&](GroupedTcTuning tu) { return timed([&] { CK(gemm_fp8_grouped_tc_tuned(a, tu, 0)); }); };
      if (profile) {
        // One launch of each main variant for a profiler (ncu -k regex:grouped_tc).
        a.W = W.p;
        a.w_scale = ws.p;
        for (GroupedTcTuning tu : {GroupedTcTuning{}, GroupedTcTuning{kGroupedTcE64x128, 0, 0},
                                   GroupedTcTuning{kGroupedTcF128x256, 0, 0},
                                   GroupedTcTuning{kGroupedTcW128x256, 0, 0},
                                   GroupedTcTuning{kGroupedTcW128x256Fast, 0, 0}})
          CK(gemm_fp8_grouped_tc_tuned(a, tu, 0));
        CK(cudaDeviceSynchronize());
        continue;
      }
      const float ms = tc_ms({});
      const float fms = g_major == 9 ? tc_ms({kGroupedTcAuto, 0, 1}) : 0.f;
      // (The streaming kernel, the decode path, is not run on the shared-group
      // points: ~10 ms a call at 16k.)
      const float sms = shared ? 0.f : timed([&] { CK(gemm_fp8_stream(a, 0)); });
      const bool h = g_major == 9;
      const float f_ms = h ? tc_ms({kGroupedTcF128x256, 0, 0}) : 0.f;
      const float w_ms = h ? tc_ms({kGroupedTcW128x256, 0, 0}) : 0.f;
      const float w2_ms = h ? tc_ms({kGroupedTcW128x128, 0, 0}) : 0.f;
      const float wf_ms = h ? tc_ms({kGroupedTcW128x256Fast, 0, 0}) : 0.f;
      GroupedTcTuning tq{kGroupedTcW128x256Fast, 0, 0};
      tq.tile_counter = g_tile_ctr;
      const float wq_ms = h ? tc_ms(tq) : 0.f;
      auto tf = [&](float t) { return t > 0 ? flop / (t * 1e-3) / 1e12 : 0.0; };
      if (sweep) {
        std::string line;
        for (int t = 1; t < kGroupedTcTiles; ++t) {
          if (!tile_runs_here(t)) continue;
          for (int p : {1, 2}) line += fmt(" %s/p%d %.3f", tile_name(t), p, tc_ms({t, p, 0}));
        }
        printf("  sweep %s M=%d:%s\n", sh.name, M, line.c_str());
      }
      const std::string mname = fmt("%d%s", M, shared ? "+sh" : "");
      auto tbs = [&](float t) { return t > 0 ? wread / (t * 1e-3) / 1e12 : 0.0; };
      printf("%-8s %8s %5d | %9.4f %8.1f %7.2f | %9.4f %8.1f | %9.4f %8.1f %7.2f | %6.1fx | %8.4f %7.1f | %8.4f %7.1f "
             "%7.2f | %8.4f %7.1f | %8.4f %7.1f %7.2f | %8.4f %7.1f\n",
             sh.name, mname.c_str(), maxc, ms, tf(ms), tbs(ms), fms, tf(fms), sms, tf(sms), tbs(sms),
             sms > 0 ? sms / ms : 0.0, f_ms, tf(f_ms), w_ms, tf(w_ms), tbs(w_ms), w2_ms, tf(w2_ms), wf_ms, tf(wf_ms),
             tbs(wf_ms), wq_ms, tf(wq_ms));
      fflush(stdout);
    }
  }
}

int main(int argc, char** argv) {
  uint64_t seed = 0x5eed;
  bool do_bench = false, only_bench = false, sweep = false, profile = false;
  int profile_point = 2;  // M = 2048 routed rows
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], nullptr, 0);
    else if (!strcmp(argv[i], "--bench")) do_bench = true;
    else if (!strcmp(argv[i], "--bench-only")) do_bench = only_bench = true;
    else if (!strcmp(argv[i], "--sweep")) do_bench = sweep = true;
    else if (!strcmp(argv[i], "--profile")) do_bench = only_bench = profile = true;
    else if (!strcmp(argv[i], "--profile-at") && i + 1 < argc) {
      do_bench = only_bench = profile = true;
      profile_point = atoi(argv[++i]);
      if (profile_point < 0 || profile_point > 8) {
        fprintf(stderr, "grouped_check: --profile-at takes a bench point 0-8, got %d\n", profile_point);
        return 2;
      }
    } else {
      fprintf(stderr, "usage: grouped_check [--seed N] [--bench] [--bench-only] [--sweep] [--profile | --profile-at P]\n");
      return 2;
    }
  }
  rng.seed(seed);
  init_fp8();
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  g_major = prop.major;
  CK(cudaMalloc(&g_tile_ctr, 2 * sizeof(int)));
  CK(cudaMemset(g_tile_ctr, 0, 2 * sizeof(int)));
  printf("device: %s, %d SMs, sm_%d%d, seed %llu\n", prop.name, prop.multiProcessorCount, prop.major, prop.minor,
         (unsigned long long)seed);
  if (!only_bench) {
    check_invalid();
    check_all();
    CK(cudaDeviceSynchronize());
  }
  const int fails = failed_checks();
  if (do_bench) bench(sweep, profile, profile_point);
  if (!only_bench) {
    print_table("rel.err");
    print_summary("grouped_check", fails);
  }
  return fails ? 1 : 0;
}
