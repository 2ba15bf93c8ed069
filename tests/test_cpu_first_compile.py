"""The cpu kernels' first compile on a machine (an empty numba cache): announced with its expected
duration, split over compile processes that fill the shared disk cache, and not repeated: later
processes (with 2 threads or 1) load every kernel from the cache and announce nothing."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("numba")

SCRIPT = """
import logging, sys
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
from mnnllm_core.steps import show_steps
show_steps()
from mnnllm_backends.cpu import kernels
from mnnllm_backends.cpu.kernels import warmup
threads = int(sys.argv[1])
kernels.set_threads(threads)
warmup.warm_up(threads)
stats = [d.stats for name, module in list(sys.modules.items()) if name.startswith("mnnllm_backends.cpu.kernels")
         for d in vars(module).values() if hasattr(getattr(d, "stats", None), "cache_misses")]
print("compiled here:", sum(sum(s.cache_misses.values()) for s in stats))
print("loaded:", sum(sum(s.cache_hits.values()) for s in stats))
"""


def _warm_up(cache, threads: int = 2) -> subprocess.CompletedProcess:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache)}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(threads)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return done


@pytest.mark.slow
def test_the_first_compile_is_announced_parallel_and_cached_for_the_next_process(tmp_path):
    first = _warm_up(tmp_path)
    assert "mnnllm: compiling the cpu kernels for this machine, once: about" in first.stderr
    assert "mnnllm: compiled the cpu kernels in " in first.stderr
    assert list(tmp_path.glob("warm-*-parallel"))
    if (os.cpu_count() or 1) > 1:  # the other processes compiled their parts, which this one loaded
        assert "loaded: 0" not in first.stdout
    for threads in (2, 1):  # the parallel warm-up loaded the one-thread kernels too
        again = _warm_up(tmp_path, threads)
        assert "compiling" not in again.stderr
        assert "compiled here: 0" in again.stdout


@pytest.mark.parametrize("threads", [1, 2])
def test_the_replay_program_calls_kernels_the_warm_up_loaded_with_the_same_types(threads):
    """run_program calls kernels by address for fixed signatures (kernels/program.SIGNATURES):
    those of the warm-up's calls, else a replay's first recording would compile (fp32 alphas,
    which the warm-up does not load, are left to their first use, as in the per-op loop)."""
    from mnnllm_backends.cpu.kernels import (activation, attention, decode_attention, linear, norm, rope, set_threads,
                                             warmup)
    from mnnllm_backends.cpu.kernels.program import SIGNATURES
    set_threads(threads)
    for run, _ in warmup.PARTS.values():
        run(threads)
    kernels = {"gemv_half": linear._gemv, "norm": norm.normalize_rows, "add_norm": norm.add_normalize_rows,
               "rope": rope.rope_qk, "mul_silu": activation.mul_silu, "attend": attention.append_attend,
               "decode": attention.append_decode, "stored_i8": decode_attention.append_attend_stored,
               "stored_f32": decode_attention.append_attend_stored}
    if threads > 1:
        kernels["gemv_half_parallel"] = linear._gemv_parallel
    for name, kernel in kernels.items():
        assert SIGNATURES[name].args in kernel.overloads, name
        assert kernel.overloads[SIGNATURES[name].args].signature == SIGNATURES[name], name
