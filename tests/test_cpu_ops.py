"""Every op type the numpy cpu backend runs, through the real core path, against an
independent float64 numpy reference.

Each op is run as a one-op graph by `op_harness.run_op`: shape inference, folding,
geometry lowering to Raster and the Execution all take part. Tolerance: the backend
computes in fp32, the references in float64, so results must agree to rtol 1e-5 and
atol 1e-5 times the magnitude of the expected values (max |expected|, at least 1);
data movement and integer ops must be exact.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from mnnllm_core.core.dtypes import DT_FLOAT, DT_INT32
from mnnllm_core.core.op import Op
from mnnllm_core.errors import UnsupportedError
from mnnllm_core.express.op_weights import ConvolutionWeights, OpWeights
from mnnllm_core.schema.MNN.AttentionParam import AttentionParamT
from mnnllm_core.schema.MNN.Axis import AxisT
from mnnllm_core.schema.MNN.BinaryOp import BinaryOpT
from mnnllm_core.schema.MNN.CastParam import CastParamT
from mnnllm_core.schema.MNN.ExpandDims import ExpandDimsT
from mnnllm_core.schema.MNN.LayerNorm import LayerNormT
from mnnllm_core.schema.MNN.MatMul import MatMulT
from mnnllm_core.schema.MNN.Permute import PermuteT
from mnnllm_core.schema.MNN.ReductionParam import ReductionParamT
from mnnllm_core.schema.MNN.Reshape import ReshapeT
from mnnllm_core.schema.MNN.RoPEParam import RoPEParamT
from mnnllm_core.schema.MNN.SqueezeParam import SqueezeParamT
from mnnllm_core.schema.MNN.StridedSliceParam import StridedSliceParamT
from mnnllm_core.schema.MNN.UnaryOp import UnaryOpT

from op_harness import Const, Graph, Weights, make_module, new_runtime, run_op
from references import attention_reference, conv_param, linear_reference, quantize, rope_tables

RNG = np.random.default_rng(20240607)
TOKENS = (1, 3, 7, 37)


def assert_close(actual: np.ndarray, expected: np.ndarray, rtol: float = 1e-5, atol: float = 1e-5) -> None:
    expected = np.asarray(expected, np.float64)
    magnitude = max(1.0, float(np.max(np.abs(expected)))) if expected.size else 1.0
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    np.testing.assert_allclose(np.asarray(actual, np.float64), expected, rtol=rtol, atol=atol * magnitude)


def randn(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def ints(*values: int) -> Const:
    return Const(np.asarray(values, np.int32))


# ------------------------------------------------------------------ Convolution as linear

@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("ic,oc", [(5, 3), (17, 9), (576, 64)])
def test_convolution_with_inline_fp32_weights_is_a_linear_layer(tokens: int, ic: int, oc: int) -> None:
    weight, bias, x = randn(oc, ic), randn(oc), randn(tokens, ic, 1, 1)
    param = conv_param(oc, ic)
    param.weight, param.bias = weight.reshape(-1).tolist(), bias.tolist()
    op = Op("Convolution", "linear", param, weights=OpWeights("linear", param, None, "<test>"))
    result = run_op(op, [x])
    assert op.weights is None, "rearrange packs the weights and drops the reader"
    assert_close(result.outputs[0], linear_reference(x, weight, bias).reshape(tokens, oc, 1, 1))


def test_convolution_accepts_two_dimensional_rows() -> None:
    weight, x = randn(9, 17), randn(7, 17)
    result = run_op(Op("Convolution", "linear", conv_param(9, 17), weights=Weights.dense(weight)), [x])
    assert_close(result.outputs[0], linear_reference(x, weight, None))


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("ic,block", [(576, 64), (576, 576), (96, 32), (6, 6)])
def test_convolution_with_block_quantized_weights_and_bias_matches_dequantized_linear(
        tokens: int, bits: int, ic: int, block: int) -> None:
    oc = 10
    quantized, dense = quantize(randn(oc, ic), bits, block)
    bias = randn(oc)  # Qwen2's q/k/v projections carry an fp32 bias
    x = randn(tokens, ic, 1, 1)
    op = Op("Convolution", "q", conv_param(oc, ic), weights=Weights(conv=ConvolutionWeights(quantized, bias)))
    assert_close(run_op(op, [x]).outputs[0], linear_reference(x, dense, bias).reshape(tokens, oc, 1, 1))


@pytest.mark.parametrize("relu,relu6,clip", [(True, False, (0, np.inf)), (False, True, (0, 6))])
def test_convolution_applies_its_fused_relu_or_relu6(relu: bool, relu6: bool, clip: tuple) -> None:
    weight, bias, x = randn(12, 17) * 3, randn(12), randn(7, 17) * 3
    op = Op("Convolution", "act", conv_param(12, 17, relu, relu6), weights=Weights.dense(weight, bias))
    expected = np.clip(linear_reference(x, weight, bias), *clip)
    assert (expected == 0).any() and (not relu6 or (expected == 6).any())
    assert_close(run_op(op, [x]).outputs[0], expected)


# ------------------------------------------------------------------ LayerNorm

def layernorm_param(eps: float, rms: bool, gamma=None, beta=None, group: int = 1, axis=(-1,)) -> LayerNormT:
    p = LayerNormT()
    p.axis, p.epsilon, p.useRmsnorm, p.group = list(axis), eps, rms, group
    p.gamma = None if gamma is None else gamma.tolist()
    p.beta = None if beta is None else beta.tolist()
    return p


def norm_reference(x: np.ndarray, gamma, beta, eps: float, rms: bool) -> np.ndarray:
    x = x.astype(np.float64)
    if rms:
        y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    else:
        centered = x - x.mean(axis=-1, keepdims=True)
        y = centered / np.sqrt(np.mean(centered * centered, axis=-1, keepdims=True) + eps)
    if gamma is not None:
        y = y * gamma
    return y + beta if beta is not None else y


def layernorm_op(param: LayerNormT, fmt: str = "NCHW") -> Op:
    return Op("LayerNorm", "ln", param, weights=OpWeights("ln", param, None, "<test>"), extra={"format": fmt})


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("width", [5, 17, 576])
@pytest.mark.parametrize("rms", [True, False])
def test_layernorm_normalizes_the_last_axis_with_gamma_and_beta(tokens: int, width: int, rms: bool) -> None:
    x, gamma, beta = randn(tokens, width) * 2 + 0.5, randn(width), randn(width)
    beta = None if rms else beta
    result = run_op(layernorm_op(layernorm_param(1e-5, rms, gamma, beta)), [x])
    assert_close(result.outputs[0], norm_reference(x, gamma, beta, 1e-5, rms))


def test_layernorm_over_two_axes_normalizes_their_product() -> None:
    x = randn(3, 4, 5)
    result = run_op(layernorm_op(layernorm_param(1e-6, False, axis=(-2, -1))), [x])
    assert_close(result.outputs[0], norm_reference(x.reshape(3, 20), None, None, 1e-6, False).reshape(3, 4, 5))


@pytest.mark.parametrize("rms", [True, False])
def test_layernorm_with_groups_normalizes_each_group_and_shares_gamma(rms: bool) -> None:
    # MNN (CPULayerNorm): a group spans every dim after the first; gamma/beta cover one group.
    batch, channels, width, group = 2, 6, 4, 3
    x = randn(batch, channels, width) * 3 + 1
    inner = channels * width // group
    gamma, beta = randn(inner), randn(inner)
    result = run_op(layernorm_op(layernorm_param(1e-5, rms, gamma, beta, group=group)), [x])
    expected = norm_reference(x.reshape(batch, group, inner), gamma, beta, 1e-5, rms).reshape(x.shape)
    assert_close(result.outputs[0], expected)


@pytest.mark.parametrize("tokens", TOKENS)
def test_fused_residual_layernorm_returns_the_sum_and_its_norm(tokens: int) -> None:
    a, b, gamma = randn(tokens, 576, 1, 1), randn(tokens, 576, 1, 1), randn(576)
    op = layernorm_op(layernorm_param(1e-5, True, gamma), "NC4HW4")
    total, normed = run_op(op, [a, b], outputs=2).outputs
    expected = a.astype(np.float64) + b
    assert_close(total, expected)
    expected_norm = norm_reference(expected.reshape(tokens, 576), gamma, None, 1e-5, True)
    assert_close(normed, expected_norm.reshape(tokens, 576, 1, 1))


def test_nc4hw4_layernorm_normalizes_over_channels() -> None:
    x, gamma, beta = randn(2, 17, 3, 5), randn(17), randn(17)
    result = run_op(layernorm_op(layernorm_param(1e-5, False, gamma, beta), "NC4HW4"), [x])
    moved = np.moveaxis(x, 1, -1)
    assert_close(result.outputs[0], np.moveaxis(norm_reference(moved, gamma, beta, 1e-5, False), -1, 1))


# ------------------------------------------------------------------ RoPE

def rope_reference(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, rope_dim: int) -> np.ndarray:
    """HF's rotate_half on the first rope_dim dims; the rest pass through. x [seq, heads, dim]."""
    x = x.astype(np.float64)
    c = cos.reshape(cos.shape[1], 1, rope_dim).astype(np.float64)
    s = sin.reshape(sin.shape[1], 1, rope_dim).astype(np.float64)
    rot, rest = x[..., :rope_dim], x[..., rope_dim:]
    half = rope_dim // 2
    rotated_half = np.concatenate([-rot[..., half:], rot[..., :half]], axis=-1)
    return np.concatenate([rot * c + rotated_half * s, rest], axis=-1)


