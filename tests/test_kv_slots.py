"""KV slots (kv_slots.py): the row table's checks, a slot's meta in place of the backend's for a
block, and which modules can run a batch (the conformance cases check the numbers)."""
from __future__ import annotations

import numpy as np
import pytest

from mnnllm_core.core.kv_cache import KVCache
from mnnllm_core.core.kv_meta import KVMeta
from mnnllm_core.core.kv_slots import BatchMeta, SlotCaches, SlotRows, slot_meta, slot_refusal
from mnnllm_core.errors import KVStateError
from mnnllm_core.express.runtime_manager import RuntimeManager
from mnnllm_core.express.static_module import Config, StaticModule
from mnnllm_core.testing.cases.attention import attention_op
from mnnllm_core.testing.harness import one_op_graph


def rows(*groups: tuple[int, int, int]) -> BatchMeta:
    return BatchMeta(tuple(SlotRows(slot, start, count, KVMeta()) for slot, start, count in groups))


def test_a_batch_whose_groups_tile_the_rows_in_order_passes_the_check() -> None:
    batch = rows((2, 0, 3), (0, 3, 1), (5, 4, 2))
    batch.check(6)
    assert batch.rows == 6


@pytest.mark.parametrize("batch, seq", [(rows((1, 0, 2), (2, 3, 1)), 4),  # a gap
                                        (rows((1, 0, 2), (1, 2, 1)), 3),  # a slot twice
                                        (rows((1, 0, 2)), 3),  # rows left over
                                        (rows((1, 0, 0), (2, 0, 1)), 1)])  # an empty group
def test_a_batch_that_does_not_tile_the_rows_is_a_kv_state_error(batch: BatchMeta, seq: int) -> None:
    with pytest.raises(KVStateError, match="batch|rows"):
        batch.check(seq)


def test_slot_caches_keep_slot_0_as_the_layer_own_and_make_the_others_once() -> None:
    own = KVCache()
    caches = SlotCaches(own, KVCache)
    assert caches.get(0) is own
    assert caches.get(3) is caches.get(3) is not own


def test_slot_meta_stands_in_for_the_backend_meta_within_the_block_only() -> None:
    manager = RuntimeManager.create()
    backend, _ = manager.create_backends()
    mine = KVMeta(previous=7)
    with slot_meta(backend, mine):
        assert backend.kv_meta is mine
    assert backend.kv_meta is manager.kv_meta
    with pytest.raises(RuntimeError), slot_meta(backend, mine):
        raise RuntimeError("interrupted")
    assert backend.kv_meta is manager.kv_meta


def test_the_cpu_attention_is_slot_aware_and_a_module_without_state_is_refused() -> None:
    manager = RuntimeManager.create()
    feeds = [np.zeros((1, 16, 1, 1), np.float32), np.zeros((1, 8, 1, 1), np.float32),
             np.zeros((1, 8, 1, 1), np.float32), np.zeros((1, 1, 1, 1), np.float32)]
    info, _ = one_op_graph(attention_op(2, 1, 8), feeds, 1)
    module = StaticModule(info, manager, Config(rearrange=True))
    executions = [e for _, e in module.session.pipeline.executions.values()]
    assert slot_refusal(executions) is None
    assert "no KV cache" in slot_refusal([])


@pytest.mark.parametrize("backend", ["opencl", "vulkan"])
def test_the_device_attentions_are_slot_aware(backend: str) -> None:
    from mnnllm_core.core.backend import ScheduleConfig
    from mnnllm_core.plugins.manager import registry
    ok, reason = registry().get(backend).is_available()
    if not ok:
        pytest.skip(f"{backend} unavailable: {reason}")
    manager = RuntimeManager.create(ScheduleConfig(backend_type=backend, thread_num=2))
    feeds = [np.zeros((1, 64, 1, 1), np.float32), np.zeros((1, 32, 1, 1), np.float32),
             np.zeros((1, 32, 1, 1), np.float32), np.zeros((1, 1, 1, 1), np.float32)]
    info, _ = one_op_graph(attention_op(4, 2, 16), feeds, 1)
    module = StaticModule(info, manager, Config(rearrange=True))
    executions = [e for _, e in module.session.pipeline.executions.values()]
    assert slot_refusal(executions) is None
    assert any(e.backend.name == backend and e.slot_aware for e in executions)


def test_a_stateful_op_that_does_not_say_it_is_slot_aware_is_refused_naming_its_class_and_backend() -> None:
    """A plugin's Attention tells the core nothing about slots: `Execution.slot_aware` is False
    unless it says otherwise, and an op stateful by its type counts even when its state is no
    KVCache (a plugin may keep it in tensors of its own)."""
    from mnnllm_core.core.backend import Execution

    class Elsewhere:
        name = "elsewhere"

    class OwnState(Execution):
        def __init__(self):
            super().__init__(Elsewhere())
            self.keys = []  # not a KVCache

    class Cached(OwnState):
        def __init__(self):
            super().__init__()
            self.cache = KVCache()

    own = OwnState()
    assert not own.slot_aware
    assert "no KV cache" in slot_refusal([own])  # by its attributes alone nothing shows state
    assert slot_refusal([own], [own]) == "OwnState on elsewhere each keep one sequence's state only (not slot-aware)"
    assert "Cached on elsewhere" in slot_refusal([Cached()])


def test_the_webgpu_plugin_attention_is_refused_for_batches_naming_webgpu() -> None:
    from mnnllm_core.core.backend import ScheduleConfig
    from mnnllm_core.errors import BackendError
    from mnnllm_core.plugins.manager import registry
    try:
        ok, reason = registry().get("webgpu").is_available()
    except BackendError as err:  # the plugin is not installed
        pytest.skip(str(err))
    if not ok:
        pytest.skip(f"webgpu unavailable: {reason}")
    manager = RuntimeManager.create(ScheduleConfig(backend_type="webgpu", thread_num=2))
    feeds = [np.zeros((1, 64, 1, 1), np.float32), np.zeros((1, 32, 1, 1), np.float32),
             np.zeros((1, 32, 1, 1), np.float32), np.zeros((1, 1, 1, 1), np.float32)]
    info, _ = one_op_graph(attention_op(4, 2, 16), feeds, 1)
    module = StaticModule(info, manager, Config(rearrange=True))
    executions = [e for _, e in module.session.pipeline.executions.values()]
    refusal = slot_refusal(executions, executions)
    assert refusal is not None and "on webgpu" in refusal and "not slot-aware" in refusal
