"""Run conformance cases on a backend, in the spirit of llama.cpp's test-backend-ops.

Each case runs as a one-op graph through the real core path on the backend under test (its
RuntimeManager, with the cpu backend as the backup): "pass" when every output matches the
float64 reference within the case's tolerance (and the op was lowered as the case says),
"fail" when one does not or the run raised, "unsupported" when the backend handed the op to
cpu, with the reason it gave (`Refused`), or had no kernel for it, or raised an UnsupportedError
while running (a limit it meets only at run time, such as a device's largest binding: reported
as "at run: ..."; a user sees the same typed error). An unsupported case still
checks the fallback's numbers (`matches`). With `perf`, the op's run (inputs already in place)
is timed: median microseconds over repeated runs.
"""
from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..core.kv_meta import KVMeta
from ..core.kv_slots import BatchMeta, SlotRows, slot_refusal
from ..errors import UnsupportedError
from ..express.runtime_manager import RuntimeManager
from ..express.static_module import Config, StaticModule
from .cases import Case, Trial, all_cases, perf_cases
from .harness import new_runtime, one_op_graph

log = logging.getLogger(__name__)

REFERENCE_BACKEND = "cpu"
PERF_SECONDS, PERF_RUNS, PERF_MAX_RUNS = 0.25, 5, 500


@dataclass
class CaseResult:
    case: Case
    status: str  # "pass" | "fail" | "unsupported"
    reason: str = ""  # the failure, or why the backend did not run the op
    error: float | None = None  # largest |got - expected| relative to the largest |expected| (at least 1)
    tolerance: float = 0.0
    matches: bool = True  # the numbers were right (for unsupported: those of the fallback)
    us_per_run: float | None = None
    outputs: list | None = field(default=None, repr=False)  # of the last step

    def as_dict(self) -> dict[str, Any]:
        return {"op": self.case.op_type, "case": self.case.name, "dtype": self.case.dtype, "status": self.status,
                "reason": self.reason, "error": self.error, "tolerance": self.tolerance, "matches": self.matches,
                "us_per_run": self.us_per_run}


def compare(got: np.ndarray, want: np.ndarray, tol: float) -> tuple[float, str | None]:
    """(error, problem): exact for integers and tol 0, else |got - want| <= tol * (max(1, max|want|) + |want|)."""
    got = np.asarray(got)
    if got.shape != want.shape:
        return float("inf"), f"shape {got.shape}, expected {want.shape}"
    if want.dtype.kind in "iub":
        if got.dtype != want.dtype:
            return float("inf"), f"dtype {got.dtype}, expected {want.dtype}"
        return (0.0, None) if np.array_equal(got, want) else (float("inf"), "integers differ")
    if got.dtype != np.float32:
        return float("inf"), f"dtype {got.dtype}, expected float32"
    if not want.size:
        return 0.0, None
    want64, got64 = want.astype(np.float64), got.astype(np.float64)
    scale = max(1.0, float(np.max(np.abs(want64))))
    with np.errstate(invalid="ignore"):
        diff = np.abs(got64 - want64)
    diff = np.where(got64 == want64, 0.0, diff)  # equal infinities
    if np.isnan(diff).any():
        return float("inf"), "NaN where the reference has a number"
    error = float(diff.max()) / scale
    if tol == 0:
        return error, None if error == 0 else f"not exact: {error:.3g}"
    bound = tol * (scale + np.abs(want64))
    return error, None if (diff <= bound).all() else f"error {error:.3g} over tolerance {tol:g}"


