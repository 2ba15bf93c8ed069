"""Fill (ONNX ConstantOfShape): a tensor of one value."""
from __future__ import annotations

from mnnllm_core.backend_api import Execution


class FillExecution(Execution):
    """Fill (ONNX ConstantOfShape): the output, of the shape input 0 gave at resize, all input 1."""

    def on_execute(self, inputs, outputs) -> None:
        outputs[0].storage[...] = inputs[1].storage.reshape(-1)[0]


def _fill(backend, inputs, outputs, op):
    return FillExecution(backend)


CREATORS = {"Fill": _fill}
