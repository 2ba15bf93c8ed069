"""The weights of one op, read on demand from the external weight file or the op itself.

A backend's creator calls `convolution()` or `layernorm()` once (weight packing) and keeps
what it needs in its own layout; the static module then drops this reader from the op.
"""
from __future__ import annotations

import numpy as np

from ..core.quant import decode_bias, decode_convolution_weight, decode_layernorm, is_asymmetric
from ..core.weights import ConvolutionWeights, FloatWeight
from ..errors import FormatError
from .weight_file import ExternalWeightFile


class OpWeights:
    """The `WeightReader` of one op of a loaded model (see `mnnllm_core.core.weights`)."""

    def __init__(self, op_name: str, param, weight_file: ExternalWeightFile | None, path: str):
        self.op_name = op_name
        self.param = param
        self.file = weight_file
        self.path = path

    def _external(self, *fields: str) -> tuple[np.ndarray, ...]:
        external = [int(v) for v in self.param.external]
        if len(external) < len(fields) + 1:
            raise FormatError(f"op {self.op_name!r}: external has {len(external)} entries, needs {len(fields) + 1}",
                              file=self.path, field="external")
        if self.file is None:
            raise FormatError(f"op {self.op_name!r} has external weights but no weight file was found",
                              file=self.path, field="external")
        return self.file.read_sections(external, fields, op_name=self.op_name)

    def release(self) -> None:
        """The op's bytes of the weight file leave the resident set (its Execution has packed them)."""
        external = getattr(self.param, "external", None)
        if self.file is not None and external is not None and len(external) > 1:
            self.file.release(int(external[0]), int(sum(int(v) for v in external[1:])))

    def convolution(self) -> ConvolutionWeights:
        p = self.param
        common = p.common
        # a k x k kernel is an [oc, ic * kh * kw] matrix (im2col order: channel, row, column)
        kernel = int(common.kernelX or 1) * int(common.kernelY or 1)
        oc, ic = int(common.outputCount), int(common.inputCount) * kernel // max(1, int(common.group or 1))
        quan = p.quanParameter
        if p.external is not None and len(p.external) > 0:
            weight, alpha, bias = self._external("weight", "alpha", "bias")
            if quan is None:
                quantized = decode_convolution_weight(weight, alpha, bits=32, oc=oc, ic=ic, shape_int32=False,
                                                      scale_storage=0, quant_type=None, file=self.file.path,
                                                      op_name=self.op_name)
            else:
                quantized = decode_convolution_weight(
                    weight, alpha, bits=int(quan.aMaxOrBits), oc=oc, ic=ic, shape_int32=bool(quan.shapeInt32),
                    scale_storage=int(quan.scaleStorage), quant_type=int(quan.type), a_min=int(quan.aMin),
                    quant_scale=float(quan.quantScale),
                    asymmetric=is_asymmetric(int(quan.readType), int(quan.type), int(quan.aMin),
                                             float(quan.quantScale)),
                    file=self.file.path, op_name=self.op_name)
            return ConvolutionWeights(quantized, decode_bias(bias, oc, file=self.file.path, op_name=self.op_name))
        bias = np.asarray(p.bias, np.float32) if p.bias is not None and len(p.bias) else None
        if quan is not None and quan.buffer is not None and len(quan.buffer):
            alpha = np.asarray(quan.alpha, np.float32).view(np.uint8) if quan.alpha is not None else np.zeros(0, np.uint8)
            quantized = decode_convolution_weight(
                np.asarray(quan.buffer, np.int8).view(np.uint8), alpha, bits=int(quan.aMaxOrBits), oc=oc, ic=ic,
                shape_int32=bool(quan.shapeInt32), scale_storage=0, quant_type=int(quan.type),
                a_min=int(quan.aMin), quant_scale=float(quan.quantScale),
                asymmetric=is_asymmetric(int(quan.readType), int(quan.type), int(quan.aMin), float(quan.quantScale)),
                file=self.path, op_name=self.op_name)
            return ConvolutionWeights(quantized, bias)
        if p.weight is None or len(p.weight) != oc * ic:
            raise FormatError(f"op {self.op_name!r}: no weights for a [{oc}, {ic}] convolution",
                              file=self.path, field="weight")
        return ConvolutionWeights(FloatWeight(oc, ic, np.asarray(p.weight, np.float32).reshape(oc, ic)), bias)

    def layernorm(self) -> tuple[np.ndarray | None, np.ndarray | None]:
        p = self.param
        if p.external is not None and len(p.external) > 0:
            gamma, beta = self._external("gamma", "beta")
            return decode_layernorm(gamma, beta, file=self.file.path, op_name=self.op_name)
        gamma = np.asarray(p.gamma, np.float32) if p.gamma is not None and len(p.gamma) else None
        beta = np.asarray(p.beta, np.float32) if p.beta is not None and len(p.beta) else None
        return gamma, beta
