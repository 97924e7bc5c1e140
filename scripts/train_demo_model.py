#!/usr/bin/env python3
"""Train the bundled demo model (testdata/models/demo-go): GLM-4.7's architecture, small.

The model is Glm4MoeForCausalLM exactly (docs/model.md §3, glm47-spec §3), at a
few million parameters, plus the MTP ("nextn") layer of glm47-spec §6, trained
from scratch on the Go standard library (scripts/demo_corpus.py):

* attention with q/k/v biases, q/k RMSNorm per head before RoPE, partial
  NeoX RoPE on the first head_dim * 0.5 dims, GQA, no o_proj bias;
* first_k_dense_replace dense SwiGLU layers, then MoE layers: a sigmoid
  router (float32 logits), selection on sigmoid + e_score_correction_bias
  (group-limited top-k), weights from the unbiased sigmoid scores,
  normalised (norm_topk_prob) and scaled by routed_scaling_factor, one
  shared expert; untied embedding and lm_head;
* e_score_correction_bias trained aux-loss-free as in DeepSeek-V3: after every
  optimizer step, each MoE layer's bias moves by gamma towards balance (up
  for experts that got fewer than the mean number of tokens in that step,
  down for those that got more); it is used only for selection. gamma is
  --bias-update times the lr schedule's cosine factor (no warmup): DeepSeek-V3's 0.001 is for its lr of
  2.2e-4 and trillions of tokens; at this lr and a few thousand steps the
  routers (the MTP layer's first) collapse onto few experts before 0.001 per
  step can catch up (measured: docs/demo-model.md);
* the MTP layer, with its own loss (weight --mtp-weight): for position i,
  e = enorm(embed(t[i+1])), g = hnorm(h[i]) with h the main model's
  final-normed hidden state, u = eh_proj([e; g]), a full MoE decoder layer
  at position i, shared_head.norm, then the main lm_head, predicting t[i+2].
  Its gradients flow into the main model, as in DeepSeek-V3.

The module and parameter names of the main model are transformers'
(model.embed_tokens, model.layers.N.self_attn.q_proj, ...,
model.layers.N.mlp.experts.gate_up_proj [E, 2I, H] and down_proj [E, H, I],
lm_head), so its state dict loads into Glm4MoeForCausalLM as is; --check-hf
does that and compares the logits. The MTP layer's parameters are under
"mtp." (scripts/export_demo_model.py writes them as model.layers.{L}.*).

Training: AdamW, bf16 autocast on CUDA (float32 on CPU), linear warmup, cosine
decay to --min-lr-ratio of the peak over --steps, or over the --time-budget
(seconds of training-loop wall time) when --steps is 0; the loop stops at the
budget. Routed experts run through torch's grouped GEMM when it is available
and agrees with a per-expert loop on a self-check, else through the loop.
Seeded (torch and numpy, batches drawn from a seeded numpy generator).

Outputs in --out (also written every --save-every seconds, so a run cut short
still leaves weights):
    demo-go-state.safetensors  the weights (BF16; routers and correction
                               biases F32), names as above
    model_config.json          the architecture (transformers key names)
    train_log.json             arguments, parameter counts, the loss curve,
                               final held-out losses, throughput, samples
    samples.txt                greedy continuations of the sample prompts

Usage (GPU; see scripts/train-demo-gpu.sh):
    python3 scripts/train_demo_model.py --out $OUT --time-budget 480
Smoke test (CPU, a handful of steps on a small slice):
    python3 scripts/train_demo_model.py --device cpu --out /tmp/demo-smoke
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

try:
    from safetensors.torch import save_file
except ImportError as exc:  # pragma: no cover - environment problem
    sys.exit(f"train_demo_model: needs safetensors ({exc})")

REPO = Path(__file__).resolve().parent.parent

# The demo model's architecture (transformers' Glm4MoeConfig key names).
# Sized so that the FP8 checkpoint, with the MTP layer's own copies of the
# embedding (BF16) and head (FP8), stays under 20 MB (docs/demo-model.md).
ARCH = {
    "vocab_size": 4096,
    "hidden_size": 256,
    "intermediate_size": 768,
    "moe_intermediate_size": 256,
    "num_hidden_layers": 5,
    "first_k_dense_replace": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_group": 1,
    "topk_group": 1,
    "n_shared_experts": 1,
    "routed_scaling_factor": 2.5,
    "norm_topk_prob": True,
    "partial_rotary_factor": 0.5,
    "rope_theta": 1000000,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 4096,
    "attention_bias": True,
    "use_qk_norm": True,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "num_nextn_predict_layers": 1,
}

STATE_FILE = "demo-go-state.safetensors"
CONFIG_FILE = "model_config.json"
LOG_FILE = "train_log.json"
SAMPLES_FILE = "samples.txt"


# ---------------------------------------------------------------- model


# Per-token FP8 activation quantization (glm47-spec §4.3), for evaluating the
# GPU inference path: set QUANT_ACT["on"] = True and use the loop experts.
QUANT_ACT = {"on": False}
FP8_MAX = 448.0


def qact(x: torch.Tensor) -> torch.Tensor:
    """Quantize-dequantize x per row (token) to FP8 E4M3 when QUANT_ACT is on, else x."""
    if not QUANT_ACT["on"]:
        return x
    xf = x.float()
    s = (xf.abs().amax(-1, keepdim=True) / FP8_MAX).clamp_min(1.0 / (FP8_MAX * 512))
    q = (xf / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float()
    return (q * s).to(x.dtype)


class RMSNorm(nn.Module):
    """transformers' Glm4MoeRMSNorm: statistics in float32, weight times the normalised input."""

    def __init__(self, n: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype)


