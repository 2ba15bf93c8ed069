"""Decode the external data of MNN's Convolution and LayerNorm ops into numpy arrays.

A quantized Convolution weight (`quanParameter.type` 1) is laid out as MNN's
IDSTDecoder reads it (`ReadQuanData_c`):

    u8 ndim (1..4) | ndim dims, uint16 (uint32 when shapeInt32) | u8 map count (0 = 256)
    | count int8 values (the value map) | ceil(bits * n / 8) bytes of codes

with bits = ceil(log2(count)) and codes packed most significant bit first (for
4 bits: high nibble first), over the weight flattened as [oc, ic]. MNN sorts the
map ascending and reads code c as the value map[c]; the exporter's map is
-2^(bits-1) .. 2^(bits-1)-1, so value = code - 2^(bits-1). After the weight come
the alphas: per (row, block) a (zero, scale) pair when asymmetric, else a scale,
in fp16 or fp32 (`scaleStorage`). MNN turns a weight back to float in fp32 as
`float(value) * scale + zero` (`ConvolutionCommon::load`); so does this module.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import FormatError, UnsupportedError
from .finite import check_finite
from .formats import ConvolutionWeight, FloatWeight, QuantizedWeight

# MNN's IDSTQuan.type values.
QUANT_IDST = 1
QUANT_SPARSE = 2
QUANT_FP16 = 3
QUANT_INT8 = 4

# MNN's ScaleStorageType (FP32 = 0, FP16 = 1; the shared model stores 1 for "FP16"), as bytes per scale.
_SCALE_BYTES: dict[str | int, int] = {"FP32": 4, "FP16": 2, 0: 4, 1: 2}


def is_asymmetric(read_type: int, quant_type: int | None, a_min: int, quant_scale: float) -> bool:
    """MNN's rule: alphas are (zero, scale) pairs when readType != 0, or for an old int8 (type 4) model."""
    return read_type != 0 or _is_old_type4(quant_type, a_min, quant_scale)


def _is_old_type4(quant_type: int | None, a_min: int, quant_scale: float) -> bool:
    return quant_type == QUANT_INT8 and a_min == 0 and abs(quant_scale) < 1e-6


@dataclass(frozen=True)
class _Header:
    dims: tuple[int, ...]
    value_map: np.ndarray
    bits: int
    length: int


