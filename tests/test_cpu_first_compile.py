"""The cpu kernels' first compile on a machine (an empty numba cache): announced with its expected
duration, split over compile processes that fill the shared disk cache, and not repeated: a second
process loads every kernel from the cache and announces nothing."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("numba")

SCRIPT = """
import logging, sys
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
from mnnllm_backends.cpu import kernels
from mnnllm_backends.cpu.kernels import warmup
kernels.set_threads(2)
warmup.warm_up(2)
stats = [d.stats for name, module in list(sys.modules.items()) if name.startswith("mnnllm_backends.cpu.kernels")
         for d in vars(module).values() if hasattr(getattr(d, "stats", None), "cache_misses")]
print("compiled here:", sum(sum(s.cache_misses.values()) for s in stats))
print("loaded:", sum(sum(s.cache_hits.values()) for s in stats))
"""


def _warm_up(cache) -> subprocess.CompletedProcess:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache)}
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return done


@pytest.mark.slow
def test_the_first_compile_is_announced_parallel_and_cached_for_the_next_process(tmp_path):
    first = _warm_up(tmp_path)
    assert "compiling the cpu kernels for this machine, once: about" in first.stderr
    assert list(tmp_path.glob("warm-*-parallel"))
    if (os.cpu_count() or 1) > 1:  # the other processes compiled their parts, which this one loaded
        assert "loaded: 0" not in first.stdout
    second = _warm_up(tmp_path)
    assert "compiling" not in second.stderr
    assert "compiled here: 0" in second.stdout
