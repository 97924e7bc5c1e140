/*
 * fake_glmrt.c — a test double of libglmcuda.so for pkg/backend/cuda's tests
 * (built with gcc in t.TempDir; no CUDA). It implements the ABI of
 * cuda/include/glmrt.h with checks instead of math:
 *   - every engine call must come from the OS thread that created the engine
 *     (GLMRT_ERR_STATE otherwise), and errors are kept in a thread-local
 *     string, as the real runtime does;
 *   - glmrt_load_tensor checks dtype/shape/nbytes and sums the bytes it is
 *     given; glmrt_get_info reports weight_bytes = bytes loaded,
 *     kv_bytes = tensors loaded and workspace_bytes = the byte sum, so the Go
 *     test can check that the right data arrived;
 *   - glmrt_step validates the flat batch like the real runtime must, and
 *     answers with values derived from its inputs (see the formulas below),
 *     so the Go test can check the conversion both ways.
 * FAKE_ABI_VERSION and FAKE_OMIT_STEP make the stale and incomplete variants.
 */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "glmrt.h"

#ifndef FAKE_ABI_VERSION
#define FAKE_ABI_VERSION GLMRT_ABI_VERSION
#endif

static __thread char last_err[512];

static int fail(int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_err, sizeof last_err, fmt, ap);
  va_end(ap);
  return rc;
}

static int ok(void) {
  last_err[0] = 0;
  return GLMRT_OK;
}

struct glmrt_engine {
  pthread_t owner;
  glmrt_model_config cfg;
  glmrt_engine_options opt;
  int64_t loaded_bytes, n_tensors;
  uint64_t byte_sum;
  int finalized;
  int synthesized;
  uint64_t seed;
  int profiling;
  int64_t profiled_steps;
  /* A step between glmrt_step_begin and glmrt_step_finish: a deep copy of
   * its batch (the caller's arrays are not kept past begin). */
  int pending;
  glmrt_batch pb;
  glmrt_seq *pseqs;
  int32_t *ptok, *ptab, *ppen;
};

static int pick(int32_t v, int32_t def) { return v > 0 ? v : def; }

int glmrt_abi_version(void) { return FAKE_ABI_VERSION; }

const char *glmrt_last_error(void) { return last_err; }

int glmrt_device_count(int32_t *out) {
  *out = 3;
  return ok();
}

static int same_thread(const glmrt_engine *e) {
  if (!pthread_equal(e->owner, pthread_self()))
    return fail(GLMRT_ERR_STATE, "fake: engine used from another OS thread");
  return GLMRT_OK;
}

int glmrt_engine_create(const glmrt_model_config *c, const glmrt_engine_options *o, glmrt_engine **out) {
  *out = NULL;
  if (c->hidden_size <= 0 || c->vocab_size <= 0 || c->num_hidden_layers <= 0 || c->head_dim != 128)
    return fail(GLMRT_ERR_INVALID, "fake: bad config (hidden_size %d, vocab_size %d, head_dim %d)", c->hidden_size,
                c->vocab_size, c->head_dim);
  for (int i = 0; i < (int)(sizeof o->reserved / sizeof o->reserved[0]); i++)
    if (o->reserved[i] != 0) return fail(GLMRT_ERR_INVALID, "fake: reserved[%d] is not zero", i);
  if (o->kv_cache_dtype != GLMRT_KV_AUTO && o->kv_cache_dtype != GLMRT_KV_FP8_E4M3)
    return fail(GLMRT_ERR_INVALID, "fake: kv_cache_dtype %d", o->kv_cache_dtype);
  if (o->kv_block_size > 1024) return fail(GLMRT_ERR_INVALID, "fake: kv_block_size %d > 1024", o->kv_block_size);
  glmrt_engine *e = calloc(1, sizeof *e);
  if (!e) return fail(GLMRT_ERR_OOM, "fake: calloc");
  e->owner = pthread_self();
  e->cfg = *c;
  e->opt = *o;
  *out = e;
  return ok();
}

