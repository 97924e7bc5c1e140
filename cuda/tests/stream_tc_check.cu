// stream_tc_check — correctness and speed of gemm_fp8_stream_tc (gemm_stream_tc.cu),
// the tensor-core weight-streaming FP8 GEMM for decode-sized batches.
//
//   stream_tc_check [--seed N] [--bench] [--bench-only] [--sweep] [--lt-sweep] [--experts]
//                   [--experts-side] [--experts-profile] [--dense-splits]
//
// Correctness (sm_90 only; elsewhere every launch must return
// cudaErrorNotSupported): random FP8 inputs (any finite E4M3 code), a float64
// CPU reference from the same bytes, relative L2 error per launch (tolerance
// 1e-3: every 128-K chain runs through Hopper's FP8 tensor accumulation before
// its FP32 promotion, as cuBLASLt's; measured ~2e-4). Dense cases (M 1..128,
// N a multiple of 128 or not, K 128..5120, bias on and off, ldy > N) and grouped
// ones (20 and 160 groups with empty groups, counts past one token tile, x_rows
// permuted, rows below the bound M), each with every token tile (16, 32, 64, 128)
// and with 1, 3 and the automatic number of K splits. Y is poisoned first; rows
// past the written ones and columns past N must stay untouched. A launch must
// repeat bit for bit, leave the split counters zero, replay identically
// from a CUDA graph, and give the same bits launched with programmatic
// dependent launch (and an L2 prefetch of group 0) right after a kernel that
// restores its poisoned inputs (eagerly and captured); a workspace too small for the split asked for must give
// fewer splits, not wrong results; invalid arguments are refused.
// Prints one row per check and "stream_tc_check: N checks, M failed"; exits 1
// on any failure.
//
// --bench: the GLM-4.7 rank-0/8 decode linears (q|k|v 1792 x 5120 with bias,
// o_proj 5120 x 1536, shared expert gate|up 3072 x 5120 and down 5120 x 1536)
// at M = 16 .. 256 rows, next to the runtime's current paths on the same inputs
// (cuBLASLt FP8 with the scales fused, or plus the epilogue kernel when there
// is a bias; gemm_fp8_stream, the mma.sync streaming kernel), and the routed
// experts (20 x gate|up, 20 x down; T tokens at top-1, multinomial) next to
// gemm_fp8_stream's row-tiled grouped form. Microseconds per call (20 calls per
// CUDA graph, median of replays), weights rotated over copies (>= 200 MB) so L2
// never holds them; % = weight bytes read / time / 4.46 TB/s.
// --lt-sweep: cuBLASLt's candidates for the dense decode and prefill linears (lt_sweep).
// --experts: the routed experts with and without the shared expert's group
// (bench_experts; in token tiles of 16, 32 and 64 rows and the kernel's own), nothing else;
// --experts-profile: only their 64 + shared form in the runtime's token tiles
// (gate|up 32, down 16), three eager launches of each GEMM (for ncu), no timing.
#include <numeric>

#include "kernels.h"

#define CHECK_NAME_W 22
#define CHECK_DETAIL_W 60
#include "check.cuh"

using namespace glmk;

static int g_major = 0;
static bool g_sweep = false;  // --sweep: every split count (and token tile) per bench point

static void fill_fp8_host(std::vector<uint8_t>& v) {
  for (size_t i = 0; i < v.size(); i += 8) {
    const uint64_t z = rng();
    for (size_t j = 0; j < 8 && i + j < v.size(); ++j) {
      uint8_t b = (uint8_t)(z >> (8 * j));
      if ((b & 0x7f) == 0x7f) b ^= 1;  // no NaN codes
      v[i + j] = b;
    }
  }
}

struct Workspace {
  Dev<float> partials;
  Dev<int> counters;
  Workspace(size_t floats, int counters_n) : partials(floats), counters(counters_n) { counters.zero(); }
  StreamTcWorkspace view() const { return {partials.p, partials.n, counters.p, (int)counters.n}; }
};

// After spin_ns, copies X and the group offsets back from their sources (the
// launch before poisons them): a PDL-launched GEMM that read either before
// griddepcontrol.wait would see the poison. Triggers its dependents first.
static __global__ void restore_inputs_kernel(uint8_t* X, const uint8_t* X_src, size_t nx, int* offs,
                                             const int* offs_src, int n_offs, long long spin_ns) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  spin_for_ns(spin_ns);
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < nx; i += (size_t)gridDim.x * blockDim.x)
    X[i] = X_src[i];
  if (offs && blockIdx.x == 0)
    for (int i = threadIdx.x; i < n_offs; i += blockDim.x) offs[i] = offs_src[i];
}

struct Case {
  std::string name;
  int M = 0, N = 0, K = 0, groups = 1;
  std::vector<int> counts;  // grouped: rows per group (sum <= M); empty: dense
  bool bias = false, permute = false;
  int64_t ldy = 0;
};

static void check_split_out(const Case& c, const StreamGemmArgs& a0, int total, int64_t ldy,
                            const std::vector<double>& ref, uint8_t* dX, size_t nx);

// Y as a launch left it (S slices `stride` floats apart; S = 1: Y itself),
// rows [0, max(1, M)) of ldy: the written part (rows < total, columns < N),
// the slices summed in order, into out [total][N]; returns how many values
// outside it are not the NaN poison.
static size_t gather_output(const std::vector<float>& y, int S, int64_t stride, int M, int total, int N,
                            int64_t ldy, std::vector<double>& out) {
  out.assign((size_t)total * N, 0.0);
  size_t outside = 0;
  for (int r = 0; r < std::max(1, M); ++r)
    for (int64_t n = 0; n < ldy; ++n) {
      float sum = 0.f;
      for (int sl = 0; sl < S; ++sl) {
        const float v = y[(size_t)sl * stride + (size_t)r * ldy + n];
        if (r < total && n < N) sum = sl == 0 ? v : sum + v;
        else if (!std::isnan(v)) ++outside;
      }
      if (r < total && n < N) out[(size_t)r * N + n] = sum;
    }
  return outside;
}

