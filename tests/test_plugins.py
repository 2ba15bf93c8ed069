"""Backends as plugins, seen from outside: the distributions in plugins/ installed with pip
into a folder of their own (found through PYTHONPATH, site-packages untouched), listed by
`mnnllm backends`, running the shared model; and plugins that break in each documented way
(raise at import, fail their probe, unknown name) without breaking mnnllm or cpu."""
from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import mnnllm_core
from mnnllm_core.errors import BackendError
from mnnllm_core.plugins.manager import reset_registry
from paths import CONFIG, REFERENCE

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = ROOT / "plugins"
PROMPTS = json.loads(REFERENCE.read_text())["prompts"]
HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch is not importable (pip install torch)")


def mnn_tokens(index: int, count: int = 64) -> list[int]:
    return PROMPTS[index]["mnn_cpp_q4_memory_normal"]["gen_ids"][:count]


def clean_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("MNNLLM_PLUGINS", "MNNLLM_DISABLE_PLUGIN_AUTOLOAD")}
    env.update(extra)
    return env


def python(code: str, env: dict, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=timeout)


def backends_json(env: dict) -> dict:
    done = subprocess.run([sys.executable, "-m", "mnnllm_core.cli", "backends", "--json"], capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """plugins/mnnllm-minimal and plugins/mnnllm-torch, pip-installed (from copies, so no
    build/ lands in the tree) into one folder that PYTHONPATH puts on the path."""
    target = tmp_path_factory.mktemp("site")
    for name in ("mnnllm-minimal", "mnnllm-torch"):
        source = tmp_path_factory.mktemp("src") / name
        shutil.copytree(PLUGINS / name, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
        done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                               "--no-index", "--target", str(target), str(source)],
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
    return target


def site_env(site: Path, **extra: str) -> dict:
    return clean_env(PYTHONPATH=os.pathsep.join([str(site), str(ROOT / "tests")]), **extra)


# -- installation and discovery ------------------------------------------------------

def test_a_pip_target_install_is_an_entry_point_importlib_metadata_sees(site):
    code = ("import json; from importlib import metadata; print(json.dumps(sorted("
            "[e.name, e.value, e.dist.name] for e in metadata.entry_points(group='mnnllm'))))")
    done = python(code, site_env(site))
    assert done.returncode == 0, done.stderr
    entries = json.loads(done.stdout)
    assert ["torch", "mnnllm_torch.plugin", "mnnllm-torch"] in entries
    assert ["minimal", "mnnllm_minimal", "mnnllm-minimal"] in entries
    assert ["cpu", "mnnllm_backends.cpu.plugin", "mnnllm"] in entries


def test_backends_json_lists_the_installed_plugins_with_version_devices_and_availability(site):
    report = backends_json(site_env(site))
    rows = {row["name"]: row for row in report["backends"]}
    assert report["plugin_errors"] == []
    minimal = rows["minimal"]
    assert (minimal["plugin"], minimal["version"], minimal["available"], minimal["static_shapes"]) == (
        "minimal", "0.1.0", True, False)
    assert (minimal["settings"], rows["cpu"]["settings"], rows["torch"]["settings"]) == (
        [], ["attention_mode", "memory", "thread_num"], ["thread_num"])
    assert minimal["devices"] == ["host memory (numpy)"]
    torch_row = rows["torch"]
    assert (torch_row["plugin"], torch_row["version"], torch_row["static_shapes"]) == ("torch", "0.1.0", False)
    if HAS_TORCH:
        assert torch_row["available"] and torch_row["reason"] == ""
        assert torch_row["devices"][0].startswith("cpu (torch ")
    else:
        assert not torch_row["available"] and "torch is not importable" in torch_row["reason"]
    assert rows["cpu"]["available"]


def test_disabling_autoload_hides_entry_point_plugins_but_loads_the_named_ones(site):
    report = backends_json(site_env(site, MNNLLM_DISABLE_PLUGIN_AUTOLOAD="1", MNNLLM_PLUGINS="mnnllm_minimal"))
    assert [row["name"] for row in report["backends"]] == ["minimal"]
    assert report["backends"][0]["version"] == "0.1.0"


@needs_torch
def test_the_torch_plugins_own_tests_pass_against_the_installed_distribution(site):
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:benchmark",
                           str(PLUGINS / "mnnllm-torch" / "tests")], capture_output=True, text=True,
                          env=site_env(site), cwd=PLUGINS / "mnnllm-torch", timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


