"""The contract every backend implements: RuntimeCreator -> Runtime -> Backend -> Execution.

Names follow MNN's `Backend.hpp` in snake_case. A backend author subclasses these (all of them
reachable from `mnnllm_core.backend_api`), registers op creators on the runtime, and exposes a
`RuntimeCreator` through the `mnnllm` plugin hooks.
"""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Hashable, Mapping, Sequence

import numpy as np

from .allocator import BufferEvent, BufferPool
from .kv_meta import KVMeta
from .op import Op
from .runtime_hints import RuntimeHints
from .tensor import Tensor
from .weights.cache import WeightCache

if TYPE_CHECKING:
    from .replay import Replay

log = logging.getLogger(__name__)

# The settings of ScheduleConfig a backend may honour; RuntimeCreator.settings names its own.
SETTINGS = ("thread_num", "precision", "memory", "power")
# Runtime hints a backend may honour (named in RuntimeCreator.settings too); a value other than the
# default is logged as ignored by a backend that does not.
HINT_SETTINGS = ("attention_mode",)


@dataclass
class BackendConfig:
    """MNN's BackendConfig: how hard and how precisely a backend should work."""

    precision: str = "normal"  # low | normal | high
    memory: str = "normal"  # low | normal | high
    power: str = "normal"  # low | normal | high


@dataclass
class ScheduleConfig:
    """MNN's ScheduleConfig: which backend, how many threads, and the backup backend."""

    backend_type: str = "cpu"
    thread_num: int = 4
    backup_type: str = "cpu"
    backend_config: BackendConfig = field(default_factory=BackendConfig)

    def setting(self, name: str) -> Any:
        """The value of one of SETTINGS."""
        return self.thread_num if name == "thread_num" else getattr(self.backend_config, name)


class Execution:
    """One op on one backend: resize when shapes change, execute every run.

    `packed_bytes`: bytes of packed weights one run reads (the decode roofline adds them up).

    The replay hooks (`replay_steps`, `fused_with`, `before_run`, `capturable`) say what a
    backend's Replay (replay.py) records for this op instead of calling on_execute per run;
    their defaults keep any Execution replayable as its on_execute.
    """

    packed_bytes = 0
    # Whether this op (one keeping per-sequence state: Attention, LinearAttention) runs a step of
    # several KV slots' rows (`kv_meta.batch`, kv_slots.py); an op that does not say so keeps one
    # sequence, and a model with such an op runs its sequences one at a time (`slot_refusal`).
    slot_aware = False
    # Whether this op's steps only launch device work (no host decision on a value that
    # changes per token), so a replay may capture them once into a device graph (a CUDA
    # graph); False makes such a replay run its steps call by call.
    capturable = True
    # The index of an input whose storage output 0 may take when this op is that input's last
    # reader and they have one byte size: the op reads each element of it before writing that
    # element of the output (an elementwise op). None: the output never shares an input's storage.
    output_may_share: int | None = None
    # Whether each row (leading dimension) of every output comes from the same row of every
    # input alone, computed the same way for any slab of at least the backend's `row_slab` rows:
    # a long step may run a chain of such ops slab by slab (row_slabs.py).
    row_wise = False

    def __init__(self, backend: "Backend"):
        self.backend = backend

    def on_resize(self, inputs: Sequence[Tensor], outputs: Sequence[Tensor]) -> None:
        """Prepare for these shapes (scratch buffers, kernel arguments)."""

    def on_execute(self, inputs: Sequence[Tensor], outputs: Sequence[Tensor]) -> None:
        raise NotImplementedError

    def on_clone(self, backend: "Backend", op: Op) -> "Execution | None":
        """A twin for another session that shares packed weights; None if unsupported."""
        return None

    # -- replay hooks --------------------------------------------------------------
    def replay_steps(self, inputs: Sequence[Tensor], outputs: Sequence[Tensor]) -> list[Any]:
        """What a replay records for this op: steps of the backend's replay, each a callable
        without arguments or an object of the backend's own (opencl: a bound kernel; vulkan: a
        dispatch). Asked at every recording (the first run after a resize, and when a
        `before_run` says buffers moved). Default: on_execute bound to these tensors."""
        return [functools.partial(self.on_execute, inputs, outputs)]

    def fused_with(self, following: Sequence[Any]) -> tuple[int, list[Any]] | None:
        """Steps doing this op and the first `n` of the `following` commands (the next few,
        each with `.execution`, `.inputs`, `.outputs`) at once, as (n, steps): two linear
        layers on one input as one kernel, or those and the MUL_SILU after them. None (the
        default): this op records its own `replay_steps`."""
        return None

    def before_run(self) -> bool:
        """Host work of every replayed run that cannot be recorded (a KV cache's bookkeeping
        and growth, this step's lengths written where the recorded steps read them), run
        before the recorded steps; True when buffers those steps bind have moved (the cache
        grew), so the replay records again. A replay calls only the overrides of this method."""
        return False

    @property
    def runs_before(self) -> bool:
        """Whether this Execution overrides `before_run` (a replay calls only those)."""
        return type(self).before_run is not Execution.before_run


