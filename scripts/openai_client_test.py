#!/usr/bin/env python3
"""End-to-end test of `glmctl serve` with the official `openai` Python client.

Run against a live server (cmd/glmctl/serve_test.go starts one on the tiny CPU
model and runs this script):

    python3 scripts/openai_client_test.py --base-url http://127.0.0.1:8000 \
        --api-key KEY --model NAME

The tiny model has random weights, so the text is gibberish; the checks are
about the API: shapes, usage, streaming, logprobs, seeds, stop strings, tool
messages, error statuses and error bodies. Exits non-zero on the first failure.
Needs `pip install openai`.
"""

import argparse
import sys
import time
import urllib.request

try:
    import openai
    from openai import OpenAI
except ImportError as e:  # the Go test turns this into an install hint
    print(f"missing Python package: {e}; install it with: python3 -m pip install openai", file=sys.stderr)
    sys.exit(3)

CHECKS = []


def check(name):
    def deco(fn):
        CHECKS.append((name, fn))
        return fn
    return deco


def expect(cond, msg):
    if not cond:
        raise AssertionError(msg)


def text_of(msg):
    """reasoning + content of a chat message (the tiny model may write either)."""
    extra = msg.model_extra or {}
    return (extra.get("reasoning_content") or "") + (msg.content or "")


def api_error(fn, cls, status, param=None, contains=None):
    try:
        fn()
    except cls as e:
        expect(e.status_code == status, f"status {e.status_code}, want {status}")
        body = e.body if isinstance(e.body, dict) else {}
        if param is not None:
            expect(body.get("param") == param, f"error param {body.get('param')!r}, want {param!r} ({body})")
        if contains is not None:
            expect(contains in (body.get("message") or ""), f"error message {body.get('message')!r} lacks {contains!r}")
        expect(body.get("type"), f"error body without type: {body}")
        return body
    raise AssertionError(f"no {cls.__name__} raised")


class Ctx:
    def __init__(self, args):
        self.args = args
        self.model = args.model
        self.client = OpenAI(base_url=args.base_url + "/v1", api_key=args.api_key, max_retries=0, timeout=60)

    def chat(self, **kw):
        kw.setdefault("model", self.model)
        kw.setdefault("messages", [{"role": "user", "content": "Hello, who are you?"}])
        return self.client.chat.completions.create(**kw)

    def metric(self, name):
        with urllib.request.urlopen(self.args.base_url + "/metrics", timeout=10) as r:
            text = r.read().decode()
        for line in text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        raise AssertionError(f"metric {name} not in /metrics")


@check("models list")
def _(c):
    ids = [m.id for m in c.client.models.list()]
    expect(ids == [c.model], f"models {ids}, want [{c.model}]")
    expect(c.client.models.retrieve(c.model).id == c.model, "retrieve")


@check("chat, non-streamed, with request id")
def _(c):
    raw = c.client.chat.completions.with_raw_response.create(
        model=c.model, messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        max_tokens=12, temperature=0)
    r = raw.parse()
    rid = raw.headers.get("x-request-id")
    expect(rid and r.id == "chatcmpl-" + rid, f"id {r.id!r}, x-request-id {rid!r}")
    expect(r.object == "chat.completion" and r.model == c.model, f"object {r.object}, model {r.model}")
    ch = r.choices[0]
    expect(ch.message.role == "assistant", ch.message.role)
    expect(ch.finish_reason in ("stop", "length"), ch.finish_reason)
    u = r.usage
    expect(u.prompt_tokens > 0 and 1 <= u.completion_tokens <= 12, f"usage {u}")
    expect(u.total_tokens == u.prompt_tokens + u.completion_tokens, f"usage {u}")
    if ch.finish_reason == "length":
        expect(u.completion_tokens == 12, f"length finish after {u.completion_tokens} tokens")


