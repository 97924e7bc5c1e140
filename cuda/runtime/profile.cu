// profile.cu — GPU time per kernel family of a step (glmrt_profile_*).
//
// While profiling, the step records a CUDA event on GPU 0's stream before its
// first launch and after every launch, each tagged with the family
// (GLMRT_PROF_*) of the launch it closes; after the step's sync the time
// between consecutive events is added to that family. Decode steps that run
// as CUDA graphs are captured once more with the events inside (external
// event-record nodes), so their timing has no host launch gaps in it; eager
// steps record into a reusable pool, and where the host launches slower than
// the GPU runs, the gap lands in the next launch's family. The bytes each
// family must move come from the step (step.cu), not from the hardware.
#include <cstring>

#include "engine.h"

namespace glmrt {
namespace {

__global__ void count_active_kernel(const int* __restrict__ offsets, int groups,
                                    int* __restrict__ counts, int layer) {
  int n = 0;
  for (int g = threadIdx.x; g < groups; g += blockDim.x) n += offsets[g + 1] > offsets[g];
  for (int o = 16; o > 0; o >>= 1) n += __shfl_xor_sync(0xffffffffu, n, o);
  if (threadIdx.x == 0) counts[layer] = n;
}

int new_event(cudaEvent_t* ev) {
  return check_cuda(cudaEventCreate(ev), "profile: cudaEventCreate");
}

}  // namespace

cudaError_t profile_count_active(const int* offsets, int groups, int* counts, int layer,
                                 cudaStream_t st) {
  count_active_kernel<<<1, 32, 0, st>>>(offsets, groups, counts, layer);
  return cudaGetLastError();
}

int profile_enable(Engine& e, bool on) {
  if (!e.finalized) return fail(GLMRT_ERR_STATE, "glmrt_profile_enable: finalize the engine first");
  e.prof.on = on;
  if (on) {
    memset(&e.prof.acc, 0, sizeof e.prof.acc);
  }
  return GLMRT_OK;
}

int profile_read(Engine& e, glmrt_profile& out, bool reset) {
  out = e.prof.acc;
  if (reset) memset(&e.prof.acc, 0, sizeof e.prof.acc);
  return GLMRT_OK;
}

int profile_begin(Engine& e, Rank& r, bool graph_step) {
  Profiler& p = e.prof;
  p.n = 0;
  p.graph_step = graph_step;
  if (!graph_step) {
    p.events = &p.pool;
    p.families = &p.eager_families;
    p.families->clear();
  }
  return profile_mark(e, r, -1);
}

// Records the next event. In a graph capture the event becomes a node of the
// graph (cudaEventRecordExternal); the graph's own event list grows the first
// time it is captured.
int profile_mark(Engine& e, Rank& r, int family) {
  Profiler& p = e.prof;
  if (!p.on || r.index != 0 || !p.events) return GLMRT_OK;
  if ((int)p.events->size() <= p.n) {
    cudaEvent_t ev;
    GLMRT_TRY(new_event(&ev));
    p.events->push_back(ev);
  }
  cudaEvent_t ev = (*p.events)[p.n];
  if (p.capturing)
    GLMRT_CUDA(cudaEventRecordWithFlags(ev, r.stream, cudaEventRecordExternal),
               "profile: record event in graph capture");
  else
    GLMRT_CUDA(cudaEventRecord(ev, r.stream), "profile: record event");
  if (p.n > 0) {
    if ((int)p.families->size() < p.n) p.families->push_back(family);
    else (*p.families)[p.n - 1] = family;
  }
  ++p.n;
  return GLMRT_OK;
}

int profile_end(Engine& e, const int64_t* bytes) {
  Profiler& p = e.prof;
  if (!p.on || !p.events || p.n < 2) return GLMRT_OK;
  glmrt_profile& a = p.acc;
  float total = 0;
  GLMRT_CUDA(cudaEventElapsedTime(&total, (*p.events)[0], (*p.events)[p.n - 1]),
             "profile: step time");
  for (int i = 1; i < p.n; ++i) {
    float ms = 0;
    GLMRT_CUDA(cudaEventElapsedTime(&ms, (*p.events)[i - 1], (*p.events)[i]),
               "profile: launch time");
    const int f = (*p.families)[i - 1];
    if (f < 0 || f >= GLMRT_PROF_N) continue;
    a.family_us[f] += ms * 1000.0;
    a.family_launches[f] += 1;
  }
  for (int f = 0; f < GLMRT_PROF_N; ++f) a.family_bytes[f] += bytes[f];
  a.step_us += total * 1000.0;
  a.steps += 1;
  a.graphs = p.graph_step ? 1 : 0;
  return GLMRT_OK;
}

void profile_destroy(Engine& e) {
  for (cudaEvent_t ev : e.prof.pool) cudaEventDestroy(ev);
  e.prof.pool.clear();
  for (auto* gs : {&e.step_graphs, &e.prof_graphs, &e.draft_graphs, &e.chain_graphs}) {
    for (StepGraph& g : *gs) {
      if (g.exec) cudaGraphExecDestroy(g.exec);
      for (cudaEvent_t ev : g.events) cudaEventDestroy(ev);
      g = StepGraph{};
    }
  }
}

}  // namespace glmrt
