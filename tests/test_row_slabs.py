"""A long step's row-wise chains run in slabs of rows (`mnnllm_core/core/row_slabs.py`, the cpu
backend's `row_slab`): the memory "low" MLP's gate, up and their product are never whole, the
step holds less, and the logits are those of the whole-step path, bit for bit."""
import numpy as np

import mnnllm_core
from mnnllm_backends.cpu.runtime import CPUBackend
from mnnllm_core.core.row_slabs import SLAB_OP, RowSlabExecution, slab_bounds
from paths import CONFIG

MiB = 1 << 20


def test_slabs_start_at_multiples_of_the_slab_and_the_last_takes_the_remainder():
    assert slab_bounds(1024, 512) == [(0, 512), (512, 1024)]
    assert slab_bounds(1100, 512) == [(0, 512), (512, 1100)]
    assert slab_bounds(1535, 512) == [(0, 512), (512, 1535)]
    assert slab_bounds(1536, 512) == [(0, 512), (512, 1024), (1024, 1536)]
    assert slab_bounds(300, 512) == [(0, 300)]


def load(**keys):
    llm = mnnllm_core.create(CONFIG)
    llm.set_config({"sampler_type": "greedy", "thread_num": 2, "max_all_tokens": 8192 + 64, **keys})
    return llm.load()


def resized(llm, rows: int):
    ids = [100 + i % 1000 for i in range(rows)]
    feeds = {**llm._token_feeds(ids), "attention_mask": llm._attention_mask(rows),
             "position_ids": llm._position_ids(rows), "logits_index": llm._logits_index[False]}
    session = llm.pool.get(rows, False).static_module.session
    session.resize(feeds)
    return session.pipeline


def test_the_long_steps_mlp_runs_in_slabs_and_its_step_holds_less(monkeypatch):
    """The shared model, memory "low", 8,192 rows: each layer's gate, up, MUL_SILU and down in one
    command; the step's buffers 70 MiB (with RoPE and the norms over their inputs: at a fused
    norm its two inputs and its normed output live) where the whole MLP's step held 136."""
    pipeline = resized(load(), 8192)
    slabbed = [c for c in pipeline.commands if c.op.type == SLAB_OP]
    assert len(slabbed) == 30 and all(len(c.execution.members) == 4 for c in slabbed)
    assert all(s.shape == (512, 1536, 1, 1) for c in slabbed for s in c.scratch)
    held = pipeline.backend.pool.held_bytes()
    monkeypatch.setattr(CPUBackend, "row_slab", 0)
    whole = resized(load(), 8192)
    assert not any(c.op.type == SLAB_OP for c in whole.commands)
    assert held <= 72 * MiB and whole.backend.pool.held_bytes() >= held + 60 * MiB


def test_a_step_under_two_slabs_runs_whole():
    assert not any(c.op.type == SLAB_OP for c in resized(load(), 1000).commands)


def test_slabs_give_the_logits_of_the_whole_step(monkeypatch):
    """1,100 rows (slabs of 512 and 588), then a decode step over the cache they filled."""
    ids = [100 + (i * 7919) % 40000 for i in range(1101)]
    slabs = []
    with monkeypatch.context() as patch:
        run = RowSlabExecution.on_execute
        patch.setattr(RowSlabExecution, "on_execute", lambda self, *a: slabs.append(len(self.slabs)) or run(self, *a))
        slabbed = load()
        want = slabbed.forward(ids[:1100]), slabbed.forward(ids[1100:])
    assert slabs == [2] * 30
    monkeypatch.setattr(CPUBackend, "row_slab", 0)
    whole = load()
    got = whole.forward(ids[:1100]), whole.forward(ids[1100:])
    assert all(np.array_equal(a, b) for a, b in zip(want, got))
