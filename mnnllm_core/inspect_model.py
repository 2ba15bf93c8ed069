"""What `mnnllm inspect` reports about an llm.mnn: header, inputs/outputs, ops, weights."""
from __future__ import annotations

import os
from collections import Counter

from .express.pipeline_module import FORMAT_NAMES
from .schema.reader import op_type_name, read_net_file

_DTYPES = {1: "float32", 2: "float64", 3: "int32", 4: "uint8", 6: "int8", 9: "int64", 10: "bool", 19: "float16"}


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else (value or "")


def inspect_graph(path: str) -> dict:
    net = read_net_file(path)
    names = [_text(n) for n in net.tensorName or []]
    histogram: Counter = Counter()
    weight_bytes: Counter = Counter()
    inputs = []
    for op in net.oplists or []:
        kind = op_type_name(op.type)
        histogram[kind] += 1
        external = getattr(op.main, "external", None) if op.main is not None else None
        if external is not None and len(external) > 1:
            weight_bytes[kind] += int(sum(int(v) for v in external[1:]))
        if kind == "Input":
            dims = op.main.dims if op.main.dims is not None else []  # a scalar input has no dims
            inputs.append({"name": names[op.outputIndexes[0]], "shape": [int(d) for d in dims],
                           "dtype": _DTYPES.get(int(op.main.dtype), str(op.main.dtype)),
                           "format": FORMAT_NAMES.get(int(op.main.dformat), "?")})
    weight_path = path + ".weight"
    return {
        "path": os.path.abspath(path),
        "version": _text(getattr(net.extraInfo, "version", None)),
        "biz_code": _text(net.bizCode),
        "uuid": _text(net.mnnUuid),
        "inputs": inputs,
        "outputs": [{"name": _text(n)} for n in net.outputName or []],
        "op_count": len(net.oplists or []),
        "op_histogram": dict(histogram.most_common()),
        "tensor_count": len(names),
        "external_weight_bytes": int(sum(weight_bytes.values())),
        "external_weight_bytes_by_op": dict(weight_bytes.most_common()),
        "weight_file": weight_path if os.path.exists(weight_path) else None,
        "weight_file_bytes": os.path.getsize(weight_path) if os.path.exists(weight_path) else 0,
    }
