#!/usr/bin/env python3
"""peer_attention.py — PyTorch SDPA decode attention on the shapes of `attn_check --bench`.

One query token per sequence, 12 query heads on 1 KV head (GLM-4.7 at TP8), head_dim 128,
BF16: q [B, 12, 1, 128], k/v [B, 1, ctx, 128], F.scaled_dot_product_attention(...,
enable_gqa=True) with the flash backend (the efficient backend if flash refuses the shape,
then the efficient backend on k/v expanded to 12 heads). Timed as attn_check times
attention_decode: 20 calls captured in one CUDA graph, the graphs replayed after a warm-up,
median replay / 20, CUDA events; the KV tensors rotate over copies (>= 200 MB in all) so
that L2 never holds them. One line per shape, in attn_check's order, joinable on `shape`:

    shape        sdpa_us  sdpa_TB/s  backend

    python3 scripts/peer_attention.py [--json OUT] [--reps N] [--shapes b1_c2048,b16_c8192]
                                      [--all-backends]

--all-backends: one line per backend that runs on the shape (flash, efficient, cuDNN, each
on the GQA call and on K/V expanded to 12 heads), the fastest marked `best`: the peer a
user of PyTorch would get by picking the backend per shape (prefill's cuDNN backend was
1.7-1.9x faster than flash, docs/perf.md 2026-11-28).
"""
import argparse
import json
import math
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

PEAK_TBS = 4.46
HEADS, D = 12, 128
ROTATE_BYTES = 200e6
CALLS_PER_GRAPH = 20


def bench_shapes():
    out = []
    for b in (1, 4, 16, 64, 128, 256):
        for c in (1024, 2048, 4096, 8192, 16384):
            out.append((b, c))
        if b <= 16:
            out.append((b, 32768))
    # Around attention_decode's short context class's bound (as attn_check).
    out += [(16, c) for c in (3072, 5120, 6144)]
    return out


def kv_bytes(b, c):
    return b * c * 2 * D * 2


# The default order (first that runs); --all-backends times every one that runs.
BACKENDS = [
    (SDPBackend.FLASH_ATTENTION, "gqa", "flash"),
    (SDPBackend.EFFICIENT_ATTENTION, "gqa", "efficient"),
    (SDPBackend.EFFICIENT_ATTENTION, "expand", "efficient-expand"),
    (SDPBackend.CUDNN_ATTENTION, "gqa", "cudnn"),
    (SDPBackend.CUDNN_ATTENTION, "expand", "cudnn-expand"),
    (SDPBackend.FLASH_ATTENTION, "expand", "flash-expand"),
]


def runs(backend, mode, q, k, v):
    try:
        with sdpa_kernel(backend):
            call(q, k, v, mode)
        torch.cuda.synchronize()
        return True
    except RuntimeError:
        return False


def pick_backend(q, k, v):
    """The first (backend, mode) of the default three that runs this shape."""
    for backend, mode, name in BACKENDS[:3]:
        if runs(backend, mode, q, k, v):
            return backend, mode, name
    raise RuntimeError("no SDPA backend takes this shape")


def call(q, k, v, mode):
    if mode == "gqa":
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    b, _, c, d = k.shape
    return F.scaled_dot_product_attention(q, k.expand(b, HEADS, c, d), v.expand(b, HEADS, c, d))


def time_shape(b, c, reps, all_backends=False):
    """[(us, TB/s, name)]: the default backend's, or every backend's that runs."""
    nbytes = kv_bytes(b, c)
    copies = 1 if nbytes >= ROTATE_BYTES else math.ceil(ROTATE_BYTES / nbytes)
    q = torch.randn(b, HEADS, 1, D, device="cuda", dtype=torch.bfloat16)
    ks = [torch.randn(b, 1, c, D, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    vs = [torch.randn(b, 1, c, D, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    if all_backends:
        picks = [(be, mode, name) for be, mode, name in BACKENDS if runs(be, mode, q, ks[0], vs[0])]
    else:
        picks = [pick_backend(q, ks[0], vs[0])]
    out = [time_backend(q, ks, vs, copies, nbytes, reps, *p) for p in picks]
    del ks, vs, q
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return out


def time_backend(q, ks, vs, copies, nbytes, reps, backend, mode, name):
    n_graphs = (copies + CALLS_PER_GRAPH - 1) // CALLS_PER_GRAPH
    graphs = []
    with sdpa_kernel(backend):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for i in range(3):
                call(q, ks[i % copies], vs[i % copies], mode)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        pool = None
        for gi in range(n_graphs):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                for i in range(CALLS_PER_GRAPH):
                    j = (gi * CALLS_PER_GRAPH + i) % copies
                    call(q, ks[j], vs[j], mode)
            pool = g.pool()
            graphs.append(g)
    for g in graphs:  # warm-up round
        g.replay()
    torch.cuda.synchronize()
    times = []
    e0 = torch.cuda.Event(enable_timing=True)
    e1 = torch.cuda.Event(enable_timing=True)
    for r in range(max(reps, n_graphs)):
        e0.record()
        graphs[r % n_graphs].replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    us = statistics.median(times) * 1000.0 / CALLS_PER_GRAPH
    del graphs
    torch.cuda.synchronize()
    return us, nbytes / (us * 1e-6) / 1e12, name


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", metavar="OUT", help="write the numbers as JSON")
    ap.add_argument("--reps", type=int, default=30, help="graph replays per shape (default 30)")
    ap.add_argument("--shapes", help="comma-separated subset, e.g. b1_c2048,b64_c8192")
    ap.add_argument("--all-backends", action="store_true",
                    help="time every SDPA backend that runs on a shape; the JSON row is the fastest")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("peer_attention: no CUDA device")
    torch.manual_seed(0)
    want = set(args.shapes.split(",")) if args.shapes else None
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("SDPA decode: q [B,12,1,128] bf16, k/v [B,1,ctx,128] bf16, enable_gqa; "
          f"{CALLS_PER_GRAPH} calls per CUDA graph, median of replays; peak {PEAK_TBS} TB/s")
    print(f"{'shape':<12} {'sdpa_us':>9} {'sdpa_TB/s':>9} {'%peak':>7}  backend")
    rows = []
    for b, c in bench_shapes():
        shape = f"b{b}_c{c}"
        if want is not None and shape not in want:
            continue
        res = time_shape(b, c, args.reps, args.all_backends)
        best = min(res)
        for us, tbs, name in res:
            mark = "  best" if args.all_backends and (us, tbs, name) == best else ""
            print(f"{shape:<12} {us:9.2f} {tbs:9.3f} {100 * tbs / PEAK_TBS:6.1f}%  {name}{mark}", flush=True)
        us, tbs, name = best
        rows.append({"shape": shape, "batch": b, "ctx": c, "kv_mb": kv_bytes(b, c) / 1e6,
                     "sdpa_us": round(us, 3), "sdpa_tbs": round(tbs, 4), "backend": name})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows},
                      f, indent=1)


if __name__ == "__main__":
    main()
