#!/usr/bin/env python3
"""model_check.py — drives libglmcuda.so through its C ABI (ctypes) on a tiny
checkpoint, the way `glmctl validate --backend cuda` does, for machines with a
GPU but no Go toolchain (the GPU machine).

For each golden file case (docs/golden.md): prefill the prompt in one step with
want_logits, compare the last logits with the golden logits (relative L2,
FP8-activation tolerance 3e-2 as pkg/golden.FP8Tolerances), then 16 greedy
decode steps fed the golden tokens (teacher forcing), counting mismatches whose
reference margin exceeds 5e-2. Then engine-level checks the golden files do not
cover: all cases prefilled as one batch (the cuBLASLt path) and decoded as one
batch against the one-sequence results, seeded sampling against a float64
port of pkg/sample on the returned logits, and ABI error reporting.

    model_check.py --lib build/cuda/libglmcuda.so --model testdata/models/tiny-f32 \
        --golden testdata/models/tiny-f32.golden.json [--quick]

Exit status 0 when every check passes. --quick runs one case and one decode
step (for compute-sanitizer).
"""

import argparse
import ctypes as C
import json
import math
import os
import re
import struct
import sys

import numpy as np

# The ctypes structs below mirror glmrt.h; its version is read from the header
# so a bump is noticed here (and the structs must be checked against it).
ABI_VERSION = int(re.search(r"^#define GLMRT_ABI_VERSION (\d+)", open(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "include", "glmrt.h")).read(), re.M).group(1))
DT = {"F32": 0, "BF16": 1, "F16": 2, "F8_E4M3": 3}
FP8_REL_L2 = 3e-2
FP8_MARGIN = 5e-2
# Validation precision (FP32 activations, FP32 KV cache and lm_head) vs the
# float32 goldens: pkg/golden.ExactTolerances.
EXACT_REL_L2 = 1e-4
EXACT_MARGIN = 1e-3


class Config(C.Structure):
    _fields_ = [("hidden_size", C.c_int32), ("num_hidden_layers", C.c_int32),
                ("first_k_dense_replace", C.c_int32), ("num_attention_heads", C.c_int32),
                ("num_key_value_heads", C.c_int32), ("head_dim", C.c_int32),
                ("partial_rotary_factor", C.c_float), ("intermediate_size", C.c_int32),
                ("moe_intermediate_size", C.c_int32), ("n_routed_experts", C.c_int32),
                ("num_experts_per_tok", C.c_int32), ("n_group", C.c_int32),
                ("topk_group", C.c_int32), ("n_shared_experts", C.c_int32),
                ("routed_scaling_factor", C.c_float), ("norm_topk_prob", C.c_int32),
                ("vocab_size", C.c_int32), ("max_position_embeddings", C.c_int32),
                ("rope_theta", C.c_float), ("rms_norm_eps", C.c_float),
                ("num_nextn_predict_layers", C.c_int32), ("attention_bias", C.c_int32),
                ("use_qk_norm", C.c_int32)]


class Options(C.Structure):
    _fields_ = [("device", C.c_int32), ("tensor_parallel", C.c_int32),
                ("kv_block_size", C.c_int32), ("num_kv_blocks", C.c_int32),
                ("memory_budget_bytes", C.c_int64), ("max_tokens_per_step", C.c_int32),
                ("max_seqs_per_step", C.c_int32), ("max_penalty_entries", C.c_int32),
                ("exact_activations", C.c_int32), ("fp32_cache_and_head", C.c_int32),
                ("disable_graphs", C.c_int32), ("draft_tokens", C.c_int32),
                ("reserved", C.c_int32 * 3)]