static void check_case(const Case& c) {
  const bool grouped = !c.counts.empty();
  const int G = grouped ? c.groups : 1;
  std::vector<int> off(G + 1, 0);
  if (grouped)
    for (int g = 0; g < G; ++g) off[g + 1] = off[g] + c.counts[g];
  const int total = grouped ? off[G] : c.M;
  const int64_t ldy = c.ldy > 0 ? c.ldy : c.N;
  const int xrows = std::max(1, c.M);
  std::vector<uint8_t> W((size_t)G * c.N * c.K), X((size_t)xrows * c.K);
  fill_fp8_host(W);
  fill_fp8_host(X);
  std::vector<float> ws((size_t)G * c.N), xs(xrows), bias;
  for (auto& v : ws) v = randu(0.5f, 2.f) / 448.f;
  for (auto& v : xs) v = randu(0.5f, 2.f) / 448.f;
  if (c.bias) {
    bias.resize((size_t)G * c.N);
    for (auto& v : bias) v = randn();
  }
  std::vector<int> rows(std::max(1, total));
  std::iota(rows.begin(), rows.end(), 0);
  if (c.permute) std::shuffle(rows.begin(), rows.end(), rng);
  // Reference: y[p][n] = sum_k X[x_rows[p]][k] W[g][n][k] * xs * ws + bias.
  std::vector<double> ref((size_t)total * c.N);
  for (int g = 0; g < G; ++g)
    for (int p = off[g]; p < (grouped ? off[g + 1] : total); ++p) {
      const int xr = c.permute ? rows[p] : p;
      for (int n = 0; n < c.N; ++n) {
        double s = 0;
        const uint8_t* wr = &W[((size_t)g * c.N + n) * c.K];
        const uint8_t* xp = &X[(size_t)xr * c.K];
        for (int k = 0; k < c.K; ++k) s += fp8_dec(xp[k]) * fp8_dec(wr[k]);
        s *= (double)xs[xr] * ws[(size_t)g * c.N + n];
        if (c.bias) s += bias[(size_t)g * c.N + n];
        ref[(size_t)p * c.N + n] = s;
      }
    }
  Dev<uint8_t> dW(W), dX(X);
  Dev<float> dws(ws), dxs(xs), dY((size_t)std::max(1, c.M) * ldy);
  Dev<float> dbias(c.bias ? bias : std::vector<float>(1));
  Dev<int> doff(off), drows(rows);
  Workspace big(8u << 20, 1 << 16);
  StreamGemmArgs a;
  a.W = dW.p;
  a.w_scale = dws.p;
  a.bias = c.bias ? dbias.p : nullptr;
  a.X = dX.p;
  a.x_scale = dxs.p;
  a.x_rows = c.permute ? drows.p : nullptr;
  a.group_offsets = grouped ? doff.p : nullptr;
  a.groups = G;
  a.M = c.M;
  a.N = c.N;
  a.K = c.K;
  a.Y = dY.p;
  a.ldy = ldy;
  a.max_rows_per_group = grouped ? *std::max_element(c.counts.begin(), c.counts.end()) : c.M;
  if (g_major == 9) check_split_out(c, a, total, ldy, ref, dX.p, X.size());
  for (int nt : {0, 16, 32, 64, 128}) {
    for (int splits : {1, 3, 0}) {
      StreamTcTuning tu;
      tu.token_tile = nt;
      tu.splits = splits;
      const std::string detail = fmt("%s tile %s splits %s", c.name.c_str(), nt ? fmt("%d", nt).c_str() : "auto",
                                     splits ? fmt("%d", splits).c_str() : "auto");
      dY.poison();
      const cudaError_t e = gemm_fp8_stream_tc(a, big.view(), tu, nullptr);
      if (g_major != 9) {
        report("stream_tc not sm_90", detail, e == cudaErrorNotSupported ? 0 : 1, 0);
        (void)cudaGetLastError();
        continue;
      }
      if (e != cudaSuccess) {
        report("stream_tc launch", detail + " " + cudaGetErrorString(e), 1, 0);
        continue;
      }
      CK(cudaDeviceSynchronize());
      const std::vector<float> y = dY.down();
      std::vector<double> out;
      const size_t outside = gather_output(y, 1, 0, c.M, total, c.N, ldy, out);
      report("stream_tc", detail, rel_err(out, ref), 1e-3);
      if (outside) report("stream_tc untouched", detail, (double)outside, 0);
      const std::vector<int> cnt = big.counters.down();
      size_t nonzero = 0;
      for (int v : cnt) nonzero += v != 0;
      if (nonzero) report("stream_tc counters", detail + " left non-zero", (double)nonzero, 0);
      if (splits == 0 && nt == 0) {
        // Bit-for-bit repeat, and a graph replay of the same launch.
        CK(gemm_fp8_stream_tc(a, big.view(), tu, nullptr));
        CK(cudaDeviceSynchronize());
        const std::vector<float> y2 = dY.down();
        report("stream_tc repeat", c.name + " bit for bit",
               memcmp(y.data(), y2.data(), y.size() * sizeof(float)) == 0 ? 0 : 1, 0);
        cudaStream_t s;
        CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        CK(gemm_fp8_stream_tc(a, big.view(), tu, s));
        CK(cudaStreamEndCapture(s, &graph));
        CK(cudaGraphInstantiate(&exec, graph, 0));
        dY.poison();
        for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(exec, s));
        CK(cudaStreamSynchronize(s));
        const std::vector<float> y3 = dY.down();
        report("stream_tc graph", c.name + " replay x3 bit for bit",
               memcmp(y.data(), y3.data(), y.size() * sizeof(float)) == 0 ? 0 : 1, 0);
        // Programmatic dependent launch with an L2 prefetch of group 0, right
        // after a kernel that restores X and the offsets from poison (eagerly
        // and captured): the plain launch's bits.
        {
          Dev<uint8_t> Xsrc(X);
          Dev<int> offsrc(off);
          StreamGemmArgs p = a;
          p.pdl = 1;
          p.prefetch_group = 0;
          for (int captured = 0; captured < 2; ++captured) {
            dY.poison();
            dX.poison();
            if (grouped) doff.zero();  // zero offsets: no tiles, Y would stay poisoned
            CK(cudaDeviceSynchronize());
            cudaGraph_t pg = nullptr;
            cudaGraphExec_t pe = nullptr;
            if (captured) CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
            restore_inputs_kernel<<<64, 256, 0, s>>>(dX.p, Xsrc.p, X.size(), grouped ? doff.p : nullptr,
                                                    offsrc.p, (int)off.size(), 20000);
            CK(cudaGetLastError());
            CK(gemm_fp8_stream_tc(p, big.view(), tu, s));
            if (captured) {
              CK(cudaStreamEndCapture(s, &pg));
              CK(cudaGraphInstantiate(&pe, pg, 0));
              CK(cudaGraphLaunch(pe, s));
            }
            CK(cudaStreamSynchronize(s));
            const std::vector<float> y5 = dY.down();
            report("stream_tc pdl", c.name + (captured ? " in a graph" : " eager") + ", bit for bit",
                   memcmp(y.data(), y5.data(), y.size() * sizeof(float)) == 0 ? 0 : 1, 0);
            if (pe) CK(cudaGraphExecDestroy(pe));
            if (pg) CK(cudaGraphDestroy(pg));
          }
        }
        CK(cudaGraphExecDestroy(exec));
        CK(cudaGraphDestroy(graph));
        CK(cudaStreamDestroy(s));
        // At most 1 or 7 CTAs (StreamTcTuning::max_ctas): the same units, the
        // same bits.
        for (int cap : {1, 7}) {
          StreamTcTuning tc = tu;
          tc.max_ctas = cap;
          dY.poison();
          CK(gemm_fp8_stream_tc(a, big.view(), tc, nullptr));
          CK(cudaDeviceSynchronize());
          const std::vector<float> y6 = dY.down();
          report("stream_tc max_ctas", fmt("%s at most %d CTAs, bit for bit", c.name.c_str(), cap),
                 memcmp(y.data(), y6.data(), y.size() * sizeof(float)) == 0 ? 0 : 1, 0);
        }
        // A workspace with room for no partials: one CTA per unit, same math.
        Workspace none(0, 0);
        StreamTcTuning t8 = tu;
        t8.splits = 8;
        dY.poison();
        CK(gemm_fp8_stream_tc(a, none.view(), t8, nullptr));
        CK(cudaDeviceSynchronize());
        const std::vector<float> y4 = dY.down();
        for (int r = 0; r < total; ++r)
          for (int n = 0; n < c.N; ++n) out[(size_t)r * c.N + n] = y4[(size_t)r * ldy + n];
        report("stream_tc no workspace", c.name + " splits 8 asked, none fit", rel_err(out, ref), 1e-3);
      }
    }
  }
}

