"""The weights of one op, read on demand from the external weight file or the op itself.

A backend's creator calls `convolution()` or `layernorm()` once (weight packing) and keeps
what it needs in its own layout; the static module then drops this reader from the op.
"""
from __future__ import annotations

import numpy as np

from ...errors import FormatError
from .file import ExternalWeightFile
from .formats import ConvolutionWeights, FloatWeight
from .quant import decode_bias, decode_convolution_weight, decode_layernorm, is_asymmetric


class OpWeights:
    """The `WeightReader` of one op of a loaded model (see `mnnllm_core.core.weights.formats`)."""

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

    def same_as(self, other: object) -> bool:
        """Whether `other` (another op's reader) packs to the same Execution (see `same_weights`)."""
        return isinstance(other, OpWeights) and same_weights(self, other)

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


def same_weights(a: OpWeights, b: OpWeights) -> bool:
    """Whether two ops' weights pack to the same Execution: the same parameters (shape, quantization,
    norm options) and the same bytes, read from the same file and offsets or compared in place."""
    pa, pb = a.param, b.param
    if _parameters(pa) != _parameters(pb):
        return False
    ext_a, ext_b = _external_of(pa), _external_of(pb)
    if (ext_a is None) != (ext_b is None):
        return False
    if ext_a is None:
        return all(np.array_equal(_inline(pa, f), _inline(pb, f)) for f in _INLINE_FIELDS)
    if len(ext_a) != len(ext_b) or ext_a[1:] != ext_b[1:] or a.file is None or b.file is None:
        return False
    if ext_a[0] == ext_b[0] and a.file.path.resolve() == b.file.path.resolve():
        return True
    size = int(sum(ext_a[1:]))
    ours = a.file.read(ext_a[0], size, op_name=a.op_name, field="external")
    theirs = b.file.read(ext_b[0], size, op_name=b.op_name, field="external")
    equal = bool(np.array_equal(ours, theirs))
    a.file.release(ext_a[0], size)  # the compare faulted the pages in: they leave the resident set again
    b.file.release(ext_b[0], size)
    return equal


_INLINE_FIELDS = ("weight", "bias", "gamma", "beta")
_QUANT_FIELDS = ("type", "aMaxOrBits", "shapeInt32", "scaleStorage", "aMin", "readType", "quantScale")
_COMMON_FIELDS = ("outputCount", "inputCount", "kernelX", "kernelY", "group", "relu", "relu6")
_NORM_FIELDS = ("epsilon", "group", "useRmsnorm")


def _external_of(param) -> list[int] | None:
    external = getattr(param, "external", None)
    return [int(v) for v in external] if external is not None and len(external) > 0 else None


def _inline(param, name: str) -> np.ndarray:
    value = getattr(param, name, None)
    return np.zeros(0, np.float32) if value is None else np.asarray(value)


def _parameters(param) -> tuple:
    """Everything but the weight bytes that decides how an op's weights pack."""
    common = getattr(param, "common", None)
    quan = getattr(param, "quanParameter", None)
    inline_quant = None
    if quan is not None and quan.buffer is not None and len(quan.buffer):
        inline_quant = (np.asarray(quan.buffer).tobytes(), np.asarray(quan.alpha).tobytes()
                        if quan.alpha is not None else b"")
    return (type(param).__name__,
            tuple(getattr(common, f, None) for f in _COMMON_FIELDS) if common is not None else None,
            tuple(getattr(quan, f, None) for f in _QUANT_FIELDS) if quan is not None else None, inline_quant,
            tuple(getattr(param, f, None) for f in _NORM_FIELDS if hasattr(param, f)),
            tuple(int(v) for v in param.axis) if getattr(param, "axis", None) is not None else None)
