"""The opencl kernels for a CPU device (linear_cpu.cl, gemv_cpu.cl, attention_tiled), against float64
numpy on every shape and format they take: q4 (blocks 32, 64, 128, 256, a whole row; one token
on gemv_cpu.cl, alone, two layers paired into one launch, and gate, up and their MUL_SILU as one
launch; 2 to 15 tokens on its per-token gemv_q4_tokens), q8 (blocks
a multiple of 16, the value map's offset 128), fp32 and fp16 weights, with and without bias,
fused activations, output rows and tokens that are not multiples of the tiles, several token
groups, fp16 activation storage; attention over several key chunks, a query tile cut short,
head dims 64 and 12, a second prefill on the cache, a float mask. Each case also checks that the
kernel it meant to test ran (the shapes the CPU kernels cannot take, a q4 block whose slice
outgrows the device's local memory, and q8 layers of fewer than 16 tokens stay on linear.cl),
and the
hint "opencl_cpu_kernels" switches them off. Tolerances, relative to the largest expected
magnitude: 2e-5 for linear layers and 1e-5 for attention in fp32 storage, FP16_TOL (4e-3) in
fp16 storage.
"""
from __future__ import annotations

import numpy as np
import pytest

from mnnllm_core.core.weights.formats import ConvolutionWeights, FloatWeight
from mnnllm_core.errors import ConfigError
from mnnllm_core.plugins.manager import registry
from mnnllm_core.testing import FP16_TOL, Case, Graph, make_module, new_runtime, run_suite
from mnnllm_core.testing.cases import Step, Trial, randn, single
from mnnllm_core.testing.cases.attention import attention_op, feeds, steps_trial
from mnnllm_core.testing.cases.elementwise import binary_op
from mnnllm_core.testing.cases.linear import linear_op
from mnnllm_core.testing.harness import Weights
from mnnllm_core.testing.references import attention_reference, linear_reference, quantize

AVAILABLE, REASON = registry().get("opencl").is_available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=f"OpenCL unavailable: {REASON}")

LINEAR_TOL = 2e-5
ATTENTION_TOL = 1e-5
NO_ACT, RELU, RELU6 = 0, 1, 2


def kernels_ran(module) -> list[str]:
    return [e.program.kernel.function_name for _, e in module.session.pipeline.executions.values()
            if getattr(e, "program", None) is not None]


def expect_kernel(name: str):
    def check(outputs, module, runtime):
        ran = kernels_ran(module)
        return None if ran == [name] else f"ran {ran}, expected [{name!r}]"
    return check


def linear_case(label: str, kernel: str, tokens: int, oc: int, ic: int, weight: str, bits: int = 4,
                block: int = 64, bias: bool = False, act: int = NO_ACT, value_map: bool = False) -> Case:
    """weight: "q" (block-quantized, `bits`), "f32" or "f16"."""
    def build(rng) -> Trial:
        raw = randn(rng, oc, ic)
        if weight == "q":
            packed, dense = quantize(raw, bits, block)
            if value_map:
                packed.value_map = np.array([-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 9], np.int8)
                dense = packed.dequantize().astype(np.float64)
        else:
            dense = raw.astype(np.float16 if weight == "f16" else np.float32)
            packed = FloatWeight(oc, ic, dense)
        b = randn(rng, oc) if bias else None
        x = randn(rng, tokens, ic, 1, 1)
        expected = linear_reference(x, dense, b)
        expected = np.maximum(expected, 0) if act == RELU else np.clip(expected, 0, 6) if act == RELU6 else expected
        op = linear_op(oc, ic, Weights(conv=ConvolutionWeights(packed, b)), activation=act)
        return single(op, [x], [expected.reshape(tokens, oc, 1, 1)], checks=[expect_kernel(kernel)])
    return Case("Convolution", label, build, device_tol=LINEAR_TOL)


