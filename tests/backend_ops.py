"""Op builders and checks shared by the tests of the GPU backends: each builder returns a
function making a fresh Op, so the same op can run on the backend under test and on cpu."""
from __future__ import annotations

import numpy as np

from mnnllm_core.core.op import Op
from mnnllm_core.express.op_weights import OpWeights
from mnnllm_core.schema.MNN.BinaryOp import BinaryOpT
from mnnllm_core.schema.MNN.CastParam import CastParamT
from mnnllm_core.schema.MNN.LayerNorm import LayerNormT
from mnnllm_core.schema.MNN.RoPEParam import RoPEParamT

from op_harness import new_runtime, run_op

FP32 = 1e-5


def assert_close(actual: np.ndarray, expected: np.ndarray, tol: float = FP32) -> None:
    expected = np.asarray(expected, np.float64)
    scale = max(1.0, float(np.max(np.abs(expected)))) if expected.size else 1.0
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    np.testing.assert_allclose(np.asarray(actual, np.float64), expected, rtol=tol, atol=tol * scale)


def on_cpu(make_op, inputs, outputs: int = 1) -> list[np.ndarray]:
    return run_op(make_op(), inputs, outputs, runtime=new_runtime()).outputs


def binary(operation: str, activation: int = 0):
    def make():
        param = BinaryOpT()
        param.activationType = activation
        return Op("BinaryOp", operation.lower(), param, extra={"operation": operation})
    return make


def layernorm_op(eps, rms, gamma=None, beta=None, group=1, axis=(-1,), fmt="NCHW"):
    def make():
        p = LayerNormT()
        p.axis, p.epsilon, p.useRmsnorm, p.group = list(axis), eps, rms, group
        p.gamma = None if gamma is None else gamma.tolist()
        p.beta = None if beta is None else beta.tolist()
        return Op("LayerNorm", "ln", p, weights=OpWeights("ln", p, None, "<test>"), extra={"format": fmt})
    return make


def rope_op(heads, kv_heads, dim, cut=0, q_norm=None, k_norm=None):
    def make():
        p = RoPEParamT()
        p.numHead, p.kvNumHead, p.headDim, p.ropeCutHeadDim = heads, kv_heads, dim, cut
        p.qNorm, p.kNorm = q_norm, k_norm
        return Op("RoPE", "rope", p)
    return make


def cast(dst: int):
    def make():
        param = CastParamT()
        param.dstT = dst
        return Op("Cast", "cast", param)
    return make
