#!/usr/bin/env python3
"""End-to-end test of `glmctl serve`'s OpenAI Responses API (POST /v1/responses)
with the official `openai` Python client.

Run against a live server:

    python3 scripts/openai_responses_client_test.py --base-url http://127.0.0.1:8000 \
        --api-key KEY --model NAME [--scripted]

cmd/glmctl/serve_test.go runs it against the real `glmctl serve` on the tiny CPU
model. Its random weights write gibberish, so the checks are about the API:
shapes, event order and sequence numbers, statuses, usage, function tools offered
and sent back, errors naming the field, auth. With --scripted, pkg/server's test
runs it against the server on its scripted backend, where a prompt
"SCRIPT:<name>" makes the model write a fixed text: reasoning then an answer, a
function call, a plain answer. Then the checks also hold the exact reasoning,
message and function_call items, streamed and not.

Needs `pip install openai` (scripts/requirements-test.txt pins it).
"""

import argparse
import json
import sys
import time
import urllib.error
import urllib.request

import glmctl_metrics  # noqa: E402 (this script's directory is on sys.path)

try:
    import openai
    from openai import OpenAI
except ImportError as e:  # the Go test turns this into an install hint
    print(f"missing Python package: {e}; install it with: python3 -m pip install openai", file=sys.stderr)
    sys.exit(3)

CHECKS = []

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]},
    "strict": False,
}
OFF = {"effort": "none"}
ON = {"effort": "high"}
ITEM_TYPES = {"reasoning", "message", "function_call"}
ITEM_PREFIX = {"reasoning": "rs_", "message": "msg_", "function_call": "fc_"}


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


def items(r):
    """The output items as plain dicts without their ids (which differ per
    request), what the server sent."""
    out = []
    for it in r.output:
        d = it.model_dump(exclude_none=True)
        d.pop("id", None)
        d.pop("call_id", None)
        out.append(d)
    return out


def reasoning_of(r):
    return "".join(c.text for it in r.output if it.type == "reasoning" for c in (it.content or []))


def api_error(fn, cls, status, param=None, contains=None):
    try:
        fn()
    except cls as e:
        expect(e.status_code == status, f"status {e.status_code}, want {status}")
        body = e.body if isinstance(e.body, dict) else {}
        expect(set(body) >= {"message", "type", "param", "code"}, f"error body not in OpenAI's shape: {e.body!r}")
        if param is not None:
            expect(body.get("param") == param, f"error param {body.get('param')!r}, want {param!r} ({body})")
        if contains is not None:
            expect(contains in (body.get("message") or ""), f"error message {body.get('message')!r} lacks {contains!r}")
        expect(e.request_id, "error response without x-request-id")
        return body
    raise AssertionError(f"no {cls.__name__} raised")


def check_response(r, c, max_output_tokens):
    """The shape every response has."""
    expect(r.object == "response" and r.model == c.model and r.id.startswith("resp_"), f"object {r.object}, model {r.model}, id {r.id}")
    expect(r.status in ("completed", "incomplete"), f"status {r.status!r}")
    expect((r.status == "incomplete") == (r.incomplete_details is not None and r.incomplete_details.reason == "max_output_tokens"),
           f"status {r.status} with incomplete_details {r.incomplete_details}")
    expect(r.error is None and r.store is False, f"error {r.error}, store {r.store}")
    for it in r.output:
        expect(it.type in ITEM_TYPES and it.id.startswith(ITEM_PREFIX[it.type]), f"item {it}")
        expect(it.status in ("completed", "incomplete"), f"item status {it.status}")
        if it.type == "message":
            expect(it.role == "assistant" and [p.type for p in it.content] == ["output_text"], f"message {it}")
        if it.type == "reasoning":
            expect(it.summary == [] and [p.type for p in it.content] == ["reasoning_text"], f"reasoning {it}")
        if it.type == "function_call":
            expect(it.call_id.startswith("call_") and it.name and isinstance(json.loads(it.arguments), dict), f"function_call {it}")
    u = r.usage
    expect(u.input_tokens > 0 and 1 <= u.output_tokens <= max_output_tokens and u.total_tokens == u.input_tokens + u.output_tokens,
           f"usage {u}")
    expect(0 <= u.output_tokens_details.reasoning_tokens <= u.output_tokens and u.input_tokens_details.cached_tokens >= 0, f"usage {u}")
    if r.status == "incomplete":
        expect(u.output_tokens == max_output_tokens, f"incomplete after {u.output_tokens} of {max_output_tokens} tokens")
    expect(isinstance(r.output_text, str), "output_text")


