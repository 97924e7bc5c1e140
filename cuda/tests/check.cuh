// check.cuh — the harness shared by the test programs of cuda/tests
// (kernel_check, attn_check, prefill_check, grouped_check, small_check): CUDA error checks, the seeded host
// RNG and its draws, host FP8 / BF16 references, device buffers, the result
// table with its report lines and summary, and event / CUDA-graph timing.
// Each program is compiled on its own (cuda/build.sh --tests); this header is
// not.
//
// Before including it a program sets the widths of its report columns (the
// GPU scripts grep the lines and the docs quote them, so they stay each
// program's own):
//   #define CHECK_NAME_W 28    // the kernel name
//   #define CHECK_DETAIL_W 44  // the case
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#if !defined(CHECK_NAME_W) || !defined(CHECK_DETAIL_W)
#error "define CHECK_NAME_W and CHECK_DETAIL_W (report's column widths) before including check.cuh"
#endif

#define CK(call)                                                                             \
  do {                                                                                       \
    cudaError_t e_ = (call);                                                                 \
    if (e_ != cudaSuccess) {                                                                 \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      exit(2);                                                                               \
    }                                                                                        \
  } while (0)
// For the kernels' launchers that return an error message ("" on success).
#define CKS(call)                                                                \
  do {                                                                           \
    std::string e_ = (call);                                                     \
    if (!e_.empty()) {                                                           \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, e_.c_str()); \
      exit(2);                                                                   \
    }                                                                            \
  } while (0)

// Seeded once in main (--seed); every random input is drawn from it, in a
// fixed order, so that a seed reproduces the same cases.
static std::mt19937_64 rng;

// ------------------------------------------------------------ host numerics

static double fp8_pos[127];  // the non-negative finite E4M3 values by code
static inline void init_fp8() {
  for (int c = 0; c < 127; ++c) {
    const int e = c >> 3, m = c & 7;
    fp8_pos[c] = e == 0 ? (m / 8.0) * std::ldexp(1.0, -6) : (1.0 + m / 8.0) * std::ldexp(1.0, e - 7);
  }
}
static inline double fp8_dec(uint8_t b) {
  if ((b & 0x7f) == 0x7f) return NAN;
  const double v = fp8_pos[b & 0x7f];
  return (b & 0x80) ? -v : v;
}
// Round to nearest even with saturation to 448 (== clamp then RNE); the encoder
// kernel_check proves bit-identical to the device's f32_to_e4m3.
static inline uint8_t fp8_enc(float xf) {
  const double x = xf;
  const double mag = std::min(std::fabs(x), 448.0);
  int hi = int(std::lower_bound(fp8_pos, fp8_pos + 127, mag) - fp8_pos);
  hi = std::min(hi, 126);
  const int lo = std::max(hi - 1, 0);
  const double dlo = mag - fp8_pos[lo], dhi = fp8_pos[hi] - mag;
  int code = (dhi < dlo || (dhi == dlo && hi % 2 == 0)) ? hi : lo;
  if (mag == 0) code = 0;
  return (uint8_t)(code | (std::signbit(x) ? 0x80 : 0));
}
static inline float bf16_round(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u = (u + 0x7fff + ((u >> 16) & 1)) & 0xffff0000u;
  float r;
  memcpy(&r, &u, 4);
  return r;
}
static inline uint16_t bf16_bits(float f) {
  float r = bf16_round(f);
  uint32_t u;
  memcpy(&u, &r, 4);
  return (uint16_t)(u >> 16);
}
static inline float bf16_val(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// SplitMix64's finaliser (pkg/sample/rng.go; also the on-device fills of the
// benches and of kernel_check's PDL check, and attn_check's FastRng).
static inline __host__ __device__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static inline float randn() {
  std::normal_distribution<float> d(0.f, 1.f);
  return d(rng);
}
static inline float randu(float a, float b) {
  std::uniform_real_distribution<float> d(a, b);
  return d(rng);
}
static inline int randi(int a, int b) {  // inclusive
  std::uniform_int_distribution<int> d(a, b);
  return d(rng);
}

// RoPE inverse frequencies theta^(-2i/rot), i < rot/2, in float (as the runtime).
static inline std::vector<float> make_inv_freq(int rot, float theta) {
  std::vector<float> f(rot / 2);
  for (int i = 0; i < rot / 2; ++i) f[i] = 1.0f / std::pow(theta, (float)(2 * i) / (float)rot);
  return f;
}

// A quiet BF16 NaN: fills cache slots no context reaches, so a read past a
// sequence's keys shows in the output (attn_check, prefill_check).
static const uint16_t kBf16NaN = 0x7fc0;

// Fast normal-ish samples for bulk data (sum of 4 uniforms, unit variance).
// Busy-waits about ns nanoseconds on the GPU (a kernel that finishes late, so
// that a dependent launched early would show a read that came too soon).
static __device__ __forceinline__ void spin_for_ns(long long ns) {
  if (ns <= 0) return;
  uint64_t t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while ((long long)(t - t0) < ns);
}

struct FastRng {
  uint64_t s;
  uint64_t next() { return mix64(s += 0x9E3779B97F4A7C15ull); }
  float nrm() {
    const uint64_t z = next();
    float t = 0;
    for (int i = 0; i < 4; ++i) t += (float)((z >> (16 * i)) & 0xffff) * (1.0f / 65536.0f);
    return (t - 2.0f) * 1.7320508f;
  }
};

// Device fill of n BF16 values in [-2, 2) from a seed (benches: the values do
// not matter, the host fill would be slow at long contexts).
static __global__ void fill_bf16_kernel(uint16_t* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const uint64_t z = mix64(seed + i * 0x9E3779B97F4A7C15ull);
    const float v = ((float)(z & 0xffff) / 65536.0f - 0.5f) * 4.0f;
    p[i] = __bfloat16_as_ushort(__float2bfloat16(v));
  }
}

