"""glmctl_metrics.py — what the client-test scripts (anthropic_client_test.py,
openai_responses_client_test.py) read from a running glmctl server's /metrics."""

from __future__ import annotations

import time
import urllib.request

CANCELLED = 'glmctl_engine_requests_finished_total{reason="cancelled"}'


def metric(base_url: str, name: str) -> float:
    """The value of one sample (name with its labels) on base_url/metrics."""
    with urllib.request.urlopen(base_url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"metric {name} not in /metrics")


STOPPED = 'glmctl_engine_requests_finished_total{reason="stop"}'


def closed_stream_cancelled(base_url: str, open_and_close, attempts: int = 3, timeout: float = 15.0) -> None:
    """open_and_close() opens a stream, reads a few events and closes it; the
    server must then cancel it and free its KV blocks (wait_one_cancelled). An
    attempt whose stream the model ended itself first (one more "stop" finish,
    nothing cancelled or running: an end-of-sequence token sampled at
    temperature 1 before the close reached the server) proves nothing either
    way and is run again, up to attempts times; anything else fails at once."""
    for _ in range(attempts):
        cancelled, stopped = metric(base_url, CANCELLED), metric(base_url, STOPPED)
        open_and_close()
        deadline = time.time() + timeout
        while time.time() < deadline:
            if metric(base_url, CANCELLED) - cancelled >= 1:  # then exactly one, nothing running, no KV
                wait_one_cancelled(base_url, cancelled, max(0.1, deadline - time.time()))
                return
            if metric(base_url, "glmctl_running_sequences") == 0 and metric(base_url, STOPPED) - stopped == 1:
                break  # ended by the model before the close reached the server: try again
            time.sleep(0.05)
        else:
            wait_one_cancelled(base_url, cancelled, 0.1)  # raises with what it sees
            return
    raise AssertionError(f"the model ended the stream itself before the close in all {attempts} attempts")


def wait_one_cancelled(base_url: str, cancelled_before: float, timeout: float = 15.0) -> None:
    """Waits until exactly one more request was cancelled and nothing runs or
    holds KV blocks; raises AssertionError with what it saw (and every finish
    counter) otherwise."""
    deadline = time.time() + timeout
    seen = None
    while time.time() < deadline:
        seen = (metric(base_url, CANCELLED) - cancelled_before, metric(base_url, "glmctl_running_sequences"),
                metric(base_url, "glmctl_kv_blocks_used"))
        if seen == (1, 0, 0):
            return
        time.sleep(0.05)
    finished = {r: metric(base_url, f'glmctl_engine_requests_finished_total{{reason="{r}"}}')
                for r in ("stop", "length", "cancelled", "error")}
    raise AssertionError(f"closed stream not cancelled, or still running or holding KV blocks after {timeout:.0f} s: "
                         f"(cancelled, running, KV blocks used) = {seen}, want (1, 0, 0); "
                         f"finished {finished}, cancelled before {cancelled_before}")