def check_event_order(events):
    """OpenAI's order: response.created, response.in_progress, then per item
    output_item.added, for a message or reasoning content_part.added, its
    deltas, its text done and content_part.done, for a function call the
    arguments' delta and done, then output_item.done; last response.completed
    or response.incomplete. sequence_number counts from 0. Returns the final
    response, whose output must be what the events built."""
    types = [e.type for e in events]
    expect([e.sequence_number for e in events] == list(range(len(events))), f"sequence numbers {[e.sequence_number for e in events]}")
    expect(types[:2] == ["response.created", "response.in_progress"], f"first events {types[:2]}")
    expect(types[-1] in ("response.completed", "response.incomplete"), f"last event {types[-1]}")
    first = events[0].response
    expect(first.status == "in_progress" and first.output == [] and first.usage is None, f"response.created {first}")
    built, state = [], "items"
    deltas = {"message": "response.output_text.delta", "reasoning": "response.reasoning_text.delta"}
    dones = {"message": "response.output_text.done", "reasoning": "response.reasoning_text.done"}
    for e in events[2:-1]:
        cur = built[-1] if built else None
        if e.type != "response.output_item.added":
            expect(cur is not None and e.output_index == len(built) - 1, f"{e.type} for item {e.output_index} of {len(built)}")
            item_id = getattr(e, "item_id", None) or e.item.id
            expect(item_id == cur["id"], f"{e.type} names item {item_id}, not {cur['id']}")
        if e.type == "response.output_item.added":
            expect(state == "items" and e.output_index == len(built) and e.item.status == "in_progress", f"{e.type} in state {state}: {e}")
            built.append(e.item.model_dump(exclude_none=True))
            state = "args" if e.item.type == "function_call" else "part"
        elif e.type == "response.content_part.added":
            expect(state == "part" and e.part.text == "", f"{e.type} in state {state}")
            cur["content"] = [e.part.model_dump(exclude_none=True)]
            state = "text"
        elif e.type in ("response.output_text.delta", "response.reasoning_text.delta"):
            expect(state == "text" and e.type == deltas[cur["type"]], f"{e.type} in a {cur['type']} item, state {state}")
            cur["content"][0]["text"] += e.delta
        elif e.type in ("response.output_text.done", "response.reasoning_text.done"):
            expect(state == "text" and e.type == dones[cur["type"]] and e.text == cur["content"][0]["text"], f"{e.type}: {e}")
            state = "part done"
        elif e.type == "response.content_part.done":
            expect(state == "part done" and e.part.model_dump(exclude_none=True) == cur["content"][0], f"{e.type}: {e}")
            state = "item done"
        elif e.type == "response.function_call_arguments.delta":
            expect(state == "args", f"{e.type} in state {state}")
            cur["arguments"] += e.delta
        elif e.type == "response.function_call_arguments.done":
            expect(state == "args" and e.arguments == cur["arguments"], f"{e.type}: {e}")
            state = "item done"
        elif e.type == "response.output_item.done":
            done = e.item.model_dump(exclude_none=True)
            expect(state == "item done" and done["status"] in ("completed", "incomplete"), f"{e.type} in state {state}: {e}")
            cur["status"] = done["status"]
            expect(done == cur, f"output_item.done {done} != built {cur}")
            state = "items"
        else:
            raise AssertionError(f"unexpected event {e.type}")
    expect(state == "items", f"stream ended in state {state}")
    final = events[-1].response
    expect(final.id == first.id and final.status == events[-1].type[len("response."):], f"final {final.id} {final.status}")
    expect([it.model_dump(exclude_none=True) for it in final.output] == built, "the final output differs from what the events built")
    return final


