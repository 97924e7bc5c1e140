// handoff_bench.cu — the latency of passing values between the CTAs of one
// persistent launch (handoff.cuh's tagged words and the alternatives), the
// primitive whose cost bounds the one-token decode launches (attn_layer_t1,
// moe_decode_t1: docs/perf.md, their phase tables).
//
// One CTA of 512 threads per SM, every CTA resident (cooperative launch).
// Every CTA waits delay_ns from its start (the grid's CTAs start within
// ~0.2 us of each other), so that what follows happens together on every SM:
// the CTAs given loads issue `load_kb` KB of streamed weight-like loads (a
// buffer far larger than L2), `producers` CTAs (the last ones) publish their
// words, and every CTA consumes every word. Each word carries its
// producer's %globaltimer (low 32 bits) at the publish, so a consumer knows
// the last publish time of what it read; the bench reports, per mode, the
// time from the last publish to each CTA having every word (after a CTA
// barrier): median over CTAs and launches, and the slowest CTA.
//
// load_who says which CTAs have load_kb KB of loads in flight across the
// hand-off (issued when the producers publish: consumers, producers before
// or after their stores), into registers (ld.global.nc, L2 evict-first, as
// the decode launches stream weights) or by the TMA engine into shared
// memory (load_tma). The cases are the decode launches' hand-offs: one row
// of 1,536 words from one CTA, 48 merge CTAs' 32 words each (attn_layer_t1's
// output row), 132 CTAs' 24 (moe_decode_t1's activations), 40 CTAs' 20 (its
// router partials). docs/perf.md (2026-11-28, tenth session) has a run.
//
//   handoff_bench            (prints a table; cuda/build.sh --tests builds it)
// check.cuh for CK (no checks are reported: the widths are its required ones).
#define CHECK_NAME_W 8
#define CHECK_DETAIL_W 8
#include "check.cuh"
#include "common.cuh"
#include "handoff.cuh"

