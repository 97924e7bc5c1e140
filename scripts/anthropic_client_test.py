#!/usr/bin/env python3
"""End-to-end test of `glmctl serve`'s Anthropic Messages API with the official
`anthropic` Python client.

Run against a live server:

    python3 scripts/anthropic_client_test.py --base-url http://127.0.0.1:8000 \
        --api-key KEY --model NAME [--scripted]

cmd/glmctl/serve_test.go runs it against the real `glmctl serve` on the tiny CPU
model. Its random weights write gibberish, so the checks are about the API:
shapes, event order, stop reasons, usage, count_tokens, tools offered and sent
back, auth and error bodies. With --scripted, pkg/server's test runs it against
the server on its scripted backend, where a prompt "SCRIPT:<name>" makes the
model write a fixed text: thinking, a tool call, a stop sequence. Then the
checks also hold the exact thinking, text and tool_use blocks, streamed and not.

Needs `pip install anthropic` (scripts/requirements-test.txt pins it).
"""

import argparse
import json
import sys
import time
import urllib.error
import urllib.request

import glmctl_metrics  # noqa: E402 (this script's directory is on sys.path)

try:
    import anthropic
    from anthropic import Anthropic
except ImportError as e:  # the Go test turns this into an install hint
    print(f"missing Python package: {e}; install it with: python3 -m pip install anthropic", file=sys.stderr)
    sys.exit(3)

CHECKS = []

WEATHER = {
    "name": "get_weather",
    "description": "Weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                     "required": ["city"]},
}
OFF = {"type": "disabled"}
ON = {"type": "enabled", "budget_tokens": 1024}
BLOCK_TYPES = {"text", "thinking", "tool_use"}
STOP_REASONS = {"end_turn", "max_tokens", "stop_sequence", "tool_use"}


def check(name, scripted_only=False):
    def deco(fn):
        CHECKS.append((name, fn, scripted_only))
        return fn
    return deco


def expect(cond, msg):
    if not cond:
        raise AssertionError(msg)


def user(text):
    return {"role": "user", "content": text}


def blocks(msg):
    """The content blocks as plain dicts (what the server sent)."""
    return [b.model_dump(exclude_none=True) for b in msg.content]


def text_of(msg, typ="text"):
    return "".join(getattr(b, "text" if typ == "text" else "thinking") for b in msg.content if b.type == typ)


def api_error(fn, cls, status, typ, contains=None):
    try:
        fn()
    except cls as e:
        expect(e.status_code == status, f"status {e.status_code}, want {status}")
        body = e.body if isinstance(e.body, dict) else {}
        expect(body.get("type") == "error" and isinstance(body.get("error"), dict),
               f"error body not in Anthropic's shape: {e.body!r}")
        expect(e.type == typ, f"error type {e.type!r}, want {typ!r} ({body})")
        expect(e.api_message, f"error without message: {body}")
        if contains is not None:
            expect(contains in e.api_message, f"error message {e.api_message!r} lacks {contains!r}")
        expect(e.request_id, "error response without request-id")
        return body
    raise AssertionError(f"no {cls.__name__} raised")


def check_message(m, c, max_tokens):
    """The shape every response message has."""
    expect(m.type == "message" and m.role == "assistant" and m.model == c.model, f"type {m.type}, role {m.role}, model {m.model}")
    expect(m.id.startswith("msg_"), f"id {m.id!r}")
    expect(all(b.type in BLOCK_TYPES for b in m.content), f"block types {[b.type for b in m.content]}")
    expect(m.stop_reason in STOP_REASONS, f"stop_reason {m.stop_reason!r}")
    expect((m.stop_sequence is not None) == (m.stop_reason == "stop_sequence"), f"stop_sequence {m.stop_sequence!r} with {m.stop_reason}")
    expect((m.stop_reason == "tool_use") == any(b.type == "tool_use" for b in m.content), "tool_use stop reason iff tool_use blocks")
    u = m.usage
    expect(u.input_tokens > 0 and 1 <= u.output_tokens <= max_tokens, f"usage {u}")
    if m.stop_reason == "max_tokens":
        expect(u.output_tokens == max_tokens, f"max_tokens stop after {u.output_tokens} of {max_tokens} tokens")
    for b in m.content:
        if b.type == "tool_use":
            expect(b.id.startswith("toolu_") and b.name and isinstance(b.input, dict), f"tool_use block {b}")
        if b.type == "thinking":
            expect(isinstance(b.signature, str), f"thinking block without signature: {b}")