// The K splits' slices stored apart (StreamTcTuning::split_stride): their sum
// in split order against the float64 reference; each slice's columns past N,
// rows past the written ones and the gap between slices untouched; a repeat
// bit for bit.
static void check_split_out(const Case& c, const StreamGemmArgs& a0, int total, int64_t ldy,
                            const std::vector<double>& ref, uint8_t* dX, size_t nx) {
  const int KT = c.K / 128;
  const int64_t stride = (int64_t)std::max(1, c.M) * ldy + 8;
  for (int S : {2, 3, KT}) {
    if (S < 2 || S > KT || (S == KT && KT <= 3)) continue;
    for (int nt : {0, 16, 64}) {
      Dev<float> dY((size_t)S * stride);
      StreamGemmArgs a = a0;
      a.Y = dY.p;
      StreamTcTuning tu;
      tu.token_tile = nt;
      tu.splits = S;
      tu.split_stride = stride;
      const std::string detail = fmt("%s tile %s, %d slices", c.name.c_str(), nt ? fmt("%d", nt).c_str() : "auto", S);
      dY.poison();
      const cudaError_t e = gemm_fp8_stream_tc(a, StreamTcWorkspace{}, tu, nullptr);
      if (e != cudaSuccess) {
        report("stream_tc slices launch", detail + " " + cudaGetErrorString(e), 1, 0);
        continue;
      }
      CK(cudaDeviceSynchronize());
      const std::vector<float> y = dY.down();
      std::vector<double> out;
      size_t outside = gather_output(y, S, stride, c.M, total, c.N, ldy, out);
      for (int sl = 0; sl < S; ++sl)
        for (int64_t g = stride - 8; g < stride; ++g) outside += !std::isnan(y[(size_t)sl * stride + g]);
      report("stream_tc slices", detail, rel_err(out, ref), 1e-3);
      if (outside) report("stream_tc slices untouched", detail, (double)outside, 0);
      if (nt == 0) {
        CK(gemm_fp8_stream_tc(a, StreamTcWorkspace{}, tu, nullptr));
        CK(cudaDeviceSynchronize());
        const std::vector<float> y2 = dY.down();
        report("stream_tc slices repeat", detail + " bit for bit",
               memcmp(y.data(), y2.data(), y.size() * sizeof(float)) == 0 ? 0 : 1, 0);
        // Programmatic dependent launch (dense: the first weight stages' TMAs
        // issued before griddepcontrol.wait) right after a kernel that
        // restores X from poison: the same bits.
        Dev<uint8_t> Xsrc(nx);
        CK(cudaMemcpy(Xsrc.p, dX, nx, cudaMemcpyDeviceToDevice));
        CK(cudaMemset(dX, 0x7f, nx));  // NaN codes
        dY.poison();
        StreamGemmArgs p = a;
        p.pdl = 1;
        cudaStream_t ps;
        CK(cudaStreamCreateWithFlags(&ps, cudaStreamNonBlocking));
        CK(cudaDeviceSynchronize());
        restore_inputs_kernel<<<64, 256, 0, ps>>>(dX, Xsrc.p, nx, nullptr, nullptr, 0, 20000);
        CK(cudaGetLastError());
        CK(gemm_fp8_stream_tc(p, StreamTcWorkspace{}, tu, ps));
        CK(cudaStreamSynchronize(ps));
        CK(cudaStreamDestroy(ps));
        const std::vector<float> y3 = dY.down();
        report("stream_tc slices pdl", detail + " bit for bit",
               memcmp(y.data(), y3.data(), y.size() * sizeof(float)) == 0 ? 0 : 1, 0);
      }
    }
  }
}

static std::vector<int> spread(int G, int rows, std::vector<int> empty) {
  std::vector<int> c(G, 0);
  std::vector<int> live;
  for (int g = 0; g < G; ++g)
    if (std::find(empty.begin(), empty.end(), g) == empty.end()) live.push_back(g);
  for (int r = 0; r < rows; ++r) ++c[live[randi(0, (int)live.size() - 1)]];
  return c;
}

static void check_all() {
  std::vector<Case> cases;
  auto dense = [&](const char* n, int M, int N, int K, bool bias, int64_t ldy = 0) {
    Case c;
    c.name = n;
    c.M = M;
    c.N = N;
    c.K = K;
    c.bias = bias;
    c.ldy = ldy;
    cases.push_back(c);
  };
  dense("dense M1 N128 K128", 1, 128, 128, false);
  dense("dense M4 N1792 K5120 bias", 4, 1792, 5120, true);
  dense("dense M9 N1792 K1024 bias", 9, 1792, 1024, true);
  dense("dense M33 N200 K384 ldy264", 33, 200, 384, false, 264);
  dense("dense M64 N512 K1536", 64, 512, 1536, true);
  dense("dense M100 N384 K640", 100, 384, 640, false);
  dense("dense M128 N256 K5120", 128, 256, 5120, false);
  auto grouped = [&](const char* n, int M, int G, int N, int K, std::vector<int> counts, bool permute,
                     bool bias) {
    Case c;
    c.name = n;
    c.M = M;
    c.groups = G;
    c.N = N;
    c.K = K;
    c.counts = std::move(counts);
    c.permute = permute;
    c.bias = bias;
    cases.push_back(c);
  };
  grouped("grouped 20x64 rows, 3 empty", 64, 20, 256, 512, spread(20, 64, {0, 7, 19}), true, false);
  grouped("grouped 20x300 rows (tiles>1)", 300, 20, 384, 256, spread(20, 300, {4}), true, true);
  grouped("grouped 160x40 rows, below M", 48, 160, 128, 384, spread(160, 40, {}), true, false);
  {
    std::vector<int> one(5, 0);
    one[3] = 37;
    grouped("grouped all rows in group 3", 37, 5, 256, 1024, one, false, false);
  }
  for (const Case& c : cases) check_case(c);
}

static void check_invalid() {
  Dev<uint8_t> W(128 * 256), X(16 * 256);
  Dev<float> ws(128), xs(16), Y(16 * 128);
  StreamGemmArgs a;
  a.W = W.p;
  a.w_scale = ws.p;
  a.X = X.p;
  a.x_scale = xs.p;
  a.M = 16;
  a.N = 128;
  a.K = 256;
  a.Y = Y.p;
  a.ldy = 128;
  Workspace w(1 << 16, 64);
  auto expect_invalid = [&](const char* what, StreamGemmArgs b, StreamTcTuning tu) {
    const cudaError_t e = gemm_fp8_stream_tc(b, w.view(), tu, nullptr);
    (void)cudaGetLastError();
    report("stream_tc invalid", what, e == cudaErrorInvalidValue ? 0 : 1, 0);
  };
  StreamGemmArgs b = a;
  b.K = 200;
  expect_invalid("K not a multiple of 128", b, {});
  b = a;
  b.ldy = 64;
  expect_invalid("ldy < N", b, {});
  b = a;
  b.W = W.p + 1;
  expect_invalid("W not 16-byte aligned", b, {});
  StreamTcTuning t;
  t.token_tile = 24;
  expect_invalid("token tile 24", a, t);
  t = {};
  t.splits = -1;
  expect_invalid("splits -1", a, t);
  t = {};
  t.max_ctas = -1;
  expect_invalid("max_ctas -1", a, t);
  b = a;
  b.groups = 2;
  expect_invalid("groups 2 without offsets", b, {});
  t = {};
  t.splits = 2;
  t.split_stride = (int64_t)a.M * a.ldy - 1;
  expect_invalid("slices overlapping (stride < M * ldy)", a, t);
  t.split_stride = (int64_t)a.M * a.ldy;
  t.splits = 0;
  expect_invalid("slices without a split count", a, t);
  t.splits = 3;  // K 256: 2 stages
  expect_invalid("more slices than K stages", a, t);
  t.splits = 2;
  t.split_stride = -1;
  expect_invalid("negative stride", a, t);
}