def rope_param(heads: int, kv_heads: int, dim: int, cut: int = 0, q_norm=None, k_norm=None) -> RoPEParamT:
    p = RoPEParamT()
    p.numHead, p.kvNumHead, p.headDim, p.ropeCutHeadDim, p.qNorm, p.kNorm = heads, kv_heads, dim, cut, q_norm, k_norm
    return p


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("heads,kv_heads,dim", [(9, 3, 64), (2, 2, 8), (4, 1, 6)])
def test_rope_rotates_packed_q_and_k_by_position(tokens: int, heads: int, kv_heads: int, dim: int) -> None:
    q, k = randn(tokens, heads * dim, 1, 1), randn(tokens, kv_heads * dim, 1, 1)
    cos, sin = rope_tables(np.arange(5, 5 + tokens), dim)
    q_out, k_out = run_op(Op("RoPE", "rope", rope_param(heads, kv_heads, dim)), [q, k, cos, sin], outputs=2).outputs
    assert_close(q_out, rope_reference(q.reshape(tokens, heads, dim), cos, sin, dim).reshape(q.shape))
    assert_close(k_out, rope_reference(k.reshape(tokens, kv_heads, dim), cos, sin, dim).reshape(k.shape))


@pytest.mark.parametrize("tokens", [1, 7])
def test_rope_with_cut_head_dim_rotates_only_the_leading_dims(tokens: int) -> None:
    heads, kv_heads, dim, cut = 4, 2, 16, 8
    q, k = randn(tokens, heads * dim, 1, 1), randn(tokens, kv_heads * dim, 1, 1)
    cos, sin = rope_tables(np.arange(tokens), cut)
    q_out, k_out = run_op(Op("RoPE", "rope", rope_param(heads, kv_heads, dim, cut)), [q, k, cos, sin],
                          outputs=2).outputs
    assert_close(q_out, rope_reference(q.reshape(tokens, heads, dim), cos, sin, cut).reshape(q.shape))
    assert_close(k_out, rope_reference(k.reshape(tokens, kv_heads, dim), cos, sin, cut).reshape(k.shape))
    passed_through = q_out.reshape(tokens, heads, dim)[..., cut:]
    np.testing.assert_array_equal(passed_through, q.reshape(tokens, heads, dim)[..., cut:])