int glmrt_get_info(const glmrt_engine *e, glmrt_info *out) {
  int rc = same_thread(e);
  if (rc) return rc;
  memset(out, 0, sizeof *out);
  out->abi_version = GLMRT_ABI_VERSION;
  out->tensor_parallel = pick(e->opt.tensor_parallel, 1);
  out->kv_block_size = pick(e->opt.kv_block_size, 16);
  out->num_kv_blocks = pick(e->opt.num_kv_blocks, 64);
  out->max_tokens_per_step = pick(e->opt.max_tokens_per_step, 8192);
  out->max_seqs_per_step = pick(e->opt.max_seqs_per_step, 256);
  out->max_blocks_per_seq = (e->cfg.max_position_embeddings + out->kv_block_size - 1) / out->kv_block_size;
  out->max_top_logprobs = GLMRT_MAX_TOP_LOGPROBS;
  out->max_penalty_entries = pick(e->opt.max_penalty_entries, out->max_seqs_per_step * 4096);
  out->vocab_size = e->cfg.vocab_size;
  out->max_draft_tokens = e->opt.draft_tokens;
  out->weight_bytes = e->loaded_bytes;
  out->kv_bytes = e->n_tensors;
  out->workspace_bytes = (int64_t)e->byte_sum;
  snprintf(out->device_name, sizeof out->device_name, "fake GPU (sm_00, 0 GiB) x%d", out->tensor_parallel);
  return ok();
}

int glmrt_load_tensor(glmrt_engine *e, const char *name, int32_t dtype, const int64_t *shape, int32_t ndim,
                      const void *data, uint64_t nbytes) {
  int rc = same_thread(e);
  if (rc) return rc;
  if (e->finalized) return fail(GLMRT_ERR_STATE, "fake: tensor %s after finalize", name);
  int esize = dtype == GLMRT_DTYPE_F32 ? 4 : dtype == GLMRT_DTYPE_BF16 || dtype == GLMRT_DTYPE_F16 ? 2
              : dtype == GLMRT_DTYPE_F8_E4M3 ? 1 : 0;
  if (!esize) return fail(GLMRT_ERR_INVALID, "fake: tensor %s: unknown dtype %d", name, dtype);
  uint64_t n = esize;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0) return fail(GLMRT_ERR_INVALID, "fake: tensor %s: negative dim", name);
    n *= (uint64_t)shape[i];
  }
  if (n != nbytes) return fail(GLMRT_ERR_INVALID, "fake: tensor %s: %llu bytes for its shape, got %llu", name,
                               (unsigned long long)n, (unsigned long long)nbytes);
  if (nbytes && !data) return fail(GLMRT_ERR_INVALID, "fake: tensor %s: NULL data", name);
  const unsigned char *p = data;
  for (uint64_t i = 0; i < nbytes; i++) e->byte_sum += p[i];
  e->loaded_bytes += (int64_t)nbytes;
  e->n_tensors++;
  return ok();
}

int glmrt_finalize(glmrt_engine *e) {
  int rc = same_thread(e);
  if (rc) return rc;
  if (e->n_tensors == 0) return fail(GLMRT_ERR_STATE, "fake: finalize without tensors");
  e->finalized = 1;
  return ok();
}

#ifndef FAKE_OMIT_STEP
/* Answers, per sequence i (derived from the inputs so the Go test can check them):
 *   token   = (sum of its new token ids + start_pos + 7*penalty_len + sample_index) % vocab,
 *             then, with a token mask, the first allowed id at or after it (cyclically);
 *             a mask allowing nothing gives sample_status GLMRT_SAMPLE_MASKED_ALL
 *   logprob = 1000*sum(prompt counts) + sum(output counts) of its penalty range, or -0.5 without one
 *   top k   = ids (token+k) % vocab, logprobs -k - temperature; -1 past n_top_logprobs
 *   logits  = row r (r-th want_logits seq): logits[v] = v + 1000*i + start_pos
 * A seed of 0xBAD is refused with GLMRT_ERR_INVALID (error path test); a seed
 * of 0x7FC00000 makes that sequence's logits "NaN": sample_status
 * GLMRT_SAMPLE_NONFINITE, or the whole step refused without a status array. */
