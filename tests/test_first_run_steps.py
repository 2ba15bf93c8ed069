"""The first minute tells what it does: a line before each long step (exporting, compiling the cpu
kernels, building the OpenCL kernels, creating the vulkan pipelines), said only when the step will
really be long (its cache is cold). Vulkan keeps its VkPipelineCache on disk in a DeviceCache file
(keyed by device and driver, written beside and renamed, a corrupt file ignored with a warning)."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mnnllm_core.core.device_cache import DeviceCache
from mnnllm_core.steps import STEPS, announce, show_steps
from paths import SHARED

TINY_MNN = SHARED / "models" / "arch" / "tiny-gemma3_text-mnn-q4"


# -- the announcements ---------------------------------------------------------------------------
def test_show_steps_prints_announcements_on_stderr_once(capsys):
    handlers = list(STEPS.handlers)
    try:
        show_steps()
        show_steps()
        announce("doing a long thing (about 3 s)")
        assert capsys.readouterr().err == "mnnllm: doing a long thing (about 3 s)\n"
    finally:
        STEPS.handlers[:] = handlers


def test_the_cpu_backend_says_it_compiles_its_kernels_when_their_cache_is_cold(monkeypatch, caplog):
    from mnnllm_backends.cpu.kernels import numba, warmup
    from mnnllm_backends.cpu.runtime import CPURuntime
    from mnnllm_core.backend_api import ScheduleConfig
    caplog.set_level(logging.INFO, logger="mnnllm.steps")
    monkeypatch.setattr(warmup, "compiled_before", lambda part, threads: False)  # the compile loads from the cache
    CPURuntime(ScheduleConfig(thread_num=1)).low_memory_kernels()
    line, done = [r.getMessage() for r in caplog.records if r.name == "mnnllm.steps"]
    assert line.startswith("compiling the cpu kernels for this machine, once: about ") and numba.config.CACHE_DIR in line
    assert done.startswith("compiled the cpu kernels in ")
    caplog.clear()
    monkeypatch.undo()
    caplog.set_level(logging.INFO, logger="mnnllm.steps")
    CPURuntime(ScheduleConfig(thread_num=1)).low_memory_kernels()  # the marker the warm-up left
    assert not [r for r in caplog.records if r.name == "mnnllm.steps"]


def _run(backend: str, cache: Path) -> subprocess.CompletedProcess:
    from mnnllm_backends.cpu import kernels
    env = {**os.environ, "MNNLLM_CACHE": str(cache), "NUMBA_CACHE_DIR": kernels.numba.config.CACHE_DIR}
    return subprocess.run([sys.executable, "-m", "mnnllm_core.cli", "run", str(TINY_MNN), "--backend", backend,
                           "-p", "hi", "--max-new-tokens", "2"], capture_output=True, text=True, timeout=300, env=env)


def _available(name: str) -> None:
    from mnnllm_core.plugins.manager import registry
    ok, reason = registry().get(name).is_available()
    if not ok:
        pytest.skip(f"{name} unavailable: {reason}")


def test_opencl_says_it_builds_its_kernels_on_the_first_run_on_a_device_only(tmp_path):
    _available("opencl")
    first = _run("opencl", tmp_path / "cache")
    assert first.returncode == 0, first.stderr
    assert "mnnllm: building the OpenCL kernels for " in first.stderr
    assert list((tmp_path / "cache" / "opencl").glob("*.built"))
    second = _run("opencl", tmp_path / "cache")
    assert second.returncode == 0 and "building the OpenCL kernels" not in second.stderr, second.stderr


def test_vulkan_keeps_its_pipeline_cache_on_disk_and_ignores_a_corrupt_one(tmp_path):
    _available("vulkan")
    cache = tmp_path / "cache"
    first = _run("vulkan", cache)
    assert first.returncode == 0, first.stderr
    assert "mnnllm: creating the vulkan pipelines on " in first.stderr
    [file] = (cache / "vulkan").glob("*.pipelines")
    assert [p.name for p in file.parent.iterdir()] == [file.name]  # written beside, renamed: nothing left over
    second = _run("vulkan", cache)
    assert second.returncode == 0 and "creating the vulkan pipelines" not in second.stderr, second.stderr
    data = bytearray(file.read_bytes())
    data[-1] ^= 0xFF
    file.write_bytes(bytes(data))
    third = _run("vulkan", cache)
    assert third.returncode == 0, third.stderr
    assert "is ignored (its checksum does not match" in third.stderr
    assert "creating the vulkan pipelines" in third.stderr
    assert DeviceCache(file, _device_key(file)).read() is not None  # rewritten whole at exit


def _device_key(file: Path) -> str:
    """The device key a DeviceCache file holds (what a reader must ask for)."""
    import struct
    data = file.read_bytes()
    _, _, length = struct.unpack_from("<8s32sI", data)
    return data[44:44 + length].decode()


def test_the_pipeline_cache_holds_the_drivers_data_and_a_new_device_reads_it(tmp_path):
    _available("vulkan")
    from mnnllm_backends.vulkan import device as vk_device
    file_path = tmp_path / "p.pipelines"
    first = vk_device.VulkanDevice(None)
    cache = DeviceCache(file_path, first.pipeline_key)
    assert first.keep_pipelines(cache) is False
    vk_device.Compiler(first).compile("probe", (vk_device.STORAGE,), 0)
    first.save_pipelines()
    payload = cache.read()
    header_size, version, vendor = (int.from_bytes(payload[i:i + 4], "little") for i in (0, 4, 8))
    assert (header_size, version) == (32, 1) and vendor == int(first.pipeline_key.split("vendor ")[1].split()[0], 16)
    second = vk_device.VulkanDevice(None)
    assert second.keep_pipelines(DeviceCache(file_path, second.pipeline_key)) is True
    vk_device.Compiler(second).compile("probe", (vk_device.STORAGE,), 0)


# -- the cache file itself -------------------------------------------------------------------------
def test_a_device_cache_round_trips_and_refuses_another_devices_file(tmp_path, caplog):
    path = tmp_path / "dev.bin"
    DeviceCache(path, "gpu A | driver 1").write(b"compiled")
    assert DeviceCache(path, "gpu A | driver 1").read() == b"compiled"
    assert DeviceCache(path, "gpu A | driver 2").read() is None
    assert "written for another device or driver" in caplog.text


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty", "folder"])
def test_a_damaged_device_cache_is_ignored_with_a_warning(tmp_path, caplog, damage):
    path = tmp_path / "dev.bin"
    DeviceCache(path, "gpu").write(b"compiled code" * 100)
    good = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(good[:-10])
    elif damage == "flip":
        path.write_bytes(good[:60] + bytes([good[60] ^ 1]) + good[61:])
    elif damage == "garbage":
        path.write_bytes(os.urandom(len(good)))
    elif damage == "empty":
        path.write_bytes(b"")
    else:
        path.unlink()
        path.mkdir()
    with caplog.at_level(logging.WARNING):
        assert DeviceCache(path, "gpu").read() is None
    assert "device cache" in caplog.text and str(path) in caplog.text


def test_a_device_cache_that_cannot_be_written_is_only_logged(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    DeviceCache(blocker / "sub" / "dev.bin", "gpu").write(b"data")
    assert "cannot be written" in caplog.text


def test_device_caches_live_in_the_cache_folder_per_backend_and_device(tmp_path, monkeypatch):
    from mnnllm_core.core.runtime_hints import RuntimeHints
    monkeypatch.setenv("MNNLLM_CACHE", str(tmp_path))
    a = DeviceCache.for_device(RuntimeHints(), "vulkan", "device A", "pipelines")
    b = DeviceCache.for_device(RuntimeHints(), "vulkan", "device B", "pipelines")
    assert a.path.parent == tmp_path / "vulkan" and a.path != b.path and a.path.suffix == ".pipelines"
    c = DeviceCache.for_device(RuntimeHints(tmp_path="/elsewhere"), "vulkan", "device A", "pipelines")
    assert c.path == Path("/elsewhere/vulkan") / a.path.name
