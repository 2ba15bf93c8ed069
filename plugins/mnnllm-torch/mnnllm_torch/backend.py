"""TorchRuntime and TorchBackend: a tensor's storage is a torch tensor of its shape and dtype
on the runtime's device; upload/download go through host numpy arrays."""
from __future__ import annotations

import os
from collections import defaultdict
from typing import Any

import numpy as np
import torch

from mnnllm_core.core.backend import Backend, BackendConfig, Runtime, ScheduleConfig
from mnnllm_core.core.tensor import Tensor

from .ops import CREATORS


def torch_dtype(dtype: np.dtype) -> torch.dtype:
    """The torch dtype of a numpy dtype (float32 -> torch.float32, int32 -> torch.int32, ...)."""
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype


class TorchBackend(Backend):
    name = "torch"

    def __init__(self, runtime: "TorchRuntime", config: BackendConfig):
        super().__init__(runtime, config)
        self.device = runtime.device
        self._free: dict[tuple, list[torch.Tensor]] = defaultdict(list)

    def on_acquire_buffer(self, tensor: Tensor) -> None:
        pool = self._free.get((tensor.shape, tensor.dtype.str))
        tensor.storage = pool.pop() if pool else torch.empty(
            tensor.shape, dtype=torch_dtype(tensor.dtype), device=self.device)

    def on_release_buffer(self, tensor: Tensor) -> None:
        if tensor.storage is not None:
            self._free[(tensor.shape, tensor.dtype.str)].append(tensor.storage)

    def on_clear_buffer(self) -> None:
        self._free.clear()

    def upload(self, tensor: Tensor, array: np.ndarray) -> None:
        host = np.ascontiguousarray(array, dtype=tensor.dtype).reshape(tensor.shape)
        if not host.flags.writeable:  # torch.from_numpy wants writable memory (an mmap is not)
            host = host.copy()
        tensor.storage.copy_(torch.from_numpy(host))

    def download(self, tensor: Tensor) -> np.ndarray:
        return tensor.storage.cpu().numpy()

    def on_copy_buffer(self, src: Tensor, dst: Tensor) -> None:
        if isinstance(src.storage, torch.Tensor) and isinstance(dst.storage, torch.Tensor):
            dst.storage.copy_(src.storage.reshape(dst.storage.shape))
            return
        super().on_copy_buffer(src, dst)


class TorchRuntime(Runtime):
    name = "torch"

    def __init__(self, config: ScheduleConfig, hints: dict[str, Any] | None, device: str):
        super().__init__(config, hints)
        self.device = torch.device(device)
        self.op_creators.update(CREATORS)
        if self.device.type == "cpu":
            # process-wide, like the cpu backend's BLAS limit; more threads than cores only wait
            torch.set_num_threads(max(1, min(int(config.thread_num), os.cpu_count() or 1)))

    def create_backend(self, config: BackendConfig) -> TorchBackend:
        return TorchBackend(self, config)

    def gc(self, level: int = 0) -> None:
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def device_name(self) -> str:
        if self.device.type == "cuda":
            return f"{self.device} {torch.cuda.get_device_name(self.device)} (torch {torch.__version__})"
        return f"{self.device} (torch {torch.__version__}, {torch.get_num_threads()} threads)"