static __global__ void fill_fp8_kernel(uint8_t* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint8_t b = (uint8_t)mix64(seed + i * 0x9E3779B97F4A7C15ull);
    if ((b & 0x7f) == 0x7f) b ^= 1;
    p[i] = b;
  }
}

// T tokens routed top-1 over E groups (multinomial): the group offsets, the
// token of each grouped row (a permutation) and the groups hit; with shared,
// one more group of every token's row (the shared expert), counted as hit.
struct RoutedRows {
  std::vector<int> off, rows;
  int hit = 0;
};
static RoutedRows route_rows(int T, int E, bool shared) {
  std::vector<int> cnt(E, 0);
  for (int r = 0; r < T; ++r) ++cnt[randi(0, E - 1)];
  RoutedRows rt;
  rt.off.assign(E + 1 + (shared ? 1 : 0), 0);
  rt.hit = shared ? 1 : 0;
  for (int e = 0; e < E; ++e) {
    rt.off[e + 1] = rt.off[e] + cnt[e];
    rt.hit += cnt[e] > 0;
  }
  if (shared) rt.off[E + 1] = rt.off[E] + T;
  rt.rows.resize(T);
  std::iota(rt.rows.begin(), rt.rows.end(), 0);
  std::shuffle(rt.rows.begin(), rt.rows.end(), rng);
  for (int t = 0; shared && t < T; ++t) rt.rows.push_back(t);
  return rt;
}

// A grouped launch's arguments: rows x_rows of X grouped by offs, Y [M][N].
static StreamGemmArgs grouped_args(const uint8_t* X, const float* xs, const int* x_rows, const int* offs,
                                   int groups, int M, int N, int K, float* Y) {
  StreamGemmArgs a;
  a.X = X;
  a.x_scale = xs;
  a.x_rows = x_rows;
  a.group_offsets = offs;
  a.groups = groups;
  a.M = M;
  a.N = N;
  a.K = K;
  a.Y = Y;
  a.ldy = N;
  return a;
}

// A dense linear's weights for the benches: N x K FP8 in copies (>= 200 MB in
// all, so L2 never holds them), scales 1/448, a zero bias; args() the
// arguments of an M-row call and at() pointing them at copy i % copies.
struct RotatedDense {
  int N, K;
  size_t wb;
  int copies;
  Dev<uint8_t> W;
  Dev<float> wsc, bias;
  RotatedDense(int n, int k)
      : N(n), K(k), wb((size_t)n * k), copies((int)std::max<size_t>(2, (200u << 20) / wb + 1)),
        W(wb * copies), wsc((size_t)n * copies), bias(n) {
    fill_fp8_kernel<<<1024, 256>>>(W.p, W.n, rng());
    CK(cudaGetLastError());
    wsc.up(std::vector<float>(wsc.n, 1.f / 448));
    bias.zero();
  }
  StreamGemmArgs args(const uint8_t* X, const float* xs, float* Y, int M, bool with_bias) const {
    StreamGemmArgs a;
    a.X = X;
    a.x_scale = xs;
    a.bias = with_bias ? bias.p : nullptr;
    a.M = M;
    a.N = N;
    a.K = K;
    a.Y = Y;
    a.ldy = N;
    a.max_rows_per_group = M;
    return a;
  }
  void at(StreamGemmArgs& a, int i) const {
    const int cp = i % copies;
    a.W = W.p + (size_t)cp * wb;
    a.w_scale = wsc.p + (size_t)cp * N;
  }
};