@pytest.mark.parametrize("tokens", [1, 3, 37])
def test_rope_applies_qwen3_per_head_q_and_k_rms_norm_before_rotating(tokens: int) -> None:
    heads, kv_heads, dim = 4, 2, 32
    q_gamma, k_gamma = randn(dim), randn(dim)
    q_norm, k_norm = layernorm_param(1e-6, True, q_gamma), layernorm_param(1e-6, True, k_gamma)
    q, k = randn(tokens, heads * dim, 1, 1) * 4, randn(tokens, kv_heads * dim, 1, 1) * 4
    cos, sin = rope_tables(np.arange(tokens) + 11, dim)
    op = Op("RoPE", "rope", rope_param(heads, kv_heads, dim, 0, q_norm, k_norm))
    q_out, k_out = run_op(op, [q, k, cos, sin], outputs=2).outputs
    q_ref = rope_reference(norm_reference(q.reshape(tokens, heads, dim), q_gamma, None, 1e-6, True), cos, sin, dim)
    k_ref = rope_reference(norm_reference(k.reshape(tokens, kv_heads, dim), k_gamma, None, 1e-6, True), cos, sin, dim)
    assert_close(q_out, q_ref.reshape(q.shape))
    assert_close(k_out, k_ref.reshape(k.shape))


# ------------------------------------------------------------------ Attention

class AttentionGraph:
    """One packed Attention op (as the fused export has it) on its own runtime and KV meta."""

    def __init__(self, heads: int, kv_heads: int, dim: int, kv_cache: bool = True, scale: float = 0.0,
                 mask_dtype=np.float32):
        param = AttentionParamT()
        param.kvCache, param.attnScale, param.outputC4 = kv_cache, scale, True
        graph = Graph()
        inputs = [graph.input(n) for n in ("q", "k", "v")] + [graph.input("mask", mask_dtype)]
        out = graph.add(Op("Attention", "attn", param, extra={"heads": (heads, kv_heads, dim)}), inputs)
        self.runtime = new_runtime()
        self.module = make_module(graph.schedule(out), self.runtime)
        self.heads, self.kv_heads, self.dim = heads, kv_heads, dim

    def step(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, remove: int = 0) -> np.ndarray:
        meta = self.runtime.kv_meta
        meta.remove, meta.add = remove, q.shape[0]
        seq = q.shape[0]
        feeds = {"q": q.reshape(seq, -1, 1, 1), "k": k.reshape(seq, -1, 1, 1), "v": v.reshape(seq, -1, 1, 1),
                 "mask": mask}
        out = self.module.forward(feeds)[0]
        meta.sync()
        return out.reshape(seq, self.heads, self.dim)


SCALAR_MASK = np.zeros((1, 1, 1, 1), np.float32)


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("heads,kv_heads,dim", [(9, 3, 64), (4, 4, 8), (6, 1, 5)])
def test_attention_prefill_with_scalar_mask_is_causal(tokens: int, heads: int, kv_heads: int, dim: int) -> None:
    attention = AttentionGraph(heads, kv_heads, dim)
    q, k, v = randn(tokens, heads, dim), randn(tokens, kv_heads, dim), randn(tokens, kv_heads, dim)
    assert_close(attention.step(q, k, v, SCALAR_MASK), attention_reference(q, k, v))


@pytest.mark.parametrize("heads,kv_heads", [(9, 3), (2, 2)])
def test_attention_decode_steps_attend_to_the_kv_cache(heads: int, kv_heads: int) -> None:
    dim, prompt, steps = 16, 7, 4
    attention = AttentionGraph(heads, kv_heads, dim)
    total = prompt + steps
    q, k, v = randn(total, heads, dim), randn(total, kv_heads, dim), randn(total, kv_heads, dim)
    attention.step(q[:prompt], k[:prompt], v[:prompt], SCALAR_MASK)
    for t in range(prompt, total):
        out = attention.step(q[t:t + 1], k[t:t + 1], v[t:t + 1], SCALAR_MASK)
        assert_close(out, attention_reference(q[t:t + 1], k[:t + 1], v[:t + 1], causal_offset=t))
    assert attention.runtime.kv_meta.previous == total
    assert attention.module.resize_count == 2, "prefill shape, then one decode shape"


def test_attention_meta_remove_truncates_the_cache_before_appending() -> None:
    heads, kv_heads, dim = 4, 2, 8
    attention = AttentionGraph(heads, kv_heads, dim)
    q, k, v = randn(9, heads, dim), randn(9, kv_heads, dim), randn(9, kv_heads, dim)
    attention.step(q[:7], k[:7], v[:7], SCALAR_MASK)
    # drop the last 3 cached tokens, then add 2 new ones (positions 4 and 5)
    out = attention.step(q[7:9], k[7:9], v[7:9], SCALAR_MASK, remove=3)
    keys, values = np.concatenate([k[:4], k[7:9]]), np.concatenate([v[:4], v[7:9]])
    assert_close(out, attention_reference(q[7:9], keys, values, causal_offset=4))
    assert attention.runtime.kv_meta.previous == 6


@pytest.mark.parametrize("tokens", [3, 7])
def test_attention_adds_a_full_float_mask_instead_of_the_causal_one(tokens: int) -> None:
    heads, kv_heads, dim = 4, 2, 8
    attention = AttentionGraph(heads, kv_heads, dim)
    q, k, v = randn(tokens, heads, dim), randn(tokens, kv_heads, dim), randn(tokens, kv_heads, dim)
    bias = (RNG.standard_normal((tokens, tokens)) * 2).astype(np.float32)
    bias[0, 1:] = np.float32(np.finfo(np.float32).min)
    out = attention.step(q, k, v, bias.reshape(1, 1, tokens, tokens))
    assert_close(out, attention_reference(q, k, v, bias=bias.astype(np.float64), causal_offset=None))


