"""The opencl backend (pyopencl; pocl on machines without a GPU) against the cpu backend and
float64 numpy.

Every op runs through the real core path (op_harness: shape inference, lowering, placement)
on an opencl RuntimeManager, and must not fall back to cpu. Tolerances, relative to the
largest expected magnitude: 1e-5 in fp32 (2e-5 for the linear layers: dequantize-in-kernel
rounds differently from numpy's dequantize-then-BLAS), 4e-3 with fp16 storage.
Skipped only when no OpenCL driver can build and run a kernel (with the probe's reason).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
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
from references import attention_reference, conv_param, linear_reference, quantize, rope_tables
from backend_ops import assert_close, binary, cast, layernorm_op, on_cpu, rope_op
from paths import SHARED

AVAILABLE, REASON = registry().get("opencl").is_available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=f"OpenCL unavailable: {REASON}")

RNG = np.random.default_rng(7)
FP32, FP16 = 1e-5, 4e-3
MODEL = SHARED / "models" / "smollm2-135m-instruct-mnn-q4"


def randn(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def opencl_runtime(**hints) -> RuntimeManager:
    return RuntimeManager.create(ScheduleConfig(backend_type="opencl", thread_num=2), hints)


@lru_cache(maxsize=None)
def shared_opencl(**hints) -> RuntimeManager:
    return opencl_runtime(**hints)


def on_opencl(make_op, inputs, outputs: int = 1, runtime: RuntimeManager | None = None) -> list[np.ndarray]:
    """Run a fresh op on opencl; every command must have stayed there."""
    result = run_op(make_op(), inputs, outputs, runtime=runtime or shared_opencl())
    placement = result.placement
    assert not placement["fallbacks"] and placement["copies"] == 0, placement
    return result.outputs


# ------------------------------------------------------------------ runtime and availability

def test_runtime_reports_the_device_and_forces_static_shapes() -> None:
    runtime = shared_opencl()
    assert runtime.static_shapes
    assert runtime.runtime.device_name()
    assert registry().get("opencl").devices()


def test_programs_are_compiled_once_per_process() -> None:
    first, second = opencl_runtime(), opencl_runtime()
    a = first.create_backends()[0].program("norm.cl", "layernorm")
    b = second.create_backends()[0].program("norm.cl", "layernorm")
    assert a.kernel.program.int_ptr == b.kernel.program.int_ptr


@pytest.mark.parametrize("split", [3, 0, "eight", [8]])
def test_a_bad_linear_split_hint_is_a_config_error_naming_the_hint(split) -> None:
    from mnnllm_core.errors import ConfigError
    with pytest.raises(ConfigError, match="opencl_linear_split"):
        opencl_runtime(opencl_linear_split=split)


def test_without_a_driver_the_backend_is_unavailable_and_selecting_it_names_why(tmp_path) -> None:
    script = textwrap.dedent("""
        from mnnllm_core.core.backend import ScheduleConfig
        from mnnllm_core.errors import BackendError
        from mnnllm_core.express.runtime_manager import RuntimeManager
        from mnnllm_core.plugins.manager import registry
        ok, reason = registry().get("opencl").is_available()
        assert not ok and reason, (ok, reason)
        try:
            RuntimeManager.create(ScheduleConfig(backend_type="opencl"))
        except BackendError as err:
            assert "opencl" in str(err) and reason in str(err), str(err)
            print("unavailable:", reason)
        else:
            raise AssertionError("selecting opencl without a driver must fail")
    """)
    env = dict(os.environ, OCL_ICD_VENDORS=str(tmp_path), OCL_ICD_FILENAMES="")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "unavailable:" in done.stdout


# ------------------------------------------------------------------ Convolution as linear

LINEAR_TOL = 2e-5


@pytest.mark.parametrize("split", [1, 8])
@pytest.mark.parametrize("tokens", [1, 3, 37])
@pytest.mark.parametrize("bits,ic,block", [(4, 576, 64), (4, 96, 32), (4, 128, 128), (8, 576, 64), (8, 40, 8),
                                           (4, 48, 16), (8, 30, 30)])
def test_quantized_linear_matches_float64_on_the_dequantized_weight(split, tokens, bits, ic, block) -> None:
    oc = 37
    quantized, dense = quantize(randn(oc, ic), bits, block)
    bias, x = randn(oc), randn(tokens, ic, 1, 1)
    op = lambda: Op("Convolution", "q", conv_param(oc, ic), weights=Weights(conv=ConvolutionWeights(quantized, bias)))
    out, = on_opencl(op, [x], runtime=shared_opencl(opencl_linear_split=split))
    assert_close(out, linear_reference(x, dense, bias).reshape(tokens, oc, 1, 1), LINEAR_TOL)


def test_quantized_linear_with_a_value_map_reads_the_map() -> None:
    oc, ic, block = 9, 64, 32
    quantized, _ = quantize(randn(oc, ic), 4, block)
    quantized.value_map = np.array([-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 9], np.int8)
    dense = quantized.dequantize()
    x = randn(3, ic, 1, 1)
    op = lambda: Op("Convolution", "map", conv_param(oc, ic), weights=Weights(conv=ConvolutionWeights(quantized, None)))
    out, = on_opencl(op, [x])
    assert_close(out, linear_reference(x, dense, None).reshape(3, oc, 1, 1), LINEAR_TOL)


@pytest.mark.parametrize("split", [1, 4])
@pytest.mark.parametrize("tokens", [1, 5])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("oc,ic", [(3, 5), (9, 17), (64, 576), (31, 35)])
def test_float_linear_matches_float64(split, tokens, dtype, oc, ic) -> None:
    weight = randn(oc, ic).astype(dtype)
    x = randn(tokens, ic, 1, 1)
    weights = Weights(conv=ConvolutionWeights(FloatWeight(oc, ic, weight), None))
    out, = on_opencl(lambda: Op("Convolution", "f", conv_param(oc, ic), weights=weights), [x],
                     runtime=shared_opencl(opencl_linear_split=split))
    assert_close(out, linear_reference(x, weight, None).reshape(tokens, oc, 1, 1), LINEAR_TOL)


@pytest.mark.parametrize("relu,relu6", [(True, False), (False, True)])
def test_linear_applies_its_fused_relu(relu, relu6) -> None:
    weight, bias, x = randn(12, 17) * 3, randn(12), randn(7, 17) * 3
    op = lambda: Op("Convolution", "act", conv_param(12, 17, relu, relu6), weights=Weights.dense(weight, bias))
    out, = on_opencl(op, [x])
    assert_close(out, np.clip(linear_reference(x, weight, bias), 0, 6 if relu6 else np.inf), LINEAR_TOL)


# ------------------------------------------------------------------ LayerNorm

@pytest.mark.parametrize("tokens", [1, 3, 37])
@pytest.mark.parametrize("width", [5, 17, 576])
@pytest.mark.parametrize("rms", [True, False])
def test_layernorm_matches_the_cpu_backend(tokens, width, rms) -> None:
    x, gamma, beta = randn(tokens, width) * 2 + 0.5, randn(width), None if rms else randn(width)
    make = layernorm_op(1e-5, rms, gamma, beta)
    assert_close(on_opencl(make, [x])[0], on_cpu(make, [x])[0])


@pytest.mark.parametrize("tokens", [1, 7])
def test_fused_residual_layernorm_returns_the_sum_and_its_norm(tokens) -> None:
    a, b, gamma = randn(tokens, 576, 1, 1), randn(tokens, 576, 1, 1), randn(576)
    make = layernorm_op(1e-5, True, gamma, fmt="NC4HW4")
    for got, want in zip(on_opencl(make, [a, b], 2), on_cpu(make, [a, b], 2)):
        assert_close(got, want)


def test_groups_two_axes_and_channel_axis_layernorms_match_the_cpu_backend() -> None:
    x = randn(2, 6, 4) * 3 + 1
    gamma, beta = randn(8), randn(8)
    cases = [(layernorm_op(1e-5, False, gamma, beta, group=3), x),
             (layernorm_op(1e-6, False, axis=(-2, -1)), randn(3, 4, 5)),
             (layernorm_op(1e-5, False, randn(17), randn(17), fmt="NC4HW4"), randn(2, 17, 3, 5))]
    for make, data in cases:
        assert_close(on_opencl(make, [data])[0], on_cpu(make, [data])[0])


def test_a_layernorm_gamma_shorter_than_its_rows_is_a_format_error_not_an_out_of_bounds_read() -> None:
    from mnnllm_core.errors import FormatError
    make = layernorm_op(1e-5, True, randn(5))
    with pytest.raises(FormatError, match="gamma"):
        on_opencl(make, [randn(3, 8)])


# ------------------------------------------------------------------ RoPE

def rms_table(gamma: np.ndarray) -> LayerNormT:
    p = LayerNormT()
    p.axis, p.epsilon, p.useRmsnorm, p.gamma = [-1], 1e-6, True, gamma.tolist()
    return p


@pytest.mark.parametrize("tokens", [1, 3, 37])
@pytest.mark.parametrize("heads,kv_heads,dim,cut,norm", [(9, 3, 64, 0, False), (4, 1, 6, 0, False),
                                                         (4, 2, 16, 8, False), (4, 2, 32, 0, True)])
def test_rope_matches_the_cpu_backend(tokens, heads, kv_heads, dim, cut, norm) -> None:
    q, k = randn(tokens, heads * dim, 1, 1) * 3, randn(tokens, kv_heads * dim, 1, 1) * 3
    cos, sin = rope_tables(np.arange(5, 5 + tokens), cut or dim)
    norms = (rms_table(randn(dim)), rms_table(randn(dim))) if norm else (None, None)
    make = rope_op(heads, kv_heads, dim, cut, *norms)
    for got, want in zip(on_opencl(make, [q, k, cos, sin], 2), on_cpu(make, [q, k, cos, sin], 2)):
        assert_close(got, want)


# ------------------------------------------------------------------ Attention

class AttentionGraph:
    """One packed Attention op on its own opencl runtime (it owns the KV meta)."""

    def __init__(self, heads, kv_heads, dim, kv_cache=True, scale=0.0, mask_dtype=np.float32, **hints):
        param = AttentionParamT()
        param.kvCache, param.attnScale, param.outputC4 = kv_cache, scale, True
        graph = Graph()
        inputs = [graph.input(n) for n in ("q", "k", "v")] + [graph.input("mask", mask_dtype)]
        out = graph.add(Op("Attention", "attn", param, extra={"heads": (heads, kv_heads, dim)}), inputs)
        self.runtime = opencl_runtime(**hints)
        self.module = make_module(graph.schedule(out), self.runtime, shape_mutable=False)
        self.heads, self.dim = heads, dim

    def step(self, q, k, v, mask, remove: int = 0) -> np.ndarray:
        meta = self.runtime.kv_meta
        meta.remove, meta.add = remove, q.shape[0]
        seq = q.shape[0]
        feeds = {"q": q.reshape(seq, -1, 1, 1), "k": k.reshape(seq, -1, 1, 1), "v": v.reshape(seq, -1, 1, 1),
                 "mask": mask}
        out = self.module.forward(feeds)[0]
        meta.sync()
        assert not self.module.session.pipeline.placement.fallbacks
        return out.reshape(seq, self.heads, self.dim)


SCALAR_MASK = np.zeros((1, 1, 1, 1), np.float32)


@pytest.mark.parametrize("tokens", [1, 7, 37])
@pytest.mark.parametrize("heads,kv_heads,dim", [(9, 3, 64), (4, 4, 8), (6, 1, 12)])
def test_attention_prefill_with_scalar_mask_is_causal(tokens, heads, kv_heads, dim) -> None:
    attention = AttentionGraph(heads, kv_heads, dim)
    q, k, v = randn(tokens, heads, dim), randn(tokens, kv_heads, dim), randn(tokens, kv_heads, dim)
    assert_close(attention.step(q, k, v, SCALAR_MASK), attention_reference(q, k, v))


def test_attention_decode_grows_the_device_cache_past_its_first_capacity() -> None:
    heads, kv_heads, dim, prompt, steps = 9, 3, 64, 250, 10  # crosses MIN_CAPACITY (256)
    attention = AttentionGraph(heads, kv_heads, dim)
    total = prompt + steps
    q, k, v = randn(total, heads, dim), randn(total, kv_heads, dim), randn(total, kv_heads, dim)
    attention.step(q[:prompt], k[:prompt], v[:prompt], SCALAR_MASK)
    for t in range(prompt, total):
        out = attention.step(q[t:t + 1], k[t:t + 1], v[t:t + 1], SCALAR_MASK)
        assert_close(out, attention_reference(q[t:t + 1], k[:t + 1], v[:t + 1], causal_offset=t))
    assert attention.module.resize_count == 2, "prefill shape, then one decode shape"


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
    out = attention.step(q, k, v, mask.reshape(1, 1, tokens, tokens))
    assert_close(out, attention_reference(q, k, v, bias=bias, causal_offset=None))


def test_attention_scale_and_no_cache_variants() -> None:
    heads, kv_heads, dim = 4, 2, 16
    scaled = AttentionGraph(heads, kv_heads, dim, scale=0.5)
    uncached = AttentionGraph(heads, kv_heads, dim, kv_cache=False)
    q, k, v = randn(7, heads, dim), randn(7, kv_heads, dim), randn(7, kv_heads, dim)
    assert_close(scaled.step(q, k, v, SCALAR_MASK), attention_reference(q, k, v, scale=0.5))
    for tokens in (5, 3):
        q, k, v = randn(tokens, heads, dim), randn(tokens, kv_heads, dim), randn(tokens, kv_heads, dim)
        assert_close(uncached.step(q, k, v, SCALAR_MASK), attention_reference(q, k, v))


def test_attention_with_head_dim_not_a_multiple_of_4_falls_back_to_cpu_instead_of_failing() -> None:
    heads, kv_heads, dim, tokens = 4, 2, 6, 3
    param = AttentionParamT()
    param.kvCache, param.outputC4 = True, True
    graph = Graph()
    inputs = [graph.input(n) for n in ("q", "k", "v")] + [graph.input("mask")]
    out = graph.add(Op("Attention", "attn", param, extra={"heads": (heads, kv_heads, dim)}), inputs)
    module = make_module(graph.schedule(out), opencl_runtime(), shape_mutable=False)
    q, k, v = randn(tokens, heads, dim), randn(tokens, kv_heads, dim), randn(tokens, kv_heads, dim)
    got = module.forward({"q": q.reshape(tokens, -1, 1, 1), "k": k.reshape(tokens, -1, 1, 1),
                          "v": v.reshape(tokens, -1, 1, 1), "mask": SCALAR_MASK})[0]
    assert [f["type"] for f in module.session.pipeline.placement.fallbacks] == ["Attention"]
    assert_close(got.reshape(tokens, heads, dim), attention_reference(q, k, v))


def test_attention_without_cache_reads_every_key_when_keys_outnumber_queries() -> None:
    heads, kv_heads, dim, queries, keys = 4, 2, 8, 2, 5
    attention = AttentionGraph(heads, kv_heads, dim, kv_cache=False)
    q, k, v = randn(queries, heads, dim), randn(keys, kv_heads, dim), randn(keys, kv_heads, dim)
    mask = (RNG.standard_normal((queries, keys)) * 2).astype(np.float32)
    feeds = {"q": q.reshape(queries, -1, 1, 1), "k": k.reshape(keys, -1, 1, 1), "v": v.reshape(keys, -1, 1, 1),
             "mask": mask.reshape(1, 1, queries, keys)}
    out = attention.module.forward(feeds)[0].reshape(queries, heads, dim)
    assert_close(out, attention_reference(q, k, v, bias=mask.astype(np.float64), causal_offset=None))


def test_attention_mask_with_fewer_rows_than_queries_is_a_typed_error_not_an_out_of_bounds_read() -> None:
    from mnnllm_core.errors import UnsupportedError
    heads, kv_heads, dim, tokens = 4, 2, 8, 7
    attention = AttentionGraph(heads, kv_heads, dim)
    q, k, v = randn(tokens, heads, dim), randn(tokens, kv_heads, dim), randn(tokens, kv_heads, dim)
    with pytest.raises(UnsupportedError, match="attention_mask"):
        attention.step(q, k, v, np.zeros((1, 1, 1, tokens), np.float32))


# ------------------------------------------------------------------ BinaryOp, UnaryOp, Cast

@pytest.mark.parametrize("operation", ["ADD", "SUB", "MUL", "REALDIV", "MAXIMUM", "MINIMUM", "POW",
                                       "SquaredDifference", "ATAN2", "MOD", "FLOORDIV", "FLOORMOD", "MUL_SILU"])
@pytest.mark.parametrize("shape_a,shape_b", [((37, 1536, 1, 1), (37, 1536, 1, 1)), ((37, 1), (32,)),
                                             ((2, 1, 5), (3, 1)), ((7,), ())])
def test_float_binary_ops_broadcast_like_the_cpu_backend(operation, shape_a, shape_b) -> None:
    a, b = randn(*shape_a), randn(*shape_b)
    if operation in ("POW",):
        a = np.abs(a) + 0.1
    if operation in ("REALDIV", "MOD", "FLOORDIV", "FLOORMOD"):
        b = np.where(np.abs(b) < 0.1, 0.5, b).astype(np.float32)
    make = binary(operation)
    assert_close(on_opencl(make, [a, b])[0], on_cpu(make, [a, b])[0])


@pytest.mark.parametrize("activation", [1, 2])
def test_binary_op_applies_its_activation(activation) -> None:
    a, b = randn(5, 9) * 5, randn(5, 9) * 5
    make = binary("ADD", activation)
    assert_close(on_opencl(make, [a, b])[0], on_cpu(make, [a, b])[0])


UNARY_DOMAIN = {"SQRT": "positive", "RSQRT": "positive", "LOG": "positive", "LOG1P": "positive", "ACOSH": "above1",
                "ASIN": "unit", "ACOS": "unit", "ATANH": "unit", "RECIPROCAL": "nonzero"}


@pytest.mark.parametrize("operation", ["ABS", "NEG", "FLOOR", "CEIL", "SQUARE", "SQRT", "RSQRT", "EXP", "LOG", "SIN",
                                       "COS", "TAN", "ASIN", "ACOS", "ATAN", "RECIPROCAL", "LOG1P", "BNLL", "ACOSH",
                                       "SINH", "ASINH", "ATANH", "SIGN", "ROUND", "COSH", "EXPM1", "SIGMOID", "TANH",
                                       "HARDSWISH", "SILU", "GELU", "GELU_STANDARD", "ERF"])
def test_unary_ops_match_the_cpu_backend(operation) -> None:
    x = randn(37, 33) * 2
    domain = UNARY_DOMAIN.get(operation)
    if domain == "positive":
        x = np.abs(x) + 0.05
    elif domain == "above1":
        x = np.abs(x) + 1.01
    elif domain == "unit":
        x = np.tanh(x) * 0.95
    elif domain == "nonzero":
        x = np.where(np.abs(x) < 0.1, 0.5, x)
    x = x.astype(np.float32)
    make = lambda: Op("UnaryOp", operation.lower(), UnaryOpT(), extra={"operation": operation})
    assert_close(on_opencl(make, [x])[0], on_cpu(make, [x])[0], 2e-5)


def test_cast_between_int32_and_float32_matches_the_cpu_backend() -> None:
    x = np.array([[1.7, -1.7, 2.5, -0.2, 37.0]], np.float32)
    ids = np.arange(-3, 40, dtype=np.int32).reshape(1, -1)
    out, = on_opencl(cast(DT_INT32), [x])
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, [[1, -1, 2, 0, 37]])
    np.testing.assert_array_equal(on_opencl(cast(DT_FLOAT), [ids])[0], ids.astype(np.float32))


# ------------------------------------------------------------------ Raster (data movement)

@pytest.mark.parametrize("shape,perm", [((3, 5, 7), (2, 0, 1)), ((2, 3, 4, 5), (0, 2, 1, 3)), ((37, 9, 64), (1, 0, 2))])
def test_permute_runs_as_raster_regions_on_the_device(shape, perm) -> None:
    x = randn(*shape)

    def make():
        param = PermuteT()
        param.dims = list(perm)
        return Op("Permute", "p", param)
    np.testing.assert_array_equal(on_opencl(make, [x])[0], x.transpose(perm))


def test_concat_of_int_and_float_tensors_copies_every_source() -> None:
    def make():
        param = AxisT()
        param.axis = 1
        return Op("Concat", "c", param)
    for dtype in (np.float32, np.int32):
        parts = [(randn(3, n, 5) * 100).astype(dtype) for n in (2, 1, 4)]
        np.testing.assert_array_equal(on_opencl(make, parts)[0], np.concatenate(parts, axis=1))


# ------------------------------------------------------------------ fp16 storage

def test_fp16_storage_keeps_every_kernel_within_fp16_tolerance() -> None:
    runtime = shared_opencl(opencl_fp16=True)
    quantized, dense = quantize(randn(37, 576), 4, 64)
    x = randn(5, 576, 1, 1)
    op = lambda: Op("Convolution", "q", conv_param(37, 576), weights=Weights(conv=ConvolutionWeights(quantized, None)))
    assert_close(on_opencl(op, [x], runtime=runtime)[0], linear_reference(x, dense, None).reshape(5, 37, 1, 1), FP16)
    a, b, gamma = randn(5, 576, 1, 1), randn(5, 576, 1, 1), randn(576)
    make = layernorm_op(1e-5, True, gamma, fmt="NC4HW4")
    for got, want in zip(on_opencl(make, [a, b], 2, runtime=runtime), on_cpu(make, [a, b], 2)):
        assert_close(got, want, FP16)
    q, k = randn(5, 9 * 64, 1, 1), randn(5, 3 * 64, 1, 1)
    cos, sin = rope_tables(np.arange(5), 64)
    for got, want in zip(on_opencl(rope_op(9, 3, 64), [q, k, cos, sin], 2, runtime=runtime),
                         on_cpu(rope_op(9, 3, 64), [q, k, cos, sin], 2)):
        assert_close(got, want, FP16)
    attention = AttentionGraph(9, 3, 64, opencl_fp16=True)
    q, k, v = randn(7, 9, 64), randn(7, 3, 64), randn(7, 3, 64)
    assert_close(attention.step(q, k, v, SCALAR_MASK), attention_reference(q, k, v), FP16)


# ------------------------------------------------------------------ the shared model

def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.reshape(-1).astype(np.float64), b.reshape(-1).astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


class Model:
    """The shared q4 model on one backend: a prefill module and a decode clone, as the LLM's
    ModulePool keeps them (the clone shares packed weights and the KV cache)."""

    def __init__(self, backend: str):
        from mnnllm_core.express.module import Module
        from mnnllm_core.express.static_module import Config
        self.runtime = RuntimeManager.create(ScheduleConfig(backend_type=backend, thread_num=2))
        self.prefill = Module.load([], [], MODEL / "llm.mnn", self.runtime, Config(rearrange=True, shape_mutable=False))
        self.decode = self.prefill.clone() if backend == "opencl" else self.prefill
        self.past = 0

    def forward(self, module, embeddings: np.ndarray) -> np.ndarray:
        seq = embeddings.shape[0]
        meta = self.runtime.kv_meta
        meta.add = seq
        feeds = {"input_ids": embeddings.reshape(seq, 1, -1), "attention_mask": np.zeros((1, 1, 1, 1), np.float32),
                 "position_ids": np.arange(self.past, self.past + seq, dtype=np.int32).reshape(1, seq),
                 "logits_index": np.array([-1], np.int32)}
        logits = module.forward(feeds)[0]
        meta.sync()
        self.past += seq
        return logits.reshape(-1)

    def reset(self) -> None:
        self.runtime.kv_meta.reset()
        self.runtime.kv_meta.sync()
        self.past = 0


@lru_cache(maxsize=1)
def embedding_table():
    """Rows of the tied lm_head, dequantized on demand (the model's embedding lookup)."""
    from mnnllm_core.express.module import Module
    from mnnllm_core.express.static_module import Config
    module = Module.load([], [], MODEL / "llm.mnn", new_runtime(), Config(rearrange=False))
    for node in module.static_module.session.info.nodes:
        if node.op.type == "Convolution" and int(node.op.param.common.outputCount) == 49152:
            return node.op.weights.convolution().quantized
    raise AssertionError("no lm_head in the shared model")


@pytest.fixture(scope="module")
def models():
    if not (MODEL / "llm.mnn").exists():
        pytest.skip(f"shared model missing at {MODEL}")
    return Model("cpu"), Model("opencl")


DECODE_STEPS = 4


def count_host_transfers(model: Model, step) -> dict[str, int]:
    """Host<->device copies during one call of `step` on the opencl model."""
    allocator = model.runtime.runtime.allocator
    counts = {"to_device": 0, "to_host": 0}
    copyin, copyout = allocator.copyin, allocator.copyout

    def counted_in(*args):
        counts["to_device"] += 1
        return copyin(*args)

    def counted_out(*args):
        counts["to_host"] += 1
        return copyout(*args)
    allocator.copyin, allocator.copyout = counted_in, counted_out
    try:
        step()
    finally:
        del allocator.copyin, allocator.copyout
    return counts


def test_shared_model_logits_match_the_cpu_backend_on_the_reference_prompts(models) -> None:
    cpu, ocl = models
    table = embedding_table()
    prompts = json.loads((MODEL / "reference.json").read_text())["prompts"]
    for prompt in prompts:
        ids = prompt["prompt_ids"]
        cpu.reset(), ocl.reset()
        embeddings = table.dequantize_rows(ids)
        want, got = cpu.forward(cpu.prefill, embeddings), ocl.forward(ocl.prefill, embeddings)
        assert int(got.argmax()) == int(want.argmax()) == prompt["mnn_cpp_q4_memory_normal"]["gen_ids"][0]
        assert cosine(got, want) >= 0.9999
        token = int(want.argmax())
        for step in range(DECODE_STEPS):
            embedding = table.dequantize_rows([token])
            want, got = cpu.forward(cpu.decode, embedding), ocl.forward(ocl.decode, embedding)
            assert int(got.argmax()) == int(want.argmax()), f"decode step {step}"
            assert cosine(got, want) >= 0.9999, f"decode step {step}"
            token = int(want.argmax())
    transfers = count_host_transfers(ocl, lambda: ocl.forward(ocl.decode, table.dequantize_rows([token])))
    assert transfers == {"to_device": 4, "to_host": 2}, "the 4 inputs in, logits and hidden_states out"
    placement = ocl.decode.placement()
    assert placement["fallbacks"] == [] and placement["copies"] == 0, placement
    assert set(placement["ops_per_backend"]) == {"opencl"}
    assert ocl.decode.static_module.resize_count == 1, "decode never resizes after its first step"