def rope_tables(cfg: dict, n: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [n, rotary_dim] for positions 0..n-1 (NeoX layout, float32)."""
    rot = int(cfg["head_dim"] * cfg["partial_rotary_factor"])
    inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, rot, 2, dtype=torch.float32, device=device) / rot))
    freqs = torch.arange(n, dtype=torch.float32, device=device)[:, None] * inv[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, heads, S, D]: rotate the first rotary_dim dims (rotate_half pairing), keep the rest."""
    rot = cos.shape[-1]
    xr, xp = x[..., :rot], x[..., rot:]
    half = rot // 2
    rotated = torch.cat([-xr[..., half:], xr[..., :half]], dim=-1)
    xr = xr * cos.to(x.dtype) + rotated * sin.to(x.dtype)
    return torch.cat([xr, xp], dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: dict) -> None:
        super().__init__()
        H, D = cfg["hidden_size"], cfg["head_dim"]
        self.nh, self.nkv, self.d = cfg["num_attention_heads"], cfg["num_key_value_heads"], D
        bias = cfg["attention_bias"]
        self.q_proj = nn.Linear(H, self.nh * D, bias=bias)
        self.k_proj = nn.Linear(H, self.nkv * D, bias=bias)
        self.v_proj = nn.Linear(H, self.nkv * D, bias=bias)
        self.o_proj = nn.Linear(self.nh * D, H, bias=False)
        self.q_norm = RMSNorm(D, cfg["rms_norm_eps"])
        self.k_norm = RMSNorm(D, cfg["rms_norm_eps"])

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cdtype: torch.dtype) -> torch.Tensor:
        B, S, _ = x.shape
        x = qact(x)
        q = self.q_norm(self.q_proj(x).view(B, S, self.nh, self.d)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, S, self.nkv, self.d)).transpose(1, 2)
        v = self.v_proj(x).view(B, S, self.nkv, self.d).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.nkv != self.nh:  # query head h reads KV head h // (nh / nkv), as repeat_kv
            rep = self.nh // self.nkv
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q.to(cdtype), k.to(cdtype), v.to(cdtype), is_causal=True)
        return self.o_proj(qact(o.transpose(1, 2).reshape(B, S, self.nh * self.d)))


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = qact(x)
        return self.down_proj(qact(F.silu(self.gate_proj(x)) * self.up_proj(x)))


class Router(nn.Module):
    """Glm4MoeTopkRouter: weight [E, H] (float32) and the e_score_correction_bias buffer."""

    def __init__(self, cfg: dict) -> None:
        super().__init__()
        E = cfg["n_routed_experts"]
        self.weight = nn.Parameter(torch.zeros(E, cfg["hidden_size"]))
        self.register_buffer("e_score_correction_bias", torch.zeros(E))


class Experts(nn.Module):
    """Glm4MoeExperts: gate_up_proj [E, 2I, H] (gate rows first), down_proj [E, H, I]."""

    def __init__(self, cfg: dict) -> None:
        super().__init__()
        E, H, I = cfg["n_routed_experts"], cfg["hidden_size"], cfg["moe_intermediate_size"]
        self.gate_up_proj = nn.Parameter(torch.empty(E, 2 * I, H))
        self.down_proj = nn.Parameter(torch.empty(E, H, I))


# How routed experts are computed: "grouped" (torch grouped GEMM) or "loop".
# Chosen once by select_expert_impl().
EXPERT_IMPL = {"name": "loop"}


def experts_loop(xs, counts, gate_up, down):
    """Per-expert matmuls over the expert-sorted rows xs (reference path)."""
    outs, start = [], 0
    for e, n in enumerate(counts.tolist()):
        if n:
            seg = qact(xs[start:start + n])
            g, u = F.linear(seg, gate_up[e]).chunk(2, dim=-1)
            outs.append(F.linear(qact(F.silu(g) * u), down[e]))
        start += n
    if not outs:
        return xs.new_zeros(0, down.shape[1])
    return torch.cat(outs, 0)


def experts_grouped(xs, counts, gate_up, down, cdtype):
    offs = torch.cumsum(counts, 0).to(torch.int32)
    gm = getattr(F, "grouped_mm", None) or torch._grouped_mm
    a = xs.to(cdtype)
    gu = gm(a, gate_up.to(cdtype).transpose(-2, -1), offs=offs)
    g, u = gu.chunk(2, dim=-1)
    return gm((F.silu(g) * u).contiguous(), down.to(cdtype).transpose(-2, -1), offs=offs)