def test_attention_int_mask_blocks_where_it_is_zero() -> None:
    heads, kv_heads, dim, tokens = 2, 1, 8, 5
    attention = AttentionGraph(heads, kv_heads, dim, mask_dtype=np.int32)
    q, k, v = randn(tokens, heads, dim), randn(tokens, kv_heads, dim), randn(tokens, kv_heads, dim)
    allowed = (RNG.random((tokens, tokens)) < 0.6).astype(np.int32)
    np.fill_diagonal(allowed, 1)
    out = attention.step(q, k, v, allowed.reshape(1, 1, tokens, tokens))
    bias = np.where(allowed == 0, -np.inf, 0.0)
    assert_close(out, attention_reference(q, k, v, bias=bias, causal_offset=None))


def test_attention_uses_attn_scale_when_it_is_set() -> None:
    heads, kv_heads, dim, tokens = 4, 2, 16, 7
    attention = AttentionGraph(heads, kv_heads, dim, scale=0.5)
    q, k, v = randn(tokens, heads, dim), randn(tokens, kv_heads, dim), randn(tokens, kv_heads, dim)
    assert_close(attention.step(q, k, v, SCALAR_MASK), attention_reference(q, k, v, scale=0.5))


def test_attention_without_kv_cache_sees_only_the_current_tokens() -> None:
    heads, kv_heads, dim = 4, 2, 8
    attention = AttentionGraph(heads, kv_heads, dim, kv_cache=False)
    for tokens in (5, 3):
        q, k, v = randn(tokens, heads, dim), randn(tokens, kv_heads, dim), randn(tokens, kv_heads, dim)
        assert_close(attention.step(q, k, v, SCALAR_MASK), attention_reference(q, k, v))


def test_attention_on_unpacked_heads_returns_seq_by_hidden() -> None:
    heads, kv_heads, dim, tokens = 4, 2, 8, 7
    param = AttentionParamT()
    q, k, v = randn(1, tokens, heads, dim), randn(1, tokens, kv_heads, dim), randn(1, tokens, kv_heads, dim)
    result = run_op(Op("Attention", "attn", param), [q, k, v, SCALAR_MASK], runtime=new_runtime())
    expected = attention_reference(q[0], k[0], v[0]).reshape(1, tokens, heads * dim)
    assert_close(result.outputs[0], expected)


# ------------------------------------------------------------------ BinaryOp

def binary(operation: str, activation: int = 0) -> Op:
    param = BinaryOpT()
    param.activationType = activation
    return Op("BinaryOp", operation.lower(), param, extra={"operation": operation})


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


FLOAT_BINARY = {
    "ADD": np.add, "SUB": np.subtract, "MUL": np.multiply, "REALDIV": np.divide, "DIV": np.divide,
    "MAXIMUM": np.maximum, "MINIMUM": np.minimum, "MAX_TEMP": np.maximum, "MIN_TEMP": np.minimum,
    "SquaredDifference": lambda a, b: (a - b) ** 2, "ATAN2": np.arctan2,
    "FLOORDIV": lambda a, b: np.floor(a / b), "FLOORMOD": lambda a, b: a - np.floor(a / b) * b,
    "MOD": np.fmod,  # MNN: fmodf for floats, the sign follows the dividend
    "MUL_SILU": lambda a, b: a * silu(b),  # the exporter feeds (up, gate)
}
COMPARISON = {"GREATER": np.greater, "GREATER_EQUAL": np.greater_equal, "LESS": np.less,
              "LESS_EQUAL": np.less_equal, "EQUAL": np.equal, "NOTEQUAL": np.not_equal}


@pytest.mark.parametrize("operation", sorted(FLOAT_BINARY))
@pytest.mark.parametrize("shape_a,shape_b", [((7, 17), (7, 17)), ((3, 1, 5), (4, 1)), ((37,), ())])
def test_float_binary_ops_broadcast_like_numpy(operation: str, shape_a: tuple, shape_b: tuple) -> None:
    a = randn(*shape_a) * 3
    b = randn(*shape_b) * 3
    b = np.where(np.abs(b) < 0.25, np.float32(0.5), b).astype(np.float32)  # keep divisors away from 0
    out = run_op(binary(operation), [a, b]).outputs[0]
    assert out.dtype == np.float32
    assert_close(out, FLOAT_BINARY[operation](a.astype(np.float64), b.astype(np.float64)))


def test_pow_raises_positive_bases() -> None:
    a, b = np.abs(randn(7, 5)) + 0.1, randn(7, 5)
    assert_close(run_op(binary("POW"), [a, b]).outputs[0], np.power(a.astype(np.float64), b))


@pytest.mark.parametrize("operation", sorted(COMPARISON))
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_comparisons_give_int32_zero_or_one(operation: str, dtype) -> None:
    a = RNG.integers(-3, 4, (7, 5)).astype(dtype)
    b = RNG.integers(-3, 4, (5,)).astype(dtype)
    out = run_op(binary(operation), [a, b]).outputs[0]
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, COMPARISON[operation](a, b).astype(np.int32))


MOD_A = np.array([7, -7, 7, -7, 3, -3, 0, 9], np.int32)
MOD_B = np.array([3, 3, -3, -3, 5, 5, 4, -2], np.int32)


def test_int_mod_takes_the_sign_of_the_divisor() -> None:
    # MNN's BinaryModInt: C remainder, moved by the divisor when the signs differ.
    out = run_op(binary("MOD"), [MOD_A, MOD_B]).outputs[0]
    np.testing.assert_array_equal(out, [1, 2, -2, -1, 3, 2, 0, -1])
    assert out.dtype == np.int32


def test_float_mod_takes_the_sign_of_the_dividend() -> None:
    a, b = MOD_A.astype(np.float32) + 0.5, MOD_B.astype(np.float32)
    out = run_op(binary("MOD"), [a, b]).outputs[0]
    np.testing.assert_allclose(out, [math.fmod(x, y) for x, y in zip(a.tolist(), b.tolist())], rtol=0, atol=1e-6)
    assert out[1] < 0 and out[2] > 0


