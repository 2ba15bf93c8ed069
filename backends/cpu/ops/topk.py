"""TopKV2: the k largest (or smallest) values along an axis and their indices."""
from __future__ import annotations

import numpy as np

from mnnllm_core.backend_api import Execution, Refused


class TopKExecution(Execution):
    """The k largest (or smallest) along the axis, largest first; equal values in index order."""

    def __init__(self, backend, largest: bool):
        super().__init__(backend)
        self.largest = largest
        self.k = self.axis = 0

    def on_resize(self, inputs, outputs) -> None:
        self.k = int(inputs[1].host.reshape(-1)[0])
        rank = len(inputs[0].shape)
        self.axis = int(inputs[2].host.reshape(-1)[0]) % rank if len(inputs) > 2 else rank - 1

    def on_execute(self, inputs, outputs) -> None:
        x = inputs[0].storage
        order = np.argsort(-x if self.largest else x, axis=self.axis, kind="stable")
        index = np.take(order, np.arange(self.k), axis=self.axis)
        outputs[0].storage[...] = np.take_along_axis(x, index, axis=self.axis)
        outputs[1].storage[...] = index


def _topk(backend, inputs, outputs, op):
    if inputs[0].dtype.kind != "f":
        return Refused(f"TopKV2 of {inputs[0].dtype}")
    return TopKExecution(backend, op.param.largest)


CREATORS = {"TopKV2": _topk}