int glmrt_step(glmrt_engine *e, const glmrt_batch *b, glmrt_result *r) {
  int rc = same_thread(e);
  if (rc) return rc;
  if (!e->finalized) return fail(GLMRT_ERR_STATE, "fake: step before finalize");
  if (e->profiling) e->profiled_steps++;
  glmrt_info info;
  glmrt_get_info(e, &info);
  int vocab = e->cfg.vocab_size, bs = info.kv_block_size;
  if (b->n_seqs < 1 || b->n_seqs > info.max_seqs_per_step) return fail(GLMRT_ERR_INVALID, "fake: n_seqs %d", b->n_seqs);
  if (b->n_tokens > info.max_tokens_per_step) return fail(GLMRT_ERR_INVALID, "fake: n_tokens %d", b->n_tokens);
  if (b->n_penalty_entries > info.max_penalty_entries)
    return fail(GLMRT_ERR_INVALID, "fake: n_penalty_entries %d", b->n_penalty_entries);
  if ((b->n_penalty_entries == 0) != (b->penalty_tokens == NULL))
    return fail(GLMRT_ERR_INVALID, "fake: penalty arrays vs n_penalty_entries %d", b->n_penalty_entries);
  if ((b->n_token_masks == 0) != (b->token_masks == NULL) ||
      (b->n_token_masks > 0 && b->mask_words != (vocab + 31) / 32))
    return fail(GLMRT_ERR_INVALID, "fake: token masks: %d rows of %d words", b->n_token_masks, b->mask_words);
  int tok = 0, row = 0;
  for (int i = 0; i < b->n_seqs; i++) {
    const glmrt_seq *s = &b->seqs[i];
    if (s->n_tokens < 1 || s->start_pos < 0) return fail(GLMRT_ERR_INVALID, "fake: seq %d: n_tokens/start_pos", i);
    if (s->block_table_offset < 0 || s->block_table_offset + s->block_table_len > b->n_block_table_entries)
      return fail(GLMRT_ERR_INVALID, "fake: seq %d: block table range", i);
    if ((int64_t)s->block_table_len * bs < (int64_t)s->start_pos + s->n_tokens)
      return fail(GLMRT_ERR_INVALID, "fake: seq %d: block table too short", i);
    for (int j = 0; j < s->block_table_len; j++) {
      int blk = b->block_tables[s->block_table_offset + j];
      if (blk < 0 || blk >= info.num_kv_blocks) return fail(GLMRT_ERR_INVALID, "fake: seq %d: block %d", i, blk);
    }
    if (s->penalty_offset < 0 || s->penalty_len < 0 || s->penalty_offset + s->penalty_len > b->n_penalty_entries)
      return fail(GLMRT_ERR_INVALID, "fake: seq %d: penalty range", i);
    long long psum = 0, osum = 0;
    for (int j = 0; j < s->penalty_len; j++) {
      int k = s->penalty_offset + j, t = b->penalty_tokens[k];
      if (t < 0 || t >= vocab) return fail(GLMRT_ERR_INVALID, "fake: seq %d: penalty token %d", i, t);
      if (b->penalty_prompt_counts[k] < 0 || b->penalty_output_counts[k] < 0 ||
          b->penalty_prompt_counts[k] + b->penalty_output_counts[k] == 0)
        return fail(GLMRT_ERR_INVALID, "fake: seq %d: penalty counts of token %d", i, t);
      for (int m = s->penalty_offset; m < k; m++)
        if (b->penalty_tokens[m] == t) return fail(GLMRT_ERR_INVALID, "fake: seq %d: penalty token %d twice", i, t);
      psum += b->penalty_prompt_counts[k];
      osum += b->penalty_output_counts[k];
    }
    long long sum = 0;
    for (int j = 0; j < s->n_tokens; j++, tok++) {
      if (tok >= b->n_tokens) return fail(GLMRT_ERR_INVALID, "fake: token count mismatch");
      int t = b->token_ids[tok];
      if (t < 0 || t >= vocab) return fail(GLMRT_ERR_INVALID, "fake: seq %d: token %d", i, t);
      sum += t;
    }
    if (s->sample) {
      const glmrt_sampling *p = &s->sampling;
      if (p->seed == 0xBAD) return fail(GLMRT_ERR_INVALID, "fake: seed 0xBAD refused for seq %d", i);
      if (p->n_top_logprobs > r->top_stride) return fail(GLMRT_ERR_INVALID, "fake: seq %d: top_stride", i);
      if (p->seed == 0x7FC00000u) {  /* this sequence's logits are NaN, as the real sampler reports it */
        if (!r->sample_status) return fail(GLMRT_ERR_INVALID, "fake: seq %d: cannot sample: a logit is NaN or +Inf", i);
        r->sample_status[i] = GLMRT_SAMPLE_NONFINITE;
        r->tokens[i] = -1;
        r->logprobs[i] = NAN;
        for (int k = 0; k < r->top_stride; k++) r->top_ids[i * r->top_stride + k] = -1;
        goto logits;
      }
      if (r->sample_status) r->sample_status[i] = GLMRT_SAMPLE_OK;
      int t = (int)((sum + s->start_pos + 7LL * s->penalty_len + p->sample_index) % vocab);
      if (s->mask_index < -1 || s->mask_index >= b->n_token_masks)
        return fail(GLMRT_ERR_INVALID, "fake: seq %d: mask_index %d", i, s->mask_index);
      if (s->mask_index >= 0) {
        const uint32_t *m = b->token_masks + (size_t)s->mask_index * b->mask_words;
        int k = 0;
        while (k < vocab && !(m[(t + k) % vocab >> 5] >> ((t + k) % vocab & 31) & 1u)) k++;
        if (k == vocab) {
          if (!r->sample_status) return fail(GLMRT_ERR_INVALID, "fake: seq %d: the token mask allows nothing", i);
          r->sample_status[i] = GLMRT_SAMPLE_MASKED_ALL;
          r->tokens[i] = -1;
          r->logprobs[i] = NAN;
          for (int q = 0; q < r->top_stride; q++) r->top_ids[i * r->top_stride + q] = -1;
          goto logits;
        }
        t = (t + k) % vocab;
      }
      r->tokens[i] = t;
      r->logprobs[i] = s->penalty_len ? (float)(1000 * psum + osum) : -0.5f;
      for (int k = 0; k < r->top_stride; k++) {
        r->top_ids[i * r->top_stride + k] = k < p->n_top_logprobs ? (t + k) % vocab : -1;
        r->top_logprobs[i * r->top_stride + k] = k < p->n_top_logprobs ? -(float)k - p->temperature : NAN;
      }
      /* Speculative decoding: drafts (the last n_drafts new tokens) are
       * accepted while even; accepted draft j has logprob -(j+1) and top
       * alternatives (draft + k) % vocab with logprob -k; the proposal is
       * (token + 1) % vocab. */
      if (s->n_drafts > 0 || s->propose > 0) {
        if (e->opt.draft_tokens == 0) return fail(GLMRT_ERR_INVALID, "fake: seq %d: drafts without draft_tokens", i);
        if (r->draft_stride < s->n_drafts || r->draft_stride < s->propose)
          return fail(GLMRT_ERR_INVALID, "fake: seq %d: draft_stride %d", i, r->draft_stride);
      }
      if (s->n_drafts > 0) {
        const int32_t *d = b->token_ids + tok - s->n_drafts;
        int a = 0;
        while (a < s->n_drafts && d[a] % 2 == 0) {
          r->accepted[i * r->draft_stride + a] = d[a];
          r->accepted_logprobs[i * r->draft_stride + a] = -(float)(a + 1);
          if (p->n_top_logprobs > 0)
            for (int k = 0; k < r->top_stride; k++) {
              r->accepted_top_ids[(i * r->draft_stride + a) * r->top_stride + k] = k < p->n_top_logprobs ? (d[a] + k) % vocab : -1;
              r->accepted_top_logprobs[(i * r->draft_stride + a) * r->top_stride + k] = -(float)k;
            }
          a++;
        }
        r->n_accepted[i] = a;
      } else if (r->n_accepted) {
        r->n_accepted[i] = 0;
      }
      if (r->drafts)
        for (int k = 0; k < r->draft_stride; k++) r->drafts[i * r->draft_stride + k] = k < s->propose ? (t + 1 + k) % vocab : -1;
    } else {
      r->tokens[i] = -1;
      r->logprobs[i] = NAN;
      if (r->sample_status) r->sample_status[i] = GLMRT_SAMPLE_OK;
      for (int k = 0; k < r->top_stride; k++) r->top_ids[i * r->top_stride + k] = -1;
    }
  logits:
    if (s->want_logits) {
      if ((int64_t)(row + 1) * vocab > r->logits_capacity) return fail(GLMRT_ERR_INVALID, "fake: logits capacity");
      for (int v = 0; v < vocab; v++) r->logits[(int64_t)row * vocab + v] = (float)(v + 1000 * i + s->start_pos);
      row++;
    }
  }
  if (tok != b->n_tokens) return fail(GLMRT_ERR_INVALID, "fake: n_tokens %d, seqs hold %d", b->n_tokens, tok);
  return ok();
}

