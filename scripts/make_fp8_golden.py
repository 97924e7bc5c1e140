#!/usr/bin/env python3
"""FP8 golden outputs for a tiny GLM-4.7-FP8-layout checkpoint: what the GPU's FP8 path computes.

Usage (from the repository root; needs only numpy):
    python3 scripts/make_fp8_golden.py --model testdata/models/tiny-f32 \
        --out testdata/models/tiny-f32.fp8.golden.json

The transformers goldens (scripts/make_golden.py) are float32 with no activation
quantization; against them an FP8 path can only be checked to the level of its
rounding noise (about 1% of the logits on the conditioned tiny models). This
script is an independent float64 numpy forward that rounds where the CUDA
runtime's FP8 path (cuda/runtime/step.cu, cuda/kernels/) rounds, so that a
correct implementation of that path agrees with it to float32 level case by case
(docs/validation.md, "FP8 golden"):

  1. Every quantized linear quantizes its input per token (docs/model.md §4.3):
       s[t]   = max(max_k |x[t,k]| / 448, 1 / (448 * 512))
       q[t,k] = fp8_e4m3_rne(clamp(x[t,k] / s[t], -448, 448))
       y[t,n] = (sum_k q[t,k] * W_fp8[n,k]) * s[t] * weight_scale[n] + bias[n]
     Router, lm_head, norms and embeddings are not quantized.
  2. The KV cache is BF16: K (after q/k norm and RoPE) and V are rounded to
     BF16 (round to nearest even) when written.
  3. Attention runs on BF16 tensor cores in the log2 domain: q is multiplied
     by log2(e)/sqrt(head_dim) and rounded to BF16; scores s = q'.k are exact
     products summed in float; P = 2^(s - m) with m the running maximum of the
     kernel's tile schedule; the normaliser l sums the unrounded P, and O sums
     BF16(P) . V. The schedule decides m, hence the BF16 rounding of P:
       - a prompt of two or more tokens (attention_prefill): per query row,
         64-key tiles from key 0 in order, one running maximum;
       - a one-token step (attention_decode, every greedy step): 16-key tiles,
         tile j on warp j % 4, one running maximum per warp, then the warps
         merged with weights 2^(m_w - M).
     Both are the kernels' single-split launches: a decode context of at most
     128 keys and a prompt of at most 256 tokens, which covers every case here.
  4. The final RMSNorm's output is rounded to BF16 before the BF16 lm_head.

The file holds the prompts of the transformers golden next to the model
(model + ".golden.json") with a 16-step greedy continuation of its own, then
--short cases of 1 to 4 random ordinary tokens with 4 greedy steps. A greedy
step is recomputed from scratch over the whole sequence (teacher forcing), each
position with the attention schedule of the step the engine computes it in:
the prompt's positions in one prefill step, every later one in a decode step.

FP8 rounding is discontinuous, so two correct implementations agree exactly
only on cases where no activation lands within float rounding of an FP8 (or
BF16) rounding boundary; the short cases make sure many such cases exist. The
script reports the smallest greedy margin and the smallest routing gap
(k-th vs (k+1)-th biased score, and the group score at the topk_group
boundary). A routing near-tie makes it refuse to write (a flipped expert
changes every later number). A greedy near-tie is only reported: the file
records each step's margin and pkg/golden does not count a mismatch at a step
whose reference margin is below its threshold.
"""

from __future__ import annotations

import argparse
import json
import math
import struct
import sys
from pathlib import Path

import numpy as np

GREEDY_STEPS = 16
MIN_GREEDY_MARGIN = 1e-3
MIN_ROUTING_GAP = 2e-5


def fp8_table() -> np.ndarray:
    """float64 value of each E4M3FN code (0x7F/0xFF are NaN)."""
    t = np.empty(256)
    for c in range(256):
        e, m = (c >> 3) & 0xF, c & 7
        v = m / 8 * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
        if c & 0x7F == 0x7F:
            v = math.nan
        t[c] = -v if c & 0x80 else v
    return t


