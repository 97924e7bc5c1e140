#!/usr/bin/env python3
"""Export the trained demo model to testdata/models/demo-go in the GLM-4.7-FP8 layout.

Reads what scripts/train_demo_model.py wrote (demo-go-state.safetensors,
model_config.json, train_log.json) and writes, with scripts/make_tiny_models.py's
own writers (so names, dtypes, key order and layout are the tiny checkpoints'):

* config.json: every Glm4Moe field in the real key order, compressed-tensors
  FP8_DYNAMIC quantization_config (make_tiny_models.make_config, sizes
  replaced by the demo model's);
* FP8 E4M3 linears with per-output-row F32 weight_scale (amax / 448, RNE);
  BF16 embeddings, lm_head, norms, q/k/v biases, routers and MTP eh_proj; F32
  e_score_correction_bias; routed experts unfused, one tensor per expert;
* the MTP layer as model.layers.{num_hidden_layers}.*: enorm, hnorm, eh_proj,
  the MoE decoder layer, shared_head.norm, and its own embed_tokens (BF16) and
  shared_head.head (FP8) as in the GLM-4.7 release, here copies of the main
  embedding and lm_head, which the MTP layer was trained with;
* model-0000N-of-00002.safetensors + model.safetensors.index.json (MTP last);
* generation_config.json, tokenizer files, the corpus LICENSE (Go's BSD-3), README.md.

Then it checks the result: the checkpoint read back (make_golden's reader,
FP8 dequantized) into transformers' Glm4MoeForCausalLM must reproduce this
script's own forward; and it reports held-out losses of the trained weights
(BF16), of the FP8 checkpoint (dequantized weights, float32), and of the FP8
checkpoint with per-token FP8 activations (the GPU path), main and MTP.
With --glmctl BIN it also runs `BIN inspect` and a greedy `BIN generate`
on the CPU backend.

Usage:
    python3 scripts/export_demo_model.py --state $OUT --out testdata/models/demo-go \
        [--tokenizer .bundle/demo-go-tokenizer] [--corpus .bundle/demo-corpus.npy] \
        [--eval-windows 24] [--glmctl /path/to/glmctl]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

try:
    import torch
    from safetensors.torch import load_file, save_file
except ImportError as exc:  # pragma: no cover - environment problem
    sys.exit(f"export_demo_model: needs torch and safetensors ({exc}); pip install -r scripts/requirements-demo.txt")

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_tiny_models as mtm  # noqa: E402  (same directory)
import train_demo_model as tdm  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
NUM_SHARDS = 2
SCALE_DTYPE = "F32"
MAX_CHECKPOINT_BYTES = 20_000_000
DEMO_PROMPT = "// Reverse returns a copy of s with its bytes in reverse order.\nfunc Reverse(s string) string {\n"

# config.json keys taken from the trained model (make_config's values are the
# tiny models' constants); every other key is make_config's.
ARCH_KEYS = ["attention_bias", "head_dim", "hidden_act", "hidden_size", "intermediate_size",
             "max_position_embeddings", "moe_intermediate_size", "norm_topk_prob", "num_attention_heads",
             "n_group", "topk_group", "n_routed_experts", "n_shared_experts", "routed_scaling_factor",
             "num_experts_per_tok", "first_k_dense_replace", "use_qk_norm", "num_hidden_layers",
             "num_key_value_heads", "num_nextn_predict_layers", "partial_rotary_factor", "rms_norm_eps",
             "rope_theta", "tie_word_embeddings", "vocab_size"]


def f32(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float32).cpu().numpy()


def make_demo_config(cfg: dict, specials: dict[str, int]) -> dict:
    spec = mtm.TinySpec("demo-go", cfg["num_hidden_layers"], cfg["first_k_dense_replace"], cfg["n_routed_experts"],
                        cfg["num_experts_per_tok"], cfg["n_group"], cfg["topk_group"], SCALE_DTYPE, NUM_SHARDS)
    config = mtm.make_config(spec, specials)
    keys = list(config)
    for k in ARCH_KEYS:
        if k not in config:
            raise SystemExit(f"make_config has no {k}: update ARCH_KEYS")
        config[k] = cfg[k]
    if list(config) != keys:
        raise SystemExit("config key order changed")
    if config["eos_token_id"] != cfg["eos_token_id"] or config["pad_token_id"] != cfg["pad_token_id"]:
        raise SystemExit(f"tokenizer eos/pad {config['eos_token_id']}/{config['pad_token_id']} differ from the "
                         f"trained model's {cfg['eos_token_id']}/{cfg['pad_token_id']}")
    return config


def build_tensors(state: dict[str, torch.Tensor], cfg: dict) -> tuple[mtm.TensorSet, list[str]]:
    """All checkpoint tensors in make_tiny_models' order; returns the set and the MTP names."""
    ts = mtm.TensorSet()
    E, I = cfg["n_routed_experts"], cfg["moe_intermediate_size"]

    def layer(dst: str, src: str, moe: bool) -> None:
        ts.bf16(dst + "input_layernorm.weight", f32(state[src + "input_layernorm.weight"]))
        for proj in ("q_proj", "k_proj", "v_proj"):
            ts.fp8_linear(dst + f"self_attn.{proj}", f32(state[src + f"self_attn.{proj}.weight"]), SCALE_DTYPE)
            ts.bf16(dst + f"self_attn.{proj}.bias", f32(state[src + f"self_attn.{proj}.bias"]))
        ts.fp8_linear(dst + "self_attn.o_proj", f32(state[src + "self_attn.o_proj.weight"]), SCALE_DTYPE)
        ts.bf16(dst + "self_attn.q_norm.weight", f32(state[src + "self_attn.q_norm.weight"]))
        ts.bf16(dst + "self_attn.k_norm.weight", f32(state[src + "self_attn.k_norm.weight"]))
        ts.bf16(dst + "post_attention_layernorm.weight", f32(state[src + "post_attention_layernorm.weight"]))

        def mlp(d: str, s: str) -> None:
            for proj in ("gate_proj", "up_proj", "down_proj"):
                ts.fp8_linear(d + proj, f32(state[s + proj + ".weight"]), SCALE_DTYPE)

        if not moe:
            mlp(dst + "mlp.", src + "mlp.")
            return
        ts.bf16(dst + "mlp.gate.weight", f32(state[src + "mlp.gate.weight"]))
        ts.f32(dst + "mlp.gate.e_score_correction_bias", f32(state[src + "mlp.gate.e_score_correction_bias"]))
        gate_up = f32(state[src + "mlp.experts.gate_up_proj"])  # [E, 2I, H], gate rows first
        down = f32(state[src + "mlp.experts.down_proj"])        # [E, H, I]
        if gate_up.shape[:2] != (E, 2 * I) or down.shape[0] != E:
            raise SystemExit(f"{src}mlp.experts: shapes {gate_up.shape} {down.shape}")
        for e in range(E):
            ts.fp8_linear(dst + f"mlp.experts.{e}.gate_proj", gate_up[e, :I], SCALE_DTYPE)
            ts.fp8_linear(dst + f"mlp.experts.{e}.up_proj", gate_up[e, I:], SCALE_DTYPE)
            ts.fp8_linear(dst + f"mlp.experts.{e}.down_proj", down[e], SCALE_DTYPE)
        mlp(dst + "mlp.shared_experts.", src + "mlp.shared_experts.")

    embed = f32(state["model.embed_tokens.weight"])
    head = f32(state["lm_head.weight"])
    ts.bf16("model.embed_tokens.weight", embed)
    for i in range(cfg["num_hidden_layers"]):
        layer(f"model.layers.{i}.", f"model.layers.{i}.", moe=i >= cfg["first_k_dense_replace"])
    ts.bf16("model.norm.weight", f32(state["model.norm.weight"]))
    ts.bf16("lm_head.weight", head)

    before = set(ts.tensors)
    p = f"model.layers.{cfg['num_hidden_layers']}."
    ts.bf16(p + "embed_tokens.weight", embed)
    ts.bf16(p + "enorm.weight", f32(state["mtp.enorm.weight"]))
    ts.bf16(p + "hnorm.weight", f32(state["mtp.hnorm.weight"]))
    ts.bf16(p + "eh_proj.weight", f32(state["mtp.eh_proj.weight"]))
    layer(p, "mtp.", moe=True)
    ts.bf16(p + "shared_head.norm.weight", f32(state["mtp.shared_head.norm.weight"]))
    ts.fp8_linear(p + "shared_head.head", head, SCALE_DTYPE)
    mtp_names = [n for n in ts.tensors if n not in before]

    used = set()
    for n in state:
        if n.startswith("mtp.") or n.startswith("model.") or n.startswith("lm_head."):
            used.add(n)
    if len(used) != len(state):
        raise SystemExit(f"state has tensors outside model./lm_head./mtp.: {sorted(set(state) - used)[:5]}")
    return ts, mtp_names


