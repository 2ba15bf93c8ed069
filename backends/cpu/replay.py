"""The cpu backend's replay (CPUBackend.on_record): a resized pipeline as one flat list of calls
bound once, so a decode step pays no per-op Python (no reshapes, no shape checks, no branches):
mostly numba kernels with their arrays bound at record time, a BLAS call per fp32 linear.

Packed linears reading one input (q/k/v, gate/up) share one GEMV (`packed_linear.SharedInput`;
for 2..FEW_TOKENS rows the few-token GEMV);
their steps (`SharedGemvStep`) are resolved here, where the order is known: the first member's
place runs the GEMV, writing its own rows straight into its output when no padding rows are in
the way, and each later member copies its rows from the GEMV's result buffer at its own place
(its output buffer may still hold a live tensor before then).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

import numpy as np

from mnnllm_core.backend_api import Replay

from .ops.bias_activation import finish


@dataclass
class SharedGemvStep:
    """One packed linear's part of a GEMV of 1..FEW_TOKENS token rows: member `member` of `shared`
    (a SharedInput), x the input (the row for one token, else [tokens, ic]), out its flat output
    ([tokens][its rows]), then its bias and activation."""

    shared: Any
    member: int
    x: np.ndarray
    out: np.ndarray
    bias: np.ndarray | None
    activation: int
    threads: int

    @property
    def tokens(self) -> int:
        return 1 if self.x.ndim == 1 else self.x.shape[0]

    def targets(self) -> tuple[np.ndarray, ...]:
        """The GEMV's result buffers: [padded rows] per member for one token, else [tokens][padded rows]."""
        gemv = self.shared.gemv
        return gemv.targets if self.tokens == 1 else gemv.few_targets(self.tokens)

    @property
    def fits(self) -> bool:
        """Whether the GEMV can write this member's rows straight into its output (no padding rows)."""
        return self.out.size == self.targets()[self.member].size

    def gemv_call(self) -> Callable[[], Any]:
        """The GEMV of every member, this member's rows written into its output when they fit."""
        from .kernels.linear import _few_gemv, _few_gemv_parallel, _gemv, _gemv_parallel
        gemv = self.shared.gemv
        targets = list(self.targets())
        if self.fits:
            targets[self.member] = self.out
        first = gemv.first
        if self.tokens == 1:
            parallel = self.threads > 1 and gemv.parallel_worth
            kernel = _gemv_parallel if parallel else _gemv
        else:
            parallel = self.threads > 1 and gemv.few_parallel_worth(self.tokens)
            kernel = _few_gemv_parallel if parallel else _few_gemv
        extra = (self.threads,) if parallel else ()
        return partial(kernel, first.bits, gemv.codes, gemv.alphas, tuple(targets), gemv.starts, self.x,
                       first.n_blocks, first.block, *extra)

    def copy_call(self) -> Callable[[], Any]:
        """This member's rows from the GEMV's result buffer."""
        tokens, results = self.tokens, self.targets()[self.member]
        if tokens == 1:
            return partial(np.copyto, self.out, results[:self.out.size])
        rows = self.out.size // tokens
        return partial(np.copyto, self.out.reshape(tokens, rows), results.reshape(tokens, -1)[:, :rows])

    def finish_call(self) -> Callable[[], Any] | None:
        if self.bias is None and not self.activation:
            return None
        return partial(finish, self.out, self.bias, self.activation)


class CPUReplay(Replay):
    """The pipeline's steps (Replay.walk) as one list of calls: a callable step as it is, a
    SharedGemvStep as its GEMV (at the first member of its group), copy and finish. With
    `compiled` (memory "low", where the steps are numba kernels), each run of kernel calls
    `StepProgram` recognises becomes one compiled call (`kernels/program.py`); `programs`
    counts those, `kernel_calls` the calls they took in.

    The first run after a resize goes op by op (each on_execute keeps its own KV books), the
    second records: a pipeline whose shapes change every run (a prefill, a decode whose mask
    grows with the cache) never pays for a recording it would not replay.

    With a `team` (thread_num > 1, `kernels/team.py`) the programs run on the team's threads."""

    def __init__(self, commands, compiled: bool = False, team=None):
        super().__init__(commands)
        self.compiled = compiled
        self.team = team
        self.calls: list[Callable[[], Any]] = []
        self.programs = self.kernel_calls = 0
        self.looped = False  # whether the first run (op by op) is done

    def run(self) -> None:
        if self.looped:
            super().run()
            return
        for command in self.commands:
            command.execution.on_execute(command.inputs, command.outputs)
        self.looped = True

    def record(self, steps: list) -> None:
        calls: list[Callable[[], Any] | None] = []
        computed: dict[int, SharedGemvStep] = {}  # id of a SharedInput -> the member that runs its GEMV
        for step in steps:
            if not isinstance(step, SharedGemvStep):
                calls.append(step)
                continue
            first = computed.setdefault(id(step.shared), step)
            if first is step:
                calls.append(step.gemv_call())
            if first is not step or not step.fits:
                calls.append(step.copy_call())
            calls.append(step.finish_call())
        calls = [call for call in calls if call is not None]
        self.calls = self._compile(calls) if self.compiled else calls

    def _compile(self, calls: list[Callable[[], Any]]) -> list[Callable[[], Any]]:
        """Runs of calls a StepProgram takes as one program call each, the rest as they are."""
        from .step_program import StepProgram
        self.programs = self.kernel_calls = 0
        compiled: list[Callable[[], Any]] = []
        program = StepProgram(self.team)
        for call in calls:
            if program.add(call):
                continue
            compiled += self._close(program)
            program = StepProgram(self.team)
            compiled.append(call)
        return compiled + self._close(program)

    def _close(self, program) -> list[Callable[[], Any]]:
        """The program's one call (none for an empty program)."""
        if not len(program):
            return []
        self.programs += 1
        self.kernel_calls += len(program)
        return [program.bound()]

    def play(self) -> None:
        for call in self.calls:
            call()
