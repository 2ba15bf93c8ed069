"""The smallest mnnllm backend: numpy storage and one op type, BinaryOp.
Every other op runs on the cpu backend, which the pipeline falls back to by itself.
A pipeline wholly on it is replayed: its steps called as one list, not op by op."""
import numpy as np

from mnnllm_core.backend_api import Execution, HostBackend, Replay, Runtime, RuntimeCreator, hookimpl

BINARY = {"ADD": np.add, "SUB": np.subtract, "MUL": np.multiply, "REALDIV": np.divide}


class BinaryExecution(Execution):
    def __init__(self, backend, function):
        super().__init__(backend)
        self.function = function

    def on_execute(self, inputs, outputs):
        outputs[0].storage[...] = self.function(inputs[0].storage, inputs[1].storage)


def create_binary(backend, inputs, outputs, op):
    function = BINARY.get(op.param.operation)  # op.param: BinaryParams, decoded by the core
    if function is None or op.param.activation:  # a fused relu: not here
        return None  # None (or Refused("why")): run it on cpu
    return BinaryExecution(backend, function)


class MinimalReplay(Replay):  # the core walks the commands into steps: bound on_execute calls here
    def record(self, steps):
        self.calls = steps

    def play(self):
        for call in self.calls:
            call()


class MinimalBackend(HostBackend):  # storage: numpy arrays (alloc, upload, download)
    name = "minimal"

    def on_record(self, commands):  # asked after every resize of a pipeline wholly on minimal
        return MinimalReplay(commands)


class MinimalRuntime(Runtime):
    name = "minimal"

    def __init__(self, config, hints=None):
        super().__init__(config, hints)
        self.op_creators["BinaryOp"] = create_binary

    def create_backend(self, config):
        return MinimalBackend(self, config)


class MinimalRuntimeCreator(RuntimeCreator):
    name = "minimal"

    def is_available(self):
        ok = np.array_equal(np.add(np.arange(3), 1), [1, 2, 3])  # really run the one kernel we have
        return (True, "") if ok else (False, "numpy add gave a wrong result")

    def create(self, config, hints=None):
        return MinimalRuntime(config, hints)

    def devices(self):
        return ["host memory (numpy)"]


@hookimpl
def mnnllm_register_runtime_creators():
    return [MinimalRuntimeCreator()]
