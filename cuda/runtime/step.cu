// step.cu — one scheduler step: validate the flat batch, pack the step's
// metadata into pinned memory and send it with one copy per GPU, run the
// forward (layers: add+RMSNorm -> FP8 q|k|v -> q/k norm + RoPE + KV write ->
// paged attention -> FP8 o_proj -> all-reduce -> add+RMSNorm -> dense MLP or
// MoE -> all-reduce), the final norm + lm_head for the rows that need logits,
// GPU sampling, and one copy of the results back. Nothing is allocated and the
// host waits only once, for the results.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "engine.h"

namespace glmrt {
namespace {

constexpr size_t kAlign = 256;
size_t al(size_t x) { return (x + kAlign - 1) & ~(kAlign - 1); }

// Where the per-row arrays a forward reads lie in region A: the step's own
// (e.ml.positions ...), or those of a chained draft pass (e.ml.chain_*).
struct RowMeta {
  size_t positions = 0, slots = 0, dec_qrow = 0, dec_ctx = 0, dec_bt = 0;
  size_t n_valid = 0;  // real rows of a padded pass (read when graph)
};

// What one step is, beyond the fixed region-A layout (e.ml): counts, the
// region-B offsets, and how attention runs.
struct Meta {
  RowMeta rm;
  int T = 0, S = 0;   // real tokens and sequences
  int rows = 0;       // rows the forward runs: T, or the graph bucket (T padded)
  // Rows every launch-shape choice is made for (GEMM path and split-K, the
  // decode attention's splits, the router path): the bucket of `rows` whether
  // or not the step runs as a graph, so that a graph and an eager step of the
  // same batch compute bit-identical results.
  int policy_rows = 0;
  bool graph = false; // a pure-decode step replayed from (or captured into) a CUDA graph
  int bucket = -1;    // index into e.buckets when graph
  int n_logits = 0, n_items = 0, n_merges = 0, n_pen = 0, n_seg = 0;
  int pf_rows = 0, pf_parts = 0;  // attention_prefill plan (e.prefill_tc): rows per item, split pieces
  int n_dec = 0;      // sequences attention_decode takes (graph: the bucket, padded)
  int dec_splits = 1;
  // The decode attention's context class (glmk::decode_attention_ctx_class of
  // the step's longest decode context): part of the graph key (graph_index).
  int ctx_class = glmk::kDecCtxAny;
  bool dec_quant = false;  // attention_decode also writes the FP8 attention output
  size_t items, merges, samples, pen_row, pen_tok, pen_prompt, pen_output, seg_begin, seg_end, masks;
  size_t a_bytes = 0, b_bytes = 0;  // bytes of region A / B to copy (B: up to the masks)
  int n_mask = 0;                   // token-mask rows (sampled rows with a mask)
  // The draft pass (speculative decoding): run when a sequence has draft set,
  // proposing for n_spec sequences (its arrays: MetaLayout).
  bool mtp_pass = false;
  int n_spec = 0;
  int max_propose = 0;  // the most drafts a sequence proposes: the passes the draft model runs
  int64_t kv_read_tokens = 0;       // sum over sequences of keys attended (profiling bytes)
  // Per sampler chunk: [begin, end) of its penalty entries and sort segments.
  int chunk_pen[2 * 1024 + 2];
  int chunk_seg[2 * 1024 + 2];
};

// A graph step's key: its bucket and its decode attention's context class
// (the launch form differs between classes, the captured graph with it).
int graph_index(const Meta& m) { return m.bucket * kCtxClasses + m.ctx_class; }

template <typename T>
T* at(unsigned char* base, size_t off) {
  return reinterpret_cast<T*>(base + off);
}

bool finite(float x) { return std::isfinite(x); }

bool needs_sort(const glmrt_sampling& p, int V) {
  return p.temperature > 0 && ((p.top_k > 0 && p.top_k < V) || (p.top_p > 0 && p.top_p < 1));
}
bool wants_penalty(const glmrt_sampling& p) {
  return (p.repetition_penalty > 0 && p.repetition_penalty != 1) || p.frequency_penalty != 0 ||
         p.presence_penalty != 0;
}

// Checks the batch; masks_now: its token_masks come with it (glmrt_step),
// else they must be NULL (glmrt_step_begin; they come at finish).
int validate_batch(const Engine& e, const glmrt_batch& b, bool masks_now) {
  const int V = e.d.V;
  if (b.n_seqs < 1 || b.n_seqs > e.max_seqs)
    return fail(GLMRT_ERR_INVALID, "batch: n_seqs %d not in 1..max_seqs_per_step (%d)", b.n_seqs,
                e.max_seqs);
  if (b.n_tokens < 1 || b.n_tokens > e.max_tokens)
    return fail(GLMRT_ERR_INVALID, "batch: n_tokens %d not in 1..max_tokens_per_step (%d)",
                b.n_tokens, e.max_tokens);
  if (!b.seqs || !b.token_ids)
    return fail(GLMRT_ERR_INVALID, "batch: seqs and token_ids are required");
  if (b.n_block_table_entries < 0 ||
      (int64_t)b.n_block_table_entries > (int64_t)e.max_seqs * e.max_blocks_per_seq ||
      (b.n_block_table_entries > 0 && !b.block_tables))
    return fail(GLMRT_ERR_INVALID,
                "batch: n_block_table_entries %d not in 0..max_seqs*max_blocks_per_seq (%lld) "
                "(or block_tables NULL)",
                b.n_block_table_entries, (long long)e.max_seqs * e.max_blocks_per_seq);
  if (b.n_penalty_entries < 0 || b.n_penalty_entries > e.max_pen ||
      (b.n_penalty_entries > 0 &&
       (!b.penalty_tokens || !b.penalty_prompt_counts || !b.penalty_output_counts)))
    return fail(GLMRT_ERR_INVALID,
                "batch: n_penalty_entries %d not in 0..max_penalty_entries (%d) (or arrays NULL)",
                b.n_penalty_entries, e.max_pen);
  const int mask_words = (V + 31) / 32;
  if (b.n_token_masks < 0 || b.n_token_masks > e.max_seqs ||
      (b.n_token_masks > 0 && ((masks_now && !b.token_masks) || b.mask_words != mask_words)))
    return fail(GLMRT_ERR_INVALID,
                "batch: n_token_masks %d not in 0..max_seqs_per_step (%d), or token_masks NULL, or "
                "mask_words %d is not ceil(vocab/32) = %d",
                b.n_token_masks, e.max_seqs, b.mask_words, mask_words);
  if (!masks_now && b.token_masks)
    return fail(GLMRT_ERR_INVALID,
                "batch: token_masks must be NULL in glmrt_step_begin (the masks go to glmrt_step_finish)");
  int64_t tok_sum = 0, pen_sum = 0;
  for (int s = 0; s < b.n_seqs; ++s) {
    const glmrt_seq& q = b.seqs[s];
    if (q.n_tokens < 1) return fail(GLMRT_ERR_INVALID, "seq %d: n_tokens %d must be >= 1", s, q.n_tokens);
    tok_sum += q.n_tokens;
    if (q.start_pos < 0 || (int64_t)q.start_pos + q.n_tokens > e.cfg.max_position_embeddings)
      return fail(GLMRT_ERR_INVALID,
                  "seq %d: positions %d..%lld outside max_position_embeddings (%d)", s, q.start_pos,
                  (long long)q.start_pos + q.n_tokens - 1, e.cfg.max_position_embeddings);
    const int64_t ctx = (int64_t)q.start_pos + q.n_tokens;
    const int64_t need = (ctx + e.block_size - 1) / e.block_size;
    if (q.block_table_offset < 0 || q.block_table_len < need ||
        (int64_t)q.block_table_offset + q.block_table_len > b.n_block_table_entries)
      return fail(GLMRT_ERR_INVALID,
                  "seq %d: block table [%d, +%d) must lie in the %d entries and cover %lld blocks",
                  s, q.block_table_offset, q.block_table_len, b.n_block_table_entries,
                  (long long)need);
    for (int64_t i = 0; i < need; ++i) {
      const int blk = b.block_tables[q.block_table_offset + i];
      if (blk < 0 || blk >= e.num_blocks)
        return fail(GLMRT_ERR_INVALID, "seq %d: block table entry %lld = %d not in 0..%d", s,
                    (long long)i, blk, e.num_blocks - 1);
    }
    if ((q.sample != 0 && q.sample != 1) || (q.want_logits != 0 && q.want_logits != 1))
      return fail(GLMRT_ERR_INVALID, "seq %d: sample and want_logits must be 0 or 1", s);
    if (q.mask_index < -1 || q.mask_index >= b.n_token_masks || (q.mask_index >= 0 && !q.sample))
      return fail(GLMRT_ERR_INVALID, "seq %d: mask_index %d must be -1 or a row of the %d token masks of a sampled sequence",
                  s, q.mask_index, b.n_token_masks);
    if (q.draft != 0 && q.draft != 1)
      return fail(GLMRT_ERR_INVALID, "seq %d: draft must be 0 or 1", s);
    if ((q.draft || q.n_drafts || q.propose) && e.draft_k == 0)
      return fail(GLMRT_ERR_INVALID,
                  "seq %d: draft/n_drafts/propose need an engine created with draft_tokens > 0", s);
    if (q.n_drafts < 0 || q.n_drafts > e.draft_k || q.n_drafts >= q.n_tokens || (q.n_drafts > 0 && !q.sample))
      return fail(GLMRT_ERR_INVALID,
                  "seq %d: n_drafts %d must be in 0..draft_tokens (%d), below n_tokens (%d), and only on a "
                  "sampled sequence",
                  s, q.n_drafts, e.draft_k, q.n_tokens);
    if (q.propose < 0 || q.propose > e.draft_k || (q.propose > 0 && !(q.draft && q.sample)))
      return fail(GLMRT_ERR_INVALID,
                  "seq %d: propose %d must be in 0..draft_tokens (%d), and only with draft and sample", s,
                  q.propose, e.draft_k);
    if (q.draft && !q.sample && (q.next_token < -1 || q.next_token >= V))
      return fail(GLMRT_ERR_INVALID, "seq %d: next_token %d must be -1 or in 0..%d", s, q.next_token, V - 1);
    if ((q.draft || q.n_drafts) && (q.want_logits || q.mask_index >= 0))
      return fail(GLMRT_ERR_INVALID,
                  "seq %d: draft / n_drafts cannot go with want_logits or a token mask", s);
    if (!q.sample) continue;
    const glmrt_sampling& p = q.sampling;
    if (!finite(p.temperature) || p.temperature < 0)
      return fail(GLMRT_ERR_INVALID, "seq %d: temperature %g must be finite and >= 0", s, p.temperature);
    if (!finite(p.top_p) || p.top_p < 0 || p.top_p > 1)
      return fail(GLMRT_ERR_INVALID, "seq %d: top_p %g must be in [0, 1]", s, p.top_p);
    if (!finite(p.min_p) || p.min_p < 0 || p.min_p > 1)
      return fail(GLMRT_ERR_INVALID, "seq %d: min_p %g must be in [0, 1]", s, p.min_p);
    if (!finite(p.repetition_penalty) || p.repetition_penalty < 0)
      return fail(GLMRT_ERR_INVALID, "seq %d: repetition_penalty %g must be >= 0", s,
                  p.repetition_penalty);
    if (!finite(p.frequency_penalty) || !finite(p.presence_penalty))
      return fail(GLMRT_ERR_INVALID, "seq %d: frequency/presence penalties must be finite", s);
    if (p.n_top_logprobs < 0 || p.n_top_logprobs > GLMRT_MAX_TOP_LOGPROBS)
      return fail(GLMRT_ERR_INVALID, "seq %d: n_top_logprobs %d not in 0..%d", s, p.n_top_logprobs,
                  GLMRT_MAX_TOP_LOGPROBS);
    if (p.sample_index < 0)
      return fail(GLMRT_ERR_INVALID, "seq %d: sample_index %lld must be >= 0", s, (long long)p.sample_index);
    if (q.penalty_len < 0 || q.penalty_offset < 0 ||
        (int64_t)q.penalty_offset + q.penalty_len > b.n_penalty_entries)
      return fail(GLMRT_ERR_INVALID, "seq %d: penalty entries [%d, +%d) outside the %d given", s,
                  q.penalty_offset, q.penalty_len, b.n_penalty_entries);
    if (wants_penalty(p)) pen_sum += q.penalty_len;
    for (int i = 0; i < q.penalty_len; ++i) {
      const int k = q.penalty_offset + i;
      if (b.penalty_tokens[k] < 0 || b.penalty_tokens[k] >= V || b.penalty_prompt_counts[k] < 0 ||
          b.penalty_output_counts[k] < 0)
        return fail(GLMRT_ERR_INVALID,
                    "seq %d: penalty entry %d: token %d must be in 0..%d and counts >= 0", s, k,
                    b.penalty_tokens[k], V - 1);
    }
  }
  if (pen_sum > e.max_pen)
    return fail(GLMRT_ERR_INVALID, "batch: %lld penalty entries in use exceed max_penalty_entries (%d)",
                (long long)pen_sum, e.max_pen);
  if (tok_sum != b.n_tokens)
    return fail(GLMRT_ERR_INVALID, "batch: n_tokens %d but the sequences hold %lld", b.n_tokens,
                (long long)tok_sum);
  for (int t = 0; t < b.n_tokens; ++t)
    if (b.token_ids[t] < 0 || b.token_ids[t] >= V)
      return fail(GLMRT_ERR_INVALID, "batch: token_ids[%d] = %d not in 0..%d", t, b.token_ids[t], V - 1);
  return GLMRT_OK;
}

// Checks the result buffers against the step's sequences.
int validate_result(const Engine& e, const glmrt_seq* seqs, int n_seqs, const glmrt_result& res) {
  const int V = e.d.V;
  if (!res.tokens || !res.logprobs)
    return fail(GLMRT_ERR_INVALID, "result: tokens and logprobs are required");
  int64_t want = 0;
  for (int s = 0; s < n_seqs; ++s) {
    const glmrt_seq& q = seqs[s];
    want += q.want_logits;
    const int n = q.sampling.n_top_logprobs;
    if (q.sample && n > 0 && (!res.top_ids || !res.top_logprobs || res.top_stride < n))
      return fail(GLMRT_ERR_INVALID,
                  "seq %d: n_top_logprobs %d needs result.top_ids/top_logprobs and top_stride >= it "
                  "(top_stride %d)",
                  s, n, res.top_stride);
    if ((q.n_drafts > 0 || q.propose > 0) && res.draft_stride < std::max(q.n_drafts, q.propose))
      return fail(GLMRT_ERR_INVALID, "seq %d: n_drafts %d / propose %d need result.draft_stride >= them (%d)",
                  s, q.n_drafts, q.propose, res.draft_stride);
    if (q.n_drafts > 0 && (!res.n_accepted || !res.accepted || !res.accepted_logprobs))
      return fail(GLMRT_ERR_INVALID,
                  "seq %d: n_drafts %d needs result.n_accepted, accepted and accepted_logprobs", s, q.n_drafts);
    if (q.n_drafts > 0 && n > 0 && (!res.accepted_top_ids || !res.accepted_top_logprobs))
      return fail(GLMRT_ERR_INVALID,
                  "seq %d: n_drafts with n_top_logprobs %d needs result.accepted_top_ids/top_logprobs", s, n);
    if (q.propose > 0 && !res.drafts)
      return fail(GLMRT_ERR_INVALID, "seq %d: propose %d needs result.drafts", s, q.propose);
  }
  if (want > 0 && (!res.logits || res.logits_capacity < want * V))
    return fail(GLMRT_ERR_INVALID, "result: logits needs %lld floats (%lld rows x vocab %d), capacity %lld",
                (long long)(want * V), (long long)want, V, (long long)res.logits_capacity);
  return GLMRT_OK;
}

// Whether this engine runs decode tokens through attention_decode (the BF16
// real path with pages of whole 16-key tiles and at most 16 query heads per KV
// head); otherwise every sequence goes through attention_paged.
bool decode_kernel_ok(const Engine& e) {
  return !e.exact && !e.f32kv && e.block_size % 16 == 0 &&
         e.d.nq / e.d.nkv <= glmk::kDecodeMaxGroup;
}

// The smallest bucket >= n (n beyond the last bucket: n).
int bucket_rows(const Engine& e, int n) {
  for (int b : e.buckets)
    if (b >= n) return b;
  return n;
}

// Whether sequence q runs its new tokens as decode rows of attention_decode:
// one token, or a verify step (its drafts and the token before them, nothing
// else), each row then a decode entry of its own over the keys up to it (the
// rope kernel writes every row's K/V before attention runs). Its rows are then
// computed exactly as decode rows are, and a step of such sequences is a CUDA
// graph of its row count.
bool decode_rows(const glmrt_seq& q) {
  return q.n_tokens == 1 || (q.n_drafts > 0 && q.n_tokens == q.n_drafts + 1);
}

// The graph bucket for a pure-decode step (every sequence one token, or its
// verify rows, each row with logits) of T rows, or -1.
int pick_bucket(const Engine& e, const glmrt_batch& b) {
  if (!e.graphs) return -1;
  for (int s = 0; s < b.n_seqs; ++s) {
    const glmrt_seq& q = b.seqs[s];
    if (!decode_rows(q) || !(q.sample || q.want_logits)) return -1;
  }
  for (size_t i = 0; i < e.buckets.size(); ++i)
    if (e.buckets[i] >= b.n_tokens) return (int)i;
  return -1;
}

// Packs the step's metadata into e.meta_host (region A at its fixed offsets,
// region B from ml.b_begin); fills m.
int pack(Engine& e, const glmrt_batch& b, Meta& m) {
  const int V = e.d.V, bs = e.block_size;
  const MetaLayout& L = e.ml;
  m.T = b.n_tokens;
  m.S = b.n_seqs;
  m.bucket = pick_bucket(e, b);
  m.graph = m.bucket >= 0;
  m.rows = m.graph ? e.buckets[m.bucket] : m.T;
  m.policy_rows = bucket_rows(e, m.rows);
  m.rm = RowMeta{L.positions, L.slots, L.dec_qrow, L.dec_ctx, L.dec_bt, L.n_valid};
  unsigned char* H = e.meta_host;
  int* tok = at<int>(H, L.tokens);
  int* pos = at<int>(H, L.positions);
  int* slot = at<int>(H, L.slots);
  int* dq = at<int>(H, L.dec_qrow);
  int* dc = at<int>(H, L.dec_ctx);
  int* db = at<int>(H, L.dec_bt);
  int* bto = at<int>(H, L.bt_off);
  int* lrows = at<int>(H, L.logit_rows);
  memcpy(tok, b.token_ids, (size_t)m.T * 4);
  if (b.n_block_table_entries)
    memcpy(at<int>(H, L.bt), b.block_tables, (size_t)b.n_block_table_entries * 4);
  const bool dec_ok = decode_kernel_ok(e);
  e.logits_seq.clear();
  e.logits_vrow.clear();
  e.seq_logit_row0.assign(m.S, -1);
  e.spec_seqs.clear();
  e.spec_seq_index.clear();
  m.mtp_pass = false;
  e.attn_seqs.clear();
  e.attn_seq_index.clear();
  m.n_dec = 0;
  m.kv_read_tokens = 0;
  int t = 0;
  for (int s = 0; s < m.S; ++s) {
    const glmrt_seq& q = b.seqs[s];
    bto[s] = q.block_table_offset;
    m.kv_read_tokens += (int64_t)q.start_pos + q.n_tokens;
    if (dec_ok && decode_rows(q)) {
      for (int i = 0; i < q.n_tokens; ++i) {
        dq[m.n_dec] = t + i;
        dc[m.n_dec] = q.start_pos + i + 1;
        db[m.n_dec] = q.block_table_offset;
        ++m.n_dec;
      }
    } else {
      e.attn_seqs.push_back(glmk::AttnSeqDesc{t, q.n_tokens, q.start_pos});
      e.attn_seq_index.push_back(s);  // the planners number sequences in attn_seqs; tables are by s
    }
    for (int i = 0; i < q.n_tokens; ++i, ++t) {
      const int p = q.start_pos + i;
      pos[t] = p;
      slot[t] = b.block_tables[q.block_table_offset + p / bs] * bs + p % bs;
    }
    if (q.sample || q.want_logits) {
      // A sequence verifying D drafts has a logits row after each of its last
      // D + 1 positions; row j predicts the token after draft j.
      const int nv = q.sample ? q.n_drafts : 0;
      e.seq_logit_row0[s] = (int)e.logits_seq.size();
      if (q.draft && q.sample) {
        e.spec_seqs.push_back(glmk::SpecSeq{(int)e.logits_seq.size(), nv, t - 1 - nv, q.block_table_offset,
                                            q.block_table_len, q.propose, {0, 0}});
        e.spec_seq_index.push_back(s);
      }
      for (int j = 0; j <= nv; ++j) {
        lrows[e.logits_seq.size()] = t - 1 - nv + j;
        e.logits_seq.push_back(s);
        e.logits_vrow.push_back(j);
      }
    }
    if (q.draft) m.mtp_pass = true;
  }
  m.n_logits = (int)e.logits_seq.size();
  m.n_spec = (int)e.spec_seqs.size();
  m.max_propose = 0;
  for (const glmk::SpecSeq& q : e.spec_seqs) m.max_propose = std::max(m.max_propose, q.propose);
  if (m.graph) {
    // Padding rows: token 0 at position 0, no KV write, no keys, own logits row.
    for (int r = m.T; r < m.rows; ++r) {
      tok[r] = 0;
      pos[r] = 0;
      slot[r] = -1;
      dq[r] = r;
      dc[r] = 0;
      db[r] = 0;
      lrows[r] = r;
    }
    m.n_dec = m.rows;
  }
  *at<int>(H, L.n_valid) = m.T;
  m.dec_splits = m.n_dec > 0 ? glmk::decode_attention_splits(bucket_rows(e, m.n_dec), e.d.nkv_l,
                                                            e.ranks[0].num_sms, e.kv8)
                             : 1;
  // The context class from the real rows' longest context, for the launch's
  // own sequence count (a graph's: the bucket), so that the graph and the
  // eager step of a batch choose the same attention form.
  if (m.n_dec > 0) {
    int max_ctx = 0;
    for (int i = 0; i < m.n_dec; ++i) max_ctx = std::max(max_ctx, dc[i]);
    m.ctx_class = glmk::decode_attention_ctx_class(m.n_dec, e.d.nkv_l, m.dec_splits, e.kv8, max_ctx);
  }
  // The decode kernel writes the FP8 attention output itself when it covers
  // every row and a token's heads all sit under one KV head.
  m.dec_quant = m.n_dec > 0 && e.attn_seqs.empty() && e.d.nkv_l == 1;
  m.a_bytes = L.bt + al((size_t)b.n_block_table_entries * 4);

  // Region B: the prefill attention plan, sampling rows, penalties, segments.
  size_t off = L.b_begin;
  auto take = [&](size_t bytes) {
    const size_t o = off;
    off += al(bytes);
    return o;
  };
  const char* why = "";
  if (e.prefill_tc) {
    glmk::PrefillPlan plan;
    plan.items = e.pf_items.data();
    plan.max_items = e.pf_max_items;
    plan.max_parts = e.pf_max_parts;
    if (!glmk::plan_prefill(e.attn_seqs.data(), (int)e.attn_seqs.size(), e.d.nq / e.d.nkv, e.d.nkv_l,
                            e.ranks[0].num_sms, &plan, &why, e.attn_seq_index.data()))
      return fail(GLMRT_ERR_INVALID, "prefill attention plan: %s", why);
    m.n_items = plan.n_items;
    m.n_merges = 0;
    m.pf_rows = plan.rows;
    m.pf_parts = plan.n_parts;
    m.items = take((size_t)m.n_items * sizeof(glmk::PrefillItem));
    m.merges = take(0);
    memcpy(at<glmk::PrefillItem>(H, m.items), e.pf_items.data(), (size_t)m.n_items * sizeof(glmk::PrefillItem));
  } else {
    glmk::AttnPlan plan{e.attn_items.data(), e.max_items, 0, e.attn_merges.data(), e.max_merges, 0,
                        e.max_parts, 0};
    if (!glmk::plan_attention(e.attn_seqs.data(), (int)e.attn_seqs.size(), e.d.nq / e.d.nkv, &plan, &why))
      return fail(GLMRT_ERR_INVALID, "attention plan: %s", why);
    m.n_items = plan.n_items;
    m.n_merges = plan.n_merges;
    for (int i = 0; i < m.n_items; ++i) e.attn_items[i].seq = e.attn_seq_index[e.attn_items[i].seq];
    m.items = take((size_t)m.n_items * sizeof(glmk::AttnItem));
    m.merges = take((size_t)m.n_merges * sizeof(glmk::AttnMerge));
    memcpy(at<glmk::AttnItem>(H, m.items), e.attn_items.data(), (size_t)m.n_items * sizeof(glmk::AttnItem));
    memcpy(at<glmk::AttnMerge>(H, m.merges), e.attn_merges.data(),
           (size_t)m.n_merges * sizeof(glmk::AttnMerge));
  }
  m.samples = take((size_t)m.n_logits * sizeof(glmk::SampleRow));
  int n_pen = 0;
  for (int i = 0; i < m.n_logits; ++i) {
    const glmrt_seq& q = b.seqs[e.logits_seq[i]];
    if (q.sample && wants_penalty(q.sampling)) n_pen += q.penalty_len + e.logits_vrow[i];
  }
  m.pen_row = take((size_t)n_pen * 4);
  m.pen_tok = take((size_t)n_pen * 4);
  m.pen_prompt = take((size_t)n_pen * 4);
  m.pen_output = take((size_t)n_pen * 4);
  m.seg_begin = take((size_t)m.n_logits * 4);
  m.seg_end = take((size_t)m.n_logits * 4);
  // Token masks of the sampled rows that have one, in logits-row order.
  const int mask_words = (V + 31) / 32;
  int n_mask = 0;
  for (int i = 0; i < m.n_logits; ++i) {
    const glmrt_seq& q = b.seqs[e.logits_seq[i]];
    if (q.sample && q.mask_index >= 0) ++n_mask;
  }
  m.n_mask = n_mask;
  m.masks = take((size_t)n_mask * mask_words * 4);  // last in region B: sent at finish
  if (off > e.meta_bytes)
    return fail(GLMRT_ERR_INVALID, "step metadata %zu bytes exceed the planned %zu", off, e.meta_bytes);
  m.b_bytes = m.masks - L.b_begin;
  glmk::SampleRow* rows = at<glmk::SampleRow>(H, m.samples);
  int* pr = at<int>(H, m.pen_row);
  int* pt = at<int>(H, m.pen_tok);
  int* pp = at<int>(H, m.pen_prompt);
  int* po = at<int>(H, m.pen_output);
  int* sb = at<int>(H, m.seg_begin);
  int* se = at<int>(H, m.seg_end);
  int mask_rows = 0;
  m.n_pen = 0;
  m.n_seg = 0;
  const int chunk = e.sample_chunk;
  for (int c0 = 0, ci = 0; c0 < m.n_logits; c0 += chunk, ++ci) {
    m.chunk_pen[2 * ci] = m.n_pen;
    m.chunk_seg[2 * ci] = m.n_seg;
    int seg_local = 0;
    for (int i = c0; i < std::min(m.n_logits, c0 + chunk); ++i) {
      const glmrt_seq& q = b.seqs[e.logits_seq[i]];
      glmk::SampleRow& r = rows[i];
      memset(&r, 0, sizeof r);
      r.skip = q.sample ? 0 : 1;
      r.sort_segment = -1;
      r.mask_row = -1;
      r.draft = -1;
      if (!q.sample) continue;
      // Verify row j (speculative decoding): sample number sample_index + j,
      // deciding draft j + 1 (the token after this row's position) unless it
      // is the last row; its penalty history has drafts 1..j appended.
      const int vj = e.logits_vrow[i];
      if (vj < q.n_drafts) r.draft = b.token_ids[lrows[i] + 1];
      if (q.mask_index >= 0) r.mask_row = mask_rows++;  // the row arrives at finish
      const glmrt_sampling& p = q.sampling;
      r.temperature = p.temperature;
      r.top_k = p.top_k;
      r.top_p = p.top_p;
      r.min_p = p.min_p;
      r.repetition_penalty = p.repetition_penalty;
      r.frequency_penalty = p.frequency_penalty;
      r.presence_penalty = p.presence_penalty;
      r.n_top = p.n_top_logprobs;
      r.seed = p.seed;
      r.sample_index = p.sample_index + vj;
      if (needs_sort(p, V)) {
        r.sort_segment = seg_local++;
        sb[m.n_seg] = (i - c0) * V;
        se[m.n_seg] = (i - c0 + 1) * V;
        ++m.n_seg;
      }
      if (wants_penalty(p)) {
        // Drafts 1..vj are output tokens of this row's history: the tokens
        // right after the first verify position.
        const int* drafts = b.token_ids + (lrows[i] - vj) + 1;
        for (int k = 0; k < q.penalty_len; ++k) {
          const int src = q.penalty_offset + k;
          int extra = 0;
          for (int x = 0; x < vj; ++x) extra += drafts[x] == b.penalty_tokens[src];
          pr[m.n_pen] = i - c0;
          pt[m.n_pen] = b.penalty_tokens[src];
          pp[m.n_pen] = b.penalty_prompt_counts[src];
          po[m.n_pen] = b.penalty_output_counts[src] + extra;
          ++m.n_pen;
        }
        for (int x = 0; x < vj; ++x) {  // drafts not in the history: new entries, once each
          bool seen = false;
          for (int k = 0; k < q.penalty_len && !seen; ++k) seen = b.penalty_tokens[q.penalty_offset + k] == drafts[x];
          for (int y = 0; y < x && !seen; ++y) seen = drafts[y] == drafts[x];
          if (seen) continue;
          int count = 0;
          for (int y = x; y < vj; ++y) count += drafts[y] == drafts[x];
          pr[m.n_pen] = i - c0;
          pt[m.n_pen] = drafts[x];
          pp[m.n_pen] = 0;
          po[m.n_pen] = count;
          ++m.n_pen;
        }
      }
    }
    m.chunk_pen[2 * ci + 1] = m.n_pen;
    m.chunk_seg[2 * ci + 1] = m.n_seg;
  }
  if (m.mtp_pass) {
    // The MTP input token of every row: the next token of the sequence, which
    // for a row inside the step is the step's next row (for verify rows: the
    // drafts, which equal the target's tokens wherever they are accepted).
    // The last row of a sampled sequence gets its sampled token on the GPU
    // (spec_accept, at the last valid row); that of a prefill chunk gets
    // next_token. Rows of sequences that do not draft and padding rows read
    // token 0: their MTP entries are never used.
    int* nx = at<int>(H, L.mtp_next);
    int row = 0;
    for (int s = 0; s < m.S; ++s) {
      const glmrt_seq& q = b.seqs[s];
      for (int i = 0; i < q.n_tokens; ++i, ++row)
        nx[row] = !q.draft ? 0 : i + 1 < q.n_tokens ? b.token_ids[row + 1] : (!q.sample && q.next_token >= 0) ? q.next_token : 0;
    }
    for (; row < m.rows; ++row) nx[row] = 0;
    memcpy(at<glmk::SpecSeq>(H, L.spec), e.spec_seqs.data(), (size_t)m.n_spec * sizeof(glmk::SpecSeq));
    *at<int>(H, L.n_spec) = m.n_spec;
  }
  return GLMRT_OK;
}

#define KCHECK(call, ...)                                                            \
  do {                                                                               \
    cudaError_t e_ = (call);                                                         \
    if (e_ != cudaSuccess) {                                                         \
      cudaGetLastError();                                                            \
      char where_[160];                                                              \
      snprintf(where_, sizeof where_, __VA_ARGS__);                                  \
      return fail(GLMRT_ERR_CUDA, "GPU %d: %s: %s", r.device, where_, cudaGetErrorString(e_)); \
    }                                                                                \
  } while (0)
// Marks the end of a launch of family f for the profiler.
#define PROF(f) GLMRT_TRY(profile_mark(e, r, (f)))

// y[M, N] = fp8 linear of X (FP8 rows, scales xs) with W [N, K]; FP32 out.
constexpr int kStreamMaxRows = 8;
// Rows up to which a dense linear without a bias takes gemm_fp8_stream_tc
// rather than cuBLASLt (see linear()).
constexpr int kStreamTcDenseMaxRows = 32;
// Rows an expert typically gets above which the routed experts run through the
// tensor-core grouped GEMM (prefill) instead of the streaming kernel's row tiles.
constexpr int kGroupedTcMinRows = 32;

// Rows up to which a linear whose caller can apply the scales itself
// (epilogue_deferred) runs cuBLASLt's plain FP8 GEMM rather than its
// outer-vector-scaled one: for these shapes cuBLASLt 13.0 offers a single
// scaled algorithm (128 x 128 tiles: 24 CTAs for N = 3,072) but eight plain
// ones. H100, stream_tc_check --lt-sweep (2026-11-27), us per call: shared
// expert gate|up 3072 x 5120 scaled 15.6 / 15.9 / 16.1 at 64 / 128 / 256
// rows, plain 8.5 / 9.3 / 11.5; 5120 x 1536 scaled 8.1 / 8.3 / 8.5, plain
// 6.2 / 6.5 / 7.8. Not measured beyond (prefill keeps the scaled path).
constexpr int kLtDeferMaxRows = 256;

// Rows a step needs (Meta::policy_rows) for the routed experts' down
// projection to take the tensor-core streaming kernel without the shared
// expert among its groups (see mlp_block).
constexpr int kDownStreamTcMinRows = 192;

// A linear whose next kernel can sum its K splits' products (the rope kernel
// for q|k|v, the post-attention norm for o_proj): past kStreamMaxRows and up
// to kSplitOutMaxRows rows on sm_90 the tensor-core streaming kernel runs with
// enough K splits to give every SM a unit, each split's product stored apart
// in r.lin_parts (StreamTcTuning::split_stride). Without the split, q|k|v's
// 14 and o_proj's 40 weight blocks of 128 rows left most of the 132 SMs idle
// (20-33% of HBM on cuBLASLt and unsplit alike, docs/perf.md), and a split
// summed inside the GEMM cost each unit a fence and a counter's round trip.
// Launched early, each CTA's weights requested under the kernel before. H200
// (2026-11-28, rank share, 2k context, A/B, ms): batch 16 12.57 -> 12.33, 32
// 15.93 -> 15.77, 48 17.87 -> 17.27, 64 18.6 -> 18.17 (a layer's q|k|v 6.5 ->
// 5.1 us, o_proj 8.4 -> 4.7). Past 64 rows cuBLASLt stays: q|k|v in 64-row
// tiles and 2-4 splits made batch 128-256 0.5-1% slower.
constexpr int kSplitOutMaxRows = 64;
// K stages (128 bytes each) a split streams at least.
constexpr int kSplitOutMinStages = 3;
constexpr int kSplitOutMaxSplits = 16;

// In: where the slices may go. Out: how many splits linear wrote there (1:
// none, Y was written as usual) and their distance in floats.
struct SplitOut {
  int splits = 1;
  int64_t stride = 0;
};

// The K splits (>= 2) of a split-out launch for M rows of an N x K linear
// (token tile as the kernel picks it for P rows), or 1 where no split pays or
// the slices do not fit r.lin_parts.
int split_out_plan(const Rank& r, int M, int P, int N, int K) {
  if (!r.stream_tc || !r.lin_parts || P <= kStreamMaxRows || P > kSplitOutMaxRows ||
      !glmk::gemm_fp8_stream_tc_supported(N, K))
    return 1;
  glmk::StreamGemmArgs a;
  a.M = M;
  a.N = N;
  a.max_rows_per_group = P;
  const int nt = glmk::gemm_fp8_stream_tc_token_tile(a);
  const int units = ((P + nt - 1) / nt) * ((N + 127) / 128);
  int s = std::min({r.num_sms / std::max(units, 1), (K / 128) / kSplitOutMinStages, kSplitOutMaxSplits});
  if (s < 2 || (size_t)s * M * N > r.lin_parts_floats) return 1;
  return s;
}

// Xf set: exactness-check path (FP32 activations).
// P: the rows the launch shape is chosen for (Meta::policy_rows, >= M).
// epilogue_deferred: when set and the cuBLASLt path would follow its GEMM with
// gemm_fp8_epilogue (a bias, or up to kLtDeferMaxRows rows), Y is left
// unscaled and *epilogue_deferred set: the next kernel applies the scales (and
// the bias) as it reads Y.
// acc_into (with accumulated): where the cuBLASLt path with fused scales runs,
// the product is added to acc_into in place (its C operand) instead of being
// written to Y, and *accumulated is set; the other paths write Y.
// split (with Xf unset): the caller sums K-split slices (split_out_plan); if
// split->splits comes back > 1 the product is in r.lin_parts, not Y.
int linear(Rank& r, const uint8_t* W, const float* ws, const float* bias, int N, int K,
           const uint8_t* X, const float* xs, const float* Xf, int M, int P, float* Y, int layer,
           const char* what, bool pdl = false, bool* epilogue_deferred = nullptr,
           float* acc_into = nullptr, bool* accumulated = nullptr, SplitOut* split = nullptr) {
  if (epilogue_deferred) *epilogue_deferred = false;
  if (accumulated) *accumulated = false;
  if (split) *split = SplitOut{};
  // What every streaming-kernel path below shares: the weights, the shape, the
  // FP32 output.
  glmk::StreamGemmArgs dense;
  dense.W = W;
  dense.w_scale = ws;
  dense.M = M;
  dense.N = N;
  dense.K = K;
  dense.Y = Y;
  dense.ldy = N;
  if (Xf) {
    glmk::StreamGemmArgs a = dense;
    a.bias = bias;
    a.Xf = Xf;
    KCHECK(glmk::gemm_fp8_stream(a, r.stream), "layer %d %s: FP32-activation linear M=%d N=%d K=%d",
           layer, what, M, N, K);
    return GLMRT_OK;
  }
  if (split) {
    const int S = split_out_plan(r, M, P, N, K);
    if (S > 1) {
      glmk::StreamGemmArgs a = dense;
      a.bias = bias;
      a.X = X;
      a.x_scale = xs;
      a.max_rows_per_group = P;
      a.Y = r.lin_parts;
      // Programmatic dependent launch: each CTA's weight stages are requested
      // while the kernel before finishes (gemm_stream_tc.cu).
      a.pdl = pdl ? 1 : 0;
      glmk::StreamTcTuning tu;
      tu.splits = S;
      tu.split_stride = (int64_t)M * N;
      KCHECK(glmk::gemm_fp8_stream_tc(a, glmk::StreamTcWorkspace{}, tu, r.stream),
             "layer %d %s: gemm_fp8_stream_tc M=%d N=%d K=%d, %d K-split slices", layer, what, M, N, K, S);
      split->splits = S;
      split->stride = tu.split_stride;
      return GLMRT_OK;
    }
  }
  // The streaming kernel beats cuBLASLt only up to 8 rows (docs/perf.md); past
  // that, the tensor-core streaming kernel (no bias, up to
  // kStreamTcDenseMaxRows) or cuBLASLt, when their 16-byte alignment holds.
  if (P <= kStreamMaxRows || N % 16 != 0 || K % 16 != 0) {
    glmk::StreamGemmArgs a = dense;
    a.bias = bias;
    a.X = X;
    a.x_scale = xs;
    a.max_rows_per_group = std::min(P, 64);
    a.ksplit = P <= 64 ? glmk::gemm_fp8_stream_splits(P, N, K, r.num_sms) : 1;
    a.ws = r.split_ws;
    // Programmatic dependent launch: the weights start streaming while the
    // kernel before (which triggers its dependents early) finishes. Not under
    // profiling, whose event nodes sit between the kernels.
    a.pdl = pdl ? 1 : 0;
    KCHECK(glmk::gemm_fp8_stream(a, r.stream), "layer %d %s: gemm_fp8_stream M=%d N=%d K=%d", layer,
           what, M, N, K);
    return GLMRT_OK;
  }
  // Up to kStreamTcDenseMaxRows rows on sm_90, a linear without a bias whose
  // K splits no kernel after sums (the dense layers' MLP, o_proj with tensor
  // parallelism) streams unsplit through the tensor-core kernel, whose
  // weight loads carry the L2 evict_first hint (cuBLASLt's cannot, so its
  // ~40 MB per layer flushed what the small kernels keep in L2). In isolation
  // on an H200 (stream_tc_check --bench, 2026-11-25) it also beat cuBLASLt at
  // 16 rows on those shapes: 13.1 vs 16.1 us (3072 x 5120), 7.4 vs 8.2 (5120 x
  // 1536). In the step (H200, 2k context): batch 16 15.05 -> 14.15 ms, 24 17.1
  // -> 16.4, 32 18.4 -> 17.95; with the bound at 64, batch 64 got 3% slower.
  if (P <= kStreamTcDenseMaxRows && !bias && r.stream_tc && glmk::gemm_fp8_stream_tc_supported(N, K)) {
    glmk::StreamGemmArgs a = dense;
    a.X = X;
    a.x_scale = xs;
    a.max_rows_per_group = P;
    KCHECK(glmk::gemm_fp8_stream_tc(a, glmk::StreamTcWorkspace{}, glmk::StreamTcTuning{}, r.stream),
           "layer %d %s: gemm_fp8_stream_tc M=%d N=%d K=%d", layer, what, M, N, K);
    return GLMRT_OK;
  }
  // cuBLASLt with the per-token and per-channel scales applied inside: no
  // second kernel. cuBLASLt 13.0 on an H200 has such FP8 algorithms without a
  // bias epilogue but none with one (kernel_check, 2026-11-24), so linears with
  // a bias (q|k|v) keep the plain GEMM + gemm_fp8_epilogue, as does a cuBLASLt
  // without any.
  if (r.lt_scaled != 0 && !bias && !(epilogue_deferred && P <= kLtDeferMaxRows)) {
    bool unsupported = false;
    std::string err;
    if (acc_into && accumulated && r.lt_accumulate != 0) {
      err = glmk::lt_gemm_fp8_scaled(r.lt, W, X, acc_into, M, N, K, xs, ws, bias, &unsupported, r.stream,
                                     true);
      if (err.empty() && !unsupported) {
        r.lt_scaled = r.lt_accumulate = 1;
        *accumulated = true;
        return GLMRT_OK;
      }
      if (err.empty() && r.lt_accumulate == -1) r.lt_accumulate = 0;  // none: stop asking
      unsupported = false;
    }
    if (err.empty())
      err = glmk::lt_gemm_fp8_scaled(r.lt, W, X, Y, M, N, K, xs, ws, bias, &unsupported, r.stream);
    if (!err.empty())
      return fail(GLMRT_ERR_CUDA, "GPU %d: layer %d %s (M=%d N=%d K=%d): %s", r.device, layer, what,
                  M, N, K, err.c_str());
    if (!unsupported) {
      r.lt_scaled = 1;
      return GLMRT_OK;
    }
    if (r.lt_scaled == -1) r.lt_scaled = 0;  // none at all: stop asking
  }
  std::string err = glmk::lt_gemm_fp8(r.lt, W, X, Y, M, N, K, r.stream);
  if (!err.empty())
    return fail(GLMRT_ERR_CUDA, "GPU %d: layer %d %s (M=%d N=%d K=%d): %s", r.device, layer, what, M,
                N, K, err.c_str());
  if (epilogue_deferred) {
    *epilogue_deferred = true;
    return GLMRT_OK;
  }
  KCHECK(glmk::gemm_fp8_epilogue(Y, 1, M, N, xs, ws, bias, Y, N, r.stream),
         "layer %d %s: gemm_fp8_epilogue", layer, what);
  return GLMRT_OK;
}

// Rows a routed expert typically gets at the step's launch shape (top_k of E,
// uniform routing).
int typical_rows_per_expert(const Engine& e, const Meta& m) {
  return (m.policy_rows * e.d.K + e.d.E - 1) / e.d.E;
}

// Whether the routed experts run through the tensor-core grouped GEMM (many
// rows per expert: prefill-sized steps); see mlp_block.
bool experts_grouped_tc(const Engine& e, const Meta& m) {
  return !e.exact && typical_rows_per_expert(e, m) > kGroupedTcMinRows &&
         glmk::gemm_fp8_grouped_tc_supported(2 * e.d.MI, e.d.H) &&
         glmk::gemm_fp8_grouped_tc_supported(e.d.H, e.d.MI);
}

// Rows a step may have (Meta::policy_rows) for the shared expert to be one
// more group of the routed experts' tensor-core streaming GEMMs (see
// shared_dense_mlp).
constexpr int kSharedGroupedMaxRows = 128;

// Rows a step needs for the MoE router's logits to come from the residual
// rows (router_logits_normed, see mlp_block) rather than cuBLAS's SGEMM.
#ifndef GLMRT_ROUTER_FROM_H_MIN_ROWS
#define GLMRT_ROUTER_FROM_H_MIN_ROWS 512
#endif
constexpr int kRouterFromHMinRows = GLMRT_ROUTER_FROM_H_MIN_ROWS;

// Whether a prefill MoE layer's post-attention norm and router logits are one
// launch (rmsnorm_router_logits; mlp_block also needs o_proj's product added
// into h already, which one GPU's cuBLASLt path does): from
// kNormLogitsMinRows rows. H200, small_check --bench (2026-11-29, us, norm +
// logits in two launches -> one): 512 rows 17.19 -> 18.44, 1,024 20.45 ->
// 19.02, 2,048 29.26 -> 24.53, 8,192 106.47 -> 91.07; TTFT 2,048 ~44.6 -> ~44.3 ms.
constexpr int kNormLogitsMinRows = 1024;
bool norm_logits_one_launch(const Engine& e, const Meta& m) {
  return !e.exact && e.tp == 1 && m.policy_rows >= std::max(kRouterFromHMinRows, kNormLogitsMinRows) &&
         !glmk::router_fused_supported(m.policy_rows, e.d.E, e.d.H) &&
         glmk::router_logits_normed_supported(e.d.E, e.d.H) && glmk::rmsnorm_router_logits_supported(e.d.E, e.d.H);
}

// Whether a MoE layer's post-attention norm and router are one launch
// (add_rmsnorm_router: E <= 32, thread-block clusters) instead of add_rmsnorm
// + router_fused: from GLMRT_NORM_ROUTER_MIN_ROWS rows (a step's policy rows)
// to the kernel's 112 (0: never; A/B libraries). H200, rank share, 2k context
// (docs/perf.md, 2026-11-28 eighth session), decode step ms, the two launches
// -> one: batch 2 5.71 -> 5.65, 4 6.92 -> 6.84, 8 9.04 -> 8.97, 16 12.2 ->
// 12.05, 32 15.57 -> 15.23, 48 17.03 -> 16.9, 64 18.03 -> 17.8, 96 20.23 ->
// 20.1, 112 20.67 -> 20.47 (moe.cu kNrMaxT).
#ifndef GLMRT_NORM_ROUTER_MIN_ROWS
#define GLMRT_NORM_ROUTER_MIN_ROWS 2
#endif
bool norm_router_one_launch(const Engine& e, const Meta& m, int T) {
  return GLMRT_NORM_ROUTER_MIN_ROWS > 0 && !e.exact && m.policy_rows >= GLMRT_NORM_ROUTER_MIN_ROWS &&
         glmk::add_rmsnorm_router_supported(m.policy_rows, e.d.E, e.d.H) &&
         glmk::add_rmsnorm_router_supported(T, e.d.E, e.d.H);
}

// Whether the routed experts run through gemm_fp8_stream_tc (a few rows per
// expert past kStreamMaxRows rows a step, on sm_90): gate|up always, down too
// when the shared expert is one of their groups.
bool experts_stream_tc(const Engine& e, const Meta& m) {
  return !e.exact && !experts_grouped_tc(e, m) && e.ranks[0].stream_tc && m.policy_rows > kStreamMaxRows &&
         glmk::gemm_fp8_stream_tc_supported(2 * e.d.MI, e.d.H);
}

// Whether the shared expert (GPU 0) runs apart as a dense MLP through the
// linear path, its output added last by the combine. Otherwise it is one more
// group of the routed experts' GEMMs (router slot top_k, a row for every
// token), which saves its three launches (gate|up, SiLU, down):
// - up to kStreamMaxRows rows, the last group of the grouped streaming GEMM;
// - from there to kSharedGroupedMaxRows rows, a group of the tensor-core
//   streaming GEMMs (gate|up and down), whose token tiles hold all its rows
//   up to 32 and half of them past 32 (shared_group_token_tile: two tiles,
//   the second's weights read mostly from L2; down_token_tile narrower). A/B
//   on one H100 (2026-11-27, rank share, 2k context): batch 16 16.5 -> 15.4
//   ms, batch 64 24.85 -> 24.2; with 64-row tiles past 64 rows, batch 80
//   24.55 -> 24.1, 96 25.5 -> 24.95, 112 26.2 -> 25.6, 128 26.75 -> 26.15, but
//   160 29.3 -> 29.6, 192 29.8 -> 30.4 and 256 32.5 -> 33.7 (with 128-row
//   tiles 128 and 256 were slower still: 27.3 -> 30.5, 34.0 -> 37.2);
// - when the routed experts go through the grouped tensor-core GEMM (prefill),
//   a group of every token's row there, its m-tiles filling the same launches
//   (H200, 2k-token prefill: the dense MLP took 50 + 10 + 34 us per layer in
//   three more launches beside 110-140 + 11 + 80 us of routed experts).
bool shared_dense_mlp(const Engine& e, const Meta& m) {
  if (e.ranks[0].shared_local < 0 || e.exact || m.policy_rows <= kStreamMaxRows || experts_grouped_tc(e, m))
    return false;
  return !(m.policy_rows <= kSharedGroupedMaxRows && experts_stream_tc(e, m) &&
           glmk::gemm_fp8_stream_tc_supported(e.d.H, e.d.MI));
}

// The token tile of the tensor-core streaming expert GEMMs (gate|up; down:
// down_token_tile) when the shared expert's group (every token's row) is one
// of theirs: up to 32 rows one tile holds it, so its weights stream once;
// from 33 to 64 rows two 32-row tiles (the second reads its weights mostly
// from L2; one 64-row tile also held every routed expert's 2-6 rows in a
// 64-wide tile: H200, stream_tc_check --experts, 64 tokens + shared 86.0 ->
// 82.8 us; decode step (rank share, 2k context, A/B, ms) batch 40 17.4 ->
// 17.2, 48 17.9 -> 17.7, 64 18.7 -> 18.55, 2026-11-28); past that 64-row
// tiles (the kernel's choice, twice the rows an expert typically gets, would
// cut it into up to 8 tiles: batch 96 25.25 -> 26.7 ms, 128 26.6 -> 29.0 on
// one H100; H200: 128 tokens + shared in 32-row tiles 90.7 -> 100.6 us); 0
// (that choice) otherwise.
int shared_group_token_tile(const Engine& e, const Meta& m) {
  if (e.ranks[0].shared_local < 0 || !experts_stream_tc(e, m) || shared_dense_mlp(e, m)) return 0;
  const int p = m.policy_rows;  // <= kSharedGroupedMaxRows here
  return p <= 16 ? 16 : p <= 64 ? 32 : 64;
}

// The down projection's token tile on the tensor-core streaming path. Narrower
// than gate|up's: down's units are short (K 1,536: 12 stages), and a wide
// tile over a routed expert's few rows cost it more than re-reading weights
// from L2 saves. H200, stream_tc_check --experts (2026-11-28, us, tiles 64 /
// 32 / 16): 64 tokens + the shared group 54.6 / 51.8 / 49.0 (16: the shared
// rows span four tiles, its 7.9 MB read once per tile, the later reads mostly
// from L2); 256 tokens (no shared group) 55.7 / 52.1 (the kernel's own
// choice) / 50.2; but 128 + shared 55.4 (64) / 58.5 / 59.4. Decode step
// (rank share, 2k context, A/B, three alternations, ms): batch 40 17.57 ->
// 17.47, 48 18.23 -> 18.07, 56 18.6 -> 18.4, 64 18.93 -> 18.77; 176 24.13 ->
// 23.83, 192 24.47 -> 24.27, 224 25.47 -> 25.3, 256 26.13 -> 26.07; 16-32
// rows unchanged, so gate|up's tile stays there and at 65-128 rows (16-row
// tiles made batch 128 21.2 -> 21.4).
int down_token_tile(const Engine& e, const Meta& m) {
  const int t = shared_group_token_tile(e, m);
  if (t == 0) return 16;  // past kSharedGroupedMaxRows: no shared group
  return m.policy_rows > 32 && m.policy_rows <= 64 ? 16 : t;
}

// The input norm of layer l: h += delta (the previous sub-layer's output,
// none before layer 0 and before the MTP layer L, whose residual stream starts
// from eh_proj's output), x = RMSNorm(h) quantized to FP8 (FP32 when exact).
glmk::AddNormArgs input_norm_args(const Engine& e, const Rank& r, int l, int T) {
  glmk::AddNormArgs n;
  n.h = r.h;
  n.delta = (l > 0 && l < e.d.L) ? r.delta : nullptr;
  n.weight = r.layers[l].in_norm;
  n.rows = T;
  n.hidden = e.d.H;
  n.eps = e.cfg.rms_norm_eps;
  if (e.exact) {
    n.out_f32 = r.xf;
  } else {
    n.out_q = r.xq;
    n.out_scale = r.xs;
  }
  return n;
}

// Whether MoE layer l ends with combine_add_rmsnorm: its combine and layer
// l+1's input norm in one kernel. One GPU only (with TP the all-reduce of the
// combine's output sits between them), FP8 path only (the exact path keeps
// the kernels the goldens were first checked with). Depends on the engine
// alone, so mlp_block(l) and attention_block(l+1) agree.
bool combine_feeds_norm(const Engine& e, int l) {
  return !e.exact && e.tp == 1 && l + 1 < e.d.L && e.ranks[0].layers[l].moe &&
         glmk::combine_add_rmsnorm_supported(e.d.H, e.d.slots);
}

// The formats of MoE layer l's rows between the experts' kernels; mlp_block
// writes them so and step_bytes counts them so. On the grouped tensor-core
// path (prefill): gate|up's rows in BF16 (the SiLU kernel widens them back:
// half the bytes its GEMM writes and the SiLU reads; 2k-token prefill on an
// H100: 50 MB a layer in FP32, the SiLU 21 us at 73% of DRAM), on sm_90 with
// SiLU·up in gate|up's epilogue instead (GroupedTcTuning::silu_gate_up: the
// BF16 activations [rows][MI], half of the gate|up rows' bytes, a quantization
// pass over them replacing the SiLU pass), and down's rows in BF16 where the
// combine feeds the next norm (the combine widens them back and sums in FP32:
// 2k-token prefill on an H100, 84 MB per layer in FP32, the combine 61 us at
// 78% of DRAM; the residual rows stay FP32, and the FP8 rows the next layer
// reads are what the rounding reaches, well below their own 2^-4 steps).
// FP32 otherwise.
struct ExpertRowFormats {
  bool gate_up_bf16 = false;  // gate|up (or, silu_fused, the activations) in BF16
  bool silu_fused = false;
  bool down_bf16 = false;
};
ExpertRowFormats expert_row_formats(const Engine& e, const Meta& m, int l) {
  ExpertRowFormats f;
  const bool grouped = experts_grouped_tc(e, m);
  f.gate_up_bf16 = grouped && glmk::silu_mul_quant_bf16_supported(e.d.MI);
  f.silu_fused = f.gate_up_bf16 && !e.exact && glmk::gemm_fp8_grouped_tc_silu_supported(2 * e.d.MI, e.d.H);
  f.down_bf16 = grouped && !e.exact && combine_feeds_norm(e, l);
  return f;
}

// Whether the attention half of this step's layers runs as one attn_layer_t1
// launch (q|k|v, q/k norm + RoPE + the KV write, attention, o_proj; kernels.h):
// one decoding token on the FP8 path. At batch 1 those were four launches.
bool attn_one_launch(const Engine& e, const Rank& r, const Meta& m) {
  return r.attn_t1_ws && !e.exact && !e.f32kv && m.rows == 1 && m.policy_rows == 1 && m.n_dec == 1 &&
         m.n_items == 0;
}

// A layer's paged cache into an attention launch's arguments (DecodeAttnArgs,
// PrefillAttnArgs, AttnT1Args): the BF16 pointers, or on the FP8 cache the
// codes and scales (glmk::QkRopeArgs::kv_fp8).
template <class Args>
void set_kv_cache(const Engine& e, const LayerDev& L, Args& a) {
  if (e.kv8) {
    a.k_cache8 = static_cast<decltype(a.k_cache8)>(L.k_cache);
    a.v_cache8 = static_cast<decltype(a.v_cache8)>(L.v_cache);
    a.k_scale = L.k_scale;
    a.v_scale = L.v_scale;
  } else {
    a.k_cache = static_cast<decltype(a.k_cache)>(L.k_cache);
    a.v_cache = static_cast<decltype(a.v_cache)>(L.v_cache);
  }
}

int attention_block(Engine& e, Rank& r, int l, const Meta& m) {
  const Dims& d = e.d;
  const MetaLayout& ML = e.ml;
  LayerDev& L = r.layers[l];
  unsigned char* M = r.meta;
  const int T = m.rows;
  if (l == 0 || !combine_feeds_norm(e, l - 1)) {
    KCHECK(glmk::add_rmsnorm(input_norm_args(e, r, l, T), r.stream), "layer %d: input add_rmsnorm", l);
    PROF(GLMRT_PROF_NORM);
  }
  if (attn_one_launch(e, r, m)) {
    glmk::AttnT1Args a;
    a.xq = r.xq;
    a.xs = r.xs;
    a.H = d.H;
    a.n_q_heads = d.nq_l;
    a.n_kv_heads = d.nkv_l;
    a.rot_dim = d.rot;
    a.qkv_w = L.qkv;
    a.qkv_scale = L.qkv_scale;
    a.qkv_bias = L.qkv_bias;
    a.q_norm = L.q_norm;
    a.k_norm = L.k_norm;
    a.eps = e.cfg.rms_norm_eps;
    a.inv_freq = r.inv_freq;
    a.positions = at<int>(M, m.rm.positions);
    a.slots = at<int>(M, m.rm.slots);
    a.ctx_len = at<int>(M, m.rm.dec_ctx);
    a.bt_offset = at<int>(M, m.rm.dec_bt);
    a.block_tables = at<int>(M, ML.bt);
    a.block_size = e.block_size;
    set_kv_cache(e, L, a);
    a.scale = 1.0f / sqrtf((float)d.D);
    a.o_w = L.o;
    a.o_scale = L.o_scale;
    a.delta = r.delta;
    a.workspace = r.attn_t1_ws;
    a.ws_ctas = r.num_sms;
    KCHECK(glmk::attn_layer_t1(a, r.stream), "layer %d: attn_layer_t1 (one-token attention layer)", l);
    r.o_in_h = false;
    r.o_splits = 1;
    PROF(GLMRT_PROF_ATTN_LAYER);
    return GLMRT_OK;
  }
  // Past the streaming kernel's rows, q|k|v (which has a bias) comes from
  // cuBLASLt unscaled and the rope kernel applies its epilogue (H200, 2k-token
  // prefill: the epilogue kernel took 16 us per layer, 3.4 us at batch 64).
  bool qkv_raw = false;
  SplitOut qkv_split;
  GLMRT_TRY(linear(r, L.qkv, L.qkv_scale, L.qkv_bias, d.qkv_rows, d.H, r.xq, r.xs,
                   e.exact ? r.xf : nullptr, T, m.policy_rows, r.qkv, l, "q|k|v", !e.prof.on, &qkv_raw,
                   nullptr, nullptr, e.exact ? nullptr : &qkv_split));
  PROF(GLMRT_PROF_QKV);
  glmk::QkRopeArgs q;
  q.qkv = qkv_split.splits > 1 ? r.lin_parts : r.qkv;
  q.qkv_splits = qkv_split.splits;
  q.qkv_split_stride = qkv_split.stride;
  q.T = T;
  q.n_q_heads = d.nq_l;
  q.n_kv_heads = d.nkv_l;
  q.head_dim = d.D;
  q.rot_dim = d.rot;
  q.q_norm = L.q_norm;
  q.k_norm = L.k_norm;
  q.eps = e.cfg.rms_norm_eps;
  q.inv_freq = r.inv_freq;
  q.positions = at<int>(M, m.rm.positions);
  q.slots = at<int>(M, m.rm.slots);
  q.block_size = e.block_size;
  q.q_out = r.q;
  q.k_cache = L.k_cache;
  q.v_cache = L.v_cache;
  q.kv_f32 = e.f32kv;
  q.kv_fp8 = e.kv8;
  q.k_scale = L.k_scale;
  q.v_scale = L.v_scale;
  if (qkv_raw) {
    q.x_scale = r.xs;
    q.w_scale = L.qkv_scale;
    q.bias = L.qkv_bias;
  }
  KCHECK(glmk::qk_norm_rope_kv_write(q, r.stream), "layer %d: qk_norm_rope_kv_write", l);
  PROF(GLMRT_PROF_ROPE_KV);
  const float scale = 1.0f / sqrtf((float)d.D);
  if (m.n_dec > 0) {
    glmk::DecodeAttnArgs a;
    a.q = r.q;
    set_kv_cache(e, L, a);
    a.block_size = e.block_size;
    a.n_q_heads = d.nq_l;
    a.n_kv_heads = d.nkv_l;
    a.scale = scale;
    a.n_seqs = m.n_dec;
    a.q_row = at<int>(M, m.rm.dec_qrow);
    a.ctx_len = at<int>(M, m.rm.dec_ctx);
    a.bt_offset = at<int>(M, m.rm.dec_bt);
    a.block_tables = at<int>(M, ML.bt);
    a.max_splits = m.dec_splits;
    a.ctx_class = m.ctx_class;
    a.out = r.attn;
    if (m.dec_quant) {
      a.out_q = r.xq;
      a.out_scale = r.xs;
    }
    a.workspace = r.dec_ws;
    // Launched early (programmatic dependent launch): the metadata, block
    // tables and first KV lines are fetched while the rope kernel runs (H200,
    // 2026-11-24: batch 1 -2%, the kernel's cold start in the step is mostly L2
    // misses). Past 8 sequences only where the grid fits one wave, its shared
    // memory padded to one CTA per SM: unpadded, the early CTAs of a one-split
    // grid packed two to an SM on the SMs rope left free (batch 128 / 16k: 43
    // -> 57 ms per step); padded, on one H100 (2026-11-27, 2k context) batch 16
    // 15.05 -> 14.9 ms, 32 19.55 -> 19.4, 64 23.1 -> 22.9. Not under profiling,
    // whose events sit between the kernels.
    const int64_t ctas = (int64_t)m.dec_splits * d.nkv_l * m.n_dec;
    a.pdl = !e.prof.on && (m.n_dec <= 8 || ctas <= r.num_sms) ? 1 : 0;
    a.one_per_sm = a.pdl && m.n_dec > 8 ? 1 : 0;
    KCHECK(glmk::attention_decode(a, r.stream), "layer %d: attention_decode (%d sequences, %d splits)",
           l, m.n_dec, m.dec_splits);
  }
  if (m.n_items > 0 && e.prefill_tc) {
    glmk::PrefillAttnArgs a;
    a.q = r.q;
    set_kv_cache(e, L, a);
    a.block_size = e.block_size;
    a.n_q_heads = d.nq_l;
    a.n_kv_heads = d.nkv_l;
    a.scale = scale;
    a.positions = at<int>(M, m.rm.positions);
    a.seq_bt_offset = at<int>(M, ML.bt_off);
    a.block_tables = at<int>(M, ML.bt);
    a.items = at<glmk::PrefillItem>(M, m.items);
    a.n_items = m.n_items;
    a.rows = m.pf_rows;
    a.n_parts = m.pf_parts;
    a.out = r.attn;
    a.workspace = r.pf_ws;
    KCHECK(glmk::attention_prefill(a, r.stream), "layer %d: attention_prefill (%d items, %d pieces)", l,
           m.n_items, m.pf_parts);
  } else if (m.n_items > 0) {
    glmk::AttnArgs a;
    a.q = r.q;
    a.k_cache = L.k_cache;
    a.v_cache = L.v_cache;
    a.kv_f32 = e.f32kv;
    a.block_size = e.block_size;
    a.n_q_heads = d.nq_l;
    a.n_kv_heads = d.nkv_l;
    a.scale = scale;
    a.positions = at<int>(M, m.rm.positions);
    a.seq_bt_offset = at<int>(M, ML.bt_off);
    a.block_tables = at<int>(M, ML.bt);
    a.items = at<glmk::AttnItem>(M, m.items);
    a.n_items = m.n_items;
    a.out = r.attn;
    a.part_o = r.part_o;
    a.part_ml = r.part_ml;
    KCHECK(glmk::attention_paged(a, r.stream), "layer %d: attention_paged (%d items)", l, m.n_items);
    KCHECK(glmk::attention_merge(at<glmk::AttnMerge>(M, m.merges), m.n_merges, d.nq_l, r.part_o,
                                 r.part_ml, r.attn, r.stream),
           "layer %d: attention_merge", l);
  }
  const int ko = d.nq_l * d.D;
  if (!e.exact && !m.dec_quant)
    KCHECK(glmk::quant_rows_fp8(r.attn, ko, T, ko, r.xq, ko, r.xs, nullptr, r.stream),
           "layer %d: quantize attention output", l);
  PROF(GLMRT_PROF_ATTENTION);
  // On one GPU, where o_proj runs on cuBLASLt (past kStreamTcDenseMaxRows
  // rows), its product is added to the residual rows h by the GEMM itself
  // (r.o_in_h) and the post-attention norm reads h alone: 2k-token prefill on
  // an H100 moved 178 MB per layer through that norm (h and delta in, h, the
  // router's FP32 rows and the FP8 rows out, 60 us at 77% of DRAM). With TP
  // the partial products are all-reduced first, so they stay apart.
  // Also on one GPU only: o_proj's K splits left apart for that norm to sum.
  const bool o_acc = e.tp == 1 && !e.exact;
  SplitOut o_split;
  GLMRT_TRY(linear(r, L.o, L.o_scale, nullptr, d.H, ko, r.xq, r.xs, e.exact ? r.attn : nullptr, T,
                   m.policy_rows, r.delta, l, "o_proj", !e.prof.on, nullptr, o_acc ? r.h : nullptr,
                   &r.o_in_h, o_acc ? &o_split : nullptr));
  r.o_splits = o_split.splits;
  r.o_split_stride = o_split.stride;
  PROF(GLMRT_PROF_O_PROJ);
  return GLMRT_OK;
}

// The router's selection arguments of MoE layer l for T rows (shared_dense:
// the shared expert runs apart, its slot left empty).
glmk::RouterArgs router_args(const Engine& e, const Rank& r, int l, const Meta& m, int T, bool shared_dense) {
  const Dims& d = e.d;
  glmk::RouterArgs ra;
  ra.logits = r.router_logits;
  ra.bias = r.layers[l].router_bias;
  ra.T = T;
  ra.E = d.E;
  ra.top_k = d.K;
  ra.n_group = e.cfg.n_group;
  ra.topk_group = e.cfg.topk_group;
  ra.norm_topk = e.cfg.norm_topk_prob;
  ra.scale = e.cfg.routed_scaling_factor;
  ra.expert_begin = r.expert_begin;
  ra.n_local = r.n_local_experts;
  ra.shared_local = shared_dense ? -1 : r.shared_local;
  ra.slots = d.slots;
  ra.ids = r.topk_ids;
  ra.w = r.topk_w;
  ra.n_valid = m.graph ? at<int>(r.meta, m.rm.n_valid) : nullptr;
  return ra;
}

// Whether MoE layer l of this step runs as one moe_decode_t1 launch (post-
// attention norm, router, experts, SiLU, combine and the next layer's input
// norm; kernels.h): one token on one GPU on the FP8 path, where the layer's
// combine feeds the next layer's norm. At batch 1 those were seven launches.
bool moe_one_launch(const Engine& e, const Rank& r, int l, const Meta& m) {
  return r.moe_t1_ws && !e.exact && r.o_splits == 1 && m.rows == 1 && m.policy_rows == 1 &&
         combine_feeds_norm(e, l) &&
         !shared_dense_mlp(e, m);
}

int mlp_block(Engine& e, Rank& r, int l, const Meta& m) {
  const Dims& d = e.d;
  LayerDev& L = r.layers[l];
  const int T = m.rows;
  if (moe_one_launch(e, r, l, m)) {
    glmk::MoeT1Args a;
    a.h = r.h;
    a.delta = r.o_in_h ? nullptr : r.delta;  // o_proj already added to h (attention_block)
    a.post_norm = L.post_norm;
    a.eps = e.cfg.rms_norm_eps;
    a.H = d.H;
    a.MI = d.MI;
    a.router_W = L.router;
    a.sel = router_args(e, r, l, m, 1, false);
    a.sel.n_valid = nullptr;
    a.e_gu = L.e_gu;
    a.e_gu_scale = L.e_gu_scale;
    a.e_down = L.e_down;
    a.e_down_scale = L.e_down_scale;
    a.n_groups = r.groups;
    a.offsets = r.offsets;
    const glmk::AddNormArgs next = input_norm_args(e, r, l + 1, T);
    a.next_norm = next.weight;
    a.out_q = next.out_q;
    a.out_scale = next.out_scale;
    a.workspace = r.moe_t1_ws;
    KCHECK(glmk::moe_decode_t1(a, r.stream), "layer %d: moe_decode_t1 (one-token MoE layer)", l);
    if (e.prof.on && r.index == 0)
      KCHECK(profile_count_active(r.offsets, r.groups, r.prof_active, l, r.stream),
             "layer %d: profile count", l);
    PROF(GLMRT_PROF_MOE_LAYER);
    return GLMRT_OK;
  }
  glmk::AddNormArgs n;
  n.h = r.h;
  n.delta = r.o_in_h ? nullptr : r.delta;  // o_proj already added to h (attention_block)
  if (r.o_splits > 1) {  // o_proj's K-split slices (attention_block), summed here
    n.delta = r.lin_parts;
    n.delta_splits = r.o_splits;
    n.delta_split_stride = r.o_split_stride;
  }
  n.weight = L.post_norm;
  n.rows = T;
  n.hidden = d.H;
  n.eps = e.cfg.rms_norm_eps;
  if (!e.exact) {
    n.out_q = r.xq;
    n.out_scale = r.xs;
  }
  // From kRouterFromHMinRows rows (prefill steps) the router's logits come
  // from the residual rows and the norm's per-row factors
  // (router_logits_normed): the norm's FP32 output rows are not written and
  // read back. H200, small_check --bench (norm + logits, us): 512 rows 26.5
  // against 30.1 with the FP32 rows and cuBLAS's SGEMM, 2,048 43.2 against
  // 60.7 (the FMA form, ~30 us a CTA whatever the grid, kept this at 1,536).
  const bool fused_router = L.moe && !e.exact && glmk::router_fused_supported(m.policy_rows, d.E, d.H);
  const bool router_from_h = L.moe && !e.exact && !fused_router && r.rstd &&
                             m.policy_rows >= kRouterFromHMinRows &&
                             glmk::router_logits_normed_supported(d.E, d.H);
  const bool norm_router = L.moe && fused_router && r.router_ws && norm_router_one_launch(e, m, T);
  n.out_f32 = ((L.moe && !router_from_h && !norm_router) || e.exact) ? r.xf : nullptr;
  n.out_rstd = router_from_h ? r.rstd : nullptr;
  // And with no delta to add (o_proj added into h), that norm and the logits
  // are one launch (rmsnorm_router_logits): h is read from HBM once, not
  // twice (its second pass reads the CTA's rows back from L2).
  const bool norm_logits = router_from_h && norm_logits_one_launch(e, m) && !n.delta && !n.out_f32 && !n.row_index;
  if (!norm_router && !norm_logits) {
    KCHECK(glmk::add_rmsnorm(n, r.stream), "layer %d: post-attention add_rmsnorm", l);
    PROF(GLMRT_PROF_NORM);
  }
  const float* xf_in = e.exact ? r.xf : nullptr;
  if (!L.moe) {
    // The SiLU applies gate|up's scales where cuBLASLt's plain GEMM runs it.
    bool gu_raw = false;
    const bool can_defer = !e.exact && glmk::silu_mul_quant_fp8_scaled_supported(d.I_l, L.gu_scale);
    GLMRT_TRY(linear(r, L.gu, L.gu_scale, nullptr, 2 * d.I_l, d.H, r.xq, r.xs, xf_in, T,
                     m.policy_rows, r.big, l, "gate|up", !e.prof.on, can_defer ? &gu_raw : nullptr));
    PROF(GLMRT_PROF_DENSE_GATE_UP);
    if (e.exact)
      KCHECK(glmk::silu_mul_f32(r.big, T, d.I_l, r.hf, nullptr, r.stream), "layer %d: silu_mul", l);
    else if (gu_raw)
      KCHECK(glmk::silu_mul_quant_fp8_scaled(r.big, T, d.I_l, r.xs, L.gu_scale, r.hq, r.hs, r.stream),
             "layer %d: silu_mul_quant (gate|up scales)", l);
    else
      KCHECK(glmk::silu_mul_quant_fp8(r.big, T, d.I_l, r.hq, r.hs, nullptr, r.stream),
             "layer %d: silu_mul_quant", l);
    PROF(GLMRT_PROF_ACTIVATION);
    GLMRT_TRY(linear(r, L.down, L.down_scale, nullptr, d.H, d.I_l, r.hq, r.hs,
                     e.exact ? r.hf : nullptr, T, m.policy_rows, r.delta, l, "down", !e.prof.on));
    PROF(GLMRT_PROF_DENSE_DOWN);
    return GLMRT_OK;
  }
  // The shared expert sees every token: one more group of the routed GEMMs
  // (router slot top_k) or, from kSharedGroupedMaxRows rows up to prefill
  // sizes, a dense MLP on the linear path, its output added last by the
  // combine and its router slot empty (shared_dense_mlp).
  const bool shared_dense = shared_dense_mlp(e, m);
  const glmk::RouterArgs ra = router_args(e, r, l, m, T, shared_dense);
  if (fused_router) {
    glmk::RouterFusedArgs rf;
    rf.sel = ra;
    rf.x = r.xf;
    rf.W = L.router;
    rf.H = d.H;
    rf.n_groups = r.groups;
    rf.offsets = r.offsets;
    rf.sorted_rows = r.sorted_rows;
    rf.inv = r.inv;
    rf.workspace = r.router_ws;
    if (norm_router)  // the norm above in the same launch (counted as the router's under --profile)
      KCHECK(glmk::add_rmsnorm_router(n, rf, r.stream), "layer %d: post-attention add_rmsnorm + router", l);
    else
      KCHECK(glmk::router_fused(rf, r.stream), "layer %d: router_fused", l);
  } else {
    if (norm_logits) {  // the norm above in the same launch (counted as the router's under --profile)
      KCHECK(glmk::rmsnorm_router_logits(n, L.router, r.router_logits, d.E, r.stream),
             "layer %d: post-attention norm + router logits", l);
    } else if (router_from_h) {
      KCHECK(glmk::router_logits_normed(r.h, L.post_norm, r.rstd, L.router, r.router_logits, T, d.E, d.H,
                                        r.stream),
             "layer %d: router_logits_normed", l);
    } else {
      std::string err = glmk::gemm_f32_nt(r.cublas, r.xf, L.router, r.router_logits, T, d.E, d.H, r.stream);
      if (!err.empty()) return fail(GLMRT_ERR_CUDA, "GPU %d: layer %d router: %s", r.device, l, err.c_str());
    }
    KCHECK(glmk::router_topk(ra, r.stream), "layer %d: router_topk", l);
    KCHECK(glmk::moe_align(r.topk_ids, T, d.slots, r.groups, r.offsets, r.sorted_rows, r.inv, r.stream),
           "layer %d: moe_align", l);
  }
  if (e.prof.on && r.index == 0)
    KCHECK(profile_count_active(r.offsets, r.groups, r.prof_active, l, r.stream),
           "layer %d: profile count", l);
  PROF(GLMRT_PROF_ROUTER);
  // (With tensor parallelism only GPU 0 holds the shared expert: the other
  // ranks' combines add nothing, their sh_out being null.)
  if (shared_dense && r.shared_local >= 0) {
    const size_t MI = d.MI, H = d.H, sg = r.shared_local;
    const float* gu_scale = L.e_gu_scale + sg * 2 * MI;
    bool gu_raw = false;  // as the dense MLP's above
    const bool can_defer = glmk::silu_mul_quant_fp8_scaled_supported(d.MI, gu_scale);
    GLMRT_TRY(linear(r, L.e_gu + sg * 2 * MI * H, gu_scale, nullptr, 2 * d.MI, d.H, r.xq, r.xs, nullptr, T,
                     m.policy_rows, r.sh_big, l, "shared expert gate|up", false, can_defer ? &gu_raw : nullptr));
    PROF(GLMRT_PROF_EXPERT_GATE_UP);
    if (gu_raw)
      KCHECK(glmk::silu_mul_quant_fp8_scaled(r.sh_big, T, d.MI, r.xs, gu_scale, r.sh_hq, r.sh_hs, r.stream),
             "layer %d: shared expert silu_mul_quant (gate|up scales)", l);
    else
      KCHECK(glmk::silu_mul_quant_fp8(r.sh_big, T, d.MI, r.sh_hq, r.sh_hs, nullptr, r.stream),
             "layer %d: shared expert silu_mul_quant", l);
    PROF(GLMRT_PROF_ACTIVATION);
    GLMRT_TRY(linear(r, L.e_down + sg * H * MI, L.e_down_scale + sg * H, nullptr, d.H, d.MI, r.sh_hq,
                     r.sh_hs, nullptr, T, m.policy_rows, r.sh_out, l, "shared expert down"));
    PROF(GLMRT_PROF_EXPERT_DOWN);
  }
  glmk::StreamGemmArgs g;
  g.W = L.e_gu;
  g.w_scale = L.e_gu_scale;
  g.X = r.xq;
  g.x_scale = r.xs;
  g.Xf = xf_in;
  g.x_rows = r.sorted_rows;
  g.group_offsets = r.offsets;
  g.groups = r.groups;
  g.N = 2 * d.MI;
  g.K = d.H;
  g.max_rows_per_group = m.policy_rows;
  g.max_active_groups = std::min(r.groups, m.policy_rows * d.slots);  // a token hits <= slots groups
  // Rows an expert typically gets (top_k of E, uniform) pick the row tile, so a
  // few rows per expert stream through the pipelined kernel at any batch. Past
  // 8 rows per step the 16-row tile is the floor: on an H200 (kernel_check
  // --bench, rank shapes, 2026-11-24) 8-row tiles ran gate|up at batch 64 in
  // 114 us against 94 for 16-row ones, and the legacy register kernel in 99.
  const int typical = typical_rows_per_expert(e, m);
  g.typical_rows_per_group = m.policy_rows > kStreamMaxRows ? std::max(typical, 9) : typical;
  g.Y = r.big;
  g.ldy = 2 * d.MI;
  // Many rows per expert (prefill): the tensor-core grouped GEMM, whose tiles
  // reuse each weight tile over up to 128 rows; the streaming kernel reads an
  // expert's weights once per 16- or 32-row tile. Its FP8-accumulation tiles
  // (wgmma on the FP8 operands, promoted to FP32 every 128 K, as cuBLASLt and
  // torch._scaled_mm: ~2e-4 relative, far below the FP8 activation rounding)
  // ran gate|up / down at 2,048 rows in 0.127 / 0.101 ms on an H200
  // (grouped_check --bench, 2026-11-24), the exact FP16 tiles in 0.169 /
  // 0.128, the streaming kernel in 0.776 / 0.408. fp8_accum 2: the
  // warp-specialized tile without promotion (W128x256Fast, the precision of
  // the FP8FastAccum CUTLASS kernels vLLM runs on sm_90: ~1e-3 relative, still
  // far below the activations' 2^-4 rounding steps), whose tensor cores never
  // wait for a 128-K chain to retire.
  glmk::GroupedTcTuning gtc;
  gtc.fp8_accum = 2;
  // The W tile's CTAs take tiles from a queue: a 2k prefill's gate|up is 432
  // tiles of unequal cost (a routed expert's streamed from HBM, the shared
  // expert's from L2) over 132 SMs, where a fixed stride left 96 SMs idle
  // through a last round of 36.
  gtc.tile_counter = r.tile_queue;
  const bool grouped_tc = experts_grouped_tc(e, m);
  if (grouped_tc) g.M = T * d.slots;  // bounds the tiles (the streaming form leaves M unset)
  // The rows between the experts' kernels (expert_row_formats): BF16 gate|up
  // rows or SiLU·up activations, BF16 down rows, on that path.
  const ExpertRowFormats rf = expert_row_formats(e, m, l);
  __nv_bfloat16* const gu16 = rf.gate_up_bf16 ? reinterpret_cast<__nv_bfloat16*>(r.big) : nullptr;
  const bool silu_fused = rf.silu_fused;
  // Past kStreamMaxRows rows (a few per expert) on sm_90: the TMA-fed
  // tensor-core streaming kernel, whose 16/32-row token tiles hold an
  // expert's rows in one pass. On an H200 (stream_tc_check --bench, 20 rank
  // experts, top-1) it ran gate|up at 80-84% of HBM from 16 to 128 tokens
  // (gemm_fp8_stream 69-77%) and 77% at 256 (67%); down below.
  const bool stream_tc_gu = experts_stream_tc(e, m);
  glmk::StreamTcTuning stc;
  stc.token_tile = shared_group_token_tile(e, m);
  if (grouped_tc) {
    glmk::StreamGemmArgs gb = g;
    gb.Y = nullptr;  // BF16 rows into gu16 instead
    glmk::GroupedTcTuning gtc_gu = gtc;
    if (silu_fused) {
      gtc_gu.silu_gate_up = 1;
      gb.ldy = d.MI;
    }
    KCHECK(glmk::gemm_fp8_grouped_tc_bf16(gb, gu16, gtc_gu, r.stream), "layer %d: expert gate|up", l);
  } else if (stream_tc_gu) {
    glmk::StreamGemmArgs gt = g;
    gt.M = T * d.slots;
    gt.typical_rows_per_group = typical;
    // (Not launched early with the shared expert's weights prefetched into L2
    // as the streaming kernel is below: on an H100, 2026-11-27, batch 16-32
    // unchanged and batch 64 24.1 -> 24.55 ms.)
    KCHECK(glmk::gemm_fp8_stream_tc(gt, glmk::StreamTcWorkspace{}, stc, r.stream),
           "layer %d: expert gate|up (tensor-core stream)", l);
  } else {
    // Up to kStreamMaxRows rows: launched early (programmatic dependent
    // launch), the shared expert's weights, whose rows are sure to come, are
    // fetched into L2 while the router runs. Not under profiling, whose event
    // nodes sit between the kernels. A/B on one H100 (2026-11-27, rank share,
    // 2k context): batch 2 6.97 -> 6.85 ms, 4 8.28 -> 8.18, 8 11.55 -> 11.15,
    // batch 1 unchanged; the early launch alone (no prefetch) changed nothing.
    glmk::StreamGemmArgs gp = g;
    gp.pdl = !e.prof.on && !e.exact;
    gp.prefetch_group = (gp.pdl && !shared_dense) ? r.shared_local : -1;
    KCHECK(glmk::gemm_fp8_stream(gp, r.stream), "layer %d: expert gate|up", l);
  }
  PROF(GLMRT_PROF_EXPERT_GATE_UP);
  if (e.exact)
    KCHECK(glmk::silu_mul_f32(r.big, T * d.slots, d.MI, r.hf, r.offsets + r.groups, r.stream),
           "layer %d: expert silu_mul", l);
  else if (silu_fused)
    KCHECK(glmk::quant_rows_fp8_bf16(gu16, T * d.slots, d.MI, r.hq, r.hs, r.offsets + r.groups, r.stream),
           "layer %d: expert SiLU*up rows -> FP8", l);
  else if (gu16)
    KCHECK(glmk::silu_mul_quant_fp8(gu16, T * d.slots, d.MI, r.hq, r.hs, r.offsets + r.groups, r.stream),
           "layer %d: expert silu_mul_quant (BF16 rows)", l);
  else
    KCHECK(glmk::silu_mul_quant_fp8(r.big, T * d.slots, d.MI, r.hq, r.hs, r.offsets + r.groups,
                                    r.stream),
           "layer %d: expert silu_mul_quant", l);
  PROF(GLMRT_PROF_ACTIVATION);
  glmk::StreamGemmArgs dn;
  dn.W = L.e_down;
  dn.w_scale = L.e_down_scale;
  dn.X = r.hq;
  dn.x_scale = r.hs;
  dn.Xf = e.exact ? r.hf : nullptr;
  dn.group_offsets = r.offsets;
  dn.groups = r.groups;
  dn.N = d.H;
  dn.K = d.MI;
  dn.max_rows_per_group = m.policy_rows;
  dn.max_active_groups = g.max_active_groups;
  dn.typical_rows_per_group = g.typical_rows_per_group;
  // Prefill-sized steps ending in combine_add_rmsnorm: the expert rows in
  // BF16 (expert_row_formats).
  __nv_bfloat16* const y16 = rf.down_bf16 ? reinterpret_cast<__nv_bfloat16*>(r.ysort) : nullptr;
  dn.Y = y16 ? nullptr : r.ysort;
  dn.ldy = d.H;
  if (grouped_tc) dn.M = T * d.slots;
  // Down streams through the tensor-core kernel too when the shared expert is
  // among the groups (the same token tiles) and from kDownStreamTcMinRows rows.
  // Once its epilogue stopped holding back the weight stream it became the
  // faster kernel there (stream_tc_check --experts on an H100, 2026-11-27: 256
  // tokens 69.6 -> 62.4 us, 73% -> 81% of 3.11 TB/s); in the step (A/B on one
  // H100, 2k context) batch 256 33.25 -> 32.65 ms and 192 30.25 -> 30.1, but
  // 160 29.1 / 29.2 against 29.1 / 29.3, 128 26.6 -> 26.85 and 96 25.25 -> 25.4,
  // so below 192 gemm_fp8_stream stays (also with down_token_tile's 16-row
  // tiles: H200, 2026-11-28, batch 144 22.87 -> 23.0 ms, 160 23.37 -> 23.43).
  if (stc.token_tile > 0 || (stream_tc_gu && m.policy_rows >= kDownStreamTcMinRows)) {
    glmk::StreamGemmArgs dt = dn;
    dt.M = T * d.slots;
    dt.typical_rows_per_group = typical;
    glmk::StreamTcTuning dtc = stc;
    dtc.token_tile = down_token_tile(e, m);
    KCHECK(glmk::gemm_fp8_stream_tc(dt, glmk::StreamTcWorkspace{}, dtc, r.stream),
           "layer %d: expert down (tensor-core stream)", l);
  } else if (grouped_tc && y16) {
    KCHECK(glmk::gemm_fp8_grouped_tc_bf16(dn, y16, gtc, r.stream), "layer %d: expert down (BF16 rows)", l);
  } else if (grouped_tc) {
    KCHECK(glmk::gemm_fp8_grouped_tc_tuned(dn, gtc, r.stream), "layer %d: expert down", l);
  } else {
    // As gate|up: the shared expert's down weights into L2 under the SiLU.
    dn.pdl = !e.prof.on && !e.exact;
    dn.prefetch_group = (dn.pdl && !shared_dense) ? r.shared_local : -1;
    KCHECK(glmk::gemm_fp8_stream(dn, r.stream), "layer %d: expert down", l);
  }
  PROF(GLMRT_PROF_EXPERT_DOWN);
  if (combine_feeds_norm(e, l)) {
    glmk::AddNormArgs next = input_norm_args(e, r, l + 1, T);
    next.delta = nullptr;  // the combine's sum, in registers
    const float* add = shared_dense ? r.sh_out : nullptr;
    if (y16)
      KCHECK(glmk::combine_add_rmsnorm(y16, r.inv, r.topk_w, d.slots, add, next, r.stream),
             "layer %d: moe combine (BF16 rows) + layer %d input add_rmsnorm", l, l + 1);
    else
      KCHECK(glmk::combine_add_rmsnorm(r.ysort, r.inv, r.topk_w, d.slots, add, next, r.stream),
             "layer %d: moe combine + layer %d input add_rmsnorm", l, l + 1);
  } else {
    KCHECK(glmk::moe_combine(r.ysort, r.inv, r.topk_w, T, d.slots, d.H, r.delta, r.stream,
                             shared_dense ? r.sh_out : nullptr),
           "layer %d: moe_combine", l);
  }
  PROF(GLMRT_PROF_MOE_COMBINE);
  return GLMRT_OK;
}

int all_reduce_delta(Engine& e, int T) {
  if (e.tp <= 1) return GLMRT_OK;
  std::vector<float*> bufs;
  std::vector<cudaStream_t> streams;
  for (Rank& r : e.ranks) {
    bufs.push_back(r.delta);
    streams.push_back(r.stream);
  }
  std::string err = glmc::allreduce_sum_f32(e.comm, bufs.data(), (size_t)T * e.d.H, streams.data());
  if (!err.empty()) return fail(GLMRT_ERR_CUDA, "all-reduce of sub-layer outputs: %s", err.c_str());
  Rank& r = e.ranks[0];
  PROF(GLMRT_PROF_COMM);
  return GLMRT_OK;
}

// With a draft model loaded, the final norm of every row (h += delta, then
// RMSNorm into mtp_hid): the MTP layer reads h_i of every position. The
// logits rows' norm then reads the summed h without a delta, the same value
// the one-kernel form sums in registers, so the logits are bit-identical.
int mtp_hidden_block(Engine& e, Rank& r, const Meta& m) {
  glmk::AddNormArgs n;
  n.h = r.h;
  n.delta = r.delta;
  n.weight = r.final_norm;
  n.rows = m.rows;
  n.hidden = e.d.H;
  n.eps = e.cfg.rms_norm_eps;
  n.out_f32 = r.mtp_hid;
  KCHECK(glmk::add_rmsnorm(n, r.stream), "final norm of every row (MTP input)");
  PROF(GLMRT_PROF_NORM);
  return GLMRT_OK;
}

int logits_block(Engine& e, Rank& r, const Meta& m) {
  const Dims& d = e.d;
  const int rows = m.graph ? m.rows : m.n_logits;
  glmk::AddNormArgs n;
  n.h = r.h;
  n.delta = e.draft_k > 0 ? nullptr : r.delta;  // summed by mtp_hidden_block
  n.weight = r.final_norm;
  n.rows = rows;
  n.hidden = d.H;
  n.eps = e.cfg.rms_norm_eps;
  n.row_index = at<int>(r.meta, e.ml.logit_rows);
  if (e.f32kv) n.out_f32 = r.final_f32;
  else n.out_bf16 = r.final_bf16;
  KCHECK(glmk::add_rmsnorm(n, r.stream), "final norm");
  PROF(GLMRT_PROF_NORM);
  std::string err =
      e.f32kv ? glmk::gemm_f32_nt(r.cublas, r.final_f32, r.lm_head_f32, r.logits_local, rows,
                                  d.V_l, d.H, r.stream)
              : glmk::gemm_bf16_nt(r.cublas, r.final_bf16, r.lm_head, r.logits_local, rows,
                                   d.V_l, d.H, r.stream);
  if (!err.empty()) return fail(GLMRT_ERR_CUDA, "GPU %d: lm_head: %s", r.device, err.c_str());
  PROF(GLMRT_PROF_LM_HEAD);
  return GLMRT_OK;
}

// The forward from the embedding to the logits on every GPU: launched eagerly,
// or recorded into a graph while e.ranks[0].stream is capturing.
int forward(Engine& e, const Meta& m) {
  for (Rank& r : e.ranks) {
    GLMRT_CUDA(cudaSetDevice(r.device), "cudaSetDevice");
    KCHECK(glmk::embed_gather(r.embed, at<int>(r.meta, e.ml.tokens), m.rows, e.d.H, r.h, r.stream),
           "embed_gather");
    PROF(GLMRT_PROF_EMBED);
  }
  for (int l = 0; l < e.d.L; ++l) {
    for (Rank& r : e.ranks) {
      GLMRT_CUDA(cudaSetDevice(r.device), "cudaSetDevice");
      GLMRT_TRY(attention_block(e, r, l, m));
    }
    GLMRT_TRY(all_reduce_delta(e, m.rows));
    for (Rank& r : e.ranks) {
      GLMRT_CUDA(cudaSetDevice(r.device), "cudaSetDevice");
      GLMRT_TRY(mlp_block(e, r, l, m));
    }
    GLMRT_TRY(all_reduce_delta(e, m.rows));
  }
  const int rows = m.graph ? m.rows : m.n_logits;
  if (e.draft_k > 0) GLMRT_TRY(mtp_hidden_block(e, e.ranks[0], m));  // TP 1 (check_config)
  for (Rank& r : e.ranks) {
    if (rows == 0) break;  // a step of non-final prefill chunks only
    GLMRT_CUDA(cudaSetDevice(r.device), "cudaSetDevice");
    GLMRT_TRY(logits_block(e, r, m));
  }
  if (e.tp > 1 && m.n_logits > 0) {
    Rank& r = e.ranks[0];
    std::vector<const float*> send;
    std::vector<float*> recv;
    std::vector<cudaStream_t> streams;
    for (Rank& q : e.ranks) {
      send.push_back(q.logits_local);
      recv.push_back(q.logits_gather);
      streams.push_back(q.stream);
    }
    std::string err = glmc::allgather_f32(e.comm, send.data(), recv.data(),
                                          (size_t)m.n_logits * e.d.V_l, streams.data());
    if (!err.empty()) return fail(GLMRT_ERR_CUDA, "all-gather of logits: %s", err.c_str());
    PROF(GLMRT_PROF_COMM);
    GLMRT_CUDA(cudaSetDevice(r.device), "cudaSetDevice");
    KCHECK(glmk::logits_interleave(r.logits_gather, e.tp, m.n_logits, e.d.V_l, r.logits, r.stream),
           "logits_interleave");
    PROF(GLMRT_PROF_LM_HEAD);
  }
  return GLMRT_OK;
}

// Rows the draft pass's head (shared_head.norm, lm_head, argmax) runs: the
// proposing sequences, or in a graph step the bucket's rows (padding entries
// read row 0), so that one captured pass serves any count.
int draft_head_rows(const Meta& m) { return m.graph ? m.rows : m.n_spec; }

// The draft model's head on rows of the MTP layer's output (h + delta, not
// stored back: row_index names row 0 for every padding entry):
// shared_head.norm, the shared lm_head, argmax into out.
int draft_head(Engine& e, Rank& r, int rows, const int* row_index, int* out) {
  const Dims& d = e.d;
  glmk::AddNormArgs n;
  n.h = r.h;
  n.delta = r.delta;
  n.keep_h = true;
  n.weight = r.mtp_head_norm;
  n.rows = rows;
  n.hidden = d.H;
  n.eps = e.cfg.rms_norm_eps;
  n.row_index = row_index;
  n.out_bf16 = r.final_bf16;
  KCHECK(glmk::add_rmsnorm(n, r.stream), "draft pass: shared_head.norm");
  PROF(GLMRT_PROF_NORM);
  std::string err = glmk::gemm_bf16_nt(r.cublas, r.final_bf16, r.lm_head, r.logits_local, rows, d.V_l, d.H, r.stream);
  if (!err.empty()) return fail(GLMRT_ERR_CUDA, "GPU %d: draft pass: lm_head: %s", r.device, err.c_str());
  PROF(GLMRT_PROF_LM_HEAD);
  KCHECK(glmk::argmax_rows(r.logits_local, d.V_l, rows, d.V_l, out, r.stream), "draft pass: argmax");
  PROF(GLMRT_PROF_SAMPLING);
  return GLMRT_OK;
}

// The draft pass (docs/speculative.md, step 3 and step 4's first proposal),
// after the sampler on GPU 0's stream: spec_accept finds each drafting
// sequence's last valid row and gives it the sampled token as its MTP input;
// the MTP layer then runs over every row of the step (its KV entries follow
// the target's positions; rows past a rejection write entries beyond the
// valid positions, overwritten later), and draft_head on the last valid row
// of each sequence gives its first proposal (row 0 of r.mtp_draft). The step's metadata
// (positions, slots, block tables, attention plans) is the target's, so
// attention_block and mlp_block run unchanged with l = L. Launches count in
// their kernels' families (mtp_input as a norm, eh_proj and the draft lm_head
// as lm_head, spec_accept and the argmax as sampling). Launched eagerly, or
// recorded into a graph (draft_pass).
int draft_forward(Engine& e, Rank& r, const Meta& m) {
  const Dims& d = e.d;
  unsigned char* M = r.meta;
  const MetaLayout& ML = e.ml;
  int* next = at<int>(M, ML.mtp_next);
  int* draft_rows = at<int>(M, ML.mtp_rows);
  const int head = draft_head_rows(m);
  if (head > 0) {
    KCHECK(glmk::spec_accept(r.sample_out, at<glmk::SpecSeq>(M, ML.spec), at<int>(M, ML.n_spec), head,
                             at<int>(M, ML.tokens), next, draft_rows, r.stream),
           "draft pass: spec_accept (%d sequences)", m.n_spec);
    PROF(GLMRT_PROF_SAMPLING);
  }
  KCHECK(glmk::mtp_input(r.embed, d.V, next, r.mtp_hid, r.mtp_enorm, r.mtp_hnorm, m.rows, d.H,
                         e.cfg.rms_norm_eps, r.mtp_cat, r.stream),
         "draft pass: mtp_input (%d rows)", m.rows);
  PROF(GLMRT_PROF_NORM);
  std::string err = glmk::gemm_bf16_nt(r.cublas, r.mtp_cat, r.mtp_eh_proj, r.h, m.rows, d.H, 2 * d.H, r.stream);
  if (!err.empty()) return fail(GLMRT_ERR_CUDA, "GPU %d: draft pass: eh_proj: %s", r.device, err.c_str());
  PROF(GLMRT_PROF_LM_HEAD);
  GLMRT_TRY(attention_block(e, r, d.L, m));
  GLMRT_TRY(mlp_block(e, r, d.L, m));
  if (head == 0) return GLMRT_OK;  // prefill chunks only: the MTP cache is all this step needs
  return draft_head(e, r, head, draft_rows, r.mtp_draft);
}

// Chained passes j = 2 .. P (docs/speculative.md, step 4): one row per
// proposing sequence at position v + j - 1 on (draft j - 1, the MTP output of
// pass j - 1), its positions, slots and decode entries written on the GPU by
// spec_chain_rows (v is known only after acceptance). Always R =
// bucket_rows(n_spec) rows (padding entries write no KV and route no
// tokens), so the eager and the captured form run the same launch shapes;
// rows past a sequence's propose count are computed and ignored.
int chain_forward(Engine& e, Rank& r, const Meta& m, int R, int P) {
  const Dims& d = e.d;
  unsigned char* M = r.meta;
  const MetaLayout& ML = e.ml;
  Meta c;
  c.rm = RowMeta{ML.chain_pos, ML.chain_slot, ML.chain_dq, ML.chain_dc, ML.chain_db, ML.n_spec};
  c.T = c.S = m.n_spec;
  c.rows = R;
  c.policy_rows = bucket_rows(e, R);
  c.graph = true;  // padded: the router reads the real count (n_spec)
  c.n_dec = R;
  c.dec_splits = glmk::decode_attention_splits(c.policy_rows, d.nkv_l, r.num_sms, e.kv8);
  c.dec_quant = d.nkv_l == 1;
  glmk::ChainRows cr{at<int>(M, ML.chain_pos), at<int>(M, ML.chain_slot), at<int>(M, ML.chain_dq),
                     at<int>(M, ML.chain_dc),  at<int>(M, ML.chain_db),   at<int>(M, ML.chain_tok)};
  const int S = e.max_seqs;
  for (int j = 2; j <= P; ++j) {
    KCHECK(glmk::spec_chain_rows(at<glmk::SpecSeq>(M, ML.spec), at<int>(M, ML.n_spec), R, j,
                                 at<int>(M, ML.positions), at<int>(M, ML.mtp_rows), at<int>(M, ML.bt),
                                 e.block_size, r.h, r.delta, d.H, r.mtp_draft + (size_t)(j - 2) * S, cr,
                                 r.mtp_hid, r.stream),
           "chained draft pass %d: spec_chain_rows (%d rows)", j, R);
    PROF(GLMRT_PROF_SAMPLING);
    KCHECK(glmk::mtp_input(r.embed, d.V, cr.tok, r.mtp_hid, r.mtp_enorm, r.mtp_hnorm, R, d.H,
                           e.cfg.rms_norm_eps, r.mtp_cat, r.stream),
           "chained draft pass %d: mtp_input (%d rows)", j, R);
    PROF(GLMRT_PROF_NORM);
    std::string err = glmk::gemm_bf16_nt(r.cublas, r.mtp_cat, r.mtp_eh_proj, r.h, R, d.H, 2 * d.H, r.stream);
    if (!err.empty())
      return fail(GLMRT_ERR_CUDA, "GPU %d: chained draft pass %d: eh_proj: %s", r.device, j, err.c_str());
    PROF(GLMRT_PROF_LM_HEAD);
    GLMRT_TRY(attention_block(e, r, d.L, c));
    GLMRT_TRY(mlp_block(e, r, d.L, c));
    GLMRT_TRY(draft_head(e, r, R, nullptr, r.mtp_draft + (size_t)(j - 1) * S));
  }
  return GLMRT_OK;
}

// Runs fwd on r.stream: replayed from g when captured, captured into g on its
// second use (as the step graphs), else launched eagerly (g null: never).
template <typename F>
int run_graphed(Rank& r, StepGraph* g, const char* what, F&& fwd) {
  if (g && !g->exec && g->seen++ >= 1) {
    const std::string w = std::string(" (") + what + ")";
    GLMRT_CUDA(cudaStreamBeginCapture(r.stream, cudaStreamCaptureModeThreadLocal),
               ("begin CUDA graph capture" + w).c_str());
    const int rc = fwd();
    cudaGraph_t graph = nullptr;
    const cudaError_t ce = cudaStreamEndCapture(r.stream, &graph);
    if (rc != GLMRT_OK) {
      if (graph) cudaGraphDestroy(graph);
      return rc;
    }
    GLMRT_TRY(check_cuda(ce, ("end CUDA graph capture" + w).c_str()));
    const cudaError_t ie = cudaGraphInstantiate(&g->exec, graph, 0);
    cudaGraphDestroy(graph);
    GLMRT_TRY(check_cuda(ie, ("instantiate the graph" + w).c_str()));
  }
  if (g && g->exec) {
    KCHECK(cudaGraphLaunch(g->exec, r.stream), "launch the graph of the %s", what);
    return GLMRT_OK;
  }
  return fwd();
}

// The index of bucket n in e.buckets, or -1.
int bucket_index(const Engine& e, int n) {
  for (size_t i = 0; i < e.buckets.size(); ++i)
    if (e.buckets[i] == n) return (int)i;
  return -1;
}

// The draft pass of a step, its chained passes (P > 1) and the copy of its
// proposals into drafts_h (pinned; they land at the step's wait). The pass of
// a graph step is itself captured per bucket (on the bucket's second draft
// pass, as the step graphs) and replayed, which spares the host its ~15
// launches per step; the step time did not change measurably with it (H200,
// batch 1-8: its time is its kernels). The chained passes (~15 launches each)
// are captured likewise. Not while profiling (events between launches).
int draft_pass(Engine& e, Rank& r, const Meta& m, int* drafts_h) {
  StepGraph* g = (m.graph && !e.prof.on) ? &e.draft_graphs[graph_index(m)] : nullptr;
  GLMRT_TRY(run_graphed(r, g, "draft pass", [&] { return draft_forward(e, r, m); }));
  if (m.n_spec == 0) return GLMRT_OK;
  const int P = m.max_propose;
  if (P > 1) {
    // The chained passes, graphed by the count of proposing sequences and of
    // passes (any step's: they read only region A and the draft pass's
    // outputs).
    const int R = bucket_rows(e, m.n_spec);
    const int cb = bucket_index(e, R);
    StepGraph* cg = (e.graphs && !e.prof.on && cb >= 0) ? &e.chain_graphs[(size_t)cb * (e.draft_k - 1) + P - 2]
                                                        : nullptr;
    GLMRT_TRY(run_graphed(r, cg, "chained draft passes", [&] { return chain_forward(e, r, m, R, P); }));
  }
  // Pass j's proposals are row j - 1 of mtp_draft (max_seqs wide).
  const size_t n = (size_t)(std::max(P, 1) - 1) * e.max_seqs + m.n_spec;
  KCHECK(cudaMemcpyAsync(drafts_h, r.mtp_draft, n * 4, cudaMemcpyDeviceToHost, r.stream),
         "draft pass: copy the proposals");
  PROF(GLMRT_PROF_COPY);
  return GLMRT_OK;
}

// Captures the forward of a pure-decode step into g (rank 0's stream; TP1).
int capture(Engine& e, const Meta& m, StepGraph& g) {
  Rank& r = e.ranks[0];
  Profiler& p = e.prof;
  GLMRT_CUDA(cudaStreamBeginCapture(r.stream, cudaStreamCaptureModeThreadLocal),
             "begin CUDA graph capture");
  if (p.on) {
    p.capturing = true;
    p.events = &g.events;
    p.families = &g.families;
    p.n = 0;
  }
  int rc = p.on ? profile_mark(e, r, -1) : GLMRT_OK;
  if (rc == GLMRT_OK) rc = forward(e, m);
  p.capturing = false;
  cudaGraph_t graph = nullptr;
  cudaError_t ce = cudaStreamEndCapture(r.stream, &graph);
  if (rc != GLMRT_OK) {
    if (graph) cudaGraphDestroy(graph);
    return rc;
  }
  GLMRT_TRY(check_cuda(ce, "end CUDA graph capture"));
  ce = cudaGraphInstantiate(&g.exec, graph, 0);
  cudaGraphDestroy(graph);
  GLMRT_TRY(check_cuda(ce, "instantiate the decode-step graph"));
  g.captured_events = p.on ? p.n : 0;
  return GLMRT_OK;
}

// Bytes each family must move in this step (profiling): weights read once
// (the experts actually hit), KV read and written, activations in and out.
void step_bytes(const Engine& e, const Meta& m, const int* active, int64_t* out) {
  const Dims& d = e.d;
  const int64_t T = m.rows, H = d.H;
  for (int f = 0; f < GLMRT_PROF_N; ++f) out[f] = 0;
  // Bytes of one cached K or V row of a KV head (FP8: the codes and their scale).
  const int64_t kv_row = e.kv8 ? d.D + 4 : (int64_t)d.D * (e.f32kv ? 4 : 2);
  const int64_t act_q = e.exact ? 4 : 1;  // FP8 or FP32 linear inputs
  out[GLMRT_PROF_EMBED] = T * H * (2 + 4);
  for (int l = 0; l < d.L; ++l) {
    const bool moe = l >= d.first_dense;
    // two add+norms: h, delta, weight in; h and the quantized (+FP32 for MoE) rows out
    out[GLMRT_PROF_NORM] += 2 * (T * H * (4 + 4 + 4 + act_q) + H * 4) + (moe ? T * H * 4 : 0);
    if (attn_one_launch(e, e.ranks[0], m)) {
      // One launch: the weights, the KV read and the new token's write, the
      // input row and the delta row; no intermediate rows through memory.
      out[GLMRT_PROF_ATTN_LAYER] += (int64_t)d.qkv_rows * H + d.qkv_rows * 8 + H * (int64_t)d.nq_l * d.D +
                                    H * 4 + m.kv_read_tokens * d.nkv_l * 2 * kv_row +
                                    2 * d.nkv_l * kv_row + H * act_q + H * 4;
    } else {
      out[GLMRT_PROF_QKV] += (int64_t)d.qkv_rows * H + d.qkv_rows * 8 + T * (H * act_q + d.qkv_rows * 4);
      out[GLMRT_PROF_ROPE_KV] += T * (d.qkv_rows * 4 + (int64_t)d.nq_l * d.D * 4 + 2 * d.nkv_l * kv_row);
      out[GLMRT_PROF_ATTENTION] += m.kv_read_tokens * d.nkv_l * 2 * kv_row +
                                   T * (int64_t)d.nq_l * d.D * (4 + 4 + 1);
      out[GLMRT_PROF_O_PROJ] += H * (int64_t)d.nq_l * d.D + H * 4 + T * ((int64_t)d.nq_l * d.D + H * 4);
    }
    if (!moe) {
      out[GLMRT_PROF_DENSE_GATE_UP] += 2 * (int64_t)d.I_l * H + T * (H + 2 * (int64_t)d.I_l * 4);
      out[GLMRT_PROF_ACTIVATION] += T * (int64_t)d.I_l * (8 + 1);
      out[GLMRT_PROF_DENSE_DOWN] += H * (int64_t)d.I_l + T * ((int64_t)d.I_l + H * 4);
      continue;
    }
    // Experts hit (counted on the GPU); the shared expert run as a dense MLP
    // is not among them.
    const bool shared_dense = shared_dense_mlp(e, m);
    const int64_t groups = (active ? active[l] : 0) + (shared_dense ? 1 : 0);
    // One launch (moe_one_launch): the same weights, no intermediate rows
    // through memory; one of the two norms above is its own.
    const bool one = moe_one_launch(e, e.ranks[0], l, m);
    // The post-attention norm's bytes as counted above, for the forms that
    // fold it into another launch.
    const int64_t norm_bytes = T * H * (4 + 4 + 4 + act_q) + H * 4 + T * H * 4;
    if (one) {
      out[GLMRT_PROF_NORM] -= norm_bytes;
      out[GLMRT_PROF_MOE_LAYER] += (int64_t)d.E * H * 4 + groups * 3 * (int64_t)d.MI * H + 4 * T * H * 4 +
                                   T * H * act_q + 2 * H * 4;
      continue;
    }
    if (norm_router_one_launch(e, m, (int)T)) {
      // The post-attention norm inside the router's launch, no FP32 rows.
      out[GLMRT_PROF_NORM] -= norm_bytes;
      out[GLMRT_PROF_ROUTER] += (int64_t)d.E * H * 4 + T * H * (4 + 4 + 4 + act_q) + H * 4;
    } else if (norm_logits_one_launch(e, m)) {
      // The post-attention norm and the logits in one launch: h read once
      // (its second pass from L2), the FP8 rows and the logits out.
      out[GLMRT_PROF_NORM] -= norm_bytes;
      out[GLMRT_PROF_ROUTER] += (int64_t)d.E * H * 4 + T * H * (4 + act_q) + H * 4 + T * d.E * 4;
    } else {
      out[GLMRT_PROF_ROUTER] += (int64_t)d.E * H * 4 + T * H * 4;
    }
    // The rows between the experts' kernels as mlp_block writes them.
    const ExpertRowFormats rf = expert_row_formats(e, m, l);
    const int64_t gu_row = rf.silu_fused ? (int64_t)d.MI * 2 : 2 * (int64_t)d.MI * (rf.gate_up_bf16 ? 2 : 4);
    const int64_t y_row = H * (rf.down_bf16 ? 2 : 4);
    out[GLMRT_PROF_EXPERT_GATE_UP] += groups * 2 * (int64_t)d.MI * H + T * d.slots * (H + gu_row);
    out[GLMRT_PROF_ACTIVATION] += T * d.slots * (gu_row + (int64_t)d.MI);
    out[GLMRT_PROF_EXPERT_DOWN] += groups * H * (int64_t)d.MI + T * d.slots * ((int64_t)d.MI + y_row);
    out[GLMRT_PROF_MOE_COMBINE] += T * d.slots * y_row + T * H * 4;
  }
  const int64_t rows = m.graph ? m.rows : m.n_logits;
  out[GLMRT_PROF_NORM] += rows * H * (4 + 4 + 2);
  out[GLMRT_PROF_LM_HEAD] += (int64_t)d.V_l * H * (e.f32kv ? 4 : 2) + rows * (int64_t)d.V_l * 4;
  out[GLMRT_PROF_SAMPLING] += (int64_t)m.n_logits * d.V * 4;
  out[GLMRT_PROF_COPY] += (int64_t)(m.a_bytes + m.b_bytes);
}

}  // namespace

// The fixed layout of the step metadata (region A at fixed offsets, region B
// after it), sized for the largest step; sets e.ml and e.meta_bytes.
void plan_meta_layout(Engine& e) {
  const size_t T = e.max_tokens, S = e.max_seqs;
  MetaLayout& L = e.ml;
  size_t off = 0;
  auto take = [&](size_t bytes) {
    const size_t o = off;
    off += al(bytes);
    return o;
  };
  L.tokens = take(T * 4);
  L.positions = take(T * 4);
  L.slots = take(T * 4);
  // Decode entries: one per decoding sequence, or per verify row (a
  // sequence verifying drafts decodes each of its rows).
  L.dec_qrow = take((size_t)e.max_logit_rows * 4);
  L.dec_ctx = take((size_t)e.max_logit_rows * 4);
  L.dec_bt = take((size_t)e.max_logit_rows * 4);
  L.bt_off = take(S * 4);
  L.logit_rows = take((size_t)e.max_logit_rows * 4);
  L.n_valid = take(4);
  const bool drafts = e.draft_k > 0;
  L.mtp_next = take(drafts ? T * 4 : 0);
  L.spec = take(drafts ? S * sizeof(glmk::SpecSeq) : 0);
  L.n_spec = take(drafts ? 4 : 0);
  L.mtp_rows = take(drafts ? S * 4 : 0);
  const bool chained = e.draft_k > 1;
  for (size_t* a : {&L.chain_pos, &L.chain_slot, &L.chain_dq, &L.chain_dc, &L.chain_db, &L.chain_tok})
    *a = take(chained ? S * 4 : 0);
  L.bt = take(S * (size_t)e.max_blocks_per_seq * 4);
  L.b_begin = off;
  // The prefill attention plan: attention_prefill's items, or attention_paged's
  // items and merges.
  take(std::max(al((size_t)e.max_items * sizeof(glmk::AttnItem)) + al((size_t)e.max_merges * sizeof(glmk::AttnMerge)),
                (size_t)e.pf_max_items * sizeof(glmk::PrefillItem)));
  const size_t LR = e.max_logit_rows;
  take(LR * sizeof(glmk::SampleRow));
  for (int i = 0; i < 4; ++i) take((size_t)e.pen_cap * 4);  // penalty row, token, prompt, output
  take(LR * 4);
  take(LR * 4);  // sort segments
  take(S * (size_t)((e.d.V + 31) / 32) * 4);  // token masks (structured outputs)
  L.total = off;
  e.meta_bytes = off;
}

// A step between glmrt_step_begin and glmrt_step_finish: what finish needs
// of the batch (its sequences are copied; the caller's arrays are not kept).
struct PendingStep {
  Meta m;
  std::vector<glmrt_seq> seqs;
  int n_token_masks = 0;
  bool active = false;
};

void step_state_create(Engine& e) {
  e.pending = new PendingStep;
  e.pending->seqs.reserve(e.max_seqs);
}

void step_state_destroy(Engine& e) {
  delete e.pending;
  e.pending = nullptr;
}

static int step_begin_checked(Engine& e, const glmrt_batch& b) {
  PendingStep& ps = *e.pending;
  Meta& m = ps.m;
  m = Meta{};
  GLMRT_TRY(pack(e, b, m));
  ps.seqs.assign(b.seqs, b.seqs + b.n_seqs);
  ps.n_token_masks = b.n_token_masks;
  Profiler& p = e.prof;
  for (Rank& r : e.ranks) {
    GLMRT_CUDA(cudaSetDevice(r.device), "cudaSetDevice");
    KCHECK(cudaMemcpyAsync(r.meta, e.meta_host, m.a_bytes, cudaMemcpyHostToDevice, r.stream),
           "copy step metadata");
    if (m.b_bytes)
      KCHECK(cudaMemcpyAsync(r.meta + e.ml.b_begin, e.meta_host + e.ml.b_begin, m.b_bytes,
                             cudaMemcpyHostToDevice, r.stream),
             "copy step metadata (sampling)");
  }
  Rank& r = e.ranks[0];
  GLMRT_CUDA(cudaSetDevice(r.device), "cudaSetDevice");
  StepGraph* g = nullptr;
  if (m.graph) {
    g = &(p.on ? e.prof_graphs : e.step_graphs)[graph_index(m)];
    if (!g->exec && g->seen++ >= 1) GLMRT_TRY(capture(e, m, *g));
  }
  if (g && g->exec) {
    if (p.on) {
      p.events = &g->events;
      p.families = &g->families;
      p.n = g->captured_events;
      p.graph_step = true;
    }
    KCHECK(cudaGraphLaunch(g->exec, r.stream), "launch the decode-step graph (batch %d)", m.rows);
  } else {
    if (p.on) GLMRT_TRY(profile_begin(e, r, false));
    GLMRT_TRY(forward(e, m));
  }
  ps.active = true;
  return GLMRT_OK;
}

// Waits for whatever a failed begin may have left running, so that the next
// step starts on an idle stream with its metadata buffers free.
static void drain_streams(Engine& e) {
  for (Rank& q : e.ranks) {
    cudaSetDevice(q.device);
    cudaStreamSynchronize(q.stream);
  }
  cudaGetLastError();
}

// result_checked: the caller validated res already (glmrt_step does, before
// launching anything).
static int step_finish_checked(Engine& e, const uint32_t* token_masks, glmrt_result& res, bool result_checked) {
  PendingStep& ps = *e.pending;
  const Meta& m = ps.m;
  const glmrt_seq* seqs = ps.seqs.data();
  Profiler& p = e.prof;
  Rank& r = e.ranks[0];
  GLMRT_CUDA(cudaSetDevice(r.device), "cudaSetDevice");
  if (!result_checked) GLMRT_TRY(validate_result(e, seqs, (int)ps.seqs.size(), res));
  if (ps.n_token_masks > 0 && !token_masks)
    return fail(GLMRT_ERR_INVALID, "step finish: %d token-mask rows were declared at begin but token_masks is NULL",
                ps.n_token_masks);
  // The token masks, in sampled-row order, behind the forward on the same
  // stream: the sampler reads them, nothing before it does.
  if (m.n_mask > 0) {
    const int words = (e.d.V + 31) / 32;
    uint32_t* mk = at<uint32_t>(e.meta_host, m.masks);
    int row = 0;
    for (int i = 0; i < m.n_logits; ++i) {
      const glmrt_seq& q = seqs[e.logits_seq[i]];
      if (!q.sample || q.mask_index < 0) continue;
      memcpy(mk + (size_t)row * words, token_masks + (size_t)q.mask_index * words, (size_t)words * 4);
      ++row;
    }
    KCHECK(cudaMemcpyAsync(r.meta + m.masks, e.meta_host + m.masks, (size_t)m.n_mask * words * 4,
                           cudaMemcpyHostToDevice, r.stream),
           "copy token masks");
  }
  GLMRT_CUDA(cudaSetDevice(r.device), "cudaSetDevice");
  // Sampling, in chunks of e.sample_chunk rows.
  const int V = e.d.V;
  unsigned char* M = r.meta;
  for (int c0 = 0, ci = 0; c0 < m.n_logits; c0 += e.sample_chunk, ++ci) {
    glmk::SampleArgs s;
    s.logits = r.logits + (size_t)c0 * V;
    s.ld = V;
    s.rows = std::min(e.sample_chunk, m.n_logits - c0);
    s.V = V;
    s.params = at<glmk::SampleRow>(M, m.samples) + c0;
    const int p0 = m.chunk_pen[2 * ci], p1 = m.chunk_pen[2 * ci + 1];
    s.pen_row = at<int>(M, m.pen_row) + p0;
    s.pen_token = at<int>(M, m.pen_tok) + p0;
    s.pen_prompt = at<int>(M, m.pen_prompt) + p0;
    s.pen_output = at<int>(M, m.pen_output) + p0;
    s.n_pen = p1 - p0;
    const int s0 = m.chunk_seg[2 * ci], s1 = m.chunk_seg[2 * ci + 1];
    s.seg_begin = at<int>(M, m.seg_begin) + s0;
    s.seg_end = at<int>(M, m.seg_end) + s0;
    s.n_seg = s1 - s0;
    s.masks = at<uint32_t>(M, m.masks);
    s.mask_words = (V + 31) / 32;
    s.workspace = r.sample_ws;
    s.workspace_bytes = r.sample_ws_bytes;
    s.out = r.sample_out + c0;
    s.top_ids = r.top_ids + (size_t)c0 * glmk::kMaxTop;
    s.top_lp = r.top_lp + (size_t)c0 * glmk::kMaxTop;
    KCHECK(glmk::sample_rows(s, r.stream), "sample_rows (rows %d..%d)", c0, c0 + s.rows - 1);
  }
  if (m.n_logits > 0) PROF(GLMRT_PROF_SAMPLING);
  // Results: one copy of the per-row outputs, then the requested logits rows.
  glmk::SampleOut* out_h = reinterpret_cast<glmk::SampleOut*>(e.result_host);
  int* top_ids_h = reinterpret_cast<int*>(e.result_host + al(e.max_logit_rows * sizeof(glmk::SampleOut)));
  float* top_lp_h = reinterpret_cast<float*>(reinterpret_cast<unsigned char*>(top_ids_h) +
                                             al((size_t)e.max_logit_rows * glmk::kMaxTop * 4));
  int* drafts_h = reinterpret_cast<int*>(reinterpret_cast<unsigned char*>(top_lp_h) +
                                         al((size_t)e.max_logit_rows * glmk::kMaxTop * 4));
  if (m.n_logits > 0) {
    KCHECK(cudaMemcpyAsync(out_h, r.sample_out, m.n_logits * sizeof(glmk::SampleOut),
                           cudaMemcpyDeviceToHost, r.stream),
           "copy sample results");
    KCHECK(cudaMemcpyAsync(top_ids_h, r.top_ids, (size_t)m.n_logits * glmk::kMaxTop * 4,
                           cudaMemcpyDeviceToHost, r.stream),
           "copy top logprob ids");
    KCHECK(cudaMemcpyAsync(top_lp_h, r.top_lp, (size_t)m.n_logits * glmk::kMaxTop * 4,
                           cudaMemcpyDeviceToHost, r.stream),
           "copy top logprobs");
  }
  int64_t want_row = 0;
  for (int i = 0; i < m.n_logits; ++i) {
    if (!seqs[e.logits_seq[i]].want_logits) continue;
    KCHECK(cudaMemcpyAsync(res.logits + want_row * V, r.logits + (size_t)i * V, (size_t)V * 4,
                           cudaMemcpyDeviceToHost, r.stream),
           "copy logits row %d", i);
    ++want_row;
  }
  PROF(GLMRT_PROF_COPY);
  // The draft pass, behind the sampler on the same stream (it needs the
  // sampled tokens) and before the one wait.
  if (m.mtp_pass) GLMRT_TRY(draft_pass(e, r, m, drafts_h));
  for (Rank& q : e.ranks) {
    GLMRT_CUDA(cudaSetDevice(q.device), "cudaSetDevice");
    GLMRT_CUDA(cudaStreamSynchronize(q.stream), "step: stream synchronize");
  }
  GLMRT_CUDA(cudaSetDevice(r.device), "cudaSetDevice");
  if (p.on) {
    std::vector<int> active(e.d.L, 0);
    if (e.d.E > 0)
      GLMRT_CUDA(cudaMemcpy(active.data(), r.prof_active, e.d.L * sizeof(int), cudaMemcpyDeviceToHost),
                 "profile: copy expert counts");
    int64_t bytes[GLMRT_PROF_N];
    step_bytes(e, m, active.data(), bytes);
    GLMRT_TRY(profile_end(e, bytes));
  }
  const int stride = res.top_stride;
  const int dstride = res.draft_stride;
  for (int s = 0; s < (int)ps.seqs.size(); ++s) {
    res.tokens[s] = -1;
    res.logprobs[s] = NAN;
    if (res.sample_status) res.sample_status[s] = GLMRT_SAMPLE_OK;
    if (res.top_ids)
      for (int k = 0; k < stride; ++k) {
        res.top_ids[(size_t)s * stride + k] = -1;
        res.top_logprobs[(size_t)s * stride + k] = NAN;
      }
    if (res.n_accepted) res.n_accepted[s] = 0;
    if (res.drafts)
      for (int k = 0; k < dstride; ++k) res.drafts[(size_t)s * dstride + k] = -1;
  }
  static const char* status_text[] = {"ok", "a logit is NaN or +Inf", "every logit is -Inf",
                                      "every logit is -Inf after penalties",
                                      "no token left to sample",
                                      "the token mask allows no token with a finite logit"};
  const int* tok_h = at<int>(e.meta_host, e.ml.tokens);
  const int* lrows_h = at<int>(e.meta_host, e.ml.logit_rows);
  // Top alternatives of logits row i into ids / lps (n of them, -1 / NaN after).
  auto copy_top = [&](int i, int n, int32_t* ids, float* lps) {
    for (int k = 0; k < stride; ++k) {
      ids[k] = k < n ? top_ids_h[(size_t)i * glmk::kMaxTop + k] : -1;
      lps[k] = k < n ? top_lp_h[(size_t)i * glmk::kMaxTop + k] : NAN;
    }
  };
  for (int s = 0; s < (int)ps.seqs.size(); ++s) {
    const glmrt_seq& q = seqs[s];
    if (!q.sample) continue;
    const int row0 = e.seq_logit_row0[s];
    const int n = q.sampling.n_top_logprobs;
    // Verification (docs/speculative.md, step 2): draft j + 1 is accepted when
    // row j sampled it. The sampler already applied the rule per row (greedy:
    // argmax; sampling: accept with p(draft), else a draw without it), so the
    // accepted drafts are the longest prefix of rows whose token is their
    // draft; spec_accept applies the same test on the GPU for the draft pass.
    // Rows after the first rejection are not read (their status neither).
    int a = 0;
    while (a < q.n_drafts && out_h[row0 + a].status == 0 && out_h[row0 + a].token == tok_h[lrows_h[row0 + a] + 1]) {
      res.accepted[(size_t)s * dstride + a] = out_h[row0 + a].token;
      res.accepted_logprobs[(size_t)s * dstride + a] = out_h[row0 + a].logprob;
      if (n > 0)
        copy_top(row0 + a, n, res.accepted_top_ids + ((size_t)s * dstride + a) * stride,
                 res.accepted_top_logprobs + ((size_t)s * dstride + a) * stride);
      ++a;
    }
    if (q.n_drafts > 0) res.n_accepted[s] = a;
    const int i = row0 + a;
    const glmk::SampleOut& o = out_h[i];
    if (o.status != 0) {
      // This sequence alone: the caller ends it with an error, the others
      // keep their tokens. Without the status array, the whole step fails.
      if (!res.sample_status)
        return fail(GLMRT_ERR_INVALID, "seq %d: cannot sample: %s", s,
                    (o.status > 0 && o.status <= GLMRT_SAMPLE_MASKED_ALL) ? status_text[o.status] : "unknown status");
      res.sample_status[s] = (o.status > 0 && o.status <= GLMRT_SAMPLE_MASKED_ALL) ? o.status : GLMRT_SAMPLE_NONFINITE;
      if (res.n_accepted) res.n_accepted[s] = 0;
      continue;
    }
    res.tokens[s] = o.token;
    res.logprobs[s] = o.logprob;
    if (res.top_ids) copy_top(i, n, res.top_ids + (size_t)s * stride, res.top_logprobs + (size_t)s * stride);
  }
  for (int i = 0; i < m.n_spec; ++i) {
    const int s = e.spec_seq_index[i];
    if (!res.sample_status || res.sample_status[s] == GLMRT_SAMPLE_OK)
      for (int j = 0; j < seqs[s].propose; ++j)
        res.drafts[(size_t)s * dstride + j] = drafts_h[(size_t)j * e.max_seqs + i];
  }
  return GLMRT_OK;
}

int step_begin(Engine& e, const glmrt_batch& b) {
  if (e.pending->active)
    return fail(GLMRT_ERR_STATE, "glmrt_step_begin: the previous step was begun and not finished");
  GLMRT_TRY(validate_batch(e, b, false));
  const int rc = step_begin_checked(e, b);
  if (rc != GLMRT_OK) drain_streams(e);
  return rc;
}

int step_finish(Engine& e, const uint32_t* token_masks, glmrt_result& res) {
  if (!e.pending->active)
    return fail(GLMRT_ERR_STATE, "glmrt_step_finish: no step was begun");
  e.pending->active = false;  // a failed finish ends the step too
  const int rc = step_finish_checked(e, token_masks, res, false);
  if (rc != GLMRT_OK) drain_streams(e);
  return rc;
}

int run_step(Engine& e, const glmrt_batch& b, glmrt_result& res) {
  if (e.pending->active)
    return fail(GLMRT_ERR_STATE, "glmrt_step: a step was begun with glmrt_step_begin and not finished");
  GLMRT_TRY(validate_batch(e, b, true));
  GLMRT_TRY(validate_result(e, b.seqs, b.n_seqs, res));
  int rc = step_begin_checked(e, b);
  if (rc == GLMRT_OK) {
    e.pending->active = false;
    rc = step_finish_checked(e, b.token_masks, res, true);
  }
  if (rc != GLMRT_OK) drain_streams(e);
  return rc;
}

}  // namespace glmrt
