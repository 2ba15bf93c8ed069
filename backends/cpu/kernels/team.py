"""A team of threads that runs a replayed step's program together (`Team`), so that every linear
of a decode step splits its rows over the threads without waking a thread pool per call.

numba's parallel kernels (`prange`) launch the OpenMP pool on each call: the sleeping threads
wake in tens of microseconds, more than a small GEMV takes, so one-token GEMVs under 2 MiB run
on one thread (`linear.parallel_pays`) and most of a small model's weights stream from one core.
Here threads-1 workers stay in a compiled loop (`work`, GIL released) for the team's life; the
caller is rank 0. For each program run rank 0 publishes the program (`lead`: its descriptor's
address, then a new generation) and every rank walks the same instructions (`run_rank`): a
linear (GEMV, few-token GEMV, int8 linear) gives each rank the part of its rows that
`_gemv_parallel` (`linear_parallel`) gives the same thread, computed by the same `_rows`
(`_members`); each rank quantizes the int8 linear's rows into its own copy where the scratch
holds one per rank (`int8_dot.own_rows`; else rank 0 does, once, and the others wait); one token's attention
(DECODE_ATTEND, STORED_ATTEND) gives each rank a share of the query heads, computed by the code
the serial kernel runs for each head (`append_decode_part`, `append_attend_stored_part`), each
rank first writing the new cache rows of the kv heads its query heads read where no kv head's
group straddles two ranks (`parts_write_own_rows`: no rank then waits for another's rows, and the
rows a rank reads are in its own cache: the 1.7B shape's attentions at two threads took 2.8-3.1
ms of a ~35 ms step with rank 0 writing every row alone, 1.1-1.5 ms so), else after rank 0 wrote
them all; the attentions of a
batched step's KV slots (JOINS) run as one, each rank computing its heads of each; every other
instruction runs on rank 0. A barrier separates an instruction from the next when either is
split (the next reads rows another thread wrote); a run of single-thread instructions needs
none, and rank 0 writes an instruction's part -1 straight after its own instructions (one
barrier then publishes both). Each element is thus computed by the code the serial program
runs: the logits are the serial replay's bit for bit.

Synchronisation is an int64 state array (`STATE_SIZE`, fields on their own cache lines) read and
written with atomics (`fetch_add`, `load_acquire`, `store_release`): a counting barrier whose
waiters spin with `pause` for SPINS turns (`MNNLLM_TEAM_SPINS`), then sleep on a futex (Linux; a
short nap elsewhere) until the last rank wakes them (a system call only when someone sleeps). Spinning alone starves
a loaded machine: a rank waiting on a preempted one would hold its core for the whole time slice.
Between programs a worker spins the same way, then sleeps until rank 0 publishes the next one,
so an idle engine does not hold a core. The kernels are the ones the serial program calls by
address (`program.run_part`, `program.run_instruction`), and `run_rank` calls those by address
too, as `lead` and `work` call `run_rank` (`RANK_AT`), so each of them compiles quickly.
"""
from __future__ import annotations

import logging
import os
import platform
import sys
import threading
import time
import weakref

import numpy as np
from llvmlite import ir
from numba import carray, types
from numba.core import cgutils
from numba.extending import intrinsic

from . import jit
from .decode_attention import parts_write_own_rows
from .int8_dot import own_rows
from .program import (DECODE_ATTEND, FEW_GEMV, GEMV, INT8_LINEAR, JOINS, STORED_ATTEND, WIDTH, _pointer,
                      array_table, instruction_at, kernel_address, part_at, rank_at, runner_address)

# state fields, a cache line each: the program (written by rank 0 once a run) and the workers
# asleep waiting for one; the barrier's count; its passes and the ranks asleep waiting for one;
# the timeout of a sleep (a timespec: no lost wake-up stalls a rank longer, STOP is seen within it)
GENERATION, PROGRAM, STOP, IDLE_SLEEPERS, IDLE_SLEEPS = 0, 1, 2, 3, 4
ARRIVED = 8
PASSED, SLEEPERS, SLEEPS = 16, 17, 18  # SLEEPS, IDLE_SLEEPS: sleeps so far (for profiling)
TIMEOUT, SPIN_TURNS = 24, 26
# the addresses of `run_rank`, `program.run_instruction` and `program.run_part` (written once, by
# `new_state`): the loops call them through these rather than link them in, which made numba
# optimize the whole program runner again for each of `run_rank`, `lead` and `work`
RANK_AT, INSTRUCTION_AT, PART_AT = 27, 28, 29
STATE_SIZE = 32
# pause turns of a wait before the rank sleeps (SPIN_TURNS, read at run time)
SPINS = int(os.environ.get("MNNLLM_TEAM_SPINS", 1 << 10))  # ~60 us on a 2-core EPYC (pause ~57 ns)
TIMEOUT_NS = 10_000_000
DESCRIPTOR = 14  # int64 fields of a program's descriptor: address and rows of code, scalars and the 5 tables
_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}.get(platform.machine().lower())
_FUTEX = _FUTEX if sys.platform.startswith("linux") else None  # elsewhere a sleep is a 50 us nap
_FUTEX_WAIT, _FUTEX_WAKE = 128, 129  # the _PRIVATE operations: waiters of this process only

