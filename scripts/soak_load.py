#!/usr/bin/env python3
"""Load driver and report of the soak test (scripts/soak.sh, docs/reliability.md).

Two steps, both run by scripts/soak.sh with the project's venv python:

    soak_load.py run    --url http://127.0.0.1:P --pid PID --minutes M --concurrency C --out DIR
    soak_load.py report --out DIR --exit-status S

`run` drives a live `glmctl serve` for M minutes with C worker threads, each
sending a weighted mix of requests one after another: chat and completions,
streamed and not, random max_tokens (1..64) and sampling options, ~10% long
prompts (~1-2k tokens), ~10% client cancellations (a stream closed after a few
events, or a non-streamed request given up after a fraction of a second), ~10%
bad requests (each must get a 4xx with an OpenAI error body) and ~10% utility
routes (/tokenize, /detokenize, /health, /v1/models, /version). Every request
carries its own X-Request-Id (soak-N) and is classified:

    ok               2xx with a well-formed body (stream: events parse, [DONE] at the end)
    cancelled        the client gave up on purpose (cancellation requests only)
    4xx-expected     a bad request refused with a 4xx and an error body
    bad-accepted     a bad request answered 2xx (a validation gap)
    unexpected-4xx   a good request refused with a 4xx (429 included)
    5xx              a 5xx status
    stream-error     a 2xx stream carrying an error event, or without [DONE]
    bad-response     a 2xx whose body is not what the API promises
    transport-error  no response: connection refused/reset, broken stream  (LOST)
    timeout          no response within the read timeout                   (LOST)

A sampler thread reads the server's VmRSS (/proc/PID/status) and scrapes
/metrics (KV block gauges, queue, running, in-flight, goroutines, Go heap)
every --sample-interval seconds into samples.csv. After the load the driver
waits for the server to drain (nothing queued or running, no KV block used),
sends one more request, and scrapes /metrics a last time. It writes
requests.jsonl (one line per request), samples.csv, metrics-start.txt,
metrics-end.txt and run.json into --out.

`report` (after soak.sh has sent SIGTERM and collected the exit status)
matches every API request with the server's log line of the same request id
(server.log), applies the checks and prints the summary table; it writes
summary.json and exits 1 when a check fails: any lost request, any error
outcome, a KV block still used after the drain, RSS growth beyond
--rss-growth-max percent (median of the first minute after warm-up against
the median of the last minute), goroutines not back near their start, a
request missing from the server's log, or a non-zero exit status.

Needs only httpx (the openai client's HTTP library; the pinned venv ships it
as httpx2).
"""

import argparse
import csv
import json
import os
import random
import re
import statistics
import sys
import threading
import time

try:
    import httpx2 as httpx
except ImportError:  # plain httpx works the same
    import httpx

LOST = ("transport-error", "timeout")
ERRORS = ("bad-accepted", "unexpected-4xx", "5xx", "stream-error", "bad-response")
OUTCOMES = ("ok", "cancelled", "4xx-expected") + ERRORS + LOST
API_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/tokenize", "/detokenize")

WORDS = ("the of and to in is was for on that with as by at from his her are were this be it an "
         "which or had not but have one all their they he she we you there been has would more "
         "time about than so into other some could them these two may only first new any after "
         "engine kernel block cache token prompt stream server request memory batch tensor expert "
         "router attention layer norm scale weight queue sequence sample model context latency "
         "river mountain orange quiet yellow garden window paper winter music silver anchor "
         "海 山 世界 你好 数据 模型 こんにちは 안녕하세요 Привет мир ünïcödé café naïve 🙂 🚀 "
         "42 3.14 1e-9 {json} [list] <tag> \\n x=y+1; def f(a): return a*2").split()