@dataclass(frozen=True)
class Refused:
    """What a creator returns instead of an Execution for an op it does not run as given,
    with the reason (shown in the placement summary and by `mnnllm test-backend`). Returning
    None means the same without a reason; either way the op runs on the backup cpu backend."""

    reason: str

    def __bool__(self) -> bool:
        return False


OpCreator = Callable[["Backend", Sequence[Tensor], Sequence[Tensor], Op], "Execution | Refused | None"]


class Backend:
    """Per-session memory and op creation on one device.

    `creators` maps an MNN op type name (e.g. "Convolution", "Raster") to a function
    returning an Execution, or a `Refused` (or None) when this backend cannot run that op as
    given; the pipeline then runs it on the backup cpu backend and inserts the copies.

    Memory: a backend says how to make storage for a tensor (`alloc`) and which tensors can
    share storage (`buffer_key`); reuse across a resize is the core's `BufferPool`. `upload`
    and `download` move values between the host and that storage.

    `row_slab`: rows per slab when a long step runs a chain of row-wise ops slab by slab
    (`Execution.row_wise`, row_slabs.py), this backend's storage then being sliced on its
    leading axis (`storage[start:stop]`, a host array); 0: never.
    """

    name = "abstract"
    row_slab = 0

    def __init__(self, runtime: "Runtime", config: BackendConfig):
        self.runtime = runtime
        self.config = config
        self.creators: dict[str, OpCreator] = dict(runtime.op_creators)
        self.pool = BufferPool(self.alloc, self.buffer_key, self.free)

    @property
    def kv_meta(self) -> KVMeta:
        """How many tokens every KV cache keeps and adds this step (set by the LLM): the runtime's,
        or that of the RuntimeManager which made this backend over runtimes it shares (`derive`)."""
        own = self.__dict__.get("own_kv_meta")
        return self.runtime.kv_meta if own is None else own

    # -- op creation -------------------------------------------------------------
    def on_create(self, inputs: Sequence[Tensor], outputs: Sequence[Tensor], op: Op) -> Execution | Refused | None:
        creator = self.creators.get(op.type)
        return None if creator is None else creator(self, inputs, outputs, op)

    # -- memory ------------------------------------------------------------------
    def alloc(self, tensor: Tensor) -> Any:
        """New storage for `tensor.shape` and `tensor.dtype` (a host array, a device buffer)."""
        raise NotImplementedError

    def free(self, storage: Any) -> None:
        """Give back storage the pool drops; by default the garbage collector does."""

    def buffer_key(self, tensor: Tensor) -> Hashable:
        """Tensors with equal keys can share storage; by default the same shape and dtype."""
        return tensor.shape, tensor.dtype.str

    def on_plan_buffers(self, events: list[BufferEvent]) -> None:
        """This backend's part of the resize's buffer order, before the first on_acquire_buffer."""
        self.pool.plan(events)

    def on_acquire_buffer(self, tensor: Tensor) -> None:
        tensor.storage = self.pool.acquire(tensor)

    def on_release_buffer(self, tensor: Tensor) -> None:
        """The tensor's storage may be reused by a later tensor of this resize."""
        self.pool.release(tensor)

    def on_clear_buffer(self) -> None:
        """Drop every dynamic buffer (before a new resize)."""
        self.pool.clear()

    def upload(self, tensor: Tensor, array: np.ndarray) -> None:
        """Host -> this backend's storage of `tensor`."""
        raise NotImplementedError

    def download(self, tensor: Tensor) -> np.ndarray:
        """This backend's storage of `tensor` -> a host array of tensor.shape."""
        raise NotImplementedError

    def on_copy_buffer(self, src: Tensor, dst: Tensor) -> None:
        """Copy between backends; the default goes through the host."""
        dst.backend.upload(dst, src.backend.download(src))

    # -- phases ------------------------------------------------------------------
    def on_resize_begin(self) -> None:
        pass

    def on_resize_end(self) -> None:
        pass

    def on_execute_begin(self) -> None:
        pass

    def on_execute_end(self) -> None:
        pass

    def on_record(self, commands: Sequence[Any]) -> "Replay | None":
        """The resized `commands` (each with `.execution`, `.inputs`, `.outputs`, all on this
        backend) as one Replay (replay.py) of the backend's own kind, or None (the default) to
        keep the per-op loop. Called after every resize of a pipeline wholly on this backend
        unless the "replay" hint is off."""
        return None