_I64 = ir.IntType(64)
_X86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "x86")
_log = logging.getLogger(__name__)


def _slot(builder, address):
    return builder.inttoptr(address, _I64.as_pointer())


@intrinsic
def load_acquire(typingctx, address):
    """The int64 at `address`, read after every write released before it."""
    def codegen(context, builder, sig, args):
        return builder.load_atomic(_slot(builder, args[0]), "acquire", 8)
    return types.int64(types.int64), codegen


@intrinsic
def store_release(typingctx, address, value):
    """Write the int64 at `address` after every write before it."""
    def codegen(context, builder, sig, args):
        builder.store_atomic(args[1], _slot(builder, args[0]), "release", 8)
        return context.get_dummy_value()
    return types.none(types.int64, types.int64), codegen


@intrinsic
def fetch_add(typingctx, address, value):
    """Add `value` to the int64 at `address` atomically; the value before."""
    def codegen(context, builder, sig, args):
        return builder.atomic_rmw("add", _slot(builder, args[0]), args[1], "acq_rel")
    return types.int64(types.int64, types.int64), codegen


@intrinsic
def pause(typingctx):
    """A spin-wait hint (x86 `pause`: the sibling hyperthread runs, the memory order is kept)."""
    def codegen(context, builder, sig, args):
        if _X86:
            function = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                                      "llvm.x86.sse2.pause")
            builder.call(function, [])
        return context.get_dummy_value()
    return types.none(), codegen


def _syscall(builder, *args):
    function = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_I64, [_I64] * 6), "syscall")
    return builder.call(function, [*args] + [ir.Constant(_I64, 0)] * (6 - len(args)))


@intrinsic
def sleep_while(typingctx, address, value, timeout):
    """Sleep while the int64 at `address` holds `value` (its low 32 bits: a futex), at most the
    timespec at `timeout`; may return early. Without futexes, a 50 us nap."""
    def codegen(context, builder, sig, args):
        if _FUTEX is None:
            int32 = ir.IntType(32)
            function = cgutils.get_or_insert_function(builder.module, ir.FunctionType(int32, [int32]), "usleep")
            builder.call(function, [ir.Constant(int32, 50)])
        else:
            expected = builder.and_(args[1], ir.Constant(_I64, 0xFFFFFFFF))
            _syscall(builder, ir.Constant(_I64, _FUTEX), args[0], ir.Constant(_I64, _FUTEX_WAIT), expected, args[2])
        return context.get_dummy_value()
    return types.none(types.int64, types.int64, types.int64), codegen


@intrinsic
def wake_all(typingctx, address):
    """Wake every thread asleep in `sleep_while` on `address`."""
    def codegen(context, builder, sig, args):
        if _FUTEX is not None:
            _syscall(builder, ir.Constant(_I64, _FUTEX), args[0], ir.Constant(_I64, _FUTEX_WAKE),
                     ir.Constant(_I64, 0x7FFFFFFF))
        return context.get_dummy_value()
    return types.none(types.int64), codegen


@jit()
def wait_change(state, field, value, sleepers):
    """Wait until state field `field` no longer holds `value`: spin SPINS turns, then sleep
    (counted in field `sleepers`, so that the writer wakes the sleepers, and only when there are;
    the field after it counts the sleeps)."""
    spins, turns = 0, load_acquire(state + SPIN_TURNS * 8)
    while load_acquire(state + field * 8) == value:
        if spins < turns:
            pause()
            spins += 1
        else:
            fetch_add(state + sleepers * 8, 1)  # a full barrier: the writer's check sees it, or we see its write
            sleep_while(state + field * 8, value, state + TIMEOUT * 8)
            fetch_add(state + sleepers * 8, -1)
            fetch_add(state + (sleepers + 1) * 8, 1)


