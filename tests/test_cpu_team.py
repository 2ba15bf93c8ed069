"""The cpu replay's thread team (`kernels/team.py`): with thread_num 2 at memory "low" a replayed
step's programs run on two threads, every linear's rows split between them (or on rank 0 alone,
where that measures faster), and give the serial
program's logits and the per-op loop's bit for bit (int4 GEMVs, and the int8-activation linears
under the `cpu_int8_activations` hint); its barrier counts exactly under stress; its workers stop
when it is closed; one thread keeps the serial program.
"""
from __future__ import annotations

import dataclasses
import json
import threading
from functools import partial

import numpy as np
import pytest

import mnnllm_core
from paths import CONFIG, REFERENCE
from test_replay import greedy_with_logits

numba = pytest.importorskip("numba")

STEPS = 5


def team_serial_and_looped(threads: int, hints: dict | None = None, config: dict | None = None,
                            prompts: list | None = None) -> tuple[dict, object]:
    """Per setting (the team's ways: all ranks, rank 0 alone, chosen; serial program; per-op loop),
    per prompt (tokens, logits), on one load of the shared model at memory "low" (and `config`);
    and its runtime."""
    prompts = prompts or [p["prompt_ids"] for p in json.loads(REFERENCE.read_text())["prompts"][:2]]
    llm = mnnllm_core.create(str(CONFIG))
    llm.set_config({"backend_type": "cpu", "memory": "low", "sampler_type": "greedy", "thread_num": threads,
                    "backend_hints": hints or {}, **(config or {})})
    llm.load()
    runtime = llm.runtime_manager.runtime
    runs = {}
    for name, replay, team in (("team", True, "team"), ("solo", True, "solo"), ("auto", True, "auto"),
                               ("serial", True, None), ("loop", False, None)):
        runtime.hints = dataclasses.replace(runtime.hints, replay=replay, cpu_thread_team=team is not None)
        if team:
            runtime.team().way = team
        llm.pool.clear()
        runs[name] = [greedy_with_logits(llm, ids, STEPS) for ids in prompts]
        decode = llm.pool.get(1, False).static_module.session.pipeline
        assert decode.replayed is replay
        if replay:
            runs[f"{name} replay"] = decode.replay
    return runs, runtime


def assert_same(runs: dict, names: tuple[str, ...]) -> None:
    for name in names[1:]:
        for (tokens, logits), (other_tokens, other_logits) in zip(runs[names[0]], runs[name]):
            assert tokens == other_tokens, name
            for a, b in zip(logits, other_logits):
                np.testing.assert_array_equal(a, b, err_msg=name)


def team_programs(replay) -> int:
    return sum(isinstance(call, partial) and getattr(call.func, "__name__", "") == "run"
               and hasattr(call.func, "__self__") for call in replay.calls)


@pytest.mark.parametrize("hints", [{}, {"cpu_int8_activations": True}], ids=["int4", "int8_activations"])
def test_two_threads_give_the_serial_programs_and_the_loops_logits(hints) -> None:
    runs, runtime = team_serial_and_looped(2, hints)
    try:
        assert_same(runs, ("loop", "team", "solo", "auto", "serial"))
        team, serial = runs["team replay"], runs["serial replay"]
        # the programs with linears (the layers', the logits') on the team, the others (RoPE's
        # position arithmetic) on the calling thread
        assert team.team is runtime._team is not None and 2 <= team_programs(team) < team.programs
        assert serial.team is None and team_programs(serial) == 0 and serial.programs == team.programs
        workers = runtime._team.workers
    finally:
        runtime.close_team()
    # this team's workers stopped (other tests' runtimes may still hold teams of their own)
    assert workers and not any(worker.is_alive() for worker in workers)


