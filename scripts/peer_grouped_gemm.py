#!/usr/bin/env python3
"""peer_grouped_gemm.py — PyTorch FP8 GEMMs on the shapes of `grouped_check --bench`.

The GLM-4.7 rank MoE GEMMs (one GPU of 8: 20 local experts; gate|up [3072, 5120],
down [5120, 1536]) for M = 512 .. 16384 rows spread multinomially over the 20 experts,
through torch._scaled_mm (FP8 e4m3 x e4m3, row-wise scales: scale_a [rows, 1] and
scale_b [1, N] FP32, as gemm_fp8_grouped_tc's x_scale / w_scale):

  per-expert  one _scaled_mm per non-empty expert ([rows_e, K] x [K, N], rows_e padded
              up to a multiple of 16, which cuBLASLt's row-wise FP8 GEMM needs), the 20 calls
              captured in a CUDA graph (no Python launch gaps), the experts' weights
              rotating over copies (>= 200 MB in all, so L2 never holds them);
  grouped     torch._scaled_grouped_mm: the same rows in one launch ([M, K] x [E, K, N]
              with offs, row-wise scales; PyTorch's CUTLASS/FBGEMM grouped FP8 GEMM on
              sm_90, BF16 out, fast accumulation as gemm_fp8_grouped_tc's default tile),
              the experts' weights rotating as per-expert; "-" where this PyTorch lacks it;
  dense       one _scaled_mm of [M, K] x [K, N] (one weight matrix: the upper bound a
              grouped kernel could reach with every row in one group; at decode sizes
              the shared expert's dense GEMM), the 20 experts' matrices in turn in a
              CUDA graph so that L2 does not hold the weights.

--ms 16,64,128,256 gives decode-sized rows (the runtime's tensor-core streaming GEMMs,
`stream_tc_check --experts`, and the shared expert past 64 rows).

Timed with CUDA events, median of N graph replays. FLOPs 2 * M * N * K (as grouped_check
counts them). Output dtype FP32 when _scaled_mm takes it with row-wise scales, else BF16
(printed). One line per shape, joinable with grouped_check's table on (gemm, M):

    gemm  M  per_expert_ms  TFLOP/s  grouped_ms  TFLOP/s  dense_ms  TFLOP/s  out

    python3 scripts/peer_grouped_gemm.py [--reps N] [--ms M,M,...] [--shapes a,b,...] [--json OUT]
"""
import argparse
import json
import statistics

import torch

E = 20
SHAPES = [("gate|up", 3072, 5120), ("down", 5120, 1536)]
# --shapes may also name the dense attention linears of a rank (their "dense"
# column is the peer of `stream_tc_check --dense-splits`; "per-expert" is
# meaningless for them).
ALL_SHAPES = SHAPES + [("q|k|v", 1792, 5120), ("o_proj", 5120, 1536)]
MS = [512, 1024, 2048, 4096, 8192, 16384]
ROTATE_BYTES = 200e6


