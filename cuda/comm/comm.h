// comm.h — NCCL collectives for tensor/expert parallelism (docs/cuda.md, Many GPUs): one
// communicator per GPU, sum all-reduce of the partial sub-layer outputs, and
// the all-gather of vocab-parallel logits. Written for any number of GPUs of
// one process (ncclCommInitAll, one thread driving all ranks through NCCL
// group calls); spanning nodes later means ncclCommInitRank with a unique id
// exchanged out of band, with the same collective calls.
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <vector>

namespace glmc {

struct Comm {
  std::vector<void*> comms;  // ncclComm_t per rank (opaque here)
  int size() const { return (int)comms.size(); }
};

// Creates communicators for devices[0..n). Keeps NVLink multicast off
// (NCCL_NVLS_ENABLE=0 unless already set). Returns "" or an error naming the call.
std::string comm_init(Comm& c, const std::vector<int>& devices);
void comm_destroy(Comm& c);

// In place: bufs[r][0..count) = sum over ranks, on streams[r].
std::string allreduce_sum_f32(Comm& c, float* const* bufs, size_t count,
                              const cudaStream_t* streams);
// recv[r] = concat over ranks q of send[q][0..count), on streams[r].
std::string allgather_f32(Comm& c, const float* const* send, float* const* recv, size_t count,
                          const cudaStream_t* streams);

}  // namespace glmc
