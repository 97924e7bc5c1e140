// api.cu — the C ABI of glmrt.h: argument checks, the thread-local last error,
// and exception containment (nothing C++ escapes into the caller).
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <new>

#include "engine.h"

struct glmrt_engine {
  glmrt::Engine e;
};

namespace glmrt {

namespace {
thread_local std::string g_last_error;
}

void set_error(const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  g_last_error = buf;
}

int fail(int code, const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  g_last_error = buf;
  return code;
}

int check_cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return GLMRT_OK;
  cudaGetLastError();  // clear a non-sticky error
  const int code = e == cudaErrorMemoryAllocation ? GLMRT_ERR_OOM : GLMRT_ERR_CUDA;
  return fail(code, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

}  // namespace glmrt

using glmrt::fail;

namespace {

template <typename F>
int guarded(F f) {
  glmrt::g_last_error.clear();
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return fail(GLMRT_ERR_OOM, "host memory exhausted");
  } catch (const std::exception& ex) {
    return fail(GLMRT_ERR_INVALID, "internal error: %s", ex.what());
  } catch (...) {
    return fail(GLMRT_ERR_INVALID, "internal error: unknown exception");
  }
}

}  // namespace

extern "C" {

int glmrt_abi_version(void) { return GLMRT_ABI_VERSION; }

const char* glmrt_last_error(void) { return glmrt::g_last_error.c_str(); }

int glmrt_device_count(int32_t* out) {
  return guarded([&] {
    if (!out) return fail(GLMRT_ERR_INVALID, "glmrt_device_count: out is NULL");
    *out = 0;
    int n = 0;
    GLMRT_CUDA(cudaGetDeviceCount(&n), "cudaGetDeviceCount");
    *out = n;
    return GLMRT_OK;
  });
}

int glmrt_engine_create(const glmrt_model_config* config, const glmrt_engine_options* options,
                        glmrt_engine** out) {
  return guarded([&] {
    if (!out) return fail(GLMRT_ERR_INVALID, "glmrt_engine_create: out is NULL");
    *out = nullptr;
    if (!config || !options)
      return fail(GLMRT_ERR_INVALID, "glmrt_engine_create: config and options are required");
    auto* h = new glmrt_engine();
    h->e.cfg = *config;
    h->e.opt = *options;
    int rc = glmrt::create_engine(h->e);
    if (rc == GLMRT_OK) rc = glmrt::build_expected_names(h->e);
    if (rc != GLMRT_OK) {
      std::string msg = glmrt_last_error();
      glmrt::destroy_engine(h->e);
      delete h;
      glmrt::set_error("%s", msg.c_str());
      return rc;
    }
    *out = h;
    return GLMRT_OK;
  });
}

int glmrt_get_info(const glmrt_engine* engine, glmrt_info* out) {
  return guarded([&] {
    if (!engine || !out) return fail(GLMRT_ERR_INVALID, "glmrt_get_info: engine and out are required");
    const glmrt::Engine& e = engine->e;
    memset(out, 0, sizeof *out);
    out->abi_version = GLMRT_ABI_VERSION;
    out->tensor_parallel = e.tp;
    out->kv_block_size = e.block_size;
    out->num_kv_blocks = e.num_blocks;
    out->max_tokens_per_step = e.max_tokens;
    out->max_seqs_per_step = e.max_seqs;
    out->max_blocks_per_seq = e.max_blocks_per_seq;
    out->max_top_logprobs = GLMRT_MAX_TOP_LOGPROBS;
    out->max_penalty_entries = e.max_pen;
    out->vocab_size = e.cfg.vocab_size;
    out->max_draft_tokens = e.draft_k;
    out->weight_bytes = e.ranks[0].weight_bytes;
    out->kv_bytes = e.ranks[0].kv_bytes;
    out->workspace_bytes = e.ranks[0].workspace_bytes;
    snprintf(out->device_name, sizeof out->device_name, "%s", e.device_name.c_str());
    return GLMRT_OK;
  });
}

int glmrt_load_tensor(glmrt_engine* engine, const char* name, int32_t dtype, const int64_t* shape,
                      int32_t ndim, const void* data, uint64_t nbytes) {
  return guarded([&] {
    if (!engine || !name) return fail(GLMRT_ERR_INVALID, "glmrt_load_tensor: engine and name are required");
    if (engine->e.finalized)
      return fail(GLMRT_ERR_STATE, "tensor %s: the engine is already finalized", name);
    if (ndim < 0 || ndim > 4 || (ndim > 0 && !shape))
      return fail(GLMRT_ERR_INVALID, "tensor %s: ndim %d not in 0..4 (or shape NULL)", name, ndim);
    if (!data && nbytes > 0) return fail(GLMRT_ERR_INVALID, "tensor %s: data is NULL", name);
    return glmrt::load_tensor(engine->e, name, dtype, shape, ndim, data, nbytes);
  });
}

int glmrt_finalize(glmrt_engine* engine) {
  return guarded([&] {
    if (!engine) return fail(GLMRT_ERR_INVALID, "glmrt_finalize: engine is NULL");
    if (engine->e.finalized) return GLMRT_OK;
    GLMRT_TRY(glmrt::check_complete(engine->e));
    engine->e.finalized = true;
    return GLMRT_OK;
  });
}

int glmrt_step(glmrt_engine* engine, const glmrt_batch* batch, glmrt_result* result) {
  return guarded([&] {
    if (!engine || !batch || !result)
      return fail(GLMRT_ERR_INVALID, "glmrt_step: engine, batch and result are required");
    if (!engine->e.finalized)
      return fail(GLMRT_ERR_STATE, "glmrt_step: call glmrt_finalize after loading the weights first");
    return glmrt::run_step(engine->e, *batch, *result);
  });
}

int glmrt_step_begin(glmrt_engine* engine, const glmrt_batch* batch) {
  return guarded([&] {
    if (!engine || !batch) return fail(GLMRT_ERR_INVALID, "glmrt_step_begin: engine and batch are required");
    if (!engine->e.finalized)
      return fail(GLMRT_ERR_STATE, "glmrt_step_begin: call glmrt_finalize after loading the weights first");
    return glmrt::step_begin(engine->e, *batch);
  });
}

int glmrt_step_finish(glmrt_engine* engine, const uint32_t* token_masks, glmrt_result* result) {
  return guarded([&] {
    if (!engine || !result) return fail(GLMRT_ERR_INVALID, "glmrt_step_finish: engine and result are required");
    return glmrt::step_finish(engine->e, token_masks, *result);
  });
}

int glmrt_synthesize(glmrt_engine* engine, uint64_t seed) {
  return guarded([&] {
    if (!engine) return fail(GLMRT_ERR_INVALID, "glmrt_synthesize: engine is NULL");
    if (engine->e.finalized)
      return fail(GLMRT_ERR_STATE, "glmrt_synthesize: the engine is already finalized");
    GLMRT_TRY(glmrt::synthesize(engine->e, seed));
    return glmrt::fill_kv_random(engine->e, seed);
  });
}

int glmrt_profile_enable(glmrt_engine* engine, int32_t on) {
  return guarded([&] {
    if (!engine) return fail(GLMRT_ERR_INVALID, "glmrt_profile_enable: engine is NULL");
    if (on != 0 && on != 1) return fail(GLMRT_ERR_INVALID, "glmrt_profile_enable: on %d must be 0 or 1", on);
    return glmrt::profile_enable(engine->e, on == 1);
  });
}

int glmrt_profile_read(glmrt_engine* engine, glmrt_profile* out, int32_t reset) {
  return guarded([&] {
    if (!engine || !out) return fail(GLMRT_ERR_INVALID, "glmrt_profile_read: engine and out are required");
    return glmrt::profile_read(engine->e, *out, reset != 0);
  });
}

void glmrt_engine_destroy(glmrt_engine* engine) {
  if (!engine) return;
  try {
    glmrt::destroy_engine(engine->e);
  } catch (...) {
  }
  delete engine;
}

}  // extern "C"
