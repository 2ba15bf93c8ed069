"""MNN's Module API: Module.load -> loadInternal -> PipelineModule -> StaticModule."""
from __future__ import annotations

import logging
import os
from typing import Sequence

import numpy as np

from ..core.session import Session
from ..core.weights.file import ExternalWeightFile
from ..errors import UnsupportedError
from ..schema.reader import read_net_file
from .pipeline_module import NetInfo, build_schedule
from .runtime_manager import RuntimeManager
from .static_module import Config, StaticModule

log = logging.getLogger(__name__)


class PipelineModule:
    """The sub-modules of one graph in execution order (LLM graphs have a single one)."""

    def __init__(self, modules: list[StaticModule]):
        self.modules = modules

    def forward(self, feeds: dict[str, np.ndarray], consume: bool = False) -> list[np.ndarray]:
        return self.modules[0].forward(feeds, consume)

    def clone(self) -> "PipelineModule":
        return PipelineModule([m.clone() for m in self.modules])


class NetModule:
    """What Module.load returns: the module plus the header of the file it came from."""

    def __init__(self, module: PipelineModule, info: NetInfo, weight_file: ExternalWeightFile | None):
        self.module = module
        self.info = info
        self.weight_file = weight_file

    @property
    def input_names(self) -> list[str]:
        return list(self.info.inputs)

    @property
    def output_names(self) -> list[str]:
        return list(self.info.outputs)

    @property
    def static_module(self) -> StaticModule:
        return self.module.modules[0]

    def forward(self, inputs: Sequence[np.ndarray] | dict[str, np.ndarray], consume: bool = False) -> list[np.ndarray]:
        """The outputs for these inputs; with `consume` the feeds dict is emptied once uploaded, so
        a long step does not hold the caller's copy of its inputs (18 MiB at 8,192 tokens) through
        the run."""
        feeds = inputs if isinstance(inputs, dict) else dict(zip(self.info.inputs, inputs))
        return self.module.forward(feeds, consume)

    def __call__(self, inputs):
        return self.forward(inputs)

    def clone(self) -> "NetModule":
        """A twin sharing packed weights (and, on the cpu backend, the KV cache)."""
        return NetModule(self.module.clone(), self.info, self.weight_file)

    def placement(self) -> dict:
        return self.static_module.session.pipeline.placement.summary()

    def get_info(self) -> dict:
        return {"uuid": self.info.uuid, "version": self.info.version, "bizCode": self.info.biz_code,
                "inputs": self.input_names, "outputs": self.output_names, "metadata": self.info.metadata}


class Module:
    @staticmethod
    def load(inputs: Sequence[str], outputs: Sequence[str], path: str | os.PathLike,
             runtime_manager: RuntimeManager | None = None, config: Config | None = None) -> NetModule:
        """Load `path` (an llm.mnn); empty `inputs`/`outputs` are inferred from the graph.

        `config.base` (a loaded NetModule, MNN's Module::Config.base): every weighted op whose
        name, type and weights equal one of the base's shares the base's packed Execution; only
        ops that differ (a LoRA's changed or added linears) pack weights of their own, and each
        Attention keeps a KV cache of its own. The base must run on the same runtimes."""
        path = str(path)
        config = config or Config()
        net = read_net_file(path)
        runtime_manager = runtime_manager or RuntimeManager.create()
        weight_path = runtime_manager.external_file or path + ".weight"
        weight_file = ExternalWeightFile(weight_path) if os.path.exists(weight_path) else None
        base = _base_session(config.base, runtime_manager, path)
        info, net_info = build_schedule(net, path, weight_file, inputs, outputs,
                                        attn_scale=runtime_manager.runtime.hints.attn_scale)
        module = StaticModule(info, runtime_manager, config, base=base)
        return NetModule(PipelineModule([module]), net_info, weight_file)


def _base_session(base: NetModule | None, runtime_manager: RuntimeManager, path: str) -> Session | None:
    """The session whose packed executions a load over `base` may share (None without a base)."""
    if base is None:
        return None
    if not isinstance(base, NetModule):
        raise UnsupportedError(f"Config.base must be a loaded module, got {type(base).__name__}", file=path,
                               field="base")
    theirs = base.static_module.runtime_manager
    if (theirs.runtime, theirs.backup_runtime) != (runtime_manager.runtime, runtime_manager.backup_runtime):
        raise UnsupportedError("Config.base shares packed weights only on the base's runtimes: load with the "
                               "base's RuntimeManager or one made by its derive()", file=path, field="base")
    session = base.static_module.session
    if not session.readers:
        log.warning("%s: the base module was loaded without rearrange, so it has no packed weights to share", path)
    return session