@dataclass
class Runner:
    """Runs cases on one backend; one RuntimeManager for all of them (each case resets its KV meta)."""

    backend: str
    precision: str = "normal"
    hints: dict[str, Any] = field(default_factory=dict)
    thread_num: int = 2
    half: bool = False  # the hints make the backend store activations as fp16
    memory: str = "normal"
    _runtime: RuntimeManager | None = field(default=None, repr=False)

    @property
    def runtime(self) -> RuntimeManager:
        if self._runtime is None:
            self._runtime = new_runtime(self.backend, self.thread_num, self.precision, self.hints or None,
                                        self.memory)
        return self._runtime

    @property
    def fp16(self) -> bool:
        """Whether fp16 tolerances apply: `half`, or precision "low" on a backend honouring it."""
        from ..plugins.manager import registry
        return self.half or (self.precision == "low" and "precision" in registry().get(self.backend).settings)

    @property
    def reference(self) -> bool:
        """The reference backend: cpu in fp32 on dequantized weights (any memory but "low")."""
        return self.backend == REFERENCE_BACKEND and self.memory != "low"

    def _tolerance(self, case: Case, module: StaticModule, runtime: RuntimeManager) -> float:
        """The case's tolerance for the KV storage the runtime running it uses, as that runtime
        reports it (`kv_storage`: a backend that ignores kv_fp16 or int8 keeps float), the
        backup's when the op was handed to it at load (an Attention, being stateful, is)."""
        handed = bool(module.session.pipeline.fallback_reasons)
        ran_on = runtime.backup_runtime if handed else runtime.runtime
        return case.tolerance(self.reference, self.fp16, ran_on.kv_storage())

    def run(self, case: Case, perf: bool = False) -> CaseResult:
        tol = case.tolerance(self.reference, self.fp16)
        trial = case.trial()
        module, problem, error = None, None, 0.0
        try:
            runtime = self.runtime  # bad hints are a ConfigError here: every case's result
            meta = runtime.kv_meta
            meta.previous = meta.remove = meta.add = 0
            meta.reserve, meta.batch = (), None
            info, first = one_op_graph(trial.op, trial.inputs, trial.outputs)
            module = StaticModule(info, runtime, Config(rearrange=True))
            tol = self._tolerance(case, module, runtime)
            refusal = _batch_refusal(module, trial)
            if refusal is not None:
                return CaseResult(case, "unsupported", refusal, None, tol)
            outputs, error, problem = _steps(module, meta, trial, list(first), first, tol)
            if problem is None and trial.error is not None:
                problem = f"expected {trial.error[0].__name__} ({trial.error[1]!r}), got outputs"
        except Exception as err:  # a case that raises is a result, never the end of the suite
            expected = trial.error
            if expected is None and isinstance(err, UnsupportedError) and module is not None:
                return CaseResult(case, "unsupported", f"at run: {err}", None, tol)
            if expected is None or not isinstance(err, expected[0]) or expected[1] not in str(err):
                problem = f"{type(err).__name__}: {err}"
            outputs = None
        fallbacks = module.session.pipeline.placement.fallbacks if module is not None else []
        if fallbacks:
            return CaseResult(case, "unsupported", fallbacks[0]["reason"], error, tol, problem is None,
                              outputs=outputs)
        if problem is None and outputs is not None:
            problem = _check_encoding(trial, module, runtime, outputs)
        if problem is not None:
            return CaseResult(case, "fail", problem, error, tol, False, outputs=outputs)
        result = CaseResult(case, "pass", "", error, tol, outputs=outputs)
        if perf and module is not None and trial.error is None:
            result.us_per_run = _time(module, meta, trial)
        return result


def _tokens(feeds: dict) -> int:
    """Tokens a step adds to a KV cache: the rows of its first input (q, for an Attention)."""
    return int(np.shape(next(iter(feeds.values())))[0]) if feeds else 0


def _batch_refusal(module: StaticModule, trial: Trial) -> str | None:
    """Why the backend cannot run the trial's batched steps (its Attention keeps one sequence), or None."""
    if not any(step.slots for step in trial.steps):
        return None
    refusal = slot_refusal([e for _, e in module.session.pipeline.executions.values()])
    return None if refusal is None else f"KV slots: {refusal}"