class Info(C.Structure):
    _fields_ = [("abi_version", C.c_int32), ("tensor_parallel", C.c_int32),
                ("kv_block_size", C.c_int32), ("num_kv_blocks", C.c_int32),
                ("max_tokens_per_step", C.c_int32), ("max_seqs_per_step", C.c_int32),
                ("max_blocks_per_seq", C.c_int32), ("max_top_logprobs", C.c_int32),
                ("max_penalty_entries", C.c_int32), ("vocab_size", C.c_int32),
                ("max_draft_tokens", C.c_int32), ("weight_bytes", C.c_int64), ("kv_bytes", C.c_int64),
                ("workspace_bytes", C.c_int64), ("device_name", C.c_char * 128)]


class Sampling(C.Structure):
    _fields_ = [("temperature", C.c_float), ("top_k", C.c_int32), ("top_p", C.c_float),
                ("min_p", C.c_float), ("repetition_penalty", C.c_float),
                ("frequency_penalty", C.c_float), ("presence_penalty", C.c_float),
                ("n_top_logprobs", C.c_int32), ("seed", C.c_uint64), ("sample_index", C.c_int64)]


class Seq(C.Structure):
    _fields_ = [("n_tokens", C.c_int32), ("start_pos", C.c_int32),
                ("block_table_offset", C.c_int32), ("block_table_len", C.c_int32),
                ("sample", C.c_int32), ("want_logits", C.c_int32),
                ("penalty_offset", C.c_int32), ("penalty_len", C.c_int32),
                ("mask_index", C.c_int32), ("sampling", Sampling),
                ("n_drafts", C.c_int32), ("draft", C.c_int32), ("next_token", C.c_int32),
                ("propose", C.c_int32)]


class Batch(C.Structure):
    _fields_ = [("n_seqs", C.c_int32), ("n_tokens", C.c_int32), ("seqs", C.POINTER(Seq)),
                ("token_ids", C.POINTER(C.c_int32)), ("block_tables", C.POINTER(C.c_int32)),
                ("n_block_table_entries", C.c_int32),
                ("penalty_tokens", C.POINTER(C.c_int32)),
                ("penalty_prompt_counts", C.POINTER(C.c_int32)),
                ("penalty_output_counts", C.POINTER(C.c_int32)),
                ("n_penalty_entries", C.c_int32),
                ("token_masks", C.POINTER(C.c_uint32)), ("n_token_masks", C.c_int32),
                ("mask_words", C.c_int32)]


class Result(C.Structure):
    _fields_ = [("tokens", C.POINTER(C.c_int32)), ("logprobs", C.POINTER(C.c_float)),
                ("top_ids", C.POINTER(C.c_int32)), ("top_logprobs", C.POINTER(C.c_float)),
                ("top_stride", C.c_int32), ("logits", C.POINTER(C.c_float)),
                ("logits_capacity", C.c_int64),
                ("sample_status", C.POINTER(C.c_int32)),  # NULL here: a sequence that cannot be sampled fails the step
                ("draft_stride", C.c_int32), ("n_accepted", C.POINTER(C.c_int32)),
                ("accepted", C.POINTER(C.c_int32)), ("accepted_logprobs", C.POINTER(C.c_float)),
                ("accepted_top_ids", C.POINTER(C.c_int32)),
                ("accepted_top_logprobs", C.POINTER(C.c_float)), ("drafts", C.POINTER(C.c_int32))]


def i32(a):
    a = np.ascontiguousarray(a, dtype=np.int32)
    return a, a.ctypes.data_as(C.POINTER(C.c_int32))


