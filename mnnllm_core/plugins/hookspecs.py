"""The hooks a backend plugin implements (pluggy project name "mnnllm").

A plugin is any module or object with `@hookimpl`-decorated functions, published under the
`mnnllm` entry-point group:

    [project.entry-points.mnnllm]
    mybackend = "my_package.plugin"
"""
from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("mnnllm")
hookimpl = pluggy.HookimplMarker("mnnllm")


@hookspec
def mnnllm_register_runtime_creators() -> list:
    """Return the `RuntimeCreator` objects this plugin provides (a list, may be empty).

    Called once, the first time the registry is used (not at import). Not firstresult:
    the lists of all plugins are joined; two creators with the same `name` are an error.
    The creator must not touch the device here: probing happens in `is_available()`.
    """


@hookspec
def mnnllm_register_op_creators(backend_name: str) -> dict:
    """Return `{op_type: creator}` to add to (or override on) the backend `backend_name`.

    Called each time a Runtime of that backend is created, for every plugin; the dicts
    are applied in registration order, later plugins winning. A creator has the
    signature `creator(backend, inputs, outputs, op) -> Execution | None`.
    """
