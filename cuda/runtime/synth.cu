// synth.cu — synthetic weights generated on the GPU(s) (glmrt_synthesize,
// docs/synthetic.md): every tensor the forward needs, filled with exactly the
// values pkg/synth (Go) writes for the same config and seed, straight into the
// runtime's fused / sharded device layouts (place_piece in weights.cu, which
// load_tensor follows too: q|k|v and gate|up fusion, o_proj / dense down
// column slices and lm_head row slices for tensor parallelism, experts in
// their owners' groups, BF16 -> FP32 for norms, biases and the router). No
// weight byte crosses the host link.
//
// The MTP layer (draft_tokens > 0 only) follows the same rules: its decoder
// layer's tensors as any layer's, enorm / hnorm / shared_head.norm as norms,
// eh_proj as a Gaussian BF16 projection of fan-in 2H. pkg/synth does not write
// it (`glmctl synth` checkpoints have no MTP layer), so a synthetic draft model
// exists on the GPU only; its proposals are random, and it serves to time the
// draft pass and verify steps at full size.
//
// The seed is the effective seed (pkg/synth Spec.EffectiveSeed: the Go side
// has already combined the user's seed with the rank); it is used as is.
//
// Bit-identity with Go: every value is integer arithmetic on a 64-bit hash
// plus at most one IEEE float32 multiply (__fmul_rn: never contracted into an
// FMA), then integer BF16 rounding; the per-tensor constants are computed on
// the host in double, as Go does. A change here needs the same change in
// pkg/synth/gen.go (and its golden hashes).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "engine.h"