namespace {

using namespace glmk;

constexpr int kThreads = 512;
constexpr int kMaxLoad = 16;  // uint4 a thread in flight (128 KB a CTA)

enum Mode {
  kPollAll = 0,    // every thread t1_poll4s its 4 words (handoff.cuh)
  kPollBackoff,    // the same, __nanosleep(backoff_ns) after a round that failed
  kFlagFirst,      // warp 0 polls each producer's last word, then every thread its 4
  kOneWarp,        // warp 0 polls every word (fewer requests a round), into shared memory
  kCounter,        // producers: plain stores, __syncthreads, fence + counter; consumers: thread 0
                   // polls the counter (acquire), then every thread reads its words once
  kModes
};
const char* kModeName[kModes] = {"poll all (t1_poll4)", "poll all + backoff", "flag first", "one warp polls",
                                 "fence + counter"};

struct HbArgs {
  unsigned long long* words;  // [producers * wpp] tagged words
  unsigned* counter;          // kCounter: producers arrived, this launch's slot
  unsigned long long* times;  // [G]: each CTA's done time; [G + b]: producer b's publish
  float* sink;                // keeps the streamed loads alive
  const uint8_t* stream;      // load_kb KB a CTA, distinct per CTA and launch
  int producers, wpp, mode, load_kb, load_who, load_tma, backoff_ns;
  unsigned epoch;
  long long delay_ns;
};
// load_who bits: which CTAs have load_kb KB of weight-like loads in flight
// during the hand-off, issued when the producers publish.
enum { kLoadConsumers = 1, kLoadProducersBefore = 2, kLoadProducersAfter = 4 };

__device__ __forceinline__ void hb_mbar_init(uint32_t bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void hb_mbar_expect(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void hb_mbar_wait0(uint32_t bar) {
  asm volatile(
      "{\n.reg .pred p;\nHB_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], 0;\n"
      "@p bra HB_DONE;\nbra HB_WAIT;\nHB_DONE:\n}\n" ::"r"(bar)
      : "memory");
}

__device__ __forceinline__ unsigned long long gtime() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void __launch_bounds__(kThreads, 1) hb_kernel(HbArgs a) {
  extern __shared__ __align__(128) unsigned char dyn[];
  __shared__ float4 s_words[2048];
  __shared__ unsigned s_max;
  __shared__ __align__(8) unsigned long long s_bar;
  const unsigned long long t0 = gtime();
  const int tid = threadIdx.x, G = gridDim.x, b = blockIdx.x;
  const int first_p = G - a.producers;
  const bool producer = b >= first_p;
  const int n = a.producers * a.wpp;  // words
  const uint64_t pol = l2_policy_stream();
  const uint32_t bar = (uint32_t)__cvta_generic_to_shared(&s_bar);
  if (tid == 0) {
    s_max = 0;
    hb_mbar_init(bar);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  // Every CTA waits for the same moment (see the top).
  while ((long long)(gtime() - t0) < a.delay_ns) {
  }
  uint4 ld[kMaxLoad];
  const int nld = a.load_kb * 1024 / (16 * kThreads);  // whole 8 KB steps into registers (60 KB: 56)
  auto issue_loads = [&]() {
    const uint8_t* p = a.stream + (size_t)b * a.load_kb * 1024;
    if (a.load_tma) {
      if (tid == 0) {
        const uint32_t bytes = (uint32_t)a.load_kb * 1024;
        hb_mbar_expect(bar, bytes);
        const uint32_t dst = (uint32_t)__cvta_generic_to_shared(dyn);
        for (uint32_t o = 0; o < bytes; o += 4096)
          asm volatile(
              "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], 4096, "
              "[%2], %3;" ::"r"(dst + o),
              "l"(p + o), "r"(bar), "l"(pol)
              : "memory");
      }
      return;
    }
#pragma unroll
    for (int i = 0; i < kMaxLoad; ++i)
      if (i < nld) ld[i] = ld_stream_v4(p + ((size_t)i * kThreads + tid) * 16, pol);
  };
  const bool loads = a.load_kb > 0 && (producer ? (a.load_who & (kLoadProducersBefore | kLoadProducersAfter)) != 0
                                                : (a.load_who & kLoadConsumers) != 0);
  if (loads && (!producer || (a.load_who & kLoadProducersBefore))) issue_loads();
  if (producer) {
    const int p = b - first_p;
    unsigned long long* w = a.words + (size_t)p * a.wpp;
    if (a.mode == kCounter) {
      const unsigned now = (unsigned)gtime();
      for (int i = tid; i < a.wpp; i += kThreads) w[i] = ((unsigned long long)a.epoch << 32) | now;
      __syncthreads();
      if (tid == 0) {
        __threadfence();
        atomicAdd(a.counter, 1u);
        a.times[G + p] = now;
      }
    } else {
      for (int i = tid; i < a.wpp / 4; i += kThreads) {
        const unsigned now = (unsigned)gtime();
        const unsigned long long v = ((unsigned long long)a.epoch << 32) | now;
        ulonglong2* d = reinterpret_cast<ulonglong2*>(w + 4 * i);
        d[0] = make_ulonglong2(v, v);
        d[1] = make_ulonglong2(v, v);
        if (i == 0) a.times[G + p] = now;
      }
    }
    if (loads && (a.load_who & kLoadProducersAfter)) issue_loads();
  }

  // Consume every word.
  unsigned mx = 0;
  if (a.mode == kPollAll || a.mode == kPollBackoff) {
    for (int i = tid; i < n / 4; i += kThreads) {
      const unsigned long long* p = a.words + 4 * i;
      unsigned long long v0, v1, v2, v3;
      for (;;) {
        asm volatile("ld.relaxed.gpu.global.v2.b64 {%0, %1}, [%2];" : "=l"(v0), "=l"(v1) : "l"(p) : "memory");
        asm volatile("ld.relaxed.gpu.global.v2.b64 {%0, %1}, [%2];" : "=l"(v2), "=l"(v3) : "l"(p + 2) : "memory");
        if ((unsigned)(v0 >> 32) == a.epoch && (unsigned)(v1 >> 32) == a.epoch && (unsigned)(v2 >> 32) == a.epoch &&
            (unsigned)(v3 >> 32) == a.epoch)
          break;
        if (a.mode == kPollBackoff) __nanosleep(a.backoff_ns);
      }
      mx = max(mx, max(max((unsigned)v0, (unsigned)v1), max((unsigned)v2, (unsigned)v3)));
    }
  } else if (a.mode == kFlagFirst) {
    if (tid < 32)
      for (int p = tid; p < a.producers; p += 32) (void)t1_poll(a.words + (size_t)p * a.wpp + a.wpp - 1, a.epoch);
    __syncthreads();
    for (int i = tid; i < n / 4; i += kThreads) {
      const float4 v = t1_poll4(a.words + 4 * i, a.epoch);
      mx = max(mx, max(max(__float_as_uint(v.x), __float_as_uint(v.y)), max(__float_as_uint(v.z), __float_as_uint(v.w))));
    }
  } else if (a.mode == kOneWarp) {
    if (tid < 32)
      for (int i = tid; i < n / 4; i += 32) s_words[i] = t1_poll4(a.words + 4 * i, a.epoch);
    __syncthreads();
    for (int i = tid; i < n / 4; i += kThreads) {
      const float4 v = s_words[i];
      mx = max(mx, max(max(__float_as_uint(v.x), __float_as_uint(v.y)), max(__float_as_uint(v.z), __float_as_uint(v.w))));
    }
  } else {  // kCounter
    if (tid == 0) {
      unsigned c;
      do {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(c) : "l"(a.counter) : "memory");
      } while (c < (unsigned)a.producers);
    }
    __syncthreads();
    for (int i = tid; i < n; i += kThreads) {
      const unsigned long long v = __ldcg(a.words + i);
      if ((unsigned)(v >> 32) != a.epoch) __trap();
      mx = max(mx, (unsigned)v);
    }
  }
  atomicMax(&s_max, mx);
  __syncthreads();
  const unsigned long long t1 = gtime();
  if (tid == 0) a.times[b] = ((unsigned long long)s_max << 32) | (unsigned)t1;
  if (loads) {
    float s = 0.f;
    if (a.load_tma) {
      hb_mbar_wait0(bar);
      s = reinterpret_cast<const float*>(dyn)[tid];
    } else {
#pragma unroll
      for (int i = 0; i < kMaxLoad; ++i)
        if (i < nld) s += __uint_as_float(ld[i].x ^ ld[i].y ^ ld[i].z ^ ld[i].w);
    }
    if (s == 1.2345f) a.sink[b * kThreads + tid] = s;
  }
}

struct Case {
  const char* what;
  int producers, wpp, mode, load_kb, load_who, load_tma, backoff_ns;
};

}  // namespace

int main() {
  int dev = 0, G = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&G, cudaDevAttrMultiProcessorCount, dev));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));
  printf("device %s, %d SMs\n", prop.name, G);
  const int kMaxWords = 8192;
  unsigned long long *words, *times;
  unsigned* counters;
  float* sink;
  uint8_t* stream;
  const int kLaunches = 60;
  const size_t stream_bytes = (size_t)kLaunches * G * 128 * 1024;  // distinct bytes every launch: no L2 hits
  CK(cudaMalloc(&words, kMaxWords * 8));
  CK(cudaMalloc(&times, (size_t)2 * G * 8));
  CK(cudaMalloc(&counters, 4096 * 4));
  CK(cudaMalloc(&sink, (size_t)G * kThreads * 4));
  CK(cudaMalloc(&stream, stream_bytes));
  CK(cudaMemset(words, 0, kMaxWords * 8));
  CK(cudaMemset(counters, 0, 4096 * 4));
  CK(cudaMemset(stream, 1, stream_bytes));
  // Force one CTA an SM (the decode launches' shape): most of the shared memory.
  const int smem = 160 * 1024;
  CK(cudaFuncSetAttribute(hb_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));

  const int C = kLoadConsumers, PB = kLoadProducersBefore, PA = kLoadProducersAfter;
  const Case cases[] = {
      {"1 producer x 4 words", 1, 4, kPollAll, 0, 0, 0, 0},
      {"1 producer x 4 words", 1, 4, kCounter, 0, 0, 0, 0},
      {"1 producer x 1536 words", 1, 1536, kPollAll, 0, 0, 0, 0},
      {"1 producer x 1536 words", 1, 1536, kOneWarp, 0, 0, 0, 0},
      {"1 producer x 1536 words", 1, 1536, kCounter, 0, 0, 0, 0},
      {"1 producer x 1536 words", 1, 1536, kPollBackoff, 0, 0, 0, 50},
      {"1 producer x 1536 words", 1, 1536, kPollBackoff, 0, 0, 0, 100},
      {"1 producer x 1536 words", 1, 1536, kPollBackoff, 0, 0, 0, 200},
      {"1 producer x 1536 words", 1, 1536, kFlagFirst, 0, 0, 0, 0},
      {"48 producers x 32 words", 48, 32, kPollAll, 0, 0, 0, 0},
      {"48 producers x 32 words", 48, 32, kPollBackoff, 0, 0, 0, 50},
      {"48 producers x 32 words", 48, 32, kPollBackoff, 0, 0, 0, 100},
      {"48 producers x 32 words", 48, 32, kPollBackoff, 0, 0, 0, 200},
      {"48 producers x 32 words", 48, 32, kFlagFirst, 0, 0, 0, 0},
      {"48 producers x 32 words", 48, 32, kOneWarp, 0, 0, 0, 0},
      {"48 producers x 32 words", 48, 32, kCounter, 0, 0, 0, 0},
      {"48 x 32, consumers load 60 KB", 48, 32, kPollAll, 60, C, 0, 0},
      {"48 x 32, consumers load 60 KB", 48, 32, kPollBackoff, 60, C, 0, 100},
      {"48 x 32, consumers TMA 60 KB", 48, 32, kPollAll, 60, C, 1, 0},
      {"48 x 32, producers load 60 KB before", 48, 32, kPollAll, 60, PB, 0, 0},
      {"48 x 32, producers load 60 KB after", 48, 32, kPollAll, 60, PA, 0, 0},
      {"48 x 32, producers TMA 60 KB after", 48, 32, kPollAll, 60, PA, 1, 0},
      {"48 x 32, all load 60 KB (after)", 48, 32, kPollAll, 60, C | PA, 0, 0},
      {"48 x 32, all load 60 KB (after)", 48, 32, kPollBackoff, 60, C | PA, 0, 100},
      {"48 x 32, all load 60 KB (after)", 48, 32, kCounter, 60, C | PA, 0, 0},
      {"48 x 32, all TMA 60 KB (after)", 48, 32, kPollAll, 60, C | PA, 1, 0},
      {"48 x 32, all TMA 120 KB (after)", 48, 32, kPollAll, 120, C | PA, 1, 0},
      {"132 producers x 24 words (acts)", G, 24, kPollAll, 0, 0, 0, 0},
      {"132 producers x 24 words (acts)", G, 24, kPollBackoff, 0, 0, 0, 100},
      {"132 producers x 24 words (acts)", G, 24, kFlagFirst, 0, 0, 0, 0},
      {"132 producers x 24 words (acts)", G, 24, kCounter, 0, 0, 0, 0},
      {"132 x 24, all load 60 KB (after)", G, 24, kPollAll, 60, PA, 0, 0},
      {"132 x 24, all TMA 60 KB (after)", G, 24, kPollAll, 60, PA, 1, 0},
      {"40 producers x 20 words (router)", 40, 20, kPollAll, 0, 0, 0, 0},
      {"40 producers x 20 words (router)", 40, 20, kPollBackoff, 0, 0, 0, 100},
  };
  unsigned epoch = 100;
  int counter_slot = 0;
  printf("%-38s %-22s %10s %10s %10s\n", "case", "mode", "median us", "p90 us", "max us");
  for (const Case& c : cases) {
    std::vector<double> lat, worst;
    for (int l = 0; l < kLaunches; ++l) {
      HbArgs a{};
      a.words = words;
      a.counter = counters + (counter_slot++ % 4096);
      a.times = times;
      a.sink = sink;
      a.stream = stream + (size_t)l * G * 128 * 1024;
      a.producers = c.producers;
      a.wpp = c.wpp;
      a.mode = c.mode;
      a.load_kb = c.load_kb;
      a.load_who = c.load_who;
      a.load_tma = c.load_tma;
      a.backoff_ns = c.backoff_ns;
      a.epoch = ++epoch;
      a.delay_ns = 8000;
      CK(launch_cooperative(hb_kernel, a, G, kThreads, smem, nullptr));
      CK(cudaDeviceSynchronize());
      if (l < 5) continue;  // warm-up
      std::vector<unsigned long long> t((size_t)2 * G);
      CK(cudaMemcpy(t.data(), times, t.size() * 8, cudaMemcpyDeviceToHost));
      unsigned pub = 0;
      for (int p = 0; p < c.producers; ++p) pub = std::max(pub, (unsigned)t[G + p]);
      double wl = 0;
      for (int b = 0; b < G; ++b) {
        const unsigned seen = (unsigned)(t[b] >> 32), done = (unsigned)t[b];
        const double d = (double)(int)(done - std::max(seen, pub)) * 1e-3;
        lat.push_back(d);
        wl = std::max(wl, d);
      }
      worst.push_back(wl);
    }
    std::sort(lat.begin(), lat.end());
    std::sort(worst.begin(), worst.end());
    const char* mode = kModeName[c.mode];
    char mb[48];
    if (c.mode == kPollBackoff) {
      snprintf(mb, sizeof mb, "%s %d ns", "backoff", c.backoff_ns);
      mode = mb;
    }
    printf("%-38s %-22s %10.2f %10.2f %10.2f\n", c.what, mode, lat[lat.size() / 2], lat[lat.size() * 9 / 10],
           worst[worst.size() / 2]);
  }
  return 0;
}
