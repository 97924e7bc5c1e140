#!/usr/bin/env python3
"""Golden outputs for a tiny GLM-4.7-FP8-layout checkpoint, from Hugging Face transformers.

Usage:
    python3 scripts/make_golden.py --model testdata/models/tiny-f32 \
        --out testdata/models/tiny-f32.golden.json [--seed N]

The reference is transformers' Glm4MoeForCausalLM in float32 with eager
attention and eager experts, built from config.json without its
quantization_config and loaded with weights dequantized from the FP8 files
(W = float(fp8) * weight_scale, one scale per output row, in float32). The
MTP layer (index num_hidden_layers) is not part of the plain forward and is
left out, as transformers does.

For every case the file records the float32 logits at the last prompt
position and a 16-token greedy continuation (teacher forcing: the whole
sequence is run again for each step, no KV cache), with the top-1 minus
top-2 logit margin of each step. No stop tokens are applied.

Prompts are drawn per case shape from a seeded stream; a case whose greedy
margins or routing decisions are fragile under float32 reordering or FP8
activation noise is redrawn (MIN_GREEDY_MARGIN, FP8_MARGIN_THRESHOLD,
FP8_SAFE_MARGIN, MIN_ROUTING_GAP below; docs/golden.md).

Before writing, an independent float64 numpy forward (docs/model.md §8) that
reads the safetensors files with its own parser must agree with transformers
on every case's last logits; this guards against a mis-mapped weight.
"""

from __future__ import annotations

import argparse
import json
import math
import struct
import sys
from pathlib import Path

import numpy as np

try:
    import torch
    import transformers
    from safetensors import safe_open
    from transformers import Glm4MoeConfig, Glm4MoeForCausalLM
except ImportError as exc:  # pragma: no cover - environment problem
    sys.exit(f"make_golden: needs torch, transformers and safetensors ({exc}); "
             "pip install -r scripts/requirements-golden.txt")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_tiny_models import special_token_ids  # noqa: E402  (same directory)
from glm_numpy_ref import load_numpy_float64, numpy_forward, read_index  # noqa: E402

GREEDY_STEPS = 16
# A case is redrawn when one of its discrete decisions is fragile:
# - a greedy margin (top-1 minus top-2 logit) below MIN_GREEDY_MARGIN, which
#   a float32 engine with another summation order might flip;
# - a greedy margin in the FP8 band (FP8_MARGIN_THRESHOLD, FP8_SAFE_MARGIN):
#   pkg/golden's FP8 comparison (FP8Tolerances) counts a flip there as a
#   failure, yet per-token FP8 activations move margins by up to ~0.09
#   (standard deviation ~0.027, measured on these models). Margins at or
#   below the FP8 threshold are kept: the FP8 comparison tolerates a flip
#   there, and the exact comparison still checks them;
# - a routing decision (k-th vs (k+1)-th biased sigmoid score, group score at
#   the topk_group boundary) closer than MIN_ROUTING_GAP, about 100 times the
#   largest FP8-induced change of a router score (~5e-4).
MIN_GREEDY_MARGIN = 1e-3   # logits
FP8_MARGIN_THRESHOLD = 5e-2  # = pkg/golden FP8Tolerances.MarginThreshold
FP8_SAFE_MARGIN = 0.15     # logits, ~5.5 standard deviations of the FP8 margin noise
MIN_ROUTING_GAP = 5e-2     # biased sigmoid scores / group scores
MAX_REDRAWS = 400
# Allowed max|hf - numpy| / max|numpy| on last logits (float32 vs float64).
SELF_CHECK_RTOL = 2e-5


# ------------------------------------------------------------ checkpoint reading