# -- the shared model through the torch plugin -----------------------------------------

MODEL_RUN = """
import json, time
import mnnllm_core
from mnnllm_core.errors import BackendError
from paths import CONFIG, REFERENCE, SHARED

MOE_CONFIG = SHARED / "models" / "arch" / "tiny-qwen3_moe-mnn-q4" / "config.json"
prompts = json.loads(REFERENCE.read_text())["prompts"]
report = {}
for backend in ("torch", "cpu"):
    llm = mnnllm_core.create(CONFIG)
    llm.set_config({"backend_type": backend, "sampler_type": "greedy", "thread_num": 2})
    llm.load()
    rows = []
    for prompt in prompts:
        llm.reset()
        gen = llm.generate(prompt["prompt_ids"], 64)
        ctx = llm.context
        rows.append({"gen_ids": gen, "prompt_len": ctx.prompt_len, "prefill_us": ctx.prefill_us,
                     "decode_us": ctx.decode_us, "gen_seq_len": ctx.gen_seq_len})
    report[backend] = {"rows": rows, "placement": llm.placement(),
                       "device": llm.runtime_manager.runtime.device_name()}
for name, config in (("smollm2", CONFIG), ("moe", MOE_CONFIG)):
    strict = mnnllm_core.create(config)
    strict.set_config({"backend_type": "torch", "allow_fallback": False})
    try:
        strict.load()
        report[name + "_strict_error"] = None
    except BackendError as err:
        report[name + "_strict_error"] = str(err)
moe = mnnllm_core.create(MOE_CONFIG)  # MoE and Qwen3's q/k norms: a model torch runs only partly
moe.set_config({"backend_type": "torch", "thread_num": 2})
moe.load()
moe.forward([1, 2, 3])
moe.forward([4])
report["moe_placement"] = moe.placement()
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def torch_run(site) -> dict:
    done = python(MODEL_RUN, site_env(site), timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@needs_torch
@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(PROMPTS)))
def test_torch_gives_the_greedy_tokens_of_cpu_and_mnn_for_64_tokens(torch_run, index):
    torch_ids = torch_run["torch"]["rows"][index]["gen_ids"]
    assert torch_ids == torch_run["cpu"]["rows"][index]["gen_ids"] == mnn_tokens(index)


@needs_torch
@pytest.mark.slow
def test_torch_runs_every_op_of_the_shared_model_and_loads_it_with_allow_fallback_false(torch_run):
    placement = torch_run["torch"]["placement"]
    assert placement["ops_per_backend"] == {"torch": 382} and placement["copies"] == 0
    on_torch = placement["op_types_per_backend"]["torch"]
    assert on_torch["Convolution"] == 211 and on_torch["Attention"] == 30 and on_torch["RoPE"] == 30
    assert torch_run["smollm2_strict_error"] is None


@needs_torch
@pytest.mark.slow
def test_torch_placement_uses_both_backends_and_says_why_each_op_fell_back(torch_run):
    placement = torch_run["moe_placement"]
    assert placement["ops_per_backend"]["torch"] > 0 and placement["ops_per_backend"]["cpu"] > 0
    on_torch = placement["op_types_per_backend"]["torch"]
    assert {"Convolution", "LayerNorm", "BinaryOp", "Raster", "Attention"} <= set(on_torch)
    assert {"RoPE", "MoE", "TopKV2"} <= set(placement["op_types_per_backend"]["cpu"])
    assert placement["copies"] > 0
    reasons = {(f["type"], f["to"], f["reason"]) for f in placement["fallbacks"]}
    assert ("RoPE", "cpu", "torch refused this RoPE: per-head q/k norms stay on cpu") in reasons
    assert ("MoE", "cpu", "torch has no MoE kernel") in reasons


@needs_torch
@pytest.mark.slow
def test_placement_lists_a_fallback_reason_for_every_op_type_on_cpu(torch_run):
    """Ops created at load (Attention, weighted ops) fall back then; the summary after a
    resize must still list them."""
    placement = torch_run["moe_placement"]
    assert {f["type"] for f in placement["fallbacks"]} == set(placement["op_types_per_backend"]["cpu"])


@needs_torch
@pytest.mark.slow
def test_allow_fallback_false_on_torch_is_a_backend_error_naming_the_op(torch_run):
    message = torch_run["moe_strict_error"]
    assert message is not None and "allow_fallback is false" in message
    assert "cannot run on torch" in message and "MoE" in message


@needs_torch
def test_backend_hints_in_the_config_reach_the_torch_runtime(site):
    code = textwrap.dedent("""
        import mnnllm_core
        from mnnllm_core.errors import BackendError
        from paths import CONFIG
        llm = mnnllm_core.create(CONFIG)
        llm.set_config({"backend_type": "torch", "backend_hints": {"torch_device": "nosuchdevice"}})
        try:
            llm.load()
        except BackendError as err:
            print(err)
    """)
    done = python(code, site_env(site))
    assert "backend 'torch' cannot use its device: a matmul on torch device 'nosuchdevice' failed" in done.stdout, \
        done.stderr[-2000:]


# -- plugins written by the test, named by MNNLLM_PLUGINS ------------------------------

BROKEN_AT_IMPORT = """
raise RuntimeError("libmydevice.so: cannot open shared object file")
"""

FAILING_PROBE = """
from mnnllm_core.backend_api import RuntimeCreator, hookimpl


