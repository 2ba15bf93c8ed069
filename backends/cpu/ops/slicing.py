"""SliceTf (TensorFlow's Slice: begin and size, -1 to the end) and Unpack (split an axis into
its slices): numpy views copied into the outputs."""
from __future__ import annotations

from mnnllm_core.backend_api import Execution


class SliceTfExecution(Execution):
    def on_execute(self, inputs, outputs) -> None:
        begin = inputs[1].storage.reshape(-1).astype(int)
        out = outputs[0].storage
        index = tuple(slice(b, b + d) for b, d in zip(begin, out.shape))
        out[...] = inputs[0].storage[index]

    def on_clone(self, backend, op):
        return SliceTfExecution(backend)


class UnpackExecution(Execution):
    def __init__(self, backend, axis: int):
        super().__init__(backend)
        self.axis = axis

    def on_execute(self, inputs, outputs) -> None:
        x = inputs[0].storage
        axis = self.axis + x.ndim if self.axis < 0 else self.axis
        for i, out in enumerate(outputs):
            out.storage[...] = x.take(i, axis=axis)

    def on_clone(self, backend, op):
        return UnpackExecution(backend, self.axis)


def create_unpack(backend, inputs, outputs, op):
    axis = getattr(op.table, "axis", None) if op.table is not None else None
    return UnpackExecution(backend, int(axis or 0))


CREATORS = {"SliceTf": lambda backend, inputs, outputs, op: SliceTfExecution(backend), "Unpack": create_unpack}
