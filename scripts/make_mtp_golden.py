#!/usr/bin/env python3
"""Golden draft logits of a checkpoint's MTP ("nextn") layer, from the float64 numpy
reference (glm_numpy_ref.numpy_mtp_logits; docs/speculative.md "The draft model").

Usage:
    python3 scripts/make_mtp_golden.py --model testdata/models/tiny-f32 \
        --out testdata/models/tiny-f32.mtp.golden.json [--seed N]

For every case (a token sequence t_0..t_{S-1}) and every position i in 0..S-2, the
draft logits computed from the target's final-normed hidden state h_i and the token
t_{i+1}, at position i, with the MTP layer's own causal KV over positions 0..i. Full
logit rows would make the file large, so each row is summarised:

    argmax, margin   top-1 id and top-1 minus top-2 logit
    lse              log-sum-exp of the row
    l2, max_abs      Euclidean norm and largest magnitude of the row
    proj             sum_v logits[v] * r(v), r(v) = ((v * 2654435761) mod 2^32) / 2^32 - 0.5
    ids, logits      the logits at the row's 5 best ids and at the file's probe_ids

pkg/backend/cpu's TestMTPGolden compares the CPU backend's draft logits (exact
float32 path) with these. Needs only numpy.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from glm_numpy_ref import load_numpy_float64, numpy_mtp_logits  # noqa: E402  (same directory)

# Case lengths: short, a few block boundaries (16-token KV blocks) apart.
LENGTHS = (2, 7, 18, 35)
TOP_IDS = 5
PROBES = 6


def proj_weights(vocab: int) -> np.ndarray:
    v = np.arange(vocab, dtype=np.uint64)
    return ((v * np.uint64(2654435761)) % np.uint64(1 << 32)).astype(np.float64) / 2.0 ** 32 - 0.5


def summarise(row: np.ndarray, probes: list[int], r: np.ndarray) -> dict:
    order = np.argsort(-row, kind="stable")
    top = [int(i) for i in order[:TOP_IDS]]
    ids = top + [p for p in probes if p not in top]
    m = row.max()
    return {
        "argmax": top[0],
        "margin": float(row[order[0]] - row[order[1]]),
        "lse": float(m + math.log(np.exp(row - m).sum())),
        "l2": float(np.sqrt((row * row).sum())),
        "max_abs": float(np.abs(row).max()),
        "proj": float(row @ r),
        "ids": ids,
        "logits": [float(row[i]) for i in ids],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--prompt", action="append", default=[],
                    help="extra case: comma-separated token ids (e.g. a tokenized Go snippet for demo-go)")
    args = ap.parse_args()
    try:
        cfg = json.loads((args.model / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        sys.exit(f"read {args.model}/config.json: {exc}")
    if cfg.get("num_nextn_predict_layers", 0) < 1:
        sys.exit(f"{args.model}: num_nextn_predict_layers is 0, no MTP layer")
    w = load_numpy_float64(args.model)
    vocab = cfg["vocab_size"]
    # Ordinary tokens: below the lowest special (eos / pad) id.
    specials = cfg.get("eos_token_id", [])
    specials = specials if isinstance(specials, list) else [specials]
    ordinary = min([vocab] + [int(s) for s in specials] + [int(cfg.get("pad_token_id") or vocab)])
    rng = random.Random(args.seed)
    probes = sorted(rng.sample(range(ordinary), PROBES))
    cases = [[rng.randrange(ordinary) for _ in range(n)] for n in LENGTHS]
    for p in args.prompt:
        cases.append([int(x) for x in p.split(",")])
    r = proj_weights(vocab)
    out_cases = []
    for ids in cases:
        logits = numpy_mtp_logits(cfg, w, ids)
        out_cases.append({"token_ids": ids, "positions": [summarise(row, probes, r) for row in logits]})
        print(f"case of {len(ids)} tokens: draft argmax {[int(a) for a in logits.argmax(-1)]}", file=sys.stderr)
    doc = {
        "model": args.model.name,
        "reference": f"scripts/make_mtp_golden.py: glm_numpy_ref.numpy_mtp_logits, float64 numpy {np.__version__}",
        "proj_rule": "sum_v logits[v] * (((v * 2654435761) mod 2^32) / 2^32 - 0.5)",
        "probe_ids": probes,
        "cases": out_cases,
    }
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes, {len(out_cases)} cases)", file=sys.stderr)


if __name__ == "__main__":
    main()