class BrokenCreator(RuntimeCreator):
    name = "broken"

    def is_available(self):
        return False, "the probe kernel failed to compile: no device"

    def create(self, config, hints=None):
        raise AssertionError("an unavailable backend must never be created")


@hookimpl
def mnnllm_register_runtime_creators():
    return [BrokenCreator()]
"""

STATIC_SHAPES = """
from mnnllm_core.backend_api import HostBackend, Runtime, RuntimeCreator, hookimpl


class StaticBackend(HostBackend):
    name = "static"


class StaticRuntime(Runtime):
    name = "static"

    def create_backend(self, config):
        return StaticBackend(self, config)


class StaticCreator(RuntimeCreator):
    name = "static"
    static_shapes = True

    def is_available(self):
        return True, ""

    def create(self, config, hints=None):
        return StaticRuntime(config, hints)


@hookimpl
def mnnllm_register_runtime_creators():
    return [StaticCreator()]
"""

EXTRA_OPS = """
import numpy as np
from mnnllm_core.backend_api import Execution, hookimpl


class Trig(Execution):
    def __init__(self, backend, function):
        super().__init__(backend)
        self.function = function

    def on_execute(self, inputs, outputs):
        outputs[0].storage[...] = self.function(inputs[0].storage)


def create_unary(backend, inputs, outputs, op):
    function = {"SIN": np.sin, "COS": np.cos}.get(op.param.operation)
    return None if function is None else Trig(backend, function)


@hookimpl
def mnnllm_register_op_creators(backend_name):
    return {"UnaryOp": create_unary} if backend_name == "minimal" else {}