def test_mod_of_constant_shape_values_is_folded_at_resize() -> None:
    # The export computes axes as (Rank + k) MOD Rank on constant values: folded, never run.
    result = run_op(binary("MOD"), [Const(np.array(-1, np.int32)), Const(np.array(3, np.int32))])
    assert result.command_types == []
    assert int(result.outputs[0]) == 2


INT_BINARY = {
    "ADD": np.add, "SUB": np.subtract, "MUL": np.multiply, "FLOORDIV": np.floor_divide,
    "MAXIMUM": np.maximum, "MINIMUM": np.minimum, "SquaredDifference": lambda a, b: (a - b) ** 2,
    "BITWISE_AND": np.bitwise_and, "BITWISE_OR": np.bitwise_or, "BITWISE_XOR": np.bitwise_xor,
    "LOGICALOR": lambda a, b: ((a != 0) | (b != 0)).astype(np.int32),
    "LOGICALXOR": lambda a, b: ((a != 0) ^ (b != 0)).astype(np.int32),
}


@pytest.mark.parametrize("operation", sorted(INT_BINARY))
def test_int_binary_ops_stay_exact(operation: str) -> None:
    a = RNG.integers(-20, 21, (7, 5)).astype(np.int32)
    b = RNG.integers(1, 9, (5,)).astype(np.int32) * RNG.choice([-1, 1], 5).astype(np.int32)
    out = run_op(binary(operation), [a, b]).outputs[0]
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, INT_BINARY[operation](a.astype(np.int64), b.astype(np.int64)))


@pytest.mark.parametrize("operation,expected", [("LEFTSHIFT", [8, 10, 12, -8]), ("RIGHTSHIFT", [2, 2, 0, -2])])
def test_shifts_move_bits(operation: str, expected: list) -> None:
    a, b = np.array([4, 5, 3, -4], np.int32), np.array([1, 1, 2, 1], np.int32)
    np.testing.assert_array_equal(run_op(binary(operation), [a, b]).outputs[0], expected)


@pytest.mark.parametrize("activation,low,high", [(1, 0, np.inf), (2, 0, 6)])
def test_binary_op_applies_its_activation(activation: int, low: float, high: float) -> None:
    a, b = randn(7, 17) * 5, randn(7, 17) * 5
    out = run_op(binary("ADD", activation), [a, b]).outputs[0]
    assert_close(out, np.clip(a.astype(np.float64) + b, low, high))


# ------------------------------------------------------------------ UnaryOp

def erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf)(x)


def c_round(x: np.ndarray) -> np.ndarray:
    """roundf: halves away from zero (MNN's UnaryRound)."""
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


UNARY = {  # operation: (reference, input domain)
    "ABS": (np.abs, "any"), "NEG": (np.negative, "any"), "FLOOR": (np.floor, "any"), "CEIL": (np.ceil, "any"),
    "SQUARE": (np.square, "any"), "SQRT": (np.sqrt, "positive"), "RSQRT": (lambda x: 1 / np.sqrt(x), "positive"),
    "EXP": (np.exp, "any"), "LOG": (np.log, "positive"), "SIN": (np.sin, "any"), "COS": (np.cos, "any"),
    "TAN": (np.tan, "unit"), "ASIN": (np.arcsin, "unit"), "ACOS": (np.arccos, "unit"), "ATAN": (np.arctan, "any"),
    "RECIPROCAL": (lambda x: 1 / x, "positive"), "LOG1P": (np.log1p, "positive"),
    "BNLL": (lambda x: np.log1p(np.exp(x)), "any"), "ACOSH": (np.arccosh, "above_one"), "SINH": (np.sinh, "any"),
    "ASINH": (np.arcsinh, "any"), "ATANH": (np.arctanh, "unit"), "SIGN": (np.sign, "any"),
    "ROUND": (c_round, "any"), "COSH": (np.cosh, "any"), "EXPM1": (np.expm1, "any"),
    "SIGMOID": (lambda x: 1 / (1 + np.exp(-x)), "any"), "TANH": (np.tanh, "any"),
    "HARDSWISH": (lambda x: x * np.clip(x + 3, 0, 6) / 6, "any"), "SILU": (silu, "any"),
    "GELU": (lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))), "any"),
    "GELU_STANDARD": (lambda x: 0.5 * x * (1 + erf(x / math.sqrt(2))), "any"), "ERF": (erf, "any"),
}


def unary_input(domain: str, shape: tuple) -> np.ndarray:
    x = RNG.uniform(-4, 4, shape)
    if domain == "positive":
        x = np.abs(x) + 0.05
    elif domain == "unit":
        x = np.clip(x / 4.5, -0.95, 0.95)
    elif domain == "above_one":
        x = np.abs(x) + 1.05
    return x.astype(np.float32)


@pytest.mark.parametrize("operation", sorted(UNARY))
@pytest.mark.parametrize("shape", [(1,), (7, 17), (3, 576)])
def test_unary_ops_match_their_math(operation: str, shape: tuple) -> None:
    reference, domain = UNARY[operation]
    x = unary_input(domain, shape)
    op = Op("UnaryOp", operation.lower(), UnaryOpT(), extra={"operation": operation})
    assert_close(run_op(op, [x]).outputs[0], reference(x.astype(np.float64)))


def test_unary_round_sends_halves_away_from_zero() -> None:
    x = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 0.49999997, -1.2], np.float32)
    op = Op("UnaryOp", "round", UnaryOpT(), extra={"operation": "ROUND"})
    np.testing.assert_array_equal(run_op(op, [x]).outputs[0], [1, 2, 3, -1, -3, 0, -1])


# ------------------------------------------------------------------ Cast, Select, Softmax, small activations

def cast(dst: int) -> Op:
    param = CastParamT()
    param.dstT = dst
    return Op("Cast", "cast", param)


