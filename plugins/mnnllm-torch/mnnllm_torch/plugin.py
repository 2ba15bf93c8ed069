"""The plugin module the `mnnllm` entry point names: it only hands over the RuntimeCreator.

Importing this module imports no torch: the registry loads plugins whenever any backend is
asked for, and a cpu user must not pay for torch (or break when it is missing).
"""
from mnnllm_core.backend_api import hookimpl

from .runtime import TorchRuntimeCreator


@hookimpl
def mnnllm_register_runtime_creators():
    return [TorchRuntimeCreator()]
