"""MNN's DataType enum values and the numpy dtypes the runtime computes in.

As in MNN's runtime, 64-bit ints and bools compute as int32 and doubles as float32.
"""
from __future__ import annotations

import numpy as np

DT_FLOAT, DT_DOUBLE, DT_INT32, DT_UINT8, DT_INT16, DT_INT8 = 1, 2, 3, 4, 5, 6
DT_INT64, DT_BOOL, DT_BFLOAT16, DT_HALF = 9, 10, 14, 19

_RUNTIME = {
    DT_FLOAT: np.float32, DT_DOUBLE: np.float32, DT_INT32: np.int32, DT_UINT8: np.uint8,
    DT_INT16: np.int16, DT_INT8: np.int8, DT_INT64: np.int32, DT_BOOL: np.int32,
    DT_BFLOAT16: np.float32, DT_HALF: np.float32,
}

FLOAT32 = np.dtype(np.float32)
INT32 = np.dtype(np.int32)


def runtime_dtype(data_type: int | None, default: np.dtype = FLOAT32) -> np.dtype:
    """The numpy dtype a tensor of MNN DataType `data_type` is held in."""
    if data_type is None or data_type not in _RUNTIME:
        return np.dtype(default)
    return np.dtype(_RUNTIME[data_type])