def words(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100.0
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def parse_metrics(text):
    """Prometheus text -> {name or name{labels}: float}."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        try:
            key, val = line.rsplit(" ", 1)
            out[key] = float(val)
        except ValueError:
            continue
    return out


def http_requests_by_path(m):
    """glmctl_http_requests_total summed by path, and by (path, code)."""
    by_path, by_code = {}, {}
    for k, v in m.items():
        if not k.startswith("glmctl_http_requests_total{"):
            continue
        code = re.search(r'code="([^"]*)"', k).group(1)
        path = re.search(r'path="([^"]*)"', k).group(1)
        by_path[path] = by_path.get(path, 0) + v
        by_code[f"{path} {code}"] = by_code.get(f"{path} {code}", 0) + v
    return by_path, by_code


def read_rss_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


# ---------------------------------------------------------------- requests


class Driver:
    def __init__(self, args):
        self.args = args
        self.url = args.url.rstrip("/")
        self.model = None
        self.lock = threading.Lock()
        self.records = []
        self.counter = 0
        self.deadline = 0.0
        self.stop = threading.Event()
        self.timeout = httpx.Timeout(connect=10.0, read=args.request_timeout, write=30.0, pool=10.0)
        self.out = open(os.path.join(args.out, "requests.jsonl"), "w")

    def next_id(self):
        with self.lock:
            self.counter += 1
            return f"soak-{self.counter}"

    def record(self, rec):
        with self.lock:
            self.records.append(rec)
            self.out.write(json.dumps(rec) + "\n")

    # ---- request builders: each returns (kind, method, path, body, opts)

    def gen_body(self, rng, chat, stream, prompt_words, long_prompt=False):
        mt = rng.randint(1, 64)
        body = {"model": self.model, "max_tokens": mt}
        if rng.random() < 0.5:
            body["temperature"] = rng.choice([0, 0.3, 0.7, 1.0, 1.5])
        if rng.random() < 0.3:
            body["top_p"] = rng.choice([0.5, 0.9, 1.0])
        if rng.random() < 0.2:
            body["top_k"] = rng.choice([1, 5, 50])
        if rng.random() < 0.2:
            body["seed"] = rng.randint(0, 1 << 30)
        if rng.random() < 0.1:
            body["stop"] = rng.choice(["\n", ["the", "。"], "x"])
        if rng.random() < 0.1:
            body["ignore_eos"] = True
        if rng.random() < 0.1:
            body["frequency_penalty"] = 0.5
        if stream:
            body["stream"] = True
            if rng.random() < 0.6:
                body["stream_options"] = {"include_usage": True}
        # A shared preamble on half the long prompts and some short chats
        # exercises the prefix cache; the rest are fresh text.
        shared = rng.random() < 0.5
        text = words(rng, prompt_words)
        if long_prompt and shared:
            text = words(random.Random(7), 300) + " " + text
        if chat:
            msgs = []
            if shared and not long_prompt:
                msgs.append({"role": "system", "content": "You are a soak-test assistant. " + words(random.Random(11), 40)})
            msgs.append({"role": "user", "content": text})
            if rng.random() < 0.15:
                msgs = msgs + [{"role": "assistant", "content": words(rng, 8)}, {"role": "user", "content": words(rng, 6)}]
            body["messages"] = msgs
            if rng.random() < 0.3:
                body["chat_template_kwargs"] = {"enable_thinking": rng.random() < 0.5}
            if rng.random() < 0.1:
                body["logprobs"] = True
                body["top_logprobs"] = rng.randint(0, 3)
            if rng.random() < 0.05:
                body["tools"] = [{"type": "function", "function": {
                    "name": "get_weather", "description": "weather of a city",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
        else:
            r = rng.random()
            if r < 0.1 and not long_prompt:
                body["prompt"] = [rng.randint(10, 900) for _ in range(rng.randint(1, 40))]
            elif r < 0.15 and not long_prompt and not stream:
                body["prompt"] = [words(rng, 5), words(rng, 7)]
            else:
                body["prompt"] = text
            if rng.random() < 0.1:
                body["logprobs"] = rng.randint(0, 3)
            elif rng.random() < 0.05:
                body["echo"] = True
        return body

    def pick(self, rng):
        a = self.args
        kinds = [("chat", a.w_chat), ("completion", a.w_completion), ("long", a.w_long),
                 ("cancel", a.w_cancel), ("bad", a.w_bad), ("utility", a.w_utility)]
        r = rng.uniform(0, sum(w for _, w in kinds))
        for k, w in kinds:
            r -= w
            if r <= 0:
                return k
        return "chat"

    def build(self, rng, group):
        if group in ("chat", "completion", "long"):
            chat = group == "chat" or (group == "long" and rng.random() < 0.5)
            stream = rng.random() < 0.5
            long_prompt = group == "long"
            n = rng.randint(a_long_min(self.args), a_long_max(self.args)) if long_prompt else rng.randint(1, 60)
            body = self.gen_body(rng, chat, stream, n, long_prompt)
            kind = ("long-" if long_prompt else "") + ("chat" if chat else "completion") + ("-stream" if stream else "")
            return kind, "POST", "/v1/chat/completions" if chat else "/v1/completions", body, {"stream": stream}
        if group == "cancel":
            chat = rng.random() < 0.5
            long_prompt = rng.random() < 0.1
            if rng.random() < 0.7:  # close a stream after a few events
                body = self.gen_body(rng, chat, True, rng.randint(200, 400) if long_prompt else rng.randint(1, 40), long_prompt)
                body["max_tokens"] = rng.randint(32, 64)
                body["ignore_eos"] = True
                body.pop("stop", None)
                return ("cancel-stream", "POST", "/v1/chat/completions" if chat else "/v1/completions", body,
                        {"stream": True, "cancel_after": rng.randint(0, 4)})
            body = self.gen_body(rng, chat, False, rng.randint(1, 40), False)  # give up while waiting
            body["max_tokens"] = 64
            body["ignore_eos"] = True
            body.pop("stop", None)
            return ("cancel-wait", "POST", "/v1/chat/completions" if chat else "/v1/completions", body,
                    {"stream": False, "give_up_after": rng.uniform(0.05, 1.5)})
        if group == "bad":
            return self.bad(rng)
        return self.utility(rng)

    def bad(self, rng):
        m = self.model
        msg = [{"role": "user", "content": "hi"}]
        cases = [
            ("/v1/chat/completions", b'{"model": "x", "messages": [{"role": "user", "content": "hi"'),  # truncated JSON
            ("/v1/completions", b"not json at all"),
            ("/v1/chat/completions", b"[1, 2, 3]"),
            ("/v1/chat/completions", {"model": "no-such-model", "messages": msg}),
            ("/v1/completions", {"model": "no-such-model", "prompt": "hi"}),
            ("/v1/chat/completions", {"model": m, "messages": msg, "max_tokens": -rng.randint(1, 100)}),
            ("/v1/completions", {"model": m, "prompt": "hi", "max_tokens": 0}),
            ("/v1/chat/completions", {"model": m, "messages": "hi"}),
            ("/v1/completions", {"model": m, "prompt": "hi", "max_tokens": "ten"}),
            ("/v1/chat/completions", {"model": m, "messages": msg, "temperature": "hot"}),
            ("/v1/chat/completions", {"model": m, "messages": msg, "stream": "yes"}),
            ("/v1/chat/completions", {"model": m, "messages": msg, "n": rng.randint(17, 1000)}),
            ("/v1/completions", {"model": m, "prompt": "hi", "n": 10**9}),
            ("/v1/chat/completions", {"model": m, "messages": []}),
            ("/v1/completions", {"model": m}),
            ("/v1/completions", {"model": m, "prompt": "hi", "max_tokens": 10**6}),
            ("/v1/chat/completions", {"model": m, "messages": msg, "temperature": -1}),
            ("/v1/chat/completions", {"model": m, "messages": msg, "top_p": 7}),
            ("/v1/completions", {"model": m, "prompt": "hi", "logprobs": 99}),
            ("/v1/chat/completions", {"model": m, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}),
            ("/v1/chat/completions", {"model": m, "messages": msg, "tool_choice": "required",
                                      "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}),
            ("/v1/completions", {"model": m, "prompt": "hi", "echo": True, "logprobs": 2}),
            ("/v1/completions", {"model": m, "prompt": words(rng, 2600), "max_tokens": 8}),  # > max model len
            ("/tokenize", {"prompt": "hi", "messages": msg}),
            ("/tokenize", {}),
            ("/detokenize", {"tokens": [1, -5]}),
            ("/detokenize", {"tokens": [10**9]}),
            ("/detokenize", {"tokens": "abc"}),
            ("/v1/models/no-such-model", None),
            ("/v1/completions", "OVERSIZED"),
        ]
        weights = [1] * len(cases)
        weights[-1] = 0.5  # a body just past --max-body-bytes (8 MiB) now and then
        path, body = rng.choices(cases, weights)[0]
        if body is None:
            return "bad", "GET", path, None, {"bad": True}
        if body == "OVERSIZED":
            pad = "a" * (self.args.max_body_bytes + 64 * 1024)
            body = ('{"model": "%s", "prompt": "%s"}' % (m, pad)).encode()
        return "bad", "POST", path, body, {"bad": True}

    def utility(self, rng):
        m = self.model
        cases = [
            ("GET", "/health", None), ("GET", "/healthz", None), ("GET", "/version", None),
            ("GET", "/v1/models", None), ("GET", f"/v1/models/{m}", None),
            ("POST", "/tokenize", {"prompt": words(rng, rng.randint(1, 200))}),
            ("POST", "/tokenize", {"messages": [{"role": "user", "content": words(rng, 20)}], "add_generation_prompt": True,
                                   "return_token_strs": rng.random() < 0.5}),
            ("POST", "/detokenize", {"tokens": [rng.randint(10, 900) for _ in range(rng.randint(1, 50))]}),
        ]
        method, path, body = rng.choice(cases)
        return "utility", method, path, body, {}

    # ---- sending and classifying

    def send(self, client, rng):
        group = self.pick(rng)
        kind, method, path, body, opts = self.build(rng, group)
        rid = self.next_id()
        rec = {"id": rid, "kind": kind, "method": method, "path": path, "t": round(time.time() - self.t0, 3)}
        if isinstance(body, dict):
            rec["max_tokens"] = body.get("max_tokens")
            if isinstance(body.get("prompt"), list) and body["prompt"] and isinstance(body["prompt"][0], str):
                rec["prompts"] = len(body["prompt"])  # one engine request per prompt
        headers = {"X-Request-Id": rid, "Content-Type": "application/json"}
        content = None
        if body is not None:
            content = body if isinstance(body, bytes) else json.dumps(body).encode()
        t0 = time.monotonic()
        try:
            if opts.get("give_up_after"):
                # A non-streamed request the client abandons: a short read timeout.
                to = httpx.Timeout(connect=10.0, read=opts["give_up_after"], write=30.0, pool=10.0)
                try:
                    r = client.request(method, self.url + path, content=content, headers=headers, timeout=to)
                except httpx.ReadTimeout:
                    rec["outcome"] = "cancelled"
                else:
                    rec["status"] = r.status_code
                    self.classify_plain(rec, r, opts, body)
            elif opts.get("stream"):
                with client.stream(method, self.url + path, content=content, headers=headers) as r:
                    rec["status"] = r.status_code
                    if r.status_code != 200:
                        r.read()
                        self.classify_plain(rec, r, opts, body)
                    else:
                        self.read_stream(rec, r, opts, body, t0)
            else:
                r = client.request(method, self.url + path, content=content, headers=headers)
                rec["status"] = r.status_code
                self.classify_plain(rec, r, opts, body)
        except httpx.TimeoutException as e:
            rec["outcome"] = "timeout"
            rec["error"] = f"{type(e).__name__}: {e}"
        except (httpx.TransportError, httpx.StreamError) as e:
            rec["outcome"] = "transport-error"
            rec["error"] = f"{type(e).__name__}: {e}"
        rec["latency_s"] = round(time.monotonic() - t0, 4)
        self.record(rec)

    def classify_plain(self, rec, r, opts, body):
        code = r.status_code
        try:
            data = r.json()
        except ValueError:
            data = None
        if opts.get("bad"):
            if 400 <= code < 500:
                ok = isinstance(data, dict) and isinstance(data.get("error"), dict) and data["error"].get("message")
                rec["outcome"] = "4xx-expected" if ok else "bad-response"
                if not ok:
                    rec["error"] = f"{code} without an OpenAI error body: {r.text[:200]!r}"
            elif code >= 500:
                rec["outcome"] = "5xx"
                rec["error"] = r.text[:300]
            else:
                rec["outcome"] = "bad-accepted"
                rec["error"] = f"bad request answered {code}: {r.text[:200]!r}"
            return
        if code >= 500:
            rec["outcome"] = "5xx"
            rec["error"] = r.text[:300]
            return
        if code >= 400:
            rec["outcome"] = "unexpected-4xx"
            rec["error"] = r.text[:300]
            return
        problem = self.check_body(rec, r, data, body)
        rec["outcome"] = "bad-response" if problem else "ok"
        if problem:
            rec["error"] = problem

    def check_body(self, rec, r, data, body):
        path = rec["path"]
        if path in ("/health", "/healthz"):
            return None
        if data is None:
            return f"body is not JSON: {r.text[:200]!r}"
        if path in ("/v1/chat/completions", "/v1/completions"):
            ch = data.get("choices")
            if not isinstance(ch, list) or not ch:
                return f"no choices: {str(data)[:200]}"
            for c in ch:
                if c.get("finish_reason") not in ("stop", "length", "tool_calls"):
                    return f"finish_reason {c.get('finish_reason')!r}"
            u = data.get("usage") or {}
            rec["prompt_tokens"] = u.get("prompt_tokens")
            rec["completion_tokens"] = u.get("completion_tokens")
            mt = body.get("max_tokens") if isinstance(body, dict) else None
            if mt and u.get("completion_tokens") is not None and u["completion_tokens"] > mt * len(ch):
                return f"completion_tokens {u['completion_tokens']} > max_tokens {mt}"
        elif path == "/tokenize":
            if not isinstance(data.get("tokens"), list) or data.get("count") != len(data["tokens"]):
                return f"bad tokenize body: {str(data)[:200]}"
        elif path == "/detokenize":
            if not isinstance(data.get("prompt"), str):
                return f"bad detokenize body: {str(data)[:200]}"
        elif path == "/v1/models":
            if not data.get("data"):
                return "empty model list"
        return None

    def read_stream(self, rec, r, opts, body, t0):
        events, done, usage, finish, err = 0, False, None, None, None
        cancel_after = opts.get("cancel_after")
        for line in r.iter_lines():
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                done = True
                continue
            if done:
                err = "data after [DONE]"
                break
            try:
                ev = json.loads(payload)
            except ValueError:
                err = f"event is not JSON: {payload[:200]!r}"
                break
            if "error" in ev:
                err = f"error event: {json.dumps(ev['error'])[:300]}"
                continue
            if events == 0:
                rec["ttft_s"] = round(time.monotonic() - t0, 4)
            events += 1
            for c in ev.get("choices") or []:
                if c.get("finish_reason"):
                    finish = c["finish_reason"]
            if ev.get("usage"):
                usage = ev["usage"]
            if cancel_after is not None and events > cancel_after:
                rec["events"] = events
                rec["outcome"] = "cancelled"
                return  # leaving the with-block closes the connection mid-stream
        rec["events"] = events
        if usage:
            rec["prompt_tokens"] = usage.get("prompt_tokens")
            rec["completion_tokens"] = usage.get("completion_tokens")
        if err:
            rec["outcome"], rec["error"] = "stream-error", err
        elif not done:
            rec["outcome"], rec["error"] = "stream-error", "stream ended without [DONE]"
        elif finish not in ("stop", "length", "tool_calls"):
            rec["outcome"], rec["error"] = "bad-response", f"stream finish_reason {finish!r}"
        elif body.get("stream_options", {}).get("include_usage") and not usage:
            rec["outcome"], rec["error"] = "bad-response", "include_usage without a usage chunk"
        else:
            rec["outcome"] = "ok"

    def worker(self, idx):
        rng = random.Random(self.args.seed * 1000 + idx)
        with httpx.Client(timeout=self.timeout) as client:
            while time.monotonic() < self.deadline and not self.stop.is_set():
                try:
                    self.send(client, rng)
                except Exception as e:  # a driver bug must not pass as a clean soak
                    self.record({"id": "driver", "kind": "driver", "path": "-", "outcome": "bad-response",
                                 "error": f"driver exception {type(e).__name__}: {e}"})

    # ---- sampling

    def scrape(self, client):
        r = client.get(self.url + "/metrics", timeout=15.0)
        r.raise_for_status()
        return r.text, parse_metrics(r.text)

    def sample_row(self, client):
        row = {"t_s": round(time.time() - self.t0, 1), "rss_kb": read_rss_kb(self.args.pid)}
        try:
            _, m = self.scrape(client)
        except Exception as e:
            row["scrape_error"] = str(e)[:100]
            m = {}
        for col, key in (("kv_used", "glmctl_kv_blocks_used"), ("kv_cached", "glmctl_kv_blocks_cached"),
                         ("kv_total", "glmctl_kv_blocks_total"), ("running", "glmctl_running_sequences"),
                         ("queued", "glmctl_queue_depth"), ("in_flight", "glmctl_http_requests_in_flight"),
                         ("goroutines", "go_goroutines"), ("heap_inuse_bytes", "go_memstats_heap_inuse_bytes"),
                         ("steps", "glmctl_engine_steps_total"), ("gen_tokens", "glmctl_generation_tokens_total")):
            v = m.get(key)
            row[col] = int(v) if v is not None else None
        with self.lock:
            row["requests"] = len(self.records)
            row["lost"] = sum(1 for x in self.records if x.get("outcome") in LOST)
            row["errors"] = sum(1 for x in self.records if x.get("outcome") in ERRORS)
        return row

    def sampler(self, rows, writer, f):
        last_print = 0.0
        with httpx.Client() as client:
            while not self.stop.is_set():
                row = self.sample_row(client)
                rows.append(row)
                writer.writerow(row)
                f.flush()
                if row["t_s"] - last_print >= self.args.progress_interval:
                    last_print = row["t_s"]
                    rss = row["rss_kb"] / 1024 if row["rss_kb"] else float("nan")
                    print(f"[{row['t_s']:7.1f}s] requests {row['requests']:6d}  errors {row['errors']}  lost {row['lost']}  "
                          f"rss {rss:.1f} MiB  kv used {row['kv_used']} cached {row['kv_cached']}  "
                          f"running {row['running']} queued {row['queued']}  goroutines {row['goroutines']}", flush=True)
                self.stop.wait(self.args.sample_interval)


def a_long_min(args):
    return args.long_words[0]


def a_long_max(args):
    return args.long_words[1]


def cmd_run(args):
    os.makedirs(args.out, exist_ok=True)
    d = Driver(args)
    with httpx.Client(timeout=30.0) as c:
        models = c.get(d.url + "/v1/models").json()
        d.model = args.model_name or models["data"][0]["id"]
        start_text, start = d.scrape(c)
    with open(os.path.join(args.out, "metrics-start.txt"), "w") as f:
        f.write(start_text)
    print(f"soak: {args.minutes} min, {args.concurrency} clients, model {d.model!r}, server pid {args.pid}, out {args.out}", flush=True)

    fields = ["t_s", "rss_kb", "kv_used", "kv_cached", "kv_total", "running", "queued", "in_flight", "goroutines",
              "heap_inuse_bytes", "steps", "gen_tokens", "requests", "lost", "errors", "scrape_error"]
    rows = []
    csvf = open(os.path.join(args.out, "samples.csv"), "w", newline="")
    writer = csv.DictWriter(csvf, fieldnames=fields)
    writer.writeheader()
    d.t0 = time.time()
    t_start = time.monotonic()
    d.deadline = t_start + args.minutes * 60
    sampler = threading.Thread(target=d.sampler, args=(rows, writer, csvf), daemon=True)
    sampler.start()
    workers = [threading.Thread(target=d.worker, args=(i,), daemon=True) for i in range(args.concurrency)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    load_s = time.monotonic() - t_start
    print(f"soak: load done after {load_s:.1f} s ({len(d.records)} requests); draining", flush=True)

    # Drain: nothing queued or running, no KV block used, only our scrape in
    # flight, goroutines back near the start.
    drain = {"ok": False}
    t_drain = time.monotonic()
    with httpx.Client(timeout=15.0) as c:
        m = {}
        while time.monotonic() - t_drain < args.drain_timeout:
            try:
                _, m = d.scrape(c)
            except Exception as e:
                drain["error"] = str(e)
                time.sleep(0.5)
                continue
            if (m.get("glmctl_queue_depth") == 0 and m.get("glmctl_running_sequences") == 0
                    and m.get("glmctl_kv_blocks_used") == 0 and m.get("glmctl_http_requests_in_flight", 0) <= 1
                    and m.get("go_goroutines", 0) <= start.get("go_goroutines", 0) + args.goroutine_slack):
                drain["ok"] = True
                break
            time.sleep(0.5)
        drain["seconds"] = round(time.monotonic() - t_drain, 2)
        drain["last"] = {k: m.get(k) for k in ("glmctl_queue_depth", "glmctl_running_sequences", "glmctl_kv_blocks_used",
                                                "glmctl_http_requests_in_flight", "go_goroutines")}
        # One more request after the soak: the server still serves.
        probe = {"ok": False}
        try:
            r = c.post(d.url + "/v1/completions", headers={"X-Request-Id": "soak-final-probe"},
                       json={"model": d.model, "prompt": "after the soak", "max_tokens": 8}, timeout=args.request_timeout)
            probe["status"] = r.status_code
            probe["ok"] = r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("stop", "length")
        except Exception as e:
            probe["error"] = f"{type(e).__name__}: {e}"
        # The probe's blocks go back too.
        for _ in range(40):
            end_text, end = d.scrape(c)
            if end.get("glmctl_kv_blocks_used") == 0 and end.get("glmctl_running_sequences") == 0:
                break
            time.sleep(0.25)
        end_rss = read_rss_kb(args.pid)
    d.stop.set()
    sampler.join(timeout=30)
    csvf.close()
    d.out.close()
    with open(os.path.join(args.out, "metrics-end.txt"), "w") as f:
        f.write(end_text)
    run = {
        "url": d.url, "model": d.model, "pid": args.pid, "minutes": args.minutes, "concurrency": args.concurrency,
        "seed": args.seed, "load_seconds": round(load_s, 1), "drain": drain, "final_probe": probe,
        "rss_kb_end": end_rss, "request_timeout_s": args.request_timeout,
        "weights": {"chat": args.w_chat, "completion": args.w_completion, "long": args.w_long,
                    "cancel": args.w_cancel, "bad": args.w_bad, "utility": args.w_utility},
    }
    with open(os.path.join(args.out, "run.json"), "w") as f:
        json.dump(run, f, indent=1)
    print(f"soak: drained in {drain['seconds']} s (ok={drain['ok']}), final probe ok={probe['ok']}", flush=True)


# ---------------------------------------------------------------- report


def load_samples(path):
    rows = []
    with open(path) as f:
        for r in csv.DictReader(f):
            rows.append({k: (float(v) if v not in ("", None) and k != "scrape_error" else v) for k, v in r.items()})
    return rows


def server_log_requests(path):
    """request_id -> list of the server's request log lines (JSON slog)."""
    out, levels, panics = {}, {}, 0
    with open(path, errors="replace") as f:
        for line in f:
            if "panic" in line:
                panics += 1
            try:
                e = json.loads(line)
            except ValueError:
                continue
            lv = e.get("level", "?")
            levels[lv] = levels.get(lv, 0) + 1
            if e.get("msg") == "request" and e.get("request_id"):
                out.setdefault(e["request_id"], []).append(e)
    return out, levels, panics


def cmd_report(args):
    out = args.out
    run = json.load(open(os.path.join(out, "run.json")))
    recs = [json.loads(l) for l in open(os.path.join(out, "requests.jsonl"))]
    samples = load_samples(os.path.join(out, "samples.csv"))
    start = parse_metrics(open(os.path.join(out, "metrics-start.txt")).read())
    end = parse_metrics(open(os.path.join(out, "metrics-end.txt")).read())
    slog, levels, panics = server_log_requests(os.path.join(out, "server.log"))

    outcomes = {k: 0 for k in OUTCOMES}
    for r in recs:
        outcomes[r.get("outcome", "bad-response")] = outcomes.get(r.get("outcome", "bad-response"), 0) + 1
    lost = sum(outcomes[k] for k in LOST)
    errors = sum(outcomes[k] for k in ERRORS)

    kinds = {}
    for r in recs:
        k = kinds.setdefault(r["kind"], {"n": 0, "outcomes": {}, "lat": [], "ttft": [], "prompt_tokens": []})
        k["n"] += 1
        k["outcomes"][r.get("outcome")] = k["outcomes"].get(r.get("outcome"), 0) + 1
        if r.get("outcome") == "ok":
            k["lat"].append(r["latency_s"])
            if r.get("ttft_s") is not None:
                k["ttft"].append(r["ttft_s"])
            if r.get("prompt_tokens") is not None:
                k["prompt_tokens"].append(r["prompt_tokens"])
    by_kind = {}
    for name, k in sorted(kinds.items()):
        by_kind[name] = {"requests": k["n"], "outcomes": k["outcomes"],
                         "latency_p50_s": pct(k["lat"], 50), "latency_p99_s": pct(k["lat"], 99),
                         "ttft_p50_s": pct(k["ttft"], 50), "ttft_p99_s": pct(k["ttft"], 99),
                         "prompt_tokens_min": min(k["prompt_tokens"]) if k["prompt_tokens"] else None,
                         "prompt_tokens_max": max(k["prompt_tokens"]) if k["prompt_tokens"] else None}
    ok_lat = [r["latency_s"] for r in recs if r.get("outcome") == "ok" and r["path"] in ("/v1/chat/completions", "/v1/completions")]
    completion_tokens = sum(r.get("completion_tokens") or 0 for r in recs if r.get("outcome") == "ok")

    # RSS: median of the first window after warm-up against the last window.
    # The KV pool is allocated once but its pages become resident as blocks
    # are first written, so RSS climbs until every block has been used once
    # (free blocks are taken before cached ones are evicted): the warm-up
    # ends at --warmup seconds or when no block was left never-used
    # (used + cached >= total), whichever is later.
    dur = run["load_seconds"]
    pool_t = next((s["t_s"] for s in samples if isinstance(s.get("kv_total"), float)
                   and isinstance(s.get("kv_used"), float) and isinstance(s.get("kv_cached"), float)
                   and s["kv_used"] + s["kv_cached"] >= 0.98 * s["kv_total"]), None)
    win = 60.0
    warm = max(args.warmup, pool_t) if pool_t is not None else None
    measurable = warm is not None and warm + 2 * win <= dur
    if not measurable:  # too short a run: compare what there is, report it, do not judge
        warm = min(args.warmup, dur / 5)
        win = min(60.0, (dur - warm) / 3)
    rss = [(s["t_s"], s["rss_kb"]) for s in samples if isinstance(s.get("rss_kb"), float)]
    first = [v for t, v in rss if warm <= t < warm + win]
    last = [v for t, v in rss if dur - win <= t <= dur]
    rss_first = statistics.median(first) if first else None
    rss_last = statistics.median(last) if last else None
    growth = 100.0 * (rss_last - rss_first) / rss_first if rss_first and rss_last else None
    heap = [(s["t_s"], s["heap_inuse_bytes"]) for s in samples if isinstance(s.get("heap_inuse_bytes"), float)]
    heap_first = statistics.median([v for t, v in heap if warm <= t < warm + win] or [0]) or None
    heap_last = statistics.median([v for t, v in heap if dur - win <= t <= dur] or [0]) or None
    rss_max = max((v for _, v in rss), default=None)
    kv_peak = max((s["kv_used"] for s in samples if isinstance(s.get("kv_used"), float)), default=None)

    # Server side: every API request id in the server's log exactly once,
    # with the status the client saw; the HTTP counters moved by as much.
    missing, dup, mismatch = [], [], []
    for r in recs:
        if r["path"] not in API_PATHS and not r["path"].startswith("/v1/models/"):
            continue
        lines = slog.get(r["id"], [])
        if not lines:
            missing.append(r["id"])
        elif len(lines) > 1:
            dup.append(r["id"])
        elif r.get("status") is not None and r.get("outcome") != "cancelled" and lines[0].get("status") != r["status"]:
            mismatch.append(f"{r['id']}: client {r['status']}, server {lines[0].get('status')}")
    sp, _ = http_requests_by_path(start)
    ep, ecodes = http_requests_by_path(end)
    server_delta = sum(ep.get(p, 0) - sp.get(p, 0) for p in ep if p not in ("/metrics", "/readyz"))
    client_sent = len([r for r in recs if r["kind"] != "driver"]) + 1  # + the final probe
    finished = {reason: end.get(f'glmctl_engine_requests_finished_total{{reason="{reason}"}}', 0)
                - start.get(f'glmctl_engine_requests_finished_total{{reason="{reason}"}}', 0)
                for reason in ("stop", "length", "cancelled", "error")}
    # Engine requests the HTTP requests made (one per prompt), for comparison
    # with the engine's finished counter (informational: a client that gives
    # up before its request is submitted makes none).
    engine_sent = sum(r.get("prompts", 1) for r in recs if r["path"] in ("/v1/chat/completions", "/v1/completions")
                      and r.get("outcome") in ("ok", "cancelled", "5xx", "stream-error", "bad-response")) + 1
    five_hundreds = {k: v for k, v in ecodes.items() if k.split()[-1].startswith("5")}

    gor_start, gor_end = start.get("go_goroutines"), end.get("go_goroutines")
    kv_used_end = end.get("glmctl_kv_blocks_used")
    checks = [
        ("no lost request (transport error / timeout)", lost == 0, f"{lost} lost"),
        ("no error outcome (5xx, unexpected 4xx, bad body, accepted bad request)", errors == 0, f"{errors} errors"),
        ("every API request in the server log once, same status",
         not missing and not dup and not mismatch,
         f"{len(missing)} missing, {len(dup)} duplicated, {len(mismatch)} status mismatches"),
        ("server request counters moved by the requests sent", server_delta == client_sent,
         f"server {int(server_delta)}, client {client_sent}"),
        ("drained: nothing queued/running, no block used", bool(run["drain"]["ok"]), json.dumps(run["drain"]["last"])),
        ("zero KV blocks used at the end", kv_used_end == 0, f"{kv_used_end}"),
        ("server still serves after the soak", bool(run["final_probe"]["ok"]), json.dumps(run["final_probe"])),
        (f"RSS growth <= {args.rss_growth_max}% (first vs last minute medians after warm-up)",
         (growth is not None and growth <= args.rss_growth_max) if measurable else None,
         (f"{growth:+.1f}%" if growth is not None else "no samples")
         + ("" if measurable else " (not judged: the run ended before the KV pool was used once "
            "plus two minutes; run longer)")),
        (f"goroutines back to start (+{args.goroutine_slack})",
         gor_start is not None and gor_end is not None and gor_end <= gor_start + args.goroutine_slack,
         f"{gor_start:.0f} -> {gor_end:.0f}" if gor_start is not None and gor_end is not None else "n/a"),
        ("no 5xx in the server's counters", not five_hundreds, json.dumps(five_hundreds)),
        ("no panic in the server log", panics == 0, f"{panics} lines"),
        ("server exit status 0 after SIGTERM", args.exit_status == "0", args.exit_status),
    ]
    passed = all(ok is not False for _, ok, _ in checks)

    summary = {
        "passed": passed,
        "run": run,
        "requests": len(recs), "outcomes": outcomes, "lost": lost, "errors": errors,
        "by_kind": by_kind,
        "generation_latency_p50_s": pct(ok_lat, 50), "generation_latency_p99_s": pct(ok_lat, 99),
        "completion_tokens_ok": completion_tokens,
        "requests_per_s": len(recs) / dur if dur else None,
        "rss_kb": {"first_window_median": rss_first, "last_window_median": rss_last, "growth_pct": growth,
                   "max": rss_max, "end": run.get("rss_kb_end"), "warmup_s": warm, "window_s": win,
                   "kv_pool_used_once_at_s": pool_t, "judged": measurable},
        "go_heap_inuse_bytes": {"first_window_median": heap_first, "last_window_median": heap_last},
        "kv_blocks": {"total": end.get("glmctl_kv_blocks_total"), "used_end": kv_used_end,
                      "cached_end": end.get("glmctl_kv_blocks_cached"), "used_peak_sampled": kv_peak},
        "goroutines": {"start": gor_start, "end": gor_end},
        "engine_finished": finished, "engine_requests_sent": engine_sent,
        "engine_preemptions": end.get("glmctl_engine_preemptions_total", 0) - start.get("glmctl_engine_preemptions_total", 0),
        "engine_step_failures": {k: end.get(f'glmctl_engine_step_failures_total{{kind="{k}"}}', 0) for k in ("error", "panic", "fatal")},
        "prefix_cache_hit_tokens": end.get("glmctl_prefix_cache_hits_tokens_total", 0),
        "server_http_codes": {k: int(v) for k, v in sorted(ecodes.items())},
        "server_log_levels": levels,
        "server_exit_status": args.exit_status,
        "log_check": {"missing": missing[:20], "duplicated": dup[:20], "status_mismatch": mismatch[:20]},
        "checks": [{"check": c, "ok": ok, "detail": d} for c, ok, d in checks],
    }
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)

    def s(x, unit="s"):
        return "-" if x is None else (f"{x * 1000:.0f} ms" if unit == "s" and x < 1 else f"{x:.2f} {unit}")

    mib = lambda kb: "-" if kb is None else f"{kb / 1024:.1f} MiB"
    print()
    print(f"== soak summary: {run['minutes']} min, {run['concurrency']} clients, {len(recs)} requests "
          f"({summary['requests_per_s']:.2f}/s), {completion_tokens} completion tokens ==")
    print(f"{'kind':24} {'n':>6} {'ok':>6} {'canc':>5} {'4xx-exp':>7} {'err':>4} {'lost':>4} {'p50':>9} {'p99':>9} {'1st ev p50':>10} {'1st ev p99':>10}")
    for name, k in by_kind.items():
        o = k["outcomes"]
        print(f"{name:24} {k['requests']:6d} {o.get('ok', 0):6d} {o.get('cancelled', 0):5d} {o.get('4xx-expected', 0):7d} "
              f"{sum(o.get(e, 0) for e in ERRORS):4d} {sum(o.get(e, 0) for e in LOST):4d} "
              f"{s(k['latency_p50_s']):>9} {s(k['latency_p99_s']):>9} {s(k['ttft_p50_s']):>10} {s(k['ttft_p99_s']):>10}")
    print(f"outcomes: " + ", ".join(f"{k} {v}" for k, v in outcomes.items()))
    print(f"generation latency (ok): p50 {s(summary['generation_latency_p50_s'])}, p99 {s(summary['generation_latency_p99_s'])}")
    print(f"RSS: before load {mib(samples[0].get('rss_kb') if samples else None)}; KV pool used once at "
          f"{'-' if pool_t is None else f'{pool_t:.0f} s'}; window {warm:.0f}-{warm + win:.0f} s "
          f"{mib(rss_first)}, last {win:.0f} s {mib(rss_last)}, growth "
          f"{'-' if growth is None else f'{growth:+.1f}%'}, max {mib(rss_max)}, after drain {mib(run.get('rss_kb_end'))}")
    if heap_first and heap_last:
        print(f"Go heap in use: {heap_first / 2**20:.1f} MiB -> {heap_last / 2**20:.1f} MiB")
    print(f"KV blocks: total {summary['kv_blocks']['total']}, peak used (sampled) {kv_peak}, used at end {kv_used_end}, "
          f"cached at end {summary['kv_blocks']['cached_end']}")
    print(f"engine requests finished {int(sum(finished.values()))} ({', '.join(f'{k} {int(v)}' for k, v in finished.items())}), "
          f"engine requests sent {engine_sent}")
    print(f"goroutines: start {gor_start}, end {gor_end}; preemptions "
          f"{summary['engine_preemptions']}; step failures {summary['engine_step_failures']}")
    print(f"server log levels {levels}; exit status {args.exit_status}")
    print()
    for c, ok, d in checks:
        print(f"  [{'SKIP' if ok is None else 'PASS' if ok else 'FAIL'}] {c}: {d}")
    if not passed:
        bad = [r for r in recs if r.get("outcome") in LOST + ERRORS][:10]
        for r in bad:
            print(f"    {r['id']} {r['kind']} {r['path']} {r.get('outcome')} {r.get('status', '')} {r.get('error', '')[:200]}")
    print(f"\nsoak: {'PASSED' if passed else 'FAILED'} (details in {os.path.join(out, 'summary.json')})")
    return 0 if passed else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--url", required=True)
    r.add_argument("--pid", type=int, required=True, help="the server's pid, for VmRSS")
    r.add_argument("--minutes", type=float, default=10)
    r.add_argument("--concurrency", type=int, default=8)
    r.add_argument("--out", required=True)
    r.add_argument("--model-name", default="", help="default: the first id of /v1/models")
    r.add_argument("--seed", type=int, default=1)
    r.add_argument("--request-timeout", type=float, default=300, help="read timeout of one request (s); beyond it the request is LOST")
    r.add_argument("--drain-timeout", type=float, default=120)
    r.add_argument("--sample-interval", type=float, default=5)
    r.add_argument("--progress-interval", type=float, default=30)
    r.add_argument("--goroutine-slack", type=int, default=5)
    r.add_argument("--max-body-bytes", type=int, default=8 << 20, help="the server's --max-body-bytes (an oversized bad request goes just past it)")
    r.add_argument("--long-words", type=int, nargs=2, default=[450, 850], metavar=("MIN", "MAX"),
                   help="words of a long prompt (the tiny tokenizer reads this word list as ~2-4 tokens a word: 1.5k-3.5k tokens)")
    for name, w in (("chat", 34), ("completion", 26), ("long", 10), ("cancel", 10), ("bad", 10), ("utility", 10)):
        r.add_argument(f"--w-{name}", type=float, default=w, help=f"weight of {name} requests (default {w})")
    p = sub.add_parser("report")
    p.add_argument("--out", required=True)
    p.add_argument("--exit-status", required=True)
    p.add_argument("--rss-growth-max", type=float, default=20)
    p.add_argument("--goroutine-slack", type=int, default=5)
    p.add_argument("--warmup", type=float, default=60, help="seconds of load before the first RSS window")
    args = ap.parse_args()
    if args.cmd == "run":
        cmd_run(args)
        return 0
    return cmd_report(args)


if __name__ == "__main__":
    sys.exit(main())
