"""MatMul / BatchMatMul of two run-time tensors (the weighted linear layers are `linear.py`),
with optional transposes and a bias input."""
from __future__ import annotations

import numpy as np

from mnnllm_core.backend_api import Execution


class MatMulExecution(Execution):
    def __init__(self, backend, transpose_a: bool, transpose_b: bool):
        super().__init__(backend)
        self.ta, self.tb = transpose_a, transpose_b

    def on_execute(self, inputs, outputs) -> None:
        a, b = inputs[0].storage, inputs[1].storage
        a = np.swapaxes(a, -1, -2) if self.ta else a
        b = np.swapaxes(b, -1, -2) if self.tb else b
        result = np.matmul(a, b)
        if len(inputs) > 2:
            result = result + inputs[2].storage
        outputs[0].storage[...] = result


def _matmul(backend, inputs, outputs, op):
    return MatMulExecution(backend, op.param.transpose_a, op.param.transpose_b)


CREATORS = {"MatMul": _matmul, "BatchMatMul": _matmul}