@jit()
def advance(state, field, sleepers):
    """Add 1 to state field `field` and wake the threads asleep waiting for it to change."""
    fetch_add(state + field * 8, 1)  # a full barrier before reading the sleepers
    if load_acquire(state + sleepers * 8) > 0:
        wake_all(state + field * 8)


@jit()
def barrier(state, threads):
    """Wait until all `threads` ranks arrived (state: the state array's address); a rank's writes
    before it are visible to every rank after it."""
    passed = load_acquire(state + PASSED * 8)
    if fetch_add(state + ARRIVED * 8, 1) == threads - 1:  # the last: reset the count, then let all pass
        store_release(state + ARRIVED * 8, 0)
        advance(state, PASSED, SLEEPERS)
    else:
        wait_change(state, PASSED, passed, SLEEPERS)


@jit()
def _own_rows(c, floats, codes, threads):
    """Whether int8 linear `c`'s scratch (field 4) holds a copy of the quantized rows per rank
    (`int8_dot.own_rows`, what its part kernel checks too): fields 2 token rows, 3 x, 18 blocks."""
    tokens = c[2]
    return own_rows(codes[c[4], 1], tokens, floats[c[3], 1] // tokens, c[18], threads)


@jit()
def _attention_own_rows(code, i, last, threads):
    """Whether each rank writes the new cache rows it reads in attentions i..last (a run of joined
    ones: `parts_write_own_rows` for each; fields 11, 12 (DECODE_ATTEND) or 14, 15 heads, kv heads)."""
    for j in range(i, last):
        c = code[j]
        heads, kv_heads = (c[11], c[12]) if c[0] == DECODE_ATTEND else (c[14], c[15])
        if not parts_write_own_rows(heads, kv_heads, threads):
            return False
    return True


@jit()
def run_rank(program, rank, threads, state):
    """Rank `rank`'s share of the program whose descriptor is at `program` (see `describe`), then
    the closing barrier."""
    d = carray(_pointer(program), DESCRIPTOR, np.int64)
    code = carray(_pointer(d[0]), (d[1], WIDTH), np.int64)
    scalars = carray(_pointer(d[2]), d[3], np.float64)
    floats, codes = carray(_pointer(d[4]), (d[5], 2), np.int64), carray(_pointer(d[6]), (d[7], 2), np.int64)
    reals, halves = carray(_pointer(d[8]), (d[9], 2), np.int64), carray(_pointer(d[10]), (d[11], 2), np.int64)
    ints = carray(_pointer(d[12]), (d[13], 2), np.int64)
    run_instruction = instruction_at(load_acquire(state + INSTRUCTION_AT * 8))
    run_part = part_at(load_acquire(state + PART_AT * 8))
    shared = False  # whether the previous instruction's results came from every rank
    i = 0
    while i < code.shape[0]:
        c = code[i]
        op = c[0]
        attention = op == DECODE_ATTEND or op == STORED_ATTEND
        last = i + 1  # past the instructions run together: an attention and those joining it
        if attention:
            while last < code.shape[0] and code[last, JOINS] != 0:
                last += 1
        # a part -1 first: an int8 linear's quantized rows, an attention's new cache rows (unless
        # each rank writes its own)
        first = ((attention and not _attention_own_rows(code, i, last, threads))
                 or (op == INT8_LINEAR and not _own_rows(c, floats, codes, threads)))
        split = op == GEMV or op == FEW_GEMV or op == INT8_LINEAR or attention
        if first:  # written once by rank 0, then read by every rank
            if shared:  # part -1 reads every rank's rows; else only rank 0's: no barrier before it
                barrier(state, threads)
            if rank == 0:
                for j in range(i, last):
                    run_part(code[j], scalars, floats, codes, reals, halves, ints, np.int64(-1), threads)
            barrier(state, threads)
        elif i > 0 and (split or shared):
            barrier(state, threads)
        if split:
            # joined attentions: the ranks take turns at the first part, so uneven parts even out
            for j in range(i, last):
                part = (rank + j - i) % threads
                run_part(code[j], scalars, floats, codes, reals, halves, ints, part, threads)
        elif rank == 0:
            run_instruction(c, scalars, floats, codes, reals, halves, ints)
        shared = split
        i = last
    barrier(state, threads)


@jit()
def lead(state, program, threads):
    """Rank 0: publish the program, start the workers on it, run rank 0's share and wait for theirs."""
    store_release(state + PROGRAM * 8, program)
    advance(state, GENERATION, IDLE_SLEEPERS)
    rank_at(load_acquire(state + RANK_AT * 8))(program, np.int64(0), threads, state)


@jit()
def work(state, rank, threads, seen):
    """A worker's life: each new generation (after `seen`), its rank's share of the program
    published; spinning, then sleeping while none comes; until STOP."""
    turns = load_acquire(state + SPIN_TURNS * 8)
    share = rank_at(load_acquire(state + RANK_AT * 8))  # `run_rank`
    while True:
        spins = 0
        while load_acquire(state + GENERATION * 8) == seen:
            if load_acquire(state + STOP * 8):
                return
            if spins < turns:
                pause()
                spins += 1
            else:  # `wait_change`'s sleep, one TIMEOUT at most, then STOP is looked at again
                fetch_add(state + IDLE_SLEEPERS * 8, 1)
                sleep_while(state + GENERATION * 8, seen, state + TIMEOUT * 8)
                fetch_add(state + IDLE_SLEEPERS * 8, -1)
                fetch_add(state + IDLE_SLEEPS * 8, 1)
        seen += 1  # rank 0 starts a program only once the previous one passed its closing barrier
        share(load_acquire(state + PROGRAM * 8), rank, threads, state)


def describe(code: np.ndarray, scalars: np.ndarray, tables: list[np.ndarray]) -> np.ndarray:
    """A program's descriptor (int64 [DESCRIPTOR]): the address and rows of its code, scalars and
    array tables (the caller keeps them alive)."""
    return np.array([field for array in (code, scalars, *tables)
                     for field in (array.__array_interface__["data"][0], array.shape[0])], np.int64)


def new_state(spins: int = SPINS) -> np.ndarray:
    """A team's state array: no program yet, sleeps of TIMEOUT_NS at most after `spins` turns,
    the runners' addresses."""
    state = np.zeros(STATE_SIZE, np.int64)
    state[TIMEOUT:TIMEOUT + 2] = divmod(TIMEOUT_NS, 1_000_000_000)
    state[SPIN_TURNS] = spins
    state[RANK_AT] = kernel_address(run_rank, "rank")
    state[INSTRUCTION_AT], state[PART_AT] = runner_address("instruction"), runner_address("part")
    return state


TRIAL = 8  # timed runs each way when a program's way is chosen (`Team.run`)
WARM = 2  # untimed runs on the team before a trial's timed ones (the workers wake, touch their rows)
KEEP = 1000  # runs on the team, once it won a trial, before the next trial
SOLO_KEEP = 64  # runs on rank 0 alone after its first win; doubled at each win in a row, up to KEEP
MARGIN = 0.1  # rank 0 alone wins only with a median this fraction below the team's
# the team wins at once where its first EARLY timed runs each way leave no doubt: every run on
# one thread CLEAR slower than every run on the team (a verify step's program, which runs a few
# times a reply, spent its first 16 runs half on one thread: the shared model's 3-token step
# 5.4 ms on the team, 8.3 alone). One thread never wins early: the team's first runs are the
# ones slowed by the workers' wake-up and first touches
EARLY, CLEAR = 2, 0.2
# runs of a new program after which its way is kept (its trial over, at the latest): what a
# benchmark runs untimed first, or half its timed runs of a step may be on one thread
SETTLED_AFTER = WARM + 2 * TRIAL


class _Way:
    """A program's way (on the team, or on rank 0 alone) and its trials: WARM untimed runs on
    the team, then TRIAL timed runs each way, alternating (cut short where the team is clearly
    faster: EARLY, CLEAR). The team is kept unless one thread was clearly faster (MARGIN): a
    trial whose team runs were slowed by something passing (the workers' first wake-up, page
    faults, a burst of other work) kept one thread for KEEP runs, a whole bench run at the
    one-thread rate. One thread, once chosen, is kept SOLO_KEEP runs, doubled while it keeps
    winning, so a core taken for a while costs few trials and a passing loss is soon tried
    again."""

    __slots__ = ("runs", "trial", "together", "keep", "times")

    def __init__(self) -> None:
        self.runs, self.trial, self.together, self.keep, self.times = 0, 0, True, KEEP, ([], [])

    def next(self) -> tuple[bool, bool]:
        """Whether the next run goes on the team, and whether its time is to be `record`ed."""
        cycle = self.runs - self.trial  # runs since the trial began
        self.runs += 1
        if cycle < WARM:
            return True, False
        if cycle < WARM + 2 * TRIAL:
            return (cycle - WARM) % 2 == 0, True
        if cycle + 1 == WARM + 2 * TRIAL + self.keep:
            self.trial = self.runs  # the next run begins a trial
        return self.together, False

    def record(self, together: bool, seconds: float) -> None:
        """A trial run's time; after the last, the way kept (see the class)."""
        solo, team = self.times
        self.times[together].append(seconds)
        clear = min(len(solo), len(team)) >= EARLY and min(solo) >= (1.0 + CLEAR) * max(team)
        if clear:
            self.trial = self.runs - (WARM + 2 * TRIAL)  # the trial ends here, as if run whole
        if clear or len(solo) == len(team) == TRIAL:
            was_solo = not self.together
            self.together = clear or float(np.median(solo)) >= (1.0 - MARGIN) * float(np.median(team))
            self.keep = KEEP if self.together else min(KEEP, 2 * self.keep if was_solo else SOLO_KEEP)
            _log.debug("team way: %s (median %.1f us on the team, %.1f us on one thread), for %d runs",
                       "team" if self.together else "one thread", 1e6 * float(np.median(team)),
                       1e6 * float(np.median(solo)), self.keep)
            solo.clear()
            team.clear()


class Team:
    """`threads` ranks for running programs: the calling thread (rank 0) and threads-1 workers
    started here. `close` (or the team's collection) stops and joins the workers.

    `way`: "auto" measures, per program, a few runs on the team against as many on rank 0 alone
    (`run_rank` with one part: every row by the same code, the same bits) now and then (`_Way`)
    and keeps the team unless one thread was clearly faster: on a machine whose cores are taken by other work the ranks are seldom on
    cores together and each barrier waits for a time slice, so one thread is faster there.
    "team" or "solo" force one way (also `MNNLLM_TEAM_WAY`, for measuring)."""

    def __init__(self, threads: int):
        if threads < 2:
            raise ValueError(f"a thread team takes 2 threads or more, not {threads}")
        self.threads = threads
        self.state = new_state()
        self.address = self.state.__array_interface__["data"][0]
        self.way = os.environ.get("MNNLLM_TEAM_WAY", "auto")
        self.ways: dict = {}  # program's key (`run`) -> its way
        self._lock = threading.Lock()  # one program at a time, whichever thread runs it
        self.workers = [threading.Thread(target=work, args=(self.address, rank, threads, 0), daemon=True,
                                         name=f"mnnllm-cpu-team-{rank}") for rank in range(1, threads)]
        for worker in self.workers:
            worker.start()
        self._close = weakref.finalize(self, _stop, self.state, self.workers)

    def run(self, program: int, key=None) -> None:
        """Run the program whose descriptor (`describe`) is at address `program` (see `way`).
        `key` (hashable; default the address) names the program's way: programs of the same code
        share one way and one trial, so a step recorded again (a batched step for other slots in
        its rows, as requests come and go) keeps the way chosen, where keyed by address each
        recording began a trial of its own (a churn of 16 requests through 4 slots ran 86 % of its
        programs in trials, half of those on rank 0 alone)."""
        with self._lock:
            if self.way != "auto":
                self._run(program, self.way == "team")
                return
            key = program if key is None else key
            way = self.ways.get(key)
            if way is None:
                way = self.ways[key] = _Way()
            together, timed = way.next()
            if not timed:
                self._run(program, together)
                return
            start = time.perf_counter()
            self._run(program, together)
            way.record(together, time.perf_counter() - start)

    def _run(self, program: int, together: bool) -> None:
        if together:
            lead(self.address, program, self.threads)
        else:
            run_rank(program, 0, 1, self.address)

    def close(self) -> None:
        self._close()

    @property
    def alive(self) -> bool:
        return any(worker.is_alive() for worker in self.workers)


def _stop(state: np.ndarray, workers: list[threading.Thread]) -> None:
    state[STOP] = 1
    for worker in workers:
        worker.join()


def warm_up_team() -> None:
    """Load the team's loops (a part of `warmup.PARTS`): an empty program on a team of 2."""
    tables = [array_table([np.zeros(1, dtype)]) for dtype in (np.float32, np.uint8, np.float32, np.uint16, np.int64)]
    code, scalars = np.zeros((0, WIDTH), np.int64), np.zeros(1)
    descriptor = describe(code, scalars, tables)
    team = Team(2)
    try:
        for way in ("team", "solo"):
            team.way = way
            team.run(descriptor.__array_interface__["data"][0])
    finally:
        team.close()
