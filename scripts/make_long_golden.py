#!/usr/bin/env python3
"""Long-context golden file for a tiny GLM-4.7-FP8-layout checkpoint (numpy float64 only).

Usage:
    python3 scripts/make_long_golden.py --model testdata/models/tiny-f32 \
        --out testdata/models/tiny-f32.long.golden.json [--len 3000] [--seed 7]

One case: a prompt of --len random ordinary token ids (< 1000), its last-position logits and a
16-token greedy continuation by teacher forcing, in the format of make_golden.py. The
reference is the independent float64 forward of scripts/glm_numpy_ref.py (the one make_golden
checks transformers against, agreeing to < 2e-5 on every short case), so no torch is needed.
It checks what the short cases cannot: RoPE angles and attention over thousands of positions,
KV pages past the first hundred, and prefill chunking (an engine's step budget splits the
prompt). A prompt whose greedy margins fall below 1e-3 (a float32 engine might flip them) is
redrawn. Routing decisions are not screened: over thousands of tokens some expert choices sit
within FP8 noise, so this file is for the exact (float32) paths; the FP8 paths are compared
against it only loosely (docs/golden.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from glm_numpy_ref import load_numpy_float64, numpy_forward  # noqa: E402

STEPS = 16
MIN_GREEDY_MARGIN = 1e-3
MAX_REDRAWS = 20


def f32_json(x: float) -> float:
    return float(np.format_float_positional(np.float32(x), unique=True, trim="0"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--len", type=int, default=3000, help="prompt tokens (default 3000)")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    with (args.model / "config.json").open() as f:
        cfg = json.load(f)
    if args.len < 1 or args.len + STEPS > cfg["max_position_embeddings"]:
        sys.exit(f"--len {args.len}: prompt + {STEPS} greedy tokens must fit max_position_embeddings "
                 f"{cfg['max_position_embeddings']}")
    w = load_numpy_float64(args.model)
    rng = np.random.Generator(np.random.PCG64(args.seed))
    for draw in range(MAX_REDRAWS):
        prompt = [int(x) for x in rng.integers(0, 1000, args.len)]
        ids = list(prompt)
        last, tokens, margins = None, [], []
        for step in range(STEPS):
            logits = numpy_forward(cfg, w, ids)
            if step == 0:
                last = logits
            top2 = np.argsort(-logits, kind="stable")[:2]
            margin = float(logits[top2[0]] - logits[top2[1]])
            if margin < MIN_GREEDY_MARGIN:
                break
            tokens.append(int(top2[0]))
            margins.append(margin)
            ids.append(int(top2[0]))
            print(f"  draw {draw + 1} step {step}: token {top2[0]}, margin {margin:.4g}", flush=True)
        if len(tokens) == STEPS:
            break
        print(f"  draw {draw + 1}: greedy margin below {MIN_GREEDY_MARGIN} at step {len(tokens)}: redrawn")
    else:
        sys.exit(f"no prompt with every greedy margin >= {MIN_GREEDY_MARGIN} in {MAX_REDRAWS} draws")
    doc = {
        "model": args.model.resolve().name,
        "reference": f"numpy {np.__version__} float64 forward (scripts/glm_numpy_ref.py), "
                     f"dequantized FP8 weights; long-context case ({args.len} tokens, seed {args.seed})",
        "cases": [{
            "prompt_token_ids": prompt,
            "last_logits": [f32_json(x) for x in last.tolist()],
            "greedy_token_ids": tokens,
            "greedy_margins": [f32_json(x) for x in margins],
        }],
    }
    args.out.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    print(f"  wrote {args.out} ({args.out.stat().st_size / 1e3:.0f} kB), min margin {min(margins):.4g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