class Engine:
    def __init__(self, lib_path, model_dir, exact, fp32, tp=1, block_size=16, blocks=4096, max_tokens=512, max_seqs=16):
        self.lib = C.CDLL(lib_path)
        L = self.lib
        L.glmrt_last_error.restype = C.c_char_p
        L.glmrt_engine_create.argtypes = [C.POINTER(Config), C.POINTER(Options), C.POINTER(C.c_void_p)]
        L.glmrt_get_info.argtypes = [C.c_void_p, C.POINTER(Info)]
        L.glmrt_load_tensor.argtypes = [C.c_void_p, C.c_char_p, C.c_int32, C.POINTER(C.c_int64),
                                        C.c_int32, C.c_void_p, C.c_uint64]
        L.glmrt_finalize.argtypes = [C.c_void_p]
        L.glmrt_step.argtypes = [C.c_void_p, C.POINTER(Batch), C.POINTER(Result)]
        L.glmrt_engine_destroy.argtypes = [C.c_void_p]
        if L.glmrt_abi_version() != ABI_VERSION:
            raise SystemExit(f"ABI version {L.glmrt_abi_version()} != {ABI_VERSION}")
        cfg_json = json.load(open(os.path.join(model_dir, "config.json")))
        cfg = Config()
        for name, _ in Config._fields_:
            v = cfg_json[name]
            setattr(cfg, name, int(v) if isinstance(v, bool) else v)
        opt = Options(device=0, tensor_parallel=tp, kv_block_size=block_size, num_kv_blocks=blocks,
                      max_tokens_per_step=max_tokens, max_seqs_per_step=max_seqs,
                      exact_activations=1 if exact else 0, fp32_cache_and_head=1 if fp32 else 0)
        h = C.c_void_p()
        self.check(L.glmrt_engine_create(C.byref(cfg), C.byref(opt), C.byref(h)), "create")
        self.h = h
        self.info = Info()
        self.check(L.glmrt_get_info(h, C.byref(self.info)), "info")
        self.V = self.info.vocab_size
        self.bs = self.info.kv_block_size
        self.model_dir = model_dir
        self.cfg_json = cfg_json

    def check(self, rc, what):
        if rc != 0:
            raise RuntimeError(f"{what}: status {rc}: {self.lib.glmrt_last_error().decode()}")

    def load_all(self):
        idx = json.load(open(os.path.join(self.model_dir, "model.safetensors.index.json")))
        shards = sorted(set(idx["weight_map"].values()))
        n = 0
        for shard in shards:
            raw = bytearray(open(os.path.join(self.model_dir, shard), "rb").read())
            hlen = struct.unpack("<Q", raw[:8])[0]
            header = json.loads(raw[8:8 + hlen])
            buf = (C.c_char * len(raw)).from_buffer(raw)
            base = C.addressof(buf) + 8 + hlen
            for name, t in header.items():
                if name == "__metadata__":
                    continue
                b0, b1 = t["data_offsets"]
                shape = (C.c_int64 * len(t["shape"]))(*t["shape"])
                self.check(self.lib.glmrt_load_tensor(self.h, name.encode(), DT[t["dtype"]], shape,
                                                      len(t["shape"]), C.c_void_p(base + b0), b1 - b0),
                           f"load {name}")
                n += 1
            del buf
        self.check(self.lib.glmrt_finalize(self.h), "finalize")
        return n

    def step(self, seqs, top_stride=0):
        """seqs: list of dicts with tokens, start, table, sample, logits, sampling (dict),
        penalties (list of (tok, prompt_count, output_count)). Returns (tokens, logprobs,
        top_ids, top_lps, logits rows)."""
        n = len(seqs)
        arr = (Seq * n)()
        toks, tables, pt, pp, po = [], [], [], [], []
        n_logits = 0
        for i, s in enumerate(seqs):
            q = arr[i]
            q.n_tokens = len(s["tokens"])
            q.start_pos = s["start"]
            q.block_table_offset = len(tables)
            q.block_table_len = len(s["table"])
            q.sample = 1 if s.get("sample", True) else 0
            q.want_logits = 1 if s.get("logits", False) else 0
            q.mask_index = -1
            q.next_token = -1
            n_logits += q.want_logits
            sp = s.get("sampling", {})
            q.sampling.temperature = sp.get("temperature", 0.0)
            q.sampling.top_k = sp.get("top_k", 0)
            q.sampling.top_p = sp.get("top_p", 1.0)
            q.sampling.min_p = sp.get("min_p", 0.0)
            q.sampling.repetition_penalty = sp.get("repetition_penalty", 1.0)
            q.sampling.frequency_penalty = sp.get("frequency_penalty", 0.0)
            q.sampling.presence_penalty = sp.get("presence_penalty", 0.0)
            q.sampling.n_top_logprobs = sp.get("n_top", 0)
            q.sampling.seed = sp.get("seed", 0)
            q.sampling.sample_index = sp.get("sample_index", 0)
            pens = s.get("penalties", [])
            q.penalty_offset = len(pt)
            q.penalty_len = len(pens)
            for t, a, b in pens:
                pt.append(t); pp.append(a); po.append(b)
            toks += list(s["tokens"])
            tables += list(s["table"])
        ta, tp_ = i32(toks)
        ba, bp = i32(tables if tables else [0])
        pa, ppp = i32(pt if pt else [0])
        qa, qpp = i32(pp if pp else [0])
        oa, opp = i32(po if po else [0])
        batch = Batch(n_seqs=n, n_tokens=len(toks), seqs=arr, token_ids=tp_, block_tables=bp,
                      n_block_table_entries=len(tables), penalty_tokens=ppp,
                      penalty_prompt_counts=qpp, penalty_output_counts=opp,
                      n_penalty_entries=len(pt))
        out_t = np.zeros(n, np.int32)
        out_l = np.zeros(n, np.float32)
        stride = max(top_stride, 1)
        top_i = np.zeros(n * stride, np.int32)
        top_l = np.zeros(n * stride, np.float32)
        logits = np.full(max(n_logits, 1) * self.V, np.nan, np.float32)
        res = Result(tokens=out_t.ctypes.data_as(C.POINTER(C.c_int32)),
                     logprobs=out_l.ctypes.data_as(C.POINTER(C.c_float)),
                     top_ids=top_i.ctypes.data_as(C.POINTER(C.c_int32)),
                     top_logprobs=top_l.ctypes.data_as(C.POINTER(C.c_float)),
                     top_stride=stride, logits=logits.ctypes.data_as(C.POINTER(C.c_float)),
                     logits_capacity=logits.size)
        rc = self.lib.glmrt_step(self.h, C.byref(batch), C.byref(res))
        keep = (ta, ba, pa, qa, oa, arr)  # alive until here
        del keep
        self.check(rc, "step")
        return out_t, out_l, top_i.reshape(n, stride), top_l.reshape(n, stride), logits.reshape(-1, self.V)[:n_logits]

    def close(self):
        self.lib.glmrt_engine_destroy(self.h)


