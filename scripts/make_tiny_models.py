#!/usr/bin/env python3
"""Write the project's two tiny checkpoints in exactly the GLM-4.7-FP8 layout.

The layout follows docs/model.md §1-§2: a compressed-tensors FP8_DYNAMIC
config, per-output-row FP8 E4M3 weights with `weight_scale [out, 1]`, BF16
norms/biases/embeddings/lm_head, a BF16 router with an F32
`e_score_correction_bias`, q/k norms, per-expert tensor names, and one MTP
("nextn") layer stored at index num_hidden_layers, sharded behind
model.safetensors.index.json.

Usage:
    python3 scripts/make_tiny_models.py --out testdata/models [--seed N]

The weights are random but conditioned like a trained model's (small residual
updates, token-keyed routers whose decisions are far from ties; see the
conditioning constants below and docs/golden.md), so that per-token FP8
activation noise costs about 1% of the logits and flips no routing decision.

Everything is drawn from numpy's PCG64 seeded with --seed, so the output is
byte-identical for a given seed. The shards are written by the reference
`safetensors` package (through its torch front end, which is the only one
that knows F8_E4M3 and BF16).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

try:
    import torch
    from safetensors.torch import save_file
except ImportError as exc:  # pragma: no cover - environment problem
    sys.exit(f"make_tiny_models: needs torch and safetensors ({exc}); "
             "pip install -r scripts/requirements-golden.txt")

FP8_MAX = 448.0

# GLM-4.7 special tokens in id order (docs/model.md §5.1: 151329..151364).
# The tiny tokenizer puts them at 1000.. in the same order; when
# tokenizer.json is present its added_tokens table is used instead.
GLM_SPECIAL_TOKENS = [
    "<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>",
    "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>",
    "<|begin_of_image|>", "<|end_of_image|>", "<|begin_of_video|>",
    "<|end_of_video|>", "<|begin_of_audio|>", "<|end_of_audio|>",
    "<|begin_of_transcription|>", "<|end_of_transcription|>",
    "<|code_prefix|>", "<|code_middle|>", "<|code_suffix|>", "<think>",
    "</think>", "<tool_call>", "</tool_call>", "<tool_response>",
    "</tool_response>", "<arg_key>", "</arg_key>", "<arg_value>",
    "</arg_value>", "/nothink", "<|begin_of_box|>", "<|end_of_box|>",
    "<|image|>", "<|video|>",
]
FIRST_SPECIAL_ID = 1000
TOKENIZER_DIR = Path("testdata/tokenizers/tiny-glm")


@dataclass(frozen=True)
class TinySpec:
    """The knobs that differ between the two tiny models."""

    name: str
    num_hidden_layers: int
    first_k_dense_replace: int
    n_routed_experts: int
    num_experts_per_tok: int
    n_group: int
    topk_group: int
    scale_dtype: str  # "F32" or "BF16"
    num_shards: int


TINY_MODELS = [
    TinySpec("tiny-f32", 3, 1, 8, 2, 1, 1, "F32", 2),
    TinySpec("tiny-bf16g", 4, 2, 16, 4, 4, 2, "BF16", 3),
]

# Shared by both tiny models (fixed by the lead, see docs/golden.md).
HIDDEN = 256
NUM_HEADS = 4
NUM_KV_HEADS = 2
HEAD_DIM = 128
INTERMEDIATE = 512
MOE_INTERMEDIATE = 128
VOCAB = 1040
N_SHARED_EXPERTS = 1
ROUTED_SCALING = 2.5
RMS_EPS = 1e-5
ROPE_THETA = 1000000
MAX_POS = 4096

# ---- conditioning (docs/golden.md, "Conditioning")
#
# Random networks drawn the textbook way are chaotic: every sublayer writes an
# update as large as the residual stream, and routing decisions sit at
# near-ties for a large fraction of tokens. Per-token FP8 activation
# quantization (~2.5% relative noise per quantized input) then moves the
# logits by 5% and flips expert choices. Trained models are not like that, so
# the tiny models are conditioned like trained ones:
#
# 1. Small residual updates. o_proj and every down_proj (dense, shared,
#    routed) are drawn with a gain below 1, so each sublayer's update is
#    about 0.1 of the residual stream (measured values in docs/golden.md).
ATTN_OUT_GAIN = 0.12
DENSE_DOWN_GAIN = 0.2
MOE_DOWN_GAIN = 0.1
#
# 2. Token-keyed routing on reserved coordinates. ROUTING_CLUSTERS residual
#    coordinates are reserved. Each token id belongs to one routing cluster
#    and its embedding row holds a positive spike of ROUTING_SPIKE_ENERGY of
#    the row's energy on its cluster's coordinate and zero on the other
#    reserved coordinates (a massive-activation channel, as trained models
#    have). The residual-writing rows (o_proj, down_proj) at those coordinates
#    are scaled by RESERVED_ROW_GAIN, so later layers barely write there.
#    Every router reads the reserved coordinates with designed logits per
#    cluster, plus a small random read of the rest of the stream
#    (ROUTER_JITTER_STD logits). Given the correction bias (DESIGNED_BIAS_STD),
#    the per-cluster logits are drawn by rejection so that every routing
#    decision (k-th vs (k+1)-th biased score, group score at the topk_group
#    boundary) is at least ROUTER_DESIGN_GAP apart over ROUTER_RMS_RANGE of
#    residual RMS, in the bias-corrected, the uncorrected and (grouped
#    models) the ungrouped selection; so the correction bias and the group
#    limit change the selection for a designed half of the clusters, never
#    by a near-tie.
ROUTING_CLUSTERS = 16
ROUTING_SPIKE_ENERGY = 0.25
RESERVED_ROW_GAIN = 0.02
ROUTER_LOGIT_STD = 2.0
ROUTER_JITTER_STD = 0.02
ROUTER_DESIGN_GAP = 0.1
ROUTER_RMS_RANGE = (0.85, 1.15)
ROUTER_MAX_DRAWS = 200000
# check_routing's stand-in for what the layers add to the residual stream by
# the last MoE layer (each sublayer adds ~0.1 of it, see ATTN_OUT_GAIN).
STANDIN_CONTEXT = 0.3
# lm_head and MTP shared_head.head: logits of standard deviation ~LM_HEAD_GAIN.
LM_HEAD_GAIN = 2.0
# Standard deviation of the designed routers' e_score_correction_bias.
DESIGNED_BIAS_STD = 0.15
# The MTP layer's router sees eh_proj's mix, not the reserved coordinates, so
# it stays a plain random router (no golden covers it). Its router logits are
# ~N(0,1), so sigmoid scores spread by ~0.2; a bias of this size reorders the
# top-k for a large fraction of tokens (measured and printed by
# check_routing).
CORRECTION_BIAS_STD = 0.08


# ---------------------------------------------------------------- encoders


def _fp8_e4m3fn_positive_table() -> np.ndarray:
    """Values of codes 0x00..0x7E (all non-negative finite E4M3FN values)."""
    vals = np.empty(127, dtype=np.float64)
    for code in range(127):
        exp, man = code >> 3, code & 7
        if exp == 0:
            vals[code] = (man / 8.0) * 2.0 ** -6
        else:
            vals[code] = (1.0 + man / 8.0) * 2.0 ** (exp - 7)
    return vals


_FP8_POS = _fp8_e4m3fn_positive_table()


def fp8_e4m3fn_encode(x: np.ndarray) -> np.ndarray:
    """Encode float32 values to E4M3FN bytes, round to nearest, ties to even.

    Inputs must already lie in [-448, 448] (callers clamp); NaN is rejected.
    Works on exact float64 copies, where every E4M3 value and every midpoint
    between neighbours is representable, so the tie test is exact.
    """
    xf = np.asarray(x, dtype=np.float32).astype(np.float64)
    if np.isnan(xf).any():
        raise ValueError("fp8 encode: NaN input")
    mag = np.abs(xf)
    if (mag > FP8_MAX).any():
        raise ValueError(f"fp8 encode: |x| up to {mag.max()} exceeds {FP8_MAX}; clamp first")
    hi = np.searchsorted(_FP8_POS, mag, side="left")  # first value >= mag
    hi = np.minimum(hi, 126)
    lo = np.maximum(hi - 1, 0)
    d_lo = mag - _FP8_POS[lo]
    d_hi = _FP8_POS[hi] - mag
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0))
    code = np.where(pick_hi, hi, lo).astype(np.uint8)
    code = np.where(mag == 0, 0, code).astype(np.uint8)
    sign = np.signbit(xf)  # -0.0 and tiny negatives give 0x80, as torch does
    return (code | (sign.astype(np.uint8) << 7)).astype(np.uint8)


def fp8_e4m3fn_decode(code: np.ndarray) -> np.ndarray:
    """Decode E4M3FN bytes to float32 (NaN codes 0x7F/0xFF map to NaN)."""
    code = np.asarray(code, dtype=np.uint8)
    mag = code & 0x7F
    table = np.append(_FP8_POS, np.nan)
    out = table[mag]
    out = np.where(code & 0x80, -out, out)
    return out.astype(np.float32)


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), round to nearest even."""
    f = np.ascontiguousarray(x, dtype=np.float32)
    if not np.isfinite(f).all():
        raise ValueError("bf16 encode: non-finite input")
    bits = f.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def bf16_round(x: np.ndarray) -> np.ndarray:
    """Round float32 values to the nearest bfloat16, returned as float32."""
    return (bf16_bits(x).astype(np.uint32) << 16).view(np.float32)


