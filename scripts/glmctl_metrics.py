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