// E4M3 codes of ~N(0, 2) values (sum of four uniforms), from a counter-based
// hash: gigabytes of FP8 weights without a host round trip (moe_decode_check,
// attn_layer_check).
static __global__ void fill_e4m3_normal_kernel(uint8_t* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const uint64_t z = mix64(seed + i);
    float v = 0.f;
    for (int k = 0; k < 4; ++k) v += (float)((z >> (16 * k)) & 0xffff) * (1.0f / 65536.0f);
    p[i] = (uint8_t)__nv_cvt_float_to_fp8(2.0f * 1.7320508f * (v - 2.0f), __NV_SATFINITE, __NV_E4M3);
  }
}

// ------------------------------------------------------------ device buffers

// The byte Dev<T>::poison() fills with by default: 0xff (NaN for floats, 0xff
// for bytes, -1 for ints). A program may specialize it before its first
// poison() (small_check: 0x7f for 4-byte ints, where -1 is a real id).
template <typename T, typename = void>
struct PoisonByte {
  static constexpr int value = 0xff;
};

template <typename T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  Dev() = default;
  explicit Dev(size_t count) : n(count) { CK(cudaMalloc(&p, std::max<size_t>(1, n) * sizeof(T))); }
  Dev(const std::vector<T>& h) : Dev(h.size()) { up(h); }
  ~Dev() {
    if (p) cudaFree(p);
  }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  void up(const std::vector<T>& h) {
    CK(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> down() const {
    std::vector<T> h(n);
    CK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  void poison(int byte = PoisonByte<T>::value) {
    CK(cudaMemset(p, byte, std::max<size_t>(1, n) * sizeof(T)));
  }
  void zero() { CK(cudaMemset(p, 0, std::max<size_t>(1, n) * sizeof(T))); }
};

// ------------------------------------------------------------ result table

struct Row {
  std::string name, detail;
  double err, tol;
  bool ok;
};
static std::vector<Row> table;

static inline double rel_err(const std::vector<double>& out, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(out[i])) return NAN;
    num += (out[i] - ref[i]) * (out[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}
// One check: a row of the table and a line "name detail err=... tol=... ok|FAIL".
static inline void report(const std::string& name, const std::string& detail, double err, double tol) {
  const bool ok = std::isfinite(err) && err <= tol;
  table.push_back({name, detail, err, tol, ok});
  printf("%-*s %-*s err=%.3e tol=%.1e %s\n", CHECK_NAME_W, name.c_str(), CHECK_DETAIL_W, detail.c_str(), err,
         tol, ok ? "ok" : "FAIL");
  fflush(stdout);
}
static inline std::string fmt(const char* f, ...) {
  char b[512];
  va_list ap;
  va_start(ap, f);
  vsnprintf(b, sizeof b, f, ap);
  va_end(ap);
  return b;
}
static inline int failed_checks() {
  int fails = 0;
  for (auto& r : table) fails += !r.ok;
  return fails;
}
// The table again, one line per check, err_head above the error column.
static inline void print_table(const char* err_head) {
  printf("\n%-*s %-*s %10s %8s\n", CHECK_NAME_W, "kernel", CHECK_DETAIL_W, "case", err_head, "result");
  for (auto& r : table)
    printf("%-*s %-*s %10.2e %8s\n", CHECK_NAME_W, r.name.c_str(), CHECK_DETAIL_W, r.detail.c_str(), r.err,
           r.ok ? "ok" : "FAIL");
}
// The line the GPU scripts grep: "prog: N checks, M failed".
static inline void print_summary(const char* prog, int fails) {
  printf("%s: %zu checks, %d failed\n", prog, table.size(), fails);
}

// ------------------------------------------------------------ phase stamps

// The phase table of a one-launch layer's bench (moe_decode_check,
// attn_layer_check): t[i * ctas + c] is CTA c's %globaltimer at phase i (0:
// not reached); per phase the CTAs that reached it and min / median / max
// microseconds from the first CTA's start.
static inline void print_phases(const std::vector<unsigned long long>& t, int ctas, const char* const* names,
                                int n_phases) {
  unsigned long long t0 = ~0ull;
  for (int c = 0; c < ctas; ++c)
    if (t[c]) t0 = std::min(t0, t[c]);
  for (int i = 0; i < n_phases; ++i) {
    std::vector<double> v;
    for (int c = 0; c < ctas; ++c)
      if (t[(size_t)i * ctas + c]) v.push_back((t[(size_t)i * ctas + c] - t0) * 1e-3);
    if (v.empty()) continue;
    std::sort(v.begin(), v.end());
    printf("phase %-22s CTAs %3zu  min %6.2f  median %6.2f  max %6.2f us\n", names[i], v.size(), v.front(),
           v[v.size() / 2], v.back());
  }
}

// ------------------------------------------------------------ timing

// The median over r < reps of the milliseconds between two events recorded
// on stream s around body(r).
template <typename F>
static float median_ms(int reps, cudaStream_t s, F body) {
  std::vector<float> t;
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int r = 0; r < reps; ++r) {
    CK(cudaEventRecord(a, s));
    body(r);
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// f(i, s) for i < launches captured in one CUDA graph on a new stream s, after
// `warm` plain calls f(i, s), i < warm, and `warm_replays` replays of the
// graph: the median of `reps` replays, in milliseconds per replay.
template <typename F>
static float graph_replay_ms(F f, int launches, int reps, int warm, int warm_replays) {
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (int i = 0; i < warm; ++i) f(i, s);
  CK(cudaStreamSynchronize(s));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < launches; ++i) f(i, s);
  CK(cudaStreamEndCapture(s, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < warm_replays; ++i) CK(cudaGraphLaunch(exec, s));
  CK(cudaStreamSynchronize(s));
  const float ms = median_ms(reps, s, [&](int) { CK(cudaGraphLaunch(exec, s)); });
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  CK(cudaStreamDestroy(s));
  return ms;
}