def test_cast_float_to_int32_truncates_toward_zero() -> None:
    x = np.array([[1.7, -1.7, 2.5, -0.2, 37.0]], np.float32)
    out = run_op(cast(DT_INT32), [x]).outputs[0]
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, [[1, -1, 2, 0, 37]])


def test_cast_int32_to_float_keeps_values() -> None:
    positions = np.arange(37, dtype=np.int32).reshape(1, 37) - 5
    out = run_op(cast(DT_FLOAT), [positions]).outputs[0]
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, positions.astype(np.float32))


def test_select_picks_by_condition_with_broadcasting() -> None:
    condition = RNG.integers(0, 2, (7, 1)).astype(np.int32)
    x, y = randn(7, 5), randn(5)
    out = run_op(Op("Select", "select"), [condition, x, y]).outputs[0]
    np.testing.assert_array_equal(out, np.where(condition != 0, x, y))


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax_sums_to_one_along_its_axis(axis: int) -> None:
    x = randn(3, 37, 5) * 4
    param = AxisT()
    param.axis = axis
    e = np.exp(x.astype(np.float64) - x.max(axis=axis, keepdims=True))
    assert_close(run_op(Op("Softmax", "softmax", param), [x]).outputs[0], e / e.sum(axis=axis, keepdims=True))


@pytest.mark.parametrize("operation,reference", [
    ("SUM", lambda a, b, c: a + b + c),
    ("PROD", lambda a, b, c: a * b * c),
    ("MAXIMUM", lambda a, b, c: np.maximum(np.maximum(a, b), c)),
])
def test_eltwise_folds_all_inputs(operation: str, reference) -> None:
    a, b, c = randn(7, 17), randn(7, 17), randn(7, 17)
    out = run_op(Op("Eltwise", "eltwise", extra={"operation": operation}), [a, b, c]).outputs[0]
    assert_close(out, reference(*(t.astype(np.float64) for t in (a, b, c))))


@pytest.mark.parametrize("op_type,reference", [("ReLU", lambda x: np.maximum(x, 0)), ("TanH", np.tanh),
                                               ("Sigmoid", lambda x: 1 / (1 + np.exp(-x)))])
def test_activation_ops(op_type: str, reference) -> None:
    x = randn(7, 17) * 3
    assert_close(run_op(Op(op_type, op_type.lower()), [x]).outputs[0], reference(x.astype(np.float64)))


# ------------------------------------------------------------------ GatherV2

# Negative indices count from the end (ONNX / numpy), on both paths alike.
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_with_constant_indices_is_lowered_to_raster(axis: int) -> None:
    params = randn(5, 7, 3)
    indices = np.array([[2, 0], [-1, 1]], np.int32)
    result = run_op(Op("GatherV2", "gather"), [params, Const(indices), ints(axis)])
    assert result.command_types == ["Raster"]
    extent = params.shape[axis]
    np.testing.assert_array_equal(result.outputs[0], np.take(params, indices % extent, axis=axis))


@pytest.mark.parametrize("axis", [0, 2])
def test_gather_with_run_time_indices_runs_as_gather(axis: int) -> None:
    params = randn(6, 4, 5)
    indices = np.array([3, -1, 0, -5, 2], np.int32)
    result = run_op(Op("GatherV2", "gather"), [params, indices, ints(axis)])
    assert result.command_types == ["GatherV2"]
    np.testing.assert_array_equal(result.outputs[0], np.take(params, indices % params.shape[axis], axis=axis))


def test_gather_of_embedding_rows_by_token_ids() -> None:
    table = randn(49, 17)
    ids = RNG.integers(0, 49, (1, 37)).astype(np.int32)
    result = run_op(Op("GatherV2", "embed"), [table, ids])
    np.testing.assert_array_equal(result.outputs[0], table[ids])


def test_gather_out_of_range_index_writes_zeros() -> None:
    params = randn(4, 3)
    for indices in (Const(np.array([1, 9], np.int32)), np.array([1, 9], np.int32)):
        out = run_op(Op("GatherV2", "gather"), [params, indices]).outputs[0]
        np.testing.assert_array_equal(out, np.stack([params[1], np.zeros(3, np.float32)]))


# ------------------------------------------------------------------ Concat

@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_concat_joins_inputs_along_its_axis(axis: int) -> None:
    parts = [randn(*(n if d == axis % 3 else s for d, s in enumerate((3, 4, 5)))) for n in (1, 2, 7)]
    param = AxisT()
    param.axis = axis
    result = run_op(Op("Concat", "concat", param), parts)
    assert result.command_types == ["Raster"]
    np.testing.assert_array_equal(result.outputs[0], np.concatenate(parts, axis=axis))


def test_concat_of_a_tensor_with_itself() -> None:
    graph = Graph()
    x = graph.input("x")
    param = AxisT()
    param.axis = -1
    out = graph.add(Op("Concat", "concat", param), [x, x])
    value = randn(2, 3, 32)
    np.testing.assert_array_equal(make_module(graph.schedule(out)).forward({"x": value})[0],
                                  np.concatenate([value, value], axis=-1))


# ------------------------------------------------------------------ StridedSlice

def strided_slice(begin_mask: int = 0, end_mask: int = 0, shrink: int = 0, ellipsis: int = 0,
                  from_type: int = 0) -> Op:
    p = StridedSliceParamT()
    p.beginMask, p.endMask, p.shrinkAxisMask = begin_mask, end_mask, shrink
    p.ellipsisMask, p.fromType = ellipsis, from_type
    return Op("StridedSlice", "slice", p)


