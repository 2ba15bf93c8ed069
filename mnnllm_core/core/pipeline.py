"""MNN's Pipeline: encode the ops for the current shapes, place them, allocate, execute.

encode():   shape inference; shape-only ops (Shape, Rank) and everything computable from
            constants are folded on the host; pure data-movement ops are lowered to Raster
            regions (geometry); the rest stay ops.
place():    one Execution per command on the session's backend, or on the backup cpu
            backend when on_create returns None; copies inserted between backends.
allocate(): a long step's chains of row-wise ops grouped to run in slabs of rows (row_slabs.py);
            buffers acquired in execution order and released after their last use; then a
            backend that can (`Backend.on_record`) turns the commands into one Replay.
execute():  the Replay's run, else each command's on_execute in order.

The runtime hint "replay" (`backend_hints: {"replay": false}` in the config) turns recording
off: every run is then the per-op loop.
"""
from __future__ import annotations

import logging
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..errors import BackendError, ConfigError, ExecutionError, MnnllmError, UnsupportedError, shorten
from .allocator import BufferEvent
from .geometry.transform import lower
from .backend import Backend, Execution, Refused
from .op import Op
from .replay import Replay
from .row_slabs import in_row_slabs
from .schedule import ScheduleInfo
from .size_computer import compute_size
from .tensor import Tensor

log = logging.getLogger(__name__)

# ops with state of their own (the KV cache, a convolution state): made once at load, shared by clones, never folded
STATEFUL = {"Attention", "LinearAttention"}
MULTI_SOURCE_RASTER = {"Concat"}
# one command's buffers: the outputs it acquires (each with the input whose storage it may take),
# the inputs it releases after its on_resize
BufferStep = tuple[list[tuple[Tensor, "Tensor | None"]], list[Tensor]]


def op_failure(op: Op, stage: str, err: Exception, backend: Backend | None = None) -> MnnllmError:
    """An error raised inside an op as the project's error naming the op (ours pass through)."""
    if isinstance(err, MnnllmError):
        return err
    where = f" on {backend.name}" if backend is not None else ""
    return ExecutionError(f"op {op.type} {shorten(op.name, 60)!r} failed {stage}{where}: "
                          f"{type(err).__name__}: {shorten(str(err), 120)}", field=op.name)


@dataclass
class Command:
    op: Op
    inputs: list[Tensor]
    outputs: list[Tensor]
    node: int | None = None  # index of the graph op (None for core-made commands)
    backend: Backend | None = None
    execution: Execution | None = None
    scratch: list[Tensor] = field(default_factory=list)  # buffers of its run alone (row slabs)


@dataclass
class Placement:
    """Which backend ran which ops, and why any op fell back."""

    ops: Counter = field(default_factory=Counter)  # backend name -> commands
    by_type: dict = field(default_factory=lambda: defaultdict(Counter))  # backend -> op type -> count
    fallbacks: list[dict] = field(default_factory=list)
    copies: int = 0
    folded: int = 0

    def summary(self) -> dict:
        return {
            "ops_per_backend": dict(self.ops),
            "op_types_per_backend": {b: dict(c) for b, c in self.by_type.items()},
            "fallbacks": list(self.fallbacks),
            "copies": self.copies,
            "folded_at_resize": self.folded,
        }


class _CopyExecution(Execution):
    def on_execute(self, inputs: Sequence[Tensor], outputs: Sequence[Tensor]) -> None:
        outputs[0].backend.on_copy_buffer(inputs[0], outputs[0])


