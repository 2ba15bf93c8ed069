"""Registers the numpy cpu backend through the same hook any third-party backend uses."""
from mnnllm_core.backend_api import hookimpl


@hookimpl
def mnnllm_register_runtime_creators():
    from .runtime import CPURuntimeCreator
    return [CPURuntimeCreator()]
