"""The backend author's contract (as docs/DESIGN.md states it): one public module that backends
and plugins import and nothing else of mnnllm, and the machinery it provides once for every
backend (buffer reuse, KV cache bookkeeping, settings a backend ignores, static shapes declared
in one place)."""
from __future__ import annotations

import ast
import json
import logging
from pathlib import Path

import numpy as np
import pytest

import mnnllm_core.backend_api as api
from mnnllm_core.core.backend import Runtime, ScheduleConfig
from mnnllm_core.core.tensor import Tensor
from mnnllm_core.errors import BackendError
from mnnllm_core.express import runtime_manager
from mnnllm_core.express.runtime_manager import RuntimeManager
from mnnllm_core.plugins.manager import registry

ROOT = Path(__file__).resolve().parents[1]
PUBLIC = "mnnllm_core.backend_api"


def mnnllm_imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
        found += [(node.lineno, name) for name in names if name.split(".")[0] in ("mnnllm_core", "mnnllm_backends")]
    return found


def sources(folder: str) -> list[Path]:
    return sorted(p for p in (ROOT / folder).rglob("*.py") if "build" not in p.parts)


def test_backends_and_plugins_import_only_the_public_module_of_mnnllm() -> None:
    """Their tests may use the conformance suite too, and drive a model through the user's API
    (`mnnllm_core.create`); backends never reach into each other."""
    checked, wrong = 0, []
    for path in sources("backends") + sources("plugins"):
        allowed = {PUBLIC, "mnnllm_core.testing", "mnnllm_core"} if "tests" in path.parts else {PUBLIC}
        for line, name in mnnllm_imports(path):
            checked += 1
            if name not in allowed:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert checked >= 20 and not wrong, wrong


def test_everything_the_public_module_lists_is_there_and_nothing_public_is_unlisted() -> None:
    missing = [name for name in api.__all__ if not hasattr(api, name)]
    unlisted = [name for name in vars(api) if not name.startswith("_") and name not in api.__all__
                and name != "annotations"]
    assert not missing and not unlisted, (missing, unlisted)


class Storage:
    def __init__(self, key):
        self.key = key


def tensor(index: int, shape: tuple) -> Tensor:
    return Tensor(index, f"t{index}", shape, np.dtype(np.float32))


def test_the_buffer_pool_reuses_a_released_buffer_of_the_same_key_and_never_hands_one_out_twice() -> None:
    made = []
    pool = api.BufferPool(lambda t: made.append(Storage(t.shape)) or made[-1], lambda t: t.shape)
    a, b, c, d = tensor(0, (2, 3)), tensor(1, (2, 3)), tensor(2, (4,)), tensor(3, (2, 3))
    a.storage = pool.acquire(a)
    pool.release(a)
    pool.release(a)  # released twice (read twice by its last command): pooled once
    b.storage, c.storage, d.storage = pool.acquire(b), pool.acquire(c), pool.acquire(d)
    assert b.storage is a.storage and c.storage is not a.storage and d.storage is not b.storage
    assert len(made) == 3
    freed = []
    pool = api.BufferPool(lambda t: Storage(t.shape), lambda t: t.shape, freed.append)
    a.storage = pool.acquire(a)
    pool.release(a)
    pool.clear()
    assert freed == [a.storage] and pool.acquire(b) is not a.storage


class ListCache(api.KVCache):
    min_capacity = 4

    def __init__(self) -> None:
        super().__init__()
        self.rows, self.grown = [], []

    def grow(self, capacity: int) -> None:
        self.grown.append(capacity)
        self.rows = self.rows[:self.length]

    def write(self, k, v, seq: int) -> None:
        self.rows = self.rows[:self.length] + list(k)


def test_the_kv_cache_drops_what_the_meta_removes_and_grows_by_doubling() -> None:
    cache, meta = ListCache(), api.KVMeta()
    meta.add = 3
    assert cache.begin_step(meta) == 0
    cache.append([0, 1, 2], None, 3)
    meta.sync()
    meta.remove, meta.add = 1, 3  # a rejected guess: keep 2 of 3, add 3
    assert cache.begin_step(meta) == 2
    cache.append([3, 4, 5], None, 3)
    meta.sync()
    assert cache.rows == [0, 1, 3, 4, 5] and cache.length == 5 == meta.previous
    assert cache.grown == [4, 8] and cache.capacity == 8