# ---------------------------------------------------------------- tensors


class TensorSet:
    """Ordered tensors with their safetensors dtype, built from numpy."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        # float32 view of every tensor as an engine would see it after
        # dequantization (used by the routing check).
        self.values: dict[str, np.ndarray] = {}

    def _add(self, name: str, t: torch.Tensor, value: np.ndarray) -> None:
        if name in self.tensors:
            raise ValueError(f"duplicate tensor name {name}")
        self.tensors[name] = t
        self.values[name] = value

    def bf16(self, name: str, x: np.ndarray) -> None:
        bits = bf16_bits(x)
        t = torch.from_numpy(bits.view(np.int16).copy()).view(torch.bfloat16)
        self._add(name, t, (bits.astype(np.uint32) << 16).view(np.float32))

    def f32(self, name: str, x: np.ndarray) -> None:
        x = np.ascontiguousarray(x, dtype=np.float32)
        self._add(name, torch.from_numpy(x.copy()), x)

    def fp8_linear(self, prefix: str, w: np.ndarray, scale_dtype: str) -> None:
        """Quantize w [out, in] per output row: scale = amax/448, q = RNE(w/scale)."""
        w = np.asarray(w, dtype=np.float32)
        amax = np.abs(w).max(axis=1, keepdims=True)
        if (amax == 0).any():
            raise ValueError(f"{prefix}: all-zero row, scale would be 0")
        scale = (amax / np.float32(FP8_MAX)).astype(np.float32)
        if scale_dtype == "BF16":
            scale = bf16_round(scale)
        elif scale_dtype != "F32":
            raise ValueError(f"{prefix}: scale dtype {scale_dtype} not F32/BF16")
        q = fp8_e4m3fn_encode(np.clip(w / scale, -FP8_MAX, FP8_MAX))
        # Cross-check the numpy encoder against torch's own RNE cast.
        ref = torch.from_numpy(np.clip(w / scale, -FP8_MAX, FP8_MAX)).to(torch.float8_e4m3fn)
        if not np.array_equal(ref.view(torch.uint8).numpy(), q):
            raise RuntimeError(f"{prefix}: numpy FP8 encoder disagrees with torch")
        deq = fp8_e4m3fn_decode(q) * scale
        self._add(prefix + ".weight", torch.from_numpy(q.copy()).view(torch.float8_e4m3fn), deq)
        if scale_dtype == "BF16":
            self.bf16(prefix + ".weight_scale", scale)
        else:
            self.f32(prefix + ".weight_scale", scale)


def normal(rng: np.random.Generator, shape, std: float) -> np.ndarray:
    return (rng.standard_normal(shape) * std).astype(np.float32)


def norm_weight(rng: np.random.Generator, n: int) -> np.ndarray:
    # Around 1 but not 1, so a missing or misplaced norm weight shows.
    return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)


def nonzero_bias(rng: np.random.Generator, n: int, std: float) -> np.ndarray:
    b = normal(rng, n, std)
    tiny = np.abs(b) < 0.01 * std
    b[tiny] = np.copysign(0.01 * std, b[tiny])
    return b


@dataclass(frozen=True)
class RoutingPlan:
    """Reserved residual coordinates and the routing cluster of every token id."""

    coords: np.ndarray       # [ROUTING_CLUSTERS] distinct coordinates in [0, HIDDEN)
    cluster_of: np.ndarray   # [VOCAB] cluster of each token id
    spike: float             # embedding value on the token's cluster coordinate

    def protect_rows(self, w: np.ndarray) -> np.ndarray:
        """Scale a residual-writing weight's rows at the reserved coordinates."""
        w = w.copy()
        w[self.coords] *= np.float32(RESERVED_ROW_GAIN)
        return w


