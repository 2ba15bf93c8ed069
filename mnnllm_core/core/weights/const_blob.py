"""A Const op's Blob as a numpy array: inline values (fp16/bf16 ones stored as their raw bytes
widened to fp32), or external bytes in the weight file; fp16/bf16 values must be finite (checked
as they are widened: a corrupt weight file)."""
from __future__ import annotations

import numpy as np

from ...errors import FormatError, UnsupportedError
from ..dtypes import (DT_BFLOAT16, DT_DOUBLE, DT_FLOAT, DT_HALF, DT_INT8, DT_INT16, DT_INT32, DT_INT64, DT_UINT8,
                      runtime_dtype)
from .file import ExternalWeightFile
from .finite import convert_checked

# how each DataType is stored in the weight file (bf16 as its raw 16 bits, widened on read)
EXTERNAL_DTYPES = {DT_FLOAT: "<f4", DT_DOUBLE: "<f8", DT_INT32: "<i4", DT_UINT8: "u1", DT_INT16: "<i2", DT_INT8: "i1",
                   DT_INT64: "<i8", DT_BFLOAT16: "<u2", DT_HALF: "<f2"}


def blob_to_array(blob, op_name: str, weight_file: ExternalWeightFile | None, path: str) -> np.ndarray:
    dtype = runtime_dtype(blob.dataType)
    shape = tuple(int(d) for d in blob.dims) if blob.dims is not None else ()
    if blob.external is not None and len(blob.external) >= 2:
        if weight_file is None:
            raise FormatError(f"const {op_name!r} is external but there is no weight file", file=path, field="external")
        offset, size = int(blob.external[0]), int(blob.external[1])
        raw = weight_file.read(offset, size, op_name=op_name, field="external")
        source = EXTERNAL_DTYPES.get(int(blob.dataType))
        if source is None:
            raise UnsupportedError(f"const {op_name!r}: external data of dataType {blob.dataType}", file=path,
                                   field="dataType")
        if size % np.dtype(source).itemsize:
            raise FormatError(f"const {op_name!r}: {size} external bytes are not a whole number of {source} values",
                              file=path, field="external")
        data = raw.view(source)
        if int(blob.dataType) in (DT_BFLOAT16, DT_HALF):
            data = convert_checked(data, np.float32, "value", op_name, str(weight_file.path), field="external",
                                   widen_bf16=int(blob.dataType) == DT_BFLOAT16)
    else:
        data = next((v for v in (blob.float32s, blob.int32s, blob.int64s, blob.uint8s, blob.int8s) if v is not None),
                    np.zeros(0, dtype))
        if data is blob.uint8s and int(blob.dataType) in (DT_HALF, DT_BFLOAT16):
            data = _widen_16bit(np.asarray(data, np.uint8), int(blob.dataType), op_name, path)
    array = np.asarray(data).astype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    if array.size != count:
        if shape == () and array.size > 1:
            shape = (array.size,)
        else:
            raise FormatError(f"const {op_name!r} has {array.size} values for dims {list(shape)}",
                              file=path, field="dims")
    return array.reshape(shape)


def _widen_16bit(raw: np.ndarray, data_type: int, op_name: str, path: str) -> np.ndarray:
    """fp16/bf16 constants inline in the graph are stored as their raw bytes (the vision graphs' rotary
    and GELU constants): two bytes a value."""
    if raw.size % 2:
        raise FormatError(f"const {op_name!r}: {raw.size} bytes are not a whole number of 16-bit values",
                          file=path, field="uint8s")
    return convert_checked(raw.view("<f2" if data_type == DT_HALF else "<u2"), np.float32, "value", op_name, path,
                           field="uint8s", widen_bf16=data_type == DT_BFLOAT16)
