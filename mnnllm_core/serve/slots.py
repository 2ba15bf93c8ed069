"""How many requests `mnnllm serve` decodes together (`--parallel`), and the KV memory that takes.

Every slot may grow to max_all_tokens tokens, so N slots reserve at most N x max_all_tokens x (the
model's KV bytes per token, fp32; less where the backend stores the cache narrower). `auto` (the
default) takes as many slots as fit in half the memory available at start, at most AUTO_MAX, and
1 where the backend cannot batch (its Attention is not slot-aware: requests then run one at a
time). An explicit N that does not fit the available memory is refused at start.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from ..llm.batch_engine import batch_refusal, kv_bytes_per_token
from ..llm.llm import Llm

AUTO_MAX = 4  # slots `auto` takes at most (a 2-core cpu gains little beyond)
AUTO_SHARE = 0.5  # of the available memory, what `auto` lets the KV slots take


@dataclass(frozen=True)
class SlotPlan:
    parallel: int
    kv_bytes: int  # the slots' KV cache at max_all_tokens each
    available: int | None  # bytes of memory available at start (None: unknown)
    refusal: str | None = None  # why the backend cannot batch

    def describe(self) -> str:
        mib = 1 << 20
        room = f" of {self.available / mib:.0f} MiB available" if self.available is not None else ""
        text = f"{self.parallel} slot(s): KV cache up to {self.kv_bytes / mib:.0f} MiB{room}"
        return text + (f" (one at a time: {self.refusal})" if self.refusal else "")


def available_memory() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (None where there is none)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def plan_slots(llm: Llm, asked: int | str) -> SlotPlan:
    """The slots to serve with: `asked` (an int >= 1, or "auto")."""
    refusal = batch_refusal(llm)
    per_slot = llm.config.max_all_tokens * kv_bytes_per_token(llm)
    available = available_memory()
    if asked == "auto":
        fits = AUTO_MAX if available is None or not per_slot else int(available * AUTO_SHARE // per_slot)
        parallel = 1 if refusal else max(1, min(AUTO_MAX, fits))
    else:
        parallel = int(asked)
        if parallel > 1 and refusal:
            raise ConfigError(f"--parallel {parallel}: this model cannot decode requests together: {refusal}",
                              field="parallel")
        if available is not None and parallel * per_slot > available:
            raise ConfigError(f"--parallel {parallel}: {parallel} x max_all_tokens {llm.config.max_all_tokens} "
                              f"tokens of KV cache take {parallel * per_slot >> 20} MiB, more than the "
                              f"{available >> 20} MiB available; lower --parallel or max_all_tokens",
                              field="parallel")
    return SlotPlan(parallel, parallel * per_slot, available, refusal if asked == "auto" else None)