def draw_routing_plan(rng: np.random.Generator) -> RoutingPlan:
    coords = np.sort(rng.choice(HIDDEN, ROUTING_CLUSTERS, replace=False))
    cluster_of = rng.integers(0, ROUTING_CLUSTERS, VOCAB)
    return RoutingPlan(coords, cluster_of, float(np.sqrt(ROUTING_SPIKE_ENERGY * HIDDEN)))


def embedding(rng: np.random.Generator, plan: RoutingPlan) -> np.ndarray:
    """Rows of RMS 1: Gaussian off the reserved coordinates plus the cluster spike."""
    free = HIDDEN - ROUTING_CLUSTERS
    std = np.sqrt((1.0 - ROUTING_SPIKE_ENERGY) * HIDDEN / free)
    e = normal(rng, (VOCAB, HIDDEN), std)
    e[:, plan.coords] = 0.0
    e[np.arange(VOCAB), plan.coords[plan.cluster_of]] = plan.spike
    return e


def select(choice: np.ndarray, spec: TinySpec, grouped: bool) -> tuple[np.ndarray, np.ndarray]:
    """Group-limited top-k as transformers does it, over the last axis.

    Returns the selected sets as sorted indices [..., k] and the smallest
    decision gap per row: k-th vs (k+1)-th remaining score, and with groups
    also the group score at the topk_group boundary.
    """
    k = spec.num_experts_per_tok
    gap = np.full(choice.shape[:-1], np.inf)
    if grouped and spec.n_group > 1:
        g = choice.reshape(*choice.shape[:-1], spec.n_group, -1)
        group_score = np.sort(g, axis=-1)[..., -2:].sum(-1)
        order = np.argsort(-group_score, axis=-1, kind="stable")
        srt = np.take_along_axis(group_score, order, -1)
        gap = srt[..., spec.topk_group - 1] - srt[..., spec.topk_group]
        mask = np.zeros(group_score.shape, dtype=bool)
        np.put_along_axis(mask, order[..., : spec.topk_group], True, axis=-1)
        choice = np.where(np.repeat(mask, g.shape[-1], axis=-1), choice, -np.inf)
    order = np.argsort(-choice, axis=-1, kind="stable")
    srt = np.take_along_axis(choice, order, -1)
    nxt = srt[..., k]
    expert_gap = np.where(np.isfinite(nxt), srt[..., k - 1] - nxt, np.inf)
    return np.sort(order[..., :k], axis=-1), np.minimum(gap, expert_gap)