static void bench(const LtGemm& lt) {
  const double kHbm = 4.46e12;
  const int H = 5120, I = 1536, E = 20, MMAX = 2048;
  Dev<uint8_t> X((size_t)MMAX * H);
  Dev<float> xs(MMAX), Y((size_t)MMAX * 2 * H), tmp((size_t)MMAX * 2 * H);
  fill_fp8_kernel<<<1024, 256>>>(X.p, X.n, rng());
  CK(cudaGetLastError());
  xs.up(std::vector<float>(xs.n, 1.f / 448));
  Workspace wsp(16u << 20, 1 << 16);
  auto graph_us = [&](auto launch) { return 1e3 * graph_replay_ms(launch, 20, 20, 3, 3) / 20; };
  printf("\nbench: GLM-4.7 rank-0/8 decode linears; us per call (20 per CUDA graph), %% of 4.46 TB/s on weight bytes\n");
  printf("tc = gemm_fp8_stream_tc (auto tile/splits), lt = cuBLASLt FP8 (+ epilogue with bias: the runtime's path\n");
  printf("past 8 rows), stream = gemm_fp8_stream (mma.sync; the runtime's path up to 8 rows)\n");
  printf("%-14s %5s %5s %6s | %8s %5s | %8s %5s | %8s %5s | %6s\n", "linear", "M", "tile", "splits", "tc us", "%",
         "lt us", "%", "stream us", "%", "lt/tc");
  struct Shape {
    const char* name;
    int N, K;
    bool bias;
  };
  const Shape dense[] = {{"q|k|v", 1792, H, true}, {"o_proj", H, I, false}, {"shared g|u", 2 * I, H, false},
                         {"shared down", H, I, false}};
  for (const Shape& sh : dense) {
    const RotatedDense rd(sh.N, sh.K);
    const size_t wb = rd.wb;
    for (int M : {16, 32, 64, 128, 256}) {
      StreamGemmArgs a = rd.args(X.p, xs.p, Y.p, M, sh.bias);
      auto at = [&](int i) { rd.at(a, i); };
      const float tc = graph_us([&](int i, cudaStream_t s) {
        at(i);
        CK(gemm_fp8_stream_tc(a, wsp.view(), StreamTcTuning{}, s));
      });
      const float lt_us = graph_us([&](int i, cudaStream_t s) {
        at(i);
        if (!sh.bias) {
          bool unsupported = false;
          CKS(lt_gemm_fp8_scaled(lt, a.W, a.X, a.Y, M, sh.N, sh.K, a.x_scale, a.w_scale, nullptr, &unsupported, s));
          if (!unsupported) return;
        }
        CKS(lt_gemm_fp8(lt, a.W, a.X, tmp.p, M, sh.N, sh.K, s));
        CK(gemm_fp8_epilogue(tmp.p, 1, M, sh.N, a.x_scale, a.w_scale, a.bias, a.Y, sh.N, s));
      });
      float st_us = NAN;
      if (M <= 64) {
        st_us = graph_us([&](int i, cudaStream_t s) {
          at(i);
          CK(gemm_fp8_stream(a, s));
        });
      }
      const int tile = gemm_fp8_stream_tc_token_tile(a);
      const double gb = (double)wb;
      if (g_sweep) {
        for (int sp : {1, 2, 3, 4, 6, 8, 10, 12, 16}) {
          StreamTcTuning tu;
          tu.splits = sp;
          const float us = graph_us([&](int i, cudaStream_t s) {
            at(i);
            CK(gemm_fp8_stream_tc(a, wsp.view(), tu, s));
          });
          printf("  sweep %-14s M %4d splits %2d: %8.2f us %4.0f%%\n", sh.name, M, sp, us, 100 * gb / (us * 1e-6) / kHbm);
        }
      }
      printf("%-14s %5d %5d %6s | %8.2f %4.0f%% | %8.2f %4.0f%% | %8.2f %4.0f%% | %5.2fx\n", sh.name, M, tile, "auto",
             tc, 100 * gb / (tc * 1e-6) / kHbm, lt_us, 100 * gb / (lt_us * 1e-6) / kHbm, st_us,
             std::isnan(st_us) ? 0.0 : 100 * gb / (st_us * 1e-6) / kHbm, lt_us / tc);
      fflush(stdout);
    }
  }
  printf("\nrouted experts: %d x [N, K], T tokens at top-1 (multinomial); us per call; %% on the weights of the experts hit\n", E);
  printf("the second column: gemm_fp8_stream up to 32 rows per expert, gemm_fp8_grouped_tc (fp8_accum) beyond\n");
  printf("%-14s %5s %5s | %8s %5s | %9s %5s | %6s\n", "gemm", "T", "hit", "tc us", "%", "stream us", "%",
         "st/tc");
  const Shape moe[] = {{"experts g|u", 2 * I, H, false}, {"experts down", H, I, false}};
  for (const Shape& sh : moe) {
    const size_t wb = (size_t)E * sh.N * sh.K;
    const int copies = (int)std::max<size_t>(2, (200u << 20) / wb + 1);
    Dev<uint8_t> W(wb * copies);
    Dev<float> wsc((size_t)E * sh.N * copies);
    fill_fp8_kernel<<<1024, 256>>>(W.p, W.n, rng());
    CK(cudaGetLastError());
    wsc.up(std::vector<float>(wsc.n, 1.f / 448));
    for (int T : {16, 64, 128, 256, 1024, 2048}) {
      const RoutedRows rt = route_rows(T, E, false);
      const int hit = rt.hit;
      Dev<int> doff(rt.off), drows(rt.rows);
      StreamGemmArgs a = grouped_args(X.p, xs.p, drows.p, doff.p, E, T, sh.N, sh.K, Y.p);
      // As the runtime passes them (step.cu, mlp_block).
      a.max_rows_per_group = T;
      a.max_active_groups = std::min(E, T);
      a.typical_rows_per_group = std::max((T + E - 1) / E, T > 8 ? 9 : 1);
      auto at = [&](int i) {
        const int cp = i % copies;
        a.W = W.p + (size_t)cp * wb;
        a.w_scale = wsc.p + (size_t)cp * E * sh.N;
      };
      StreamGemmArgs tca = a;
      tca.typical_rows_per_group = (T + E - 1) / E;
      const float tc = graph_us([&](int i, cudaStream_t s) {
        at(i);
        tca.W = a.W;
        tca.w_scale = a.w_scale;
        CK(gemm_fp8_stream_tc(tca, wsp.view(), StreamTcTuning{}, s));
      });
      // Past 32 rows per expert the runtime runs the tensor-core grouped GEMM
      // (gemm_grouped.cu, FP8 accumulation tiles): that is the column to beat there.
      const bool big = (T + E - 1) / E > 32;
      const float st_us = graph_us([&](int i, cudaStream_t s) {
        at(i);
        if (big) {
          GroupedTcTuning g;
          g.fp8_accum = 1;
          StreamGemmArgs b = a;
          b.M = T;
          b.typical_rows_per_group = (T + E - 1) / E;
          CK(gemm_fp8_grouped_tc_tuned(b, g, s));
        } else {
          CK(gemm_fp8_stream(a, s));
        }
      });
      const double gb = (double)hit * sh.N * sh.K;
      if (g_sweep) {
        for (int nt : {16, 32})
          for (int sp : {1, 2, 3, 4, 6}) {
            StreamTcTuning tu;
            tu.token_tile = nt;
            tu.splits = sp;
            const float us = graph_us([&](int i, cudaStream_t s) {
              at(i);
              tca.W = a.W;
              tca.w_scale = a.w_scale;
              CK(gemm_fp8_stream_tc(tca, wsp.view(), tu, s));
            });
            printf("  sweep %-14s T %4d tile %3d splits %2d: %8.2f us %4.0f%%\n", sh.name, T, nt, sp, us,
                   100 * gb / (us * 1e-6) / kHbm);
          }
      }
      printf("%-14s %5d %5d | %8.2f %4.0f%% | %9.2f %4.0f%% | %5.2fx\n", sh.name, T, hit, tc,
             100 * gb / (tc * 1e-6) / kHbm, st_us, 100 * gb / (st_us * 1e-6) / kHbm, st_us / tc);
      fflush(stdout);
    }
  }
}

// --dense-splits: q|k|v and o_proj at 16-256 rows as K-split slices
// (StreamTcTuning::split_stride: no counter, the next kernel sums them) for
// every split count, next to the runtime's cuBLASLt calls (q|k|v: the plain
// FP8 GEMM, its epilogue folded into the rope kernel; o_proj: the scaled GEMM
// adding into h) and the unsplit kernel. Weights rotated over >= 200 MB.
static void bench_dense_splits(const LtGemm& lt) {
  const double kHbm = 4.46e12;
  const int H = 5120, I = 1536, MMAX = 256;
  Dev<uint8_t> X((size_t)MMAX * H);
  Dev<float> xs(MMAX), Y((size_t)2 << 20), acc((size_t)MMAX * H);
  fill_fp8_kernel<<<1024, 256>>>(X.p, X.n, rng());
  CK(cudaGetLastError());
  xs.up(std::vector<float>(xs.n, 1.f / 448));
  acc.zero();
  auto graph_us = [&](auto launch) { return 1e3 * graph_replay_ms(launch, 20, 20, 3, 3) / 20; };
  printf("\ndense-splits: us per call (20 per CUDA graph), %% of 4.46 TB/s on weight bytes; slices S: K splits stored apart\n");
  struct Shape {
    const char* name;
    int N, K;
    bool bias;
  };
  const Shape dense[] = {{"q|k|v", 1792, H, true}, {"o_proj", H, I, false}};
  for (const Shape& sh : dense) {
    const RotatedDense rd(sh.N, sh.K);
    const size_t wb = rd.wb;
    const int KT = sh.K / 128;
    for (int M : {16, 32, 64, 96, 128, 192, 256}) {
      StreamGemmArgs a = rd.args(X.p, xs.p, Y.p, M, sh.bias);
      auto at = [&](int i) { rd.at(a, i); };
      auto pct = [&](float us) { return 100 * (double)wb / (us * 1e-6) / kHbm; };
      const float lt_us = graph_us([&](int i, cudaStream_t s) {
        at(i);
        if (!sh.bias) {
          bool unsupported = false;
          CKS(lt_gemm_fp8_scaled(lt, a.W, a.X, acc.p, M, sh.N, sh.K, a.x_scale, a.w_scale, nullptr, &unsupported, s,
                                 true));
          if (!unsupported) return;
        }
        CKS(lt_gemm_fp8(lt, a.W, a.X, a.Y, M, sh.N, sh.K, s));
      });
      const float one = graph_us([&](int i, cudaStream_t s) {
        at(i);
        CK(gemm_fp8_stream_tc(a, StreamTcWorkspace{}, StreamTcTuning{}, s));
      });
      printf("%-7s M %3d tile %3d | lt %6.2f (%3.0f%%) | unsplit %6.2f (%3.0f%%) | slices:", sh.name, M,
             gemm_fp8_stream_tc_token_tile(a), lt_us, pct(lt_us), one, pct(one));
      float best = 1e30f;
      int best_s = 0, best_nt = 0;
      for (int nt : {0, 64}) {
        if (nt == 64 && M <= 64) continue;
        if (nt == 64) printf(" | tile 64:");
        for (int S : {2, 3, 4, 5, 6, 8, 9, 10, 12, 16}) {
          if (S > KT || (int64_t)S * M * sh.N > (int64_t)Y.n) continue;
          StreamTcTuning tu;
          tu.token_tile = nt;
          tu.splits = S;
          tu.split_stride = (int64_t)M * sh.N;
          const float us = graph_us([&](int i, cudaStream_t s) {
            at(i);
            CK(gemm_fp8_stream_tc(a, StreamTcWorkspace{}, tu, s));
          });
          printf(" %d:%.2f", S, us);
          if (us < best) best = us, best_s = S, best_nt = nt;
        }
      }
      printf(" | best S %d tile %s %.2f (%.0f%%), lt/best %.2fx\n", best_s, best_nt ? "64" : "auto", best, pct(best),
             lt_us / best);
      fflush(stdout);
    }
  }
}

