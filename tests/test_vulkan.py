"""The vulkan backend (the `vulkan` package; lavapipe on machines without a GPU) against the cpu
backend and float64 numpy.

Every op runs through the real core path (op_harness: shape inference, lowering, placement) on
a vulkan RuntimeManager and must not fall back to cpu. Tolerances, relative to the largest
expected magnitude: 1e-5 (fp32 everywhere); 2e-5 for linear layers, whose shader sums in
another order than BLAS and dequantizes as scale * sum(v x) + zero * sum(x).
Skipped only when Vulkan cannot build and run the probe shader (with the probe's reason).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from functools import lru_cache

import numpy as np
import pytest

from mnnllm_core.core.backend import ScheduleConfig
from mnnllm_core.core.dtypes import DT_FLOAT, DT_INT32
from mnnllm_core.core.op import Op
from mnnllm_core.express.op_weights import ConvolutionWeights
from mnnllm_core.express.quant import FloatWeight
from mnnllm_core.express.runtime_manager import RuntimeManager
from mnnllm_core.plugins.manager import registry
from mnnllm_core.schema.MNN.AttentionParam import AttentionParamT
from mnnllm_core.schema.MNN.Axis import AxisT
from mnnllm_core.schema.MNN.LayerNorm import LayerNormT
from mnnllm_core.schema.MNN.Permute import PermuteT
from mnnllm_core.schema.MNN.UnaryOp import UnaryOpT

from op_harness import Graph, Weights, make_module, new_runtime, run_op
from paths import CONFIG, REFERENCE
from references import attention_reference, conv_param, linear_reference, quantize, rope_tables
from backend_ops import assert_close, binary, cast, layernorm_op, on_cpu, rope_op

def vulkan_creator():
    """The vulkan RuntimeCreator, registered through the project's `mnnllm` entry points."""
    return registry().get("vulkan")


AVAILABLE, REASON = vulkan_creator().is_available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=f"Vulkan unavailable: {REASON}")

RNG = np.random.default_rng(11)
FP32, LINEAR_TOL = 1e-5, 2e-5


