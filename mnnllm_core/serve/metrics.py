"""`/metrics` in Prometheus' text format: requests by outcome, completion tokens (a counter, and
tokens/s over the last minute), the queue, and the KV slots in use."""
from __future__ import annotations

import collections
import threading
import time
from typing import Any

WINDOW_S = 60.0  # the tokens/s gauge averages over this many seconds


class Throughput:
    """Completion tokens: the total, and the rate over the last WINDOW_S seconds (thread-safe)."""

    def __init__(self) -> None:
        self.total = 0
        self._recent: collections.deque[tuple[float, int]] = collections.deque()
        self._lock = threading.Lock()

    def add(self, tokens: int) -> None:
        now = time.monotonic()
        with self._lock:
            self.total += tokens
            self._recent.append((now, tokens))
            self._trim(now)

    def per_second(self) -> float:
        now = time.monotonic()
        with self._lock:
            self._trim(now)
            if not self._recent:
                return 0.0
            span = max(now - self._recent[0][0], 1.0)
            return sum(n for _, n in self._recent) / span

    def _trim(self, now: float) -> None:
        while self._recent and now - self._recent[0][0] > WINDOW_S:
            self._recent.popleft()


def render(status: dict[str, Any], throughput: Throughput, model: str) -> str:
    """The worker's status as Prometheus text exposition (version 0.0.4)."""
    label = f'model="{_escape(model)}"'
    lines = ["# HELP mnnllm_requests_total Requests by how they ended (rejected: the queue was full).",
             "# TYPE mnnllm_requests_total counter"]
    for outcome in ("served", "cancelled", "rejected", "failed"):
        lines.append(f'mnnllm_requests_total{{{label},outcome="{outcome}"}} {status.get(outcome, 0)}')
    gauges = [("mnnllm_completion_tokens_total", "counter", "Completion tokens generated.", throughput.total),
              ("mnnllm_completion_tokens_per_second", "gauge",
               f"Completion tokens per second over the last {WINDOW_S:.0f} s.", round(throughput.per_second(), 3)),
              ("mnnllm_queue_waiting", "gauge", "Requests waiting for a slot.", status["waiting"]),
              ("mnnllm_queue_size", "gauge", "Requests that may wait before new ones get 503.", status["queue_size"]),
              ("mnnllm_slots", "gauge", "Sequences that decode together (serve --parallel).", status["slots"]),
              ("mnnllm_slots_in_use", "gauge", "Slots running a request now.", status["slots_in_use"])]
    for name, kind, text, value in gauges:
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", f"{name}{{{label}}} {value}"]
    return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
