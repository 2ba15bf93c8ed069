"""Which kernel family runs: those written for a CPU device (pocl: a register tile of tokens,
rows or queries per work-item in a prefill, the staged one-token GEMV of gemv_cpu.cl, vector
types, work-groups that keep both cores busy) or those for a GPU (one work-item per output,
work-group reductions). By device class, or forced by the runtime hint "opencl_cpu_kernels"
(true / false), read here so that every op decides the same way."""
from __future__ import annotations

from mnnllm_core.backend_api import ConfigError

HINT = "opencl_cpu_kernels"


def cpu_kernels(backend) -> bool:
    """True when the CPU-device kernels run on this backend."""
    runtime = backend.runtime
    value = runtime.hints.get(HINT)
    if value is None:
        return runtime.device.is_cpu
    if not isinstance(value, bool):
        raise ConfigError(f"the backend hint {HINT} must be true or false, got {value!r}", field=f"backend_hints.{HINT}")
    return value