def route(scores: np.ndarray, bias: np.ndarray | None, spec: TinySpec,
          grouped: bool) -> np.ndarray:
    """Selected expert sets (sorted indices) per token, as transformers does it."""
    return select(scores + (bias if bias is not None else 0.0), spec, grouped)[0]


def design_cluster_logits(rng: np.random.Generator, spec: TinySpec, bias: np.ndarray,
                          layer: int) -> np.ndarray:
    """Router logits [ROUTING_CLUSTERS, E] for a token of each cluster at residual RMS 1.

    Candidates are drawn N(0, ROUTER_LOGIT_STD) per expert and kept only when,
    for every RMS factor in ROUTER_RMS_RANGE (the logits scale with 1/RMS),
    the bias-corrected, uncorrected and (with groups) ungrouped selections
    do not change and each of their decisions is at least ROUTER_DESIGN_GAP
    apart, the k-th selected biased score is at least ROUTER_DESIGN_GAP (so
    masking dropped groups with 0.0 instead of -inf selects the same), and
    the correction bias changes the selection exactly for the clusters with
    c + layer even, the group limit exactly for those with (c + layer) // 2
    even.
    """
    e = spec.n_routed_experts
    kappas = np.linspace(ROUTER_RMS_RANGE[0], ROUTER_RMS_RANGE[1], 7)
    grouped = spec.n_group > 1
    out = np.empty((ROUTING_CLUSTERS, e), dtype=np.float64)
    batch = 4096
    for c in range(ROUTING_CLUSTERS):
        # Half the clusters each; shifted by layer so that layers differ.
        want_bias_change = (c + layer) % 2 == 0
        want_group_change = ((c + layer) // 2) % 2 == 0
        found = None
        for _ in range(ROUTER_MAX_DRAWS // batch):
            z = rng.standard_normal((batch, e)) * ROUTER_LOGIT_STD
            ok = np.ones(batch, dtype=bool)
            ref = {}
            for kappa in kappas:
                scores = 1.0 / (1.0 + np.exp(-kappa * z))
                biased = scores + bias
                sel = {"full": select(biased, spec, grouped), "plain": select(scores, spec, grouped)}
                if grouped:
                    sel["flat"] = select(biased, spec, False)
                for name, (s, gap) in sel.items():
                    ok &= gap >= ROUTER_DESIGN_GAP
                    if name in ref:
                        ok &= (s == ref[name]).all(-1)
                    else:
                        ref[name] = s
                full_sel = sel["full"][0]
                ok &= np.take_along_axis(biased, full_sel, -1).min(-1) >= ROUTER_DESIGN_GAP
            ok &= (ref["full"] != ref["plain"]).any(-1) == want_bias_change
            if grouped:
                ok &= (ref["full"] != ref["flat"]).any(-1) == want_group_change
            hits = np.flatnonzero(ok)
            if hits.size:
                found = z[hits[0]]
                break
        if found is None:
            raise RuntimeError(f"{spec.name} layer {layer} cluster {c}: no router design in "
                               f"{ROUTER_MAX_DRAWS} draws (bias {bias.round(3).tolist()})")
        out[c] = found
    return out


def add_decoder_layer(ts: TensorSet, rng: np.random.Generator, spec: TinySpec,
                      layer: int, moe: bool, plan: RoutingPlan, designed_router: bool) -> None:
    p = f"model.layers.{layer}."
    sd = spec.scale_dtype
    ts.bf16(p + "input_layernorm.weight", norm_weight(rng, HIDDEN))
    q_out, kv_out = NUM_HEADS * HEAD_DIM, NUM_KV_HEADS * HEAD_DIM
    for proj, out in (("q_proj", q_out), ("k_proj", kv_out), ("v_proj", kv_out)):
        ts.fp8_linear(p + f"self_attn.{proj}", normal(rng, (out, HIDDEN), HIDDEN ** -0.5), sd)
        ts.bf16(p + f"self_attn.{proj}.bias", nonzero_bias(rng, out, 0.5))
    ts.fp8_linear(p + "self_attn.o_proj",
                  plan.protect_rows(normal(rng, (HIDDEN, q_out), ATTN_OUT_GAIN * q_out ** -0.5)), sd)
    ts.bf16(p + "self_attn.q_norm.weight", norm_weight(rng, HEAD_DIM))
    ts.bf16(p + "self_attn.k_norm.weight", norm_weight(rng, HEAD_DIM))
    post_norm = norm_weight(rng, HIDDEN)
    ts.bf16(p + "post_attention_layernorm.weight", post_norm)

    def mlp(prefix: str, inter: int, down_gain: float) -> None:
        ts.fp8_linear(prefix + "gate_proj", normal(rng, (inter, HIDDEN), HIDDEN ** -0.5), sd)
        ts.fp8_linear(prefix + "up_proj", normal(rng, (inter, HIDDEN), HIDDEN ** -0.5), sd)
        ts.fp8_linear(prefix + "down_proj",
                      plan.protect_rows(normal(rng, (HIDDEN, inter), down_gain * inter ** -0.5)), sd)

    if not moe:
        mlp(p + "mlp.", INTERMEDIATE, DENSE_DOWN_GAIN)
        return
    if designed_router:
        bias = nonzero_bias(rng, spec.n_routed_experts, DESIGNED_BIAS_STD)
        # The float32 value the engines see (F32 tensor: exact).
        z = design_cluster_logits(rng, spec, bias.astype(np.float64), layer)
        gate = normal(rng, (spec.n_routed_experts, HIDDEN), ROUTER_JITTER_STD * HIDDEN ** -0.5)
        # A token of cluster c has post-norm value spike * post_norm[coord]
        # on its coordinate (residual RMS 1) and 0 on the others.
        read = plan.spike * post_norm[plan.coords].astype(np.float64)
        gate[:, plan.coords] = (z / read[:, None]).T.astype(np.float32)
    else:
        gate = normal(rng, (spec.n_routed_experts, HIDDEN), HIDDEN ** -0.5)
        bias = nonzero_bias(rng, spec.n_routed_experts, CORRECTION_BIAS_STD)
    ts.bf16(p + "mlp.gate.weight", gate)
    ts.f32(p + "mlp.gate.e_score_correction_bias", bias)
    for e in range(spec.n_routed_experts):
        mlp(p + f"mlp.experts.{e}.", MOE_INTERMEDIATE, MOE_DOWN_GAIN)
    mlp(p + "mlp.shared_experts.", MOE_INTERMEDIATE * N_SHARED_EXPERTS, MOE_DOWN_GAIN)


def build_tensors(spec: TinySpec, seed: int) -> tuple[TensorSet, list[str], RoutingPlan]:
    """All tensors of one model; returns the set, the MTP tensor names and the routing plan."""
    # One independent stream per model so the two never share weights.
    rng = np.random.Generator(np.random.PCG64([seed, TINY_MODELS.index(spec)]))
    plan = draw_routing_plan(rng)
    ts = TensorSet()
    ts.bf16("model.embed_tokens.weight", embedding(rng, plan))
    for layer in range(spec.num_hidden_layers):
        add_decoder_layer(ts, rng, spec, layer, moe=layer >= spec.first_k_dense_replace,
                          plan=plan, designed_router=True)
    ts.bf16("model.norm.weight", norm_weight(rng, HIDDEN))
    ts.bf16("lm_head.weight", normal(rng, (VOCAB, HIDDEN), LM_HEAD_GAIN * HIDDEN ** -0.5))

    before = set(ts.tensors)
    mtp = spec.num_hidden_layers
    p = f"model.layers.{mtp}."
    ts.bf16(p + "embed_tokens.weight", embedding(rng, plan))
    ts.bf16(p + "enorm.weight", norm_weight(rng, HIDDEN))
    ts.bf16(p + "hnorm.weight", norm_weight(rng, HIDDEN))
    ts.bf16(p + "eh_proj.weight", normal(rng, (HIDDEN, 2 * HIDDEN), (2 * HIDDEN) ** -0.5))
    add_decoder_layer(ts, rng, spec, mtp, moe=True, plan=plan, designed_router=False)
    ts.bf16(p + "shared_head.norm.weight", norm_weight(rng, HIDDEN))
    ts.fp8_linear(p + "shared_head.head", normal(rng, (VOCAB, HIDDEN), LM_HEAD_GAIN * HIDDEN ** -0.5),
                  spec.scale_dtype)
    mtp_names = [n for n in ts.tensors if n not in before]
    return ts, mtp_names, plan


# ---------------------------------------------------------------- routing check


def check_routing(spec: TinySpec, ts: TensorSet, plan: RoutingPlan, seed: int) -> None:
    """Print, and enforce, how the routers behave on stand-in router inputs.

    Main-model layers: every token id's embedding plus a Gaussian "context"
    of STANDIN_CONTEXT of the row's RMS on the free coordinates, residual RMS scaled
    over ROUTER_RMS_RANGE, post-attention-norm applied. The correction bias
    must change the expert set for >= 20% of them (and the group limit for
    >= 20% in grouped models), and no decision may come within half of
    ROUTER_DESIGN_GAP of a tie. MTP layer (plain random router): RMS-
    normalised Gaussians; only the bias fraction is enforced.
    """
    rng = np.random.Generator(np.random.PCG64([seed, 99]))
    free = np.setdiff1d(np.arange(HIDDEN), plan.coords)
    emb = ts.values["model.embed_tokens.weight"]
    for layer in range(spec.first_k_dense_replace, spec.num_hidden_layers + 1):
        p = f"model.layers.{layer}."
        mtp = layer == spec.num_hidden_layers
        if mtp:
            x = rng.standard_normal((4096, HIDDEN)).astype(np.float32)
        else:
            x = np.tile(emb, (4, 1)).astype(np.float64)
            x[:, free] += STANDIN_CONTEXT * rng.standard_normal((len(x), free.size))
        x = x / np.sqrt((x * x).mean(-1, keepdims=True) + RMS_EPS)
        if not mtp:
            x = x * rng.uniform(*ROUTER_RMS_RANGE, (len(x), 1))
        x = x * ts.values[p + "post_attention_layernorm.weight"]
        scores = 1.0 / (1.0 + np.exp(-(x @ ts.values[p + "mlp.gate.weight"].T.astype(np.float64))))
        bias = ts.values[p + "mlp.gate.e_score_correction_bias"].astype(np.float64)
        full, gap = select(scores + bias, spec, grouped=True)
        no_bias = route(scores, None, spec, grouped=True)
        frac_bias = float((full != no_bias).any(-1).mean())
        kind = "MTP, random router" if mtp else "designed router"
        msg = (f"  {spec.name} layer {layer} ({kind}): correction bias changes the expert set "
               f"for {frac_bias:.1%} of stand-in tokens")
        if spec.n_group > 1:
            ungrouped = route(scores, bias, spec, grouped=False)
            frac_group = float((full != ungrouped).any(-1).mean())
            msg += f"; group limit changes it for {frac_group:.1%}"
            if frac_group < (0.05 if mtp else 0.2):
                raise RuntimeError(f"{spec.name} layer {layer}: group limit changes only "
                                   f"{frac_group:.1%} of selections")
        if not mtp:
            msg += f"; smallest decision gap {gap.min():.3f}"
            if gap.min() < ROUTER_DESIGN_GAP / 2:
                raise RuntimeError(f"{spec.name} layer {layer}: a routing decision gap of "
                                   f"{gap.min():.4f} < {ROUTER_DESIGN_GAP / 2}")
        print(msg)
        if frac_bias < 0.2:
            raise RuntimeError(f"{spec.name} layer {layer}: correction bias changes only "
                               f"{frac_bias:.1%} of selections (want >= 20%)")


# ---------------------------------------------------------------- files


def special_token_ids(tokenizer_dir: Path) -> dict[str, int]:
    """Special token ids, from tokenizer.json when present."""
    path = tokenizer_dir / "tokenizer.json"
    if path.is_file():
        with path.open() as f:
            added = json.load(f).get("added_tokens", [])
        ids = {t["content"]: int(t["id"]) for t in added}
        missing = [t for t in ("<|endoftext|>", "<|user|>", "<|observation|>") if t not in ids]
        if missing:
            raise ValueError(f"{path}: added_tokens lacks {missing}")
        return ids
    return {tok: FIRST_SPECIAL_ID + i for i, tok in enumerate(GLM_SPECIAL_TOKENS)}


def make_config(spec: TinySpec, specials: dict[str, int]) -> dict:
    eos = [specials["<|endoftext|>"], specials["<|user|>"], specials["<|observation|>"]]
    moe_layers = range(spec.first_k_dense_replace, spec.num_hidden_layers + 1)
    ignore = ["lm_head"] + [f"model.layers.{L}.mlp.gate" for L in moe_layers]
    ignore.append(f"model.layers.{spec.num_hidden_layers}.eh_proj")
    # Key order mirrors zai-org/GLM-4.7-FP8/config.json (docs/model.md §1.1).
    return {
        "architectures": ["Glm4MoeForCausalLM"],
        "attention_bias": True,
        "attention_dropout": 0.0,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "max_position_embeddings": MAX_POS,
        "model_type": "glm4_moe",
        "moe_intermediate_size": MOE_INTERMEDIATE,
        "norm_topk_prob": True,
        "scoring_func": "sigmoid",
        "num_attention_heads": NUM_HEADS,
        "n_group": spec.n_group,
        "topk_group": spec.topk_group,
        "n_routed_experts": spec.n_routed_experts,
        "n_shared_experts": N_SHARED_EXPERTS,
        "routed_scaling_factor": ROUTED_SCALING,
        "topk_method": "noaux_tc",
        "moe_router_dtype": "float32",
        "num_experts_per_tok": spec.num_experts_per_tok,
        "first_k_dense_replace": spec.first_k_dense_replace,
        "use_qk_norm": True,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_key_value_heads": NUM_KV_HEADS,
        "num_nextn_predict_layers": 1,
        "partial_rotary_factor": 0.5,
        "rms_norm_eps": RMS_EPS,
        "rope_scaling": None,
        "rope_theta": ROPE_THETA,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": VOCAB,
        "transformers_version": "4.52.3",
        "eos_token_id": eos,
        "pad_token_id": specials["<|endoftext|>"],
        "quantization_config": {
            "config_groups": {
                "group_0": {
                    "input_activations": {
                        "actorder": None, "block_structure": None, "dynamic": True,
                        "group_size": None, "num_bits": 8, "observer": None,
                        "observer_kwargs": {}, "strategy": "token", "symmetric": True,
                        "type": "float",
                    },
                    "output_activations": None,
                    "targets": ["Linear"],
                    "weights": {
                        "actorder": None, "block_structure": None, "dynamic": False,
                        "group_size": None, "num_bits": 8, "observer": "minmax",
                        "observer_kwargs": {}, "strategy": "channel", "symmetric": True,
                        "type": "float",
                    },
                },
            },
            "format": "float-quantized",
            "global_compression_ratio": None,
            "ignore": ignore,
            "kv_cache_scheme": None,
            "quant_method": "compressed-tensors",
            "quantization_status": "compressed",
        },
    }


def make_generation_config(config: dict) -> dict:
    return {
        "_from_model_config": True,
        "eos_token_id": config["eos_token_id"],
        "pad_token_id": config["pad_token_id"],
        "temperature": 1.0,
        "transformers_version": "4.56.2",
    }


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def assign_shards(ts: TensorSet, mtp_names: list[str], num_shards: int) -> list[list[str]]:
    """Split by size in file order, like save_pretrained; all MTP tensors go last.

    Main-model tensors fill shards up to total/num_shards bytes each, so a
    layer may straddle two shards (engines must go through weight_map).
    """
    mtp = set(mtp_names)
    main = [n for n in ts.tensors if n not in mtp]
    total = sum(nbytes(t) for t in ts.tensors.values())
    target = total / num_shards
    shards: list[list[str]] = [[] for _ in range(num_shards)]
    k, filled = 0, 0
    for name in main:
        size = nbytes(ts.tensors[name])
        if k < num_shards - 1 and filled > 0 and filled + size > target:
            k, filled = k + 1, 0
        shards[k].append(name)
        filled += size
    shards[-1].extend(mtp_names)
    for i, names in enumerate(shards):
        if not names:
            raise RuntimeError(f"shard {i + 1} of {num_shards} would be empty")
    return shards


# Files this script writes itself; a same-named file in the tokenizer
# directory is checked for consistency instead of copied over ours.
OWN_FILES = {"config.json", "generation_config.json", "model.safetensors.index.json"}


def copy_tokenizer(tokenizer_dir: Path, out: Path, config: dict) -> None:
    for f in sorted(tokenizer_dir.iterdir()):
        if not f.is_file() or f.suffix == ".safetensors":
            continue
        if f.name not in OWN_FILES:
            shutil.copyfile(f, out / f.name)
            continue
        if f.name == "generation_config.json":
            theirs = json.loads(f.read_text())
            for key in ("eos_token_id", "pad_token_id"):
                if key in theirs and theirs[key] != config[key]:
                    raise ValueError(f"{f}: {key} {theirs[key]} differs from config.json's {config[key]}")


def write_model(spec: TinySpec, out_root: Path, seed: int, tokenizer_dir: Path) -> int:
    out = out_root / spec.name
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("model-*.safetensors"):
        old.unlink()
    specials = special_token_ids(tokenizer_dir)
    ts, mtp_names, plan = build_tensors(spec, seed)
    check_routing(spec, ts, plan, seed)

    config = make_config(spec, specials)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "generation_config.json").write_text(
        json.dumps(make_generation_config(config), indent=2) + "\n")

    shards = assign_shards(ts, mtp_names, spec.num_shards)
    weight_map: dict[str, str] = {}
    for i, names in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{spec.num_shards:05d}.safetensors"
        save_file({n: ts.tensors[n] for n in names}, str(out / fname), metadata={"format": "pt"})
        (out / fname).chmod(0o644)  # safetensors creates 0600 files
        for n in names:
            weight_map[n] = fname
    index = {
        "metadata": {"total_size": sum(nbytes(t) for t in ts.tensors.values())},
        "weight_map": dict(sorted(weight_map.items())),
    }
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")

    if tokenizer_dir.is_dir():
        copy_tokenizer(tokenizer_dir, out, config)
    else:
        print(f"  WARNING: {tokenizer_dir} not found: {spec.name} has no tokenizer files; "
              "rerun once it exists", file=sys.stderr)

    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    print(f"  {spec.name}: {len(ts.tensors)} tensors ({len(mtp_names)} MTP), "
          f"{spec.num_shards} shards, {size / 1e6:.2f} MB on disk -> {out}")
    return size


def self_test() -> None:
    """Check the FP8/BF16 encoders on exhaustive and edge-case inputs."""
    codes = np.array([c for c in range(256) if c & 0x7F != 0x7F], dtype=np.uint8)
    vals = fp8_e4m3fn_decode(codes)
    back = fp8_e4m3fn_encode(vals)
    # Every finite code round-trips, including -0.0 (0x80).
    if not np.array_equal(back, codes):
        raise RuntimeError("fp8 encoder: decode/encode round trip failed")
    if fp8_e4m3fn_decode(np.array([0x7E, 0x38, 0x01], np.uint8)).tolist() != [448.0, 1.0, 2.0 ** -9]:
        raise RuntimeError("fp8 decoder: wrong values for 0x7E/0x38/0x01")
    # Ties go to the even code: 1.0625 sits between 1.0 (0x38) and 1.125 (0x39).
    if fp8_e4m3fn_encode(np.array([1.0625, 1.1875], np.float32)).tolist() != [0x38, 0x3A]:
        raise RuntimeError("fp8 encoder: ties not rounded to even")
    x = np.random.Generator(np.random.PCG64(7)).standard_normal(200000).astype(np.float32) * 100
    x = np.clip(x, -FP8_MAX, FP8_MAX)
    ref = torch.from_numpy(x).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    if not np.array_equal(ref, fp8_e4m3fn_encode(x)):
        raise RuntimeError("fp8 encoder disagrees with torch.float8_e4m3fn")
    refb = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    if not np.array_equal(refb, bf16_bits(x)):
        raise RuntimeError("bf16 encoder disagrees with torch.bfloat16")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="output root, e.g. testdata/models")
    ap.add_argument("--seed", type=int, default=47, help="random seed (default 47)")
    ap.add_argument("--tokenizer-dir", type=Path, default=TOKENIZER_DIR,
                    help=f"tokenizer files to copy (default {TOKENIZER_DIR})")
    args = ap.parse_args()
    if args.seed < 0:
        ap.error(f"--seed must be >= 0, got {args.seed}")
    self_test()
    total = 0
    for spec in TINY_MODELS:
        total += write_model(spec, args.out, args.seed, args.tokenizer_dir)
    print(f"total {total / 1e6:.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