def check_event_order(events):
    """Anthropic's order: message_start, then per block start, deltas of its
    kind, stop; then message_delta and message_stop. Returns the events' types."""
    types = [e.type for e in events]
    expect(types and types[0] == "message_start", f"first event {types[:1]}")
    expect(types[-2:] == ["message_delta", "message_stop"], f"last events {types[-2:]}")
    start = events[0].message
    expect(start.stop_reason is None and start.content == [] and start.usage.input_tokens > 0, f"message_start {start}")
    open_block, n = None, 0
    want_delta = {"text": "text_delta", "thinking": "thinking_delta", "tool_use": "input_json_delta"}
    for e in events[1:-2]:
        if e.type == "content_block_start":
            expect(open_block is None and e.index == n, f"block {e.index} starts while {open_block} is open (next {n})")
            open_block, n = e.content_block.type, n + 1
            expect(open_block in BLOCK_TYPES, f"block type {open_block}")
        elif e.type == "content_block_delta":
            expect(open_block is not None and e.index == n - 1, f"delta for block {e.index} (open {open_block}, {n})")
            expect(e.delta.type == want_delta[open_block], f"{e.delta.type} in a {open_block} block")
        elif e.type == "content_block_stop":
            expect(open_block is not None and e.index == n - 1, f"stop of block {e.index}")
            open_block = None
        else:
            raise AssertionError(f"unexpected event {e.type} between blocks")
    expect(open_block is None, "a block was left open")
    d = events[-2]
    expect(d.delta.stop_reason in STOP_REASONS and d.usage.output_tokens >= 1, f"message_delta {d}")
    return types


class Ctx:
    def __init__(self, args):
        self.args = args
        self.model = args.model
        self.scripted = args.scripted
        self.client = Anthropic(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=60)

    def kwargs(self, kw):
        """Defaults, and the sampling fields (temperature, top_p, top_k) moved
        to extra_body: this client version no longer takes them as arguments,
        and the server still reads them."""
        kw.setdefault("model", self.model)
        kw.setdefault("max_tokens", 16)
        kw.setdefault("messages", [user("Hello, who are you?")])
        extra = dict(kw.pop("extra_body", None) or {})
        for k in ("temperature", "top_p", "top_k"):
            if k in kw:
                extra.setdefault(k, kw.pop(k))
        if extra:
            kw["extra_body"] = extra
        return kw

    def create(self, **kw):
        return self.client.messages.create(**self.kwargs(kw))

    def stream(self, **kw):
        return self.client.messages.stream(**self.kwargs(kw))

    def count(self, **kw):
        kw.setdefault("model", self.model)
        return self.client.messages.count_tokens(**kw).input_tokens


@check("non-streamed, with a system prompt and the request id")
def _(c):
    raw = c.client.messages.with_raw_response.create(**c.kwargs(dict(
        max_tokens=12, temperature=0, system="Be brief.", messages=[user("Hi")])))
    m = raw.parse()
    rid = raw.headers.get("request-id")
    expect(rid and m.id == "msg_" + rid and m._request_id == rid, f"id {m.id!r}, request-id {rid!r}")
    check_message(m, c, 12)
    plain = c.create(max_tokens=1, messages=[user("Hi")])
    expect(m.usage.input_tokens > plain.usage.input_tokens, "the system prompt is rendered into the prompt")
    # system as text blocks is the same prompt as the string
    expect(c.count(system=[{"type": "text", "text": "Be brief."}], messages=[user("Hi")]) == m.usage.input_tokens,
           "system blocks and system string differ")


@check("multi-turn: the answer sent back, then another question")
def _(c):
    first = c.create(max_tokens=8, temperature=0, messages=[user("Tell me a story")])
    check_message(first, c, 8)
    turns = [user("Tell me a story"), first.to_param(), user("And then?")]
    second = c.create(max_tokens=8, temperature=0, messages=turns)
    check_message(second, c, 8)
    expect(second.usage.input_tokens > first.usage.input_tokens, f"{second.usage} vs {first.usage}")


@check("thinking: disabled gives no thinking blocks, enabled and disabled prompts differ by one token")
def _(c):
    off = c.create(max_tokens=8, temperature=0, thinking=OFF)
    check_message(off, c, 8)
    expect(all(b.type != "thinking" for b in off.content), f"thinking with thinking disabled: {blocks(off)}")
    on = c.create(max_tokens=8, temperature=0, thinking=ON)
    check_message(on, c, 8)
    default = c.create(max_tokens=8, temperature=0)
    expect(on.usage.input_tokens == off.usage.input_tokens == default.usage.input_tokens,
           "GLM-4.7's prompts end with <think> or </think>, one token each")
    expect(blocks(default) == blocks(on), "thinking is GLM's default")
    if not c.scripted:
        # GLM-4.7 starts the answer inside <think>: gibberish stays there.
        expect(on.content and on.content[0].type == "thinking", f"thinking on: {blocks(on)}")


