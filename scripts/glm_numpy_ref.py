#!/usr/bin/env python3
"""glm_numpy_ref.py — an independent float64 numpy forward of GLM-4.7 (docs/model.md §8)
over a checkpoint in the real GLM-4.7-FP8 layout, with its own safetensors reader.

make_golden.py uses it to cross-check transformers on every golden case;
make_long_golden.py uses it alone (no torch) for the long-context golden file;
make_mtp_golden.py uses numpy_mtp_logits, the MTP ("nextn") layer's draft logits
(docs/speculative.md), for the MTP golden files. Needs only numpy.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import numpy as np


def read_index(model_dir: Path) -> dict[str, str]:
    path = model_dir / "model.safetensors.index.json"
    try:
        with path.open() as f:
            index = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise SystemExit(f"read {path}: {exc}")
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise SystemExit(f"{path}: missing or empty weight_map")
    return weight_map


def _fp8_table() -> np.ndarray:
    """float64 value of each of the 256 E4M3FN codes (0x7F/0xFF are NaN)."""
    t = np.empty(256)
    for c in range(256):
        e, m = (c >> 3) & 0xF, c & 7
        v = m / 8 * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
        if c & 0x7F == 0x7F:
            v = math.nan
        t[c] = -v if c & 0x80 else v
    return t


def load_numpy_float64(model_dir: Path) -> dict[str, np.ndarray]:
    """Independent reader: parses safetensors headers itself, decodes FP8/BF16 in numpy."""
    weight_map = read_index(model_dir)
    fp8 = _fp8_table()
    raw: dict[str, np.ndarray] = {}
    for shard in sorted(set(weight_map.values())):
        path = model_dir / shard
        try:
            blob = path.read_bytes()
        except OSError as exc:
            raise SystemExit(f"read shard {path}: {exc}")
        (hlen,) = struct.unpack("<Q", blob[:8])
        header = json.loads(blob[8: 8 + hlen])
        base = 8 + hlen
        for name, info in header.items():
            if name == "__metadata__":
                continue
            a, b = info["data_offsets"]
            buf = blob[base + a: base + b]
            shape = tuple(info["shape"])
            dt = info["dtype"]
            if dt == "F8_E4M3":
                arr = fp8[np.frombuffer(buf, np.uint8)]
            elif dt == "BF16":
                arr = (np.frombuffer(buf, np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
            elif dt == "F32":
                arr = np.frombuffer(buf, "<f4").astype(np.float64)
            else:
                raise SystemExit(f"{path}: {name}: dtype {dt} not F8_E4M3/BF16/F32")
            if arr.size != math.prod(shape):
                raise SystemExit(f"{path}: {name}: {arr.size} elements for shape {list(shape)}")
            raw[name] = arr.reshape(shape)
    out = {}
    for name, arr in raw.items():
        if name.endswith(".weight_scale"):
            continue
        sname = name[: -len("weight")] + "weight_scale"
        # float32 product, as the reference and the engines dequantize.
        out[name] = (arr.astype(np.float32) * raw[sname].astype(np.float32)).astype(np.float64) \
            if sname in raw else arr
    return out


def np_rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def np_silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _rope_tables(cfg: dict, positions: np.ndarray):
    D = cfg["head_dim"]
    rot = int(D * cfg["partial_rotary_factor"])
    inv_freq = 1.0 / cfg["rope_theta"] ** (np.arange(0, rot, 2, dtype=np.float64) / rot)
    ang = np.concatenate([np.outer(positions.astype(np.float64), inv_freq)] * 2, axis=-1)  # [S, rot]
    return rot, np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]


def _lin(w, x, name, bias=False):
    y = x @ w[name + ".weight"].T
    return y + w[name + ".bias"] if bias else y


def _mlp(w, x, p):
    return _lin(w, np_silu(_lin(w, x, p + "gate_proj")) * _lin(w, x, p + "up_proj"), p + "down_proj")


def decoder_layer(cfg: dict, w: dict[str, np.ndarray], L: int, h: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Decoder layer L (pre-norm, residual from h) over rows h [S, H] at the given positions,
    causal attention among the S rows (the rows are one sequence from position positions[0])."""
    H, NH, NKV, D = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps = cfg["rms_norm_eps"]
    S = h.shape[0]
    rot, cos, sin = _rope_tables(cfg, positions)

    def rope(x):  # x [S, heads, D]; NeoX halves on the first `rot` dims
        r, p = x[..., :rot], x[..., rot:]
        half = rot // 2
        rh = np.concatenate([-r[..., half:], r[..., :half]], axis=-1)
        return np.concatenate([r * cos + rh * sin, p], axis=-1)

    causal = np.triu(np.full((S, S), -np.inf), 1)
    p = f"model.layers.{L}."
    a = np_rms(h, w[p + "input_layernorm.weight"], eps)
    q = _lin(w, a, p + "self_attn.q_proj", True).reshape(S, NH, D)
    k = _lin(w, a, p + "self_attn.k_proj", True).reshape(S, NKV, D)
    v = _lin(w, a, p + "self_attn.v_proj", True).reshape(S, NKV, D)
    q = rope(np_rms(q, w[p + "self_attn.q_norm.weight"], eps))
    k = rope(np_rms(k, w[p + "self_attn.k_norm.weight"], eps))
    o = np.empty((S, NH, D))
    for head in range(NH):
        kv = head // (NH // NKV)
        s = q[:, head] @ k[:, kv].T / math.sqrt(D) + causal
        s = np.exp(s - s.max(-1, keepdims=True))
        o[:, head] = (s / s.sum(-1, keepdims=True)) @ v[:, kv]
    h = h + _lin(w, o.reshape(S, NH * D), p + "self_attn.o_proj")
    m = np_rms(h, w[p + "post_attention_layernorm.weight"], eps)
    if L < cfg["first_k_dense_replace"]:
        return h + _mlp(w, m, p + "mlp.")
    E, K = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
    G, TG = cfg["n_group"], cfg["topk_group"]
    scores = 1.0 / (1.0 + np.exp(-(m @ w[p + "mlp.gate.weight"].T)))
    choice = scores + w[p + "mlp.gate.e_score_correction_bias"]
    y = _mlp(w, m, p + "mlp.shared_experts.")
    for t in range(S):
        c = choice[t].copy()
        if G > 1:
            grp = np.sort(c.reshape(G, E // G), -1)[:, -2:].sum(-1)
            keep = np.argsort(-grp, kind="stable")[:TG]
            allowed = np.zeros(G, bool)
            allowed[keep] = True
            c[~np.repeat(allowed, E // G)] = -np.inf
        idx = np.argsort(-c, kind="stable")[:K]
        wt = scores[t, idx]
        if cfg["norm_topk_prob"]:
            wt = wt / (wt.sum() + 1e-20)
        wt = wt * cfg["routed_scaling_factor"]
        for j, e in enumerate(idx):
            y[t] += wt[j] * _mlp(w, m[t: t + 1], p + f"mlp.experts.{e}.")[0]
    return h + y


def numpy_hidden(cfg: dict, w: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    """The final-normed hidden states [S, H] of a sequence (what lm_head reads)."""
    pos = np.arange(len(ids))
    h = w["model.embed_tokens.weight"][ids]
    for L in range(cfg["num_hidden_layers"]):
        h = decoder_layer(cfg, w, L, h, pos)
    return np_rms(h, w["model.norm.weight"], cfg["rms_norm_eps"])


def numpy_forward(cfg: dict, w: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    """float64 forward of docs/model.md §8 on the raw checkpoint names; returns last logits."""
    return numpy_hidden(cfg, w, ids)[-1] @ w["lm_head.weight"].T


def numpy_mtp_logits(cfg: dict, w: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    """Draft logits [S-1, V] of the MTP layer (docs/speculative.md): row i from the
    target's final-normed h_i and the token ids[i+1], at position i, with the main
    embedding and lm_head (the layer's own embed_tokens / shared_head.head unused).

        e = enorm(embed(t_{i+1})); g = hnorm(h_i); u = eh_proj([e ; g])
        v = DecoderLayer_L(u) at positions 0..S-2 (its own causal attention)
        logits = lm_head(shared_head.norm(v))
    """
    L, eps = cfg["num_hidden_layers"], cfg["rms_norm_eps"]
    if cfg.get("num_nextn_predict_layers", 0) < 1:
        raise SystemExit("config has num_nextn_predict_layers = 0: no MTP layer")
    p = f"model.layers.{L}."
    hn = numpy_hidden(cfg, w, ids)
    e = np_rms(w["model.embed_tokens.weight"][ids[1:]], w[p + "enorm.weight"], eps)
    g = np_rms(hn[:-1], w[p + "hnorm.weight"], eps)
    u = np.concatenate([e, g], axis=-1) @ w[p + "eh_proj.weight"].T
    v = decoder_layer(cfg, w, L, u, np.arange(len(ids) - 1))
    return np_rms(v, w[p + "shared_head.norm.weight"], eps) @ w["lm_head.weight"].T
