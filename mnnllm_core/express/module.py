"""MNN's Module API: Module.load -> loadInternal -> PipelineModule -> StaticModule."""
from __future__ import annotations

import logging
import os
from typing import Sequence

import numpy as np

from ..errors import UnsupportedError
from ..schema.reader import read_net_file
from .pipeline_module import NetInfo, build_schedule
from .runtime_manager import RuntimeManager
from .static_module import Config, StaticModule
from .weight_file import ExternalWeightFile

log = logging.getLogger(__name__)


class PipelineModule:
    """The sub-modules of one graph in execution order (LLM graphs have a single one)."""

    def __init__(self, modules: list[StaticModule]):
        self.modules = modules

    def forward(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.modules[0].forward(feeds)

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

    def forward(self, inputs: Sequence[np.ndarray] | dict[str, np.ndarray]) -> list[np.ndarray]:
        feeds = inputs if isinstance(inputs, dict) else dict(zip(self.info.inputs, inputs))
        return self.module.forward(feeds)

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
        """Load `path` (an llm.mnn); empty `inputs`/`outputs` are inferred from the graph."""
        path = str(path)
        config = config or Config()
        net = read_net_file(path)
        runtime_manager = runtime_manager or RuntimeManager.create()
        weight_path = runtime_manager.external_file or path + ".weight"
        weight_file = ExternalWeightFile(weight_path) if os.path.exists(weight_path) else None
        if config.base is not None:
            base: NetModule = config.base
            uuid = net.mnnUuid.decode() if isinstance(net.mnnUuid, bytes) else (net.mnnUuid or "")
            if not uuid or uuid != base.info.uuid:
                raise UnsupportedError("Config.base shares packed weights only between loads of the same graph "
                                       f"(uuid {uuid or '-'} vs {base.info.uuid or '-'})", file=path, field="base")
            log.info("loaded %s sharing the weights of an already loaded module", path)
            return base.clone()
        info, net_info = build_schedule(net, path, weight_file, inputs, outputs)
        module = StaticModule(info, runtime_manager, config)
        return NetModule(PipelineModule([module]), net_info, weight_file)
