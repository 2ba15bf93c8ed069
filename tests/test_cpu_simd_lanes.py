"""The cpu kernels' vector width (`kernels.SIMD_LANES`: 16 lanes where the cores run 512-bit
vectors at full rate, else 8) changes their speed, never their bits: the lanes run over output
rows (GEMV, few-token GEMV, dequantized panels) or columns (GEMM), never across a sum. The shared
model's logits at both widths, in fresh processes, bit for bit."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("numba")

from mnnllm_backends.cpu import kernels  # noqa: E402
from paths import CONFIG  # noqa: E402

# a 7-token prefill (panels + GEMM), three one-token steps (GEMV), a 4-token step (few-token GEMV)
PROBE = """
import sys, numpy as np
from mnnllm_backends.cpu.kernels import SIMD_LANES
from mnnllm_core.llm.create import create
llm = create(sys.argv[1]); llm.set_config({"thread_num": 2, "memory": "low"}); llm.load()
steps = [[1, 504, 3458, 282, 4350, 30, 2], [28], [351], [905], [12, 13, 14, 15]]
logits = [np.asarray(llm.forward(ids), np.float32).ravel() for ids in steps]
np.save(sys.argv[2], np.concatenate(logits))
print(SIMD_LANES)
"""


def host_wide() -> bool:
    return kernels.host_has("avx512f")


def logits_at(lanes: int, tmp_path) -> np.ndarray:
    out = tmp_path / f"logits{lanes}.npy"
    env = {**os.environ, "MNNLLM_SIMD_LANES": str(lanes)}
    run = subprocess.run([sys.executable, "-c", PROBE, str(CONFIG), str(out)], env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split()[-1] == str(lanes)
    return np.load(out)


def test_lanes_follow_the_host_and_the_override():
    from llvmlite import binding
    if os.environ.get("MNNLLM_SIMD_LANES"):
        pytest.skip("MNNLLM_SIMD_LANES is set for this run")
    expected = 16 if host_wide() and binding.get_host_cpu_name() not in kernels.HALF_RATE_512 else 8
    assert kernels.SIMD_LANES == expected
    script = "from mnnllm_backends.cpu.kernels import SIMD_LANES; print(SIMD_LANES)"
    for wanted, got in (("8", "8"), ("16", "16" if host_wide() else "8"), ("32", str(expected))):
        run = subprocess.run([sys.executable, "-c", script], env={**os.environ, "MNNLLM_SIMD_LANES": wanted},
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 0 and run.stdout.strip() == got, (wanted, run.stdout, run.stderr[-2000:])


@pytest.mark.skipif(not host_wide(), reason="no AVX-512F: this cpu runs the kernels at 8 lanes only")
def test_logits_are_the_same_bits_at_8_and_16_lanes(tmp_path):
    eight, sixteen = logits_at(8, tmp_path), logits_at(16, tmp_path)
    assert eight.shape == sixteen.shape == (5 * 49152,)
    assert np.isfinite(eight).all()
    assert np.array_equal(eight.view(np.uint32), sixteen.view(np.uint32))