# ---------------------------------------------------------------- pkg/sample port (float64)

def mix64(z):
    m = (1 << 64) - 1
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return z ^ (z >> 31)


def uniform(seed, idx):
    g, m = 0x9E3779B97F4A7C15, (1 << 64) - 1
    key = mix64((seed + g) & m)
    return (mix64((key + (idx + 1) * g) & m) >> 11) * (1.0 / (1 << 53))


def sample_ref(logits, sp, pens):
    w = [float(x) for x in logits]
    V = len(w)
    rp = sp.get("repetition_penalty", 1.0)
    fp, pr = sp.get("frequency_penalty", 0.0), sp.get("presence_penalty", 0.0)
    rp = float(np.float32(rp)); fp = float(np.float32(fp)); pr = float(np.float32(pr))
    for t, a, b in pens:
        if rp > 0 and rp != 1 and a + b > 0:
            w[t] = w[t] / rp if w[t] > 0 else w[t] * rp
        if (fp != 0 or pr != 0) and b > 0:
            w[t] -= b * fp + pr
    temp = float(np.float32(sp.get("temperature", 0.0)))
    if temp <= 0:
        best = 0
        for i in range(V):
            if w[i] > w[best]:
                best = i
        return best
    inv = 1 / temp
    w = [x * inv for x in w]
    mx = max(w)
    w = [math.exp(x - mx) for x in w]
    mp = float(np.float32(sp.get("min_p", 0.0)))
    if mp > 0:
        w = [0.0 if x < mp else x for x in w]
    k = sp.get("top_k", 0)
    if 0 < k < V:
        pos = sorted([x for x in w if x > 0], reverse=True)
        if len(pos) >= k:
            kth = pos[k - 1]
            w = [0.0 if x < kth else x for x in w]
    tp = float(np.float32(sp.get("top_p", 1.0)))
    if 0 < tp < 1:
        ids = [i for i in range(V) if w[i] > 0]
        total = sum(w[i] for i in ids)
        ids.sort(key=lambda i: (-w[i], i))
        limit, mass, n = tp * total, 0.0, 0
        while n < len(ids) and mass < limit:
            mass += w[ids[n]]
            n += 1
        for i in ids[n:]:
            w[i] = 0.0
    total = sum(w)
    target = uniform(sp.get("seed", 0), sp.get("sample_index", 0)) * total
    acc, last = 0.0, -1
    for i, x in enumerate(w):
        if x <= 0:
            continue
        acc += x
        last = i
        if acc > target:
            return i
    return last


