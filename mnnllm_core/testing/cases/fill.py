"""Fill (ONNX ConstantOfShape): the shape an input known at resize, float32 and int32."""
from __future__ import annotations

import numpy as np

from ...core.op import Op
from .case import Case, Trial, ints, single


def _fill(shape: tuple, value, dtype):
    def build(rng) -> Trial:
        fill = np.asarray([value], dtype)
        return single(Op("Fill", "fill"), [ints(*shape), fill], [np.full(shape, value, dtype)])
    return build


def cases() -> list[Case]:
    return [Case("Fill", f"{shape} with {value} {np.dtype(dtype).name}", _fill(shape, value, dtype), tol=0,
                 dtype=np.dtype(dtype).name)
            for shape, value, dtype in (((1, 7, 1), 0.0, np.float32), ((2, 3, 5), 1.5, np.float32),
                                        ((4,), 3, np.int32))]