LINEAR_CASES = [
    linear_case("q4 block 64 oc 37 tokens 37 bias", "linear_cpu_q4", 37, 37, 576, "q", bias=True),
    linear_case("q4 block 32 oc 200 tokens 390 (two token groups)", "linear_cpu_q4", 390, 200, 96, "q", block=32),
    linear_case("q4 block 128 oc 16 tokens 16 relu", "linear_cpu_q4", 16, 16, 256, "q", block=128, act=RELU),
    linear_case("q4 block 256 oc 24 tokens 23", "linear_cpu_q4", 23, 24, 512, "q", block=256, bias=True),
    linear_case("q4 one block per row ic 576 tokens 17", "linear_cpu_q4", 17, 37, 576, "q", block=576),
    linear_case("q4 value map as q8 offset 128", "linear_cpu_q8", 21, 9, 64, "q", block=32, value_map=True),
    linear_case("q8 block 16 oc 33 tokens 19 bias", "linear_cpu_q8", 19, 33, 48, "q", bits=8, block=16, bias=True),
    linear_case("q8 block 64 oc 37 tokens 37 relu6", "linear_cpu_q8", 37, 37, 576, "q", bits=8, act=RELU6),
    linear_case("fp32 weights oc 70 tokens 29 bias relu", "linear_cpu_f", 29, 70, 64, "f32", bias=True, act=RELU),
    linear_case("fp16 weights oc 64 ic 576 tokens 16", "linear_cpu_f", 16, 64, 576, "f16"),
    linear_case("q8 block 8 stays on linear.cl", "linear_q8", 37, 37, 40, "q", bits=8, block=8),
    linear_case("fp32 weights ic 17 stay on linear.cl", "linear_f", 37, 9, 17, "f32"),
    linear_case("q4 15 tokens bias on gemv_q4_tokens", "gemv_q4_tokens", 15, 37, 576, "q", bias=True),
    linear_case("q4 2 tokens block 32 oc 200 relu on gemv_q4_tokens", "gemv_q4_tokens", 2, 200, 96, "q", block=32,
                act=RELU),
    linear_case("q8 3 tokens stay on linear.cl", "linear_q8", 3, 37, 576, "q", bits=8),
    linear_case("one token q4 block 64 oc 37 bias (a group past oc)", "gemv_q4", 1, 37, 576, "q", bias=True),
    linear_case("one token q4 block 32 oc 200 relu", "gemv_q4", 1, 200, 96, "q", block=32, act=RELU),
    linear_case("one token q4 block 128 oc 64 ic 1536", "gemv_q4", 1, 64, 1536, "q", block=128),
    linear_case("one token q4 block 256 oc 24 bias relu6", "gemv_q4", 1, 24, 512, "q", block=256, bias=True,
                act=RELU6),
    linear_case("one token q4 one block per row ic 576", "gemv_q4", 1, 130, 576, "q", block=576),
    linear_case("one token q8 stays on linear.cl", "linear_q8", 1, 37, 576, "q", bits=8),
]


def attention_case(label: str, kernel: str, heads: int, kv_heads: int, dim: int, runs: tuple[int, ...],
                   window: int = 0) -> Case:
    """Prefills of `runs` tokens one after another on the cache; with `window`, a float mask
    that lets each query see only the last `window` keys."""
    def build(rng) -> Trial:
        total = sum(runs)
        q, k, v = (randn(rng, total, n, dim) for n in (heads, kv_heads, kv_heads))
        steps, start = [], 0
        for count in runs:
            end = start + count
            mask = np.zeros((1, 1, 1, 1), np.float32)
            bias = None
            if window:
                pos = np.arange(start, end)[:, None]
                keys = np.arange(end)[None, :]
                bias = np.where((keys <= pos) & (keys > pos - window), 0.0, -np.inf).astype(np.float32)
                mask = bias.reshape(1, 1, count, end)
            expected = attention_reference(q[start:end], k[:end], v[:end], bias=bias,
                                           causal_offset=None if window else start)
            steps.append(Step(feeds(q[start:end], k[start:end], v[start:end], mask),
                              [expected.reshape(count, heads * dim, 1, 1)]))
            start = end
        return steps_trial(attention_op(heads, kv_heads, dim), steps, checks=[expect_kernel(kernel)])
    return Case("Attention", label, build, tol=ATTENTION_TOL)


ATTENTION_CASES = [
    attention_case("causal prefill 130 tokens heads 9/3 dim 64", "attention_tiled", 9, 3, 64, (130,)),
    attention_case("causal prefill 37 tokens heads 6/1 dim 12", "attention_tiled", 6, 1, 12, (37,)),
    attention_case("two prefills on the cache 37 + 21 heads 4/2 dim 64", "attention_tiled", 4, 2, 64, (37, 21)),
    attention_case("float mask window 5 over 2 prefills heads 4/2 dim 16", "attention_tiled", 4, 2, 16, (19, 6),
                   window=5),
    attention_case("one token stays on attention", "attention", 9, 3, 64, (1,)),
]


def failures(results) -> list:
    return [(r.case.id, r.status, r.reason) for r in results if r.status != "pass"]


def test_cpu_linear_kernels_match_float64_numpy_on_every_shape_and_format_they_take() -> None:
    assert not failures(run_suite("opencl", cases=LINEAR_CASES))


def test_tiled_prefill_attention_matches_float64_numpy() -> None:
    assert not failures(run_suite("opencl", cases=ATTENTION_CASES))


def test_cpu_prefill_kernels_keep_fp16_storage_within_fp16_tolerance() -> None:
    cases = [c for c in LINEAR_CASES + ATTENTION_CASES if "stay" not in c.name]
    results = run_suite("opencl", hints={"opencl_fp16": True}, half=True, cases=cases)
    assert all(r.tolerance == FP16_TOL for r in results)
    assert not failures(results)


def test_a_q4_block_whose_slice_outgrows_local_memory_stays_on_linear_cl() -> None:
    local_bytes = new_runtime("opencl").runtime.device.device.local_mem_size
    ic = local_bytes // (16 * 4) // 32 * 32 + 32  # one block per row, 16 rows of it: over the limit
    case = linear_case(f"q4 one block per row ic {ic} tokens 16", "linear_q4", 16, 16, ic, "q", block=ic)
    assert not failures(run_suite("opencl", cases=[case]))