SLICE_CASES = [  # begin, end, strides, begin_mask, end_mask, shrink, numpy index
    ((1, 0, 2), (4, 7, 5), (1, 2, 1), 0, 0, 0, np.s_[1:4, 0:7:2, 2:5]),
    ((0, 0, 0), (0, 0, 0), (1, 1, 1), 0b111, 0b111, 0, np.s_[:, :, :]),
    ((-1, 5, 0), (0, -9, 5), (-1, -2, 2), 0b001, 0b001, 0, np.s_[::-1, 5:-9:-2, 0:5:2]),
    ((2, 0, -2), (3, 7, -1), (1, 3, 1), 0, 0b010, 0b101, np.s_[2, 0::3, -2]),
    ((-3, -100, 0), (100, 100, 5), (1, 1, -1), 0, 0, 0, np.s_[-3:100, -100:100, 0:5:-1]),
    ((4, 6, 4), (0, 0, 0), (-2, -3, -1), 0, 0b110, 0, np.s_[4:0:-2, 6::-3, 4::-1]),
]


@pytest.mark.parametrize("begin,end,strides,begin_mask,end_mask,shrink,index", SLICE_CASES)
def test_strided_slice_matches_numpy_slicing(begin, end, strides, begin_mask, end_mask, shrink, index) -> None:
    x = randn(5, 7, 6)
    result = run_op(strided_slice(begin_mask, end_mask, shrink), [x, ints(*begin), ints(*end), ints(*strides)])
    expected = x[index]
    assert result.outputs[0].shape == expected.shape
    np.testing.assert_array_equal(result.outputs[0], expected)
    assert set(result.command_types) <= {"Raster"}


def test_strided_slice_with_ellipsis_keeps_the_middle_dims() -> None:
    x = randn(3, 4, 5, 6)
    result = run_op(strided_slice(ellipsis=0b010), [x, ints(1, 0, 2), ints(3, 0, 6), ints(1, 1, 2)])
    np.testing.assert_array_equal(result.outputs[0], x[1:3, ..., 2:6:2])


def test_onnx_slice_uses_starts_ends_axes_steps() -> None:
    x = randn(5, 7, 6)
    starts, ends, axes, steps = ints(-1, 1), ints(-2**31, 6), ints(2, 0), ints(-2, 2)
    result = run_op(strided_slice(from_type=1), [x, starts, ends, axes, steps])
    np.testing.assert_array_equal(result.outputs[0], x[1:6:2, :, ::-2])


def test_slice_with_empty_result_has_zero_extent() -> None:
    x = randn(5, 7)
    result = run_op(strided_slice(), [x, ints(3, 0), ints(3, 7), ints(1, 1)])
    assert result.outputs[0].shape == (0, 7)


@pytest.mark.parametrize("begin", [5, -6])
def test_a_shrunk_axis_index_outside_the_extent_is_an_unsupported_error(begin: int) -> None:
    x = randn(5, 7)
    with pytest.raises(UnsupportedError, match="outside its extent"):
        run_op(strided_slice(shrink=0b01), [x, ints(begin, 0), ints(begin + 1, 7), ints(1, 1)])


def test_a_range_with_delta_zero_is_an_unsupported_error() -> None:
    scalar = lambda v: Const(np.array([v], np.int32))  # noqa: E731
    with pytest.raises(UnsupportedError, match="delta of 0"):
        run_op(Op("Range", "range"), [scalar(0), scalar(5), scalar(0)])


# ------------------------------------------------------------------ Squeeze / Unsqueeze / ExpandDims / Reshape

def squeeze_param(*dims: int) -> SqueezeParamT:
    p = SqueezeParamT()
    p.squeezeDims = list(dims)
    return p


@pytest.mark.parametrize("dims,expected_shape", [((0,), (3, 1, 5)), ((-2, 0), (3, 5)), ((), (3, 5))])
def test_squeeze_drops_the_named_unit_dims(dims: tuple, expected_shape: tuple) -> None:
    x = randn(1, 3, 1, 5)
    by_param = run_op(Op("Squeeze", "squeeze", squeeze_param(*dims)), [x])
    assert by_param.command_types == ["Raster"]
    np.testing.assert_array_equal(by_param.outputs[0], x.reshape(expected_shape))
    if dims:
        by_input = run_op(Op("Squeeze", "squeeze"), [x, ints(*dims)])
        np.testing.assert_array_equal(by_input.outputs[0], x.reshape(expected_shape))


@pytest.mark.parametrize("dims,expected_shape", [((0,), (1, 3, 5)), ((-1,), (3, 5, 1)), ((0, 3), (1, 3, 5, 1)),
                                                 ((1, -1), (3, 1, 5, 1))])
def test_unsqueeze_inserts_unit_dims_in_the_output_rank(dims: tuple, expected_shape: tuple) -> None:
    x = randn(3, 5)
    np.testing.assert_array_equal(run_op(Op("Unsqueeze", "u", squeeze_param(*dims)), [x]).outputs[0],
                                  x.reshape(expected_shape))
    np.testing.assert_array_equal(run_op(Op("Unsqueeze", "u"), [x, ints(*dims)]).outputs[0],
                                  x.reshape(expected_shape))


def test_expand_dims_inserts_one_axis() -> None:
    x = randn(3, 5)
    param = ExpandDimsT()
    param.axis = -1
    np.testing.assert_array_equal(run_op(Op("ExpandDims", "e", param), [x]).outputs[0], x[..., None])


@pytest.mark.parametrize("dims,expected_shape", [((0, -1), (2, 15)), ((-1, 5), (6, 5)), ((0, 0, 5, 1), (2, 3, 5, 1)),
                                                 ((1, -1, 1), (1, 30, 1))])
def test_reshape_copies_zero_dims_and_infers_minus_one(dims: tuple, expected_shape: tuple) -> None:
    x = randn(2, 3, 5)
    param = ReshapeT()
    param.dims = list(dims)
    result = run_op(Op("Reshape", "r", param), [x])
    assert result.command_types == ["Raster"]
    np.testing.assert_array_equal(result.outputs[0], x.reshape(expected_shape))
    np.testing.assert_array_equal(run_op(Op("Reshape", "r"), [x, ints(*dims)]).outputs[0], x.reshape(expected_shape))


def test_reshape_to_a_different_element_count_is_refused() -> None:
    param = ReshapeT()
    param.dims = [4, -1, 7]
    with pytest.raises(UnsupportedError):
        run_op(Op("Reshape", "r", param), [randn(2, 3, 5)])