static void *dup_array(const void *src, size_t n, size_t size) {
  if (!src || n == 0) return NULL;
  void *d = malloc(n * size);
  memcpy(d, src, n * size);
  return d;
}

static void drop_pending(glmrt_engine *e) {
  free(e->pseqs);
  free(e->ptok);
  free(e->ptab);
  free(e->ppen);
  e->pseqs = NULL;
  e->ptok = e->ptab = e->ppen = NULL;
  e->pending = 0;
}

/* The two-call step: begin keeps a copy of the batch (token_masks must be
 * NULL), finish runs glmrt_step on it with the masks given then. */
int glmrt_step_begin(glmrt_engine *e, const glmrt_batch *b) {
  int rc = same_thread(e);
  if (rc) return rc;
  if (e->pending) return fail(GLMRT_ERR_STATE, "fake: glmrt_step_begin: the previous step was begun and not finished");
  if (b->token_masks) return fail(GLMRT_ERR_INVALID, "fake: glmrt_step_begin: token_masks must be NULL");
  if (b->n_seqs < 1 || b->n_tokens < 1) return fail(GLMRT_ERR_INVALID, "fake: glmrt_step_begin: empty batch");
  e->pb = *b;
  e->pseqs = dup_array(b->seqs, b->n_seqs, sizeof *b->seqs);
  e->ptok = dup_array(b->token_ids, b->n_tokens, 4);
  e->ptab = dup_array(b->block_tables, b->n_block_table_entries, 4);
  /* penalty arrays: tokens, prompt counts, output counts in one buffer */
  if (b->n_penalty_entries > 0) {
    size_t n = b->n_penalty_entries;
    e->ppen = malloc(3 * n * 4);
    memcpy(e->ppen, b->penalty_tokens, n * 4);
    memcpy(e->ppen + n, b->penalty_prompt_counts, n * 4);
    memcpy(e->ppen + 2 * n, b->penalty_output_counts, n * 4);
    e->pb.penalty_tokens = e->ppen;
    e->pb.penalty_prompt_counts = e->ppen + n;
    e->pb.penalty_output_counts = e->ppen + 2 * n;
  }
  e->pb.seqs = e->pseqs;
  e->pb.token_ids = e->ptok;
  e->pb.block_tables = e->ptab;
  e->pending = 1;
  return ok();
}

