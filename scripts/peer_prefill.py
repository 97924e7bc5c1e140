#!/usr/bin/env python3
"""peer_prefill.py — PyTorch SDPA causal prefill attention on the shapes of `prefill_check --bench`.

12 query heads on 1 KV head (GLM-4.7 at TP8), head_dim 128, BF16: q [B, 12, Lq, 128],
k/v [B, 1, Lk, 128], F.scaled_dot_product_attention(..., enable_gqa=True) with the flash
backend (then the efficient one if flash refuses). A whole prompt is is_causal=True; a chunk
after earlier context (Lq < Lk) uses the lower-right causal bias (query i sees keys
<= Lk - Lq + i), as the engine's chunked prefill does. Timed with CUDA events: the median
of N timings of 4-32 back-to-back calls (bench_inner), divided, after warm-up. FLOPs counted as prefill_check counts them: 4 * 128 * heads * the keys
each query sees, summed. One line per shape, joinable on `shape`:

    shape        sdpa_ms  sdpa_TFLOP/s  backend

    python3 scripts/peer_prefill.py [--json OUT] [--reps N] [--all-backends]

--all-backends: one line per backend that runs on the shape (flash, efficient,
cudnn with enable_gqa, and flash / cudnn with K/V expanded to the 12 query heads,
as a model that repeats its KV heads calls it).
"""
import argparse
import json
import math
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

HEADS, D = 12, 128


def shapes():
    out = [(f"prompt_{n}", 1, n, 0) for n in (512, 1024, 2048, 4096, 8192, 16384, 32768)]
    out.append(("chunk_2048_at_14336", 1, 2048, 14336))
    out.append(("batch8_prompt_1024", 8, 1024, 0))
    return out


def flops(batch, lq, start):
    keys = lq * start + lq * (lq + 1) / 2
    return 4.0 * D * HEADS * keys * batch


def bench_inner(fl):
    """Calls one timing spans: ~0.2 TFLOP of attention, 4 to 32 (prefill_check's
    bench_inner: the same rule). One call at a time, SDPA's host-side dispatch
    (tens of microseconds; cuDNN's plan lookup) runs while the GPU idles."""
    return int(min(32, max(4, math.ceil(2e11 / fl))))


def timed(fn, reps, inner=1):
    """Median ms of fn over reps timings of inner back-to-back calls between
    two CUDA events (each divided by inner), after a warm-up."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(inner):
            fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) / inner)
    return statistics.median(ts)


# (name, backend, KV heads expanded to the query heads): the default run tries
# the first two in order; --all-backends times every one that runs.
CONFIGS = (
    ("flash", SDPBackend.FLASH_ATTENTION, False),
    ("efficient", SDPBackend.EFFICIENT_ATTENTION, False),
    ("cudnn", SDPBackend.CUDNN_ATTENTION, False),
    ("flash/kv-expanded", SDPBackend.FLASH_ATTENTION, True),
    ("cudnn/kv-expanded", SDPBackend.CUDNN_ATTENTION, True),
)


def run(batch, lq, start, reps, every=False):
    """(ms, backend) of the first config that runs, or with every=True a list
    of (ms, backend) for every config that runs."""
    lk = start + lq
    q = torch.randn(batch, HEADS, lq, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, 1, lk, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(batch, 1, lk, D, device="cuda", dtype=torch.bfloat16)
    kx = k.expand(batch, HEADS, lk, D).contiguous() if every else None
    vx = v.expand(batch, HEADS, lk, D).contiguous() if every else None
    bias = causal_lower_right(lq, lk) if start else None

    def make(expanded):
        kk, vv = (kx, vx) if expanded else (k, v)
        gqa = not expanded
        if bias is None:
            return lambda: F.scaled_dot_product_attention(q, kk, vv, is_causal=True, enable_gqa=gqa)
        return lambda: F.scaled_dot_product_attention(q, kk, vv, attn_mask=bias, enable_gqa=gqa)

    out, last = [], None
    inner = bench_inner(flops(batch, lq, start))
    for name, be, expanded in CONFIGS if every else CONFIGS[:2]:
        try:
            with sdpa_kernel(be):
                ms = timed(make(expanded), reps, inner)
        except RuntimeError as err:
            last = err
            continue
        if not every:
            return ms, name
        out.append((ms, name))
    if not out:
        raise last
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--all-backends", action="store_true",
                    help="time every SDPA backend (flash, efficient, cudnn; GQA and KV expanded to 12 heads)")
    args = ap.parse_args()
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"{'shape':22s} {'sdpa_ms':>10s} {'TFLOP/s':>8s}  backend")
    rows = []
    for name, batch, lq, start in shapes():
        try:
            res = run(batch, lq, start, args.reps, args.all_backends)
        except RuntimeError as err:
            print(f"{name:22s} {'-':>10s} {'-':>8s}  failed: {str(err).splitlines()[0]}")
            continue
        for ms, be in res if args.all_backends else [res]:
            tf = flops(batch, lq, start) / (ms * 1e-3) / 1e12
            print(f"{name:22s} {ms:10.4f} {tf:8.1f}  {be}")
            rows.append({"shape": name, "sdpa_ms": ms, "sdpa_tflops": tf, "backend": be})
        sys.stdout.flush()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