class Pipeline:
    def __init__(self, info: ScheduleInfo, backend: Backend, backup: Backend,
                 executions: dict[int, tuple[Backend, Execution]] | None = None,
                 allow_fallback: bool = True, fallback_reasons: dict[int, str] | None = None):
        self.info = info
        self.backend = backend
        self.backup = backup
        self.backends = (backend,) if backup is backend else (backend, backup)  # each once per phase
        self.allow_fallback = allow_fallback
        self.executions = executions if executions is not None else {}
        self.fallback_reasons = dict(fallback_reasons or {})  # graph op -> why it left the backend
        self.tensors = [Tensor(i, name) for i, name in enumerate(info.tensor_names)]
        for index, value in info.constants.items():
            self.tensors[index].host = value
            self.tensors[index].shape = tuple(value.shape)
            self.tensors[index].dtype = value.dtype
        self.nodes = self._needed_nodes()
        self.commands: list[Command] = []
        self.placement = Placement()
        self.profile: dict[tuple[str, str], float] | None = None
        self.replay_enabled = backend.runtime.hints.replay
        self.replay: Replay | None = None
        self.records = 0  # how many times the commands were recorded into a Replay

    def _needed_nodes(self) -> list[int]:
        """Indexes of the ops the requested outputs depend on (MNN prunes the rest)."""
        producer = {}
        for i, node in enumerate(self.info.nodes):
            for t in node.outputs:
                producer[t] = i
        needed, stack = set(), list(self.info.output_indexes.values())
        while stack:
            i = producer.get(stack.pop())
            if i is None or i in needed:
                continue
            needed.add(i)
            stack.extend(self.info.nodes[i].inputs)
        fed = set(self.info.input_indexes.values())
        for i in needed:
            node = self.info.nodes[i]
            if node.op.type == "Input" and not fed.issuperset(node.outputs):
                raise MnnllmError(f"the outputs need Input {node.op.name!r}, which is not among the module's "
                                  f"inputs {list(self.info.input_indexes)}", file=self.info.path, field="inputs")
        return sorted(needed)

    # -- encode ------------------------------------------------------------------
    def encode(self, input_shapes: dict[str, tuple[int, ...]], shape_values: dict[str, np.ndarray]) -> None:
        self.replay = None  # recorded for the old commands
        for tensor in self.tensors:
            if tensor.index not in self.info.constants:
                tensor.host, tensor.backend, tensor.storage, tensor.shape = None, None, None, ()
        for name, index in self.info.input_indexes.items():
            tensor = self.tensors[index]
            tensor.shape = tuple(int(d) for d in input_shapes[name])
            tensor.dtype = self.info.input_dtypes[name]
            if name in shape_values:
                tensor.host = np.asarray(shape_values[name], dtype=tensor.dtype).reshape(tensor.shape)
        self.placement = Placement()
        commands: list[Command] = []
        for i in self.nodes:
            op = self.info.nodes[i].op
            if op.type in ("Input", "Const"):
                continue
            try:
                self._encode_node(i, commands)
            except Exception as err:
                raise op_failure(op, "computing its shapes", err) from err
        self.commands = commands

    def _encode_node(self, i: int, commands: list[Command]) -> None:
        """Shapes of one op's outputs; a shape op or an op of constants is folded, the rest queued."""
        node = self.info.nodes[i]
        op = node.op
        inputs = [self.tensors[t] for t in node.inputs]
        outputs = [self.tensors[t] for t in node.outputs]
        for tensor, (shape, dtype) in zip(outputs, compute_size(op, inputs)):
            tensor.shape, tensor.dtype = tuple(int(d) for d in shape), np.dtype(dtype)
        if op.type in ("Shape", "Rank"):
            value = inputs[0].shape if op.type == "Shape" else len(inputs[0].shape)
            outputs[0].host = np.asarray(value, dtype=np.int32).reshape(outputs[0].shape)
            self.placement.folded += 1
            return
        raster = lower(op, inputs, outputs)
        if raster is not None:
            sources = inputs if op.type in MULTI_SOURCE_RASTER else inputs[:1]
            command = Command(Op("Raster", op.name, index=op.index, param=raster), sources, outputs)
        else:
            command = Command(op, inputs, outputs, node=i)
        packed = command.node in self.executions  # its raw weights are gone: run it, don't fold
        if op.type not in STATEFUL and not packed and all(t.host is not None for t in command.inputs):
            self._fold(command)
        else:
            commands.append(command)

    def _fold(self, command: Command) -> None:
        """Compute a command whose inputs are all known now, on the backup backend."""
        backup = self.backup
        inputs = [Tensor(t.index, t.name, t.shape, t.dtype, backend=backup) for t in command.inputs]
        outputs = [Tensor(t.index, t.name, t.shape, t.dtype, backend=backup) for t in command.outputs]
        for tensor, source in zip(inputs, command.inputs):
            backup.on_acquire_buffer(tensor)
            backup.upload(tensor, source.host)
        for tensor in outputs:
            backup.on_acquire_buffer(tensor)
        execution = backup.on_create(inputs, outputs, command.op)
        if not isinstance(execution, Execution):
            raise UnsupportedError(f"cannot fold {command.op.type} {command.op.name!r}: the backup backend "
                                   f"{backup.name} has no kernel for it", field="type")
        execution.on_resize(inputs, outputs)
        execution.on_execute(inputs, outputs)
        for tensor, target in zip(outputs, command.outputs):
            target.host = np.array(backup.download(tensor), copy=True).reshape(target.shape)
        self.placement.folded += 1

    # -- place -------------------------------------------------------------------
    def place(self) -> None:
        placed: list[Command] = []
        mirrors: dict[tuple[int, str], Tensor] = {}
        for name, index in self.info.input_indexes.items():
            self.tensors[index].backend = self.backend
        for command in self.commands:
            backend, execution = self.create_execution(command)
            inputs = []
            for tensor in command.inputs:
                if tensor.host is None and tensor.backend is backend:
                    inputs.append(tensor)
                    continue
                key = (tensor.index, backend.name)
                mirror = mirrors.get(key)
                if mirror is None:
                    mirror = Tensor(tensor.index, tensor.name, tensor.shape, tensor.dtype, backend=backend)
                    mirrors[key] = mirror
                    if tensor.host is not None:
                        mirror.host = tensor.host
                    else:
                        placed.append(Command(Op("Copy", f"copy {tensor.name}"), [tensor], [mirror],
                                              backend=backend, execution=_CopyExecution(backend)))
                        self.placement.copies += 1
                inputs.append(mirror)
            for tensor in command.outputs:
                tensor.backend = backend
            command.inputs, command.backend, command.execution = inputs, backend, execution
            placed.append(command)
            self.placement.ops[backend.name] += 1
            self.placement.by_type[backend.name][command.op.type] += 1
        self.commands = placed

    def create_execution(self, command: Command) -> tuple[Backend, Execution]:
        op = command.op
        if command.node is not None and command.node in self.executions:
            backend, execution = self.executions[command.node]
            if backend is not self.backend:  # created at load (rearrange): still a fallback
                self._record_fallback(op, self.fallback_reasons.get(command.node) or self._fallback_reason(op, None))
            return backend, execution
        execution = self.backend.on_create(command.inputs, command.outputs, op)
        backend = self.backend
        if not isinstance(execution, Execution) and self.backup is not self.backend:
            reason = self._fallback_reason(op, execution)
            if not self.allow_fallback:
                raise BackendError(f"op {op.type} {op.name!r} cannot run on {self.backend.name} "
                                   f"({reason}) and allow_fallback is false", field="allow_fallback")
            execution, backend = self.backup.on_create(command.inputs, command.outputs, op), self.backup
            self._record_fallback(op, reason)
            if command.node is not None:
                self.fallback_reasons[command.node] = reason
        if not isinstance(execution, Execution):
            why = f": {execution.reason}" if isinstance(execution, Refused) else ""
            raise UnsupportedError(f"op type {op.type} ({op.name!r}) has no kernel on {backend.name}{why}",
                                   field="type")
        if command.node is not None:
            self.executions[command.node] = (backend, execution)
        return backend, execution

    def _fallback_reason(self, op: Op, refusal: Refused | None) -> str:
        if op.type not in self.backend.creators:
            return f"{self.backend.name} has no {op.type} kernel"
        detail = f": {refusal.reason}" if isinstance(refusal, Refused) else ""
        return f"{self.backend.name} refused this {op.type}{detail}"

    def _record_fallback(self, op: Op, reason: str) -> None:
        self.placement.fallbacks.append({"op": op.name, "type": op.type, "to": self.backup.name, "reason": reason})

    # -- allocate ----------------------------------------------------------------
    def allocate(self) -> None:
        for backend in self.backends:
            backend.on_clear_buffer()
            backend.on_resize_begin()
        whole = {id(self.tensors[i]) for i in (*self.info.input_indexes.values(), *self.info.output_indexes.values())}
        self.commands = in_row_slabs(self.commands, whole, Command)
        inputs, uploaded, steps, last_reads = self._buffer_order()
        events = [BufferEvent(True, t) for t in inputs + uploaded]
        for position, (acquired, released) in enumerate(steps):
            events += [BufferEvent(True, t, shares) for t, shares in acquired]
            events += [BufferEvent(False, t) for t in released]
            events += [BufferEvent(False, t) for t in last_reads.get(position, ())]
        for backend in self.backends:
            backend.on_plan_buffers([e for e in events if e.tensor.backend is backend])
        for tensor in inputs + uploaded:
            tensor.backend.on_acquire_buffer(tensor)
        for tensor in uploaded:
            tensor.backend.upload(tensor, tensor.host)
        command = None
        try:
            for command, (acquired, released) in zip(self.commands, steps):
                for tensor, _ in acquired:
                    tensor.backend.on_acquire_buffer(tensor)
                command.execution.on_resize(command.inputs, command.outputs)
                for tensor in released:
                    tensor.backend.on_release_buffer(tensor)
        except Exception as err:
            if command is None:
                raise
            raise op_failure(command.op, "at resize", err, command.backend) from err
        for backend in self.backends:
            backend.on_resize_end()
        self.replay = self._record()

    def _buffer_order(self) -> tuple[list[Tensor], list[Tensor], list["BufferStep"], dict[int, list[Tensor]]]:
        """The resize's buffer events in order, known before any is acquired (so a backend may
        place buffers by lifetime): the graph's inputs; the host-known values, uploaded once, here,
        so each gets a buffer no computed tensor ever had (a pooled buffer of an earlier tensor
        would be overwritten when that one runs); then per command the outputs it acquires (each
        with the input whose storage it may take: `Execution.output_may_share`, when the command
        is that input's last reader) and its scratch, and the inputs it releases after its
        on_resize, and its scratch; and command position -> the graph inputs it reads last (an
        input no op reads: none)."""
        inputs = [self.tensors[i] for i in self.info.input_indexes.values()]
        keep = {id(t) for t in inputs} | {id(self.tensors[i]) for i in self.info.output_indexes.values()}
        uploaded, last_use = {}, {}
        for position, command in enumerate(self.commands):
            for tensor in command.inputs:
                last_use[id(tensor)] = position
                if tensor.host is not None:
                    uploaded[id(tensor)] = tensor
        keep |= set(uploaded)
        steps = []
        for position, command in enumerate(self.commands):
            released = [t for t in {id(t): t for t in command.inputs}.values()  # Concat(x, x) reads x twice
                        if last_use[id(t)] == position and id(t) not in keep]
            shares = self._shared_input(command, released)
            acquired = [(t, shares if i == 0 else None) for i, t in enumerate(command.outputs)]
            steps.append((acquired + [(t, None) for t in command.scratch], released + command.scratch))
        last_reads = defaultdict(list)
        for tensor in inputs:
            if id(tensor) in last_use:
                last_reads[last_use[id(tensor)]].append(tensor)
        return inputs, list(uploaded.values()), steps, last_reads

    @staticmethod
    def _shared_input(command: Command, released: list[Tensor]) -> Tensor | None:
        """The input whose storage the command's first output may take, if any."""
        index = command.execution.output_may_share
        if index is None or index >= len(command.inputs) or not command.outputs:
            return None
        source, output = command.inputs[index], command.outputs[0]
        if (all(source is not t for t in released) or source.backend is not output.backend
                or source.nbytes != output.nbytes):
            return None
        return source

    def _record(self) -> Replay | None:
        """The backend's Replay of the commands, when replay is on and every command runs there."""
        if not self.replay_enabled or any(c.backend is not self.backend for c in self.commands):
            return None
        replay = self.backend.on_record(self.commands)
        if replay is not None:
            self.records += 1
        return replay

    @property
    def replayed(self) -> bool:
        """Whether runs replay a recorded step (else: the per-op loop)."""
        return self.replay is not None and self.replay_enabled

    # -- execute -----------------------------------------------------------------
    def execute(self) -> None:
        for backend in self.backends:
            backend.on_execute_begin()
        if self.profile is None and self.replayed:
            try:
                self.replay.run()
            except MnnllmError:
                raise
            except Exception as err:  # which op failed inside a recorded step is the driver's secret
                raise ExecutionError(f"the replayed step failed on {self.backend.name}: {type(err).__name__}: "
                                     f"{shorten(str(err), 120)}", field="replay") from err
        else:
            command = None
            try:  # the loops stay bare (an op's error is rare; a try per op is not free)
                if self.profile is None:
                    for command in self.commands:
                        command.execution.on_execute(command.inputs, command.outputs)
                else:
                    for command in self.commands:
                        start = time.perf_counter()
                        command.execution.on_execute(command.inputs, command.outputs)
                        command.backend.on_execute_end()
                        key = (command.backend.name, command.op.type)
                        self.profile[key] = self.profile.get(key, 0.0) + time.perf_counter() - start
            except Exception as err:
                if command is None:
                    raise
                raise op_failure(command.op, "while running", err, command.backend) from err
        for backend in self.backends:
            backend.on_execute_end()