def _steps(module: StaticModule, meta, trial: Trial, names: list[str], first: dict, tol: float):
    outputs, worst = None, 0.0
    slot_metas = {0: meta}  # slot 0 is the layer's own cache, steered by the runtime's meta
    for step in trial.steps:
        feeds = first if step.feeds is None else dict(zip(names, step.feeds))
        if step.slots:
            outputs = _batched_step(module, meta, slot_metas, step.slots, feeds)
        else:
            meta.remove, meta.add, meta.reserve = step.remove, _tokens(feeds), step.reserve
            outputs = module.forward(feeds)
            meta.sync()
        for k, want in enumerate(step.expected or []):
            error, problem = compare(outputs[k], np.asarray(want), tol)
            worst = max(worst, error)
            if problem is not None:
                return outputs, worst, f"output {k}: {problem}"
    return outputs, worst, None


def _batched_step(module: StaticModule, meta, slot_metas: dict, slots, feeds: dict) -> list:
    """One forward of several slots' rows: each slot's KV meta adds its rows, then syncs."""
    groups, start = [], 0
    for slot, rows in slots:
        slot_meta = slot_metas.setdefault(slot, KVMeta())
        slot_meta.add = rows
        groups.append(SlotRows(slot, start, rows, slot_meta))
        start += rows
    meta.batch = BatchMeta(tuple(groups))
    try:
        outputs = module.forward(feeds)
    finally:
        meta.batch = None
    for group in groups:
        group.meta.sync()
    return outputs


def _check_encoding(trial: Trial, module: StaticModule, runtime: RuntimeManager, outputs) -> str | None:
    """The core's part of a case: no copies between backends, the commands it encoded, resizes,
    and the case's own checks."""
    copies = module.session.pipeline.placement.copies
    if copies:
        return f"{copies} copies between backends although every command ran on one"
    if trial.commands is not None:
        types = tuple(c.op.type for c in module.session.pipeline.commands)
        if types != tuple(trial.commands):
            return f"encoded as {list(types)}, expected {list(trial.commands)}"
    if trial.resizes is not None and module.resize_count != trial.resizes:
        return f"{module.resize_count} resizes, expected {trial.resizes}"
    for check in trial.checks:
        problem = check(outputs, module, runtime)
        if problem is not None:
            return problem
    return None


def _time(module: StaticModule, meta, trial: Trial) -> float:
    """Median microseconds of one run of the last step (its inputs stay uploaded); the KV
    meta is set so that every run attends to the same cached tokens."""
    pipeline = module.session.pipeline
    last = trial.steps[-1].feeds
    meta.remove = meta.add = _tokens(dict(enumerate(last)) if last is not None else _fed(trial))
    pipeline.execute()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < PERF_MAX_RUNS and (len(times) < PERF_RUNS or time.perf_counter() - start < PERF_SECONDS):
        t0 = time.perf_counter()
        pipeline.execute()
        times.append(time.perf_counter() - t0)
    meta.sync()
    return statistics.median(times) * 1e6


def _fed(trial: Trial) -> dict:
    return {k: v for k, v in enumerate(trial.inputs) if isinstance(v, np.ndarray)}


def select(op: str | None = None, perf: bool = False, name: str | None = None) -> list[Case]:
    """The cases of one op type (case-insensitive; all when None), the perf ones with `perf`;
    `name` keeps those whose variant contains it."""
    found = perf_cases() if perf else all_cases()
    if op:
        found = [c for c in found if c.op_type.lower() == op.lower()]
    if name:
        found = [c for c in found if name.lower() in c.name.lower()]
    return found


def run_suite(backend: str, op: str | None = None, perf: bool = False, precision: str = "normal",
              hints: dict[str, Any] | None = None, thread_num: int = 2, cases: Sequence[Case] | None = None,
              name: str | None = None, half: bool = False, memory: str = "normal") -> list[CaseResult]:
    """Every selected case on `backend` (see `select`)."""
    runner = Runner(backend, precision, dict(hints or {}), thread_num, half, memory)
    chosen = list(cases) if cases is not None else select(op, perf, name)
    results = []
    for case in chosen:
        results.append(runner.run(case, perf))
        log.debug("%s %s: %s", backend, case.id, results[-1].status)
    return results