# ---------------------------------------------------------------- checks

rows = []


def report(name, detail, value, tol, ok=None):
    if ok is None:
        ok = value == value and value <= tol
    rows.append((name, detail, value, tol, ok))
    print(f"{name:34s} {detail:52s} {value:10.3e} tol {tol:8.1e} {'ok' if ok else 'FAIL'}", flush=True)


def rel_l2(got, ref):
    got = np.asarray(got, np.float64); ref = np.asarray(ref, np.float64)
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


def table_for(eng, n_pos, base):
    nb = (n_pos + eng.bs - 1) // eng.bs
    return [base + i for i in range(nb)]


def run_golden(eng, golden, model_name, quick, tol, margin, label, check=True):
    """check=False: report the numbers only (FP8 path against the float32 goldens,
    which docs/validation.md shows cannot meet any useful tolerance)."""
    cases = golden["cases"][:1] if quick else golden["cases"]
    errs = []
    single = []
    for ci, c in enumerate(cases):
        prompt = c["prompt_token_ids"]
        steps = 1 if quick else len(c["greedy_token_ids"])
        table = table_for(eng, len(prompt) + steps, ci * 64)
        greedy = {"temperature": 0.0}
        tok, _, _, _, lg = eng.step([{"tokens": prompt, "start": 0, "table": table, "logits": True,
                                      "sampling": greedy}])
        err = rel_l2(lg[0], c["last_logits"])
        ref_top = int(np.argmax(c["last_logits"]))
        rec = {"prefill_logits": lg[0].copy(), "decode_logits": [], "tokens": [int(tok[0])]}
        hard, soft, not_argmax = 0, 0, 0
        for i in range(steps):
            if i > 0:
                t = c["greedy_token_ids"][i - 1]
                tok, _, _, _, lg = eng.step([{"tokens": [t], "start": len(prompt) + i - 1,
                                              "table": table, "logits": True, "sampling": greedy}])
                rec["decode_logits"].append(lg[0].copy())
                rec["tokens"].append(int(tok[0]))
            if int(tok[0]) != int(np.argmax(lg[0])):
                not_argmax += 1
            if int(tok[0]) != c["greedy_token_ids"][i]:
                if c["greedy_margins"][i] > margin:
                    hard += 1
                else:
                    soft += 1
        single.append(rec)
        top_ok = int(np.argmax(rec["prefill_logits"])) == ref_top
        errs.append(err)
        if not check:
            print(f"  {label} case {ci}: prompt {len(prompt)} rel L2 {err:.4f}, top-1 {'=' if top_ok else '!='}, "
                  f"greedy mismatches {hard} (+{soft} at margin <= {margin})")
            continue
        report(f"{label} case {ci} logits", f"prompt {len(prompt)}, top-1 {'matches' if top_ok else 'differs from'} reference",
               err, tol)
        report(f"{label} case {ci} greedy", f"{steps} steps: {hard} mismatches > margin {margin}, {soft} tolerated, {not_argmax} not argmax",
               float(hard + not_argmax), 0.0)
    return single, errs