class Ctx:
    def __init__(self, args):
        self.args = args
        self.model = args.model
        self.scripted = args.scripted
        self.client = OpenAI(base_url=args.base_url + "/v1", api_key=args.api_key, max_retries=0, timeout=60)

    def kwargs(self, kw):
        kw.setdefault("model", self.model)
        kw.setdefault("max_output_tokens", 16)
        kw.setdefault("input", "Hello, who are you?")
        return kw

    def create(self, **kw):
        return self.client.responses.create(**self.kwargs(kw))

    def stream(self, **kw):
        return self.client.responses.stream(**self.kwargs(kw))


@check("non-streamed, with instructions and the request id")
def _(c):
    raw = c.client.responses.with_raw_response.create(**c.kwargs(dict(
        max_output_tokens=12, temperature=0, instructions="Be brief.", input="Hi", metadata={"k": "v"})))
    r = raw.parse()
    rid = raw.headers.get("x-request-id")
    expect(rid and r.id == "resp_" + rid and r._request_id == rid, f"id {r.id!r}, request-id {rid!r}")
    check_response(r, c, 12)
    expect(r.instructions == "Be brief." and r.max_output_tokens == 12 and r.temperature == 0 and r.metadata == {"k": "v"},
           f"echo: {r.instructions!r} {r.max_output_tokens} {r.temperature} {r.metadata}")
    plain = c.create(max_output_tokens=1, input="Hi")
    expect(r.usage.input_tokens > plain.usage.input_tokens, "the instructions are rendered into the prompt")
    # A developer message says what the instructions say.
    dev = c.create(max_output_tokens=1, input=[{"role": "developer", "content": "Be brief."}, user("Hi")])
    expect(dev.usage.input_tokens == r.usage.input_tokens, f"developer message {dev.usage} vs instructions {r.usage}")
    parts = c.create(max_output_tokens=1, input=[{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}])
    expect(parts.usage.input_tokens == plain.usage.input_tokens, "input_text parts and a string are the same prompt")


@check("multi-turn: the output sent back as input, then another question")
def _(c):
    first = c.create(max_output_tokens=8, temperature=0, input="Tell me a story")
    check_response(first, c, 8)
    turns = [user("Tell me a story"), *first.output, user("And then?")]
    second = c.create(max_output_tokens=8, temperature=0, input=turns)
    check_response(second, c, 8)
    expect(second.usage.input_tokens > first.usage.input_tokens, f"{second.usage} vs {first.usage}")


@check("reasoning: effort none gives no reasoning item; on and off prompts differ by one token")
def _(c):
    off = c.create(max_output_tokens=8, temperature=0, reasoning=OFF)
    check_response(off, c, 8)
    expect(all(it.type != "reasoning" for it in off.output) and off.usage.output_tokens_details.reasoning_tokens == 0,
           f"reasoning with effort none: {items(off)}")
    on = c.create(max_output_tokens=8, temperature=0, reasoning=ON)
    check_response(on, c, 8)
    expect(on.reasoning.effort == "high", f"reasoning echoed as {on.reasoning}")
    default = c.create(max_output_tokens=8, temperature=0)
    expect(on.usage.input_tokens == off.usage.input_tokens == default.usage.input_tokens,
           "GLM-4.7's prompts end with <think> or </think>, one token each")
    expect(items(default) == items(on), "reasoning is GLM's default")
    if not c.scripted:
        # GLM-4.7 starts the answer inside <think>: gibberish stays there.
        expect(on.output and on.output[0].type == "reasoning", f"reasoning on: {items(on)}")


@check("reasoning and message items from GLM's output", scripted_only=True)
def _(c):
    r = c.create(max_output_tokens=100, input="SCRIPT:think")
    check_response(r, c, 100)
    expect(items(r) == [
        {"type": "reasoning", "status": "completed", "summary": [], "content": [{"type": "reasoning_text", "text": "Let me think."}]},
        {"type": "message", "status": "completed", "role": "assistant",
         "content": [{"type": "output_text", "text": "Hello!", "annotations": [], "logprobs": []}]},
    ], items(r))
    expect(r.output_text == "Hello!" and r.status == "completed", f"{r.output_text!r} {r.status}")
    expect(r.usage.output_tokens_details.reasoning_tokens == len("Let me think."), f"usage {r.usage}")
    with c.stream(max_output_tokens=100, input="SCRIPT:think") as s:
        kinds = [e.type for e in s]
        final = s.get_final_response()
    expect(items(final) == items(r) and final.usage == r.usage, f"{items(final)} vs {items(r)}")
    expect("response.reasoning_text.delta" in kinds and "response.output_text.delta" in kinds, f"ResponseStream events {kinds}")


