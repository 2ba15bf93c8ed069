"""Weights must be finite: MNN's weight file has no checksum, but a corrupt quantization scale or
zero point, or a corrupt fp16/bf16 weight, often decodes to NaN or infinity, which would turn every
answer to garbage. The checks ride on work the load already does: the (small) scale and zero
arrays as they are decoded, and float weights a cache-sized chunk at a time as they are converted,
so the check reads what the conversion just wrote."""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ...errors import FormatError

_CHUNK_ELEMENTS = 1 << 18  # converted then checked while still in cache (1 MB of float32)


def non_finite_error(values: np.ndarray, what: str, op_name: str | None, file: str | None,
                     field: str, offset: int = 0) -> FormatError:
    """The error for the first non-finite entry of `values` (flat position + `offset`)."""
    index = int(np.flatnonzero(~np.isfinite(values.reshape(-1)))[0])
    return FormatError(f"op {op_name!r}: {what} {index + offset} is {values.reshape(-1)[index]} (the weight file is "
                       "corrupt)", file=file, field=field)


def check_finite(values: np.ndarray, what: str, op_name: str | None, file: str | None, field: str) -> None:
    """Refuse a NaN or infinite entry of a small array (scales, zero points, biases)."""
    if values.size and not np.isfinite(values).all():
        raise non_finite_error(values, what, op_name, file, field)


def convert_checked(source: np.ndarray, dtype: npt.DTypeLike, what: str, op_name: str | None, file: str | None,
                    field: str = "weight", widen_bf16: bool = False) -> np.ndarray:
    """`source` as a new `dtype` array of its shape, each chunk checked for finiteness right after it
    is converted. With `widen_bf16`, `source` holds raw bf16 bits (uint16), the high half of a float32."""
    out = np.empty(source.shape, dtype)
    flat_in, flat_out = source.reshape(-1), out.reshape(-1)
    for start in range(0, flat_in.size, _CHUNK_ELEMENTS):
        stop = min(start + _CHUNK_ELEMENTS, flat_in.size)
        chunk = flat_out[start:stop]
        if widen_bf16:
            np.left_shift(flat_in[start:stop], 16, out=chunk.view(np.uint32), dtype=np.uint32)
        else:
            chunk[:] = flat_in[start:stop]
        # max and min carry a NaN or an infinity through: two reductions, no mask array
        if not (np.isfinite(chunk.max()) and np.isfinite(chunk.min())):
            raise non_finite_error(chunk, what, op_name, file, field, offset=start)
    return out
