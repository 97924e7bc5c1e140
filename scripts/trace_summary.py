#!/usr/bin/env python3
"""trace_summary.py — where one decode step's GPU time goes, from the kernel
trace scripts/kernel_trace.c writes (start_ns,end_ns,stream,graph_node,grid,
block,smem,regs,name per kernel).

Steps are the runs of kernels between idle gaps of more than 200 us, or, where
steps run back to back (batch 1: the host's work for the next step overlaps the
GPU's), the runs from one embedding kernel (each forward's first) to the next;
the last whole one is summarised (--longest: the longest one with a router kernel, e.g.
a prefill step among decode steps). A kernel launched early (programmatic dependent
launch) starts while the kernel before runs, so its start-to-end time counts
that overlap; its "exclusive" time (from the end of the kernel before, or its
own start if later, to its own end) is its share of the step's critical path,
and the exclusive times sum to the step's span.

    python3 scripts/trace_summary.py [--longest] trace.csv
"""
import collections
import csv
import re
import sys


def short(name):
    """glmk kernels by function name and leading integer template arguments;
    others (cuBLASLt's nvjet kernels) by their first 44 characters."""
    if not name.startswith("_ZN4glmk"):
        return name[:44]
    s = name[len("_ZN4glmk"):]
    parts = []
    for _ in range(2):
        m = re.match(r"(\d+)", s)
        if not m:
            break
        n = int(m.group(1))
        parts.append(s[len(m.group(1)):len(m.group(1)) + n])
        s = s[len(m.group(1)) + n:]
    if not parts:
        return name[:44]
    fn = parts[1] if parts[0].startswith("_GLOBAL") and len(parts) > 1 else parts[0]
    args = re.findall(r"Li(\d+)E", s[:40])
    return fn + ("<" + ",".join(args[:3]) + ">" if s.startswith("I") and args else "")


def main(path, longest=False):
    rows = [r for r in csv.DictReader(open(path)) if r["start_ns"]]
    if not rows:
        sys.exit(f"{path}: no kernels recorded")
    t = sorted((int(r["start_ns"]), int(r["end_ns"]), short(r["name"]), r["grid"]) for r in rows)
    cuts = [i for i in range(1, len(t)) if t[i][0] - max(e for _, e, _, _ in t[max(0, i - 8):i]) > 200_000]
    if len(cuts) < 2:
        cuts = [i for i in range(len(t)) if t[i][2].startswith(("embed_kernel", "embed_vec_kernel"))]
    if len(cuts) < 2:
        sys.exit(f"{path}: fewer than two idle gaps or embedding kernels; no whole step to summarise")
    spans = list(zip(cuts, cuts[1:]))
    if longest:  # among forward steps (a router kernel in them: not weight generation)
        spans = [ab for ab in spans if any(k[2].startswith("router") for k in t[ab[0]:ab[1]])] or spans
    a, b = max(spans, key=lambda ab: t[ab[1] - 1][1] - t[ab[0]][0]) if longest else spans[-1]
    step = t[a:b]
    span = (max(e for _, e, _, _ in step) - step[0][0]) / 1000
    excl, full, cnt = collections.defaultdict(float), collections.defaultdict(float), collections.Counter()
    seq = []
    prev_end = step[0][0]
    for s, e, n, g in step:
        x = max(0, e - max(prev_end, s)) / 1000
        excl[n] += x
        full[n] += (e - s) / 1000
        cnt[n] += 1
        seq.append((n, x, (e - s) / 1000, g))
        prev_end = max(prev_end, e)
    print(f"{path}: step span {span:.0f} us, {len(step)} kernels")
    print(f"  {'kernel':44s} {'n':>5s} {'excl us':>8s} {'start-end':>9s} {'total excl':>10s} {'share':>6s}")
    for n in sorted(excl, key=lambda k: -excl[k]):
        print(f"  {n:44s} {cnt[n]:5d} {excl[n] / cnt[n]:8.2f} {full[n] / cnt[n]:9.2f} {excl[n]:10.0f} "
              f"{100 * excl[n] / span:5.1f}%")
    # A layer's landmark: its router, or at batch 1 its one-launch MoE half.
    routers = [i for i, r in enumerate(seq) if r[0].startswith("router")] or \
        [i for i, r in enumerate(seq) if r[0].startswith("moe_t1")]
    if routers:
        i = routers[len(routers) // 2]
        print(f"  one layer (around a middle {seq[i][0]}):")
        for n, x, f, g in seq[max(0, i - 6):i + 5]:
            print(f"    {n:44s} excl {x:6.2f}  start-end {f:6.2f}  grid {g}")


if __name__ == "__main__":
    args = sys.argv[1:]
    longest = "--longest" in args
    args = [x for x in args if x != "--longest"]
    if len(args) != 1:
        sys.exit("usage: trace_summary.py [--longest] TRACE.csv")
    main(args[0], longest)