def randn(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


@lru_cache(maxsize=None)
def shared_vulkan() -> RuntimeManager:
    return RuntimeManager.create(ScheduleConfig(backend_type="vulkan", thread_num=2))


def on_vulkan(make_op, inputs, outputs: int = 1) -> list[np.ndarray]:
    """Run a fresh op on vulkan; every command must have stayed there."""
    result = run_op(make_op(), inputs, outputs, runtime=shared_vulkan())
    placement = result.placement
    assert not placement["fallbacks"] and placement["copies"] == 0, placement
    return result.outputs


# ------------------------------------------------------------------ runtime and availability

def test_runtime_reports_the_device_and_forces_static_shapes() -> None:
    runtime = shared_vulkan()
    assert runtime.static_shapes
    assert "maxStorageBufferRange" in runtime.runtime.device_name()
    assert vulkan_creator().devices()


def test_importing_the_plugin_does_not_touch_vulkan() -> None:
    script = ("import sys, mnnllm_backends.vulkan.plugin; assert 'vulkan' not in sys.modules, 'vulkan imported'; "
              "print('ok')")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr


def test_without_a_driver_the_backend_is_unavailable_with_a_reason_and_never_raises(tmp_path) -> None:
    script = textwrap.dedent("""
        from mnnllm_backends.vulkan.runtime import VulkanRuntimeCreator
        ok, reason = VulkanRuntimeCreator().is_available()
        assert not ok and reason, (ok, reason)
        print("unavailable:", reason)
    """)
    env = dict(os.environ, VK_ICD_FILENAMES=str(tmp_path / "none.json"), VK_DRIVER_FILES=str(tmp_path / "none.json"))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "unavailable:" in done.stdout


# ------------------------------------------------------------------ Raster (data movement)

@pytest.mark.parametrize("shape,perm", [((3, 5, 7), (2, 0, 1)), ((2, 3, 4, 5), (0, 2, 1, 3)), ((37, 9, 64), (1, 0, 2))])
def test_permute_runs_as_raster_regions_on_the_device(shape, perm) -> None:
    x = randn(*shape)

    def make():
        param = PermuteT()
        param.dims = list(perm)
        return Op("Permute", "p", param)
    np.testing.assert_array_equal(on_vulkan(make, [x])[0], x.transpose(perm))


def test_concat_of_int_and_float_tensors_copies_every_source() -> None:
    def make():
        param = AxisT()
        param.axis = 1
        return Op("Concat", "c", param)
    for dtype in (np.float32, np.int32):
        parts = [(randn(3, n, 5) * 100).astype(dtype) for n in (2, 1, 4)]
        np.testing.assert_array_equal(on_vulkan(make, parts)[0], np.concatenate(parts, axis=1))


# ------------------------------------------------------------------ BinaryOp

@pytest.mark.parametrize("operation", ["ADD", "SUB", "MUL", "REALDIV", "MUL_SILU", "MAXIMUM", "MINIMUM"])
@pytest.mark.parametrize("shape_a,shape_b", [((37, 1536, 1, 1), (37, 1536, 1, 1)), ((37, 1), (33,)),
                                             ((2, 1, 5), (3, 1)), ((7,), ()), ((2, 3, 5, 1, 3), (3, 5, 4, 1))])
def test_float_binary_ops_broadcast_like_the_cpu_backend(operation, shape_a, shape_b) -> None:
    a, b = randn(*shape_a), randn(*shape_b)
    if operation == "REALDIV":
        b = np.where(np.abs(b) < 0.1, 0.5, b).astype(np.float32)
    make = binary(operation)
    assert_close(on_vulkan(make, [a, b])[0], on_cpu(make, [a, b])[0])


@pytest.mark.parametrize("activation", [1, 2])
def test_binary_op_applies_its_activation(activation) -> None:
    a, b = randn(5, 9) * 5, randn(5, 9) * 5
    make = binary("ADD", activation)
    assert_close(on_vulkan(make, [a, b])[0], on_cpu(make, [a, b])[0])


def test_integer_binary_ops_fall_back_to_cpu() -> None:
    a, b = np.arange(6, dtype=np.int32), np.full(6, 3, np.int32)
    result = run_op(binary("ADD")(), [a, b], runtime=shared_vulkan())
    assert [f["type"] for f in result.placement["fallbacks"]] == ["BinaryOp"]
    np.testing.assert_array_equal(result.outputs[0], a + b)


# ------------------------------------------------------------------ Convolution as linear

@pytest.mark.parametrize("tokens", [1, 3, 37])
@pytest.mark.parametrize("bits,ic,block", [(4, 576, 64), (4, 96, 32), (4, 48, 16), (4, 40, 8), (8, 30, 30)])
def test_quantized_linear_matches_float64_on_the_dequantized_weight(tokens, bits, ic, block) -> None:
    oc = 37
    quantized, dense = quantize(randn(oc, ic), bits, block)
    bias, x = randn(oc), randn(tokens, ic, 1, 1)
    op = lambda: Op("Convolution", "q", conv_param(oc, ic), weights=Weights(conv=ConvolutionWeights(quantized, bias)))
    out, = on_vulkan(op, [x])
    assert_close(out, linear_reference(x, dense, bias).reshape(tokens, oc, 1, 1), LINEAR_TOL)


@pytest.mark.parametrize("tokens", [1, 5])
@pytest.mark.parametrize("oc,ic", [(3, 5), (31, 35), (64, 576)])
def test_float_linear_matches_float64(tokens, oc, ic) -> None:
    weight, x = randn(oc, ic), randn(tokens, ic, 1, 1)
    weights = Weights(conv=ConvolutionWeights(FloatWeight(oc, ic, weight), None))
    out, = on_vulkan(lambda: Op("Convolution", "f", conv_param(oc, ic), weights=weights), [x])
    assert_close(out, linear_reference(x, weight, None).reshape(tokens, oc, 1, 1), LINEAR_TOL)


@pytest.mark.parametrize("relu,relu6", [(True, False), (False, True)])
def test_linear_applies_its_fused_relu(relu, relu6) -> None:
    weight, bias, x = randn(12, 17) * 3, randn(12), randn(7, 17) * 3
    op = lambda: Op("Convolution", "act", conv_param(12, 17, relu, relu6), weights=Weights.dense(weight, bias))
    out, = on_vulkan(op, [x])
    assert_close(out, np.clip(linear_reference(x, weight, bias), 0, 6 if relu6 else np.inf), LINEAR_TOL)


def test_a_weight_over_max_storage_buffer_range_is_refused_and_runs_on_cpu() -> None:
    limit = shared_vulkan().runtime.device.max_range
    oc, ic = 8, limit // (8 * 4) + 1  # one fp32 weight buffer just over the limit
    weight = np.zeros((oc, ic), np.float32)
    weight[:, :3] = randn(oc, 3)
    x = np.zeros((1, ic, 1, 1), np.float32)
    x[0, :3, 0, 0] = randn(3)
    weights = Weights(conv=ConvolutionWeights(FloatWeight(oc, ic, weight), None))
    result = run_op(Op("Convolution", "big", conv_param(oc, ic), weights=weights), [x], runtime=shared_vulkan())
    assert [f["type"] for f in result.placement["fallbacks"]] == ["Convolution"]
    assert_close(result.outputs[0], (weight[:, :3] @ x[0, :3, 0, 0]).reshape(1, oc, 1, 1), LINEAR_TOL)


# ------------------------------------------------------------------ LayerNorm

@pytest.mark.parametrize("tokens", [1, 3, 37])
@pytest.mark.parametrize("width", [5, 17, 576])
@pytest.mark.parametrize("rms", [True, False])
def test_layernorm_matches_the_cpu_backend(tokens, width, rms) -> None:
    x, gamma, beta = randn(tokens, width) * 2 + 0.5, randn(width), None if rms else randn(width)
    make = layernorm_op(1e-5, rms, gamma, beta)
    assert_close(on_vulkan(make, [x])[0], on_cpu(make, [x])[0])


@pytest.mark.parametrize("tokens", [1, 7])
def test_fused_residual_layernorm_returns_the_sum_and_its_norm(tokens) -> None:
    a, b, gamma = randn(tokens, 576, 1, 1), randn(tokens, 576, 1, 1), randn(576)
    make = layernorm_op(1e-5, True, gamma, fmt="NC4HW4")
    for got, want in zip(on_vulkan(make, [a, b], 2), on_cpu(make, [a, b], 2)):
        assert_close(got, want)


def test_groups_two_axes_and_channel_axis_layernorms_match_the_cpu_backend() -> None:
    gamma, beta = randn(8), randn(8)
    cases = [(layernorm_op(1e-5, False, gamma, beta, group=3), randn(2, 6, 4) * 3 + 1),
             (layernorm_op(1e-6, False, axis=(-2, -1)), randn(3, 4, 5)),
             (layernorm_op(1e-5, False, randn(17), randn(17), fmt="NC4HW4"), randn(2, 17, 3, 5))]
    for make, data in cases:
        assert_close(on_vulkan(make, [data])[0], on_cpu(make, [data])[0])


# ------------------------------------------------------------------ UnaryOp, Cast

UNARY_INPUTS = {"SQRT": "positive", "RSQRT": "positive", "LOG": "positive", "RECIPROCAL": "nonzero"}


@pytest.mark.parametrize("operation", ["ABS", "NEG", "FLOOR", "CEIL", "SQUARE", "SQRT", "RSQRT", "EXP", "LOG", "SIN",
                                       "COS", "TAN", "ATAN", "RECIPROCAL", "SIGN", "SIGMOID", "TANH", "HARDSWISH",
                                       "SILU", "GELU"])
def test_unary_ops_match_the_cpu_backend_and_float64(operation) -> None:
    x = randn(37, 33) * 2
    if operation in ("SIN", "COS", "TANH", "SIGMOID", "SILU", "GELU", "HARDSWISH"):
        x[0, :6] = [0.0, -30.0, 30.0, 95.0, -0.5, 0.5]  # saturation, a large angle, halves
    if UNARY_INPUTS.get(operation) == "positive":
        x = np.abs(x) + 0.05
    elif UNARY_INPUTS.get(operation) == "nonzero":
        x = np.where(np.abs(x) < 0.1, 0.5, x)
    if operation == "TAN":
        x = np.tanh(x) * 1.4  # away from the poles
    x = x.astype(np.float32)
    make = lambda: Op("UnaryOp", operation.lower(), UnaryOpT(), extra={"operation": operation})
    got, want = on_vulkan(make, [x])[0], on_cpu(make, [x])[0]
    assert got.dtype == np.float32
    assert_close(got, want, 2e-5)
    from mnnllm_backends.cpu.ops.elementwise import UNARY
    assert_close(got, UNARY[operation](x.astype(np.float64)), 2e-5)


def test_an_unsupported_unary_op_falls_back_to_cpu() -> None:
    x = randn(3, 5)
    make = lambda: Op("UnaryOp", "erf", UnaryOpT(), extra={"operation": "ERF"})
    result = run_op(make(), [x], runtime=shared_vulkan())
    assert [f["type"] for f in result.placement["fallbacks"]] == ["UnaryOp"]
    assert_close(result.outputs[0], on_cpu(make, [x])[0])


def test_cast_between_int32_and_float32_matches_the_cpu_backend() -> None:
    x = np.array([[1.7, -1.7, 2.5, -0.2, 37.0, -2.5, 1e6 + 0.5, 0.0, 3.0]], np.float32)
    ids = np.arange(-3, 40, dtype=np.int32).reshape(1, -1)
    ids[0, -1] = 16777217  # not representable in fp32: rounds as the cpu backend does
    out, = on_vulkan(cast(DT_INT32), [x])
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, on_cpu(cast(DT_INT32), [x])[0])
    np.testing.assert_array_equal(out, x.astype(np.int32))
    floats, = on_vulkan(cast(DT_FLOAT), [ids])
    assert floats.dtype == np.float32
    np.testing.assert_array_equal(floats, on_cpu(cast(DT_FLOAT), [ids])[0])