def test_the_hint_turns_the_cpu_prefill_kernels_off() -> None:
    cases = [linear_case("q4 tokens 37 on linear.cl", "linear_q4", 37, 37, 576, "q", bias=True),
             linear_case("q4 one token on linear.cl", "linear_q4", 1, 37, 576, "q", bias=True),
             attention_case("prefill 37 on attention", "attention", 9, 3, 64, (37,))]
    assert not failures(run_suite("opencl", hints={"opencl_cpu_kernels": False}, cases=cases))


@pytest.mark.parametrize("value", ["yes", 1])
def test_a_cpu_kernels_hint_that_is_not_a_boolean_is_a_config_error_naming_it(value) -> None:
    results = run_suite("opencl", hints={"opencl_cpu_kernels": value}, cases=LINEAR_CASES[:1])
    assert results[0].status != "pass" and "opencl_cpu_kernels" in results[0].reason


def one_token_layers(graph: Graph, x, rng, specs, ic: int = 576) -> tuple[list, list]:
    """q4 linear layers of `specs` (oc, bias, activation) on x: their outputs and (dense, bias, act)."""
    outputs, layers = [], []
    for oc, bias, act in specs:
        packed, dense = quantize(randn(rng, oc, ic), 4, 64)
        b = randn(rng, oc) if bias else None
        layers.append((dense, b, act))
        outputs += graph.add(linear_op(oc, ic, Weights(conv=ConvolutionWeights(packed, b)), activation=act), [x])
    return outputs, layers


def layer_reference(x: np.ndarray, dense, b, act) -> np.ndarray:
    expected = linear_reference(x, dense, b)
    return np.maximum(expected, 0) if act == RELU else expected


def replay_and_loop(module, feed):
    pipeline = module.session.pipeline
    replayed = module.forward(feed)
    assert pipeline.replayed
    pipeline.replay_enabled = False
    return replayed, module.forward(feed), pipeline.replay


def within(got: np.ndarray, expected: np.ndarray, tol: float) -> None:
    assert np.abs(got.reshape(expected.shape) - expected).max() <= tol * np.abs(expected).max()


@pytest.mark.parametrize("precision", ["normal", "low"])
def test_two_one_token_q4_layers_on_one_input_replay_as_one_gemv_launch_equal_to_two(precision: str) -> None:
    """q and k: the replay pairs them into gemv_q4_pair, whose outputs equal the two gemv_q4
    launches of the per-op loop bit for bit (sizes that leave a work-group straddling the two
    layers and one past the end), and float64 numpy within tolerance."""
    rng = np.random.default_rng(3)
    graph = Graph()
    x = graph.input("x")
    outputs, layers = one_token_layers(graph, x, rng, ((37, True, NO_ACT), (100, False, RELU)))
    module = make_module(graph.schedule(outputs), new_runtime("opencl", precision=precision), shape_mutable=False)
    feed = {"x": randn(rng, 1, 576, 1, 1)}
    replayed, looped, replay = replay_and_loop(module, feed)
    assert (replay.paired, replay.gated) == (1, 0)
    assert "gemv_q4_pair" in [s.kernel.function_name for s in replay.steps]
    for got, again, layer in zip(replayed, looped, layers):
        np.testing.assert_array_equal(got, again)
        within(got, layer_reference(feed["x"], *layer), FP16_TOL if precision == "low" else LINEAR_TOL)


@pytest.mark.parametrize("precision", ["normal", "low"])
@pytest.mark.parametrize("order", ["up, gate", "gate, up"])
def test_gate_up_and_their_mul_silu_replay_as_one_launch_equal_to_three(precision: str, order: str) -> None:
    """gate, up and MUL_SILU(up, gate) (an MLP): one gemv_q4_gated launch whose three outputs
    (gate's and up's too, which the graph also returns here) equal the per-op loop's bit for
    bit, whichever layer comes first, and float64 numpy within tolerance; 100 rows leave a
    work-group part empty."""
    rng = np.random.default_rng(5)
    graph = Graph()
    x = graph.input("x")
    outputs, layers = one_token_layers(graph, x, rng, ((100, True, NO_ACT), (100, False, NO_ACT)))
    up, gate = outputs if order == "up, gate" else outputs[::-1]
    (mlp,) = graph.add(binary_op("MUL_SILU"), [up, gate])
    module = make_module(graph.schedule([mlp, *outputs]), new_runtime("opencl", precision=precision),
                         shape_mutable=False)
    feed = {"x": randn(rng, 1, 576, 1, 1)}
    replayed, looped, replay = replay_and_loop(module, feed)
    assert (replay.paired, replay.gated) == (1, 1)
    assert [s.kernel.function_name for s in replay.steps if hasattr(s, "kernel")] == ["gemv_q4_gated"]
    for got, again in zip(replayed, looped):
        np.testing.assert_array_equal(got, again)
    tol = FP16_TOL if precision == "low" else LINEAR_TOL
    first, second = (layer_reference(feed["x"], *layer) for layer in layers)
    a, b = (first, second) if order == "up, gate" else (second, first)
    within(replayed[0], a * b / (1 + np.exp(-b)), tol)
    within(replayed[1], first, tol)
    within(replayed[2], second, tol)
