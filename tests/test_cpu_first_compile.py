"""The cpu kernels' first compile on a machine (an empty numba cache): announced with its expected
duration, split over compile processes that fill the shared disk cache, and not repeated: later
processes load every kernel from the cache and announce nothing (one thread after a parallel
warm-up too), or compile only the parts they lack. Only the parts a runtime's settings run are
compiled. The process that started the compile runs the same code as the later ones (bit for bit):
it compiles nothing itself (see `kernels/warmup.py`)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("numba")

SCRIPT = """
import hashlib, logging, os, sys
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
import numpy as np
from mnnllm_core.steps import show_steps
show_steps()
from mnnllm_backends.cpu import kernels
from mnnllm_backends.cpu.kernels import attention, linear, warmup
from mnnllm_backends.cpu.kernels.layout import PackedWeight
threads = int(sys.argv[1])
kernels.set_threads(threads)
os.cpu_count = lambda: 2  # two compile processes whatever the machine (a split that compiled the GEMV here)
warmup.warm_up(threads, [*warmup.parts_for(threads), "few_tokens"])
stats = [d.stats for name, module in list(sys.modules.items()) if name.startswith("mnnllm_backends.cpu.kernels")
         for d in vars(module).values() if hasattr(getattr(d, "stats", None), "cache_misses")]
