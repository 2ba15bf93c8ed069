"""A prefill attends in blocks of queries, so its memory grows linearly with the prompt: both
cpu paths (memory "normal" numpy, memory "low" numba kernel) give the float64 reference's
answer however the prompt is cut into blocks, with the cache already holding tokens or not,
under causal, float and int masks; a block seeing more than TILED_FROM keys (lowered here) goes
over them in key tiles with an online softmax and gives the same answer within the tolerance."""
from __future__ import annotations

import tracemalloc
from types import SimpleNamespace

import numpy as np
import pytest

from mnnllm_core.core.kv_meta import KVMeta
from mnnllm_core.core.op_params import AttentionParams
from mnnllm_core.testing.references import attention_reference
from mnnllm_backends.cpu.host_threads import HostThreads
from mnnllm_backends.cpu.ops import attention as cpu_attention

HEADS, KV_HEADS, DIM = 4, 2, 16
SCALAR = np.zeros((1, 1, 1, 1), np.float32)


class Backend:
    def __init__(self, low: bool, threads: int = 1):
        self.kv_meta, self._low = KVMeta(), low
        self.runtime = SimpleNamespace(thread_num=threads, host_threads=HostThreads(threads))

    def low_memory(self) -> bool:
        return self._low


def tensor(array: np.ndarray) -> SimpleNamespace:
    return SimpleNamespace(storage=np.ascontiguousarray(array), shape=array.shape, size=array.size,
                           dtype=array.dtype)


def run_steps(low: bool, q, k, v, cuts: list[int], mask_of=lambda t0, t1: SCALAR, threads: int = 1) -> np.ndarray:
    """Prefill q/k/v in steps ending at `cuts`; the outputs of every step, stacked."""
    backend = Backend(low, threads)
    execution = cpu_attention.AttentionExecution(backend, AttentionParams(True, 0.0, (HEADS, KV_HEADS, DIM), True))
    outs, start = [], 0
    for end in cuts:
        seq = end - start
        inputs = [tensor(x[start:end].reshape(seq, -1, 1, 1)) for x in (q, k, v)] + [tensor(mask_of(start, end))]
        outputs = [tensor(np.zeros((seq, HEADS * DIM, 1, 1), np.float32))]
        backend.kv_meta.add = seq
        execution.on_resize(inputs, outputs)
        execution.on_execute(inputs, outputs)
        backend.kv_meta.sync()
        outs.append(outputs[0].storage.reshape(seq, HEADS, DIM))
        start = end
    return np.concatenate(outs)


def qkv(tokens: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((tokens, HEADS, DIM), np.float32), rng.standard_normal((tokens, KV_HEADS, DIM), np.float32),
            rng.standard_normal((tokens, KV_HEADS, DIM), np.float32))


