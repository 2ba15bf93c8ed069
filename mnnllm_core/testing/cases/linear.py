"""Convolution 1x1 as a linear layer: fp32 weights inline in the table (the loader's reader),
float weights (fp32, fp16), block-quantized weights (2, 3, 4 and 8 bits, asymmetric and symmetric,
several blocks, a value map),
bias, fused relu/relu6, 1..37 tokens, odd widths; every token count 1..8 (a speculative verify
step: the cpu backend's few-token GEMV at memory "low") on odd row counts."""
from __future__ import annotations

import numpy as np

from ...core.op import Op
from ...core.op_params import NO_ACTIVATION, RELU, RELU6, ConvolutionParams
from ...core.weights.formats import ConvolutionWeights, FloatWeight
from ...core.weights.op_weights import OpWeights
from ...schema.MNN.Convolution2D import Convolution2DT
from ...schema.MNN.Convolution2DCommon import Convolution2DCommonT
from ..harness import Weights
from ..references import linear_reference, quantize
from .case import Case, Trial, randn, single

LINEAR_TOL = 2e-5  # a kernel dequantizing in place sums in another order than numpy's BLAS
TOKENS = (1, 3, 7, 37)
# (bits, ic, block): MNN's 4-bit block 64 (SmolLM2), per-row blocks, small and odd blocks
QUANTIZED = [(4, 576, 64), (8, 576, 64), (4, 576, 576), (8, 576, 576), (4, 96, 32), (8, 96, 32), (4, 6, 6),
             (8, 6, 6), (4, 128, 128), (8, 40, 8), (4, 48, 16), (8, 30, 30), (4, 40, 8)]
# (bits, ic, block, oc, symmetric) run at every token count 1..FEW_TOKENS: rows that are not a
# multiple of 32, blocks of 6 to 64, a single block
FEW_TOKENS = 8
FEW = [(4, 128, 64, 45, False), (8, 40, 8, 33, False), (4, 6, 6, 70, False), (4, 96, 32, 100, True)]
# (bits, ic, block, symmetric): MNN's --quant_bit 2/3 and --sym, odd blocks included
LOW_BITS = [(2, 64, 64, False), (2, 96, 32, False), (3, 64, 64, False), (3, 48, 16, False), (3, 24, 3, False),
            (2, 10, 5, False), (4, 96, 32, True), (8, 64, 64, True), (4, 6, 6, True), (3, 64, 32, True)]


def linear_op(oc: int, ic: int, weights, activation: int = NO_ACTIVATION) -> Op:
    return Op("Convolution", "linear", param=ConvolutionParams(oc, ic, activation=activation), weights=weights)


def _inline(tokens: int, ic: int, oc: int):
    def build(rng) -> Trial:
        weight, bias, x = randn(rng, oc, ic), randn(rng, oc), randn(rng, tokens, ic, 1, 1)
        common = Convolution2DCommonT()
        common.outputCount, common.inputCount = oc, ic
        table = Convolution2DT()
        table.common, table.weight, table.bias = common, weight.reshape(-1).tolist(), bias.tolist()
        op = Op("Convolution", "linear", table, weights=OpWeights("linear", table, None, "<test>"))

        def dropped(outputs, module, runtime):
            return None if op.weights is None else "rearrange must pack the weights and drop the reader"
        return single(op, [x], [linear_reference(x, weight, bias).reshape(tokens, oc, 1, 1)], checks=[dropped])
    return build


def _rows(rng) -> Trial:
    weight, x = randn(rng, 9, 17), randn(rng, 7, 17)
    return single(linear_op(9, 17, Weights.dense(weight)), [x], [linear_reference(x, weight, None)])


def _quantized(tokens: int, bits: int, ic: int, block: int, oc: int = 37, symmetric: bool = False):
    def build(rng) -> Trial:
        weight, dense = quantize(randn(rng, oc, ic), bits, block, symmetric)
        bias, x = randn(rng, oc), randn(rng, tokens, ic, 1, 1)  # Qwen2's q/k/v projections carry a bias
        op = linear_op(oc, ic, Weights(conv=ConvolutionWeights(weight, bias)))
        return single(op, [x], [linear_reference(x, dense, bias).reshape(tokens, oc, 1, 1)])
    return build


def _value_map(rng) -> Trial:
    oc, ic, block = 9, 64, 32
    weight, _ = quantize(randn(rng, oc, ic), 4, block)
    weight.value_map = np.array([-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 9], np.int8)
    x = randn(rng, 3, ic, 1, 1)
    op = linear_op(oc, ic, Weights(conv=ConvolutionWeights(weight, None)))
    return single(op, [x], [linear_reference(x, weight.dequantize(), None).reshape(3, oc, 1, 1)])


def _float(tokens: int, dtype, oc: int, ic: int):
    def build(rng) -> Trial:
        weight, x = randn(rng, oc, ic).astype(dtype), randn(rng, tokens, ic, 1, 1)
        op = linear_op(oc, ic, Weights(conv=ConvolutionWeights(FloatWeight(oc, ic, weight), None)))
        return single(op, [x], [linear_reference(x, weight, None).reshape(tokens, oc, 1, 1)])
    return build


def _activation(activation: int):
    def build(rng) -> Trial:
        weight, bias, x = randn(rng, 12, 17) * 3, randn(rng, 12), randn(rng, 7, 17) * 3
        expected = np.clip(linear_reference(x, weight, bias), 0, 6 if activation == RELU6 else np.inf)

        def clips(outputs, module, runtime):
            if not (expected == 0).any() or (activation == RELU6 and not (expected == 6).any()):
                return "the data must reach the activation's bounds"
            return None
        return single(linear_op(12, 17, Weights.dense(weight, bias), activation), [x], [expected], checks=[clips])
    return build


def cases() -> list[Case]:
    found = [Case("Convolution", f"fp32 inline tokens={t} ic={ic} oc={oc}", _inline(t, ic, oc), device_tol=LINEAR_TOL)
             for t in TOKENS for ic, oc in ((5, 3), (17, 9), (576, 64))]
    found.append(Case("Convolution", "fp32 two-dimensional rows", _rows, device_tol=LINEAR_TOL))
    found += [Case("Convolution", f"q{bits} ic={ic} block={block} tokens={t}", _quantized(t, bits, ic, block),
                   device_tol=LINEAR_TOL)
              for bits, ic, block in QUANTIZED for t in TOKENS]
    found += [Case("Convolution", f"q{bits}{' sym' if sym else ''} ic={ic} block={block} tokens={t}",
                   _quantized(t, bits, ic, block, symmetric=sym), device_tol=LINEAR_TOL)
              for bits, ic, block, sym in LOW_BITS for t in (1, 3, 37)]
    found += [Case("Convolution", f"q{bits}{' sym' if sym else ''} oc={oc} ic={ic} block={block} tokens={t}",
                   _quantized(t, bits, ic, block, oc, sym), device_tol=LINEAR_TOL)
              for bits, ic, block, oc, sym in FEW for t in range(1, FEW_TOKENS + 1)]
    found.append(Case("Convolution", "q4 value map", _value_map, device_tol=LINEAR_TOL))
    found += [Case("Convolution", f"{np.dtype(d).name} weight oc={oc} ic={ic} tokens={t}", _float(t, d, oc, ic),
                   device_tol=LINEAR_TOL)
              for d in (np.float32, np.float16) for oc, ic in ((3, 5), (9, 17), (64, 576), (31, 35)) for t in (1, 5)]
    found += [Case("Convolution", f"fused {name}", _activation(act), device_tol=LINEAR_TOL)
              for name, act in (("relu", RELU), ("relu6", RELU6))]
    return found