@check("max_output_tokens: status incomplete")
def _(c):
    hit = 0
    for prompt in ("Once upon a time", "Count to ten", "The capital of France is"):
        r = c.create(max_output_tokens=4, temperature=0, reasoning=OFF, input=prompt)
        check_response(r, c, 4)
        hit += r.status == "incomplete"
    expect(hit > 0, "no request of 4 tokens stopped at max_output_tokens")
    if c.scripted:
        r = c.create(max_output_tokens=3, input="SCRIPT:think")
        expect(r.status == "incomplete" and items(r) == [{"type": "reasoning", "status": "incomplete", "summary": [],
                                                          "content": [{"type": "reasoning_text", "text": "Let"}]}], items(r))


@check("streaming: events in OpenAI's order equal the non-streamed answer")
def _(c):
    for kw in (dict(reasoning=OFF), dict(reasoning=ON), dict(reasoning=OFF, max_output_tokens=3)):
        kw = {**dict(input="Tell me a story", max_output_tokens=16, temperature=0), **kw}
        whole = c.create(**dict(kw))
        events = list(c.create(stream=True, **dict(kw)))
        final = check_event_order(events)
        check_response(final, c, kw["max_output_tokens"])
        expect(items(final) == items(whole) and final.status == whole.status and final.usage == whole.usage,
               f"stream {final.status} {items(final)} {final.usage} != whole {whole.status} {items(whole)} {whole.usage}")
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        expect(text == whole.output_text, f"output_text deltas {text!r} != {whole.output_text!r}")
        # The SDK's stream helper assembles the same response (its
        # get_final_response wants response.completed; an incomplete response
        # is the last event's).
        with c.stream(**dict(kw)) as s:
            last = None
            for last in s:
                pass
            helper = s.get_final_response() if whole.status == "completed" else last.response
        expect(last.type == "response." + whole.status, f"helper's last event {last.type}")
        expect(items(helper) == items(whole) and helper.output_text == whole.output_text, f"helper {items(helper)}")
    # On the wire: "event: TYPE" and "data: JSON" of that type, no [DONE].
    req = urllib.request.Request(c.args.base_url + "/v1/responses", method="POST", data=json.dumps(
        {"model": c.model, "max_output_tokens": 4, "stream": True, "input": "Hi"}).encode(),
        headers={"authorization": "Bearer " + c.args.api_key, "content-type": "application/json"})
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
    expect(names[0] == "response.created" and names[-1] in ("response.completed", "response.incomplete"), names)


@check("function tools: offered with tool_choice auto, hidden by none, a function call round trip")
def _(c):
    q = [user("What is the weather in Paris?")]
    r = c.create(input=q, tools=[WEATHER], tool_choice="auto", max_output_tokens=8)
    check_response(r, c, 8)
    expect(len(r.tools) == 1 and r.tools[0].name == "get_weather" and r.tool_choice == "auto", f"tools echoed {r.tools} {r.tool_choice}")
    plain = c.create(input=q, max_output_tokens=1)
    none = c.create(input=q, tools=[WEATHER], tool_choice="none", max_output_tokens=1)
    expect(r.usage.input_tokens > plain.usage.input_tokens + 20, f"tools rendered: {plain.usage} -> {r.usage}")
    expect(none.usage.input_tokens == plain.usage.input_tokens, "tool_choice none hides the tools")
    turns = q + [
        {"type": "function_call", "call_id": "call_01", "name": "get_weather", "arguments": json.dumps({"city": "Paris", "days": 2})},
        {"type": "function_call_output", "call_id": "call_01", "output": "21C, sunny"},
    ]
    rt = c.create(input=turns, tools=[WEATHER], max_output_tokens=8)
    check_response(rt, c, 8)
    expect(rt.usage.input_tokens > r.usage.input_tokens, f"{rt.usage} vs {r.usage}")
    check_event_order(list(c.create(input=turns, tools=[WEATHER], max_output_tokens=4, stream=True)))