class MoE(nn.Module):
    def __init__(self, cfg: dict) -> None:
        super().__init__()
        self.cfg = cfg
        self.gate = Router(cfg)
        self.experts = Experts(cfg)
        self.shared_experts = MLP(cfg["hidden_size"], cfg["moe_intermediate_size"] * cfg["n_shared_experts"])
        # Tokens per expert since the last bias update (training only).
        self.register_buffer("load", torch.zeros(cfg["n_routed_experts"]), persistent=False)
        # Tokens per expert since the last report.
        self.register_buffer("load_report", torch.zeros(cfg["n_routed_experts"]), persistent=False)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(top-k expert ids [T, k], weights [T, k] float32), as Glm4MoeTopkRouter."""
        c = self.cfg
        E, k, G = c["n_routed_experts"], c["num_experts_per_tok"], c["n_group"]
        with torch.autocast(device_type=x.device.type, enabled=False):
            logits = F.linear(x.float(), self.gate.weight.float())
        scores = logits.sigmoid()
        choice = scores.detach() + self.gate.e_score_correction_bias
        if G > 1:
            group = choice.view(-1, G, E // G).topk(2, dim=-1)[0].sum(-1)
            keep = torch.zeros_like(group).scatter_(1, group.topk(c["topk_group"], dim=-1)[1], 1.0)
            mask = keep.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E).bool()
            choice = choice.masked_fill(~mask, float("-inf"))
        idx = choice.topk(k, dim=-1, sorted=False)[1]
        w = scores.gather(1, idx)
        if c["norm_topk_prob"]:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        return idx, w * c["routed_scaling_factor"]

    def forward(self, x: torch.Tensor, cdtype: torch.dtype) -> torch.Tensor:
        shape = x.shape
        xt = x.reshape(-1, shape[-1])
        T, k = xt.shape[0], self.cfg["num_experts_per_tok"]
        idx, w = self.route(xt)
        flat = idx.reshape(-1)
        counts = torch.bincount(flat, minlength=self.cfg["n_routed_experts"])
        if self.training:
            with torch.no_grad():
                self.load += counts
                self.load_report += counts
        order = torch.argsort(flat, stable=True)
        xs = xt[order // k]
        if EXPERT_IMPL["name"] == "grouped":
            out = experts_grouped(xs, counts, self.experts.gate_up_proj, self.experts.down_proj, cdtype)
        else:
            out = experts_loop(xs, counts, self.experts.gate_up_proj, self.experts.down_proj)
        inv = torch.empty_like(order)
        inv[order] = torch.arange(order.numel(), device=order.device)
        routed = (out[inv].view(T, k, -1) * w.unsqueeze(-1).to(out.dtype)).sum(1)
        return routed.view(shape) + self.shared_experts(x)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: dict, moe: bool) -> None:
        super().__init__()
        H, eps = cfg["hidden_size"], cfg["rms_norm_eps"]
        self.input_layernorm = RMSNorm(H, eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(H, eps)
        self.is_moe = moe
        self.mlp = MoE(cfg) if moe else MLP(H, cfg["intermediate_size"])

    def forward(self, h, cos, sin, cdtype):
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, cdtype)
        m = self.post_attention_layernorm(h)
        return h + (self.mlp(m, cdtype) if self.is_moe else self.mlp(m))


class SharedHead(nn.Module):
    def __init__(self, cfg: dict) -> None:
        super().__init__()
        self.norm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])


class MTPLayer(DecoderLayer):
    """The nextn layer: enorm, hnorm, eh_proj, a MoE decoder layer, shared_head.norm."""

    def __init__(self, cfg: dict) -> None:
        super().__init__(cfg, moe=True)
        H, eps = cfg["hidden_size"], cfg["rms_norm_eps"]
        self.enorm = RMSNorm(H, eps)
        self.hnorm = RMSNorm(H, eps)
        self.eh_proj = nn.Linear(2 * H, H, bias=False)
        self.shared_head = SharedHead(cfg)

    def mtp_forward(self, emb_next, h_final, cos, sin, cdtype):
        u = self.eh_proj(torch.cat([self.enorm(emb_next), self.hnorm(h_final)], dim=-1))
        return self.shared_head.norm(super().forward(u, cos, sin, cdtype))


class Body(nn.Module):
    def __init__(self, cfg: dict) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, moe=i >= cfg["first_k_dense_replace"]) for i in range(cfg["num_hidden_layers"]))
        self.norm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])


class GLMDemo(nn.Module):
    """Glm4MoeForCausalLM (same parameter names) plus the MTP layer under `mtp.`."""

    def __init__(self, cfg: dict, cdtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.cfg = cfg
        self.cdtype = cdtype
        self.model = Body(cfg)
        self.lm_head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)
        self.mtp = MTPLayer(cfg)
        self._rope: dict = {}

    def rope(self, n: int, device):
        key = (n, str(device))
        if key not in self._rope:
            self._rope = {key: rope_tables(self.cfg, n, device)}
        return self._rope[key]

    def hidden(self, ids: torch.Tensor) -> torch.Tensor:
        """The final-normed hidden state [B, S, H] (what the MTP layer reads)."""
        cos, sin = self.rope(ids.shape[1], ids.device)
        h = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            h = layer(h, cos, sin, self.cdtype)
        return self.model.norm(h)

    def logits(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.hidden(ids))

    def mtp_logits(self, h_final: torch.Tensor, next_ids: torch.Tensor) -> torch.Tensor:
        """Draft logits for t[i+2] from h[i] and t[i+1] (positions 0..S-1)."""
        cos, sin = self.rope(next_ids.shape[1], next_ids.device)
        z = self.mtp.mtp_forward(self.model.embed_tokens(next_ids), h_final, cos, sin, self.cdtype)
        return self.lm_head(z)

    def forward(self, win: torch.Tensor):
        """win [B, S+2]: main loss on t[1..S], MTP loss on t[2..S+1]; returns (loss, mtp_loss, logits, mtp_logits)."""
        S = win.shape[1] - 2
        x, y, y2 = win[:, :S], win[:, 1:S + 1], win[:, 2:S + 2]
        h = self.hidden(x)
        logits = self.lm_head(h)
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.reshape(-1))
        mlog = self.mtp_logits(h, y)
        mtp_loss = F.cross_entropy(mlog.float().view(-1, mlog.shape[-1]), y2.reshape(-1))
        return loss, mtp_loss, logits, mlog

    def moe_layers(self) -> list[MoE]:
        return [m for m in self.modules() if isinstance(m, MoE)]


def init_weights(model: GLMDemo, std: float = 0.02) -> None:
    """Normal(0, std) everywhere (transformers' initializer_range), residual-writing
    projections scaled by 1/sqrt(2 * layers), zero biases, unit norms."""
    n_layers = model.cfg["num_hidden_layers"] + 1
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            nn.init.ones_(p)
        elif name.endswith(".bias"):
            nn.init.zeros_(p)
        elif name.endswith(("o_proj.weight", "down_proj.weight", "experts.down_proj")):
            nn.init.normal_(p, 0.0, std / math.sqrt(2 * n_layers))
        else:
            nn.init.normal_(p, 0.0, std)


def count_params(model: GLMDemo) -> dict:
    cfg = model.cfg
    total = sum(p.numel() for p in model.parameters())
    mtp = sum(p.numel() for p in model.mtp.parameters())
    E, k, I, H = cfg["n_routed_experts"], cfg["num_experts_per_tok"], cfg["moe_intermediate_size"], cfg["hidden_size"]
    per_expert = 3 * H * I
    n_moe = cfg["num_hidden_layers"] - cfg["first_k_dense_replace"]
    main = total - mtp
    active = main - n_moe * (E - k) * per_expert
    emb = 2 * cfg["vocab_size"] * H
    return {"total": total, "main": main, "mtp_layer": mtp, "main_active_per_token": active,
            "main_non_embedding": main - emb, "main_active_non_embedding": active - emb}


# ---------------------------------------------------------------- expert path


def select_expert_impl(device: torch.device, cdtype: torch.dtype, cfg: dict, force: str = "auto") -> str:
    """Use the grouped GEMM when it exists and matches the loop (values and gradients)."""
    if force in ("loop", "grouped"):
        EXPERT_IMPL["name"] = force
        return force
    if device.type != "cuda" or not (hasattr(F, "grouped_mm") or hasattr(torch, "_grouped_mm")):
        EXPERT_IMPL["name"] = "loop"
        return "loop (no grouped GEMM on this device)"
    g = torch.Generator(device="cpu").manual_seed(1)
    E, H, I = cfg["n_routed_experts"], cfg["hidden_size"], cfg["moe_intermediate_size"]
    counts = torch.tensor([37, 0, 64, 5, 129, 1, 16, 0] * (E // 8 + 1))[:E]
    xs0 = torch.randn(int(counts.sum()), H, generator=g)
    gu0 = torch.randn(E, 2 * I, H, generator=g) * H ** -0.5
    dn0 = torch.randn(E, H, I, generator=g) * I ** -0.5
    res = []
    try:
        for impl in ("loop", "grouped"):
            xs = xs0.to(device).requires_grad_(True)
            gu = gu0.to(device).requires_grad_(True)
            dn = dn0.to(device).requires_grad_(True)
            c = counts.to(device)
            with torch.autocast(device_type=device.type, dtype=cdtype, enabled=cdtype != torch.float32):
                out = (experts_loop(xs, c, gu, dn) if impl == "loop"
                       else experts_grouped(xs, c, gu, dn, cdtype))
            out.float().pow(2).sum().backward()
            res.append([out.float(), xs.grad.float(), gu.grad.float(), dn.grad.float()])
        worst = max(float((a - b).abs().max() / (a.abs().max() + 1e-6)) for a, b in zip(*res))
    except Exception as exc:  # no kernel for this GPU / dtype / shape
        EXPERT_IMPL["name"] = "loop"
        return f"loop (grouped GEMM failed: {type(exc).__name__}: {str(exc)[:200]})"
    if worst > 3e-2:
        EXPERT_IMPL["name"] = "loop"
        return f"loop (grouped GEMM differs from the loop by {worst:.3g})"
    EXPERT_IMPL["name"] = "grouped"
    return f"grouped (matches the loop within {worst:.2g})"


# ---------------------------------------------------------------- HF check


def hf_config_kwargs(cfg: dict, eos: list[int] | None = None, pad: int | None = None) -> dict:
    kw = dict(cfg)
    kw.update(model_type="glm4_moe", scoring_func="sigmoid", topk_method="noaux_tc", attention_dropout=0.0,
              rope_scaling=None)
    if eos is not None:
        kw["eos_token_id"] = eos
    if pad is not None:
        kw["pad_token_id"] = pad
    return kw


def hf_model_from_state(cfg: dict, state: dict[str, torch.Tensor], eos=None, pad=None):
    """transformers' Glm4MoeForCausalLM (float32, eager) loaded with the main-model tensors of state."""
    from transformers import Glm4MoeConfig, Glm4MoeForCausalLM
    kw = hf_config_kwargs(cfg, eos, pad)
    kw.pop("model_type")
    config = Glm4MoeConfig(**kw, attn_implementation="eager", experts_implementation="eager")
    hf = Glm4MoeForCausalLM(config).to(torch.float32).eval()
    main = {k: v.to(torch.float32) for k, v in state.items() if not k.startswith("mtp.")}
    res = hf.load_state_dict(main, strict=True)
    if res.missing_keys or res.unexpected_keys:
        raise RuntimeError(f"load_state_dict: missing {res.missing_keys}, unexpected {res.unexpected_keys}")
    return hf


def hf_check(model: GLMDemo, ids: torch.Tensor) -> dict:
    """Logits of this implementation vs transformers' Glm4MoeForCausalLM, float32 on the CPU."""
    import transformers
    cpu = GLMDemo(model.cfg, torch.float32)
    state = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    cpu.load_state_dict(state)
    cpu.eval()
    hf = hf_model_from_state(model.cfg, state)
    ids = ids.cpu()
    saved = EXPERT_IMPL["name"]
    EXPERT_IMPL["name"] = "loop"
    try:
        with torch.no_grad():
            ours = cpu.logits(ids)
            theirs = hf(input_ids=ids).logits
    finally:
        EXPERT_IMPL["name"] = saved
    diff = float((ours - theirs).abs().max())
    scale = float(theirs.abs().max())
    return {"transformers": transformers.__version__, "tokens": int(ids.numel()),
            "max_abs_diff": diff, "max_abs_logit": scale, "ok": diff <= 1e-3 * max(1.0, scale)}


# ---------------------------------------------------------------- data


class Corpus:
    def __init__(self, npy: Path, meta: Path, device: torch.device, slice_tokens: int = 0) -> None:
        self.meta = json.loads(meta.read_text())
        arr = np.load(npy, mmap_mode="r")
        n_train = int(self.meta["train_tokens"])
        n_held = int(self.meta["heldout_tokens"])
        if arr.shape != (n_train + n_held,) or arr.dtype != np.uint16:
            sys.exit(f"{npy}: shape {arr.shape} {arr.dtype}, want ({n_train + n_held},) uint16 per {meta}")
        train = np.asarray(arr[:n_train])
        held = np.asarray(arr[n_train:])
        if slice_tokens:
            train, held = train[:slice_tokens], held[:max(slice_tokens // 8, 4096)]
        self.train = torch.from_numpy(train.astype(np.int64)).to(device)
        self.held = torch.from_numpy(held.astype(np.int64)).to(device)
        self.device = device

    def batch(self, rng: np.random.Generator, B: int, S: int) -> torch.Tensor:
        off = torch.from_numpy(rng.integers(0, self.train.numel() - (S + 2), B)).to(self.device)
        return self.train[off[:, None] + torch.arange(S + 2, device=self.device)]

    def heldout_windows(self, S: int, limit: int = 0) -> torch.Tensor:
        n = (self.held.numel() - 2) // S
        if limit:
            n = min(n, limit)
        off = torch.arange(n, device=self.device) * S
        return self.held[off[:, None] + torch.arange(S + 2, device=self.device)]


@torch.no_grad()
def evaluate(model: GLMDemo, windows: torch.Tensor, batch: int, autocast: bool) -> dict:
    model.eval()
    tot = {"loss": 0.0, "mtp_loss": 0.0, "acc": 0.0, "mtp_acc": 0.0}
    n = 0
    for i in range(0, windows.shape[0], batch):
        w = windows[i:i + batch]
        with torch.autocast(device_type=w.device.type, dtype=torch.bfloat16, enabled=autocast):
            loss, mloss, logits, mlog = model(w)
        S = w.shape[1] - 2
        m = w.shape[0]
        tot["loss"] += float(loss) * m
        tot["mtp_loss"] += float(mloss) * m
        tot["acc"] += float((logits.argmax(-1) == w[:, 1:S + 1]).float().mean()) * m
        tot["mtp_acc"] += float((mlog.argmax(-1) == w[:, 2:S + 2]).float().mean()) * m
        n += m
    model.train()
    return {k: v / max(n, 1) for k, v in tot.items()} | {"tokens": int(n * (windows.shape[1] - 2))}


# ---------------------------------------------------------------- text


def byte_decoder() -> dict[str, int]:
    """The inverse of GPT-2's bytes_to_unicode (the ByteLevel alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


class Detok:
    """Decode ids with tokenizer.json alone (no tokenizers package needed)."""

    def __init__(self, tokenizer_json: Path) -> None:
        tj = json.loads(tokenizer_json.read_text())
        self.pieces = {i: t for t, i in tj["model"]["vocab"].items()}
        self.added = {t["id"]: t["content"] for t in tj.get("added_tokens", [])}
        self.bd = byte_decoder()

    def decode(self, ids) -> str:
        out = bytearray()
        for i in ids:
            i = int(i)
            if i in self.added:
                out += self.added[i].encode()
            elif i in self.pieces:
                out += bytes(self.bd[c] for c in self.pieces[i])
        return out.decode("utf-8", errors="replace")


@torch.no_grad()
def greedy(model: GLMDemo, prompt: list[int], n: int, ctx: int, stop: set[int], autocast: bool) -> list[int]:
    model.eval()
    ids = list(prompt)
    dev = next(model.parameters()).device
    for _ in range(n):
        x = torch.tensor([ids[-ctx:]], device=dev)
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=autocast):
            nxt = int(model.logits(x)[0, -1].float().argmax())
        ids.append(nxt)
        if nxt in stop:
            break
    model.train()
    return ids[len(prompt):]


# ---------------------------------------------------------------- training


def save_outputs(out: Path, model: GLMDemo, log: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    state = {}
    for k, v in model.state_dict().items():
        keep32 = k.endswith("e_score_correction_bias") or k.endswith("mlp.gate.weight")
        state[k] = v.detach().to(torch.float32 if keep32 else torch.bfloat16).cpu().contiguous()
    tmp = out / (STATE_FILE + ".tmp")
    save_file(state, str(tmp), metadata={"format": "pt", "step": str(log.get("steps", 0))})
    os.replace(tmp, out / STATE_FILE)
    (out / STATE_FILE).chmod(0o644)
    (out / CONFIG_FILE).write_text(json.dumps(model.cfg, indent=2) + "\n")
    tmp = out / (LOG_FILE + ".tmp")
    tmp.write_text(json.dumps(log, indent=1) + "\n")
    os.replace(tmp, out / LOG_FILE)


def lr_at(args, step: int, progress: float) -> float:
    warm = min(1.0, (step + 1) / max(1, args.warmup))
    p = min(max(progress, 0.0), 1.0)
    return args.lr * warm * (args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * p)))


def balance(model: GLMDemo, reset: bool = True) -> list[float]:
    """max/mean tokens per expert per MoE layer since the last call (1.0 = perfectly balanced)."""
    out = []
    for m in model.moe_layers():
        load = m.load_report
        out.append(round(float(load.max() / load.mean().clamp_min(1e-9)), 3))
        if reset:
            load.zero_()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--corpus", type=Path, default=REPO / ".bundle" / "demo-corpus.npy")
    ap.add_argument("--meta", type=Path, default=None, help="corpus JSON (default: --corpus with .json)")
    ap.add_argument("--tokenizer", type=Path, default=REPO / ".bundle" / "demo-go-tokenizer" / "tokenizer.json",
                    help="tokenizer.json, only to print the samples")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for the smoke test (small defaults)")
    ap.add_argument("--time-budget", type=float, default=480.0, help="seconds of training loop")
    ap.add_argument("--steps", type=int, default=None,
                    help="fixed step count (0: until --time-budget; default cuda 0, cpu 20)")
    ap.add_argument("--batch-size", type=int, default=None, help="sequences per step (cuda 64, cpu 4)")
    ap.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (cuda 1024, cpu 128)")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=100, help="warmup steps")
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--mtp-weight", type=float, default=0.3, help="MTP loss weight (DeepSeek-V3: 0.3, then 0.1)")
    ap.add_argument("--bias-update", type=float, default=1e-2,
                    help="e_score_correction_bias step per optimizer step at the peak lr (scaled with the lr)")
    ap.add_argument("--seed", type=int, default=47)
    ap.add_argument("--log-every", type=int, default=50, help="steps between train-loss log lines")
    ap.add_argument("--eval-every", type=float, default=60.0, help="seconds between held-out evaluations")
    ap.add_argument("--eval-windows", type=int, default=32, help="held-out windows per periodic evaluation")
    ap.add_argument("--save-every", type=float, default=120.0, help="seconds between checkpoint saves")
    ap.add_argument("--samples", type=int, default=None, help="sample prompts to continue at the end")
    ap.add_argument("--sample-tokens", type=int, default=None)
    ap.add_argument("--experts", choices=["auto", "loop", "grouped"], default="auto")
    ap.add_argument("--check-hf", action=argparse.BooleanOptionalAction, default=True,
                    help="compare the logits with transformers' Glm4MoeForCausalLM at the end")
    ap.add_argument("--autocast", action=argparse.BooleanOptionalAction, default=None,
                    help="bf16 autocast (default: on for cuda, off for cpu; on with cpu tests the GPU code path)")
    ap.add_argument("--slice-tokens", type=int, default=None, help="train on the first N tokens (cpu: 200000)")
    args = ap.parse_args()

    cpu = args.device == "cpu"
    if not cpu and not torch.cuda.is_available():
        sys.exit("train_demo_model: CUDA is not available (use --device cpu for the smoke test)")
    device = torch.device(args.device)
    B = args.batch_size or (4 if cpu else 64)
    S = args.seq_len or (128 if cpu else 1024)
    steps = args.steps if args.steps is not None else (20 if cpu else 0)
    n_samples = args.samples if args.samples is not None else (1 if cpu else 4)
    sample_tokens = args.sample_tokens or (16 if cpu else 160)
    slice_tokens = args.slice_tokens if args.slice_tokens is not None else (200_000 if cpu else 0)
    autocast = (not cpu) if args.autocast is None else args.autocast
    cdtype = torch.bfloat16 if autocast else torch.float32
    meta_path = args.meta or args.corpus.with_suffix(".json")

    torch.manual_seed(args.seed)
    np_rng = np.random.Generator(np.random.PCG64(args.seed))

    t_start = time.time()
    corpus = Corpus(args.corpus, meta_path, device, slice_tokens)
    meta = corpus.meta
    cfg = dict(ARCH)
    if meta["vocab_size"] != cfg["vocab_size"]:
        sys.exit(f"corpus vocab_size {meta['vocab_size']} != model vocab_size {cfg['vocab_size']}")
    cfg["pad_token_id"] = meta["special_ids"]["<|endoftext|>"]
    cfg["eos_token_id"] = [meta["special_ids"][t] for t in ("<|endoftext|>", "<|user|>", "<|observation|>")]

    model = GLMDemo(cfg, cdtype)
    init_weights(model)
    model.to(device)
    model.train()
    params = count_params(model)
    impl = select_expert_impl(device, cdtype, cfg, args.experts)
    print(f"device {device} ({torch.cuda.get_device_name(device) if not cpu else platform.processor() or 'cpu'}), "
          f"torch {torch.__version__}; experts: {impl}")
    print(f"params: {params}")
    print(f"corpus: {corpus.train.numel():,} train / {corpus.held.numel():,} held-out tokens; "
          f"batch {B} x {S} = {B * S:,} tokens/step")

    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.ndim >= 2 else no_decay).append(p)
    opt_kw = {"fused": True} if not cpu else {}
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, **opt_kw)

    eval_windows = corpus.heldout_windows(S, args.eval_windows)
    log = {
        "script": "scripts/train_demo_model.py",
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "argv": sys.argv[1:],
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "batch_size": B, "seq_len": S, "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if not cpu else "cpu",
        "torch": torch.__version__, "experts_impl": impl,
        "corpus": {k: meta[k] for k in ("go_version", "files_kept", "train_files", "heldout_files", "train_bytes",
                                        "heldout_bytes", "train_tokens", "heldout_tokens", "bytes_per_token",
                                        "tokens_sha256", "tokenizer_sha256") if k in meta},
        "config": cfg, "params": params, "curve": [],
    }

    step, tokens = 0, 0
    moe = model.moe_layers()
    acc_loss = torch.zeros((), device=device)
    acc_mtp = torch.zeros((), device=device)
    acc_n = 0
    if not cpu:
        torch.cuda.synchronize()
    t0 = time.time()
    last_eval, last_save = t0, t0
    print(f"setup {t0 - t_start:.1f} s; training "
          + (f"{steps} steps" if steps else f"for {args.time_budget:.0f} s"), flush=True)
    while True:
        elapsed = time.time() - t0
        if (steps and step >= steps) or (not steps and elapsed >= args.time_budget):
            break
        progress = step / steps if steps else elapsed / args.time_budget
        lr = lr_at(args, step, progress)
        for g in opt.param_groups:
            g["lr"] = lr
        win = corpus.batch(np_rng, B, S)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=autocast):
            loss, mloss, _, _ = model(win)
            total = loss + args.mtp_weight * mloss
        opt.zero_grad(set_to_none=True)
        total.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        # follows the lr's cosine decay (not its warmup): full size early, small at the end
        gamma = args.bias_update * lr_at(args, args.warmup, progress) / args.lr
        with torch.no_grad():  # aux-loss-free balancing (DeepSeek-V3 §2.1.2)
            for m in moe:
                m.gate.e_score_correction_bias += gamma * torch.sign(m.load.mean() - m.load)
                m.load.zero_()
        acc_loss += loss.detach()
        acc_mtp += mloss.detach()
        acc_n += 1
        step += 1
        tokens += B * S
        now = time.time()
        if step % args.log_every == 0 or (steps and step == steps):
            tl, tm = float(acc_loss) / acc_n, float(acc_mtp) / acc_n
            acc_loss.zero_()
            acc_mtp.zero_()
            acc_n = 0
            entry = {"step": step, "tokens": tokens, "elapsed_s": round(now - t0, 1), "lr": lr,
                     "train_loss": round(tl, 4), "train_mtp_loss": round(tm, 4),
                     "grad_norm": round(float(gnorm), 3), "expert_max_over_mean": balance(model)}
            if now - last_eval >= args.eval_every:
                ev = evaluate(model, eval_windows, B, autocast)
                entry.update(heldout_loss=round(ev["loss"], 4), heldout_mtp_loss=round(ev["mtp_loss"], 4))
                last_eval = time.time()
            log["curve"].append(entry)
            print(json.dumps(entry), flush=True)
            if time.time() - last_save >= args.save_every:
                log["steps"], log["tokens"] = step, tokens
                save_outputs(args.out, model, log)
                last_save = time.time()
    if not cpu:
        torch.cuda.synchronize()
    train_s = time.time() - t0

    all_windows = corpus.heldout_windows(S)
    ev = evaluate(model, all_windows, B, autocast)
    log["peak_gpu_memory_gb"] = round(torch.cuda.max_memory_allocated(device) / 1e9, 2) if not cpu else None
    log.update(steps=step, tokens=tokens, train_seconds=round(train_s, 1),
               tokens_per_second=round(tokens / max(train_s, 1e-9)),
               final={"heldout_loss": ev["loss"], "heldout_mtp_loss": ev["mtp_loss"],
                      "heldout_top1": ev["acc"], "heldout_mtp_top1": ev["mtp_acc"],
                      "heldout_tokens": ev["tokens"],
                      "train_loss": log["curve"][-1]["train_loss"] if log["curve"] else None,
                      "train_mtp_loss": log["curve"][-1]["train_mtp_loss"] if log["curve"] else None,
                      "expert_bias": [[round(x, 4) for x in m.gate.e_score_correction_bias.tolist()] for m in moe]})

    samples = []
    if n_samples:
        detok = Detok(args.tokenizer) if args.tokenizer.is_file() else None
        stop = set(cfg["eos_token_id"])
        for p in meta.get("sample_prompts", [])[:n_samples]:
            out_ids = greedy(model, p["ids"], sample_tokens, S, stop, autocast)
            samples.append({"prompt": p["text"], "ids": out_ids,
                            "text": detok.decode(out_ids) if detok else None})
    log["samples"] = samples

    if args.check_hf:
        try:
            log["hf_check"] = hf_check(model, all_windows[:2, :64])
        except Exception as exc:  # report, do not lose the run
            log["hf_check"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    log["wall_seconds"] = round(time.time() - t_start, 1)
    save_outputs(args.out, model, log)
    with (args.out / SAMPLES_FILE).open("w") as f:
        for s in samples:
            f.write("=" * 20 + " prompt\n" + s["prompt"] + "\n" + "-" * 20 + " greedy continuation\n"
                    + (s["text"] if s["text"] is not None else str(s["ids"])) + "\n")

    for s in samples:
        print("=" * 60)
        print(s["prompt"] + "\u2588" + (s["text"] if s["text"] is not None else str(s["ids"])))
    print("=" * 60)
    fin = log["final"]
    rows = [
        ("device", log["device_name"]), ("experts", EXPERT_IMPL["name"]),
        ("parameters", f"{params['total']:,} (main {params['main']:,}, active/token "
                       f"{params['main_active_per_token']:,}, MTP {params['mtp_layer']:,})"),
        ("steps", f"{step:,}"), ("tokens seen", f"{tokens:,} ({tokens / max(1, corpus.train.numel()):.1f} epochs)"),
        ("final train loss", f"{fin['train_loss']}"), ("final train MTP loss", f"{fin['train_mtp_loss']}"),
        ("held-out loss", f"{fin['heldout_loss']:.4f} (top-1 {fin['heldout_top1']:.3f}, "
                          f"{fin['heldout_tokens']:,} tokens)"),
        ("held-out MTP loss", f"{fin['heldout_mtp_loss']:.4f} (top-1 {fin['heldout_mtp_top1']:.3f})"),
        ("expert balance", " ".join(str(x) for x in (log["curve"][-1]["expert_max_over_mean"]
                                                  if log["curve"] else []))),
        ("tokens/s", f"{log['tokens_per_second']:,}"), ("peak GPU memory", f"{log['peak_gpu_memory_gb']} GB"),
        ("train time", f"{train_s:.0f} s"),
        ("wall time", f"{log['wall_seconds']:.0f} s"),
        ("HF check", json.dumps(log.get("hf_check"))),
        ("outputs", f"{args.out}/{{{STATE_FILE},{CONFIG_FILE},{LOG_FILE},{SAMPLES_FILE}}}"),
    ]
    w = max(len(r[0]) for r in rows)
    for k, v in rows:
        print(f"{k:<{w}}  {v}")
    if args.check_hf and not log["hf_check"].get("ok"):
        print("WARNING: the transformers check did not pass (see hf_check above)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
