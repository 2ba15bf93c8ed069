"""MNN's Session: owns the Pipeline; resize() = encode + place + allocate, run() = execute."""
from __future__ import annotations

import logging
from typing import Sequence

import numpy as np

from ..errors import MnnllmError
from ..progress import Progress
from .backend import Backend
from .pipeline import STATEFUL, Command, Pipeline
from .schedule import ScheduleInfo

log = logging.getLogger(__name__)


class Session:
    def __init__(self, info: ScheduleInfo, backend: Backend, backup: Backend, allow_fallback: bool = True,
                 executions: dict | None = None, fallback_reasons: dict[int, str] | None = None):
        self.info = info
        self.pipeline = Pipeline(info, backend, backup, executions, allow_fallback, fallback_reasons)
        self.resize_count = 0
        self.packed: set[int] = set()  # ops whose executions were made at load (rearrange)
        self.readers: dict[int, object] = {}  # packed op -> the reader its weights came from (for a later base)
        self.from_base: set[int] = set()  # packed ops whose executions are a base module's, shared
        self._key: tuple | None = None

    @property
    def backend(self) -> Backend:
        return self.pipeline.backend

    def prepare_executions(self, base: "Session | None" = None) -> int:
        """Create each weighted or stateful op's Execution now (the backend packs its weights;
        an Attention makes the KV cache its clones will share), then drop the raw weights
        from the op, as StaticModule does with `rearrange`.

        With a `base` session (MNN's Module::Config.base, the LoRA case), a weighted op whose
        name, type and weights equal one of the base's is given a clone of the base's Execution
        (its packed weights shared, not packed again); stateful ops (Attention) get their own."""
        created = 0
        shareable = base.shareable() if base is not None else {}
        pipeline = self.pipeline
        todo = [i for i in pipeline.nodes if (self.info.nodes[i].op.weights is not None
                                               or self.info.nodes[i].op.type in STATEFUL)
                and i not in pipeline.executions]
        progress = Progress(len(todo), f"packing weights ({pipeline.backend.name})", unit=" ops", delay=1.0)
        for i in todo:
            node = self.info.nodes[i]
            progress.update()
            inputs = [pipeline.tensors[t] for t in node.inputs]
            outputs = [pipeline.tensors[t] for t in node.outputs]
            if not self._share_from(base, shareable.get((node.op.type, node.op.name)), i):
                pipeline.create_execution(Command(node.op, inputs, outputs, node=i))
            release = getattr(node.op.weights, "release", None)  # weight-file readers drop their pages
            if release is not None:
                release()
                self.readers[i] = node.op.weights
            node.op.weights = None
            self.packed.add(i)
            created += 1
        progress.close()
        return created

    def shareable(self) -> dict[tuple[str, str], int]:
        """(op type, op name) -> graph index of each packed op whose weight reader is known."""
        return {(self.info.nodes[i].op.type, self.info.nodes[i].op.name): i for i in self.readers
                if i in self.pipeline.executions}

    def _share_from(self, base: "Session | None", index: int | None, i: int) -> bool:
        """Give op `i` a clone of the base's Execution of op `index` when their weights are the same."""
        same_as = getattr(self.info.nodes[i].op.weights, "same_as", None)
        theirs = base.readers.get(index) if base is not None and index is not None else None
        if same_as is None or theirs is None or not same_as(theirs):
            return False
        owner, execution = base.pipeline.executions[index]
        on_main = owner is base.pipeline.backend
        target = self.pipeline.backend if on_main else self.pipeline.backup
        twin = execution.on_clone(target, self.info.nodes[i].op)
        if twin is None:
            return False
        self.pipeline.executions[i] = (target, twin)
        if not on_main and index in base.pipeline.fallback_reasons:
            self.pipeline.fallback_reasons[i] = base.pipeline.fallback_reasons[index]
        self.from_base.add(i)
        return True

    def resize_key(self, feeds: dict[str, np.ndarray]) -> tuple:
        """What decides the encoding: every input's shape, and the content of shape inputs."""
        shapes = tuple((n, tuple(np.shape(feeds[n]))) for n in sorted(feeds))
        values = tuple((n, np.asarray(feeds[n]).tobytes()) for n in self.info.shape_inputs if n in feeds)
        return shapes + values

    def needs_resize(self, feeds: dict[str, np.ndarray]) -> bool:
        return self._key != self.resize_key(feeds)

    def resize(self, feeds: dict[str, np.ndarray]) -> None:
        """Encode for these inputs' shapes (and shape-input values), place, allocate."""
        missing = set(self.info.input_indexes) - set(feeds)
        if missing:
            raise MnnllmError(f"missing inputs {sorted(missing)}", file=self.info.path, field="inputs")
        shapes = {n: tuple(np.shape(v)) for n, v in feeds.items()}
        values = {n: feeds[n] for n in self.info.shape_inputs if n in feeds}
        self._key = None  # a resize that fails part-way leaves no valid encoding behind
        self.pipeline.encode(shapes, values)
        self.pipeline.place()
        self.pipeline.allocate()
        self._key = self.resize_key(feeds)
        self.resize_count += 1
        log.debug("resized %s: %d commands", self.info.path, len(self.pipeline.commands))

    def run(self, feeds: dict[str, np.ndarray], consume: bool = False) -> None:
        """Upload every input, then execute: an input's storage may serve other tensors once its
        last reader ran (a backend's pool plans so), so a run never reads the last run's input.
        `consume`: empty `feeds` once uploaded (the caller's arrays are not held through the run)."""
        if len(feeds) < len(self.info.input_indexes):
            missing = set(self.info.input_indexes) - set(feeds)
            raise MnnllmError(f"missing inputs {sorted(missing)}", file=self.info.path, field="inputs")
        tensors = self.pipeline.tensors
        for name in feeds:  # no loop variable keeps a consumed input alive
            tensor = tensors[self.info.input_indexes[name]]
            tensor.backend.upload(tensor, np.ascontiguousarray(feeds[name], dtype=tensor.dtype))
        if consume:
            feeds.clear()
        self.pipeline.execute()

    def output(self, name: str) -> np.ndarray:
        tensor = self.pipeline.tensors[self.info.output_indexes[name]]
        if tensor.host is not None:
            return tensor.host
        return tensor.backend.download(tensor)

    def outputs(self, names: Sequence[str]) -> list[np.ndarray]:
        return [self.output(n) for n in names]

    def clone(self, backend: Backend, backup: Backend) -> "Session":
        """A session on the same graph whose executions share this one's packed weights."""
        executions = {}
        for index, (owner, execution) in self.pipeline.executions.items():
            target = backend if owner is self.pipeline.backend else backup
            op = self.info.nodes[index].op
            twin = execution.on_clone(target, op)
            if twin is not None:
                executions[index] = (target, twin)
            elif op.weights is None and (op.type in STATEFUL or index in self.packed):
                # its weights were packed and dropped, or it owns the KV cache: it must be shared
                raise MnnllmError(f"{owner.name} execution of {op.type} {op.name!r} cannot be cloned",
                                  file=self.info.path)
        twin = Session(self.info, backend, backup, self.pipeline.allow_fallback, executions,
                       self.pipeline.fallback_reasons)
        twin.packed = set(self.packed)
        twin.readers = self.readers
        twin.from_base = set(self.from_base)
        return twin
