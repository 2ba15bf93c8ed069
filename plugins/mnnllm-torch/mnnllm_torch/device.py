"""The torch-touching half of the backend: which device, whether it works, and an Allocator
(alloc / copyin / copyout / copy) of torch tensors on it. Only this module and ops/ import
torch; the runtime and plugin modules do not, so registering the plugin costs nothing.

The device is, first found: the runtime hint "torch_device" (TorchHints; in a model's config:
`"backend_hints": {"torch_device": "cuda:1"}`), the environment variable MNNLLM_TORCH_DEVICE,
then "cuda" when torch sees a GPU, else "cpu".
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

DEVICE_ENV = "MNNLLM_TORCH_DEVICE"


def select_device(hint: str | None = None) -> str:
    """The torch device a runtime with this "torch_device" hint runs on."""
    chosen = hint or os.environ.get(DEVICE_ENV)
    if chosen:
        return str(chosen)
    return "cuda" if torch.cuda.is_available() else "cpu"


def probe(device: str) -> tuple[bool, str]:
    """Run a 2x3 matmul on `device` and check the result: (True, "") or (False, why)."""
    try:
        a = torch.arange(6, dtype=torch.float32, device=device).reshape(2, 3)
        got = (a @ a.T).cpu().tolist()
    except Exception as err:  # a bad device name, a missing driver, a kernel that fails
        return False, f"a matmul on torch device {device!r} failed: {type(err).__name__}: {err}"
    if got != [[5.0, 14.0], [14.0, 50.0]]:
        return False, f"a matmul on torch device {device!r} gave a wrong result: {got}"
    return True, ""


def list_devices() -> list[str]:
    default = select_device()
    found = [f"cpu (torch {torch.__version__}, {torch.get_num_threads()} threads)"]
    found += [f"cuda:{i} {torch.cuda.get_device_name(i)}" for i in range(torch.cuda.device_count())]
    return [f"{name} [default]" if name.split(" ")[0] in (default, f"{default}:0") else name for name in found]


def describe(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{device} {torch.cuda.get_device_name(device)} (torch {torch.__version__})"
    return f"{device} (torch {torch.__version__}, {torch.get_num_threads()} threads)"


def torch_dtype(dtype: np.dtype) -> torch.dtype:
    """The torch dtype of a numpy dtype (float32 -> torch.float32, int32 -> torch.int32, ...)."""
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype


class Allocator:
    """Tensors on one device, and the host copies."""

    def __init__(self, device: torch.device):
        self.device = device

    def alloc(self, shape: tuple[int, ...], dtype: np.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=torch_dtype(dtype), device=self.device)

    def constant(self, array: np.ndarray | None) -> torch.Tensor | None:
        """A fp32 copy of a host array on the device (weights, norm tables); None stays None."""
        if array is None:
            return None
        return torch.from_numpy(np.array(array, dtype=np.float32, order="C", copy=True)).to(self.device)

    def copyin(self, tensor: torch.Tensor, array: np.ndarray) -> None:
        if not array.flags.writeable:  # torch.from_numpy wants writable memory (an mmap is not)
            array = array.copy()
        tensor.copy_(torch.from_numpy(array))

    def copyout(self, tensor: torch.Tensor) -> np.ndarray:
        return tensor.cpu().numpy()

    @staticmethod
    def is_buffer(storage: Any) -> bool:
        return isinstance(storage, torch.Tensor)

    @staticmethod
    def copy(dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src.reshape(dst.shape))

    def set_threads(self, threads: int) -> None:
        """Process-wide, like the cpu backend's BLAS limit; more threads than cores only wait."""
        if self.device.type == "cpu":
            torch.set_num_threads(max(1, min(int(threads), os.cpu_count() or 1)))

    def gc(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