// --experts: the routed experts' GEMMs as the runtime runs them past 8 rows,
// with the shared expert as a 21st group of every token's row up to 128 rows,
// weights rotated over >= 400 MB, in every token tile (step.cu's
// shared_group_token_tile and down_token_tile pick from these figures).
// The HBM read rate the bench's percentages use: the H200's 4.46 TB/s
// (docs/hardware.md), else the H100 SXM's 3.11.
static double hbm_peak() {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  return strstr(prop.name, "H200") ? 4.46e12 : 3.11e12;
}

static void bench_experts(bool profile = false) {
  const double kHbm = hbm_peak();
  const int H = 5120, I = 1536, E = 20, MMAX = 512;
  Dev<uint8_t> X((size_t)MMAX * H);
  Dev<float> xs(MMAX), Y((size_t)2 * MMAX * 2 * H);
  fill_fp8_kernel<<<1024, 256>>>(X.p, X.n, rng());
  CK(cudaGetLastError());
  xs.up(std::vector<float>(xs.n, 1.f / 448));
  Workspace wsp(16u << 20, 1 << 16);
  auto graph_us = [&](auto launch) { return 1e3 * graph_replay_ms(launch, 20, 20, 3, 3) / 20; };
  printf("\nexperts: us per call (20 per CUDA graph); %% of %.2f TB/s on the weights of the groups hit\n", kHbm / 1e12);
  struct Shape { const char* name; int N, K; };
  const Shape moe[] = {{"experts g|u", 2 * I, H}, {"experts down", H, I}};
  for (const Shape& sh : moe) {
    const size_t wb = (size_t)(E + 1) * sh.N * sh.K;
    const int copies = (int)std::max<size_t>(2, (400u << 20) / wb + 1);
    Dev<uint8_t> W(wb * copies);
    Dev<float> wsc((size_t)(E + 1) * sh.N * copies);
    fill_fp8_kernel<<<1024, 256>>>(W.p, W.n, rng());
    CK(cudaGetLastError());
    wsc.up(std::vector<float>(wsc.n, 1.f / 448));
    for (int T : {16, 32, 64, 128, 256}) {
      for (int shared = 0; shared < 2; ++shared) {
        if (shared && T > 128) continue;  // (the runtime's shared group: up to 128 rows)
        if (profile && !(T == 64 && shared)) continue;
        const int G = E + shared;
        const RoutedRows rt = route_rows(T, E, shared != 0);
        const int hit = rt.hit;
        const std::vector<int>& rows = rt.rows;
        Dev<int> doff(rt.off), drows(rt.rows);
        StreamGemmArgs a = grouped_args(X.p, xs.p, drows.p, doff.p, G, (int)rows.size(), sh.N, sh.K, Y.p);
        a.max_rows_per_group = T;
        a.max_active_groups = std::min(E, T) + shared;
        a.typical_rows_per_group = (T + E - 1) / E;
        // First a tile holding all the shared group's rows up to 64 (without
        // it: the kernel's own choice, "auto"), then every narrower tile of 16
        // to 64 rows (the shared rows then span several tiles, its weights
        // read once per tile, mostly from L2; a routed expert's rows likewise).
        const int tile0 = shared ? (T <= 16 ? 16 : T <= 32 ? 32 : 64) : 0;
        const int tiles[4] = {tile0, 16, 32, 64};
        for (int ti = 0; ti < 4; ++ti) {
          const int nt = tiles[ti];
          if (ti > 0 && (nt == tile0 || profile || (shared && nt > tile0))) continue;
          StreamTcTuning tu;
          // (--experts-profile: the runtime's tiles at 64 + shared, step.cu's
          // shared_group_token_tile and down_token_tile: 32 and 16.)
          tu.token_tile = profile ? (sh.K == H ? 32 : 16) : nt;
          if (profile) {  // --experts-profile: three eager launches for a profiler, no timing
            for (int i = 0; i < 3; ++i) {
              StreamGemmArgs b = a;
              b.W = W.p + (size_t)(i % copies) * wb;
              b.w_scale = wsc.p + (size_t)(i % copies) * (E + 1) * sh.N;
              CK(gemm_fp8_stream_tc(b, wsp.view(), tu, 0));
            }
            CK(cudaDeviceSynchronize());
            printf("%-13s T %4d %-3s hit %2d: 3 launches\n", sh.name, T, shared ? "+sh" : "", hit);
            continue;
          }
          const float us = graph_us([&](int i, cudaStream_t s) {
            const int cp = i % copies;
            StreamGemmArgs b = a;
            b.W = W.p + (size_t)cp * wb;
            b.w_scale = wsc.p + (size_t)cp * (E + 1) * sh.N;
            CK(gemm_fp8_stream_tc(b, wsp.view(), tu, s));
          });
          const double gb = (double)hit * sh.N * sh.K;
          printf("%-13s T %4d %-3s hit %2d | %8.2f us %4.0f%%%s\n", sh.name, T, shared ? "+sh" : "", hit, us,
                 100 * gb / (us * 1e-6) / kHbm, nt ? fmt(" (token tile %d)", nt).c_str() : " (token tile auto)");
          fflush(stdout);
        }
      }
    }
  }
}