@check("thinking and text blocks from GLM's reasoning", scripted_only=True)
def _(c):
    m = c.create(max_tokens=100, messages=[user("SCRIPT:think")])
    expect(blocks(m) == [{"type": "thinking", "thinking": "Let me think.", "signature": ""}, {"type": "text", "text": "Hello!"}],
           blocks(m))
    expect(m.stop_reason == "end_turn", m.stop_reason)
    with c.stream(max_tokens=100, messages=[user("SCRIPT:think")]) as s:
        kinds = [e.type for e in s]
        final = s.get_final_message()
    expect(blocks(final) == blocks(m) and final.usage.output_tokens == m.usage.output_tokens, f"{blocks(final)} vs {blocks(m)}")
    expect("thinking" in kinds and "text" in kinds, f"MessageStream events {kinds}")


@check("max_tokens stop reason")
def _(c):
    hit = 0
    for prompt in ("Once upon a time", "Count to ten", "The capital of France is"):
        m = c.create(max_tokens=4, temperature=0, thinking=OFF, messages=[user(prompt)])
        check_message(m, c, 4)
        hit += m.stop_reason == "max_tokens"
    expect(hit > 0, "no request of 4 tokens stopped at max_tokens")


@check("stop_sequences cut the text, stop_reason stop_sequence")
def _(c):
    if c.scripted:
        m = c.create(max_tokens=100, thinking=OFF, stop_sequences=["NEVER", "STOP"], messages=[user("SCRIPT:stopme")])
        expect(blocks(m) == [{"type": "text", "text": "one two "}], blocks(m))
        expect(m.stop_reason == "stop_sequence" and m.stop_sequence == "STOP", f"{m.stop_reason} {m.stop_sequence}")
        return
    for prompt in ("Once upon a time", "Tell me a story", "Write a long poem about the sea"):
        full = c.create(max_tokens=24, temperature=0, thinking=OFF, messages=[user(prompt)])
        text = text_of(full)
        if len(text) >= 6:
            break
    else:
        raise AssertionError(f"no prompt gave text long enough to test stop sequences: {text!r}")
    stop = text[len(text) // 2: len(text) // 2 + 2]
    cut = c.create(max_tokens=24, temperature=0, thinking=OFF, messages=[user(prompt)], stop_sequences=[stop])
    want = text[: text.index(stop)]
    expect(text_of(cut) == want and cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop,
           f"stop {stop!r}: got {text_of(cut)!r} ({cut.stop_reason}, {cut.stop_sequence!r}), want {want!r}")


@check("streaming with messages.stream equals the non-streamed answer")
def _(c):
    for thinking in (OFF, ON):
        kw = dict(messages=[user("Tell me a story")], max_tokens=16, temperature=0, thinking=thinking)
        whole = c.create(**dict(kw))
        with c.stream(**dict(kw)) as s:
            streamed_text = "".join(s.text_stream)
            final = s.get_final_message()
        expect(blocks(final) == blocks(whole), f"stream {blocks(final)} != whole {blocks(whole)}")
        expect(streamed_text == text_of(whole), f"text_stream {streamed_text!r} != {text_of(whole)!r}")
        expect(final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens
               and final.usage.input_tokens == whole.usage.input_tokens, f"{final.stop_reason} {final.usage} vs {whole.stop_reason} {whole.usage}")


@check("streaming raw events in Anthropic's order")
def _(c):
    for kw in (dict(thinking=OFF), dict(thinking=ON), dict(thinking=OFF, max_tokens=3)):
        kw.setdefault("max_tokens", 16)
        events = list(c.create(stream=True, temperature=0, **kw))
        check_event_order(events)
        expect(events[-2].usage.output_tokens <= kw["max_tokens"], f"usage {events[-2].usage}")
    # The event names on the wire equal the data's types, and a ping follows message_start.
    req = urllib.request.Request(c.args.base_url + "/v1/messages", method="POST", data=json.dumps(
        {"model": c.model, "max_tokens": 4, "stream": True, "messages": [user("Hi")]}).encode(),
        headers={"x-api-key": c.args.api_key, "content-type": "application/json", "anthropic-version": "2023-06-01"})
    with urllib.request.urlopen(req, timeout=60) as r:
        expect(r.headers.get("content-type", "").startswith("text/event-stream"), r.headers.get("content-type"))
        raw = r.read().decode()
    names = []
    for ev in raw.strip().split("\n\n"):
        lines = ev.split("\n")
        expect(len(lines) == 2 and lines[0].startswith("event: ") and lines[1].startswith("data: "), f"event framing {ev!r}")
        name = lines[0][len("event: "):]
        expect(json.loads(lines[1][len("data: "):])["type"] == name, f"event {name} with data {lines[1]}")
        names.append(name)
    expect(names[:2] == ["message_start", "ping"] and names[-1] == "message_stop", names)


@check("tools: offered with tool_choice auto, hidden by none, a tool_use round trip")
def _(c):
    q = [user("What is the weather in Paris?")]
    r = c.create(messages=q, tools=[WEATHER], tool_choice={"type": "auto"}, max_tokens=8)
    check_message(r, c, 8)
    plain = c.count(messages=q)
    with_tools = c.count(messages=q, tools=[WEATHER])
    expect(r.usage.input_tokens == with_tools > plain + 20, f"tools rendered: {plain} -> {with_tools} ({r.usage})")
    expect(c.count(messages=q, tools=[WEATHER], tool_choice={"type": "none"}) == plain, "tool_choice none hides the tools")
    turns = q + [
        {"role": "assistant", "content": [
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris", "days": 2}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "21C, sunny"}]},
    ]
    rt = c.create(messages=turns, tools=[WEATHER], max_tokens=8)
    check_message(rt, c, 8)
    expect(rt.usage.input_tokens > r.usage.input_tokens, f"{rt.usage} vs {r.usage}")
    err = turns[:-1] + [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "is_error": True,
                                                       "content": [{"type": "text", "text": "no such city"}]}]}]
    check_message(c.create(messages=err, tools=[WEATHER], max_tokens=4), c, 4)
    events = list(c.create(messages=turns, tools=[WEATHER], max_tokens=4, stream=True))
    check_event_order(events)


