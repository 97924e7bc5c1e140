// kernel_trace.c — a CUPTI injection library that records every kernel the
// process runs (graph nodes included) with its GPU start and end times, for a
// timeline of one decode step where nsys is not installed (the GPU machines
// have ncu only). Build (scripts/kernel-trace.sh does this):
//   cc -O2 -shared -fPIC -I<cupti>/include kernel_trace.c -L<cupti>/lib -l:libcupti.so.13 -o libkernel_trace.so
// Run: CUDA_INJECTION64_PATH=$PWD/libkernel_trace.so KERNEL_TRACE_OUT=trace.csv <program>
// Output: one CSV row per kernel: start_ns,end_ns,stream,graph_node,grid,block,smem,regs,name
// (name mangled). CUPTI hands the records over every 50 ms and at exit (a Go
// program's exit runs no atexit handlers: the last ~50 ms may be missing).
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static FILE* out;

#define CUPTI_OK(call)                                                        \
  do {                                                                        \
    CUptiResult r_ = (call);                                                  \
    if (r_ != CUPTI_SUCCESS) {                                                \
      const char* s_ = "?";                                                   \
      cuptiGetResultString(r_, &s_);                                          \
      fprintf(stderr, "kernel_trace: %s: %s\n", #call, s_);                   \
    }                                                                         \
  } while (0)

static void CUPTIAPI buffer_requested(uint8_t** buf, size_t* size, size_t* max_records) {
  *size = 1u << 20;
  *buf = (uint8_t*)aligned_alloc(8, *size);
  *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t* buf, size_t size, size_t valid) {
  (void)ctx;
  (void)stream;
  (void)size;
  CUpti_Activity* rec = NULL;
  while (cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
    const CUpti_ActivityKernel10* k = (const CUpti_ActivityKernel10*)rec;
    if (out)
      fprintf(out, "%llu,%llu,%u,%llu,%dx%dx%d,%dx%dx%d,%d,%u,%s\n", (unsigned long long)k->start,
              (unsigned long long)k->end, k->streamId, (unsigned long long)k->graphNodeId, k->gridX, k->gridY,
              k->gridZ, k->blockX, k->blockY, k->blockZ, k->dynamicSharedMemory + k->staticSharedMemory,
              (unsigned)k->registersPerThread, k->name ? k->name : "?");
  }
  free(buf);
  if (out) fflush(out);
}

static void finish(void) {
  cuptiActivityFlushAll(1);
  if (out) fclose(out);
  out = NULL;
}

int InitializeInjection(void) {
  const char* path = getenv("KERNEL_TRACE_OUT");
  out = fopen(path ? path : "kernel_trace.csv", "w");
  if (!out) {
    perror("kernel_trace: open output");
    return 0;
  }
  fprintf(out, "start_ns,end_ns,stream,graph_node,grid,block,smem,regs,name\n");
  CUPTI_OK(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
  CUPTI_OK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
  CUPTI_OK(cuptiActivityFlushPeriod(50));
  atexit(finish);
  return 1;
}
