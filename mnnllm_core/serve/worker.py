"""The one model behind the server: generations run one at a time, in arrival order, on a
worker thread that owns the Llm. In front of it, a bounded queue of waiting jobs; a full
queue refuses at once. A job whose client has gone is dropped from the queue, or, when
running, stopped before its next token: the engine is then consistent (its history holds
exactly the tokens its KV cache holds), so the next request starts at once and still
reuses the common prefix."""
from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

from ..errors import MnnllmError
from ..llm.context import FINISHED
from ..llm.guided import GuidedSampler, TokenLogprob
from ..llm.llm import Llm
from ..llm.sampler import Sampler
from .metrics import Throughput
from .stops import StopMatcher

log = logging.getLogger(__name__)


class QueueFull(MnnllmError):
    """Every waiting place is taken."""


@dataclass(frozen=True)
class Generation:
    """What one request asks of the model."""

    prompt_ids: list[int]
    max_tokens: int
    sampler: Sampler | None = None
    stop: tuple[str, ...] = ()
    n: int = 1  # choices, one after another (the prompt's KV cache is reused)
    choice_sampler: Callable[[int], Sampler | GuidedSampler | None] | None = None  # per choice index, built
    # on the worker when the choice starts (a guided sampler serves one reply)

    def sampler_for(self, index: int) -> Sampler | GuidedSampler | None:
        return self.choice_sampler(index) if self.choice_sampler is not None else self.sampler


@dataclass(frozen=True)
class Task:
    """Work other than a generation (the embeddings of a request): `run(llm, cancelled)` on the
    worker thread, in turn with the generations; what it returns (None: cancelled, as `cancelled()`
    said) is the job's "done" value."""

    run: Callable[[Llm, Callable[[], bool]], Any]
    name: str = "task"


@dataclass(frozen=True)
class ChoiceEnd:
    """How one choice ended: its finish reason and, when asked for, its tokens' log-probabilities
    (the stop token left out)."""

    index: int
    finish_reason: str | None
    logprobs: list[TokenLogprob] | None = None


@dataclass(frozen=True)
class Outcome:
    finish_reason: str | None  # "stop" (stop token or sequence), "length"; None: cancelled (the last choice's)
    prompt_tokens: int
    cached_tokens: int  # prompt tokens whose KV came from the previous conversation
    completion_tokens: int  # sampled tokens, the stop token included
    waited_s: float
    prefill_s: float
    decode_s: float
    choices: list[ChoiceEnd] = field(default_factory=list)


