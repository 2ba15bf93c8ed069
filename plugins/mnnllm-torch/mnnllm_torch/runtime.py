"""TorchRuntimeCreator (probe), TorchRuntime (device, allocator) and TorchBackend (a tensor's
storage is a torch tensor of its shape and dtype; upload/download through host arrays; a
pipeline wholly on torch is replayed, see replay.py).

Runtime hint "torch_replay": "graph" (the default on CUDA: the step captured as a CUDA graph),
"eager" (the recorded step run call by call; any device), "off" (the default elsewhere: the
per-op loop). The core's "replay": false turns all of it off.

Nothing here imports torch at module level: torch comes with `device` when the backend is
probed or created, so a cpu user of mnnllm never pays for it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mnnllm_core.backend_api import (Backend, BackendConfig, BackendError, ConfigError, Runtime, RuntimeCreator,
                                     RuntimeHints, ScheduleConfig, Tensor)

REPLAY_HINT = "torch_replay"
REPLAY_MODES = ("graph", "eager", "off")


@dataclass(frozen=True)
class TorchHints(RuntimeHints):
    """"torch_device" (device.py) and "torch_replay" (above); None: the default."""

    torch_device: str | None = None
    torch_replay: str | None = None


class TorchBackend(Backend):
    name = "torch"

    def __init__(self, runtime: "TorchRuntime", config: BackendConfig):
        super().__init__(runtime, config)
        self.allocator = runtime.allocator
        self.device = runtime.allocator.device

    def alloc(self, tensor: Tensor):
        return self.allocator.alloc(tensor.shape, tensor.dtype)

    def upload(self, tensor: Tensor, array: np.ndarray) -> None:
        self.allocator.copyin(tensor.storage, np.ascontiguousarray(array, dtype=tensor.dtype).reshape(tensor.shape))

    def download(self, tensor: Tensor) -> np.ndarray:
        return self.allocator.copyout(tensor.storage)

    def on_copy_buffer(self, src: Tensor, dst: Tensor) -> None:
        if self.allocator.is_buffer(src.storage) and self.allocator.is_buffer(dst.storage):
            self.allocator.copy(dst.storage, src.storage)
            return
        super().on_copy_buffer(src, dst)

    def on_record(self, commands):
        mode = self.runtime.replay_mode
        if mode == "off":
            return None
        from .replay import TorchReplay
        return TorchReplay(self, commands, graph=mode == "graph")


class TorchRuntime(Runtime):
    name = "torch"
    hints_type = TorchHints

    def __init__(self, config: ScheduleConfig, hints: RuntimeHints | dict[str, Any] | None, device: str):
        super().__init__(config, hints)
        import torch

        from . import device as torch_device
        from .ops import CREATORS
        self.allocator = torch_device.Allocator(torch.device(device))
        self.allocator.set_threads(config.thread_num)
        self.replay_mode = self.hints.torch_replay or ("graph" if self.allocator.device.type == "cuda" else "off")
        if self.replay_mode not in REPLAY_MODES:
            raise ConfigError(f"{REPLAY_HINT} must be one of {', '.join(REPLAY_MODES)}, got {self.replay_mode!r}",
                              field=f"backend_hints.{REPLAY_HINT}")
        if self.replay_mode == "graph" and self.allocator.device.type != "cuda":
            raise ConfigError(f"{REPLAY_HINT} \"graph\" needs a CUDA device, this runtime is on "
                              f"{self.allocator.device}", field=f"backend_hints.{REPLAY_HINT}")
        self.op_creators.update(CREATORS)

    def create_backend(self, config: BackendConfig) -> TorchBackend:
        return TorchBackend(self, config)

    def gc(self, level: int = 0) -> None:
        self.allocator.gc()

    def device_name(self) -> str:
        from .device import describe
        return describe(self.allocator.device)


class TorchRuntimeCreator(RuntimeCreator):
    """fp32 whatever precision says; weights dequantized at load whatever memory says;
    thread_num sets torch's threads on the cpu device."""

    name = "torch"
    static_shapes = False  # torch takes any shape; the pipeline may resize freely
    settings = frozenset({"thread_num"})
    hints_type = TorchHints

    def is_available(self) -> tuple[bool, str]:
        try:
            from . import device
            chosen = device.select_device()
        except Exception as err:  # ImportError, or OSError from broken CUDA libraries
            return False, f"torch is not importable: {type(err).__name__}: {err}"
        return device.probe(chosen)

    def create(self, config: ScheduleConfig, hints: RuntimeHints | dict[str, Any] | None = None) -> Runtime:
        from . import device
        hints = TorchHints.of(hints)
        chosen = device.select_device(hints.torch_device)
        ok, reason = device.probe(chosen)
        if not ok:
            raise BackendError(f"backend 'torch' cannot use its device: {reason}", field="backend_type")
        return TorchRuntime(config, hints, chosen)

    def list_devices(self) -> list[str]:
        from . import device
        return device.list_devices()