"""


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    """Write plugin modules, name them in MNNLLM_PLUGINS, and give this test a fresh registry.
    The minimal example is imported from its source folder."""
    sources = {"mnnllm_test_broken_import": BROKEN_AT_IMPORT, "mnnllm_test_failing_probe": FAILING_PROBE,
               "mnnllm_test_static": STATIC_SHAPES, "mnnllm_test_extra_ops": EXTRA_OPS}
    for name, source in sources.items():
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(PLUGINS / "mnnllm-minimal"))

    def use(*names: str) -> dict:
        monkeypatch.setenv("MNNLLM_PLUGINS", ",".join(names))
        reset_registry()
        return clean_env(MNNLLM_PLUGINS=",".join(names),
                         PYTHONPATH=os.pathsep.join([str(tmp_path), str(PLUGINS / "mnnllm-minimal")]))

    yield use
    monkeypatch.delenv("MNNLLM_PLUGINS")
    reset_registry()


def load(backend_type: str, **config):
    llm = mnnllm_core.create(CONFIG)
    llm.set_config({"backend_type": backend_type, "sampler_type": "greedy", "thread_num": 2, **config})
    return llm.load()


def test_a_plugin_that_raises_at_import_is_reported_and_mnnllm_and_cpu_still_work(plugins):
    env = plugins("mnnllm_test_broken_import")
    report = backends_json(env)
    (error,) = report["plugin_errors"]
    assert error["plugin"] == "mnnllm_test_broken_import"
    assert error["error"] == "RuntimeError: libmydevice.so: cannot open shared object file"
    assert "mnnllm_test_broken_import.py" in error["traceback"] and "line 2" in error["traceback"]
    assert {row["name"]: row["available"] for row in report["backends"]}["cpu"]
    done = python("import mnnllm_core; print('imported')", env)
    assert done.stdout.strip() == "imported", done.stderr
    assert load("cpu").generate(PROMPTS[0]["prompt_ids"], 8) == mnn_tokens(0, 8)


def test_the_text_listing_shows_the_import_error_and_its_traceback(plugins):
    done = subprocess.run([sys.executable, "-m", "mnnllm_core.cli", "backends"], capture_output=True, text=True,
                          env=plugins("mnnllm_test_broken_import"), timeout=300)
    assert done.returncode == 0, done.stderr
    assert ("plugin mnnllm_test_broken_import failed to load: RuntimeError: libmydevice.so: "
            "cannot open shared object file") in done.stdout
    assert "mnnllm_test_broken_import.py\", line 2" in done.stdout


def test_a_backend_whose_probe_fails_is_listed_unavailable_and_selecting_it_is_a_backend_error(plugins):
    report = backends_json(plugins("mnnllm_test_failing_probe"))
    row = {row["name"]: row for row in report["backends"]}["broken"]
    assert (row["available"], row["reason"], row["devices"]) == (
        False, "the probe kernel failed to compile: no device", [])
    with pytest.raises(BackendError, match=r"backend 'broken' is not available: the probe kernel failed to "
                                           r"compile: no device; other registered backends: .*cpu") as err:
        load("broken")
    assert err.value.field == "backend_type" and err.value.file == "set_config"  # where the value came from


def test_an_unknown_backend_type_lists_the_available_backends(plugins):
    plugins("mnnllm_test_failing_probe")
    with pytest.raises(BackendError, match=r"unknown backend 'nosuch'; available backends: [^;]*\bcpu\b") as err:
        load("nosuch")
    assert "registered but unavailable: broken (the probe kernel failed to compile: no device)" in str(err.value)


def test_a_fallback_list_skips_an_unavailable_backend_with_a_warning(plugins, caplog):
    plugins("mnnllm_test_failing_probe")
    with caplog.at_level(logging.WARNING, logger="mnnllm_core"):
        llm = load("broken,cpu")
    assert llm.runtime_manager.config.backend_type == "cpu"
    assert any("backend broken unavailable" in r.getMessage() and "no device" in r.getMessage()
               for r in caplog.records)
    assert llm.generate(PROMPTS[0]["prompt_ids"], 8) == mnn_tokens(0, 8)


def test_a_plugin_declaring_static_shapes_gets_shape_mutable_false_and_no_resize_between_decode_steps(plugins):
    plugins("mnnllm_test_static")
    llm = load("static")
    assert llm.module.static_module.shape_mutable is False
    assert load("cpu").module.static_module.shape_mutable is True
    prompt = PROMPTS[1]
    assert llm.generate(prompt["prompt_ids"], 16) == mnn_tokens(1, 16)
    assert llm.pool.resize_counts() == {(len(prompt["prompt_ids"]), False): 1, (1, False): 1}


def test_the_minimal_example_runs_the_model_with_binary_ops_on_it_and_the_rest_on_cpu(plugins):
    plugins("mnnllm_minimal")
    llm = load("minimal")
    assert llm.generate(PROMPTS[1]["prompt_ids"], 64) == mnn_tokens(1)
    placement = llm.placement()
    assert set(placement["op_types_per_backend"]["minimal"]) == {"BinaryOp"}
    kinds = {(f["type"], f["reason"]) for f in placement["fallbacks"]}
    assert ("RoPE", "minimal has no RoPE kernel") in kinds
    assert ("BinaryOp", "minimal refused this BinaryOp") in kinds  # MUL_SILU is not in its table


def test_the_minimal_example_passes_the_conformance_suite_running_binary_ops_and_handing_the_rest_to_cpu(plugins):
    from mnnllm_core.testing import run_suite
    plugins("mnnllm_minimal")
    results = run_suite("minimal")
    assert [r.case.id for r in results if r.status == "fail"] == []
    assert all(r.matches for r in results), "the fallback to cpu must give the right numbers"
    # a case whose op is refused before any backend sees it (bad LinearAttention params) passes everywhere
    ran = {(r.case.op_type, r.case.operation) for r in results if r.status == "pass" and r.outputs is not None}
    assert ran == {("BinaryOp", op) for op in ("ADD", "SUB", "MUL", "REALDIV")}
    binary = [r for r in results if r.case.op_type == "BinaryOp" and r.case.operation in ("ADD", "SUB", "MUL")
              and r.case.dtype == "float32" and "fused" not in r.case.name]
    assert binary and all(r.status == "pass" for r in binary)
    reasons = {r.reason for r in results if r.status == "unsupported"}
    assert {"minimal has no RoPE kernel", "minimal refused this BinaryOp"} <= reasons


def test_the_minimal_example_replays_a_pipeline_wholly_on_it_with_the_per_op_loops_outputs(plugins, monkeypatch):
    """A graph of BinaryOps only (ADD, MUL, SUB, REALDIV, one input broadcast) runs wholly on
    minimal, so the core records it (MinimalReplay: the documented hooks and nothing else) once
    per resize and every run plays the replay: outputs equal to the per-op loop's bit for bit
    and to float64 numpy."""
    from mnnllm_core.testing import Graph, make_module, new_runtime
    from mnnllm_core.testing.cases.elementwise import binary_op
    plugins("mnnllm_minimal")
    import mnnllm_minimal
    played = []
    play = mnnllm_minimal.MinimalReplay.play
    monkeypatch.setattr(mnnllm_minimal.MinimalReplay, "play", lambda self: (played.append(self), play(self)))
    graph = Graph()
    x, y = graph.input("x"), graph.input("y")
    (total,) = graph.add(binary_op("ADD"), [x, y])
    (scaled,) = graph.add(binary_op("MUL"), [total, x])
    (shifted,) = graph.add(binary_op("SUB"), [scaled, y])
    (out,) = graph.add(binary_op("REALDIV"), [shifted, total])
    module = make_module(graph.schedule([out]), new_runtime("minimal"), shape_mutable=False)
    pipeline = module.session.pipeline
    rng = np.random.default_rng(11)
    for rows in (3, 3, 1, 5):
        feed = {"x": (rng.random((rows, 7)) + 0.5).astype(np.float32), "y": (rng.random((1, 7)) + 1).astype(np.float32)}
        runs = len(played)
        replayed = module.forward(feed)[0]
        assert pipeline.replayed and len(played) == runs + 1, "the run played the replay"
        pipeline.replay_enabled = False
        looped = module.forward(feed)[0]
        pipeline.replay_enabled = True
        assert len(played) == runs + 1, "the per-op loop"
        np.testing.assert_array_equal(replayed, looped)
        x64, y64 = feed["x"].astype(np.float64), feed["y"].astype(np.float64)
        np.testing.assert_allclose(replayed, ((x64 + y64) * x64 - y64) / (x64 + y64), rtol=1e-5, atol=1e-6)
    assert pipeline.placement.ops == {"minimal": 4} and pipeline.records == 3, "recorded once per resize"
    assert [type(r) for r in played] == [mnnllm_minimal.MinimalReplay] * 4


def test_test_backend_prints_the_table_and_json_for_a_plugin_backend(plugins):
    env = plugins("mnnllm_minimal")
    command = [sys.executable, "-m", "mnnllm_core.cli", "test-backend", "minimal", "--op", "BinaryOp"]
    table = subprocess.run(command + ["--case", "MUL_SILU (7, 17)"], capture_output=True, text=True, env=env,
                           timeout=300)
    assert table.returncode == 0, table.stderr
    assert "| BinaryOp | MUL_SILU (7, 17) x (7, 17) | float32 | not supported | - | minimal refused this BinaryOp |" \
        in table.stdout
    done = subprocess.run(command + ["--json"], capture_output=True, text=True, env=env, timeout=300)
    report = json.loads(done.stdout)
    statuses = {(r["case"], r["status"]) for r in report["results"]}
    assert ("ADD (7, 17) x (7, 17)", "pass") in statuses and ("MUL_SILU (7, 17) x (7, 17)", "unsupported") in statuses
    assert report["backend"] == "minimal" and report["device"] == "host memory (numpy)"


def test_a_plugin_can_add_op_creators_to_a_backend_it_does_not_own(plugins):
    plugins("mnnllm_minimal", "mnnllm_test_extra_ops")
    llm = load("minimal")
    assert llm.generate(PROMPTS[0]["prompt_ids"], 8) == mnn_tokens(0, 8)
    assert llm.placement()["op_types_per_backend"]["minimal"]["UnaryOp"] == 2


def test_the_plugins_readme_shows_the_minimal_backend_verbatim():
    readme = (PLUGINS / "README.md").read_text()
    for name in ("mnnllm_minimal.py", "pyproject.toml"):
        assert (PLUGINS / "mnnllm-minimal" / name).read_text() in readme, f"plugins/README.md is out of date: {name}"