FP8 = fp8_table()
POS = FP8[:0x7F]  # codes 0x00..0x7E: 0 .. 448, increasing; code parity = index parity


def fp8_rne(v: np.ndarray) -> np.ndarray:
    """Round to the nearest E4M3FN value, ties to the even code, after clamping to ±448."""
    a = np.minimum(np.abs(v), 448.0)
    i = np.clip(np.searchsorted(POS, a), 1, len(POS) - 1)  # POS[i-1] < a <= POS[i]
    lo, hi = POS[i - 1], POS[i]
    up = (a - lo > hi - a) | ((a - lo == hi - a) & (i % 2 == 0))
    r = np.where(up, hi, lo)
    r = np.where(a == 0, 0.0, r)
    return np.sign(v) * r


def bf16(v: np.ndarray) -> np.ndarray:
    """The float32 value of v, rounded to BF16 (nearest, ties to even), as float64.

    The GPU rounds float32 values; rounding v to float32 first reproduces that
    (the float64 -> float32 -> BF16 double rounding differs from it only where v
    is within float32 rounding of a BF16 boundary, like any float32 reordering)."""
    u = np.asarray(v, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16
    return u.astype(np.uint32).view(np.float32).astype(np.float64)


LOG2E = 1.4426950408889634
DEC_TILE, DEC_WARPS = 16, 4   # attention_decode: 16-key tiles, tile j on warp j % 4
PF_TILE = 64                  # attention_prefill: 64-key tiles in order


def attend(s: np.ndarray, v: np.ndarray, decode: bool) -> np.ndarray:
    """One query row's attention output from its log2-domain scores s [n] and
    the BF16 values v [n, D], with the kernel's tile schedule (module doc, 3)."""
    n = len(s)
    if decode:
        tiles = [list(range(w, (n + DEC_TILE - 1) // DEC_TILE, DEC_WARPS)) for w in range(DEC_WARPS)]
        width = DEC_TILE
    else:
        tiles = [list(range((n + PF_TILE - 1) // PF_TILE))]
        width = PF_TILE
    ms, ls, os_ = [], [], []
    for seq in tiles:
        m, l, o = -math.inf, 0.0, np.zeros(v.shape[1])
        for j in seq:
            st, vt = s[j * width:(j + 1) * width], v[j * width:(j + 1) * width]
            mn = max(m, float(st.max()))
            al = 2.0 ** (m - mn) if m != -math.inf else 0.0
            p = 2.0 ** (st - mn)
            l = l * al + float(p.sum())
            o = o * al + bf16(p) @ vt
            m = mn
        ms.append(m)
        ls.append(l)
        os_.append(o)
    M = max(ms)
    f = [0.0 if m == -math.inf else 2.0 ** (m - M) for m in ms]
    L = sum(li * fi for li, fi in zip(ls, f))
    return sum(oi * fi for oi, fi in zip(os_, f)) / L


def load(model_dir: Path) -> dict[str, np.ndarray]:
    with (model_dir / "model.safetensors.index.json").open() as f:
        weight_map = json.load(f)["weight_map"]
    out = {}
    for shard in sorted(set(weight_map.values())):
        blob = (model_dir / shard).read_bytes()
        (hlen,) = struct.unpack("<Q", blob[:8])
        header = json.loads(blob[8: 8 + hlen])
        base = 8 + hlen
        for name, info in header.items():
            if name == "__metadata__":
                continue
            a, b = info["data_offsets"]
            buf = blob[base + a: base + b]
            dt = info["dtype"]
            if dt == "F8_E4M3":
                arr = FP8[np.frombuffer(buf, np.uint8)]
            elif dt == "BF16":
                arr = (np.frombuffer(buf, np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
            elif dt == "F32":
                arr = np.frombuffer(buf, "<f4").astype(np.float64)
            else:
                sys.exit(f"{shard}: {name}: dtype {dt} not F8_E4M3/BF16/F32")
            out[name] = arr.reshape(info["shape"])
    return out


class Model:
    def __init__(self, cfg: dict, w: dict[str, np.ndarray]):
        self.cfg, self.w = cfg, w
        self.min_gap = math.inf

    def lin(self, x: np.ndarray, name: str) -> np.ndarray:
        w = self.w
        W = w[name + ".weight"]
        s = w.get(name + ".weight_scale")
        if s is None:
            y = x @ W.T
        else:
            sx = np.maximum(np.abs(x).max(-1, keepdims=True) / 448, 1 / (448 * 512))
            y = (fp8_rne(x / sx) @ W.T) * sx * s.reshape(1, -1)
        b = w.get(name + ".bias")
        return y + b if b is not None else y

    def mlp(self, x: np.ndarray, p: str) -> np.ndarray:
        g = self.lin(x, p + "gate_proj")
        return self.lin(g / (1 + np.exp(-g)) * self.lin(x, p + "up_proj"), p + "down_proj")

    def forward(self, ids: list[int], n_prefill: int) -> np.ndarray:
        """Logits at every position of ids; positions below n_prefill were
        computed in one prefill step, the others each in a decode step (the
        attention schedule, module doc 3)."""
        cfg, w = self.cfg, self.w
        H, NH, NKV, D = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        eps = cfg["rms_norm_eps"]
        rot = int(D * cfg["partial_rotary_factor"])
        S = len(ids)
        inv_freq = 1.0 / cfg["rope_theta"] ** (np.arange(0, rot, 2, dtype=np.float64) / rot)
        ang = np.concatenate([np.outer(np.arange(S, dtype=np.float64), inv_freq)] * 2, axis=-1)
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

        def rms(x, wt):
            return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * wt

        def rope(x):
            r, p = x[..., :rot], x[..., rot:]
            half = rot // 2
            rh = np.concatenate([-r[..., half:], r[..., :half]], axis=-1)
            return np.concatenate([r * cos + rh * sin, p], axis=-1)

        h = w["model.embed_tokens.weight"][ids]
        qscale = LOG2E / math.sqrt(D)
        for L in range(cfg["num_hidden_layers"]):
            p = f"model.layers.{L}."
            a = rms(h, w[p + "input_layernorm.weight"])
            q = self.lin(a, p + "self_attn.q_proj").reshape(S, NH, D)
            k = self.lin(a, p + "self_attn.k_proj").reshape(S, NKV, D)
            v = self.lin(a, p + "self_attn.v_proj").reshape(S, NKV, D)
            q = rope(rms(q, w[p + "self_attn.q_norm.weight"]))
            k = bf16(rope(rms(k, w[p + "self_attn.k_norm.weight"])))
            v = bf16(v)
            q = bf16(q * qscale)
            o = np.empty((S, NH, D))
            for head in range(NH):
                kv = head // (NH // NKV)
                for t in range(S):
                    o[t, head] = attend(k[: t + 1, kv] @ q[t, head], v[: t + 1, kv], t >= n_prefill)
            h = h + self.lin(o.reshape(S, NH * D), p + "self_attn.o_proj")
            m = rms(h, w[p + "post_attention_layernorm.weight"])
            if L < cfg["first_k_dense_replace"]:
                h = h + self.mlp(m, p + "mlp.")
                continue
            h = h + self.moe(m, p)
        return bf16(rms(h, w["model.norm.weight"])) @ w["lm_head.weight"].T

    def moe(self, m: np.ndarray, p: str) -> np.ndarray:
        cfg, w = self.cfg, self.w
        E, K = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
        G, TG = cfg["n_group"], cfg["topk_group"]
        scores = 1.0 / (1.0 + np.exp(-(m @ w[p + "mlp.gate.weight"].T)))
        choice = scores + w[p + "mlp.gate.e_score_correction_bias"]
        routed = np.zeros_like(m)
        for t in range(len(m)):
            c = choice[t].copy()
            if G > 1:
                grp = np.sort(c.reshape(G, E // G), -1)[:, -2:].sum(-1)
                srt = np.sort(grp)[::-1]
                self.min_gap = min(self.min_gap, srt[TG - 1] - srt[TG])
                keep = np.argsort(-grp, kind="stable")[:TG]
                allowed = np.zeros(G, bool)
                allowed[keep] = True
                c[~np.repeat(allowed, E // G)] = -np.inf
            order = np.argsort(-c, kind="stable")
            if np.isfinite(c[order[K]]):
                self.min_gap = min(self.min_gap, c[order[K - 1]] - c[order[K]])
            idx = order[:K]
            wt = scores[t, idx]
            if cfg["norm_topk_prob"]:
                wt = wt / (wt.sum() + 1e-20)
            wt = wt * cfg["routed_scaling_factor"]
            for j, e in enumerate(idx):
                routed[t] += wt[j] * self.mlp(m[t: t + 1], p + f"mlp.experts.{e}.")[0]
        return routed + self.mlp(m, p + "mlp.shared_experts.")


def f32_json(x: float) -> float:
    return float(np.format_float_positional(np.float32(x), unique=True, trim="0"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--short", type=int, default=24, help="extra short cases (default 24)")
    ap.add_argument("--seed", type=int, default=7, help="seed of the short prompts (default 7)")
    args = ap.parse_args()
    with (args.model / "config.json").open() as f:
        cfg = json.load(f)
    hf_golden = Path(str(args.model) + ".golden.json")
    with hf_golden.open() as f:
        prompts = [(c["prompt_token_ids"], GREEDY_STEPS) for c in json.load(f)["cases"]]
    rng = np.random.Generator(np.random.PCG64(args.seed))
    prompts += [([int(x) for x in rng.integers(0, 1000, 1 + i % 4)], 4) for i in range(args.short)]
    model = Model(cfg, load(args.model))
    cases = []
    for ci, (prompt, steps) in enumerate(prompts):
        model.min_gap = math.inf
        # pkg/golden sends the prompt as one step: the prefill kernel from two
        # tokens on, the decode kernel for a one-token prompt.
        n_prefill = len(prompt) if len(prompt) > 1 else 0
        last = model.forward(prompt, n_prefill)[-1]
        seq, tokens, margins = list(prompt), [], []
        for step in range(steps):
            logits = last if step == 0 else model.forward(seq, n_prefill)[-1]
            order = np.argsort(-logits, kind="stable")
            tokens.append(int(order[0]))
            margins.append(float(logits[order[0]] - logits[order[1]]))
            seq.append(int(order[0]))
        print(f"  case {ci}: prompt {len(prompt)} tokens, min greedy margin {min(margins):.4g}, "
              f"min routing gap {model.min_gap:.3g}")
        if model.min_gap < MIN_ROUTING_GAP:
            sys.exit(f"case {ci}: a routing decision is closer to a tie than float32 engines reproduce")
        if min(margins) < MIN_GREEDY_MARGIN:
            print(f"    note: greedy margin below {MIN_GREEDY_MARGIN} at step(s) "
                  f"{[i for i, m in enumerate(margins) if m < MIN_GREEDY_MARGIN]}; comparisons tolerate a mismatch there")
        cases.append({
            "prompt_token_ids": prompt,
            "last_logits": [f32_json(x) for x in last.tolist()],
            "greedy_token_ids": tokens,
            "greedy_margins": [f32_json(x) for x in margins],
        })
    doc = {
        "model": args.model.resolve().name,
        "reference": f"numpy {np.__version__} float64 forward rounding where the GPU's FP8 path does: "
                     "per-token FP8 activations of every quantized linear (docs/model.md §4.3), BF16 KV "
                     "cache, BF16 attention operands with the kernels' tile schedules, BF16 lm_head input; "
                     "scripts/make_fp8_golden.py",
        "numerics": "fp8-gpu",
        "cases": cases,
    }
    args.out.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    print(f"  wrote {args.out} ({len(cases)} cases)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
