"""StaticModule resizes only when it must, and its clones share packed weights and the KV cache.

A resize (encode + place + allocate) happens when an input's shape differs from the
previous forward's, or when the value of a shape input (an input that reaches a shape
argument, such as Reshape's dims) changes; never for repeated shapes. `resize_count`
pins the exact sequence. Clones (`StaticModule.clone()`, what the LLM's ModulePool
keeps per (seq_len, all_logits)) keep their own resize state but share the packed
weight arrays and the Attention KV cache.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from mnnllm_core.core.op import Op
from mnnllm_core.core.op_params import BinaryParams, ConvolutionParams, UnaryParams
from mnnllm_core.core.weights.op_weights import OpWeights
from mnnllm_core.errors import UnsupportedError
from mnnllm_core.schema.MNN.AttentionParam import AttentionParamT
from mnnllm_core.schema.MNN.Convolution2D import Convolution2DT
from mnnllm_core.schema.MNN.Convolution2DCommon import Convolution2DCommonT
from mnnllm_core.schema.MNN.LayerNorm import LayerNormT

from mnnllm_core.testing import Const, Graph, Weights, make_module, new_runtime, run_op

RNG = np.random.default_rng(7)
HIDDEN, OUT = 17, 12


def linear_op(weight: np.ndarray, bias: np.ndarray) -> Op:
    common = Convolution2DCommonT()
    common.outputCount, common.inputCount = weight.shape
    param = Convolution2DT()
    param.common = common
    return Op("Convolution", "linear", param, weights=Weights.dense(weight, bias))


def rms_norm_op(gamma: np.ndarray) -> Op:
    param = LayerNormT()
    param.axis, param.epsilon, param.useRmsnorm, param.gamma = [-1], 1e-6, True, gamma.tolist()
    return Op("LayerNorm", "norm", param, weights=OpWeights("norm", param, None, "<test>"))


class NormLinearReshape:
    """x [seq, HIDDEN] -> RMSNorm -> linear -> Reshape(dims), dims fed as a shape input."""

    def __init__(self) -> None:
        self.gamma = RNG.standard_normal(HIDDEN).astype(np.float32)
        self.weight = RNG.standard_normal((OUT, HIDDEN)).astype(np.float32)
        self.bias = RNG.standard_normal(OUT).astype(np.float32)
        graph = Graph()
        x, dims = graph.input("x"), graph.input("dims", np.int32)
        (normed,) = graph.add(rms_norm_op(self.gamma), [x])
        (projected,) = graph.add(linear_op(self.weight, self.bias), [normed])
        (out,) = graph.add(Op("Reshape", "reshape"), [projected, dims])
        self.info = graph.schedule([out])
        self.norm_node, self.linear_node = 0, 1

    def reference(self, x: np.ndarray, dims: np.ndarray) -> np.ndarray:
        x = x.astype(np.float64)
        normed = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6) * self.gamma
        return (normed @ self.weight.T + self.bias).reshape(dims)


def feeds(seq: int, dims: tuple[int, ...] = (-1,)) -> dict[str, np.ndarray]:
    return {"x": RNG.standard_normal((seq, HIDDEN)).astype(np.float32), "dims": np.asarray(dims, np.int32)}


def test_the_shape_input_is_detected() -> None:
    assert NormLinearReshape().info.shape_inputs == ["dims"]


@pytest.mark.parametrize("shape_mutable", [False, True])
def test_resizes_only_when_an_input_shape_changes(shape_mutable: bool) -> None:
    graph = NormLinearReshape()
    module = make_module(graph.info, shape_mutable=shape_mutable)
    counts = []
    for seq in (3, 3, 1, 1, 1, 3, 37, 37, 3):
        inputs = feeds(seq)
        out = module.forward(inputs)[0]
        np.testing.assert_allclose(out, graph.reference(inputs["x"], inputs["dims"]), rtol=1e-5, atol=1e-4)
        counts.append(module.resize_count)
    assert counts == [1, 1, 2, 2, 2, 3, 4, 4, 5]


@pytest.mark.parametrize("shape_mutable", [False, True])
def test_a_changed_shape_input_value_resizes_with_the_same_shapes(shape_mutable: bool) -> None:
    graph = NormLinearReshape()
    module = make_module(graph.info, shape_mutable=shape_mutable)
    counts, shapes = [], []
    for dims in ((-1,), (-1,), (2, -1), (2, -1), (-1, 2), (-1,)):
        inputs = feeds(4, dims)
        out = module.forward(inputs)[0]
        np.testing.assert_allclose(out, graph.reference(inputs["x"], inputs["dims"]), rtol=1e-5, atol=1e-4)
        counts.append(module.resize_count)
        shapes.append(out.shape)
    assert counts == [1, 1, 2, 2, 3, 4]
    assert shapes == [(48,), (48,), (2, 24), (2, 24), (24, 2), (48,)]


def test_a_failed_resize_does_not_leave_the_previous_key_valid() -> None:
    graph = NormLinearReshape()
    module = make_module(graph.info)
    good = feeds(4)
    module.forward(good)
    with pytest.raises(UnsupportedError):
        module.forward(feeds(4, (5, -1)))  # 48 values do not reshape to (5, -1)
    out = module.forward(good)[0]  # the same shapes as before the failure: it must resize again
    np.testing.assert_allclose(out, graph.reference(good["x"], good["dims"]), rtol=1e-5, atol=1e-4)
    assert module.resize_count == 2


def packed(module, node: int):
    return module.session.pipeline.executions[node][1]


def test_clones_share_the_packed_weight_arrays() -> None:
    graph = NormLinearReshape()
    module = make_module(graph.info)
    clone = module.clone()
    assert packed(clone, graph.linear_node) is not packed(module, graph.linear_node)
    assert packed(clone, graph.linear_node).weight is packed(module, graph.linear_node).weight
    assert packed(clone, graph.linear_node).bias is packed(module, graph.linear_node).bias
    assert packed(clone, graph.norm_node).gamma is packed(module, graph.norm_node).gamma
    assert all(node.op.weights is None for node in graph.info.nodes), "raw weights are dropped once packed"
    inputs = feeds(5)
    np.testing.assert_array_equal(clone.forward(inputs)[0], module.forward(inputs)[0])


def test_a_clone_resizes_independently_of_its_base() -> None:
    graph = NormLinearReshape()
    prefill = make_module(graph.info)
    decode = prefill.clone()
    for _ in range(3):
        prefill.forward(feeds(7))
        decode.forward(feeds(1))
    assert (prefill.resize_count, decode.resize_count) == (1, 1)


HEADS, KV_HEADS, DIM = 4, 2, 8


def attention_graph() -> Graph:
    graph = Graph()
    param = AttentionParamT()
    param.kvCache, param.outputC4 = True, True
    inputs = [graph.input(n) for n in ("q", "k", "v", "mask")]
    graph.add(Op("Attention", "attn", param, extra={"heads": (HEADS, KV_HEADS, DIM)}), inputs)
    return graph


def attention_feeds(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> dict[str, np.ndarray]:
    seq = q.shape[0]
    return {"q": q.reshape(seq, -1, 1, 1), "k": k.reshape(seq, -1, 1, 1), "v": v.reshape(seq, -1, 1, 1),
            "mask": np.zeros((1, 1, 1, 1), np.float32)}


def last_row_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """The last query against every key: [HEADS, DIM]."""
    group = HEADS // KV_HEADS
    out = np.empty((HEADS, DIM))
    for h in range(HEADS):
        scores = k[:, h // group].astype(np.float64) @ q[-1, h] / math.sqrt(DIM)
        p = np.exp(scores - scores.max())
        out[h] = p / p.sum() @ v[:, h // group]
    return out


# Attention's Execution is made at load (like weighted ops), so even a clone made before
# the first forward shares the cache.
@pytest.mark.parametrize("clone_before_first_forward", [False, True])
def test_a_clone_decodes_from_the_kv_cache_its_base_filled(clone_before_first_forward: bool) -> None:
    graph = attention_graph()
    runtime = new_runtime()
    prefill = make_module(graph.schedule([len(graph.names) - 1]), runtime)
    total, prompt = 10, 7
    q = RNG.standard_normal((total, HEADS, DIM)).astype(np.float32)
    k = RNG.standard_normal((total, KV_HEADS, DIM)).astype(np.float32)
    v = RNG.standard_normal((total, KV_HEADS, DIM)).astype(np.float32)
    meta = runtime.kv_meta
    decode = prefill.clone() if clone_before_first_forward else None
    meta.add = prompt
    prefill.forward(attention_feeds(q[:prompt], k[:prompt], v[:prompt]))
    meta.sync()
    decode = decode or prefill.clone()
    for t in range(prompt, total):
        meta.add = 1
        out = decode.forward(attention_feeds(q[t:t + 1], k[t:t + 1], v[t:t + 1]))[0]
        meta.sync()
        expected = last_row_attention(q[:t + 1], k[:t + 1], v[:t + 1])
        np.testing.assert_allclose(out.reshape(HEADS, DIM), expected, rtol=1e-5, atol=1e-5)
    assert packed(decode, 0).cache is packed(prefill, 0).cache
    assert (prefill.resize_count, decode.resize_count) == (1, 1)


def test_a_packed_op_with_only_constant_inputs_runs_instead_of_folding() -> None:
    weight = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    op = Op("Convolution", "linear", param=ConvolutionParams(3, 4), weights=Weights.dense(weight))
    result = run_op(op, [Const(x.reshape(2, 4, 1, 1))])
    np.testing.assert_allclose(result.outputs[0].reshape(2, 3), x @ weight.T, rtol=1e-6, atol=1e-6)


def test_a_constant_keeps_its_value_when_a_computed_tensor_of_its_size_ran_before_its_first_use() -> None:
    """The constant is uploaded at resize; had it taken the pooled buffer of `negated` (released
    before the constant's first use), running `negated` would overwrite it on every forward."""
    graph = Graph()
    x = graph.input("x")
    (negated,) = graph.add(Op("UnaryOp", "neg", param=UnaryParams("NEG")), [x])
    (again,) = graph.add(Op("UnaryOp", "neg2", param=UnaryParams("NEG")), [negated])
    (scaled,) = graph.add(Op("BinaryOp", "mul", param=BinaryParams("MUL")), [graph.const(np.float32(0.25)), again])
    module = make_module(graph.schedule([scaled]))
    for value in (3.0, 5.0):
        (out,) = module.forward({"x": np.array(value, np.float32)})  # the shape of the constant
        assert float(out) == 0.25 * value