def write_checkpoint(ts: mtm.TensorSet, mtp_names: list[str], config: dict, out: Path, tok_dir: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("model-*.safetensors"):
        old.unlink()
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(mtm.make_generation_config(config), indent=2) + "\n")
    shards = mtm.assign_shards(ts, mtp_names, NUM_SHARDS)
    weight_map: dict[str, str] = {}
    for i, names in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{NUM_SHARDS:05d}.safetensors"
        save_file({n: ts.tensors[n] for n in names}, str(out / fname), metadata={"format": "pt"})
        (out / fname).chmod(0o644)
        for n in names:
            weight_map[n] = fname
    total = sum(mtm.nbytes(t) for t in ts.tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    mtm.copy_tokenizer(tok_dir, out, config)
    return sum((out / f).stat().st_size for f in set(weight_map.values()))


# ---------------------------------------------------------------- evaluation


def demo_state_from_checkpoint(model_dir: Path, cfg: dict) -> dict[str, torch.Tensor]:
    """The checkpoint (FP8 dequantized, float32) in train_demo_model's names, MTP included."""
    import make_golden
    ckpt, _ = make_golden.load_torch_float32(model_dir)
    L, E = cfg["num_hidden_layers"], cfg["n_routed_experts"]
    mtp = f"model.layers.{L}."
    out: dict[str, torch.Tensor] = {}
    experts: dict[str, dict] = {}
    for name, t in ckpt.items():
        dst = "mtp." + name[len(mtp):] if name.startswith(mtp) else name
        if dst in ("mtp.embed_tokens.weight", "mtp.shared_head.head.weight"):
            continue  # copies of the main embedding / lm_head (checked below)
        if ".mlp.experts." in dst:
            pre, rest = dst.split(".mlp.experts.")
            e, proj = rest.split(".")[:2]
            experts.setdefault(pre, {})[(int(e), proj)] = t
            continue
        out[dst] = t
    for pre, d in experts.items():
        out[pre + ".mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([d[(e, "gate_proj")], d[(e, "up_proj")]], 0) for e in range(E)])
        out[pre + ".mlp.experts.down_proj"] = torch.stack([d[(e, "down_proj")] for e in range(E)])
    if not torch.equal(ckpt[mtp + "embed_tokens.weight"], ckpt["model.embed_tokens.weight"]):
        raise SystemExit("MTP embed_tokens is not the main embedding")
    head_err = float((ckpt[mtp + "shared_head.head.weight"] - ckpt["lm_head.weight"]).abs().max())
    if head_err > 0.07 * float(ckpt["lm_head.weight"].abs().max()):
        raise SystemExit(f"MTP shared_head.head differs from lm_head by {head_err}")
    return out


def load_demo(cfg: dict, state: dict[str, torch.Tensor]) -> tdm.GLMDemo:
    m = tdm.GLMDemo(cfg, torch.float32)
    res = m.load_state_dict({k: v.to(torch.float32) for k, v in state.items()}, strict=True)
    if res.missing_keys or res.unexpected_keys:
        raise SystemExit(f"load: missing {res.missing_keys}, unexpected {res.unexpected_keys}")
    return m.eval()


def evaluate_all(model_dir: Path, cfg: dict, trained: dict[str, torch.Tensor], windows: torch.Tensor) -> dict:
    import make_golden
    tdm.EXPERT_IMPL["name"] = "loop"
    res = {}
    t = time.time()
    bf16 = load_demo(cfg, trained)
    res["bf16"] = tdm.evaluate(bf16, windows, 4, autocast=False)
    fp8_state = demo_state_from_checkpoint(model_dir, cfg)
    fp8 = load_demo(cfg, fp8_state)
    res["fp8"] = tdm.evaluate(fp8, windows, 4, autocast=False)
    tdm.QUANT_ACT["on"] = True
    try:
        res["fp8_act"] = tdm.evaluate(fp8, windows, 4, autocast=False)
    finally:
        tdm.QUANT_ACT["on"] = False

    # transformers reads the written directory itself (make_golden's loader);
    # its logits must be this script's (same dequantized weights).
    _, hf = make_golden.build_hf_model(model_dir)
    S = windows.shape[1] - 2
    nll, n, worst = 0.0, 0, 0.0
    with torch.no_grad():
        for i in range(0, windows.shape[0], 4):
            w = windows[i:i + 4]
            lg = hf(input_ids=w[:, :S]).logits.float()
            ours = fp8.logits(w[:, :S])
            worst = max(worst, float((lg - ours).abs().max() / lg.abs().max()))
            nll += float(torch.nn.functional.cross_entropy(lg.reshape(-1, lg.shape[-1]), w[:, 1:S + 1].reshape(-1),
                                                           reduction="sum"))
            n += w[:, 1:S + 1].numel()
    res["transformers_fp8"] = {"loss": nll / n, "max_rel_diff_vs_ours": worst}
    if worst > 1e-4:
        raise SystemExit(f"transformers' Glm4MoeForCausalLM on the written checkpoint differs from this "
                         f"implementation by {worst:.3g} (relative): architecture or weight mapping mismatch")
    res["seconds"] = round(time.time() - t, 1)
    return res, fp8


# ---------------------------------------------------------------- README


def human(n: float) -> str:
    return f"{n / 1e6:.2f} MB"


def write_readme(out: Path, config: dict, log: dict, ev: dict, ckpt_bytes: int, params: dict) -> None:
    corpus = log.get("corpus", {})
    fin = log.get("final", {})
    args = log.get("args", {})
    cmd = "python3 scripts/train_demo_model.py " + " ".join(log.get("argv", []))
    files = sorted(p.name for p in out.iterdir() if p.is_file())
    size = sum((out / f).stat().st_size for f in files if f != "README.md")
    sample = ""
    if "glmctl" in ev:
        g = ev["glmctl"]
        sample = (f"\nwhich printed, at export ({g['tokens']} tokens; the prompt, then the continuation):\n\n"
                  f"```go\n{DEMO_PROMPT}{g['text']}\n```\n")
    text = f"""# demo-go: a tiny GLM-4.7 that writes Go

A {params['total'] / 1e6:.1f}M-parameter model with exactly the GLM-4.7 architecture
(`Glm4MoeForCausalLM`: q/k RMSNorm, partial NeoX RoPE, attention biases, a dense first
layer, sigmoid-routed MoE with `e_score_correction_bias`, one shared expert, untied
embedding and lm_head, and the MTP layer), trained from scratch on the Go standard library's
source and stored in the GLM-4.7-FP8 checkpoint layout. It continues Go code:

```
glmctl generate --model testdata/models/demo-go --backend cpu --temperature 0 --max-tokens 128 \\
  $'{DEMO_PROMPT.encode('unicode_escape').decode()}'
```
{sample}

It is a demo and a test fixture: the code it writes looks like Go and is often locally
sensible, but it does not compile in general. It has no chat ability (the chat template is
GLM-4.7's, the model never saw it): use raw prompts.

## Architecture

| field | value |
|---|---|
| hidden_size | {config['hidden_size']} |
| layers | {config['num_hidden_layers']} ({config['first_k_dense_replace']} dense, intermediate {config['intermediate_size']}) + 1 MTP layer |
| attention | {config['num_attention_heads']} query heads, {config['num_key_value_heads']} KV heads, head_dim {config['head_dim']}, RoPE on {int(config['head_dim'] * config['partial_rotary_factor'])} dims, theta {config['rope_theta']} |
| MoE | {config['n_routed_experts']} routed experts (top-{config['num_experts_per_tok']}, intermediate {config['moe_intermediate_size']}), {config['n_shared_experts']} shared, routed_scaling_factor {config['routed_scaling_factor']} |
| vocab | {config['vocab_size']} (byte-level BPE, {corpus.get('bytes_per_token', '?')} bytes/token on the corpus; GLM's 36 special tokens at 4000..4035) |
| parameters | {params['total']:,} ({params['main']:,} main, {params['main_active_per_token']:,} active per token; MTP layer {params['mtp_layer']:,}) |
| checkpoint | {human(ckpt_bytes)} of safetensors in {NUM_SHARDS} shards, {human(size)} with the tokenizer |

Weights are FP8 E4M3 with one F32 scale per output row (compressed-tensors FP8_DYNAMIC,
channel strategy); embeddings, lm_head, norms, biases, routers and `eh_proj` are BF16,
`e_score_correction_bias` F32. The MTP layer is `model.layers.{config['num_hidden_layers']}.*`
with its own copies of the embedding and (FP8) head, as the GLM-4.7 release has.

## Provenance

* Corpus: `$(go env GOROOT)/src/**/*.go` of **{corpus.get('go_version', '?')}**, without testdata/,
  vendor/, generated files and data tables: {corpus.get('files_kept', '?')} files,
  {corpus.get('train_bytes', 0) / 1e6:.1f} MB for training ({corpus.get('train_tokens', 0):,} tokens) and
  {corpus.get('heldout_files', '?')} held-out files ({corpus.get('heldout_tokens', 0):,} tokens).
  The Go source is BSD-3-Clause, Copyright The Go Authors; its licence is `LICENSE` here.
* Tokenizer: byte-level BPE with GLM-4's pre-tokenizer, trained on the training files
  (`scripts/demo_corpus.py`).
* Training: `{cmd}` on {log.get('device_name', '?')} (torch {log.get('torch', '?')}),
  {log.get('date_utc', '?')}: {log.get('steps', 0):,} steps of {log.get('batch_size', '?')} x {log.get('seq_len', '?')}
  tokens ({log.get('tokens', 0):,} tokens, {log.get('train_seconds', 0):.0f} s, {log.get('tokens_per_second', 0):,} tokens/s),
  AdamW lr {args.get('lr')} cosine, MTP loss weight {args.get('mtp_weight')}, aux-loss-free expert
  balancing (bias step {args.get('bias_update')}), seed {args.get('seed')}.
* Export: `python3 scripts/export_demo_model.py` ({time.strftime('%Y-%m-%d', time.gmtime())}).
  How to regenerate: docs/demo-model.md.

## Measured

Cross-entropy in nats per token on {ev['bf16']['tokens']:,} held-out tokens (the MTP loss predicts
the token after next):

| weights | loss | top-1 | MTP loss | MTP top-1 |
|---|---|---|---|---|
| trained (BF16) | {ev['bf16']['loss']:.4f} | {ev['bf16']['acc']:.3f} | {ev['bf16']['mtp_loss']:.4f} | {ev['bf16']['mtp_acc']:.3f} |
| this checkpoint, FP8 weights | {ev['fp8']['loss']:.4f} | {ev['fp8']['acc']:.3f} | {ev['fp8']['mtp_loss']:.4f} | {ev['fp8']['mtp_acc']:.3f} |
| FP8 weights + per-token FP8 activations (GPU path) | {ev['fp8_act']['loss']:.4f} | {ev['fp8_act']['acc']:.3f} | {ev['fp8_act']['mtp_loss']:.4f} | {ev['fp8_act']['mtp_acc']:.3f} |

Training log: final train loss {fin.get('train_loss')}, MTP {fin.get('train_mtp_loss')}; held-out
(all {fin.get('heldout_tokens', 0):,} tokens, BF16) {fin.get('heldout_loss', float('nan')):.4f}, MTP
{fin.get('heldout_mtp_loss', float('nan')):.4f}. transformers' `Glm4MoeForCausalLM` on this directory
gives loss {ev['transformers_fp8']['loss']:.4f} (logits within {ev['transformers_fp8']['max_rel_diff_vs_ours']:.1e}
of the export script's forward).
"""
    (out / "README.md").write_text(text)


def run_glmctl(binary: str, out: Path, fp8: tdm.GLMDemo, stop: set[int]) -> dict:
    """glmctl inspect, then a greedy CPU generate compared token by token with this script's
    forward of the same FP8 weights (the CPU backend's default path is the exact one)."""
    print(f"$ {binary} inspect {out}")
    r = subprocess.run([binary, "inspect", str(out)], capture_output=True, text=True)
    verdict = [ln for ln in r.stdout.splitlines() if ln.startswith("Verdict")]
    print("\n".join(verdict) or r.stdout[-2000:])
    if r.returncode:
        print(r.stdout[-3000:] + r.stderr[-2000:])
        raise SystemExit(f"glmctl inspect failed ({r.returncode})")
    n = 96
    cmd = [binary, "generate", "--model", str(out), "--backend", "cpu", "--temperature", "0",
           "--max-tokens", str(n), "--json", "--", DEMO_PROMPT]
    print("$ " + " ".join(cmd[:-1]) + " " + repr(DEMO_PROMPT))
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        print(r.stdout[-2000:] + r.stderr[-2000:])
        raise SystemExit(f"glmctl generate failed ({r.returncode})")
    res = json.loads(r.stdout)
    print(DEMO_PROMPT + "\u2588" + res["text"])
    ours = tdm.greedy(fp8, res["prompt_token_ids"], len(res["token_ids"]), 4096, stop, autocast=False)
    same = 0
    for a, b in zip(ours, res["token_ids"]):
        if a != b:
            break
        same += 1
    print(f"glmctl CPU greedy vs this script's FP8 forward: first {same} of {len(res['token_ids'])} tokens agree")
    return {"tokens": len(res["token_ids"]), "agree_prefix": same, "text": res["text"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--state", type=Path, required=True, help="train_demo_model.py's output directory")
    ap.add_argument("--out", type=Path, default=REPO / "testdata" / "models" / "demo-go")
    ap.add_argument("--tokenizer", type=Path, default=REPO / ".bundle" / "demo-go-tokenizer")
    ap.add_argument("--corpus", type=Path, default=REPO / ".bundle" / "demo-corpus.npy")
    ap.add_argument("--eval-windows", type=int, default=24, help="held-out windows for the loss comparison")
    ap.add_argument("--eval-seq-len", type=int, default=512)
    ap.add_argument("--max-bytes", type=int, default=MAX_CHECKPOINT_BYTES)
    ap.add_argument("--glmctl", default=None, help="glmctl binary: run inspect and a greedy generate after export")
    args = ap.parse_args()

    mtm.self_test()
    state = load_file(str(args.state / tdm.STATE_FILE))
    cfg = json.loads((args.state / tdm.CONFIG_FILE).read_text())
    log_path = args.state / tdm.LOG_FILE
    log = json.loads(log_path.read_text()) if log_path.is_file() else {}
    specials = mtm.special_token_ids(args.tokenizer)
    config = make_demo_config(cfg, specials)
    params = tdm.count_params(load_demo(cfg, state))

    ts, mtp_names = build_tensors(state, cfg)
    ckpt_bytes = write_checkpoint(ts, mtp_names, config, args.out, args.tokenizer)
    print(f"wrote {len(ts.tensors)} tensors ({len(mtp_names)} MTP), {human(ckpt_bytes)} of safetensors -> {args.out}")
    if ckpt_bytes > args.max_bytes:
        raise SystemExit(f"checkpoint is {ckpt_bytes:,} bytes, over the {args.max_bytes:,} limit")

    corpus = tdm.Corpus(args.corpus, args.corpus.with_suffix(".json"), torch.device("cpu"))
    windows = corpus.heldout_windows(args.eval_seq_len)
    if args.eval_windows and windows.shape[0] > args.eval_windows:
        pick = np.linspace(0, windows.shape[0] - 1, args.eval_windows).round().astype(np.int64)
        windows = windows[torch.from_numpy(pick)]
    ev, fp8 = evaluate_all(args.out, cfg, state, windows)
    for k in ("bf16", "fp8", "fp8_act"):
        e = ev[k]
        print(f"held-out {k:8s} loss {e['loss']:.4f} top-1 {e['acc']:.3f}  MTP loss {e['mtp_loss']:.4f} "
              f"top-1 {e['mtp_acc']:.3f}  ({e['tokens']:,} tokens)")
    print(f"transformers (FP8 checkpoint) loss {ev['transformers_fp8']['loss']:.4f}, "
          f"max rel diff vs ours {ev['transformers_fp8']['max_rel_diff_vs_ours']:.2e}  [{ev['seconds']} s]")
    if args.glmctl:
        ev["glmctl"] = run_glmctl(args.glmctl, args.out, fp8, set(config["eos_token_id"]))
    write_readme(args.out, config, log, ev, ckpt_bytes, params)
    total = sum(p.stat().st_size for p in args.out.iterdir() if p.is_file())
    print(f"{args.out}: {len(list(args.out.iterdir()))} files, {human(total)}")
    print(json.dumps({k: v for k, v in ev.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
