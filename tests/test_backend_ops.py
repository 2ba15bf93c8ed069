"""Every backend installed here through the conformance suite (mnnllm_core.testing), case by case.

No case may fail on any backend: an op the backend takes must match the float64 reference within
the case's tolerance (and, as in ggml's test-backend-ops, the cpu backend's result), and an op it
hands to cpu must still give the right numbers. Each backend must pass (run itself, not hand to
cpu) at least what it has always run, pinned in REQUIRED, and hand to cpu what it is known not to
run, pinned in HANDED_TO_CPU. A backend whose driver is missing is skipped with its probe's reason.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest

from mnnllm_core.core.backend import Runtime, ScheduleConfig
from mnnllm_core.plugins.manager import registry
from mnnllm_core.testing import FP16_TOL, INT8_KV_TOL, Case, CaseResult, Runner, all_cases, compare

CASES = all_cases()
# each backend as it is installed, and the cpu backend once more on its packed-weight kernels
BACKENDS = sorted(registry().runtime_creators()) + ["cpu/memory=low"]

OPENCL_BINARY = {"ADD", "SUB", "MUL", "REALDIV", "MAXIMUM", "MINIMUM", "POW", "SquaredDifference", "ATAN2", "MOD",
                 "FLOORDIV", "FLOORMOD", "MUL_SILU"}
VULKAN_BINARY = {"ADD", "SUB", "MUL", "REALDIV", "MUL_SILU", "MAXIMUM", "MINIMUM"}
VULKAN_UNARY = {"ABS", "NEG", "FLOOR", "CEIL", "SQUARE", "SQRT", "RSQRT", "EXP", "LOG", "SIN", "COS", "TAN", "ATAN",
                "RECIPROCAL", "SIGN", "SIGMOID", "TANH", "HARDSWISH", "SILU", "GELU", "GELU_STANDARD", "ERF"}
DEVICE_OPS = {"Convolution", "LayerNorm", "RoPE", "Raster", "Cast"}


def _opencl(case: Case) -> bool:
    if case.op_type in DEVICE_OPS | {"UnaryOp"}:
        return True
    if case.op_type == "Attention":  # KV slots: the device Attention keeps one sequence (the runner says so)
        return not {"head_dim%4", "sinks", "slots"} & case.tags
    return case.op_type == "BinaryOp" and case.dtype == "float32" and case.operation in OPENCL_BINARY \
        and "5d" not in case.tags


def _vulkan(case: Case) -> bool:
    if case.op_type == "Attention":
        return not {"sinks", "slots"} & case.tags
    if case.op_type in DEVICE_OPS:
        return True
    if case.op_type == "BinaryOp":
        return case.dtype == "float32" and case.operation in VULKAN_BINARY
    return case.op_type == "UnaryOp" and case.operation in VULKAN_UNARY


REQUIRED = {"cpu": lambda case: True, "cpu/memory=low": lambda case: True, "opencl": _opencl, "vulkan": _vulkan}
SINKS_CASE = "Attention[sinks, sliding window 4 heads=6/2 dim=16 prompt=9 decode=4]"  # no device kernel adds sinks
HANDED_TO_CPU = {
    "opencl": {"Attention[causal prefill heads=4/2 dim=6 tokens=3]",  # head_dim not a multiple of 4
               SINKS_CASE},
    "vulkan": {"BinaryOp[ADD int32]", "UnaryOp[ROUND sends halves away from zero]", SINKS_CASE},
}


@lru_cache(maxsize=None)
def runner(backend: str) -> Runner:
    name, _, memory = backend.partition("/memory=")
    ok, reason = registry().get(name).is_available()
    if not ok:
        pytest.skip(f"{name} unavailable: {reason}")
    return Runner(name, memory=memory or "normal")


@lru_cache(maxsize=None)
def on_cpu(case_id: str) -> CaseResult:
    return runner("cpu").run(next(c for c in CASES if c.id == case_id))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
@pytest.mark.parametrize("backend", BACKENDS)
def test_backend_runs_the_case_or_hands_it_to_cpu_and_never_fails(backend: str, case: Case) -> None:
    result = runner(backend).run(case)
    assert result.status != "fail", result.reason
    assert result.matches, f"the fallback to cpu gave wrong numbers: {result.reason}"
    if REQUIRED.get(backend, lambda c: False)(case):
        assert result.status == "pass", f"{backend} must run {case.id} itself: {result.reason}"
    if case.id in HANDED_TO_CPU.get(backend, ()):
        assert result.status == "unsupported" and result.reason.startswith(f"{backend} refused this {case.op_type}")
    if backend != "cpu" and result.status == "pass" and result.outputs is not None:
        reference = on_cpu(case.id)
        for k, (got, want) in enumerate(zip(result.outputs, reference.outputs)):
            error, problem = compare(got, want, result.tolerance)
            assert problem is None, f"output {k} against the cpu backend: {problem}"


def test_the_catalogue_covers_every_op_type_a_backend_sees_in_the_llm_graphs() -> None:
    types = {c.op_type for c in CASES}
    assert {"Convolution", "LayerNorm", "RoPE", "Attention", "BinaryOp", "UnaryOp", "Raster", "Cast",
            "GatherV2"} <= types
    dtypes = {c.dtype for c in CASES}
    assert {"float32", "int32"} <= dtypes


# the Attention cases a cpu run gets through quickly (not those with thousands of cached keys)
SHORT_ATTENTION = [c for c in CASES if c.op_type == "Attention" and "long" not in c.name
                   and not any(deep in c.name for deep in ("4096", "4059"))]


def test_attention_on_an_fp16_kv_cache_passes_within_the_fp16_tolerance_and_would_fail_at_fp32() -> None:
    """cpu honours the hint kv_fp16 and says so (kv_storage), so the runner compares its Attention
    at FP16_TOL; the same outputs at the fp32 tolerance fail (fp16 rows are off by ~5e-4)."""
    fp16 = Runner("cpu", hints={"kv_fp16": True})
    assert fp16.runtime.runtime.kv_storage() == "fp16"
    results = [fp16.run(case) for case in SHORT_ATTENTION]
    assert [(r.case.id, r.reason) for r in results if r.status != "pass"] == []
    assert {r.tolerance for r in results} == {FP16_TOL}
    over_fp32 = []
    for r in results:
        expected = r.case.trial().steps[-1].expected
        if r.outputs and expected:
            _, problem = compare(r.outputs[0], np.asarray(expected[0]), r.case.tolerance(reference=True))
            over_fp32 += [r.case.id] if problem else []
    assert len(over_fp32) > len(results) // 2, over_fp32


@pytest.mark.parametrize("mode", [9, 10])
def test_attention_on_int8_keys_passes_within_the_int8_tolerance(mode: int) -> None:
    cases = [c for c in SHORT_ATTENTION if c.name.startswith(("decode 4 steps", "causal prefill in chunks"))]
    results = [Runner("cpu", hints={"attention_mode": mode}).run(case) for case in cases]
    assert [(r.case.id, r.reason) for r in results if r.status != "pass"] == []
    assert {r.tolerance for r in results} == {INT8_KV_TOL}


def test_only_attention_takes_the_kv_storage_tolerance_and_a_backend_ignoring_it_keeps_float() -> None:
    attention = next(c for c in CASES if c.op_type == "Attention")
    binary = next(c for c in CASES if c.op_type == "BinaryOp" and c.dtype == "float32")
    assert [attention.tolerance(True, kv_storage=kind) for kind in ("float", "fp16", "int8")] == \
        [attention.tol, FP16_TOL, INT8_KV_TOL]
    assert binary.tolerance(True, kv_storage="int8") == binary.tol
    assert Runtime(ScheduleConfig(), {"kv_fp16": True, "attention_mode": 10}).kv_storage() == "float"