namespace glmrt {
namespace {

// ---- the generator (docs/synthetic.md §3) ----

constexpr uint64_t kGamma = 0x9E3779B97F4A7C15ull;

// Generator kinds, numbered as pkg/synth.Kind.
enum GenKind : int { kGenFp8 = 0, kGenScale = 1, kGenGaussBF16 = 2, kGenGaussF32 = 3, kGenNorm = 4 };

// e4m3Normal of pkg/synth/gen.go: F8_E4M3 codes of 256 Gaussian quantiles
// with extremes +-448.
#define GLMRT_E4M3_NORMAL                                                                         \
  {                                                                                               \
    0xFE, 0xFC, 0xFB, 0xFB, 0xFA, 0xFA, 0xF9, 0xF9, 0xF9, 0xF9, 0xF8, 0xF8, 0xF8, 0xF8, 0xF7, 0xF7, \
    0xF7, 0xF6, 0xF6, 0xF6, 0xF6, 0xF5, 0xF5, 0xF5, 0xF5, 0xF4, 0xF4, 0xF4, 0xF4, 0xF4, 0xF3, 0xF3, \
    0xF3, 0xF3, 0xF3, 0xF3, 0xF2, 0xF2, 0xF2, 0xF2, 0xF2, 0xF2, 0xF1, 0xF1, 0xF1, 0xF1, 0xF1, 0xF1, \
    0xF1, 0xF0, 0xF0, 0xF0, 0xF0, 0xF0, 0xEF, 0xEF, 0xEF, 0xEF, 0xEE, 0xEE, 0xEE, 0xEE, 0xED, 0xED, \
    0xED, 0xED, 0xEC, 0xEC, 0xEC, 0xEC, 0xEC, 0xEB, 0xEB, 0xEB, 0xEB, 0xEA, 0xEA, 0xEA, 0xEA, 0xEA, \
    0xE9, 0xE9, 0xE9, 0xE9, 0xE9, 0xE8, 0xE8, 0xE8, 0xE7, 0xE7, 0xE7, 0xE6, 0xE6, 0xE5, 0xE5, 0xE5, \
    0xE4, 0xE4, 0xE3, 0xE3, 0xE3, 0xE2, 0xE2, 0xE1, 0xE1, 0xE1, 0xE0, 0xE0, 0xDF, 0xDE, 0xDD, 0xDD, \
    0xDC, 0xDB, 0xDA, 0xDA, 0xD9, 0xD8, 0xD6, 0xD5, 0xD3, 0xD2, 0xD0, 0xCE, 0xCB, 0xC7, 0xC1, 0xB4, \
    0x34, 0x41, 0x47, 0x4B, 0x4E, 0x50, 0x52, 0x53, 0x55, 0x56, 0x58, 0x59, 0x5A, 0x5A, 0x5B, 0x5C, \
    0x5D, 0x5D, 0x5E, 0x5F, 0x60, 0x60, 0x61, 0x61, 0x61, 0x62, 0x62, 0x63, 0x63, 0x63, 0x64, 0x64, \
    0x65, 0x65, 0x65, 0x66, 0x66, 0x67, 0x67, 0x67, 0x68, 0x68, 0x68, 0x69, 0x69, 0x69, 0x69, 0x69, \
    0x6A, 0x6A, 0x6A, 0x6A, 0x6A, 0x6B, 0x6B, 0x6B, 0x6B, 0x6C, 0x6C, 0x6C, 0x6C, 0x6C, 0x6D, 0x6D, \
    0x6D, 0x6D, 0x6E, 0x6E, 0x6E, 0x6E, 0x6F, 0x6F, 0x6F, 0x6F, 0x70, 0x70, 0x70, 0x70, 0x70, 0x71, \
    0x71, 0x71, 0x71, 0x71, 0x71, 0x71, 0x72, 0x72, 0x72, 0x72, 0x72, 0x72, 0x73, 0x73, 0x73, 0x73, \
    0x73, 0x73, 0x74, 0x74, 0x74, 0x74, 0x74, 0x75, 0x75, 0x75, 0x75, 0x76, 0x76, 0x76, 0x76, 0x77, \
    0x77, 0x77, 0x78, 0x78, 0x78, 0x78, 0x79, 0x79, 0x79, 0x79, 0x7A, 0x7A, 0x7B, 0x7B, 0x7C, 0x7E  \
  }
__constant__ uint8_t kE4M3NormalDev[256] = GLMRT_E4M3_NORMAL;
[[maybe_unused]] const uint8_t kE4M3NormalHost[256] = GLMRT_E4M3_NORMAL;  // host-side checks
#undef GLMRT_E4M3_NORMAL

// Normalisers and gains (pkg/synth/gen.go: scaleNorm, gaussNorm, Gain*).
constexpr double kScaleNorm = 173.4;
constexpr double kGaussNorm = 209.0;
constexpr double kGainEmbed = 0.5;
constexpr double kGainLMHead = 3.0;
constexpr double kGainRouter = 1.5;
constexpr double kGainCorrection = 0.001;
constexpr double kGainBias = 0.05;
constexpr double kGainProj = 1.0;
constexpr double kGainOProj = 0.25;
constexpr double kGainDenseDown = 0.15;
constexpr double kGainExpertDown = 0.06;
constexpr double kGainSharedDown = 0.10;

float scale_base(double gain, int64_t fan_in) {
  return (float)(gain / (kScaleNorm * std::sqrt((double)fan_in)));
}
float gauss_step(double gain, int64_t fan_in) {
  return (float)(gain / (kGaussNorm * std::sqrt((double)fan_in)));
}

// FNV-1a-64 of the name's bytes.
uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001B3ull;
  }
  return h;
}

__host__ __device__ inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The sum of h's 8 bytes minus 1020 (Irwin-Hall, in [-1020, 1020]).
__host__ __device__ inline int32_t ih_sum(uint64_t h) {
  uint64_t x = (h & 0x00FF00FF00FF00FFull) + ((h >> 8) & 0x00FF00FF00FF00FFull);
  x = (x & 0x0000FFFF0000FFFFull) + ((x >> 16) & 0x0000FFFF0000FFFFull);
  x = (x & 0xFFFFFFFFull) + (x >> 32);
  return (int32_t)x - 1020;
}

__host__ __device__ inline uint32_t f32_bits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
#endif
}

__host__ __device__ inline float bits_f32(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, 4);
  return f;
