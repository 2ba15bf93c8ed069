"""Which kernel family runs: those written for a CPU device (pocl: a register tile of tokens,
rows or queries per work-item in a prefill, the staged one-token GEMV of gemv_cpu.cl, vector
types, work-groups that keep both cores busy) or those for a GPU (one work-item per output,
work-group reductions). By device class, or forced by the runtime hint "opencl_cpu_kernels"
(true / false), read here so that every op decides the same way."""
from __future__ import annotations


def cpu_kernels(backend) -> bool:
    """True when the CPU-device kernels run on this backend."""
    runtime = backend.runtime
    forced = runtime.hints.opencl_cpu_kernels
    return runtime.device.is_cpu if forced is None else forced
