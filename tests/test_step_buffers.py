"""The cpu backend's step buffers placed by lifetime (`backends/cpu/lifetime_plan.py`,
`buffer_pool.py`): two live tensors never share a byte, an elementwise op's output takes its
input's bytes, the long step holds its live peak, and the logits are those of the first-come pool."""
import numpy as np
import pytest

import mnnllm_core
from mnnllm_backends.cpu import buffer_pool
from mnnllm_backends.cpu.lifetime_plan import Lifetime, aligned, place
from mnnllm_backends.cpu.ops.elementwise import MulSiluExecution
from mnnllm_backends.cpu.ops.norm import LayerNormExecution
from mnnllm_backends.cpu.ops.rope import RoPEExecution
from mnnllm_backends.cpu.runtime import CPUBackend
from mnnllm_core.backend_api import BufferEvent
from mnnllm_core.errors import MnnllmError
from paths import CONFIG

MiB = 1 << 20


def test_buffers_whose_lifetimes_overlap_never_share_a_byte_and_the_arena_is_the_live_peak():
    lifetimes = [Lifetime(0, 4, 300), Lifetime(1, 3, 1000), Lifetime(3, 6, 700), Lifetime(4, 8, 200),
                 Lifetime(5, 9, 64), Lifetime(2, 9, 100)]
    offsets, size = place(lifetimes)
    for i, a in enumerate(lifetimes):
        for j, b in enumerate(lifetimes[:i]):
            if a.overlaps(b):
                assert offsets[i] + aligned(a.nbytes) <= offsets[j] or offsets[j] + aligned(b.nbytes) <= offsets[i]
        assert offsets[i] % 64 == 0
    live = max(sum(aligned(x.nbytes) for x in lifetimes if x.start <= t < x.stop) for t in range(9))
    assert size == live  # 1024 + 320 + 128 at t=2: the 700 bytes later take the 1000's place


class _Tensor:
    def __init__(self, shape, dtype=np.float32):
        self.shape, self.dtype, self.storage = shape, np.dtype(dtype), None

    @property
    def nbytes(self):
        return int(np.prod(self.shape)) * self.dtype.itemsize


def test_the_pool_places_big_tensors_by_plan_an_output_over_its_input_and_pools_small_ones():
    rows = buffer_pool.PLANNED_FROM // 4 // 64
    gate, up, out, down, small = (_Tensor((rows, 64)), _Tensor((rows, 64)), _Tensor((rows, 64)),
                                  _Tensor((rows, 64)), _Tensor((2, 3)))
    events = [BufferEvent(True, gate), BufferEvent(True, up), BufferEvent(True, out, shares=gate),
              BufferEvent(False, gate), BufferEvent(False, up), BufferEvent(True, down), BufferEvent(True, small),
              BufferEvent(False, out)]
    pool = buffer_pool.SizedBufferPool()
    pool.plan(events)
    for event in events:
        if event.acquire:
            event.tensor.storage = pool.acquire(event.tensor)
        else:
            pool.release(event.tensor)
    assert np.shares_memory(out.storage, gate.storage) and out.storage.ctypes.data == gate.storage.ctypes.data
    assert not np.shares_memory(up.storage, gate.storage) and not np.shares_memory(down.storage, out.storage)
    assert np.shares_memory(down.storage, up.storage)  # up's last reader ran before down was acquired
    assert small.storage.shape == (2, 3) and pool.held_bytes() == 2 * gate.nbytes + 24
    pool.clear()
    assert pool.held_bytes() == 0 and not np.shares_memory(pool.acquire(gate), out.storage)


def test_a_graph_inputs_bytes_serve_a_tensor_acquired_after_its_last_reader():
    rows = buffer_pool.PLANNED_FROM // 4 // 64
    given, hidden, later = _Tensor((rows, 64)), _Tensor((rows, 64)), _Tensor((rows, 64))
    events = [BufferEvent(True, given), BufferEvent(True, hidden), BufferEvent(False, given),
              BufferEvent(True, later)]
    pool = buffer_pool.SizedBufferPool()
    pool.plan(events)
    storages = [pool.acquire(t) for t in (given, hidden, later)]
    assert np.shares_memory(storages[2], storages[0]) and not np.shares_memory(storages[1], storages[0])
    assert pool.held_bytes() == 2 * given.nbytes


def load(**keys):
    llm = mnnllm_core.create(CONFIG)
    llm.set_config({"sampler_type": "greedy", "thread_num": 2, "max_all_tokens": 8192 + 64, **keys})
    return llm.load()


def unplanned(monkeypatch):
    """The first-come pool alone, as before lifetimes were planned."""
    monkeypatch.setattr(buffer_pool, "PLANNED_FROM", 1 << 62)  # graph inputs kept, as pooled tensors are
    monkeypatch.setattr(MulSiluExecution, "output_may_share", None)
    monkeypatch.setattr(RoPEExecution, "output_may_share", None)
    monkeypatch.setattr(LayerNormExecution, "output_may_share", None)


def step_buffer_bytes(llm, rows: int) -> int:
    """The buffers of a step of `rows` tokens once resized (not run)."""
    ids = [100 + i % 1000 for i in range(rows)]
    feeds = {**llm._token_feeds(ids), "attention_mask": llm._attention_mask(rows),
             "position_ids": llm._position_ids(rows), "logits_index": llm._logits_index[False]}
    pipeline = llm.pool.get(rows, False).static_module.session.pipeline
    llm.pool.get(rows, False).static_module.session.resize(feeds)
    return pipeline.backend.pool.held_bytes()


def test_the_8192_row_step_holds_its_live_peak_not_a_buffer_per_shape(monkeypatch):
    """The shared model, memory "low", the MLP whole (its row slabs: test_row_slabs.py): 136 MiB
    planned (at the MLP's up projection the residual, the norm's output, the gate and up live, and
    RoPE's tables), where the first-come pool held 260."""
    monkeypatch.setattr(CPUBackend, "row_slab", 0)
    held = step_buffer_bytes(load(), 8192)
    assert held <= 140 * MiB
    unplanned(monkeypatch)
    assert step_buffer_bytes(load(), 8192) > held + 110 * MiB


def test_a_run_without_every_input_is_refused_and_a_consumed_feed_is_let_go():
    """A graph input's bytes serve later tensors once its last reader ran: each run must upload it.
    The Llm's steps consume their feeds (the embeddings are not held through a long step)."""
    llm = load()
    llm.forward([1, 2])
    module = llm.pool.get(1, False).static_module
    feeds = {**llm._token_feeds([3]), "attention_mask": llm._attention_mask(1),
             "position_ids": llm._position_ids(1), "logits_index": llm._logits_index[False]}
    want = module.forward(dict(feeds))
    assert np.array_equal(module.forward(feeds, consume=True)[0], want[0]) and feeds == {}  # uploaded, let go
    with pytest.raises(MnnllmError, match="missing inputs"):
        module.forward(feeds)


@pytest.mark.parametrize("keys", [{"memory": "low"}, {"memory": "low", "attention_mode": 10}, {"memory": "normal"}])
def test_planned_buffers_give_the_logits_of_the_first_come_pool(monkeypatch, keys):
    ids = [100 + (i * 7919) % 40000 for i in range(600)]
    planned = load(**keys)
    want_all = planned.forward(ids[:500], all_logits=True), planned.forward(ids[500:])
    with monkeypatch.context() as patch:
        unplanned(patch)
        before = load(**keys)
        got_all = before.forward(ids[:500], all_logits=True), before.forward(ids[500:])
    assert all(np.array_equal(a, b) for a, b in zip(want_all, got_all))