// --experts-side: the MoE layer's expert GEMMs (gate|up, SiLU, down) as the
// runtime runs them at T decode rows ("base": the shared expert a group of
// the routed GEMMs up to 128 rows, past that a dense MLP on cuBLASLt after
// them), against the shared expert as a dense MLP on a second stream beside
// the routed experts, confined to k CTAs while the routed launches take the
// other SMs (StreamTcTuning::max_ctas), forked and joined in the CUDA graph;
// "serial": the same launches on one stream, every launch on every SM.
// Weights rotated over two copies (~1 GB), us per layer (20 per graph).
static void bench_experts_side() {
  const double kHbm = hbm_peak();
  const int H = 5120, I = 1536, E = 20, TMAX = 256, MMAX = 2 * TMAX;
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  Dev<uint8_t> X((size_t)MMAX * H), Xd_m((size_t)MMAX * I), Xd_s((size_t)TMAX * I);
  Dev<float> xs(MMAX), xsd_m(MMAX), xsd_s(TMAX);
  Dev<float> Ygu_m((size_t)MMAX * 2 * I), Ygu_s((size_t)TMAX * 2 * I), Ydn_m((size_t)MMAX * H),
      Ydn_s((size_t)TMAX * H);
  fill_fp8_kernel<<<1024, 256>>>(X.p, X.n, rng());
  CK(cudaGetLastError());
  xs.up(std::vector<float>(xs.n, 1.f / 448));
  const int copies = 2;
  const size_t gub = (size_t)(E + 1) * 2 * I * H, dnb = (size_t)(E + 1) * H * I;
  Dev<uint8_t> Wgu(gub * copies), Wdn(dnb * copies);
  Dev<float> sgu((size_t)(E + 1) * 2 * I * copies), sdn((size_t)(E + 1) * H * copies);
  fill_fp8_kernel<<<1024, 256>>>(Wgu.p, Wgu.n, rng());
  fill_fp8_kernel<<<1024, 256>>>(Wdn.p, Wdn.n, rng());
  CK(cudaGetLastError());
  sgu.up(std::vector<float>(sgu.n, 1.f / 448));
  sdn.up(std::vector<float>(sdn.n, 1.f / 448));
  LtGemm lt;
  if (cublasLtCreate(&lt.handle) != CUBLAS_STATUS_SUCCESS) {
    fprintf(stderr, "cublasLtCreate failed\n");
    exit(1);
  }
  lt.workspace_bytes = 32u << 20;
  CK(cudaMalloc(&lt.workspace, lt.workspace_bytes));
  cudaStream_t side;
  CK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  cudaEvent_t fork, join;
  CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  CK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  auto graph_us = [&](auto launch) { return 1e3 * graph_replay_ms(launch, 20, 20, 3, 3) / 20; };
  printf("\nexperts + shared expert beside them: us per layer (gate|up, SiLU, down; 20 per CUDA graph), %d SMs, "
         "%% of %.2f TB/s on the weights of the groups hit\n", sms, kHbm / 1e12);
  for (int T : {16, 32, 64, 96, 128, 192, 256}) {
    const RoutedRows rt = route_rows(T, E, true);
    Dev<int> doff(rt.off), drows(rt.rows);
    const bool grouped_sh = T <= 128;  // the runtime's shared group (step.cu kSharedGroupedMaxRows)
    const int gu_tile = T <= 16 ? 16 : T <= 64 ? 32 : 64, dn_tile = T > 32 && T <= 64 ? 16 : gu_tile;
    const double gb = (double)rt.hit * 3 * I * H;  // routed hit + shared
    // The routed (and, grouped_sh, shared) GEMMs: G groups, M rows.
    auto routed = [&](int cp, cudaStream_t s, bool with_sh, int max_ctas) {
      const int G = E + (with_sh ? 1 : 0), M = rt.off[G];
      StreamGemmArgs g = grouped_args(X.p, xs.p, drows.p, doff.p, G, M, 2 * I, H, Ygu_m.p);
      g.W = Wgu.p + (size_t)cp * gub;
      g.w_scale = sgu.p + (size_t)cp * (E + 1) * 2 * I;
      g.max_rows_per_group = T;
      g.max_active_groups = std::min(E, T) + (with_sh ? 1 : 0);
      g.typical_rows_per_group = (T + E - 1) / E;
      StreamTcTuning tu;
      tu.token_tile = with_sh ? gu_tile : 0;
      tu.max_ctas = max_ctas;
      CK(gemm_fp8_stream_tc(g, StreamTcWorkspace{}, tu, s));
      CK(silu_mul_quant_fp8(Ygu_m.p, M, I, Xd_m.p, xsd_m.p, nullptr, s));
      StreamGemmArgs d = grouped_args(Xd_m.p, xsd_m.p, drows.p, doff.p, G, M, H, I, Ydn_m.p);
      d.W = Wdn.p + (size_t)cp * dnb;
      d.w_scale = sdn.p + (size_t)cp * (E + 1) * H;
      d.max_rows_per_group = T;
      d.max_active_groups = g.max_active_groups;
      d.typical_rows_per_group = g.typical_rows_per_group;
      tu.token_tile = with_sh ? dn_tile : 16;
      CK(gemm_fp8_stream_tc(d, StreamTcWorkspace{}, tu, s));
    };
    // The shared expert alone as a dense MLP: tile 0 = cuBLASLt, else the
    // streaming kernel's tile on at most max_ctas CTAs.
    auto shared = [&](int cp, cudaStream_t s, int tile, int max_ctas) {
      const uint8_t* wg = Wgu.p + (size_t)cp * gub + (size_t)E * 2 * I * H;
      const float* sg = sgu.p + (size_t)cp * (E + 1) * 2 * I + (size_t)E * 2 * I;
      const uint8_t* wd = Wdn.p + (size_t)cp * dnb + (size_t)E * H * I;
      const float* sd = sdn.p + (size_t)cp * (E + 1) * H + (size_t)E * H;
      if (tile == 0) {
        bool un = false;
        CKS(lt_gemm_fp8_scaled(lt, wg, X.p, Ygu_s.p, T, 2 * I, H, xs.p, sg, nullptr, &un, s));
        if (un) { fprintf(stderr, "lt scaled unsupported\n"); exit(1); }
        CK(silu_mul_quant_fp8(Ygu_s.p, T, I, Xd_s.p, xsd_s.p, nullptr, s));
        CKS(lt_gemm_fp8_scaled(lt, wd, Xd_s.p, Ydn_s.p, T, H, I, xsd_s.p, sd, nullptr, &un, s));
        return;
      }
      StreamGemmArgs g = grouped_args(X.p, xs.p, nullptr, nullptr, 1, T, 2 * I, H, Ygu_s.p);
      g.W = wg;
      g.w_scale = sg;
      StreamTcTuning tu;
      tu.token_tile = tile;
      tu.max_ctas = max_ctas;
      CK(gemm_fp8_stream_tc(g, StreamTcWorkspace{}, tu, s));
      CK(silu_mul_quant_fp8(Ygu_s.p, T, I, Xd_s.p, xsd_s.p, nullptr, s));
      StreamGemmArgs d = grouped_args(Xd_s.p, xsd_s.p, nullptr, nullptr, 1, T, H, I, Ydn_s.p);
      d.W = wd;
      d.w_scale = sd;
      CK(gemm_fp8_stream_tc(d, StreamTcWorkspace{}, tu, s));
    };
    auto pct = [&](float us) { return 100 * gb / (us * 1e-6) / kHbm; };
    const float base = graph_us([&](int i, cudaStream_t s) {
      routed(i % copies, s, grouped_sh, 0);
      if (!grouped_sh) shared(i % copies, s, 0, 0);
    });
    printf("T %3d hit %2d | base (%s) %7.2f (%3.0f%%)", T, rt.hit, grouped_sh ? "shared group" : "shared on cuBLASLt after",
           base, pct(base));
    const int stile = T <= 16 ? 16 : T <= 32 ? 32 : T <= 64 ? 64 : 128;
    const float ser = graph_us([&](int i, cudaStream_t s) {
      routed(i % copies, s, false, 0);
      shared(i % copies, s, stile, 0);
    });
    printf(" | serial, tile %d %7.2f", stile, ser);
    for (int tile : {stile, 0}) {
      if (tile == 0 && T < 128) continue;
      printf(" | side%s:", tile ? "" : " cuBLASLt");
      for (int k : {4, 8, 12, 16, 24, 32}) {
        const float us = graph_us([&](int i, cudaStream_t s) {
          CK(cudaEventRecord(fork, s));
          CK(cudaStreamWaitEvent(side, fork, 0));
          shared(i % copies, side, tile, k);
          routed(i % copies, s, false, sms - k);
          CK(cudaEventRecord(join, side));
          CK(cudaStreamWaitEvent(s, join, 0));
        });
        printf(" k%d %.2f", k, us);
      }
    }
    printf("\n");
    fflush(stdout);
  }
  CK(cudaEventDestroy(fork));
  CK(cudaEventDestroy(join));
  CK(cudaStreamDestroy(side));
  cublasLtDestroy(lt.handle);
  CK(cudaFree(lt.workspace));
}

