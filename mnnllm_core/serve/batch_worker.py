"""The worker of `mnnllm serve --parallel N` (N > 1): up to N generations decode together in the
BatchEngine (llm/batch_engine.py), each in its own KV slot; the queue in front holds the rest, in
arrival order. A request joins the running batch between two steps, takes the free slot whose
cached history shares the longest prefix with its prompt (the prompt cache works per slot), and
streams its text as its tokens come; a cancelled request (client gone) or one that met a stop
sequence leaves its slot at the next step.

What the engine does not run (several choices, a guided sampler: constraints, logprobs; an
embeddings task) runs as the one-at-a-time Worker runs it, on the Llm's own conversation, once
the batch has drained; the jobs behind it wait their turn.
"""
from __future__ import annotations

import logging
import time
from typing import Any

from ..llm.batch_engine import BatchEngine, BatchSequence
from ..llm.llm import Llm
from .stops import StopMatcher
from .worker import ChoiceEnd, Generation, Job, Outcome, Worker, _log_outcome

log = logging.getLogger(__name__)


class _Stream:
    """One job's sequence in the engine: its text decoder, stop sequences and timings."""

    def __init__(self, job: Job, sequence: BatchSequence, llm: Llm):
        self.job, self.sequence = job, sequence
        self.decoder = llm.tokenizer.stream()
        self.stops = StopMatcher(job.generation.stop)
        self.admitted = time.perf_counter()
        self.first_token: float | None = None
        self.stopped = False  # a stop sequence ended the text


def batchable(generation: Any) -> bool:
    """Whether the engine runs this job: one choice with a plain sampler."""
    return isinstance(generation, Generation) and generation.n == 1 and generation.choice_sampler is None


class BatchWorker(Worker):
    def __init__(self, llm: Llm, queue_size: int, parallel: int, token_budget: int | None = None):
        super().__init__(llm, queue_size)
        options = {} if token_budget is None else {"token_budget": token_budget}
        self.engine = BatchEngine(llm, parallel, **options)
        self.parallel = parallel
        self._streams: dict[int, _Stream] = {}  # by sequence id

    def _full(self) -> bool:
        return len(self._waiting) + len(self._streams) + (self._running is not None) >= self.queue_size + self.parallel

    def status(self) -> dict[str, Any]:
        with self._lock:
            in_use = len(self._streams) + (self._running is not None)
            return {"busy": in_use > 0, "waiting": len(self._waiting), "queue_size": self.queue_size,
                    "slots": self.parallel, "slots_in_use": in_use, **self.counts}

    def stop(self, timeout: float = 10.0) -> None:
        for stream in list(self._streams.values()):
            stream.job.cancel()
        super().stop(timeout)

    # -- the worker thread ---------------------------------------------------------------
    def _serve(self) -> None:
        engine = self.engine
        while True:
            with self._lock:
                while not self._waiting and not self._streams and not self._stopping:
                    self._lock.wait()
                if self._stopping:
                    self._drop_all()
                    return
                admitted, alone = self._take()
            if alone is not None:
                self._run_alone(alone)
                continue
            for job in admitted:
                self._admit(job)
            self._drop_cancelled()
            try:
                emitted = engine.step()
            except Exception as err:  # every running request fails; the server goes on
                log.exception("a batch step failed")
                self._fail_all(err)
                continue
            for sequence, token in emitted:
                self._deliver(self._streams[sequence.id], token)
            for stream in [s for s in self._streams.values() if s.sequence.finished or s.stopped]:
                self._complete(stream)

    def _take(self) -> tuple[list[Job], Job | None]:
        """(under the lock) Jobs for the free slots, first come first served; or the job at the head
        of the queue that runs alone, once the batch has drained."""
        admitted: list[Job] = []
        while self._waiting and len(self._streams) + len(admitted) < self.parallel:
            if batchable(self._waiting[0].generation):
                admitted.append(self._waiting.popleft())
            elif not self._streams and not admitted:
                job = self._running = self._waiting.popleft()
                job._withdraw = None
                return [], job
            else:
                break
        for job in admitted:
            job._withdraw = None
        return admitted, None

    def _run_alone(self, job: Job) -> None:
        try:
            self._run(job)
        finally:
            with self._lock:
                self._running = None

    def _admit(self, job: Job) -> None:
        if job.cancelled:
            self._count("cancelled")
            return
        gen = job.generation
        try:
            sequence = self.engine.submit(gen.prompt_ids, gen.max_tokens, gen.sampler)
        except Exception as err:  # the request fails; the others go on
            self._count("failed")
            job._send("error", err)
            return
        with self._lock:
            self._streams[sequence.id] = _Stream(job, sequence, self.llm)

    def _drop_cancelled(self) -> None:
        """Requests whose client has gone leave their slot now (the engine frees it this step)."""
        for stream in [s for s in self._streams.values() if s.job.cancelled]:
            self.engine.cancel(stream.sequence)
            self._complete(stream)

    def _deliver(self, stream: _Stream, token: int) -> None:
        if stream.first_token is None:
            stream.first_token = time.perf_counter()
        self.throughput.add(1)
        if stream.stopped or self.llm.tokenizer.is_stop(token):
            return
        piece = stream.decoder.put(token)
        if not piece:
            return
        text, stopped = stream.stops.feed(piece)
        if text:
            stream.job._send("text", (0, text))
        if stopped:
            stream.stopped = True
            self.engine.cancel(stream.sequence)

    def _complete(self, stream: _Stream) -> None:
        """The request's end: its choice and outcome, or nothing more for a client that has gone."""
        with self._lock:
            self._streams.pop(stream.sequence.id, None)
        job, sequence = stream.job, stream.sequence
        finish = None
        if not job.cancelled:
            if not stream.stopped:
                tail, stream.stopped = stream.stops.feed(stream.decoder.flush())
                tail += "" if stream.stopped else stream.stops.flush()
                if tail:
                    job._send("text", (0, tail))
            finish = "stop" if stream.stopped else sequence.finish_reason
            job._send("choice", ChoiceEnd(0, finish))
        now = time.perf_counter()
        first = stream.first_token or now
        outcome = Outcome(finish_reason=finish, prompt_tokens=len(sequence.prompt), cached_tokens=sequence.cached,
                          completion_tokens=len(sequence.tokens), waited_s=stream.admitted - job.created,
                          prefill_s=first - stream.admitted, decode_s=now - first,
                          choices=[] if finish is None else [ChoiceEnd(0, finish)])
        self._count("served" if finish else "cancelled")
        _log_outcome(job.id, outcome)
        job._send("done", outcome)

    def _fail_all(self, err: Exception) -> None:
        for stream in list(self._streams.values()):
            self.engine.cancel(stream.sequence)
            with self._lock:
                self._streams.pop(stream.sequence.id, None)
            self._count("failed")
            stream.job._send("error", err)

    def _drop_all(self) -> None:
        """(under the lock, stopping) Every running request ends as cancelled."""
        for stream in list(self._streams.values()):
            self.engine.cancel(stream.sequence)
            stream.job._send("done", Outcome(None, len(stream.sequence.prompt), stream.sequence.cached,
                                             len(stream.sequence.tokens), 0.0, 0.0, 0.0))
        self._streams.clear()