int glmrt_step_finish(glmrt_engine *e, const uint32_t *token_masks, glmrt_result *r) {
  int rc = same_thread(e);
  if (rc) return rc;
  if (!e->pending) return fail(GLMRT_ERR_STATE, "fake: glmrt_step_finish: no step was begun");
  glmrt_batch b = e->pb;
  b.token_masks = token_masks;
  rc = glmrt_step(e, &b, r);
  drop_pending(e);
  return rc;
}
#endif

void glmrt_engine_destroy(glmrt_engine *e) {
#ifndef FAKE_OMIT_STEP
  drop_pending(e);
#endif
  free(e);
}

/* Synthetic weights: counts as one tensor of 0 bytes and records the seed
 * (reported as workspace_bytes) so the Go test can see it arrived. */
int glmrt_synthesize(glmrt_engine *e, uint64_t seed) {
  int rc = same_thread(e);
  if (rc) return rc;
  if (e->n_tensors || e->synthesized) return fail(GLMRT_ERR_STATE, "fake: synthesize after tensors were loaded");
  e->synthesized = 1;
  e->seed = seed;
  e->n_tensors = 1;
  e->byte_sum = seed;
  return ok();
}

/* Profile: counts the steps run while enabled; one launch of each family. */
int glmrt_profile_enable(glmrt_engine *e, int32_t on) {
  int rc = same_thread(e);
  if (rc) return rc;
  if (on != 0 && on != 1) return fail(GLMRT_ERR_INVALID, "fake: profile on %d", on);
  e->profiling = on;
  if (on) e->profiled_steps = 0;
  return ok();
}

int glmrt_profile_read(glmrt_engine *e, glmrt_profile *out, int32_t reset) {
  int rc = same_thread(e);
  if (rc) return rc;
  memset(out, 0, sizeof *out);
  out->steps = e->profiled_steps;
  for (int f = 0; f < GLMRT_PROF_N; f++) {
    out->family_us[f] = (double)(f + 1) * (double)e->profiled_steps;
    out->family_bytes[f] = (int64_t)(f + 1) * 1000 * e->profiled_steps;
    out->family_launches[f] = e->profiled_steps;
    out->step_us += out->family_us[f];
  }
  if (reset) e->profiled_steps = 0;
  return ok();
}