@pytest.mark.parametrize("low", [False, True], ids=["memory normal", "memory low"])
@pytest.mark.parametrize("cuts", [[300], [100, 300], [1, 40, 300]])
@pytest.mark.parametrize("budget", [1 << 24, 4 * 64 * 16], ids=["one block", "blocks of 16"])
def test_a_blocked_causal_prefill_equals_the_reference(monkeypatch, low, cuts, budget):
    monkeypatch.setattr(cpu_attention, "SCORES_BUDGET", budget)
    q, k, v = qkv(cuts[-1])
    np.testing.assert_allclose(run_steps(low, q, k, v, cuts), attention_reference(q, k, v), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", ["float", "int"])
def test_a_blocked_prefill_with_a_full_mask_equals_the_reference(monkeypatch, kind):
    monkeypatch.setattr(cpu_attention, "SCORES_BUDGET", 4 * 64 * 16)
    tokens = 200
    q, k, v = qkv(tokens, seed=1)
    rng = np.random.default_rng(2)
    if kind == "float":
        bias = rng.standard_normal((tokens, tokens)).astype(np.float32)
        mask = bias.reshape(1, 1, tokens, tokens)
    else:
        allowed = np.tril(np.ones((tokens, tokens), bool)) & (rng.random((tokens, tokens)) < 0.7)
        np.fill_diagonal(allowed, True)
        mask = allowed.astype(np.int32).reshape(1, 1, tokens, tokens)
        bias = np.where(allowed, 0.0, -np.inf)
    got = run_steps(False, q, k, v, [tokens], lambda t0, t1: mask)
    np.testing.assert_allclose(got, attention_reference(q, k, v, bias=bias, causal_offset=None), rtol=1e-4, atol=1e-4)


def peak_bytes(tokens: int) -> int:
    q, k, v = qkv(tokens)
    tracemalloc.start()
    try:
        run_steps(False, q, k, v, [tokens])
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_prefill_memory_grows_linearly_with_the_prompt(monkeypatch):
    monkeypatch.setattr(cpu_attention, "SCORES_BUDGET", 1 << 16)
    small, large = peak_bytes(1024), peak_bytes(4096)
    assert large < 6 * small  # 4x the prompt: linear gives ~4x, unblocked gives ~16x
    scores_unblocked = HEADS * 4096 * 4096 * 4
    assert large < scores_unblocked / 4


@pytest.mark.parametrize("cuts", [[300], [100, 300], [1, 40, 300]])
@pytest.mark.parametrize("tile", [16, 37])
def test_a_key_tiled_causal_prefill_equals_the_reference(monkeypatch, cuts, tile):
    """TILED_FROM 50: every block past 50 keys runs attend_key_tiles (tiles of 16, or 37 that
    cut the causal diagonal anywhere); blocks of 16 queries, so some blocks stay one-pass."""
    monkeypatch.setattr(cpu_attention, "SCORES_BUDGET", 4 * 64 * 16)
    monkeypatch.setattr(cpu_attention, "TILED_FROM", 50)
    monkeypatch.setattr(cpu_attention, "KEY_TILE", tile)
    q, k, v = qkv(cuts[-1], seed=3)
    np.testing.assert_allclose(run_steps(False, q, k, v, cuts), attention_reference(q, k, v), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", ["float", "int"])
def test_a_key_tiled_prefill_with_a_full_mask_equals_the_reference(monkeypatch, kind):
    monkeypatch.setattr(cpu_attention, "TILED_FROM", 50)
    monkeypatch.setattr(cpu_attention, "KEY_TILE", 23)
    test_a_blocked_prefill_with_a_full_mask_equals_the_reference(monkeypatch, kind)


def test_key_tiles_bound_the_scores_of_a_block_whatever_the_keys(monkeypatch):
    """One block of 256 queries over 4096 keys: one-pass scores are 256 x 4096 a head, the
    tiles' KEY_TILE (512 here) wide."""
    monkeypatch.setattr(cpu_attention, "KEY_TILE", 512)
    monkeypatch.setattr(cpu_attention, "SCORES_BUDGET", HEADS * 256 * 4096)
    monkeypatch.setattr(cpu_attention, "CAUSAL_QUERIES", 256)
    one_pass = peak_bytes(4096)
    monkeypatch.setattr(cpu_attention, "TILED_FROM", 256)
    tiled = peak_bytes(4096)
    scores_block = HEADS * 256 * 4096 * 4
    assert tiled < one_pass - scores_block / 2, (tiled, one_pass)


def test_every_attention_case_passes_with_key_tiles_from_a_few_keys(monkeypatch):
    """The conformance suite's Attention cases on cpu (memory normal, float64 references, the
    cases' tolerances), sinks and float/int masks included, with every prefill block past 16
    keys in tiles of 16."""
    from mnnllm_core.testing import run_suite, select
    monkeypatch.setattr(cpu_attention, "TILED_FROM", 16)
    monkeypatch.setattr(cpu_attention, "KEY_TILE", 16)
    calls, tiled = [], cpu_attention.attend_key_tiles

    def counted(*args):
        calls.append(args[3])
        return tiled(*args)
    monkeypatch.setattr(cpu_attention, "attend_key_tiles", counted)
    results = run_suite("cpu", cases=[c for c in select("Attention") if "long" not in c.name])
    assert results and not [(r.case.id, r.status, r.reason) for r in results if r.status != "pass"]
    assert len(calls) > 50, "the cases' prefills ran in key tiles"


@pytest.mark.parametrize("mask", ["causal", "float"])
def test_blocks_spread_over_threads_give_the_bits_of_one_thread(monkeypatch, mask):
    """The numpy path's blocks of queries run on the runtime's threads (`host_threads.py`), BLAS
    on one thread in each: the same bits as one thread running them in order, for a prompt that
    crosses CAUSAL_QUERIES blocks and TILED_FROM (lowered to 150; tiles of 64 and one-pass
    blocks both), after a cached part and from an empty cache."""
    monkeypatch.setattr(cpu_attention, "TILED_FROM", 150)
    monkeypatch.setattr(cpu_attention, "KEY_TILE", 64)
    monkeypatch.setattr(cpu_attention, "CAUSAL_QUERIES", 32)
    monkeypatch.setattr(cpu_attention, "SCORES_BUDGET", HEADS * 32 * 300)
    tokens = 300
    q, k, v = qkv(tokens, seed=4)
    bias = np.random.default_rng(5).standard_normal((tokens, tokens)).astype(np.float32).reshape(1, 1, tokens, tokens)
    mask_of = (lambda t0, t1: SCALAR) if mask == "causal" else (lambda t0, t1: bias[..., t0:t1, :t1])
    cuts = [tokens] if mask == "float" else [100, tokens]
    one = run_steps(False, q, k, v, cuts, mask_of, threads=1)
    for threads in (2, 3):
        np.testing.assert_array_equal(run_steps(False, q, k, v, cuts, mask_of, threads=threads), one)


def test_an_error_in_a_block_reaches_the_caller_after_every_thread_stopped():
    done = []

    def task(item):
        if item == 3:
            raise ValueError("block 3")
        done.append(item)
    with pytest.raises(ValueError, match="block 3"):
        HostThreads(2).run(task, range(8))
    assert 3 not in done