def test_a_setting_the_backend_ignores_is_logged_once(caplog, monkeypatch) -> None:
    monkeypatch.setattr(runtime_manager, "_REPORTED", set())
    config = ScheduleConfig(backend_type="cpu", thread_num=1)
    config.backend_config.precision = "high"
    with caplog.at_level(logging.INFO, logger="mnnllm_core.express.runtime_manager"):
        RuntimeManager.create(config)
        RuntimeManager.create(config)
    ignored = [r.getMessage() for r in caplog.records if "ignores" in r.getMessage()]
    assert sorted(ignored) == ["backend cpu ignores power=normal (it honours: attention_mode, memory, thread_num)",
                               "backend cpu ignores precision=high (it honours: attention_mode, memory, thread_num)"]


def test_static_shapes_is_declared_by_the_runtime_creator_alone() -> None:
    assert not hasattr(Runtime, "static_shapes")
    for name, creator in registry().runtime_creators().items():
        if creator.is_available()[0]:
            manager = RuntimeManager.create(ScheduleConfig(backend_type=name, thread_num=1))
            assert manager.static_shapes is bool(creator.static_shapes) and not hasattr(manager.runtime,
                                                                                        "static_shapes")


def test_an_error_moved_to_the_config_key_that_caused_it_keeps_its_type_and_message() -> None:
    err = BackendError("backend 'x' is not available: no driver", field="backend_type")
    moved = err.at(file="config.json", field="backend_type")
    assert type(moved) is BackendError and moved.reason == err.reason
    assert str(moved) == "backend 'x' is not available: no driver (file config.json, field backend_type)"


@pytest.mark.parametrize("name", ["cpu", "opencl", "vulkan"])
def test_each_backend_keeps_one_layout_runtime_device_and_ops_by_family(name: str) -> None:
    """The op families are the modules ops/__init__.py gathers the creators of."""
    folder = ROOT / "backends" / name
    assert (folder / "runtime.py").exists() and (folder / "ops" / "__init__.py").exists()
    assert name == "cpu" or (folder / "device.py").exists()
    gathered = ast.parse((folder / "ops" / "__init__.py").read_text()).body
    families = [a.name for node in gathered if isinstance(node, ast.ImportFrom) and node.level == 1
                for a in node.names]
    assert len(families) >= 5
    for family in families:
        path = folder / "ops" / f"{family}.py"
        last = ast.parse(path.read_text()).body[-1]
        assert isinstance(last, ast.Assign) and last.targets[0].id == "CREATORS", \
            f"{path.relative_to(ROOT)} must end with its creators"


def mnnllm(*args: str):
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-m", "mnnllm_core.cli", *args], capture_output=True, text=True,
                          timeout=600)


def test_test_backend_prints_a_table_and_a_summary_and_exits_0_when_nothing_fails() -> None:
    done = mnnllm("test-backend", "cpu", "--op", "Cast")
    assert done.returncode == 0, done.stderr
    assert "| Cast | float32 -> int32 truncates toward zero | float32 | pass | exact |  |" in done.stdout
    assert "5/5 passed, 0 failed, 0 not supported" in done.stdout  # the Cast cases, float32 -> float32 too


def test_test_backend_perf_times_each_op_and_json_has_every_field() -> None:
    done = mnnllm("test-backend", "cpu", "--perf", "--op", "RoPE", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["backend"] == "cpu" and len(report["results"]) == 2
    for row in report["results"]:
        assert row["status"] == "pass" and row["us_per_run"] > 0
        assert set(row) == {"op", "case", "dtype", "status", "reason", "error", "tolerance", "matches", "us_per_run"}


def test_test_backend_names_the_op_types_when_none_matches() -> None:
    done = mnnllm("test-backend", "cpu", "--op", "NoSuchOp")
    assert done.returncode != 0 and "op types: " in done.stderr and "Convolution" in done.stderr
