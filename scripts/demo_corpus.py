#!/usr/bin/env python3
"""Corpus and tokenizer of the bundled demo model (testdata/models/demo-go).

The corpus is the Go standard library's own source, $(go env GOROOT)/src/**/*.go
(BSD-3-Clause; $(go env GOROOT)/LICENSE is copied next to the model), minus:

* anything under a testdata/ or vendor/ directory (fixtures and third-party code);
* generated files (a line "// Code generated ... DO NOT EDIT.", the Go convention);
* data tables: files over MAX_FILE_BYTES, or whose characters are more than
  MAX_DIGIT_FRACTION digits (e.g. crypto/internal/fips140/nistec/p256_table.go);
* files that are not valid UTF-8 or contain a NUL byte.

_test.go files are kept: they are ordinary, readable Go.

Files are taken in sorted path order. About HELDOUT_PERCENT% of them (chosen by a
hash of the path, so the split does not depend on the file list) are held out
for evaluation; the tokenizer is trained on the training files only.

The tokenizer is built the way scripts/tokenizer_build_tiny.py builds
testdata/tokenizers/tiny-glm: a byte-level BPE with GLM-4's pre-tokenizer (the
GLM-4 Split regex, then ByteLevel without its own regex), ORDINARY_VOCAB
ordinary tokens, then GLM's 36 special tokens as added tokens in the real
table's order (ids ORDINARY_VOCAB..ORDINARY_VOCAB+35), GLM-4.7's chat template.
The model's vocab_size (VOCAB_SIZE) pads the table, as GLM's 151552 does.

Outputs (default --out .bundle, which git ignores):

    .bundle/demo-go-tokenizer/   tokenizer.json, tokenizer_config.json,
                                 chat_template.jinja, generation_config.json,
                                 LICENSE (the Go licence, the corpus's)
    .bundle/demo-corpus.npy      uint16 token ids: every training file, then
                                 every held-out file, each file followed by
                                 <|endoftext|>
    .bundle/demo-corpus.json     the split (train_tokens, heldout_tokens), corpus
                                 statistics, the Go version, token ids of the
                                 sample prompts, the special ids

Everything is deterministic (sorted file order, hash split, the BPE trainer is
deterministic for a given input order); the JSON records a SHA-256 of the
token array and of tokenizer.json.

Usage:
    python3 scripts/demo_corpus.py [--goroot DIR] [--out .bundle]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

try:
    from tokenizers import Tokenizer
except ImportError as exc:  # pragma: no cover - environment problem
    sys.exit(f"demo_corpus: needs tokenizers and numpy ({exc}); pip install -r scripts/requirements-demo.txt")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tokenizer_build_tiny import SPECIALS, train_glm_bpe  # noqa: E402  (the tiny tokenizer's tables and trainer)

ORDINARY_VOCAB = 4000
VOCAB_SIZE = 4096          # config.json vocab_size: ordinary + 36 specials, padded
MODEL_MAX_LENGTH = 4096    # tokenizer_config.json, = the model's max_position_embeddings
HELDOUT_PERCENT = 2
MAX_FILE_BYTES = 400 * 1000
MAX_DIGIT_FRACTION = 0.2
GENERATED = re.compile(r"^// Code generated .* DO NOT EDIT\.$", re.M)
REPO = Path(__file__).resolve().parent.parent
TEMPLATE = REPO / "testdata" / "tokenizers" / "templates" / "glm47" / "chat_template.jinja"

# Prompts the training script samples from (greedy) and the docs show. Stored
# pre-tokenised in demo-corpus.json so the GPU machine needs no tokenizer to
# encode them.
SAMPLE_PROMPTS = [
    "package main\n\nimport (\n\t\"fmt\"\n\t\"os\"\n)\n\nfunc main() {\n",
    "// Reverse returns a copy of s with its bytes in reverse order.\nfunc Reverse(s string) string {\n",
    "func (b *Buffer) WriteString(s string) (n int, err error) {\n",
    "\tfor i := 0; i < len(data); i++ {\n",
]


def go_env(name: str) -> str:
    try:
        return subprocess.run(["go", "env", name], check=True, capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as exc:
        sys.exit(f"demo_corpus: `go env {name}` failed ({exc}); pass --goroot")


def go_version(goroot: Path) -> str:
    first = (goroot / "VERSION").read_text().splitlines()[0].strip() if (goroot / "VERSION").is_file() else ""
    return first or go_env("GOVERSION")


def is_heldout(rel: str) -> bool:
    h = int.from_bytes(hashlib.sha256(rel.encode()).digest()[:8], "big")
    return h % 100 < HELDOUT_PERCENT


def collect(goroot: Path) -> tuple[list[tuple[str, str]], dict]:
    """(relative path, text) of every kept file in sorted order, plus skip counts."""
    src = goroot / "src"
    if not src.is_dir():
        sys.exit(f"demo_corpus: {src} is not a directory")
    paths = []
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames[:] = sorted(d for d in dirnames if d not in ("testdata", "vendor"))
        for fn in filenames:
            if fn.endswith(".go"):
                paths.append(Path(dirpath) / fn)
    paths.sort(key=lambda p: p.relative_to(src).as_posix())
    skipped = {"generated": 0, "too_large": 0, "data_table": 0, "not_utf8": 0}
    skipped_bytes = dict.fromkeys(skipped, 0)
    kept = []
    for p in paths:
        rel = "src/" + p.relative_to(src).as_posix()
        raw = p.read_bytes()
        why = None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is None or "\x00" in text:
            why = "not_utf8"
        elif GENERATED.search(text):
            why = "generated"
        elif len(raw) > MAX_FILE_BYTES:
            why = "too_large"
        elif text and sum(c.isdigit() for c in text) / len(text) > MAX_DIGIT_FRACTION:
            why = "data_table"
        if why:
            skipped[why] += 1
            skipped_bytes[why] += len(raw)
            continue
        kept.append((rel, text))
    return kept, {"files_seen": len(paths), "skipped_files": skipped, "skipped_bytes": skipped_bytes}


def train_tokenizer(texts: list[str]) -> Tokenizer:
    return train_glm_bpe(texts, ORDINARY_VOCAB, "demo_corpus", length=len(texts))


def special_ids() -> dict[str, int]:
    return {c: ORDINARY_VOCAB + i for i, (c, _) in enumerate(SPECIALS)}


def write_tokenizer_files(tok: Tokenizer, out_dir: Path, goroot: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"), pretty=False)
    shutil.copyfile(TEMPLATE, out_dir / "chat_template.jinja")
    decoder = {
        str(ORDINARY_VOCAB + i): {"content": c, "lstrip": False, "normalized": False, "rstrip": False,
                                  "single_word": False, "special": special}
        for i, (c, special) in enumerate(SPECIALS)
    }
    config = {
        "added_tokens_decoder": decoder,
        "additional_special_tokens": [c for c, _ in SPECIALS],
        "clean_up_tokenization_spaces": False,
        "do_lower_case": False,
        "eos_token": "<|endoftext|>",
        "extra_special_tokens": {},
        "model_max_length": MODEL_MAX_LENGTH,
        "pad_token": "<|endoftext|>",
        "padding_side": "left",
        "remove_space": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    ids = special_ids()
    gen = {
        "_from_model_config": True,
        "eos_token_id": [ids["<|endoftext|>"], ids["<|user|>"], ids["<|observation|>"]],
        "pad_token_id": ids["<|endoftext|>"],
        "temperature": 1.0,
    }
    (out_dir / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    lic = goroot / "LICENSE"
    if not lic.is_file():
        sys.exit(f"demo_corpus: {lic} not found (the corpus licence)")
    shutil.copyfile(lic, out_dir / "LICENSE")


def encode_files(tok: Tokenizer, texts: list[str], eos: int) -> np.ndarray:
    parts = []
    batch = 256
    for i in range(0, len(texts), batch):
        for enc in tok.encode_batch(texts[i:i + batch], add_special_tokens=False):
            ids = np.asarray(enc.ids, dtype=np.int64)
            parts.append(ids)
            parts.append(np.array([eos], dtype=np.int64))
    arr = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    if arr.size and arr.max() >= 65536:
        sys.exit("demo_corpus: token id does not fit uint16")
    return arr.astype(np.uint16)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--goroot", type=Path, default=None, help="Go root (default: go env GOROOT)")
    ap.add_argument("--out", type=Path, default=REPO / ".bundle", help="output directory (default .bundle)")
    args = ap.parse_args()
    goroot = args.goroot or Path(go_env("GOROOT"))
    version = go_version(goroot)
    t0 = time.time()

    files, stats = collect(goroot)
    train = [(r, t) for r, t in files if not is_heldout(r)]
    held = [(r, t) for r, t in files if is_heldout(r)]
    n_test = sum(r.endswith("_test.go") for r, _ in files)
    print(f"corpus: {version} at {goroot}: {stats['files_seen']} .go files outside testdata/vendor, "
          f"kept {len(files)} ({n_test} _test.go), skipped {stats['skipped_files']}")

    t1 = time.time()
    tok = train_tokenizer([t for _, t in train])
    print(f"tokenizer: {ORDINARY_VOCAB} BPE tokens + {len(SPECIALS)} specials trained in {time.time() - t1:.0f} s")

    tok_dir = args.out / "demo-go-tokenizer"
    write_tokenizer_files(tok, tok_dir, goroot)
    eos = special_ids()["<|endoftext|>"]
    t2 = time.time()
    train_ids = encode_files(tok, [t for _, t in train], eos)
    held_ids = encode_files(tok, [t for _, t in held], eos)
    print(f"encoded in {time.time() - t2:.0f} s")
    ids = np.concatenate([train_ids, held_ids])
    args.out.mkdir(parents=True, exist_ok=True)
    np.save(args.out / "demo-corpus.npy", ids)

    # Round trip: decoding must give back the text exactly (byte-level BPE).
    for rel, text in files[:: max(1, len(files) // 50)]:
        back = tok.decode(tok.encode(text, add_special_tokens=False).ids, skip_special_tokens=False)
        if back != text:
            sys.exit(f"demo_corpus: {rel} does not round-trip through the tokenizer")

    train_bytes = sum(len(t.encode()) for _, t in train)
    held_bytes = sum(len(t.encode()) for _, t in held)
    counts = np.bincount(ids, minlength=VOCAB_SIZE)
    meta = {
        "go_version": version,
        "goroot": str(goroot),
        "corpus": "$(go env GOROOT)/src/**/*.go minus testdata/, vendor/, generated files and data tables",
        "license": "BSD-3-Clause (the Go LICENSE, copied as LICENSE)",
        **stats,
        "files_kept": len(files),
        "test_files_kept": n_test,
        "train_files": len(train),
        "heldout_files": len(held),
        "heldout_paths": [r for r, _ in held],
        "train_bytes": train_bytes,
        "heldout_bytes": held_bytes,
        "train_tokens": int(train_ids.size),
        "heldout_tokens": int(held_ids.size),
        "bytes_per_token": round((train_bytes + held_bytes) / max(1, ids.size - len(files)), 4),
        "ordinary_vocab": ORDINARY_VOCAB,
        "vocab_size": VOCAB_SIZE,
        "unused_ordinary_tokens": int((counts[:ORDINARY_VOCAB] == 0).sum()),
        "special_ids": special_ids(),
        "eos_token_id": special_ids()["<|endoftext|>"],
        "sample_prompts": [{"text": p, "ids": tok.encode(p, add_special_tokens=False).ids} for p in SAMPLE_PROMPTS],
        "tokens_sha256": hashlib.sha256(ids.tobytes()).hexdigest(),
        "tokenizer_sha256": hashlib.sha256((tok_dir / "tokenizer.json").read_bytes()).hexdigest(),
        "params": {"heldout_percent": HELDOUT_PERCENT, "max_file_bytes": MAX_FILE_BYTES,
                   "max_digit_fraction": MAX_DIGIT_FRACTION},
    }
    (args.out / "demo-corpus.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"train: {len(train)} files, {train_bytes / 1e6:.1f} MB, {train_ids.size:,} tokens; "
          f"held out: {len(held)} files, {held_bytes / 1e6:.2f} MB, {held_ids.size:,} tokens; "
          f"{meta['bytes_per_token']} bytes/token")
    print(f"wrote {args.out / 'demo-corpus.npy'} ({ids.nbytes / 1e6:.1f} MB), {args.out / 'demo-corpus.json'}, "
          f"{tok_dir}/ in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
