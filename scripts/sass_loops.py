#!/usr/bin/env python3
"""sass_loops.py — the instruction mix of kernels' SASS and of their loops.

Reads `cuobjdump -sass` output (a file or stdin). For every function whose
mangled name contains FILTER (all without one): its instruction count and the
counts of a few telling opcodes (tensor-core instructions, R2UR moves into
uniform registers, FMUL, FADD, MUFU); then every loop (a backward branch) that
holds a tensor-core instruction: its static size and opcode mix. A loop's
static size over its tensor-core instructions is the issue cost per tile that
ncu's "issue slots busy" charges (docs/perf.md, fifteenth session: the prefill
attention kernel was issue-bound at 384 instructions for 12 wgmmas a tile).

    scripts/sass-report.sh build/cuda-dev/obj-90a/kernels/attention.o prefill_attn_ws
"""
import collections
import re
import sys

MMA = ("HGMMA", "QGMMA", "HMMA", "IMMA")


def opcode(text):
    parts = text.split()
    op = parts[1] if parts[0].startswith("@") and len(parts) > 1 else parts[0]
    return op.split(".")[0]


def report(sass, name_filter, max_loop):
    for func in sass.split("Function : ")[1:]:
        name = func.split("\n", 1)[0].strip()
        if name_filter and name_filter not in name:
            continue
        lines = re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", func)
        if not lines:
            continue
        addr = [int(a, 16) for a, _ in lines]
        text = [t.strip() for _, t in lines]
        ops = collections.Counter(opcode(t) for t in text)
        mma = sum(ops[m] for m in MMA)
        print(f"{name}\n  {len(text)} instructions; " +
              ", ".join(f"{k} {ops[k]}" for k in (*MMA, "R2UR", "FMUL", "FADD", "MUFU") if ops[k]))
        if not mma:
            continue
        seen = set()
        for i, t in enumerate(text):
            m = re.search(r"BRA (?:\w+, )?0x([0-9a-f]+)", t)
            if not m:
                continue
            lo = int(m.group(1), 16)
            if lo >= addr[i] or (lo, addr[i]) in seen:
                continue
            seen.add((lo, addr[i]))
            body = [x for a, x in zip(addr, text) if lo <= a <= addr[i]]
            c = collections.Counter(opcode(x) for x in body)
            n_mma = sum(c[m] for m in MMA)
            if n_mma == 0 or len(body) > max_loop:
                continue
            mix = ", ".join(f"{k} {v}" for k, v in c.most_common(12))
            print(f"  loop {lo:#x}-{addr[i]:#x}: {len(body)} instructions, {n_mma} MMA: {mix}")


def main():
    args = list(sys.argv[1:])
    max_loop = 1000
    if "--max-loop" in args:
        i = args.index("--max-loop")
        max_loop = int(args[i + 1])
        del args[i:i + 2]
    if len(args) > 2 or any(a in ("-h", "--help") for a in args):
        sys.exit("usage: sass_loops.py [SASS_FILE|-] [FUNCTION_FILTER] [--max-loop N]")
    src = args[0] if args else "-"
    sass = sys.stdin.read() if src == "-" else open(src).read()
    report(sass, args[1] if len(args) > 1 else "", max_loop)


if __name__ == "__main__":
    main()