@check("chat thinking off: no reasoning_content")
def _(c):
    r = c.chat(max_tokens=8, temperature=0, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    extra = r.choices[0].message.model_extra or {}
    expect(not extra.get("reasoning_content"), f"reasoning with thinking off: {extra}")
    on = c.chat(max_tokens=8, temperature=0)
    expect(on.usage.prompt_tokens == r.usage.prompt_tokens, "thinking on/off prompts differ only in </think> vs <think>")


@check("chat streamed with include_usage equals the non-streamed answer")
def _(c):
    kw = dict(messages=[{"role": "user", "content": "Tell me a story"}], max_tokens=16, temperature=0)
    whole = c.chat(**kw)
    chunks = list(c.chat(stream=True, stream_options={"include_usage": True}, **kw))
    expect(len(chunks) >= 3, f"{len(chunks)} chunks")
    expect(chunks[0].choices[0].delta.role == "assistant", "first delta announces the role")
    usage = chunks[-1].usage
    expect(usage is not None and chunks[-1].choices == [], "last chunk carries usage and no choices")
    for ch in chunks[:-1]:
        expect(ch.usage is None, "usage only on the last chunk")
        expect(ch.id == chunks[0].id and ch.object == "chat.completion.chunk", "chunk id/object")
    finishes = [ch.choices[0].finish_reason for ch in chunks[:-1] if ch.choices[0].finish_reason]
    expect(finishes == [whole.choices[0].finish_reason], f"finish reasons {finishes}")
    got = ""
    for ch in chunks[:-1]:
        d = ch.choices[0].delta
        got += ((d.model_extra or {}).get("reasoning_content") or "") + (d.content or "")
    expect(got == text_of(whole.choices[0].message), f"stream {got!r} != whole {text_of(whole.choices[0].message)!r}")
    expect(usage.completion_tokens == whole.usage.completion_tokens, f"usage {usage} vs {whole.usage}")


@check("chat without include_usage sends no usage chunk")
def _(c):
    chunks = list(c.chat(stream=True, max_tokens=4))
    expect(all(ch.usage is None for ch in chunks), "usage chunk without include_usage")
    expect(chunks[-1].choices[0].finish_reason is not None, "last chunk has the finish reason")


@check("completions: string prompt, token ids, echo, streaming")
def _(c):
    r = c.client.completions.create(model=c.model, prompt="The capital of France is", max_tokens=10, temperature=0)
    expect(r.object == "text_completion" and r.choices[0].finish_reason in ("stop", "length"), r)
    expect(r.usage.completion_tokens >= 1, r.usage)
    ids = c.client.completions.create(model=c.model, prompt=[100, 200, 300, 400], max_tokens=5, temperature=0)
    expect(ids.usage.prompt_tokens == 4, ids.usage)
    echo = c.client.completions.create(model=c.model, prompt="The capital of France is", max_tokens=10, temperature=0, echo=True)
    expect(echo.choices[0].text == "The capital of France is" + r.choices[0].text, f"echo {echo.choices[0].text!r}")
    s = "".join(ch.choices[0].text for ch in c.client.completions.create(
        model=c.model, prompt="The capital of France is", max_tokens=10, temperature=0, stream=True) if ch.choices)
    expect(s == r.choices[0].text, f"stream {s!r} != whole {r.choices[0].text!r}")
    two = c.client.completions.create(model=c.model, prompt=["a b c", "x y z"], max_tokens=3, temperature=0)
    expect(sorted(ch.index for ch in two.choices) == [0, 1], [ch.index for ch in two.choices])


@check("stop string cuts the text")
def _(c):
    full = c.client.completions.create(model=c.model, prompt="Once upon a time", max_tokens=24, temperature=0,
                                    extra_body={"ignore_eos": True})
    text = full.choices[0].text
    expect(len(text) >= 6, f"text too short to test stop: {text!r}")
    stop = text[len(text) // 2: len(text) // 2 + 2]
    cut = c.client.completions.create(model=c.model, prompt="Once upon a time", max_tokens=24, temperature=0, stop=[stop])
    want = text[: text.index(stop)]
    expect(cut.choices[0].text == want and cut.choices[0].finish_reason == "stop",
           f"stop {stop!r}: got {cut.choices[0].text!r} ({cut.choices[0].finish_reason}), want {want!r}")


@check("logprobs: chat and completions")
def _(c):
    r = c.chat(max_tokens=6, temperature=0, logprobs=True, top_logprobs=3)
    lp = r.choices[0].logprobs.content
    n = r.usage.completion_tokens - (1 if r.choices[0].finish_reason == "stop" else 0)
    expect(len(lp) == n, f"{len(lp)} logprob entries for {n} visible tokens")
    for e in lp:
        expect(e.logprob <= 0 and len(e.top_logprobs) == 3, e)
        # Greedy: the sampled token is the most likely one.
        expect(abs(e.logprob - max(t.logprob for t in e.top_logprobs)) < 1e-4, f"greedy token not top-1: {e}")
    cr = c.client.completions.create(model=c.model, prompt="Hello", max_tokens=5, temperature=0, logprobs=2)
    clp = cr.choices[0].logprobs
    expect(len(clp.tokens) == len(clp.token_logprobs) == len(clp.top_logprobs) == len(clp.text_offset) == 5, clp)
    expect(all(len(t) <= 2 for t in clp.top_logprobs), clp.top_logprobs)


@check("seed reproduces sampling")
def _(c):
    kw = dict(max_tokens=12, temperature=1.0, top_p=0.95)
    a = c.chat(seed=1234, **kw)
    b = c.chat(seed=1234, **kw)
    d = c.chat(seed=4321, **kw)
    expect(text_of(a.choices[0].message) == text_of(b.choices[0].message), "same seed, different text")
    expect(text_of(a.choices[0].message) != text_of(d.choices[0].message), "different seeds gave the same 12 tokens")


@check("n=2: indexed choices, seeded copies differ, prompt counted once, streamed per choice")
def _(c):
    kw = dict(max_tokens=8, temperature=1.0, seed=77)
    one = c.chat(**kw)
    r = c.chat(n=2, **kw)
    expect([ch.index for ch in r.choices] == [0, 1], f"indices {[ch.index for ch in r.choices]}")
    expect(text_of(r.choices[0].message) == text_of(one.choices[0].message), "choice 0 uses the request's seed")
    expect(text_of(r.choices[0].message) != text_of(r.choices[1].message), "seeded choices gave the same 8 tokens")
    expect(r.usage.prompt_tokens == one.usage.prompt_tokens, f"prompt counted once: {r.usage} vs {one.usage}")
    if all(ch.finish_reason == "length" for ch in r.choices):
        expect(r.usage.completion_tokens == 16, f"completion tokens summed over the choices: {r.usage}")
    expect(2 <= r.usage.completion_tokens <= 16, f"usage {r.usage}")
    chunks = list(c.chat(n=2, stream=True, stream_options={"include_usage": True}, **kw))
    texts, finishes = ["", ""], [[], []]
    for ch in chunks[:-1]:
        expect(len(ch.choices) == 1, f"{len(ch.choices)} choices in a chunk")
        x = ch.choices[0]
        d = x.delta
        texts[x.index] += ((d.model_extra or {}).get("reasoning_content") or "") + (d.content or "")
        if x.finish_reason:
            finishes[x.index].append(x.finish_reason)
    expect(finishes == [[ch.finish_reason] for ch in r.choices], f"finish reasons {finishes}")
    expect(texts == [text_of(ch.message) for ch in r.choices], f"stream {texts} != whole")
    u = chunks[-1].usage
    expect(u is not None and u.prompt_tokens == r.usage.prompt_tokens and u.completion_tokens == r.usage.completion_tokens,
           f"stream usage {u} vs {r.usage}")
    cr = c.client.completions.create(model=c.model, prompt="Once upon a time", n=2, **kw)
    expect([ch.index for ch in cr.choices] == [0, 1] and cr.choices[0].text != cr.choices[1].text, f"completions {cr.choices}")


@check("tools: offered, and a tool-call round trip renders and runs")
def _(c):
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                                "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                               "required": ["city"]}}}]
    r = c.chat(messages=[{"role": "user", "content": "Weather in Paris?"}], tools=tools, max_tokens=8)
    expect(r.choices[0].finish_reason in ("stop", "length", "tool_calls"), r.choices[0].finish_reason)
    plain = c.chat(messages=[{"role": "user", "content": "Weather in Paris?"}], max_tokens=1)
    expect(r.usage.prompt_tokens > plain.usage.prompt_tokens + 20, "tools are rendered into the prompt")
    none = c.chat(messages=[{"role": "user", "content": "Weather in Paris?"}], tools=tools, tool_choice="none", max_tokens=1)
    expect(none.usage.prompt_tokens == plain.usage.prompt_tokens, "tool_choice none hides the tools")
    msgs = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 21}'},
    ]
    rt = c.chat(messages=msgs, tools=tools, max_tokens=8)
    expect(rt.choices[0].message.role == "assistant" and rt.usage.prompt_tokens > r.usage.prompt_tokens, rt.usage)
    chunks = list(c.chat(messages=msgs, tools=tools, max_tokens=4, stream=True))
    expect(chunks[-1].choices[0].finish_reason is not None, "streamed tool round trip finishes")


