"""The JIT compiler's code pages handed back once the cpu kernels are loaded
(`backends/cpu/kernels/warmup.py`, `release_compiler_pages`): libllvmlite's read-only mappings
without private copies leave this process's resident set even while another process maps the
same pages, relocated read-only data stays, and the kernels still run, a compile too (the pages
fault back in)."""
import subprocess
import sys

import numpy as np
import pytest

from mnnllm_backends.cpu.kernels import warmup

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise and /proc/self/smaps: Linux")


def resident_kib(clean: bool) -> int:
    """Rss of libllvmlite's read-only mappings with no private copy (clean) or with some."""
    total, mapping = 0, None
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if not fields[0].endswith(":"):
                mapping = fields if len(fields) >= 6 and "llvmlite" in fields[5] and fields[1][1] != "w" else None
            elif mapping is not None and fields[0] == "Rss:":
                rss = int(fields[1])
            elif mapping is not None and fields[0] == "Anonymous:":
                total += rss if (int(fields[1]) == 0) == clean else 0
    return total


def test_the_compilers_pages_leave_the_process_while_another_maps_them_and_kernels_still_run():
    from numba import njit

    from mnnllm_backends.cpu.kernels.activation import mul_silu
    a, b = np.linspace(-3, 3, 64, dtype=np.float32), np.linspace(2, -2, 64, dtype=np.float32)
    out = np.empty_like(a)
    mul_silu(a, b, out)
    assert njit(lambda x: x * 2)(3) == 6  # a compile here: LLVM's code resident again (an earlier load released it)
    holder = subprocess.Popen([sys.executable, "-c", "from numba import njit; njit(lambda x: x + 1)(1); "
                               "import sys; print('ready', flush=True); sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:  # it maps libllvmlite and touches its code too: MADV_PAGEOUT alone skips pages another process maps
        assert holder.stdout.readline().strip() == "ready"
        assert resident_kib(clean=True) > 1024
        relocated = resident_kib(clean=False)
        assert warmup.release_compiler_pages() > 0
        assert resident_kib(clean=True) < 1024 and resident_kib(clean=False) == relocated
    finally:
        holder.communicate("")
    again = np.empty_like(a)
    mul_silu(a, b, again)
    assert np.array_equal(again, out) and njit(lambda x: x - 2)(3) == 1  # LLVM's pages fault back in