print("compiled here:", sum(sum(s.cache_misses.values()) for s in stats))
print("loaded:", sum(sum(s.cache_hits.values()) for s in stats))
# the shared model's q, k, v shapes (ic 576, blocks of 64), random codes and fp16 alphas
rng = np.random.default_rng(7)
x, rows = rng.standard_normal(576, np.float32), rng.standard_normal((3, 576), np.float32)
digest = hashlib.sha256()
for bits in (4, 8):
    gemv = linear.Gemv([PackedWeight(bits, oc, 576, 64, rng.integers(0, 256, oc * 576 * bits // 8, dtype=np.uint8),
                                     (rng.standard_normal(oc * 18) / 32).astype(np.float16).view(np.uint16))
                        for oc in (576, 192, 192)])
    for worth in (False, True):
        gemv.parallel_worth = worth
        digest.update(b"".join(r.tobytes() for r in gemv(x, threads) + gemv.few(rows, threads)))
    out = np.zeros((3, 576), np.float32)
    linear.matmul(gemv.first, rows, out, threads)
    digest.update(out.tobytes())
q, out = rng.standard_normal((2, 9, 64), np.float32), np.zeros((2, 9, 64), np.float32)
attention.attend(q, rng.standard_normal((3, 64, 64), np.float32), rng.standard_normal((3, 64, 64), np.float32), 40,
                 np.float32(0.125), np.zeros(0, np.float32), out)
print("results:", digest.update(out.tobytes()) or digest.hexdigest())
"""


def _warm_up(cache, threads: int = 2) -> subprocess.CompletedProcess:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache)}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(threads)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return done


@pytest.fixture(scope="module")
def first_compile(tmp_path_factory) -> tuple:
    """An empty cache, and the output of the process whose warm-up compiled the kernels into it."""
    cache = tmp_path_factory.mktemp("numba")
    return cache, _warm_up(cache)


def _line(done: subprocess.CompletedProcess, label: str) -> str:
    return next(line for line in done.stdout.splitlines() if line.startswith(label))


@pytest.mark.slow
def test_the_first_compile_is_announced_parallel_and_cached_for_the_next_process(first_compile):
    cache, first = first_compile
    assert "mnnllm: compiling the cpu kernels for this machine, once: about" in first.stderr
    assert "mnnllm: compiled the cpu kernels in " in first.stderr
    assert {p.name.split("-")[2] for p in cache.glob("warm-*-parallel")} == {"gemv", "few_tokens", "matmul", "rows",
                                                                             "attention", "decode", "replay"}
    # the compile processes compiled every kernel, which this one loaded
    assert "compiled here: 0" in first.stdout and "loaded: 0" not in first.stdout
    again = _warm_up(cache, 2)
    assert "compiling" not in again.stderr and "compiled here: 0" in again.stdout
    serial = _warm_up(cache, 1)  # the parallel warm-up loaded the one-thread kernels too
    assert "compiling" not in serial.stderr and "compiled here: 0" in serial.stdout
    assert not list(cache.glob("warm-*-serial"))


def test_the_kernels_imported_under_another_name_cache_apart(tmp_path):
    """numba's cache entries name the kernels' module: the same files imported under another
    package name (as `backends.cpu` from the source tree) must not share a cache folder with
    `mnnllm_backends.cpu`."""
    from pathlib import Path

    from mnnllm_backends.cpu import kernels
    (tmp_path / "other_name").symlink_to(Path(kernels.__file__).resolve().parents[2], target_is_directory=True)
    code = "import sys; sys.path.insert(0, sys.argv[1]); import other_name.cpu.kernels as k; print(k.SOURCE_DIGEST)"
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] != kernels.SOURCE_DIGEST


def test_a_runtime_loads_only_the_parts_its_settings_run():
    from mnnllm_backends.cpu.kernels import warmup
    assert warmup.parts_for(1) == warmup.parts_for(2) == ["gemv", "matmul", "rows", "attention", "replay", "decode"]
    assert warmup.parts_for(2, kv_stored=True)[-1] == "stored"
    assert ("int8" in warmup.parts_for(2, int8_activations=True)) == warmup.int8_dot.supported()
    # the processes get parts of about equal time, "decode" after the `attend` of "attention"
    shares = warmup._balanced(warmup.parts_for(2), 2)
    assert sorted(sum(shares, [])) == sorted(warmup.parts_for(2))
    totals = [sum(warmup.PARTS[part].seconds for part in share) for share in shares]
    assert max(totals) - min(totals) < 2.0
    [with_decode] = [share for share in shares if "decode" in share]
    assert with_decode.index("attention") < with_decode.index("decode")


@pytest.mark.slow
def test_the_process_that_compiled_the_kernels_computes_the_same_bits_as_one_loading_them(first_compile):
    """A kernel compiled in a process calls the kernels it calls compiled there, one loaded from
    the cache calls the copies linked into it: the GEMVs differed in their last bits (5.7e-5 on
    the shared model's logits), a whole step once rounded into an int8 KV cache."""
    cache, first = first_compile
    assert _line(_warm_up(cache), "results:") == _line(first, "results:")


@pytest.mark.parametrize("threads", [1, 2])
def test_the_replay_program_calls_kernels_the_warm_up_loaded_with_the_same_types(threads):
    """run_program calls kernels by address for fixed signatures (kernels/program.SIGNATURES):
    those of the warm-up's calls, else a replay's first recording would compile (fp32 alphas,
    which the warm-up does not load, are left to their first use, as in the per-op loop)."""
    from mnnllm_backends.cpu.kernels import (activation, attention, decode_attention, int8_dot, linear, norm, program,
                                             rope, set_threads, warmup)
    from mnnllm_backends.cpu.kernels.program import SIGNATURES
    set_threads(threads)
    for part in warmup.PARTS.values():
        part.run(threads)
    kernels = [("gemv_half", linear._gemv), ("few_half", linear._few_gemv), ("norm", norm.normalize_rows),
               ("add_norm", norm.add_normalize_rows), ("rope", rope.rope_qk), ("mul_silu", activation.mul_silu),
               ("attend", attention.append_attend), ("decode", attention.append_decode),
               ("decode", attention.append_decode_deep), ("stored_i8", decode_attention.append_attend_stored),
               ("stored_f32", decode_attention.append_attend_stored), ("instruction", program.stored_instruction)]
    if threads > 1:  # with the thread team's attention parts
        kernels += [("gemv_half_parallel", linear._gemv_parallel), ("decode_part", attention.append_decode_part),
                    ("decode_part", attention.append_decode_deep_part),
                    ("stored_i8_part", decode_attention.append_attend_stored_part),
                    ("stored_f32_part", decode_attention.append_attend_stored_part),
                    ("gemv_half_part", linear._gemv_part), ("few_half_part", linear._few_gemv_part),
                    ("part", program.stored_instruction_part)]
    if int8_dot.supported():  # the int8 linears (`cpu_int8_activations`)
        kernels += [("int8_half", int8_dot.linear), ("instruction", program.int8_instruction)]
        if threads > 1:
            kernels += [("int8_half_parallel", int8_dot.linear_parallel), ("int8_half_part", int8_dot.linear_part),
                        ("part", program.int8_instruction_part)]
    for name, kernel in kernels:
        assert SIGNATURES[name].args in kernel.overloads, name
        assert kernel.overloads[SIGNATURES[name].args].signature == SIGNATURES[name], name


_CALL = """
import sys
import numpy as np
from mnnllm_backends.cpu.kernels import attention, decode_attention
rng = np.random.default_rng(0)
q = rng.standard_normal((1, 2, 16), np.float32)  # two query heads over one kv head
k, v = rng.standard_normal((2, 1, 1, 16), np.float32)
keys_t, values = rng.standard_normal((1, 16, 64), np.float32), rng.standard_normal((1, 64, 16), np.float32)
past, out, none = np.array([40], np.int64), np.zeros((1, 2, 16), np.float32), np.zeros(0, np.float32)
if sys.argv[1] == "split":
    decode_attention.attend_split(q[0], keys_t, values, 40, np.float32(0.25), none, out[0], 2)
else:
    attention.append_decode_deep(q, k, v, keys_t, values, past, np.float32(0.25), none, out, 1)
print("done", float(out.sum()))
"""


def test_a_kernel_compiled_beside_a_cached_parallel_one_loads_in_a_fresh_process(tmp_path) -> None:
    """numba saves a kernel without its hook that starts the parallel runtime on load when a
    parallel kernel it calls was loaded from the cache rather than compiled in that process (the
    warm-up's compile processes fill one cache): its calls into the runtime are then left at
    address 0 in a process that has not started it. A process that first calls such a kernel
    (here `append_decode_deep`, calling `attend_split`) must not crash: importing the kernels starts
    the runtime."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}

    def call(which: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", _CALL, which], env=env, capture_output=True, text=True,
                              timeout=600)

    assert call("split").returncode == 0  # caches the parallel kernel alone
    first = call("decode")  # compiles append_decode_deep beside the cached attend_split
    assert first.returncode == 0, first.stderr
    again = call("decode")  # loads both from the cache
    assert again.returncode == 0, f"exit status {again.returncode}: {again.stderr[-2000:]}"
    assert again.stdout == first.stdout