def decode_convolution_weight(
    weight_bytes: np.ndarray,
    alpha_bytes: np.ndarray,
    *,
    bits: int,
    oc: int,
    ic: int,
    shape_int32: bool,
    scale_storage: str | int,
    asymmetric: bool = True,
    quant_type: int | None = QUANT_IDST,
    a_min: int = 1,
    quant_scale: float = 1.0,
    file: str | None,
    op_name: str,
) -> ConvolutionWeight:
    """Decode one Convolution's external weight and alpha bytes.

    The parameters come from the op: `bits` = quanParameter.aMaxOrBits, `oc`/`ic` =
    common.outputCount/inputCount, `shape_int32`, `scale_storage`, `quant_type` =
    quanParameter.type (None when the op has no quanParameter: fp32 weights),
    `a_min` = aMin, `quant_scale` = quantScale, `asymmetric` = `is_asymmetric(...)`.
    Every count is checked against the bytes present, and every scale and zero point
    must be finite: a corrupt block raises FormatError naming the file and op rather
    than decoding garbage. Float weights are checked as they are converted (FloatWeight).
    """
    weight_bytes = _as_uint8(weight_bytes)
    alpha_bytes = _as_uint8(alpha_bytes)
    if oc <= 0 or ic <= 0:
        raise FormatError(f"op {op_name!r}: weight shape [{oc}, {ic}] is empty", file=file, field="common")
    if quant_type is None:
        return FloatWeight(oc, ic, _float_matrix(weight_bytes, "<f4", oc, ic, file=file, op_name=op_name),
                           file=file, op_name=op_name)
    if quant_type == QUANT_FP16:
        return FloatWeight(oc, ic, _float_matrix(weight_bytes, "<f2", oc, ic, file=file, op_name=op_name),
                           file=file, op_name=op_name)
    if quant_type == QUANT_INT8:
        if weight_bytes.size != oc * ic:
            raise FormatError(f"op {op_name!r}: int8 weight holds {weight_bytes.size} bytes, "
                              f"[{oc}, {ic}] needs {oc * ic}", file=file, field="weight")
        # Stored int8 v becomes the unsigned code v + 128, so the linear 8-bit map applies.
        packed, value_map, code_bits = weight_bytes ^ np.uint8(0x80), None, 8
    elif quant_type == QUANT_IDST:
        header = _parse_header(weight_bytes, oc=oc, ic=ic, bits=bits, shape_int32=shape_int32,
                               file=file, op_name=op_name)
        packed, value_map, code_bits = weight_bytes[header.length:], header.value_map, header.bits
    else:
        raise UnsupportedError(f"op {op_name!r}: quanParameter.type {quant_type} (sparse or unknown) "
                               "is not supported", file=file, field="quanParameter.type")
    zero, scale = _decode_alpha(alpha_bytes, oc=oc, ic=ic, scale_storage=scale_storage, asymmetric=asymmetric,
                                file=file, op_name=op_name)
    if asymmetric and a_min <= 0:
        # Old exporters stored the block minimum: MNN shifts it to the zero of value 0.
        clamp_min = np.float32(-128 if a_min == 0 else a_min)
        zero = zero - clamp_min * scale
    if quant_scale != 1.0 and not _is_old_type4(quant_type, a_min, quant_scale):
        zero, scale = zero * np.float32(quant_scale), scale * np.float32(quant_scale)
    check_finite(scale, "quantization scale", op_name, file, "alpha")
    check_finite(zero, "quantization zero point", op_name, file, "alpha")
    return QuantizedWeight(bits=code_bits, block_size=ic // zero.shape[1], oc=oc, ic=ic, packed=packed,
                           zero=zero, scale=scale, value_map=value_map, file=file, op_name=op_name)


def _parse_header(data: np.ndarray, *, oc: int, ic: int, bits: int, shape_int32: bool,
                  file: str | None, op_name: str) -> _Header:
    def fail(what: str) -> FormatError:
        return FormatError(f"op {op_name!r}: corrupt quantized weight header: {what}", file=file, field="weight")

    if data.size < 1:
        raise fail("the weight block is empty")
    ndim = int(data[0])
    if not 1 <= ndim <= 4:
        raise fail(f"{ndim} dims (MNN allows 1 to 4)")
    dim_type = np.dtype("<u4" if shape_int32 else "<u2")
    pos = 1 + ndim * dim_type.itemsize
    if data.size < pos + 1:
        raise fail(f"{data.size} bytes cannot hold {ndim} dims and the map count")
    dims = tuple(int(d) for d in data[1:pos].view(dim_type))
    # [oc, ic], or each row split in equal parts (MNN's exporter writes a Qwen3-VL patch embedding
    # [32, 1536] as [384, 128]): the same codes in the same order
    if dims[0] % oc or int(np.prod(dims, dtype=np.int64)) != oc * ic:
        raise fail(f"dims {list(dims)} do not match the op's [{oc}, {ic}]")
    count = int(data[pos]) or 256
    pos += 1
    if data.size < pos + count:
        raise fail(f"{data.size} bytes cannot hold a value map of {count} entries")
    value_map = np.sort(data[pos:pos + count].view(np.int8))
    pos += count
    code_bits = max(1, (count - 1).bit_length())
    if code_bits > bits:
        raise fail(f"a value map of {count} entries needs {code_bits} bits, the op declares {bits}")
    n_codes = oc * ic
    need = (code_bits * n_codes + 7) // 8
    if data.size - pos != need:
        raise fail(f"{data.size - pos} bytes of codes after a {pos}-byte header; "
                   f"{n_codes} codes of {code_bits} bits need {need}")
    return _Header(dims=dims, value_map=value_map, bits=code_bits, length=pos)