class Job:
    """One generation and the way back to the request that asked for it (an asyncio queue
    of events on the server's loop, fed from the worker thread)."""

    def __init__(self, job_id: str, generation: Generation | Task):
        self.id = job_id
        self.generation = generation
        self.created = time.perf_counter()
        self._loop = asyncio.get_running_loop()
        self._events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._cancelled = threading.Event()
        self._withdraw = None

    def cancel(self) -> None:
        """The client has gone: stop, or never start. Harmless once finished."""
        self._cancelled.set()
        if self._withdraw is not None:
            self._withdraw(self)

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    async def events(self) -> AsyncIterator[tuple[str, Any]]:
        """("text", (choice index, str)) pieces and ("choice", ChoiceEnd) per choice, then ("done", Outcome)
        or ("error", exception); a Task's job: ("done", what it returned) or ("error", exception)."""
        while True:
            kind, value = await self._events.get()
            yield kind, value
            if kind in ("done", "error"):
                return

    def _send(self, kind: str, value: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(self._events.put_nowait, (kind, value))
        except RuntimeError:  # the server's loop has closed (shutdown): nobody is listening
            pass


class Worker:
    def __init__(self, llm: Llm, queue_size: int):
        if queue_size < 0:
            raise MnnllmError(f"the queue size must be >= 0, got {queue_size}", field="queue_size")
        self.llm = llm
        self.queue_size = queue_size
        self.counts = collections.Counter(served=0, cancelled=0, rejected=0, failed=0)
        self.throughput = Throughput()  # completion tokens, for /metrics
        self._waiting: collections.deque[Job] = collections.deque()
        self._running: Job | None = None
        self._stopping = False
        self._lock = threading.Condition()
        self._thread = threading.Thread(target=self._serve, name="mnnllm-serve-worker", daemon=True)

    # -- the server's side ---------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel what is running and waiting, and end the thread."""
        with self._lock:
            self._stopping = True
            jobs = list(self._waiting) + ([self._running] if self._running else [])
            self._lock.notify_all()
        for job in jobs:
            job.cancel()
        self._thread.join(timeout)

    def submit(self, job: Job) -> None:
        """Queue a job, or raise QueueFull when `queue_size` jobs already wait."""
        with self._lock:
            if self._stopping or self._full():
                self.counts["rejected"] += 1
                raise QueueFull(f"the server is busy: {len(self._waiting)} requests wait for the model "
                                f"(queue size {self.queue_size})", field="queue_size")
            job._withdraw = self._withdraw
            self._waiting.append(job)
            self._lock.notify_all()

    def _full(self) -> bool:
        """Whether a new job finds no place (called under the lock): one runs, `queue_size` wait."""
        return len(self._waiting) + (self._running is not None) > self.queue_size

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {"busy": self._running is not None, "waiting": len(self._waiting),
                    "queue_size": self.queue_size, "slots": 1, "slots_in_use": int(self._running is not None),
                    **self.counts}

    def _count(self, outcome: str) -> None:
        with self._lock:
            self.counts[outcome] += 1

    def _withdraw(self, job: Job) -> None:
        with self._lock:
            if job in self._waiting:
                self._waiting.remove(job)
                self.counts["cancelled"] += 1
                log.info("%s: cancelled while waiting", job.id)

    # -- the worker thread ---------------------------------------------------------------
    def _serve(self) -> None:
        while True:
            with self._lock:
                while not self._waiting and not self._stopping:
                    self._lock.wait()
                if self._stopping:
                    return
                job = self._running = self._waiting.popleft()
                job._withdraw = None
            try:
                self._run(job)
            finally:
                with self._lock:
                    self._running = None

    def _run(self, job: Job) -> None:
        llm, gen = self.llm, job.generation
        if job.cancelled:  # its client left between the queue and here
            self._count("cancelled")
            return
        if isinstance(gen, Task):
            self._run_task(job, gen)
            return
        started = time.perf_counter()
        cached = llm.cached_prefix(gen.prompt_ids)
        ends, totals = [], [0, 0.0, 0.0]  # completion tokens, prefill s, decode s over the choices
        finish = None
        for index in range(gen.n):
            try:
                finish, logprobs = self._choice(job, index, gen.sampler_for(index))
            except Exception as err:  # the request fails; the server goes on serving the next one
                log.exception("%s: generation failed", job.id)
                self._count("failed")
                llm.reset()  # start the next request from a clean engine
                job._send("error", err)
                return
            ctx = llm.context
            totals[0] += ctx.gen_seq_len
            totals[1] += ctx.prefill_us / 1e6
            totals[2] += ctx.decode_us / 1e6
            if finish is None:
                break
            ends.append(ChoiceEnd(index, finish, logprobs))
            job._send("choice", ends[-1])
        self.throughput.add(totals[0])
        outcome = Outcome(finish_reason=finish, prompt_tokens=len(gen.prompt_ids), cached_tokens=cached,
                          completion_tokens=totals[0], waited_s=started - job.created, prefill_s=totals[1],
                          decode_s=totals[2], choices=ends)
        self._count("served" if finish else "cancelled")
        _log_outcome(job.id, outcome)
        job._send("done", outcome)

    def _run_task(self, job: Job, task: Task) -> None:
        started = time.perf_counter()
        try:
            result = task.run(self.llm, lambda: job.cancelled)
        except Exception as err:  # the request fails; the server goes on serving the next one
            log.exception("%s: %s failed", job.id, task.name)
            self._count("failed")
            job._send("error", err)
            return
        self._count("cancelled" if result is None else "served")
        log.info("%s: %s %s in %.0f ms, waited %.0f ms", job.id, task.name,
                 "cancelled (client gone)" if result is None else "done", (time.perf_counter() - started) * 1e3,
                 (started - job.created) * 1e3)
        job._send("done", result)

    def _choice(self, job: Job, index: int, sampler) -> tuple[str | None, list[TokenLogprob] | None]:
        """Run one choice, sending its text; its finish reason (None: cancelled) and logprobs."""
        llm, gen = self.llm, job.generation
        stops = StopMatcher(gen.stop)
        finish = None
        pieces = llm.stream_text(gen.prompt_ids, gen.max_tokens, sampler)
        try:
            for piece in pieces:
                if job.cancelled:
                    break
                text, stopped = stops.feed(piece)
                if text:
                    job._send("text", (index, text))
                if stopped:
                    finish = "stop"
                    break
            else:
                tail = stops.flush()
                if tail:
                    job._send("text", (index, tail))
                finish = "stop" if llm.context.status == FINISHED else "length"
        finally:
            pieces.close()
        logprobs = None
        if isinstance(sampler, GuidedSampler) and sampler.top_logprobs is not None:
            logprobs = [lp for lp in sampler.logprobs if not llm.tokenizer.is_stop(lp.token)]
        return finish, logprobs


def _log_outcome(job_id: str, o: Outcome) -> None:
    decoded = max(o.completion_tokens - 1, 0)
    speed = f"{decoded / o.decode_s:.1f} tok/s" if o.decode_s > 0 else "-"
    log.info("%s: %s; %d prompt tokens (%d from the KV cache, %d prefilled in %.0f ms), %d completion tokens "
             "(%s), waited %.0f ms", job_id,
             f"finish {o.finish_reason}" if o.finish_reason else "cancelled (client gone)",
             o.prompt_tokens, o.cached_tokens, o.prompt_tokens - o.cached_tokens, o.prefill_s * 1e3,
             o.completion_tokens, speed, o.waited_s * 1e3)