#endif
}

// One float32 multiply, rounded to nearest even, never fused.
__host__ __device__ inline float mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  volatile float r = a * b;
  return r;
#endif
}

__host__ __device__ inline uint16_t bf16_rne(uint32_t u) {
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// One generation job: n elements of a device buffer. Element t of the buffer
// is element src_off + (t / w) * src_ld + t % w (row-major index) of the
// checkpoint tensor whose stream key is key.
struct Job {
  void* dst;
  int kind, store;  // GenKind; how a value is stored in the buffer (DevElem, engine.h)
  uint64_t key;
  float param;
  int64_t n, w, src_ld, src_off;
};

__host__ __device__ inline void gen_store(const Job& j, int64_t t, const uint8_t* table) {
  const int64_t i = j.w >= j.n ? j.src_off + t : j.src_off + (t / j.w) * j.src_ld + t % j.w;
  const uint64_t h = mix64(j.key + (uint64_t)(i + 1) * kGamma);
  uint32_t bf;  // BF16 bits of the value (kinds that make BF16)
  switch (j.kind) {
    case kGenFp8:
      static_cast<uint8_t*>(j.dst)[t] = table[h >> 56];
      return;
    case kGenScale:
      static_cast<float*>(j.dst)[t] = mul_rn(j.param, bits_f32(0x3F800000u | (uint32_t)(h >> 43)));
      return;
    case kGenGaussF32:
      static_cast<float*>(j.dst)[t] = mul_rn((float)ih_sum(h), j.param);
      return;
    case kGenGaussBF16:
      bf = bf16_rne(f32_bits(mul_rn((float)ih_sum(h), j.param)));
      break;
    default:  // kGenNorm
      bf = 0x3F80u + (uint32_t)(h >> 60) - 8u;
      break;
  }
  if (j.store == kElemBF16)
    static_cast<uint16_t*>(j.dst)[t] = (uint16_t)bf;
  else
    static_cast<float*>(j.dst)[t] = bits_f32(bf << 16);
}

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) synth_kernel(Job j) {
  __shared__ uint8_t table[256];
  for (int i = threadIdx.x; i < 256; i += blockDim.x) table[i] = kE4M3NormalDev[i];
  __syncthreads();
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < j.n; t += stride)
    gen_store(j, t, table);
}

// ---- jobs: where each checkpoint tensor goes (place_piece, as load_tensor) ----

struct Gen {
  int kind;
  float param;
};

// The generator of a piece: its kind and constant (pkg/synth Tensors).
Gen piece_gen(const Engine& e, const Piece& pc) {
  const Dims& d = e.d;
  switch (pc.role) {
    case Role::Embed: return {kGenGaussBF16, gauss_step(kGainEmbed, 1)};
    case Role::LmHead: return {kGenGaussBF16, gauss_step(kGainLMHead, d.H)};
    case Role::RouterW: return {kGenGaussBF16, gauss_step(kGainRouter, d.H)};
    case Role::RouterB: return {kGenGaussF32, gauss_step(kGainCorrection, 1)};
    case Role::QB:
    case Role::KB:
    case Role::VB: return {kGenGaussBF16, gauss_step(kGainBias, 1)};
    case Role::MtpEhProj: return {kGenGaussBF16, gauss_step(kGainProj, 2 * (int64_t)d.H)};
    case Role::MtpENorm:
    case Role::MtpHNorm:
    case Role::MtpHeadNorm:
    case Role::FinalNorm:
    case Role::InNorm:
    case Role::PostNorm:
    case Role::QNorm:
    case Role::KNorm: return {kGenNorm, 0.0f};
    case Role::QS:
    case Role::KS:
    case Role::VS:
    case Role::DGateS:
    case Role::DUpS:
    case Role::EGateS:
    case Role::EUpS: return {kGenScale, scale_base(kGainProj, d.H)};
    case Role::OS: return {kGenScale, scale_base(kGainOProj, (int64_t)d.nq * d.D)};
    case Role::DDownS: return {kGenScale, scale_base(kGainDenseDown, d.I)};
    case Role::EDownS:
      return {kGenScale, scale_base(pc.expert == d.E ? kGainSharedDown : kGainExpertDown, d.MI)};
    default: return {kGenFp8, 0.0f};  // every .weight of a linear
  }
}

