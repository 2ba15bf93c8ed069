"""TorchRuntimeCreator: which torch device to use, whether it really works, and its Runtime.

The device is, first found: the runtime hint "torch_device" (in a model's config:
`"backend_hints": {"torch_device": "cuda:1"}`), the environment variable
MNNLLM_TORCH_DEVICE, then "cuda" when torch sees a GPU, else "cpu".

torch is imported only here, inside the methods: registering the plugin costs nothing.
"""
from __future__ import annotations

import os
from typing import Any

from mnnllm_core.core.backend import Runtime, RuntimeCreator, ScheduleConfig
from mnnllm_core.errors import BackendError

DEVICE_HINT = "torch_device"
DEVICE_ENV = "MNNLLM_TORCH_DEVICE"


def choose_device(hints: dict[str, Any] | None = None) -> str:
    """The torch device a runtime created with these hints runs on."""
    chosen = (hints or {}).get(DEVICE_HINT) or os.environ.get(DEVICE_ENV)
    if chosen:
        return str(chosen)
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def probe(device: str) -> tuple[bool, str]:
    """Run a 2x3 matmul on `device` and check the result: (True, "") or (False, why)."""
    try:
        import torch
    except Exception as err:  # ImportError, or OSError from broken CUDA libraries
        return False, f"torch is not importable: {type(err).__name__}: {err}"
    try:
        a = torch.arange(6, dtype=torch.float32, device=device).reshape(2, 3)
        got = (a @ a.T).cpu().tolist()
    except Exception as err:  # a bad device name, a missing driver, a kernel that fails
        return False, f"a matmul on torch device {device!r} failed: {type(err).__name__}: {err}"
    if got != [[5.0, 14.0], [14.0, 50.0]]:
        return False, f"a matmul on torch device {device!r} gave a wrong result: {got}"
    return True, ""


class TorchRuntimeCreator(RuntimeCreator):
    name = "torch"
    static_shapes = False  # torch takes any shape; the pipeline may resize freely

    def is_available(self) -> tuple[bool, str]:
        try:
            device = choose_device()
        except Exception as err:  # ImportError, or OSError from broken CUDA libraries
            return False, f"torch is not importable: {type(err).__name__}: {err}"
        return probe(device)

    def create(self, config: ScheduleConfig, hints: dict[str, Any] | None = None) -> Runtime:
        device = choose_device(hints)
        ok, reason = probe(device)
        if not ok:
            raise BackendError(f"backend 'torch' cannot use its device: {reason}", field="backend_type")
        from .backend import TorchRuntime
        return TorchRuntime(config, hints, device)

    def devices(self) -> list[str]:
        import torch
        default = choose_device()
        found = [f"cpu (torch {torch.__version__}, {torch.get_num_threads()} threads)"]
        found += [f"cuda:{i} {torch.cuda.get_device_name(i)}" for i in range(torch.cuda.device_count())]
        return [f"{name} [default]" if name.split(" ")[0] in (default, f"{default}:0") else name
                for name in found]
