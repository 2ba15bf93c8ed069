"""MNN's StaticModule: one Session for the graph; weights packed once (rearrange);
resize only when an input's shape (or a shape input's value) changes."""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from ..core.schedule import ScheduleInfo
from ..core.session import Session
from ..errors import MnnllmError
from .runtime_manager import RuntimeManager

log = logging.getLogger(__name__)


@dataclass
class Config:
    """MNN's Module::Config."""

    dynamic: bool = False
    shape_mutable: bool = True
    rearrange: bool = False
    base: object | None = None  # a loaded NetModule whose packed executions this one shares where weights agree


class StaticModule:
    def __init__(self, info: ScheduleInfo, runtime_manager: RuntimeManager, config: Config,
                 session: Session | None = None, base: Session | None = None):
        self.info = info
        self.runtime_manager = runtime_manager
        self.config = config
        # Static-shape backends (opencl, vulkan, npu, plugins that declare it) never mutate shapes.
        # Either way a session re-encodes only when an input shape or a shape input's value
        # changes; what static shapes change is the caller's side: the LLM keeps one clone per
        # shape (ModulePool) so such a module is resized once and never again.
        self.shape_mutable = bool(config.shape_mutable) and not runtime_manager.static_shapes
        if session is None:
            backend, backup = runtime_manager.create_backends()
            session = Session(info, backend, backup, runtime_manager.allow_fallback)
            if config.rearrange:
                packed = session.prepare_executions(base)
                log.debug("packed the weights of %d ops (%d shared with the base)", packed, len(session.from_base))
        self.session = session

    @property
    def resize_count(self) -> int:
        return self.session.resize_count

    def forward(self, feeds: dict[str, np.ndarray], consume: bool = False) -> list[np.ndarray]:
        unknown = set(feeds) - set(self.info.input_indexes)
        if unknown:
            raise MnnllmError(f"unknown inputs {sorted(unknown)}; the module takes {list(self.info.input_indexes)}",
                              file=self.info.path, field="inputs")
        if self.session.needs_resize(feeds):
            self.session.resize(feeds)
        self.session.run(feeds, consume)
        return [np.array(self.session.output(n), copy=True) for n in self.info.output_indexes]

    def clone(self) -> "StaticModule":
        backend, backup = self.runtime_manager.create_backends()
        return StaticModule(self.info, self.runtime_manager, self.config, self.session.clone(backend, backup))