@check("function_call items from GLM's tool call, streamed and not, and sent back", scripted_only=True)
def _(c):
    q = [user("SCRIPT:tool")]
    r = c.create(input=q, tools=[WEATHER], max_output_tokens=200)
    check_response(r, c, 200)
    expect([it.type for it in r.output] == ["reasoning", "function_call"] and r.status == "completed", items(r))
    call = r.output[1]
    expect(call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris", "days": 3}, call)
    events = list(c.create(input=q, tools=[WEATHER], max_output_tokens=200, stream=True))
    final = check_event_order(events)
    expect(items(final) == items(r), f"{items(final)} vs {items(r)}")
    deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
    expect(len(deltas) == 1 and json.loads(deltas[0].delta) == {"city": "Paris", "days": 3}, deltas)
    with c.stream(input=q, tools=[WEATHER], max_output_tokens=200) as s:
        for _ in s:
            pass
        helper = s.get_final_response()
    expect([it.type for it in helper.output] == ["reasoning", "function_call"] and helper.output[1].arguments == call.arguments,
           items(helper))
    # The output goes back as input, with the function's result.
    turns = q + list(r.output) + [{"type": "function_call_output", "call_id": call.call_id, "output": "21C"}, user("SCRIPT:plain")]
    back = c.create(input=turns, tools=[WEATHER], max_output_tokens=100, reasoning=OFF)
    expect(back.output_text == "Just an answer." and back.status == "completed", items(back))


@check("errors: 400 naming the field in param, 404 for an unknown model")
def _(c):
    bad = openai.BadRequestError
    api_error(lambda: c.create(store=True), bad, 400, "store", "stores no responses")
    api_error(lambda: c.create(previous_response_id="resp_123"), bad, 400, "previous_response_id")
    api_error(lambda: c.client.responses.create(model=c.model), bad, 400, "input", "field required")
    api_error(lambda: c.create(extra_body={"temperature": "hot"}), bad, 400, "temperature")
    api_error(lambda: c.create(temperature=3), bad, 400, "temperature", "[0, 2]")
    api_error(lambda: c.create(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,AA=="}]}]),
              bad, 400, "input[0].content[0].type", "text only")
    api_error(lambda: c.create(input=[{"type": "item_reference", "id": "msg_1"}]), bad, 400, "input[0].type")
    api_error(lambda: c.create(tools=[{"type": "web_search"}]), bad, 400, "tools[0].type", "hosted tools")
    api_error(lambda: c.create(tool_choice="required"), bad, 400, "tool_choice", "needs tools")
    api_error(lambda: c.create(text={"format": {"type": "yaml"}}), bad, 400, "text.format.type", "must be")
    api_error(lambda: c.create(max_output_tokens=10_000_000), bad, 400, "max_output_tokens", "maximum context length")
    api_error(lambda: c.create(model="gpt-no-such-model"), openai.NotFoundError, 404, "model", "does not exist")
    api_error(lambda: list(c.create(stream=True, max_output_tokens=0)), bad, 400, "max_output_tokens")


@check("auth: a wrong key is 401")
def _(c):
    if not c.args.api_key or c.args.api_key == "unused":
        return
    wrong = OpenAI(base_url=c.args.base_url + "/v1", api_key="wrong-key", max_retries=0, timeout=30)
    api_error(lambda: wrong.responses.create(model=c.model, input="x", max_output_tokens=2), openai.AuthenticationError, 401)
    api_error(lambda: list(wrong.responses.create(model=c.model, input="x", max_output_tokens=2, stream=True)),
              openai.AuthenticationError, 401)


@check("a stream closed early is cancelled and frees its KV blocks")
def _(c):
    # No max_output_tokens: the answer may run to the end of the context, far
    # longer than reading five events takes even on a loaded machine.
    def open_and_close():
        stream = c.create(stream=True, max_output_tokens=None, temperature=1.0)
        it = iter(stream)
        for _ in range(5):  # created, in_progress, then the first item's added, part added and a delta
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
    print(f"openai {openai.__version__} (Responses API) against {args.base_url}{' (scripted backend)' if args.scripted else ''}")
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
