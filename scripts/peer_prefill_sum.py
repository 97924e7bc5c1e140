#!/usr/bin/env python3
"""peer_prefill_sum.py — the peer kernels' time for a whole prompt of the GLM-4.7 rank share.

Issue 12's second target compares the prefill of an N-token prompt with "the sum of the peer
kernels' times (SDPA + cuBLASLt FP8 on the same shapes)". This measures that sum on this GPU,
per layer, for the synthetic `--rank 0/8` model (92 layers: 3 dense, 89 MoE; hidden 5,120;
12 query heads and 1 KV head of dim 128; dense and shared-expert intermediate 1,536; 20
routed experts at top-1, so N routed rows a MoE layer):

  attention   F.scaled_dot_product_attention, causal over the whole prompt, BF16, q [1, 12, N,
              128], k/v [1, 1, N, 128] with enable_gqa — the fastest of the cuDNN, flash and
              efficient backends that runs;
  q|k|v       torch._scaled_mm (FP8 e4m3, row-wise scales, BF16 out) [N, 5120] x [5120, 1792];
  o_proj      [N, 1536] x [1536, 5120];
  experts     gate|up [2N, 5120] x [5120, 3072] and down [2N, 1536] x [1536, 5120]: the routed
              and the shared expert's rows as ONE dense GEMM with one weight matrix (L2-resident
              after the first call) — faster than any grouped form, so the strictest peer;
  dense MLP   gate|up [N, 5120] x [5120, 3072], down [N, 1536] x [1536, 5120].

Norms, RoPE, the router, SiLU, the combine, lm_head and sampling have no peer and count zero.
Sum = 92 x (attention + q|k|v + o_proj) + 89 x experts + 3 x dense MLP. Each figure is the
median over --reps timings of --inner back-to-back calls between two CUDA events, divided by
--inner (launch gaps hidden, as in a real forward).

    python3 scripts/peer_prefill_sum.py [--prompts 2048,8192,32768] [--reps N] [--json OUT]
"""
import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from peer_prefill import timed  # scripts/ is the script's own directory on sys.path

LAYERS, DENSE = 92, 3
HIDDEN, HEADS, D = 5120, 12, 128
QKV_N = (HEADS + 2) * D  # 12 query heads, 1 key and 1 value head
INTER = 1536
FP8 = torch.float8_e4m3fn


def gemm_ms(m, n, k, reps, inner):
    a = (torch.randn(m, k, device="cuda") * 0.5).to(FP8)
    w = (torch.randn(n, k, device="cuda") * 0.5).to(FP8)  # [N, K] row-major = K x N column-major
    sa = torch.rand(m, 1, device="cuda") + 0.5
    sb = torch.rand(1, n, device="cuda") + 0.5
    return timed(lambda: torch._scaled_mm(a, w.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16), reps, inner)


def sdpa_ms(n, reps, inner):
    q = torch.randn(1, HEADS, n, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 1, n, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(1, 1, n, D, device="cuda", dtype=torch.bfloat16)
    best = None
    for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION),
                     ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
        try:
            with sdpa_kernel(be):
                ms = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True), reps, inner)
        except RuntimeError:
            continue
        if best is None or ms < best[0]:
            best = (ms, name)
    if best is None:
        raise RuntimeError(f"no SDPA backend runs a {n}-token causal prompt")
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", default="2048,8192,32768")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--json")
    args = ap.parse_args()
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"{'prompt':>7s} {'attn ms':>8s} {'backend':>9s} {'qkv':>7s} {'o_proj':>7s} {'exp g|u':>8s} {'exp down':>8s} "
          f"{'dense g|u':>9s} {'dense dn':>8s} {'sum ms':>8s}")
    rows = []
    for n in (int(x) for x in args.prompts.split(",")):
        inner = max(1, 16384 // n)
        attn, backend = sdpa_ms(n, args.reps, inner)
        qkv = gemm_ms(n, QKV_N, HIDDEN, args.reps, inner)
        o = gemm_ms(n, HIDDEN, HEADS * D, args.reps, inner)
        egu = gemm_ms(2 * n, 2 * INTER, HIDDEN, args.reps, inner)
        edn = gemm_ms(2 * n, HIDDEN, INTER, args.reps, inner)
        dgu = gemm_ms(n, 2 * INTER, HIDDEN, args.reps, inner)
        ddn = gemm_ms(n, HIDDEN, INTER, args.reps, inner)
        total = LAYERS * (attn + qkv + o) + (LAYERS - DENSE) * (egu + edn) + DENSE * (dgu + ddn)
        print(f"{n:7d} {attn:8.4f} {backend:>9s} {qkv:7.4f} {o:7.4f} {egu:8.4f} {edn:8.4f} {dgu:9.4f} {ddn:8.4f} {total:8.2f}",
              flush=True)
        rows.append({"prompt": n, "attention_ms": attn, "attention_backend": backend, "qkv_ms": qkv, "o_proj_ms": o,
                     "experts_gate_up_ms": egu, "experts_down_ms": edn, "dense_gate_up_ms": dgu, "dense_down_ms": ddn,
                     "sum_ms": total})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