def _decode_alpha(alpha: np.ndarray, *, oc: int, ic: int, scale_storage: str | int, asymmetric: bool,
                  file: str | None, op_name: str) -> tuple[np.ndarray, np.ndarray]:
    """fp32 (zero, scale), each [oc, n_blocks]; the block count follows from the alpha size."""
    storage = scale_storage.upper() if isinstance(scale_storage, str) else int(scale_storage)
    if storage not in _SCALE_BYTES:
        raise FormatError(f"op {op_name!r}: unknown scaleStorage {scale_storage!r}", file=file,
                          field="quanParameter.scaleStorage")
    width = _SCALE_BYTES[storage]
    per_block = 2 if asymmetric else 1
    n_values, rest = divmod(alpha.size, width)
    n_blocks, uneven = divmod(n_values, per_block * oc)
    if rest or uneven or n_blocks == 0 or ic % n_blocks:
        raise FormatError(
            f"op {op_name!r}: {alpha.size} alpha bytes are not {oc} rows x n blocks x {per_block} "
            f"values of {width} bytes with n dividing ic={ic}", file=file, field="alpha")
    values = alpha.view("<f2" if width == 2 else "<f4").reshape(oc, n_blocks, per_block)
    # each straight from the stored pairs to its own float32 array: one pass, no float32 copy of the pairs
    scale = values[:, :, -1].astype(np.float32, order="C")
    zero = values[:, :, 0].astype(np.float32, order="C") if asymmetric else np.zeros_like(scale)
    return zero, scale


def decode_bias(bias_bytes: np.ndarray, oc: int, *, file: str | None = None,
                op_name: str | None = None) -> np.ndarray:
    """The fp32 bias [oc]; zeros when the op stores none (a Linear without bias)."""
    bias_bytes = _as_uint8(bias_bytes)
    if bias_bytes.size == 0:
        return np.zeros(oc, np.float32)
    if bias_bytes.size != 4 * oc:
        raise FormatError(f"op {op_name!r}: bias holds {bias_bytes.size} bytes, {oc} fp32 values need {4 * oc}",
                          file=file, field="bias")
    bias = bias_bytes.view("<f4").astype(np.float32)
    check_finite(bias, "bias", op_name, file, "bias")
    return bias


def decode_layernorm(gamma_bytes: np.ndarray, beta_bytes: np.ndarray, *, file: str | None = None,
                     op_name: str | None = None) -> tuple[np.ndarray | None, np.ndarray | None]:
    """fp32 (gamma, beta) of a LayerNorm's external data; None for a part stored with 0 bytes."""
    parts = []
    for name, raw in (("gamma", _as_uint8(gamma_bytes)), ("beta", _as_uint8(beta_bytes))):
        if raw.size % 4:
            raise FormatError(f"op {op_name!r}: {name} holds {raw.size} bytes, not a whole number of fp32",
                              file=file, field=name)
        part = raw.view("<f4").astype(np.float32) if raw.size else None
        if part is not None:
            check_finite(part, name, op_name, file, name)
        parts.append(part)
    gamma, beta = parts
    if gamma is not None and beta is not None and gamma.size != beta.size:
        raise FormatError(f"op {op_name!r}: gamma has {gamma.size} values, beta {beta.size}",
                          file=file, field="beta")
    return gamma, beta


def _float_matrix(data: np.ndarray, dtype: str, oc: int, ic: int, *, file: str | None,
                  op_name: str) -> np.ndarray:
    width = np.dtype(dtype).itemsize
    if data.size != oc * ic * width:
        raise FormatError(f"op {op_name!r}: float weight holds {data.size} bytes, [{oc}, {ic}] of "
                          f"{width}-byte floats needs {oc * ic * width}", file=file, field="weight")
    return data.view(dtype).reshape(oc, ic)


def _as_uint8(data: np.ndarray | bytes) -> np.ndarray:
    array = np.frombuffer(data, np.uint8) if isinstance(data, (bytes, bytearray, memoryview)) else data
    if array.dtype != np.uint8 or array.ndim != 1:
        raise TypeError(f"expected a 1-D uint8 array, got {array.dtype} with shape {array.shape}")
    return array
