#!/usr/bin/env python3
"""ncu_summary.py — one line per profiled kernel from `ncu --page details` text.

For each kernel: duration (ns), DRAM / L2 / SM throughput (% of peak), achieved
and theoretical occupancy, eligible warps a scheduler, registers a thread, and
(when the profile asked for them with --metrics) the average cycles a warp
spends in each stall reason between two issued instructions; then ncu's own
hints with an estimated speedup above --hint-min percent. What a bandwidth
kernel is bound by shows here: SM% high and DRAM% low is an instruction stream
too long for its bytes (docs/perf.md, sixteenth session: the prefill SiLU);
low occupancy with long-scoreboard stalls is too few bytes in flight.

    scripts/ncu_summary.py NCU_DETAILS.txt [--hint-min 15]
"""
import argparse
import re
import sys

HEADER = re.compile(r"^  (\S.*\(\d+, \d+, \d+\)x\(\d+, \d+, \d+\).*)$", re.M)
FIELDS = [
    ("dur_ns", "Duration"),
    ("dram%", "DRAM Throughput"),
    ("l2%", "L2 Cache Throughput"),
    ("sm%", "Compute (SM) Throughput"),
    ("occ%", "Achieved Occupancy"),
    ("theo%", "Theoretical Occupancy"),
    ("elig", "Eligible Warps Per Scheduler"),
    ("regs", "Registers Per Thread"),
]
STALL = re.compile(r"smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio\s+\S*\s+([\d,.]+)")
HINT = re.compile(r"OPT\s+Est\. (?:Local )?Speedup: ([\d.]+)%\s*\n\s+(.*)")


def field(block, label):
    m = re.search(r"\n\s+" + re.escape(label) + r"\s+\S*\s+([\d,.]+)", block)
    return m.group(1).replace(",", "") if m else "-"


def summarize(text, hint_min):
    heads = list(HEADER.finditer(text))
    out = []
    for i, h in enumerate(heads):
        block = text[h.end(): heads[i + 1].start() if i + 1 < len(heads) else len(text)]
        name = h.group(1)
        name = name[: name.find("(")] if "(" in name else name
        out.append(name.strip()[:100])
        out.append("   " + " ".join(f"{k} {field(block, label)}" for k, label in FIELDS))
        stalls = STALL.findall(block)
        if stalls:
            out.append("   stalls " + " ".join(f"{k}={v}" for k, v in stalls))
        for m in HINT.finditer(block):
            if float(m.group(1)) >= hint_min:
                out.append(f"   * {m.group(1)}% {m.group(2).strip()[:110]}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("details", help="ncu --page details output (text)")
    ap.add_argument("--hint-min", type=float, default=15.0, help="show ncu hints from this estimated speedup (%%)")
    args = ap.parse_args()
    try:
        with open(args.details, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as e:
        print(f"ncu_summary: {e}", file=sys.stderr)
        return 2
    lines = summarize(text, args.hint_min)
    if not lines:
        print(f"ncu_summary: no profiled kernel found in {args.details}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