# ------------------------------------------------------------------ RoPE

def norm_table(gamma: np.ndarray, rms: bool = True, beta: np.ndarray | None = None) -> LayerNormT:
    p = LayerNormT()
    p.axis, p.epsilon, p.useRmsnorm, p.gamma = [-1], 1e-6, rms, gamma.tolist()
    p.beta = None if beta is None else beta.tolist()
    return p


@pytest.mark.parametrize("tokens", [1, 3, 37])
@pytest.mark.parametrize("heads,kv_heads,dim,cut,norm", [(9, 3, 64, 0, None), (4, 1, 6, 0, None),
                                                         (5, 5, 10, 0, None), (4, 2, 16, 8, None),
                                                         (3, 1, 14, 7, None), (4, 2, 32, 0, "rms"),
                                                         (3, 3, 10, 6, "layer")])
def test_rope_matches_the_cpu_backend(tokens, heads, kv_heads, dim, cut, norm) -> None:
    q, k = randn(tokens, heads * dim, 1, 1) * 3, randn(tokens, kv_heads * dim, 1, 1) * 3
    cos, sin = rope_tables(np.arange(5, 5 + tokens), (cut or dim) // 2 * 2)
    if norm == "rms":
        norms = (norm_table(randn(dim)), norm_table(randn(dim)))
    elif norm == "layer":
        norms = (norm_table(randn(dim), False, randn(dim)), norm_table(randn(dim), False))
    else:
        norms = (None, None)
    make = rope_op(heads, kv_heads, dim, cut, *norms)
    for got, want in zip(on_vulkan(make, [q, k, cos, sin], 2), on_cpu(make, [q, k, cos, sin], 2)):
        assert_close(got, want)


# ------------------------------------------------------------------ Attention

def vulkan_runtime() -> RuntimeManager:
    return RuntimeManager.create(ScheduleConfig(backend_type="vulkan", thread_num=2))


class AttentionGraph:
    """One packed Attention op on its own vulkan runtime (which owns the KV meta)."""

    def __init__(self, heads, kv_heads, dim, kv_cache=True, scale=0.0, mask_dtype=np.float32):
        param = AttentionParamT()
        param.kvCache, param.attnScale, param.outputC4 = kv_cache, scale, True
        graph = Graph()
        inputs = [graph.input(n) for n in ("q", "k", "v")] + [graph.input("mask", mask_dtype)]
        out = graph.add(Op("Attention", "attn", param, extra={"heads": (heads, kv_heads, dim)}), inputs)
        self.runtime = vulkan_runtime()
        self.module = make_module(graph.schedule(out), self.runtime, shape_mutable=False)
        self.heads, self.dim = heads, dim

    def forward(self, q, k, v, mask) -> np.ndarray:
        feeds = {"q": q.reshape(q.shape[0], -1, 1, 1), "k": k.reshape(k.shape[0], -1, 1, 1),
                 "v": v.reshape(v.shape[0], -1, 1, 1), "mask": mask}
        out = self.module.forward(feeds)[0]
        placement = self.module.session.pipeline.placement
        assert not placement.fallbacks, placement.fallbacks
        return out.reshape(q.shape[0], self.heads, self.dim)

    def step(self, q, k, v, mask, remove: int = 0) -> np.ndarray:
        meta = self.runtime.kv_meta
        meta.remove, meta.add = remove, q.shape[0]
        out = self.forward(q, k, v, mask)
        meta.sync()
        return out


SCALAR_MASK = np.zeros((1, 1, 1, 1), np.float32)


def attention_cpu(q, k, v, mask, kv_cache=True, scale=0.0) -> np.ndarray:
    """The cpu backend on one prefill step."""
    param = AttentionParamT()
    param.kvCache, param.attnScale, param.outputC4 = kv_cache, scale, True
    heads, dim = q.shape[1], q.shape[2]
    op = Op("Attention", "attn", param, extra={"heads": (heads, k.shape[1], dim)})
    feeds = [q.reshape(q.shape[0], -1, 1, 1), k.reshape(k.shape[0], -1, 1, 1), v.reshape(v.shape[0], -1, 1, 1), mask]
    return run_op(op, feeds, runtime=new_runtime()).outputs[0].reshape(q.shape)


@pytest.mark.parametrize("tokens", [1, 7, 37])
@pytest.mark.parametrize("heads,kv_heads,dim", [(9, 3, 64), (4, 4, 8), (6, 1, 12), (3, 1, 5)])
def test_attention_prefill_with_scalar_mask_is_causal(tokens, heads, kv_heads, dim) -> None:
    attention = AttentionGraph(heads, kv_heads, dim)
    q, k, v = randn(tokens, heads, dim), randn(tokens, kv_heads, dim), randn(tokens, kv_heads, dim)
    got = attention.step(q, k, v, SCALAR_MASK)
    assert_close(got, attention_reference(q, k, v))
    assert_close(got, attention_cpu(q, k, v, SCALAR_MASK))


def test_attention_decode_grows_the_device_cache_past_its_first_capacity() -> None:
    from mnnllm_backends.vulkan.ops import MIN_CAPACITY
    heads, kv_heads, dim, prompt, steps = 9, 3, 64, MIN_CAPACITY - 3, 7
    attention = AttentionGraph(heads, kv_heads, dim)
    total = prompt + steps
    q, k, v = randn(total, heads, dim), randn(total, kv_heads, dim), randn(total, kv_heads, dim)
    attention.step(q[:prompt], k[:prompt], v[:prompt], SCALAR_MASK)
    for t in range(prompt, total):
        out = attention.step(q[t:t + 1], k[t:t + 1], v[t:t + 1], SCALAR_MASK)
        assert_close(out, attention_reference(q[t:t + 1], k[:t + 1], v[:t + 1], causal_offset=t))
    assert attention.module.resize_count == 2, "prefill shape, then one decode shape"
    caches = {id(e.cache) for e in executions(attention.module)}
    assert len(caches) == 1, "prefill and decode clones share one KV cache"
    cache = next(e.cache for e in executions(attention.module))
    assert cache.length == total and cache.capacity == 2 * MIN_CAPACITY


def executions(module):
    from mnnllm_backends.vulkan.ops import AttentionExecution
    found, seen = [], set()

    def walk(value, depth):
        if id(value) in seen or depth > 6:
            return
        seen.add(id(value))
        if isinstance(value, AttentionExecution):
            found.append(value)
            return
        if isinstance(value, dict):
            children = list(value.values())
        elif isinstance(value, (list, tuple, set)):
            children = list(value)
        elif hasattr(value, "__dict__") and type(value).__module__.startswith(("mnnllm", "op_harness")):
            children = list(vars(value).values())
        else:
            return
        for child in children:
            walk(child, depth + 1)
    walk(module, 0)
    assert found, "no vulkan AttentionExecution reachable from the module"
    return found


def test_attention_meta_remove_truncates_the_cache_before_appending() -> None:
    heads, kv_heads, dim = 4, 2, 8
    attention = AttentionGraph(heads, kv_heads, dim)
    q, k, v = randn(9, heads, dim), randn(9, kv_heads, dim), randn(9, kv_heads, dim)
    attention.step(q[:7], k[:7], v[:7], SCALAR_MASK)
    out = attention.step(q[7:9], k[7:9], v[7:9], SCALAR_MASK, remove=3)
    keys, values = np.concatenate([k[:4], k[7:9]]), np.concatenate([v[:4], v[7:9]])
    assert_close(out, attention_reference(q[7:9], keys, values, causal_offset=4))


@pytest.mark.parametrize("mask_dtype", [np.float32, np.int32])
def test_attention_applies_a_full_mask(mask_dtype) -> None:
    heads, kv_heads, dim, tokens = 4, 2, 8, 7
    attention = AttentionGraph(heads, kv_heads, dim, mask_dtype=mask_dtype)
    q, k, v = randn(tokens, heads, dim), randn(tokens, kv_heads, dim), randn(tokens, kv_heads, dim)
    if mask_dtype == np.int32:
        mask = (RNG.random((tokens, tokens)) < 0.6).astype(np.int32)
        np.fill_diagonal(mask, 1)
        bias = np.where(mask == 0, -np.inf, 0.0)
    else:
        mask = (RNG.standard_normal((tokens, tokens)) * 2).astype(np.float32)
        bias = mask.astype(np.float64)
    mask = mask.reshape(1, 1, tokens, tokens)
    got = attention.step(q, k, v, mask)
    assert_close(got, attention_reference(q, k, v, bias=bias, causal_offset=None))
    assert_close(got, attention_cpu(q, k, v, mask))


def test_attention_scale_and_no_cache_variants() -> None:
    heads, kv_heads, dim = 4, 2, 16
    scaled = AttentionGraph(heads, kv_heads, dim, scale=0.5)
    uncached = AttentionGraph(heads, kv_heads, dim, kv_cache=False)
    q, k, v = randn(7, heads, dim), randn(7, kv_heads, dim), randn(7, kv_heads, dim)
    assert_close(scaled.step(q, k, v, SCALAR_MASK), attention_reference(q, k, v, scale=0.5))
    for tokens in (5, 3, 1):  # no cache: each run sees only its own keys
        q, k, v = randn(tokens, heads, dim), randn(tokens, kv_heads, dim), randn(tokens, kv_heads, dim)
        assert_close(uncached.step(q, k, v, SCALAR_MASK), attention_reference(q, k, v))


def test_attention_without_cache_reads_every_key_when_keys_outnumber_queries() -> None:
    heads, kv_heads, dim, queries, keys = 4, 2, 8, 2, 5
    attention = AttentionGraph(heads, kv_heads, dim, kv_cache=False)
    q, k, v = randn(queries, heads, dim), randn(keys, kv_heads, dim), randn(keys, kv_heads, dim)
    mask = (RNG.standard_normal((queries, keys)) * 2).astype(np.float32)
    out = attention.forward(q, k, v, mask.reshape(1, 1, queries, keys))
    assert_close(out, attention_reference(q, k, v, bias=mask.astype(np.float64), causal_offset=None))


def test_attention_mask_with_fewer_rows_than_queries_is_a_typed_error_not_an_out_of_bounds_read() -> None:
    from mnnllm_core.errors import UnsupportedError
    heads, kv_heads, dim, tokens = 4, 2, 8, 7
    attention = AttentionGraph(heads, kv_heads, dim)
    q, k, v = randn(tokens, heads, dim), randn(tokens, kv_heads, dim), randn(tokens, kv_heads, dim)
    with pytest.raises(UnsupportedError, match="attention_mask"):
        attention.step(q, k, v, np.zeros((1, 1, 1, tokens), np.float32))


# ------------------------------------------------------------------ the shared model

def test_the_shared_model_gives_the_reference_greedy_tokens_with_vulkan_in_use() -> None:
    import mnnllm_core
    prompt = json.loads(REFERENCE.read_text())["prompts"][0]
    expected = prompt["mnn_cpp_q4_memory_normal"]["gen_ids"][:16]
    got = {}
    for backend in ("vulkan", "cpu"):
        llm = mnnllm_core.create(CONFIG)
        llm.set_config({"backend_type": backend, "sampler_type": "greedy", "thread_num": 2})
        llm.load()
        got[backend] = llm.generate(prompt["prompt_ids"], 16)[:len(expected)]
        if backend == "vulkan":
            placement = llm.placement()
    assert got["vulkan"] == got["cpu"] == expected, got
    on_vulkan_types = placement["op_types_per_backend"]["vulkan"]
    assert {"Convolution", "LayerNorm", "BinaryOp", "RoPE", "Attention", "UnaryOp", "Cast"} <= set(on_vulkan_types), \
        placement
    assert set(placement["ops_per_backend"]) == {"vulkan"} and placement["copies"] == 0, placement


@pytest.mark.skipif(shutil.which("glslangValidator") is None, reason="glslangValidator (glslang-tools) is not installed")
def test_committed_spirv_matches_the_glsl_sources(tmp_path) -> None:
    shaders = Path(__file__).resolve().parents[1] / "backends" / "vulkan" / "shaders"
    copy = tmp_path / "shaders"
    shutil.copytree(shaders, copy)
    for source in sorted(copy.glob("*.comp")):
        subprocess.run(["glslangValidator", "-V", "--quiet", str(source), "-o", str(source.with_suffix(".spv"))],
                       check=True, cwd=copy, capture_output=True)
        assert source.with_suffix(".spv").read_bytes() == (shaders / source.with_suffix(".spv").name).read_bytes()