class HostBackend(Backend):
    """A backend whose storage is host numpy arrays (the cpu backend, numpy-based plugins)."""

    def alloc(self, tensor: Tensor) -> np.ndarray:
        return np.empty(tensor.shape, dtype=tensor.dtype)

    def upload(self, tensor: Tensor, array: np.ndarray) -> None:
        tensor.storage[...] = np.asarray(array).reshape(tensor.shape)

    def download(self, tensor: Tensor) -> np.ndarray:
        return tensor.storage


class Runtime:
    """Shared device state (contexts, queues, kernel caches) for every backend it creates.

    `hints` are MNN's runtime hints and the config's `backend_hints`, as `hints_type` (the
    backend's RuntimeHints subclass, read as attributes); `kv_meta` is the KV cache state of the
    LLM driving this runtime (the RuntimeManager shares one among its runtimes)."""

    name = "abstract"
    hints_type: type[RuntimeHints] = RuntimeHints
    # Whether the weights a run reads live in the host's memory (the cpu backend): `mnnllm bench`
    # then judges the decode roofline against the host's measured read bandwidth (memory_probe.py).
    reads_host_memory = False

    def __init__(self, config: ScheduleConfig, hints: RuntimeHints | Mapping[str, Any] | None = None):
        self.config = config
        self.hints = self.hints_type.of(hints)
        self.op_creators: dict[str, OpCreator] = {}
        self.kv_meta = KVMeta()

    def create_backend(self, config: BackendConfig) -> Backend:
        raise NotImplementedError

    @functools.cached_property
    def weight_cache(self) -> WeightCache | None:
        """Where this backend keeps the weights it packs at load, memory-mapped by later loads
        (`use_mmap`; weight_cache.py), or None."""
        return WeightCache.from_hints(self.hints, self.name)

    def gc(self, level: int = 0) -> None:
        """Release cached memory; higher levels release more."""

    def device_name(self) -> str:
        return self.name

    def kv_storage(self) -> str:
        """How this runtime stores KV cache rows, as it honoured `attention_mode` and `kv_fp16`
        (kv_format.py): "float" (as the activations), "fp16", or "int8" (keys, values or both).
        What the conformance suite's Attention tolerance follows; a backend that ignores both
        keeps this default."""
        return "float"


class RuntimeCreator:
    """Entry point of a backend: probes the device and creates the Runtime.

    `static_shapes`: the backend cannot change shapes cheaply, so the LLM keeps one resized
    module per shape (the only place this is declared). `settings`: which of SETTINGS the
    backend honours; any other one is logged as ignored when a runtime is created. `hints_type`:
    the RuntimeHints subclass with the backend's own hints (the config's `backend_hints` is
    checked against those of every installed backend)."""

    name = "abstract"
    static_shapes = False
    settings: frozenset[str] = frozenset()
    hints_type: type[RuntimeHints] = RuntimeHints

    def is_available(self) -> tuple[bool, str]:
        """(True, "") when a tiny kernel really built and ran; else (False, why)."""
        raise NotImplementedError

    def create(self, config: ScheduleConfig, hints: RuntimeHints | Mapping[str, Any] | None = None) -> Runtime:
        raise NotImplementedError

    def devices(self) -> list[str]:
        """The devices the backend can use, one line each (`mnnllm devices`): `list_devices()`,
        or [] where that fails (no driver)."""
        try:
            return self.list_devices()
        except Exception:  # no driver, or its package missing: no devices to list
            return []

    def list_devices(self) -> list[str]:
        return []

    def probe_device_module(self, load: Callable[[], Any], package: str, silent: str = "",
                            install: str = "") -> tuple[bool, str]:
        """is_available of a backend whose device layer is a module importing the driver's package:
        `load()` imports it (a failure means unavailable, with `install`, the command that installs it,
        first), then its `probe(spec)` runs once on the selection `device_spec(None)` gives (the
        environment's, else the default device)."""
        try:
            device = load()
        except Exception as err:  # the package missing, or its native library not loadable
            hint = f"{install}; " if install else ""
            return False, f"{package} cannot be imported ({hint}{type(err).__name__}: {err})"
        spec = device.device_spec(None)
        return self.probe_once(spec, lambda: device.probe(spec), silent)

    def probe_once(self, key: Hashable, probe: Callable[[], str], silent: str = "") -> tuple[bool, str]:
        """(ok, reason) of `probe()`, run once per `key` (a device selection); never raises.
        `probe` builds and runs a tiny kernel and returns the device's description, or raises
        (any driver or compiler failure means unavailable); `silent` is the reason given when
        the error says nothing."""
        probed = self.__dict__.setdefault("_probed", {})
        if key not in probed:
            try:
                log.debug("%s probe ran on %s", self.name, probe())
                probed[key] = (True, "")
            except Exception as err:  # whatever the driver raises, the backend is unavailable
                probed[key] = (False, f"{type(err).__name__}: {str(err).strip() or silent}")
        return probed[key]