struct RankJob {
  int rank;
  Job job;
};

// Adds the jobs of one piece, exactly where load_tensor would put its data.
int plan_piece(Engine& e, const std::string& name, const Piece& pc, uint64_t seed,
               std::vector<RankJob>& jobs) {
  const Gen g = piece_gen(e, pc);
  const uint64_t key = mix64(seed ^ fnv1a64(name));
  for (int r = 0; r < (int)e.ranks.size(); ++r) {
    Placement p;
    bool held;
    GLMRT_TRY(place_piece(e, pc, name.c_str(), r, p, held));
    if (held) jobs.push_back({r, Job{p.dst, g.kind, p.elem, key, g.param, p.n, p.w, p.src_ld, p.src_off}});
  }
  return GLMRT_OK;
}

// Every job of the engine, grouped by rank (the order within a rank is the
// pieces' order, so the launches are reproducible).
int plan_jobs(Engine& e, uint64_t seed, std::vector<RankJob>& jobs,
              std::vector<std::string>* job_names) {
  std::vector<const std::string*> names(e.pieces.size(), nullptr);
  for (const auto& kv : e.names) names[kv.second] = &kv.first;
  for (size_t i = 0; i < e.pieces.size(); ++i) {
    const Piece& pc = e.pieces[i];
    if (pc.role == Role::MtpSkip) continue;
    if (!names[i]) return fail(GLMRT_ERR_INVALID, "synthesize: piece %zu has no name", i);
    if (pc.loaded)
      return fail(GLMRT_ERR_STATE,
                  "glmrt_synthesize: tensor %s was already loaded; synthesize replaces "
                  "glmrt_load_tensor and must come first",
                  names[i]->c_str());
    const size_t before = jobs.size();
    GLMRT_TRY(plan_piece(e, *names[i], pc, seed, jobs));
    if (job_names)
      for (size_t k = before; k < jobs.size(); ++k) job_names->push_back(*names[i]);
  }
  return GLMRT_OK;
}

}  // namespace

int synthesize(Engine& e, uint64_t seed) {
  std::vector<RankJob> jobs;
  std::vector<std::string> job_names;
  GLMRT_TRY(plan_jobs(e, seed, jobs, &job_names));
  int current = -1;
  for (size_t k = 0; k < jobs.size(); ++k) {
    const RankJob& rj = jobs[k];
    Rank& r = e.ranks[rj.rank];
    if (rj.job.n <= 0) continue;
    if (rj.rank != current) {
      GLMRT_CUDA(cudaSetDevice(r.device), "cudaSetDevice");
      current = rj.rank;
    }
    const int64_t want = (rj.job.n + kThreads - 1) / kThreads;
    const int blocks = (int)std::min<int64_t>(want, (int64_t)std::max(r.num_sms, 1) * 16);
    synth_kernel<<<blocks, kThreads, 0, r.stream>>>(rj.job);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess)
      return fail(GLMRT_ERR_CUDA, "synthesize: tensor %s on GPU %d: %s", job_names[k].c_str(),
                  r.device, cudaGetErrorString(err));
  }
  for (Rank& r : e.ranks) {
    GLMRT_CUDA(cudaSetDevice(r.device), "cudaSetDevice");
    const cudaError_t err = cudaStreamSynchronize(r.stream);
    if (err != cudaSuccess) {
      cudaGetLastError();
      return fail(GLMRT_ERR_CUDA, "synthesize: GPU %d: %s", r.device, cudaGetErrorString(err));
    }
  }
  for (Piece& pc : e.pieces)
    if (pc.role != Role::MtpSkip) pc.loaded = true;
  return GLMRT_OK;
}

}  // namespace glmrt