@check("errors: n out of range, bad types, context, unknown model")
def _(c):
    api_error(lambda: c.chat(n=17, max_tokens=2), openai.BadRequestError, 400, param="n", contains="[1, 16]")
    api_error(lambda: c.chat(n=0, max_tokens=2), openai.BadRequestError, 400, param="n")
    api_error(lambda: c.chat(max_tokens=2, extra_body={"temperature": "hot"}), openai.BadRequestError, 400,
              param="temperature", contains="temperature")
    api_error(lambda: c.chat(messages=[{"role": "user", "content": 123}]), openai.BadRequestError, 400,
              param="messages[0].content")
    api_error(lambda: c.chat(max_tokens=10_000_000), openai.BadRequestError, 400, param="max_tokens",
              contains="maximum context length")
    api_error(lambda: c.client.completions.create(model=c.model, prompt="x", max_tokens=2, logprobs=50),
              openai.BadRequestError, 400, param="logprobs")
    api_error(lambda: c.chat(model="no-such-model", max_tokens=2), openai.NotFoundError, 404, param="model")


@check("auth: wrong key is 401")
def _(c):
    if not c.args.api_key or c.args.api_key == "unused":
        return
    bad = OpenAI(base_url=c.args.base_url + "/v1", api_key="wrong-key", max_retries=0, timeout=30)
    api_error(lambda: bad.models.list(), openai.AuthenticationError, 401)
    api_error(lambda: bad.chat.completions.create(model=c.model, messages=[{"role": "user", "content": "x"}]),
              openai.AuthenticationError, 401)