def run_batched(eng, golden, single, label, exact):
    """One-sequence runs vs the same sequences batched. Cases 1 and 2 (6 prompt
    tokens) stay on the streaming GEMM (<= 8 rows), which computes every row
    the same way at any batch size: they must agree to float32 rounding (cuBLAS
    may pick another router / lm_head kernel per batch size). All six cases
    (188 tokens) take cuBLASLt for the dense linears on the FP8 path, whose
    different accumulation flips FP8 codes (docs/validation.md): reported only.
    The exactness-check path computes every row alike at any size: strict."""
    greedy = {"temperature": 0.0}
    ids = [1, 2]
    cases = [golden["cases"][i] for i in ids]
    seqs, tables = [], []
    for k, c in enumerate(cases):
        t = table_for(eng, len(c["prompt_token_ids"]) + len(c["greedy_token_ids"]), 1024 + k * 64)
        tables.append(t)
        seqs.append({"tokens": c["prompt_token_ids"], "start": 0, "table": t, "logits": True, "sampling": greedy})
    ntok = sum(len(s["tokens"]) for s in seqs)
    _, _, _, _, lg = eng.step(seqs)
    errs = [rel_l2(lg[k], single[i]["prefill_logits"]) for k, i in enumerate(ids)]
    for st in range(1, len(cases[0]["greedy_token_ids"])):
        seqs = []
        for k, c in enumerate(cases):
            seqs.append({"tokens": [c["greedy_token_ids"][st - 1]], "start": len(c["prompt_token_ids"]) + st - 1,
                         "table": tables[k], "logits": True, "sampling": greedy})
        _, _, _, _, lg = eng.step(seqs)
        for k, i in enumerate(ids):
            errs.append(rel_l2(lg[k], single[i]["decode_logits"][st - 1]))
    errs.sort()
    if exact:
        report(f"{label} batched", f"cases 1+2, prefill + 15 decode steps: max", errs[-1], 1e-5)
    else:
        # cuBLAS may pick another router / lm_head kernel per batch size; the
        # ~1e-7 differences flip an FP8 (and BF16 KV) rounding now and then,
        # so FP8 agreement is case by case (docs/validation.md): need half.
        within = sum(e <= 1e-5 for e in errs)
        report(f"{label} batched", f"cases 1+2, {len(errs)} steps: {within} within 1e-5 (need half), max {errs[-1]:.1e}; median",
               errs[len(errs) // 2], 1e-5, ok=2 * within >= len(errs))
    allc = golden["cases"]
    seqs = [{"tokens": c["prompt_token_ids"], "start": 0, "table": table_for(eng, len(c["prompt_token_ids"]), 1536 + ci * 16),
             "logits": True, "sampling": greedy} for ci, c in enumerate(allc)]
    _, _, _, _, lg = eng.step(seqs)
    errs = sorted(rel_l2(lg[i], single[i]["prefill_logits"]) for i in range(len(allc)))
    if exact:
        report(f"{label} batched prefill", f"6 seqs, 188 tokens vs one-seq runs", errs[-1], 1e-5)
    else:
        # cuBLASLt's FP8 accumulation differs from the streaming kernel's, and
        # FP8 activation rounding amplifies that (docs/validation.md): report only.
        print(f"  {label} batched prefill via cuBLASLt (6 seqs, 188 tokens) vs one-seq: "
              f"median rel L2 {errs[len(errs) // 2]:.4f}, max {errs[-1]:.4f}")


def run_sampling(eng, golden, model_name):
    c = golden["cases"][3]
    prompt = c["prompt_token_ids"]
    rng = np.random.default_rng(7)
    params = [
        {"temperature": 1.0, "seed": 1, "sample_index": 0},
        {"temperature": 0.7, "top_k": 5, "seed": 2, "sample_index": 3, "n_top": 5},
        {"temperature": 1.3, "top_p": 0.8, "seed": 3, "sample_index": 9, "n_top": 20},
        {"temperature": 1.0, "min_p": 0.05, "top_k": 40, "top_p": 0.9, "seed": 4, "sample_index": 1},
        {"temperature": 0.0, "repetition_penalty": 1.3, "n_top": 3},
        {"temperature": 0.9, "repetition_penalty": 1.2, "frequency_penalty": 0.5,
         "presence_penalty": -0.3, "seed": 5, "sample_index": 2},
        {"temperature": 2.0, "seed": (1 << 64) - 5, "sample_index": 123456},
    ]
    bad = 0
    seqs = []
    for pi, sp in enumerate(params):
        hist = {}
        for t in prompt:
            hist.setdefault(t, [0, 0])[0] += 1
        for t in rng.integers(0, eng.V, 6):
            hist.setdefault(int(t), [0, 0])[1] += 1
        pens = [(t, a, b) for t, (a, b) in sorted(hist.items())]
        seqs.append({"tokens": prompt, "start": 0, "table": table_for(eng, len(prompt), 2048 + pi * 64),
                     "logits": True, "sampling": sp, "penalties": pens})
    toks, lps, ti, tl, lg = eng.step(seqs, top_stride=20)
    worst_lp = 0.0
    for i, sp in enumerate(params):
        ref = sample_ref(lg[i], sp, seqs[i]["penalties"])
        if ref != int(toks[i]):
            bad += 1
            print(f"  sampling row {i}: GPU {toks[i]} reference {ref} params {sp}")
        l64 = lg[i].astype(np.float64)
        lse = l64.max() + math.log(np.exp(l64 - l64.max()).sum())
        worst_lp = max(worst_lp, abs(float(lps[i]) - (l64[toks[i]] - lse)))
        order = sorted(range(eng.V), key=lambda j: (-lg[i][j], j))
        n = sp.get("n_top", 0)
        if list(ti[i][:n]) != order[:n] or any(x != -1 for x in ti[i][n:]):
            bad += 1
            print(f"  sampling row {i}: top ids {list(ti[i][:n])} want {order[:n]}")
    report(f"{model_name} GPU sampling", f"{len(params)} param sets vs pkg/sample port: {bad} mismatches",
           float(bad), 0.0)
    report(f"{model_name} GPU logprobs", "max |logprob - float64 log-softmax|", worst_lp, 1e-5)


def run_errors(eng, model_name):
    fails = 0
    lib = eng.lib
    # Unknown tensor name, after finalize: both must fail with a message naming the tensor.
    shape = (C.c_int64 * 1)(4)
    buf = (C.c_char * 16)()
    rc = lib.glmrt_load_tensor(eng.h, b"model.layers.0.bogus.weight", 0, shape, 1, C.cast(buf, C.c_void_p), 16)
    msg = lib.glmrt_last_error().decode()
    fails += not (rc != 0 and "bogus" in msg)
    # A block id outside the pool.
    try:
        eng.step([{"tokens": [1, 2], "start": 0, "table": [eng.info.num_kv_blocks + 3]}])
        fails += 1
    except RuntimeError as e:
        fails += "block table" not in str(e)
    # A token outside the vocabulary.
    try:
        eng.step([{"tokens": [eng.V], "start": 0, "table": [0]}])
        fails += 1
    except RuntimeError as e:
        fails += "token_ids" not in str(e)
    report(f"{model_name} ABI errors", "unknown tensor, bad block id, bad token id", float(fails), 0.0)


def run_bench(eng, model_name):
    """Tiny-model throughput through the C ABI (host overhead included)."""
    import time
    greedy = {"temperature": 0.0}
    out = []
    for batch, steps in ((1, 128), (16, 64)):
        seqs = []
        for b in range(batch):
            prompt = [(7 * b + 3 * i) % 1000 for i in range(32)]
            seqs.append({"tokens": prompt, "start": 0, "table": table_for(eng, 32 + steps, 3000 + b * 16),
                         "sampling": greedy})
        t0 = time.perf_counter()
        toks = eng.step(seqs)[0]
        t_pre = time.perf_counter() - t0
        t0 = time.perf_counter()
        for i in range(steps):
            for b, s in enumerate(seqs):
                s["tokens"] = [int(toks[b])]
                s["start"] = 32 + i
            toks = eng.step(seqs)[0]
        t_dec = time.perf_counter() - t0
        out.append((batch, 32 * batch / t_pre, batch * steps / t_dec, 1e3 * t_dec / steps))
    print(f"\n{model_name} throughput (C ABI from Python, greedy):")
    print(f"{'batch':>5} {'prefill tok/s':>14} {'decode tok/s':>13} {'ms/step':>8}")
    for b, p, d, ms in out:
        print(f"{b:5d} {p:14.0f} {d:13.0f} {ms:8.2f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--golden", required=True)
    ap.add_argument("--fp8-golden", help="the FP8 path's golden (testdata/models/<model>.fp8.golden.json)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--tp", type=int, default=1, help="GPUs (tensor + expert parallel)")
    a = ap.parse_args()
    name = os.path.basename(a.model.rstrip("/")) + (f" tp{a.tp}" if a.tp > 1 else "")
    golden = json.load(open(a.golden))
    fp8_golden = json.load(open(a.fp8_golden)) if a.fp8_golden else None
    # 1. Validation precision against the float32 transformers goldens: no
    #    activation quantization, FP32 KV cache and lm_head.
    eng = Engine(a.lib, a.model, exact=True, fp32=True, tp=a.tp)
    n = eng.load_all()
    print(f"{name}: {n} tensors loaded on {eng.info.device_name.decode()}, {eng.info.num_kv_blocks} KV blocks of {eng.bs}")
    single, _ = run_golden(eng, golden, name, a.quick, EXACT_REL_L2, EXACT_MARGIN, f"{name} exact")
    if not a.quick:
        run_batched(eng, golden, single, f"{name} exact", True)
    eng.close()
    # 2. The real path: FP8 activations, BF16 KV cache, BF16 lm_head.
    eng = Engine(a.lib, a.model, exact=False, fp32=False, tp=a.tp)
    eng.load_all()
    # The tiny models are conditioned so FP8 noise flips no routing decision
    # (docs/golden.md): the real path is held to the FP8 tolerances.
    single, _ = run_golden(eng, golden, name, a.quick, FP8_REL_L2, FP8_MARGIN, f"{name} fp8", check=True)
    if fp8_golden and not a.quick:
        # The FP8 golden rounds where this path rounds (scripts/make_fp8_golden.py).
        # FP8 rounding is discontinuous, so two correct implementations agree
        # case by case (docs/validation.md): golden.FP8GoldenTolerances asks half
        # of the cases within 1e-5 and every case within 2e-2.
        _, errs = run_golden(eng, fp8_golden, name, False, 1.0, FP8_MARGIN, f"{name} fp8-golden", check=False)
        errs = sorted(errs)
        within = sum(e <= 1e-5 for e in errs)
        if a.tp == 1:
            report(f"{name} fp8 vs FP8 golden", f"{len(errs)} cases: {within} within 1e-5 (need half); worst",
                   errs[-1], 2e-2, ok=2 * within >= len(errs) and errs[-1] <= 2e-2)
        else:
            # Row-parallel linears (o_proj, dense down) quantize each GPU's input
            # slice with its own per-token scale, as vLLM does: not the
            # single-GPU arithmetic of the golden, so report only.
            print(f"  {name} fp8 vs FP8 golden: median rel L2 {errs[len(errs) // 2]:.4f}, "
                  f"{within}/{len(errs)} within 1e-5 (per-GPU activation scales under tensor parallelism)")
    if not a.quick:
        run_batched(eng, golden, single, f"{name} fp8", False)
        run_sampling(eng, golden, name)
        run_errors(eng, name)
    if a.bench:
        run_bench(eng, name)
    eng.close()
    bad = [r for r in rows if not r[4]]
    print(f"model_check {name}: {len(rows)} checks, {len(bad)} failed")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
