#!/usr/bin/env python3
"""serve_load.py — closed-loop streaming load on a running glmctl server with
token-id prompts, for synthetic rank models whose vocabulary (a rank's share,
18,944 ids for rank 0/8) is smaller than any real tokenizer's: `glmctl bench
--url` makes its prompts from words through /tokenize, whose ids fall outside
it. Each of --concurrency workers sends --requests-each /v1/completions
requests in turn (prompt: --input-len random ids below --vocab, max_tokens =
min_tokens = --output-len, ignore_eos, stream, and with --stop S the stop
string S, which random text practically never contains) and counts the streamed
tokens; prints output tokens/s over the measured window and the p50 / p90
gap between a request's streamed tokens (TPOT as a client sees it).

    python3 scripts/serve_load.py --url http://127.0.0.1:8000 --concurrency 64
"""
import argparse
import json
import random
import threading
import time
import urllib.request


def one(url, model, ids, out_len, gaps, lock, stop=None):
    req_body = {"model": model, "prompt": ids, "max_tokens": out_len, "min_tokens": out_len,
                "ignore_eos": True, "stream": True, "temperature": 0}
    if stop:
        req_body["stop"] = [stop]
    body = json.dumps(req_body).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    n, last, mine = 0, None, []
    with urllib.request.urlopen(req, timeout=600) as resp:
        for raw in resp:
            line = raw.strip()
            if not line.startswith(b"data:") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if chunk.get("choices") and chunk["choices"][0].get("text") is not None:
                now = time.perf_counter()
                if last is not None:
                    mine.append(now - last)
                last = now
                n += 1
    with lock:
        gaps.extend(mine)
    return n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--requests-each", type=int, default=4)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=18944)
    ap.add_argument("--stop", default="", help="a stop string every request carries")
    a = ap.parse_args()
    model = json.load(urllib.request.urlopen(a.url + "/v1/models"))["data"][0]["id"]
    rng = random.Random(0)
    prompts = [[rng.randrange(1, a.vocab) for _ in range(a.input_len)]
               for _ in range(a.concurrency * (a.requests_each + 1))]
    gaps, lock, counts = [], threading.Lock(), [0] * a.concurrency
    # Warm-up: one request a worker (CUDA graphs, the allocator), not measured.
    ws = [threading.Thread(target=one, args=(a.url, model, prompts[i], 8, [], lock)) for i in range(a.concurrency)]
    [w.start() for w in ws]
    [w.join() for w in ws]

    def worker(i):
        for j in range(a.requests_each):
            counts[i] += one(a.url, model, prompts[a.concurrency * (j + 1) + i], a.output_len, gaps, lock, a.stop)

    t0 = time.perf_counter()
    ws = [threading.Thread(target=worker, args=(i,)) for i in range(a.concurrency)]
    [w.start() for w in ws]
    [w.join() for w in ws]
    dt = time.perf_counter() - t0
    gaps.sort()
    q = lambda p: 1e3 * gaps[min(len(gaps) - 1, int(p * len(gaps)))] if gaps else float("nan")
    print(f"concurrency {a.concurrency}{' (stop string)' if a.stop else ''}: {sum(counts)} tokens in {dt:.2f} s = {sum(counts) / dt:.0f} out tok/s; "
          f"token gap p50 {q(0.5):.2f} ms p90 {q(0.9):.2f} ms")


if __name__ == "__main__":
    main()