# ------------------------------------------------------------------ Permute / Transpose

@pytest.mark.parametrize("perm", [(1, 0, 2), (2, 1, 0), (0, 2, 1), (1, 2, 0)])
def test_permute_and_transpose_reorder_axes(perm: tuple) -> None:
    x = randn(3, 4, 5)
    param = PermuteT()
    param.dims = list(perm)
    by_param = run_op(Op("Permute", "p", param), [x])
    assert by_param.command_types == ["Raster"]
    np.testing.assert_array_equal(by_param.outputs[0], x.transpose(perm))
    np.testing.assert_array_equal(run_op(Op("Transpose", "t"), [x, ints(*perm)]).outputs[0], x.transpose(perm))


# ------------------------------------------------------------------ Shape / Rank folding

def test_shape_and_rank_are_folded_into_host_values() -> None:
    graph = Graph()
    x, y = graph.input("x"), graph.input("y")
    (shape,) = graph.add(Op("Shape", "shape"), [x])
    (rank,) = graph.add(Op("Rank", "rank"), [x])
    (reshaped,) = graph.add(Op("Reshape", "reshape"), [y, shape])
    module = make_module(graph.schedule([shape, rank, reshaped]))
    x_value, y_value = randn(2, 3, 7), randn(42)
    out_shape, out_rank, out_reshaped = module.forward({"x": x_value, "y": y_value})
    np.testing.assert_array_equal(out_shape, [2, 3, 7])
    assert int(out_rank) == 3 and out_shape.dtype == np.int32
    np.testing.assert_array_equal(out_reshaped, y_value.reshape(2, 3, 7))
    commands = [c.op.type for c in module.session.pipeline.commands]
    assert commands == ["Raster"]
    assert module.session.pipeline.placement.folded >= 2


# ------------------------------------------------------------------ MatMul

@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("shape_a,shape_b", [((7, 5), (5, 3)), ((2, 1, 3, 4), (5, 4, 6)), ((37, 17), (17, 1))])
def test_matmul_transposes_and_broadcasts_batches(ta: bool, tb: bool, shape_a: tuple, shape_b: tuple) -> None:
    a, b = randn(*shape_a), randn(*shape_b)
    a_in = np.ascontiguousarray(np.swapaxes(a, -1, -2)) if ta else a
    b_in = np.ascontiguousarray(np.swapaxes(b, -1, -2)) if tb else b
    param = MatMulT()
    param.transposeA, param.transposeB = ta, tb
    out = run_op(Op("MatMul", "mm", param), [a_in, b_in]).outputs[0]
    assert_close(out, np.matmul(a.astype(np.float64), b.astype(np.float64)))


# ------------------------------------------------------------------ Reduction

REDUCTIONS = {
    "SUM": np.sum, "MEAN": np.mean, "MAXIMUM": np.max, "MINIMUM": np.min, "PROD": np.prod,
    "ASUM": lambda x, axis, keepdims: np.sum(np.abs(x), axis=axis, keepdims=keepdims),
    "SUMSQ": lambda x, axis, keepdims: np.sum(x * x, axis=axis, keepdims=keepdims),
}


@pytest.mark.parametrize("operation", sorted(REDUCTIONS))
@pytest.mark.parametrize("dims,keep", [((1,), False), ((-1,), True), ((0, 2), False), ((), True)])
def test_reduction_over_dims(operation: str, dims: tuple, keep: bool) -> None:
    x = randn(3, 4, 5) * 0.9 + 0.3
    param = ReductionParamT()
    param.dim, param.keepDims = list(dims), keep
    out = run_op(Op("Reduction", operation.lower(), param, extra={"operation": operation}), [x]).outputs[0]
    axes = tuple(d % 3 for d in dims) if dims else None
    assert_close(out, REDUCTIONS[operation](x.astype(np.float64), axis=axes, keepdims=keep))


@pytest.mark.parametrize("operation,reference", [("ANY", np.any), ("ALL", np.all)])
def test_logical_reductions_on_ints(operation: str, reference) -> None:
    x = np.array([[0, 1, 0], [1, 1, 1], [0, 0, 0]], np.int32)
    param = ReductionParamT()
    param.dim, param.keepDims = [1], False
    out = run_op(Op("Reduction", "r", param, extra={"operation": operation}), [x]).outputs[0]
    np.testing.assert_array_equal(out, reference(x != 0, axis=1).astype(np.int32))


@pytest.mark.parametrize("operation,expected", [
    ("MOD", [1, 2, -2, -1]), ("FLOORDIV", [2, -3, -3, 2]), ("REALDIV", [2, -2, -2, 2]), ("DIV", [2, -2, -2, 2])])
def test_int_division_family_matches_mnn(operation: str, expected: list) -> None:
    """Values measured with MNN 3.6.1's own runtime (MNN.expr) on [7, -7, 7, -7] op [3, 3, -3, -3]."""
    a, b = np.array([7, -7, 7, -7], np.int32), np.array([3, 3, -3, -3], np.int32)
    result = run_op(binary(operation), [a, b]).outputs[0]
    assert result.dtype == np.int32 and result.tolist() == expected


def test_rope_params_decode_the_cut_dim_and_the_norm_tables_once_for_every_backend() -> None:
    from mnnllm_core.core.op_params import rope_params
    table = LayerNormT()
    table.gamma, table.beta, table.epsilon, table.useRmsnorm = [1.0] * 8, [0.5] * 3, 1e-6, True
    param = rope_param(4, 2, 8, cut=7, q_norm=table)
    p = rope_params(Op("RoPE", "rope", param))
    assert (p.num_head, p.kv_num_head, p.head_dim, p.rope_dim) == (4, 2, 8, 6)
    assert p.q_norm.rms and p.q_norm.beta is None and p.k_norm is None  # beta of another length is ignored
    assert rope_params(Op("RoPE", "rope", RoPEParamT())) is None