@check("a stream closed early is cancelled and frees its KV blocks")
def _(c):
    cancelled = c.metric('glmctl_engine_requests_finished_total{reason="cancelled"}')
    stream = c.chat(stream=True, max_tokens=3000, temperature=1.0)
    next(iter(stream))
    next(iter(stream))
    stream.close()
    deadline = time.time() + 15
    while time.time() < deadline:
        if (c.metric('glmctl_engine_requests_finished_total{reason="cancelled"}') == cancelled + 1
                and c.metric("glmctl_running_sequences") == 0 and c.metric("glmctl_kv_blocks_used") == 0):
            return
        time.sleep(0.05)
    raise AssertionError("closed stream still running or holding KV blocks after 15 s")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", required=True)
    p.add_argument("--api-key", default="unused")
    p.add_argument("--model", required=True)
    args = p.parse_args()
    print(f"openai {openai.__version__} against {args.base_url}")
    c = Ctx(args)
    failed = 0
    for name, fn in CHECKS:
        t0 = time.time()
        try:
            fn(c)
        except Exception as e:  # report every check, then fail
            failed += 1
            print(f"FAIL {name}: {type(e).__name__}: {e}")
            continue
        print(f"ok   {name} ({time.time() - t0:.2f}s)")
    print(f"{len(CHECKS) - failed}/{len(CHECKS)} checks passed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