def test_a_deep_step_splits_its_attention_and_keeps_the_bits() -> None:
    """A prompt of 300 tokens, fp32 KV (DECODE_ATTEND) and int8 KV (attention_mode 10, STORED_ATTEND,
    whose serial kernel splits 300 keys in 2 spans): team, rank 0 alone, serial, loop give the same
    logits."""
    from mnnllm_backends.cpu.kernels import program

    prompt = json.loads(REFERENCE.read_text())["prompts"][0]["prompt_ids"]
    prompt = (prompt * (300 // len(prompt) + 1))[:300]
    for config, op in (({}, program.DECODE_ATTEND), ({"attention_mode": 10}, program.STORED_ATTEND)):
        runs, runtime = team_serial_and_looped(2, config=config, prompts=[prompt])
        try:
            assert_same(runs, ("loop", "team", "solo", "auto", "serial"))
            rows = [row for call in runs["team replay"].calls
                    if isinstance(call, partial) and getattr(call.func, "__name__", "") == "run"
                    for row in call.arrays[1]]  # a team program's code
            assert any(row[0] == op and row[program.PART_KERNEL] for row in rows), config
        finally:
            runtime.close_team()


def test_three_ranks_write_their_own_cache_rows_and_keep_the_bits() -> None:
    """Three ranks over the shared model's 9 heads and 3 kv heads: each rank writes the new cache
    rows of its own kv head (fp32 KV and int8 KV); team, rank 0 alone, serial, loop give the same
    logits."""
    from mnnllm_backends.cpu.kernels.decode_attention import parts_write_own_rows

    assert parts_write_own_rows(9, 3, 3) and not parts_write_own_rows(9, 3, 2)
    for config in ({}, {"attention_mode": 10}):
        runs, runtime = team_serial_and_looped(3, config=config)
        try:
            assert_same(runs, ("loop", "team", "solo", "auto", "serial"))
        finally:
            runtime.close_team()


@pytest.mark.parametrize("heads, kv_heads", [(9, 3), (8, 4)])
@pytest.mark.parametrize("length", [1, 300, 1024, 2100])
def test_attention_parts_give_the_serial_kernels_bits(length, heads, kv_heads) -> None:
    """Each one-token attention's parts (`append_decode_deep_part`, `append_decode_part`,
    `append_attend_stored_part`) write the serial kernel's cache rows and give its bits, at depths
    of one span, of 2 and 4 spans and past SPLIT_FROM (the fp32 cache's key split): 9 heads over 3
    kv heads in two parts (4 and 5 heads: the middle kv head's group straddles them, so part -1
    writes every row first), and 8 over 4 (each part writes the rows it reads, so either part may
    run first). Below SPLIT_FROM the kernels without the split give the splitting ones' bits."""
    from mnnllm_backends.cpu.kernels.attention import (SPLIT_FROM, append_decode, append_decode_deep,
                                                       append_decode_deep_part, append_decode_part)
    from mnnllm_backends.cpu.kernels.decode_attention import (append_attend_stored, append_attend_stored_part,
                                                              parts_write_own_rows)

    dim, capacity = 64, 2112
    own_rows = parts_write_own_rows(heads, kv_heads, 2)
    assert own_rows == (heads % 2 == 0)
    parts = (1, 0) if own_rows else (-1, 0, 1)
    rng = np.random.default_rng(length)
    q, k, v = (rng.standard_normal((1, h, dim), np.float32) for h in (heads, kv_heads, kv_heads))
    past, scale, sinks = np.array([length - 1]), np.float32(dim ** -0.5), rng.standard_normal(heads, np.float32)
    keys_t = rng.standard_normal((kv_heads, dim, capacity), np.float32)
    values = rng.standard_normal((kv_heads, capacity, dim), np.float32)
    codes = rng.integers(-128, 128, (kv_heads, capacity, dim), np.int8)
    rows = rng.random((kv_heads, capacity), np.float32)
    for sink in (sinks, np.zeros(0, np.float32)):
        serial, parted = np.zeros((1, heads, dim), np.float32), np.full((1, heads, dim), np.nan, np.float32)
        caches = [(keys_t.copy(), values.copy()) for _ in range(2)]
        append_decode_deep(q, k, v, *caches[0], past, scale, sink, serial, 2)
        for part in parts:
            append_decode_deep_part(q, k, v, *caches[1], past, scale, sink, parted, 2, part, 2)
        np.testing.assert_array_equal(caches[0][0], caches[1][0])
        np.testing.assert_array_equal(caches[0][1], caches[1][1])
        np.testing.assert_array_equal(serial, parted)
        if length < SPLIT_FROM:
            short, short_parted = np.zeros_like(serial), np.full_like(parted, np.nan)
            shorts = [(keys_t.copy(), values.copy()) for _ in range(2)]
            append_decode(q, k, v, *shorts[0], past, scale, sink, short, 2)
            for part in parts:
                append_decode_part(q, k, v, *shorts[1], past, scale, sink, short_parted, 2, part, 2)
            for a, b in zip((*shorts[0], *shorts[1], short, short_parted), (*caches[0], *caches[0], serial, serial)):
                np.testing.assert_array_equal(a, b)
        for stored_values, v_rows in ((codes, rows), (values, np.zeros((0, 0), np.float32))):
            serial, parted = np.zeros((1, heads, dim), np.float32), np.full((1, heads, dim), np.nan, np.float32)
            stores = [(codes.copy(), rows.copy(), rows.copy(), stored_values.copy(), v_rows.copy(), v_rows.copy())
                      for _ in range(2)]
            append_attend_stored(q, k, v, *stores[0], past, scale, sink, serial, 2)
            for part in parts:
                append_attend_stored_part(q, k, v, *stores[1], past, scale, sink, parted, 2, part, 2)
            for a, b in zip(*stores):
                np.testing.assert_array_equal(a, b)
            np.testing.assert_array_equal(serial, parted)


def test_parts_write_own_rows_where_no_group_straddles_two() -> None:
    from mnnllm_backends.cpu.kernels.decode_attention import parts_write_own_rows

    assert parts_write_own_rows(32, 32, 2) and parts_write_own_rows(32, 8, 4) and parts_write_own_rows(16, 8, 2)
    assert not parts_write_own_rows(9, 3, 2) and not parts_write_own_rows(32, 8, 3)
    assert parts_write_own_rows(9, 3, 1) and parts_write_own_rows(9, 3, 3)


def test_one_thread_keeps_the_serial_program() -> None:
    llm = mnnllm_core.create(str(CONFIG))
    llm.set_config({"backend_type": "cpu", "memory": "low", "sampler_type": "greedy", "thread_num": 1})
    llm.load()
    greedy_with_logits(llm, json.loads(REFERENCE.read_text())["prompts"][0]["prompt_ids"], 3)
    replay = llm.pool.get(1, False).static_module.session.pipeline.replay
    assert llm.runtime_manager.runtime.team() is None and replay.team is None
    assert replay.programs >= 1 and team_programs(replay) == 0


def test_the_barrier_counts_exactly_and_the_workers_stop() -> None:
    """Every rank adds 1 per generation, then passes a barrier and checks the total; many times,
    on more ranks than cores, and with every wait asleep; then the team's workers are joined on close."""
    from mnnllm_backends.cpu.kernels import team as team_module
    from mnnllm_backends.cpu.kernels.team import barrier, fetch_add, load_acquire

    @numba.njit(nogil=True)
    def count(state, counter, threads, generations, wrong):
        for g in range(generations):
            fetch_add(counter, 1)
            barrier(state, threads)
            if load_acquire(counter) != threads * (g + 1):
                fetch_add(wrong, 1)
            barrier(state, threads)

    for threads, spins in ((2, team_module.SPINS), (3, team_module.SPINS), (2, 0)):  # 0: every wait sleeps
        state, cells = team_module.new_state(spins), np.zeros(16, np.int64)
        address, cell = state.ctypes.data, cells.ctypes.data
        generations = 20000
        workers = [threading.Thread(target=count, args=(address, cell, threads, generations, cell + 64))
                   for _ in range(threads - 1)]
        for worker in workers:
            worker.start()
        count(address, cell, threads, generations, cell + 64)
        for worker in workers:
            worker.join()
        assert cells[0] == threads * generations and cells[8] == 0
        assert state[team_module.ARRIVED] == 0 and state[team_module.PASSED] == 2 * generations

    team = team_module.Team(3)
    assert team.alive and len(team.workers) == 2
    team.close()
    assert not team.alive
    with pytest.raises(ValueError):
        team_module.Team(1)


def test_programs_of_the_same_code_share_one_way() -> None:
    """A batched step recorded again (other slots in its rows, as requests come and go) is a new
    program of the same code: it keeps the way chosen instead of starting a trial of its own, and
    the team's ways stay as many as the step shapes, not as the recordings."""
    from mnnllm_backends.cpu.kernels.team import TRIAL, WARM, Team, describe
    from mnnllm_backends.cpu.kernels.program import WIDTH, array_table

    tables = [array_table([np.zeros(1, dtype)]) for dtype in (np.float32, np.uint8, np.float32, np.uint16, np.int64)]
    code, scalars = np.zeros((0, WIDTH), np.int64), np.zeros(1)
    descriptors = [describe(code, scalars, tables) for _ in range(3)]  # the same empty program, three times
    team = Team(2)
    try:
        for descriptor in descriptors:
            for _ in range(TRIAL):
                team.run(descriptor.__array_interface__["data"][0], "the same code")
        assert len(team.ways) == 1 and team.ways["the same code"].runs == 3 * TRIAL
        team.run(descriptors[0].__array_interface__["data"][0])  # no key: its address names it
        assert len(team.ways) == 2
    finally:
        team.close()

    llm = mnnllm_core.create(str(CONFIG))  # int8 activations: every batched step replays as team programs
    llm.set_config({"backend_type": "cpu", "memory": "low", "sampler_type": "greedy", "thread_num": 2,
                    "backend_hints": {"cpu_int8_activations": True}})
    llm.load()
    from mnnllm_core.llm.batch_engine import BatchEngine
    engine = BatchEngine(llm, slots=4)
    sampler = llm.make_sampler({"sampler_type": "greedy", "banned_tokens": sorted(llm.tokenizer.stop_ids)})
    for i in range(16):  # 16 requests of 8 to 20 tokens through 4 slots: the slots in the rows keep changing
        engine.submit([1] + [(1000 + 997 * i + 31 * j) % 40000 + 50 for j in range(15)], 8 + 3 * (i % 5), sampler)
    engine.run()
    runtime = llm.runtime_manager.runtime
    try:
        runs = [way.runs for way in runtime.team().ways.values()]
        # keyed by address (each recording its own way) the busiest way ran 37 times and 86 % of
        # the runs were in trials (42 ways); keyed by code the step shapes keep theirs (13 ways, 28 %)
        trial = WARM + 2 * TRIAL
        assert max(runs) > 4 * TRIAL and sum(min(r, trial) for r in runs) < sum(runs) / 2, runs
    finally:
        runtime.close_team()


def _trial(way, team_seconds: float, solo_seconds: float, slow_first: int = 0) -> list[bool]:
    """The ways of one trial's runs on `way` (`_Way`), each team run taking `team_seconds` (the
    first `slow_first` timed ones 10x that), each run on one thread `solo_seconds`."""
    from mnnllm_backends.cpu.kernels.team import TRIAL, WARM

    ways, slow = [], slow_first
    for _ in range(WARM + 2 * TRIAL):
        together, timed = way.next()
        ways.append(together)
        if timed:
            seconds = team_seconds if together else solo_seconds
            if together and slow > 0:
                seconds, slow = 10 * team_seconds, slow - 1
            way.record(together, seconds)
    return ways


def _kept(way, runs: int) -> list[bool]:
    """The ways of the next `runs` runs, none timed."""
    ways = []
    for _ in range(runs):
        together, timed = way.next()
        assert not timed
        ways.append(together)
    return ways


def test_the_way_warms_the_team_before_timing_and_alternates() -> None:
    from mnnllm_backends.cpu.kernels.team import TRIAL, WARM, _Way

    way = _Way()
    ways = [way.next() for _ in range(WARM + 2 * TRIAL)]
    assert ways[:WARM] == [(True, False)] * WARM  # the workers' wake-up, untimed
    assert ways[WARM:] == [(True, True), (False, True)] * TRIAL


def test_the_team_is_kept_unless_one_thread_is_clearly_faster() -> None:
    from mnnllm_backends.cpu.kernels.team import KEEP, MARGIN, SOLO_KEEP, _Way

    way = _Way()
    _trial(way, 1.0, 1.0 - MARGIN / 2)  # one thread a little faster: within the noise
    assert way.together and _kept(way, KEEP) == [True] * KEEP
    way = _Way()
    _trial(way, 1.0, 1.5, slow_first=3)  # the team's first runs slow (wake-up, page faults): the median holds
    assert way.together
    way = _Way()
    _trial(way, 1.0, 0.5, slow_first=2)  # ... and one thread never wins before the whole trial ran
    assert not way.together and way.keep == SOLO_KEEP


def test_a_busy_core_keeps_one_thread_and_tries_the_team_again_sooner() -> None:
    """Where the other core is taken the team's runs wait for time slices: one thread wins, is
    kept SOLO_KEEP runs, then twice as long at each win in a row, up to KEEP; the team, once it
    wins again, is kept KEEP runs."""
    from mnnllm_backends.cpu.kernels.team import EARLY, KEEP, SOLO_KEEP, TRIAL, WARM, _Way

    way = _Way()
    keep = SOLO_KEEP
    while keep <= KEEP:
        _trial(way, 2.0, 1.0)
        assert not way.together and way.keep == min(keep, KEEP)
        assert _kept(way, way.keep) == [False] * way.keep
        if keep == KEEP:
            break
        keep = min(2 * keep, KEEP)
    ways = _trial(way, 1.0, 1.6)  # the core is free again: the team clearly faster, the trial cut short
    assert ways == [True] * WARM + [True, False] * EARLY + [True] * (2 * TRIAL - 2 * EARLY)
    assert way.together and way.keep == KEEP and _kept(way, KEEP - 2 * TRIAL + 2 * EARLY) == [True] * (
        KEEP - 2 * TRIAL + 2 * EARLY)
    _trial(way, 2.0, 1.0)  # taken again: the doubling starts over
    assert not way.together and way.keep == SOLO_KEEP


# A process that loads the GEMV kernels from the disk cache, then compiles a new caller of the
# block sums itself (as a test of another weight format does), then runs the team's part kernel.
_AFTER_A_COMPILE = """
import numpy as np, numba
from mnnllm_backends.cpu.kernels import linear
from mnnllm_backends.cpu.kernels.layout import PackedWeight
from mnnllm_backends.cpu.kernels.simd import GROUP_ROWS
rng = np.random.default_rng(3)
oc, ic, block = 4 * GROUP_ROWS, 576, 64
w = PackedWeight(4, oc, ic, block, rng.integers(0, 256, oc * ic // 2, dtype=np.uint8),
                 rng.standard_normal(2 * oc * ic // block).astype(np.float16).view(np.uint16))
x = rng.standard_normal(ic).astype(np.float32)
gemv = linear.Gemv([w])
alone = gemv(x, 1)[0].copy()
numba.njit(lambda x, n, b: linear._block_sums(x, n, b))(x, w.n_blocks, w.block)
for part in range(2):
    linear._gemv_part(w.bits, gemv.codes, gemv.alphas, gemv.targets, gemv.starts, x, w.n_blocks, w.block, part, 2)
print(float(np.abs(gemv.results[0] - alone).max()))
"""


def test_the_part_kernels_bits_do_not_depend_on_what_the_process_compiled_before() -> None:
    """test_batch_replay's team logits differed from the loop's (~1e-6) when test_cpu_low_memory
    ran first: compiling a GEMV of another format loaded `_block_sums` alone, whose copy then
    served the part kernel loaded after it and summed in another order (fastmath). The first
    process fills the disk cache if needed; the second loads the kernels from it, as a test run does."""
    import subprocess
    import sys
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", _AFTER_A_COMPILE], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
    assert float(done.stdout.split()[-1]) == 0.0
