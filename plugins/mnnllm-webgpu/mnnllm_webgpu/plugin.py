"""The plugin module the `mnnllm` entry point names: it only hands over the RuntimeCreator.

Importing this module imports no wgpu: the registry loads plugins whenever any backend is
asked for, and a cpu user must not pay for (or break on) a missing WebGPU stack.
"""
from mnnllm_core.backend_api import hookimpl

from .runtime import WebGPURuntimeCreator


@hookimpl
def mnnllm_register_runtime_creators():
    return [WebGPURuntimeCreator()]