@check("tool_use blocks from GLM's tool call, streamed and not, and sent back", scripted_only=True)
def _(c):
    q = [user("SCRIPT:tool")]
    m = c.create(messages=q, tools=[WEATHER], max_tokens=200)
    check_message(m, c, 200)
    expect(m.stop_reason == "tool_use", m.stop_reason)
    expect([b.type for b in m.content] == ["thinking", "tool_use"], blocks(m))
    call = m.content[1]
    expect(call.name == "get_weather" and call.input == {"city": "Paris", "days": 3}, call)
    with c.stream(messages=q, tools=[WEATHER], max_tokens=200) as s:
        events = list(s)
        final = s.get_final_message()
    expect([b.type for b in final.content] == ["thinking", "tool_use"] and final.content[1].input == call.input
           and final.stop_reason == "tool_use", blocks(final))
    raw = list(c.create(messages=q, tools=[WEATHER], max_tokens=200, stream=True))
    types = check_event_order(raw)
    deltas = [e.delta for e in raw if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]
    expect(len(deltas) == 1 and json.loads(deltas[0].partial_json) == call.input, deltas)
    expect(types.count("content_block_start") == 2, types)
    # The answer goes back as the assistant turn, with the tool's result.
    turns = q + [m.to_param(), {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": call.id, "content": "21C"}, {"type": "text", "text": "SCRIPT:plain"}]}]
    back = c.create(messages=turns, tools=[WEATHER], max_tokens=100, thinking=OFF)
    expect(blocks(back) == [{"type": "text", "text": "Just an answer."}] and back.stop_reason == "end_turn", blocks(back))
    expect(any(e.type == "input_json" for e in events), f"MessageStream events {[e.type for e in events]}")


@check("count_tokens equals usage.input_tokens")
def _(c):
    kw = dict(system="You answer in French.", messages=[user("Hi"), {"role": "assistant", "content": "Bonjour"}, user("Ca va?")],
              tools=[WEATHER])
    n = c.count(**kw)
    m = c.create(max_tokens=2, **kw)
    expect(n == m.usage.input_tokens, f"count_tokens {n}, usage {m.usage}")
    expect(c.count(messages=[user("Hi")], thinking=OFF) == c.count(messages=[user("Hi")]), "thinking off costs the same")


@check("errors in Anthropic's shape: 400 invalid_request_error, 404 not_found_error")
def _(c):
    api_error(lambda: c.create(extra_body={"temperature": "hot"}), anthropic.BadRequestError, 400, "invalid_request_error", "temperature")
    api_error(lambda: c.create(top_k=-1), anthropic.BadRequestError, 400, "invalid_request_error", "top_k")
    api_error(lambda: c.create(temperature=1.5), anthropic.BadRequestError, 400, "invalid_request_error", "temperature")
    api_error(lambda: c.create(messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]),
        anthropic.BadRequestError, 400, "invalid_request_error", "messages.0.content.0.type")
    api_error(lambda: c.create(tool_choice={"type": "any"}), anthropic.BadRequestError, 400,
              "invalid_request_error", "needs tools")
    api_error(lambda: c.create(max_tokens=10_000_000), anthropic.BadRequestError, 400, "invalid_request_error",
              "maximum context length")
    api_error(lambda: c.create(extra_body={"max_tokens": None}), anthropic.BadRequestError, 400, "invalid_request_error",
              "max_tokens")
    api_error(lambda: c.create(model="claude-no-such-model"), anthropic.NotFoundError, 404, "not_found_error", "does not exist")
    api_error(lambda: c.count(model="claude-no-such-model", messages=[user("x")]), anthropic.NotFoundError, 404, "not_found_error")
    api_error(lambda: list(c.create(stream=True, max_tokens=0)), anthropic.BadRequestError, 400, "invalid_request_error",
              "max_tokens")


@check("auth: a wrong x-api-key is 401 authentication_error")
def _(c):
    if not c.args.api_key or c.args.api_key == "unused":
        return
    bad = Anthropic(base_url=c.args.base_url, api_key="wrong-key", max_retries=0, timeout=30)
    body = api_error(lambda: bad.messages.create(model=c.model, max_tokens=2, messages=[user("x")]),
                     anthropic.AuthenticationError, 401, "authentication_error", "x-api-key")
    expect(set(body) == {"type", "error"} and set(body["error"]) == {"type", "message"}, body)
    api_error(lambda: bad.messages.count_tokens(model=c.model, messages=[user("x")]), anthropic.AuthenticationError, 401,
              "authentication_error")
    api_error(lambda: list(bad.messages.create(model=c.model, max_tokens=2, messages=[user("x")], stream=True)),
              anthropic.AuthenticationError, 401, "authentication_error")
    # The header itself (this client version sends its key as a bearer token).
    for key, want in (("wrong-key", 401), (c.args.api_key, 200)):
        req = urllib.request.Request(c.args.base_url + "/v1/messages/count_tokens", method="POST",
                                     data=json.dumps({"model": c.model, "messages": [user("x")]}).encode(),
                                     headers={"x-api-key": key, "content-type": "application/json", "anthropic-version": "2023-06-01"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                status, body = r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            status, body = e.code, json.loads(e.read())
        expect(status == want, f"x-api-key {key!r}: status {status}, want {want}: {body}")
        if want == 401:
            expect(body["type"] == "error" and body["error"]["type"] == "authentication_error", body)


@check("a stream closed early is cancelled and frees its KV blocks")
def _(c):
    # max_tokens up to the end of the context (from /v1/models): the answer runs
    # far longer than reading four events takes, even on a loaded machine (1,000
    # tokens once finished, ~1 s, before the client closed: nothing to cancel).
    req = urllib.request.Request(c.args.base_url + "/v1/models",
                                 headers={"Authorization": "Bearer " + c.args.api_key})
    with urllib.request.urlopen(req, timeout=10) as r:
        ctx = json.loads(r.read())["data"][0]["max_model_len"]

    def open_and_close():
        stream = c.create(stream=True, max_tokens=ctx - 64, temperature=1.0)
        it = iter(stream)
        for _ in range(4):  # message_start, then the first block's start and deltas
            next(it)
        stream.close()

    glmctl_metrics.closed_stream_cancelled(c.args.base_url, open_and_close)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", required=True)
    p.add_argument("--api-key", default="unused")
    p.add_argument("--model", required=True)
    p.add_argument("--scripted", action="store_true", help="the server runs pkg/server's scripted test backend")
    p.add_argument("--only", default="", help="run only the checks whose name holds this text")
    args = p.parse_args()
    print(f"anthropic {anthropic.__version__} against {args.base_url}{' (scripted backend)' if args.scripted else ''}")
    c = Ctx(args)
    failed = ran = 0
    for name, fn, scripted_only in CHECKS:
        if (scripted_only and not args.scripted) or args.only not in name:
            continue
        ran += 1
        t0 = time.time()
        try:
            fn(c)
        except Exception as e:  # report every check, then fail
            failed += 1
            print(f"FAIL {name}: {type(e).__name__}: {e}")
            continue
        print(f"ok   {name} ({time.time() - t0:.2f}s)")
    print(f"{ran - failed}/{ran} checks passed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
