"""What a conformance case is: a `Case` is a cheap descriptor (op type, variant name, tolerances,
tags); `case.trial()` builds the op, the inputs and the expected outputs (deterministic: the
random data is seeded by the case's id). `op_type` is the type a backend sees: a Concat or a
Permute is lowered to "Raster" by the core, and its trial says so (`commands`), which the runner
checks too.

Tolerances, relative to the largest expected magnitude (at least 1): `tol` on the reference cpu
backend (fp32 on dequantized weights: 1e-5), `device_tol` on every other backend (and on cpu with
memory "low") (kernels that sum or round in another order: 2e-5 for linear layers, 3e-5 for
transcendental unary ops), and FP16_TOL when a backend stores activations as fp16 (precision
"low"). An Attention case takes at least the tolerance of the KV storage the run's backend
actually uses (`Runtime.kv_storage`, KV_TOL): FP16_TOL for the hint kv_fp16, INT8_KV_TOL for
attention_mode's int8 keys or values; a backend that ignores them keeps its float tolerance.
0 means exact (data movement, integers).

Why these values. fp16 keeps 11 significant bits: rounding moves a value by at most 2^-11 of
its magnitude (4.9e-4), and the cases' values (randn, queries up to 4x) reach a few units, so
fp16 activations or fp16 keys and values give errors of 1e-4 to 5e-4, and up to 2.4e-3 (cpu) and
3.4e-3 (vulkan on llvmpipe) on the long cases' queries sharpened 4x over 1500 to 4000 fp16 keys;
FP16_TOL = 4e-3 covers those.
int8 rows keep a scale per row of ~1/127 of the row's largest |x| (symmetric max/127 on the
device backends, (max - min)/255 on cpu): half a step is ~max|x|/254, 1.4e-2 for a randn row reaching
3.5, and keys' rounding moves the softmax weights too: seen up to 1.4e-2 on the short cases and
2.5e-2 on cpu's long ones (queries sharpened 4x over 2000 to 4000 int8 keys); INT8_KV_TOL = 3e-2
(the seeded data makes those figures exact repeats, not samples).
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from ...core.op import Op
from ..harness import Const

FP32_TOL = 1e-5
FP16_TOL = 4e-3
INT8_KV_TOL = 3e-2
KV_TOL = {"float": 0.0, "fp16": FP16_TOL, "int8": INT8_KV_TOL}  # by Runtime.kv_storage()

Check = Callable[[list, Any, Any], "str | None"]  # (outputs, module, runtime) -> a failure, or None


@dataclass
class Step:
    """One forward: the arrays fed (in the order of the trial's non-constant inputs; None: the
    trial's own), the expected outputs (None: not checked), and KV-meta tokens removed first
    (with `reserve`: runs of them kept, MNN's (begin, size) pairs). `slots`: a batched step
    (KV slots), its rows in order as (slot, rows) groups, each slot with its own KV meta."""

    feeds: list[np.ndarray] | None = None
    expected: list[np.ndarray] | None = None
    remove: int = 0
    reserve: tuple[tuple[int, int], ...] = ()
    slots: tuple[tuple[int, int], ...] = ()


@dataclass
class Trial:
    """One case made concrete. `error`: the typed error (class, text in its message) the case
    must raise instead of producing outputs. `resizes`: how often the module must have resized
    after the last step."""

    op: Op
    inputs: list
    steps: list[Step]
    outputs: int = 1
    commands: tuple[str, ...] | None = None
    checks: Sequence[Check] = ()
    resizes: int | None = None
    error: tuple[type, str] | None = None


@dataclass(frozen=True)
class Case:
    op_type: str
    name: str
    build: Callable[[np.random.Generator], Trial] = field(repr=False, compare=False)
    tol: float = FP32_TOL
    device_tol: float | None = None
    operation: str | None = None
    dtype: str = "float32"
    tags: frozenset[str] = frozenset()
    perf: bool = False

    @property
    def id(self) -> str:
        return f"{self.op_type}[{self.name}]"

    def trial(self) -> Trial:
        return self.build(np.random.default_rng(zlib.crc32(self.id.encode())))

    def tolerance(self, reference: bool, fp16: bool = False, kv_storage: str = "float") -> float:
        """The bound for the reference backend, or for another one (with fp16 activations), an
        Attention's loosened to its KV cache's `kv_storage` (see the module's docstring)."""
        tol = self.tol if reference else (self.device_tol if self.device_tol is not None else self.tol)
        if not tol:
            return tol
        if fp16 and self.dtype == "float32":
            tol = max(tol, FP16_TOL)
        if self.op_type == "Attention":  # float outputs whatever its mask's dtype
            tol = max(tol, KV_TOL[kv_storage])
        return tol


def single(op: Op, inputs: Sequence, expected: Sequence[np.ndarray], outputs: int = 1, **trial: Any) -> Trial:
    """A one-step trial fed the trial's arrays."""
    return Trial(op, list(inputs), [Step(None, list(expected))], outputs, **trial)


def randn(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def ints(*values: int) -> Const:
    return Const(np.asarray(values, np.int32))
