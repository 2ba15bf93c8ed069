"""Registers the opencl backend through the same hook any third-party backend uses.
Nothing here imports pyopencl or touches a driver: probing happens in `is_available()`."""
from mnnllm_core.backend_api import hookimpl


@hookimpl
def mnnllm_register_runtime_creators():
    from .runtime import OpenCLRuntimeCreator
    return [OpenCLRuntimeCreator()]