def load_torch_float32(model_dir: Path) -> tuple[dict[str, torch.Tensor], set[str]]:
    """Every checkpoint tensor as float32 through safetensors+torch, FP8 weights dequantized.

    Returns the tensors (by base name, scales folded in) and the set of file
    tensor names that were read, for the all-consumed accounting.
    """
    weight_map = read_index(model_dir)
    raw: dict[str, torch.Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        try:
            with safe_open(str(model_dir / shard), framework="pt") as f:
                for name in f.keys():
                    if weight_map.get(name) != shard:
                        raise SystemExit(f"{shard}: tensor {name} not mapped to this shard in the index")
                    raw[name] = f.get_tensor(name)
        except Exception as exc:  # safetensors raises its own error types; SystemExit passes
            raise SystemExit(f"read shard {model_dir / shard}: {exc}")
    missing = set(weight_map) - set(raw)
    if missing:
        raise SystemExit(f"{model_dir}: {len(missing)} indexed tensors not found, e.g. {sorted(missing)[:3]}")
    out: dict[str, torch.Tensor] = {}
    for name, t in raw.items():
        if name.endswith(".weight_scale"):
            continue
        if t.dtype == torch.float8_e4m3fn:
            sname = name[: -len("weight")] + "weight_scale"
            if sname not in raw:
                raise SystemExit(f"{name}: FP8 weight without {sname}")
            s = raw[sname]
            if tuple(s.shape) != (t.shape[0], 1):
                raise SystemExit(f"{sname}: shape {tuple(s.shape)}, want [{t.shape[0]}, 1]")
            out[name] = t.to(torch.float32) * s.to(torch.float32)
        elif t.dtype in (torch.bfloat16, torch.float32):
            out[name] = t.to(torch.float32)
        else:
            raise SystemExit(f"{name}: unexpected dtype {t.dtype}")
    orphans = [n for n in raw if n.endswith(".weight_scale") and n[: -len("_scale")] not in out]
    if orphans:
        raise SystemExit(f"{model_dir}: scales without weights: {orphans[:3]}")
    return out, set(raw)






# ------------------------------------------------------------ transformers model


def hf_config(model_dir: Path) -> tuple[dict, Glm4MoeConfig]:
    path = model_dir / "config.json"
    try:
        with path.open() as f:
            cfg = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise SystemExit(f"read {path}: {exc}")
    plain = {k: v for k, v in cfg.items() if k != "quantization_config"}
    config = Glm4MoeConfig(**plain, attn_implementation="eager", experts_implementation="eager")
    return cfg, config


# How transformers' state_dict keys are filled from the checkpoint names.
KEY_MAPPING = [
    "model.layers.L.mlp.experts.gate_up_proj [E, 2I, H]: row block e = cat(model.layers.L.mlp.experts.e.gate_proj.weight, "
    "...experts.e.up_proj.weight) (gate rows first)",
    "model.layers.L.mlp.experts.down_proj [E, H, I]: [e] = model.layers.L.mlp.experts.e.down_proj.weight",
    "every other key: the same name; an FP8 .weight becomes float(fp8) * .weight_scale (per output row, float32)",
    "model.layers.<num_hidden_layers>.* (MTP) and the consumed .weight_scale tensors have no transformers key",
]


def build_hf_model(model_dir: Path) -> tuple[dict, Glm4MoeForCausalLM]:
    """Float32 transformers model loaded with the dequantized checkpoint (KEY_MAPPING)."""
    cfg, config = hf_config(model_dir)
    model = Glm4MoeForCausalLM(config).to(torch.float32).eval()
    ckpt, file_names = load_torch_float32(model_dir)
    n_layers = cfg["num_hidden_layers"]
    mtp_prefix = f"model.layers.{n_layers}."
    n_experts = cfg["n_routed_experts"]

    consumed: set[str] = set()

    def take(name: str) -> torch.Tensor:
        if name not in ckpt:
            raise SystemExit(f"{model_dir}: transformers needs {name}, not in checkpoint")
        consumed.add(name)
        return ckpt[name]

    state = {}
    for key, param in model.state_dict().items():
        if key.endswith("mlp.experts.gate_up_proj"):
            p = key[: -len("gate_up_proj")]
            t = torch.stack([torch.cat([take(f"{p}{e}.gate_proj.weight"),
                                        take(f"{p}{e}.up_proj.weight")], 0)
                             for e in range(n_experts)])
        elif key.endswith("mlp.experts.down_proj"):
            p = key[: -len("down_proj")]
            t = torch.stack([take(f"{p}{e}.down_proj.weight") for e in range(n_experts)])
        else:
            t = take(key)
        if tuple(t.shape) != tuple(param.shape):
            raise SystemExit(f"{key}: checkpoint shape {tuple(t.shape)}, model wants {tuple(param.shape)}")
        state[key] = t

    result = model.load_state_dict(state, strict=True)
    if result.missing_keys or result.unexpected_keys:
        raise SystemExit(f"load_state_dict: missing {result.missing_keys}, unexpected {result.unexpected_keys}")
    leftover = set(ckpt) - consumed
    not_mtp = sorted(n for n in leftover if not n.startswith(mtp_prefix))
    if not_mtp:
        raise SystemExit(f"{model_dir}: checkpoint tensors not used by transformers: {not_mtp[:5]}")
    if not any(n.startswith(mtp_prefix) for n in file_names):
        raise SystemExit(f"{model_dir}: no MTP layer {mtp_prefix}* in checkpoint")
    print(f"  loaded {len(state)} transformers tensors from {len(consumed)} checkpoint weights; "
          f"left out {len(leftover)} MTP weights ({mtp_prefix}*)")
    return cfg, model


class RouterProbe:
    """Records, per MoE layer, the router input of the last forward."""

    def __init__(self, model: Glm4MoeForCausalLM) -> None:
        self.inputs: dict[int, torch.Tensor] = {}
        self.routers = {}
        for i, layer in enumerate(model.model.layers):
            gate = getattr(layer.mlp, "gate", None)
            if gate is not None and hasattr(gate, "e_score_correction_bias"):
                self.routers[i] = gate
                gate.register_forward_hook(self._hook(i))

    def _hook(self, i: int):
        def hook(module, args, output):
            self.inputs[i] = args[0].detach().reshape(-1, module.hidden_dim).clone()
        return hook

    @torch.no_grad()
    def stats(self) -> tuple[float, dict[int, tuple[int, int, int, float]]]:
        """Smallest tie gap over all tokens and layers, and per layer the number of
        tokens whose expert set the correction bias changes, the number the group
        limit changes, the number of tokens, and the smallest decision gap of the
        selections without the bias and without the group limit (so a change is
        known not to come from a near-tie)."""
        min_gap = math.inf
        changed = {}
        for i, gate in self.routers.items():
            x = self.inputs[i].to(torch.float32)
            scores = torch.sigmoid(x @ gate.weight.to(torch.float32).T)
            biased = scores + gate.e_score_correction_bias
            sel_b, gap_b = _select(biased, gate)
            sel_u, gap_u = _select(scores, gate)
            min_gap = min(min_gap, gap_b)
            diff = (torch.sort(sel_b, -1)[0] != torch.sort(sel_u, -1)[0]).any(-1)
            flat, gap_f = _select(biased, gate, grouped=False)
            gdiff = (torch.sort(sel_b, -1)[0] != torch.sort(flat, -1)[0]).any(-1)
            alt_gap = min(gap_u, gap_f) if gate.num_group > 1 else gap_u
            changed[i] = (int(diff.sum()), int(gdiff.sum()), int(diff.numel()), alt_gap)
        return min_gap, changed


def _select(choice: torch.Tensor, gate, grouped: bool = True) -> tuple[torch.Tensor, float]:
    """Group-limited top-k as transformers does it (plain top-k when not grouped);
    also the smallest decision gap."""
    t, e = choice.shape
    g = gate.num_group if grouped else 1
    gap = math.inf
    if g > 1:
        gs = choice.view(t, g, e // g).topk(2, dim=-1)[0].sum(-1)
        srt = torch.sort(gs, -1, descending=True)[0]
        gap = min(gap, float((srt[:, gate.topk_group - 1] - srt[:, gate.topk_group]).min()))
        keep = srt[:, gate.topk_group - 1: gate.topk_group]
        mask = (gs >= keep).repeat_interleave(e // g, dim=1)
        choice = choice.masked_fill(~mask, float("-inf"))
    srt, idx = torch.sort(choice, -1, descending=True)
    k = gate.top_k
    nxt = srt[:, k]
    finite = torch.isfinite(nxt)
    if finite.any():
        gap = min(gap, float((srt[:, k - 1] - nxt)[finite].min()))
    return idx[:, :k], gap


@torch.no_grad()
def hf_logits(model: Glm4MoeForCausalLM, ids: list[int]) -> torch.Tensor:
    out = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False)
    return out.logits[0].to(torch.float32)


def margin_ok(m: float) -> bool:
    """A greedy margin that neither float32 reordering nor FP8 activations make fragile."""
    return m >= MIN_GREEDY_MARGIN and not (FP8_MARGIN_THRESHOLD < m < FP8_SAFE_MARGIN)


def run_case(model, probe: RouterProbe, prompt: list[int]) -> dict | None:
    """Last logits and the greedy continuation of prompt; None as soon as a
    greedy margin fails margin_ok (the case is redrawn)."""
    logits = hf_logits(model, prompt)
    last = logits[-1].clone()
    seq = list(prompt)
    tokens, margins = [], []
    for _ in range(GREEDY_STEPS):
        step = hf_logits(model, seq)[-1]
        top2 = torch.topk(step, 2)
        tok = int(torch.argmax(step))
        if tok != int(top2.indices[0]):
            raise SystemExit("argmax and topk disagree on the top token")
        margin = float(top2.values[0] - top2.values[1])
        if not margin_ok(margin):
            return None
        tokens.append(tok)
        margins.append(margin)
        seq.append(tok)
    # The last step ran the whole final sequence: its router decisions cover
    # every position of every earlier step (causal attention).
    min_gap, changed = probe.stats()
    return {"prompt": prompt, "last": last, "tokens": tokens, "margins": margins,
            "min_gap": min_gap, "changed": changed}


# ------------------------------------------------------------ numpy reference








# ------------------------------------------------------------ cases and output


def draw_prompt(rng: np.random.Generator, shape: list, special: dict[str, int]) -> list[int]:
    """shape: ints (that many random ordinary ids < 1000) and special token strings."""
    ids: list[int] = []
    for part in shape:
        if isinstance(part, int):
            ids.extend(int(x) for x in rng.integers(0, 1000, part))
        else:
            ids.append(special[part])
    return ids


CASE_SHAPES = [
    ["[gMASK]", "<sop>", "<|user|>", 12, "<|assistant|>", "<think>"],  # chat-like, 17 tokens
    [1],
    [5],
    ["[gMASK]", "<sop>", "<|system|>", 8, "<|user|>", 9, "</think>", 3],  # 25 tokens
    [40],
    [100],
]


def f32_json(x: float) -> float:
    """Python float whose repr is the shortest string that round-trips as float32."""
    return float(np.format_float_positional(np.float32(x), unique=True, trim="0"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, required=True, help="checkpoint dir, e.g. testdata/models/tiny-f32")
    ap.add_argument("--out", type=Path, required=True, help="golden JSON to write")
    ap.add_argument("--seed", type=int, default=1, help="seed for the prompt ids (default 1)")
    args = ap.parse_args()
    torch.set_num_threads(1)  # reproducible summation order, and a shared 2-core machine
    torch.manual_seed(0)

    print(f"{args.model}: transformers {transformers.__version__}, torch {torch.__version__}")
    cfg, model = build_hf_model(args.model)
    for line in KEY_MAPPING:
        print("  mapping:", line)
    special = special_token_ids(args.model)
    for tok in ("[gMASK]", "<sop>", "<|user|>", "<|assistant|>", "<think>", "</think>", "<|system|>"):
        if tok not in special or special[tok] >= cfg["vocab_size"]:
            raise SystemExit(f"{args.model}: special token {tok} missing or outside vocab_size")
    probe = RouterProbe(model)
    rng = np.random.Generator(np.random.PCG64(args.seed))

    cases = []
    changed_total: dict[int, list[int]] = {}  # layer -> [bias changed, group changed, tokens]
    for ci, shape in enumerate(CASE_SHAPES):
        rejected = {"margin": 0, "routing": 0}
        for attempt in range(MAX_REDRAWS):
            res = run_case(model, probe, draw_prompt(rng, shape, special))
            if res is None:
                rejected["margin"] += 1
            elif res["min_gap"] < MIN_ROUTING_GAP:
                rejected["routing"] += 1
            else:
                break
        else:
            raise SystemExit(f"case {ci}: no prompt without fragile decisions in {MAX_REDRAWS} draws "
                             f"(rejected for a greedy margin {rejected['margin']}, for routing {rejected['routing']})")
        for layer, (n_bias, n_group, n_tok, alt_gap) in res["changed"].items():
            acc = changed_total.setdefault(layer, [0, 0, 0, math.inf])
            acc[0] += n_bias
            acc[1] += n_group
            acc[2] += n_tok
            acc[3] = min(acc[3], alt_gap)
        big = [m for m in res["margins"] if m >= FP8_SAFE_MARGIN]
        print(f"  case {ci}: prompt {len(res['prompt'])} tokens (draw {attempt + 1}; redrawn "
              f"{rejected['margin']}x for a greedy margin, {rejected['routing']}x for routing), "
              f"min greedy margin {min(res['margins']):.4g}, {len(big)} of {GREEDY_STEPS} margins >= "
              f"{FP8_SAFE_MARGIN} (min {min(big, default=math.nan):.4g}), min routing gap {res['min_gap']:.3g}")
        cases.append(res)
    for layer, (n_bias, n_group, tot, alt_gap) in sorted(changed_total.items()):
        msg = (f"  layer {layer}: over the {tot} positions of the final greedy sequences the correction "
               f"bias changes the expert set for {n_bias / tot:.1%}")
        if cfg["n_group"] > 1:
            msg += f", the group limit for {n_group / tot:.1%}"
        msg += (f"; smallest decision gap without the bias"
                f"{' or without the group limit' if cfg['n_group'] > 1 else ''} {alt_gap:.3g}")
        print(msg)

    print("  self-check: numpy float64 forward vs transformers")
    w64 = load_numpy_float64(args.model)
    for ci, res in enumerate(cases):
        ref = numpy_forward(cfg, w64, res["prompt"])
        hf = res["last"].double().numpy()
        rel = float(np.abs(hf - ref).max() / np.abs(ref).max())
        print(f"    case {ci}: max rel diff {rel:.2e}")
        if not rel < SELF_CHECK_RTOL:
            raise SystemExit(f"case {ci}: transformers and numpy disagree (rel {rel:.2e} >= {SELF_CHECK_RTOL})")

    doc = {
        "model": args.model.resolve().name,
        "reference": f"transformers {transformers.__version__}, torch {torch.__version__}, "
                     "float32 eager, dequantized FP8 weights",
        "cases": [
            {
                "prompt_token_ids": res["prompt"],
                "last_logits": [f32_json(x) for x in res["last"].tolist()],
                "greedy_token_ids": res["tokens"],
                "greedy_margins": [f32_json(x) for x in res["margins"]],
            }
            for res in cases
        ],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    print(f"  wrote {args.out} ({args.out.stat().st_size / 1e3:.0f} kB, {len(cases)} cases)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
