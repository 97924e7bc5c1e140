#!/usr/bin/env python3
"""FP8-activation reference outputs for a tiny GLM-4.7-FP8-layout checkpoint.

Usage (from the repository root; needs only numpy):
    python3 pkg/backend/cpu/testdata/make_fp8_reference.py \
        --model testdata/models/tiny-f32 --out pkg/backend/cpu/testdata/tiny-f32.fp8.golden.json

The transformers goldens (scripts/make_golden.py) are float32 with no activation
quantization. The GPU path, and the CPU backend with FP8Activations, quantize
the input of every quantized linear per token (docs/model.md §4.3):

    s[t]   = max(max_k |x[t,k]| / 448, 1 / (448 * 512))
    q[t,k] = fp8_e4m3_rne(clamp(x[t,k] / s[t], -448, 448))
    y[t,n] = (sum_k q[t,k] * W_fp8[n,k]) * s[t] * weight_scale[n] + bias[n]

On the conditioned tiny models (docs/golden.md) that noise costs about 1% of the
logits against the float32 goldens, which check the FP8 path only to that level
(pkg/golden FP8Tolerances). This script is an independent float64 numpy forward of the same
model with exactly that quantization. It reads the shards with its own
safetensors parser and FP8 decoder/encoder, and writes a golden file in the
format of docs/golden.md: first the prompts of the transformers golden next to
the model (model + ".golden.json") with a 16-step greedy continuation of its
own (teacher forcing, whole sequence recomputed per step), then --short cases
of 1 to 4 random ordinary tokens with 4 greedy steps. FP8 rounding is
discontinuous, so two correct implementations agree exactly only on cases where
no activation lands within float rounding of an FP8 rounding boundary; the
short cases make sure many such cases exist. Router, lm_head, norms and
embeddings are not quantized.

It reports the smallest greedy margin and the smallest routing gap (k-th vs
(k+1)-th biased score, and the group score at the topk_group boundary). A
routing near-tie makes it refuse to write (a flipped expert changes every
later number). A greedy near-tie is only reported: the file records each
step's margin and pkg/golden does not count a mismatch at a step whose
reference margin is below its threshold.
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

    def forward(self, ids: list[int]) -> np.ndarray:
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
        causal = np.triu(np.full((S, S), -np.inf), 1)
        for L in range(cfg["num_hidden_layers"]):
            p = f"model.layers.{L}."
            a = rms(h, w[p + "input_layernorm.weight"])
            q = self.lin(a, p + "self_attn.q_proj").reshape(S, NH, D)
            k = self.lin(a, p + "self_attn.k_proj").reshape(S, NKV, D)
            v = self.lin(a, p + "self_attn.v_proj").reshape(S, NKV, D)
            q = rope(rms(q, w[p + "self_attn.q_norm.weight"]))
            k = rope(rms(k, w[p + "self_attn.k_norm.weight"]))
            o = np.empty((S, NH, D))
            for head in range(NH):
                kv = head // (NH // NKV)
                sc = q[:, head] @ k[:, kv].T / math.sqrt(D) + causal
                sc = np.exp(sc - sc.max(-1, keepdims=True))
                o[:, head] = (sc / sc.sum(-1, keepdims=True)) @ v[:, kv]
            h = h + self.lin(o.reshape(S, NH * D), p + "self_attn.o_proj")
            m = rms(h, w[p + "post_attention_layernorm.weight"])
            if L < cfg["first_k_dense_replace"]:
                h = h + self.mlp(m, p + "mlp.")
                continue
            h = h + self.moe(m, p)
        return rms(h, w["model.norm.weight"]) @ w["lm_head.weight"].T

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
        last = model.forward(prompt)[-1]
        seq, tokens, margins = list(prompt), [], []
        for step in range(steps):
            logits = last if step == 0 else model.forward(seq)[-1]
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
        "reference": f"numpy {np.__version__} float64 forward with per-token dynamic FP8 activation "
                     "quantization of every quantized linear (docs/model.md §4.3), "
                     "pkg/backend/cpu/testdata/make_fp8_reference.py",
        "cases": cases,
    }
    args.out.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    print(f"  wrote {args.out} ({len(cases)} cases)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
