"""What the core decides about an op whatever backend runs it: parameters decoded once, host
folding of shape arithmetic, and the typed errors of shape rules. (The ops' numbers, on every
backend, are the conformance suite's: tests/test_backend_ops.py.)"""
from __future__ import annotations

import numpy as np
import pytest

from mnnllm_core.core.op import Op
from mnnllm_core.core.op_params import (AttentionParams, BinaryParams, CastParams, ConvolutionParams,
                                        LayerNormParams, RoPEParams, UnaryParams, decode)
from mnnllm_core.errors import UnsupportedError
from mnnllm_core.schema.MNN.BinaryOp import BinaryOpT
from mnnllm_core.schema.MNN.BinaryOpOperation import BinaryOpOperation
from mnnllm_core.schema.MNN.LayerNorm import LayerNormT
from mnnllm_core.schema.MNN.Reshape import ReshapeT
from mnnllm_core.schema.MNN.RoPEParam import RoPEParamT
from mnnllm_core.schema.MNN.StridedSliceParam import StridedSliceParamT
from mnnllm_core.testing import Const, Graph, make_module, run_op
from paths import LLM_MNN

RNG = np.random.default_rng(5)


def ints(*values: int) -> Const:
    return Const(np.asarray(values, np.int32))


def test_mod_of_constant_shape_values_is_folded_at_resize() -> None:
    # The export computes axes as (Rank + k) MOD Rank on constant values: folded, never run.
    table = BinaryOpT()
    table.opType = BinaryOpOperation.MOD
    result = run_op(Op("BinaryOp", "mod", table), [Const(np.array(-1, np.int32)), Const(np.array(3, np.int32))])
    assert result.command_types == []
    assert int(result.outputs[0]) == 2


@pytest.mark.parametrize("begin", [5, -6])
def test_a_shrunk_axis_index_outside_the_extent_is_an_unsupported_error(begin: int) -> None:
    table = StridedSliceParamT()
    table.shrinkAxisMask = 0b01
    x = RNG.standard_normal((5, 7)).astype(np.float32)
    with pytest.raises(UnsupportedError, match="outside its extent"):
        run_op(Op("StridedSlice", "slice", table), [x, ints(begin, 0), ints(begin + 1, 7), ints(1, 1)])


def test_a_range_with_delta_zero_is_an_unsupported_error() -> None:
    with pytest.raises(UnsupportedError, match="delta of 0"):
        run_op(Op("Range", "range"), [ints(0), ints(5), ints(0)])


def test_reshape_to_a_different_element_count_is_refused() -> None:
    table = ReshapeT()
    table.dims = [4, -1, 7]
    with pytest.raises(UnsupportedError):
        run_op(Op("Reshape", "r", table), [RNG.standard_normal((2, 3, 5)).astype(np.float32)])


def test_shape_and_rank_are_folded_into_host_values() -> None:
    graph = Graph()
    x, y = graph.input("x"), graph.input("y")
    (shape,) = graph.add(Op("Shape", "shape"), [x])
    (rank,) = graph.add(Op("Rank", "rank"), [x])
    (reshaped,) = graph.add(Op("Reshape", "reshape"), [y, shape])
    module = make_module(graph.schedule([shape, rank, reshaped]))
    x_value, y_value = RNG.standard_normal((2, 3, 7)).astype(np.float32), RNG.standard_normal(42).astype(np.float32)
    out_shape, out_rank, out_reshaped = module.forward({"x": x_value, "y": y_value})
    np.testing.assert_array_equal(out_shape, [2, 3, 7])
    assert int(out_rank) == 3 and out_shape.dtype == np.int32
    np.testing.assert_array_equal(out_reshaped, y_value.reshape(2, 3, 7))
    commands = [c.op.type for c in module.session.pipeline.commands]
    assert commands == ["Raster"]
    assert module.session.pipeline.placement.folded >= 2


def test_rope_params_decode_the_cut_dim_and_the_norm_tables_once_for_every_backend() -> None:
    norm = LayerNormT()
    norm.gamma, norm.beta, norm.epsilon, norm.useRmsnorm = [1.0] * 8, [0.5] * 3, 1e-6, True
    table = RoPEParamT()
    table.numHead, table.kvNumHead, table.headDim, table.ropeCutHeadDim, table.qNorm = 4, 2, 8, 7, norm
    p = decode(Op("RoPE", "rope", table))
    assert (p.num_head, p.kv_num_head, p.head_dim, p.rope_dim) == (4, 2, 8, 6)
    assert p.q_norm.rms and p.q_norm.beta is None and p.k_norm is None  # beta of another length is ignored
    assert decode(Op("RoPE", "rope", RoPEParamT())) is None


def test_a_given_param_is_kept_and_an_op_without_a_decoder_has_none() -> None:
    given = BinaryParams("MUL_SILU")
    assert decode(Op("BinaryOp", "b", BinaryOpT(), param=given)) is given
    assert decode(Op("Select", "s")) is None
    assert decode(Op("NoSuchOp", "x", object())) is None


def test_the_shared_model_decodes_every_op_a_backend_sees_into_typed_params() -> None:
    if not LLM_MNN.exists():
        pytest.skip(f"shared model missing at {LLM_MNN}")
    from mnnllm_core.express.module import Module
    from mnnllm_core.express.static_module import Config
    module = Module.load([], [], LLM_MNN, config=Config(rearrange=False))
    expected = {"Convolution": ConvolutionParams, "LayerNorm": LayerNormParams, "RoPE": RoPEParams,
                "Attention": AttentionParams, "BinaryOp": BinaryParams, "UnaryOp": UnaryParams, "Cast": CastParams}
    seen = set()
    for node in module.static_module.info.nodes:
        kind = expected.get(node.op.type)
        if kind is not None:
            assert isinstance(node.op.param, kind), node.op
            seen.add(node.op.type)
    assert seen == set(expected)
    convolutions = [n.op.param for n in module.static_module.info.nodes if n.op.type == "Convolution"]
    assert all(p.is_linear for p in convolutions) and {p.oc for p in convolutions} >= {576, 1536, 49152}
    attention = next(n.op.param for n in module.static_module.info.nodes if n.op.type == "Attention")
    assert attention.heads == (9, 3, 64) and attention.kv_cache
    norms = [n.op.param for n in module.static_module.info.nodes if n.op.type == "LayerNorm"]
    assert all(p.rms for p in norms)