def median_ms(fn, reps):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def graph_ms(fn, passes, reps):
    """ms of fn(0) .. fn(passes - 1) captured in one CUDA graph (run once on a side stream
    first, as capture wants), median over reps replays, per pass."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for p in range(passes):
            fn(p)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for p in range(passes):
            fn(p)
    ms = median_ms(g.replay, reps) / passes
    del g
    return ms


def pick_out_dtype(dev):
    """FP32 output if _scaled_mm takes it with row-wise scales, else BF16."""
    a = torch.zeros(16, 128, device=dev).to(torch.float8_e4m3fn)
    b = torch.zeros(128, 128, device=dev).to(torch.float8_e4m3fn)
    sa = torch.ones(16, 1, device=dev)
    sb = torch.ones(1, 128, device=dev)
    try:
        torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=torch.float32)
        return torch.float32
    except RuntimeError:
        return torch.bfloat16


def rand_fp8(shape, dev):
    # Random finite E4M3 values (no NaN codes), like the bench's device fill.
    return (torch.randn(shape, device=dev) * 8).clamp(-448, 448).to(torch.float8_e4m3fn)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json")
    ap.add_argument("--ms", help="comma-separated row counts (default: %s)" % ",".join(map(str, MS)))
    ap.add_argument("--shapes", help="comma-separated among %s (default: the first two)"
                    % ",".join(n for n, _, _ in ALL_SHAPES))
    args = ap.parse_args()
    ms = [int(v) for v in args.ms.split(",")] if args.ms else MS
    shapes = SHAPES
    if args.shapes:
        by_name = {n: (n, N, K) for n, N, K in ALL_SHAPES}
        unknown = [n for n in args.shapes.split(",") if n not in by_name]
        if unknown:
            ap.error("unknown shape(s): %s" % ",".join(unknown))
        shapes = [by_name[n] for n in args.shapes.split(",")]
    dev = "cuda"
    torch.manual_seed(0)
    out_dtype = pick_out_dtype(dev)
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, out {out_dtype}")
    print(f"{'gemm':8s} {'M':>6s} | {'expert ms':>9s} {'TFLOP/s':>8s} | {'grouped ms':>10s} {'TFLOP/s':>8s} | "
          f"{'dense ms':>9s} {'TFLOP/s':>8s}")
    rows = []
    x_all = rand_fp8((max(ms) + 16 * E, max(k for _, _, k in shapes)), dev)
    for name, N, K in shapes:
        wbytes = E * N * K
        copies = max(1, int(-(-ROTATE_BYTES // wbytes)))
        W = [rand_fp8((E, N, K), dev) for _ in range(copies)]
        ws = torch.full((1, N), 1 / 448, device=dev)
        for M in ms:
            counts = torch.bincount(torch.randint(0, E, (M,)), minlength=E).tolist()
            # cuBLASLt's row-wise-scaled FP8 GEMM refuses row counts that are not
            # multiples of 16: each expert's rows are padded up to one (at most 15
            # extra rows an expert, the analogue of a grouped kernel's partial tile).
            offs = [0]
            for c in counts:
                offs.append(offs[-1] + -(-c // 16) * 16)
            X = x_all[:max(M, offs[-1]), :K].contiguous()
            xs = torch.full((X.shape[0], 1), 1 / 448, device=dev)

            def per_expert(cp):
                for e in range(E):
                    lo, hi = offs[e], offs[e + 1]
                    if hi > lo:
                        torch._scaled_mm(X[lo:hi], W[cp][e].t(), scale_a=xs[lo:hi], scale_b=ws,
                                         out_dtype=out_dtype)

            # One graph holding a pass over every copy: replay / copies = one call.
            pe_ms = graph_ms(per_expert, copies, args.reps)

            # One _scaled_grouped_mm over the experts' rows (unpadded offsets;
            # padded ones where this PyTorch wants them aligned).
            gs = torch.full((E, N), 1 / 448, device=dev)
            gr_ms = None
            for aligned in (False, True):
                ends = offs[1:] if aligned else list(torch.tensor(counts).cumsum(0).tolist())
                rows_g = ends[-1]
                goffs = torch.tensor(ends, device=dev, dtype=torch.int32)
                Xg, xg = X[:rows_g], xs[:rows_g, 0].contiguous()

                def grouped(cp):
                    torch._scaled_grouped_mm(Xg, W[cp].transpose(-2, -1), xg, gs, offs=goffs,
                                             out_dtype=torch.bfloat16, use_fast_accum=True)
                try:
                    gr_ms = graph_ms(grouped, copies, args.reps)
                    break
                except (RuntimeError, AttributeError) as e:
                    if aligned:
                        print(f"  (_scaled_grouped_mm: {str(e).splitlines()[0][:120]})")

            def dense():
                for e in range(E):
                    torch._scaled_mm(X[:M], W[0][e].t(), scale_a=xs[:M], scale_b=ws, out_dtype=out_dtype)

            dense_ms = graph_ms(lambda _: dense(), 1, args.reps) / E
            flop = 2.0 * M * N * K
            r = {"gemm": name, "M": M, "per_expert_ms": pe_ms, "per_expert_tflops": flop / pe_ms / 1e9,
                 "grouped_ms": gr_ms, "grouped_tflops": flop / gr_ms / 1e9 if gr_ms else None,
                 "dense_ms": dense_ms, "dense_tflops": flop / dense_ms / 1e9, "out": str(out_dtype)}
            rows.append(r)
            gcol = f"{gr_ms:10.4f} {r['grouped_tflops']:8.1f}" if gr_ms else f"{'-':>10s} {'-':>8s}"
            print(f"{name:8s} {M:6d} | {pe_ms:9.4f} {r['per_expert_tflops']:8.1f} | {gcol} | {dense_ms:9.4f} "
                  f"{r['dense_tflops']:8.1f}", flush=True)
        del W
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