// --lt-sweep: the dense decode linears on cuBLASLt (the runtime's path past the
// streaming kernels' rows) and the prefill's (512-2,048 rows: q|k|v, o_proj
// adding into h): the heuristic's first algorithm against the fastest of its
// candidates (lt_tune_fp8: a CUDA graph of 20 calls, weights rotated over >=
// 200 MB), per row count.
static void lt_sweep(const LtGemm& lt0) {
  const double kHbm = 3.11e12;
  const int H = 5120, I = 1536, MMAX = 2048;
  LtGemm lt = lt0;
  lt.algos = lt_algo_cache_create();
  Dev<uint8_t> X((size_t)MMAX * H);
  Dev<float> xs(MMAX), Y((size_t)MMAX * 2 * H);
  fill_fp8_kernel<<<1024, 256>>>(X.p, X.n, rng());
  CK(cudaGetLastError());
  xs.up(std::vector<float>(xs.n, 1.f / 448));
  Y.zero();
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  struct Shape {
    const char* name;
    int N, K;
    bool scaled, accumulate;
  };
  const Shape shapes[] = {{"q|k|v (unscaled)", 1792, H, false, false},
                          {"o_proj (+= Y)", H, I, true, true},
                          {"shared g|u", 2 * I, H, true, false},
                          {"shared down", H, I, true, false},
                          {"g|u (unscaled)", 2 * I, H, false, false},
                          {"o_proj (unscaled)", H, I, false, false}};
  printf("\ncuBLASLt: heuristic's first vs fastest candidate, us per call (graph of 20, weights rotated), %% of 3.11 TB/s\n");
  for (const Shape& sh : shapes) {
    const size_t wb = (size_t)sh.N * sh.K;
    const int copies = (int)std::max<size_t>(2, (200u << 20) / wb + 1);
    Dev<uint8_t> W(wb * copies);
    Dev<float> wsc(sh.N);
    fill_fp8_kernel<<<1024, 256>>>(W.p, W.n, rng());
    CK(cudaGetLastError());
    wsc.up(std::vector<float>(wsc.n, 1.f / 448));
    std::vector<const uint8_t*> Ws;
    for (int c = 0; c < copies; ++c) Ws.push_back(W.p + (size_t)c * wb);
    for (int M : {16, 32, 48, 64, 96, 128, 192, 256, 512, 2048}) {
      LtShape s;
      s.M = M, s.N = sh.N, s.K = sh.K, s.scaled = sh.scaled, s.accumulate = sh.accumulate;
      LtTuneReport r;
      const std::string err = lt_tune_fp8(lt, s, Ws.data(), (int)Ws.size(), X.p, Y.p, xs.p, wsc.p, nullptr, st, 20, &r);
      if (!err.empty()) {
        printf("%-18s M %4d: %s\n", sh.name, M, err.c_str());
        continue;
      }
      printf("%-18s M %4d: %2d candidates | first %7.2f us %4.0f%% | best #%-2d %7.2f us %4.0f%% | x%.2f\n", sh.name,
             M, r.candidates, r.first_us, 100 * wb / (r.first_us * 1e-6) / kHbm, r.best, r.best_us,
             100 * wb / (r.best_us * 1e-6) / kHbm, r.first_us / r.best_us);
      fflush(stdout);
    }
  }
  CK(cudaStreamDestroy(st));
  lt_algo_cache_destroy(lt.algos);
}

int main(int argc, char** argv) {
  uint64_t seed = 1;
  bool do_bench = false, only_bench = false, do_lt_sweep = false, do_dense_splits = false;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], nullptr, 10);
    else if (!strcmp(argv[i], "--bench")) do_bench = true;
    else if (!strcmp(argv[i], "--bench-only")) do_bench = only_bench = true;
    else if (!strcmp(argv[i], "--sweep")) do_bench = only_bench = g_sweep = true;
    else if (!strcmp(argv[i], "--lt-sweep")) do_lt_sweep = only_bench = true;
    else if (!strcmp(argv[i], "--experts")) {
      bench_experts();
      return 0;
    } else if (!strcmp(argv[i], "--dense-splits")) {
      do_dense_splits = only_bench = true;
    } else if (!strcmp(argv[i], "--experts-side")) {
      bench_experts_side();
      return 0;
    } else if (!strcmp(argv[i], "--experts-profile")) {
      bench_experts(true);
      return 0;
    }
    else {
      fprintf(stderr, "usage: stream_tc_check [--seed N] [--bench] [--bench-only] [--sweep] [--lt-sweep] [--experts] [--experts-side] [--experts-profile] [--dense-splits]\n");
      return 2;
    }
  }
  rng.seed(seed);
  init_fp8();
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  g_major = prop.major;
  printf("stream_tc_check: %s (sm_%d%d), seed %llu\n", prop.name, prop.major, prop.minor,
         (unsigned long long)seed);
  if (!only_bench) {
    check_all();
    check_invalid();
  }
  if ((do_bench || do_lt_sweep || do_dense_splits) && g_major == 9) {
    LtGemm lt;
    if (cublasLtCreate(&lt.handle) != CUBLAS_STATUS_SUCCESS) {
      fprintf(stderr, "cublasLtCreate failed\n");
      return 1;
    }
    lt.workspace_bytes = 32u << 20;
    CK(cudaMalloc(&lt.workspace, lt.workspace_bytes));
    if (do_bench) bench(lt);
    if (do_dense_splits) bench_dense_splits(lt);
    if (do_lt_sweep) lt_sweep(lt);
    cublasLtDestroy(lt.handle);
    CK(cudaFree(lt.workspace));
  }
  const int fails = failed_checks();
  if (!only_bench) print_summary("stream_tc_check", fails);
  return fails ? 1 : 0;
}
