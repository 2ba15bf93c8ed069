"""The hooks a backend plugin implements (pluggy project name "mnnllm"). Every hook is here.

A plugin is a module (or object) with `@hookimpl`-decorated functions named after the specs
below. mnnllm finds it in one of two ways:

  * an entry point in the `mnnllm` group of an installed distribution:

        [project.entry-points.mnnllm]
        mybackend = "my_package.plugin"

  * the environment variable MNNLLM_PLUGINS=my_package.plugin,other.module (imported by name;
    handy for a plugin that is not installed, and the only way left when
    MNNLLM_DISABLE_PLUGIN_AUTOLOAD=1 turns entry-point loading off).

When: plugins are loaded lazily, the first time anything asks the registry for a backend
(creating a Runtime, `mnnllm backends`), never by `import mnnllm_core`. A plugin module that
raises at import, or a hook that raises, is recorded (`mnnllm backends` shows the error and
the plugin's traceback frames) and skipped; the other plugins still load.

Keep the plugin module cheap to import: it runs whenever any backend is used, even cpu.
Import the device library (torch, pyopencl, ...) inside the RuntimeCreator's methods, and
touch the device only in `RuntimeCreator.is_available()` and `create()`.

What a backend provides, all from `mnnllm_core.backend_api` (the one module of mnnllm a
backend imports; plugins/README.md walks through it):

  RuntimeCreator  name; static_shapes; settings (which of thread_num, precision, memory, power
                  it honours); is_available() -> (ok, reason), a probe that really runs a tiny
                  kernel on the device; create(config, hints) -> Runtime; devices() -> list[str]
                  (shown by `mnnllm backends`).
  Runtime         device state; op_creators {op type -> creator}; create_backend(config).
  Backend         alloc (storage for a tensor; reuse is the core's BufferPool), upload, download,
                  on_create; kv_meta (the KV cache state of this step).
  Execution       on_resize, on_execute, on_clone (share packed weights with a clone).

A creator `creator(backend, inputs, outputs, op) -> Execution | Refused | None` reads `op.param`
(the op's parameters, decoded once by the core into a typed dataclass) and returns Refused(why)
or None for an op it does not run; the pipeline then runs that op on the cpu backend (copies
inserted), lists it in the placement summary with the reason, or raises BackendError when the
model's config says `allow_fallback: false`. Weighted ops (Convolution, LayerNorm) and Attention
are created once at load, before shapes are known, and must read their weights then
(`op.weights.convolution()`, `op.weights.layernorm()`): the core drops them afterwards.

Static shapes: a backend that cannot change shapes cheaply (compiled graphs, NPUs) sets
`static_shapes = True` on its RuntimeCreator; the LLM then loads its modules with
`shape_mutable=False` and keeps one resized clone per (seq_len, all_logits).

`mnnllm test-backend NAME` runs the conformance suite (mnnllm_core.testing) on a backend.
"""
from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("mnnllm")
hookimpl = pluggy.HookimplMarker("mnnllm")


@hookspec
def mnnllm_register_runtime_creators() -> list:
    """Return the `RuntimeCreator` objects (backends) this plugin provides; may be empty.

    Args: none.
    Returns: a list of `mnnllm_core.backend_api.RuntimeCreator` instances; each `name`
        is what users put in `backend_type`.
    Called: once per process, when the registry first loads the plugins (lazily, see the
        module docstring); not at `import mnnllm_core`.
    Not firstresult: the lists of all plugins are joined. A name already registered by an
        earlier plugin is reported as that later plugin's error and ignored.
    Must not touch the device or import heavy libraries: probing happens in
    `is_available()`, device state in `create()`.
    """


@hookspec
def mnnllm_register_op_creators(backend_name: str) -> dict:
    """Return `{op_type: creator}` to add to (or override on) the backend `backend_name`.

    For plugins that extend a backend they do not own (a faster Attention for "cpu", a
    missing op for "opencl"); return {} for backends you do not extend.
    Args: backend_name, the RuntimeCreator name of the Runtime being created.
    Returns: a dict from MNN op type name ("Convolution", "RoPE", "Raster", ...) to
        `creator(backend, inputs, outputs, op) -> Execution | Refused | None`.
    Called: each time a Runtime of any backend is created (after `RuntimeCreator.create`),
        once per plugin implementing it.
    Not firstresult: the dicts are applied over the backend's own creators in plugin
        registration order, later plugins winning on the same op type.
    """
