"""A model is whatever the user has: an MNN folder or config, a .gguf file, a HuggingFace folder, or
a hub id. GGUF and HF inputs are exported once into the cache (the default model's code path) and
reused while unchanged; hub ids are fetched with huggingface_hub from a local server in the hub's
URL layout (HF_ENDPOINT pointed at it: no test reaches a real hub); `list` and `rm` see both
caches; wrong inputs say what was tried."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hub_server import HubServer
from mnnllm_core.errors import ConfigError
from mnnllm_core.export import export_model, model_cache
from mnnllm_core.model_list import cached_models, remove_model
from mnnllm_core.model_source import resolve_model
from paths import MODEL_DIR, SHARED, smollm2_gguf
from test_export import hf_folder_from_gguf, random_weights, write_gguf, write_hf_folder

TINY_MNN = SHARED / "models" / "arch" / "tiny-gemma3_text-mnn-q4"
MODEL_FILES = ("llm.mnn", "llm.mnn.weight", "tokenizer.mtok", "llm_config.json")


@pytest.fixture
def cache(tmp_path) -> Path:
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "Tiny-Llama.Q8.gguf"
    write_gguf(path, random_weights("llama", True))
    return path


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory) -> Path:
    return write_hf_folder(tmp_path_factory.mktemp("hf") / "tiny-qwen2", "qwen2", random_weights("qwen2", False, 1),
                           False)


def _exports(monkeypatch) -> list[str]:
    """Count the exports resolve_model makes (the real exporter still runs)."""
    runs: list[str] = []
    real = model_cache.ensure_exported

    def counted(target, export, **kw):
        def export_counted(out):
            runs.append(str(target))
            export(out)
        return real(target, export_counted, **kw)

    monkeypatch.setattr("mnnllm_core.model_source.ensure_exported", counted)
    return runs


def _same_model(a: Path, b: Path) -> None:
    for name in MODEL_FILES:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


# -- local inputs ---------------------------------------------------------------------------
def test_an_mnn_folder_or_config_is_used_where_it_is(cache):
    assert resolve_model(str(TINY_MNN), str(cache)) == str(TINY_MNN / "config.json")
    assert resolve_model(str(TINY_MNN / "llm_config.json"), str(cache)) == str(TINY_MNN / "llm_config.json")
    assert not cache.exists()


def test_a_gguf_is_exported_once_as_export_would_and_reused(tmp_path, cache, tiny_gguf, monkeypatch):
    runs = _exports(monkeypatch)
    config = Path(resolve_model(str(tiny_gguf), str(cache)))
    assert config.parent.parent == cache / "models" and config.parent.name.startswith("tiny-llama.q8-")
    assert resolve_model(str(tiny_gguf), str(cache)) == str(config) and len(runs) == 1
    assert resolve_model(config.parent.name, str(cache)) == str(config)  # the NAME `mnnllm list` shows
    reference = export_model(str(tiny_gguf), str(tmp_path / "by-export"))
    _same_model(config.parent, Path(reference.dst))
    settings = json.loads(config.read_text())
    assert (settings["sampler_type"], settings["max_new_tokens"]) == ("greedy", 256)  # as the default model
    manifest = model_cache.read_manifest(config.parent)
    assert manifest["source"] == str(tiny_gguf.resolve()) and manifest["identity"]


def test_a_changed_gguf_is_exported_again_into_the_same_folder(tmp_path, cache, monkeypatch):
    gguf = tmp_path / "m.gguf"
    write_gguf(gguf, random_weights("llama", True, seed=1))
    runs = _exports(monkeypatch)
    first = resolve_model(str(gguf), str(cache))
    weights_before = (Path(first).parent / "llm.mnn.weight").read_bytes()
    write_gguf(gguf, random_weights("llama", True, seed=2))
    assert resolve_model(str(gguf), str(cache)) == first and len(runs) == 2
    assert (Path(first).parent / "llm.mnn.weight").read_bytes() != weights_before
    assert [p.name for p in (cache / "models").iterdir()] == [Path(first).parent.name]


def test_a_huggingface_folder_is_exported_once_as_export_would(tmp_path, cache, tiny_hf, monkeypatch):
    runs = _exports(monkeypatch)
    config = Path(resolve_model(str(tiny_hf), str(cache)))
    assert config.parent.name.startswith("tiny-qwen2-") and resolve_model(str(tiny_hf), str(cache)) == str(config)
    assert len(runs) == 1
    _same_model(config.parent, Path(export_model(str(tiny_hf), str(tmp_path / "by-export")).dst))


def test_the_exported_model_generates(cache, tiny_gguf):
    import mnnllm_core
    llm = mnnllm_core.create(resolve_model(str(tiny_gguf), str(cache))).load()
    assert len(llm.generate([1, 40, 80, 200], 4)) >= 1


@pytest.mark.parametrize("spec, words", [
    ("/nonexistent.gguf", ["not found", "/nonexistent.gguf"]),
    ("./no/such/folder", ["not found", "./no/such/folder"]),
    ("org/name/extra", ["not found", "org/name or org/name@revision"]),
])
def test_a_missing_input_says_not_found(cache, spec, words):
    with pytest.raises(ConfigError) as err:
        resolve_model(spec, str(cache))
    assert all(w in str(err.value) for w in words), str(err.value)


def test_a_folder_that_is_no_model_says_what_it_lacks(tmp_path, cache):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="neither an MNN model .* nor a HuggingFace model"):
        resolve_model(str(tmp_path / "empty"), str(cache))


def test_export_of_a_missing_gguf_says_not_found(tmp_path):
    done = _cli(["export", "/nonexistent.gguf", str(tmp_path / "out")], {})
    assert done.returncode == 2 and "not found" in done.stderr and "/nonexistent.gguf" in done.stderr


# -- hub ids ---------------------------------------------------------------------------------
def _cli(args: list[str], env: dict, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mnnllm_core.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **env})


def _resolve_in(env: dict, spec: str) -> subprocess.CompletedProcess:
    """resolve_model in a fresh process: huggingface_hub reads HF_ENDPOINT and HF_HOME at import."""
    code = ("import sys; from mnnllm_core.steps import show_steps; show_steps()\n"
            "from mnnllm_core.model_source import resolve_model\nprint(resolve_model(sys.argv[1]))")
    return subprocess.run([sys.executable, "-c", code, spec], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})


@pytest.fixture
def hub_env(tmp_path) -> dict:
    return {"HF_HOME": str(tmp_path / "hf"), "MNNLLM_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "0",
            "HF_HUB_DISABLE_TELEMETRY": "1", "HF_TOKEN": ""}


def test_an_mnn_repository_is_fetched_into_huggingface_hubs_cache_then_used_offline(hub_env):
    with HubServer({"taobao-mnn/tiny-gemma3-MNN": TINY_MNN}) as hub:
        done = _resolve_in({**hub_env, "HF_ENDPOINT": hub.endpoint}, "taobao-mnn/tiny-gemma3-MNN")
        assert done.returncode == 0, done.stderr
        config = Path(done.stdout.strip())
        assert config.name == "config.json" and config.is_relative_to(Path(hub_env["HF_HOME"]) / "hub")
        assert "fetching taobao-mnn/tiny-gemma3-MNN (MNN format) from " + hub.endpoint in done.stderr
        fetched = {r.rsplit("/", 1)[-1] for r in hub.requests if r.startswith("GET") and "/resolve/" in r}
        assert fetched == {p.name for p in TINY_MNN.iterdir()} - {"llm.mnn.json"}  # no graph dump
        _same_model(config.parent, TINY_MNN)
    offline = _resolve_in({**hub_env, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"},
                          "taobao-mnn/tiny-gemma3-MNN")
    assert offline.returncode == 0 and Path(offline.stdout.strip()) == config, offline.stderr


def test_a_huggingface_repository_is_fetched_then_exported_once(hub_env, tiny_hf):
    with HubServer({"someone/tiny-qwen2": tiny_hf}) as hub:
        env = {**hub_env, "HF_ENDPOINT": hub.endpoint}
        done = _resolve_in(env, "someone/tiny-qwen2")
        assert done.returncode == 0, done.stderr
        config = Path(done.stdout.strip())
        assert config.parent.parent == Path(hub_env["MNNLLM_CACHE"]) / "models"
        assert config.parent.name.startswith("someone--tiny-qwen2-") and "exporting someone/tiny-qwen2" in done.stderr
        again = _resolve_in(env, "someone/tiny-qwen2")
        assert again.returncode == 0 and again.stdout == done.stdout and "exporting" not in again.stderr


@pytest.mark.parametrize("offline", [False, True])
def test_a_bad_hub_id_says_what_was_tried(hub_env, offline):
    with HubServer({}) as hub:
        env = {**hub_env, "HF_ENDPOINT": hub.endpoint, "HF_HUB_OFFLINE": "1" if offline else "0"}
        done = _cli(["run", "nobody/no-such-model", "-p", "hi"], env, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "not found" in done.stderr and "nobody/no-such-model" in done.stderr
    assert ("HF_HUB_OFFLINE" in done.stderr or "cache" in done.stderr) if offline else hub.endpoint in done.stderr


def test_without_huggingface_hub_a_hub_id_says_what_to_install(cache, monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(ConfigError, match="pip install huggingface_hub"):
        resolve_model("org/name", str(cache))


# -- list and rm -----------------------------------------------------------------------------
def test_list_shows_both_caches_and_rm_removes_only_inside_them(tmp_path, hub_env, tiny_gguf):
    with HubServer({"taobao-mnn/tiny-gemma3-MNN": TINY_MNN}) as hub:
        assert _resolve_in({**hub_env, "HF_ENDPOINT": hub.endpoint}, "taobao-mnn/tiny-gemma3-MNN").returncode == 0
    assert _resolve_in(hub_env, str(tiny_gguf)).returncode == 0
    listed = _cli(["list", "--json"], hub_env)
    assert listed.returncode == 0, listed.stderr
    models = {m["name"]: m for m in json.loads(listed.stdout)}
    exported = next(n for n in models if n.startswith("tiny-llama.q8-"))
    assert models[exported]["source"] == str(tiny_gguf.resolve()) and models[exported]["size"] > 0
    assert models["taobao-mnn/tiny-gemma3-MNN"]["source"].startswith("hub")
    assert models[exported]["state"] == models["taobao-mnn/tiny-gemma3-MNN"]["state"] == "ready"
    table = _cli(["list"], hub_env).stdout
    assert exported in table and ("MiB" in table or "KiB" in table)
    outside = tmp_path / "precious"
    outside.mkdir()
    for name in ("../../precious", str(outside), ".", "..", "no-such-model"):
        refused = _cli(["rm", name], hub_env)
        assert refused.returncode == 2 and "no cached model" in refused.stderr, (name, refused.stderr)
    assert outside.is_dir()
    for name in (exported, "taobao-mnn/tiny-gemma3-MNN"):
        removed = _cli(["rm", name], hub_env)
        assert removed.returncode == 0 and f"removed {name}" in removed.stdout, removed.stderr
    assert json.loads(_cli(["list", "--json"], hub_env).stdout) == []


def test_rm_in_process_returns_what_it_removed(cache, tiny_gguf):
    config = Path(resolve_model(str(tiny_gguf), str(cache)))
    [entry] = [m for m in cached_models(str(cache)) if m.name == config.parent.name]
    assert remove_model(entry.name, str(cache)).path == str(config.parent) and not config.parent.exists()


# -- the real model, end to end ----------------------------------------------------------------
def _numba_env(cache: Path) -> dict:
    """A fresh model cache, but the machine's compiled cpu kernels (compiling them is not tested here)."""
    from mnnllm_backends.cpu import kernels
    return {"MNNLLM_CACHE": str(cache), "NUMBA_CACHE_DIR": kernels.numba.config.CACHE_DIR}


@pytest.mark.slow
def test_run_answers_from_the_smollm2_gguf_and_exports_it_only_once(tmp_path):
    gguf = smollm2_gguf()
    env = _numba_env(tmp_path / "cache")
    question = ["run", str(gguf), "-p", "What is the capital of France?"]
    first = _cli(question, env)
    assert first.returncode == 0 and "Paris" in first.stdout, first.stderr
    assert "exporting" in first.stderr and "once, about" in first.stderr
    second = _cli(question, env)
    assert second.returncode == 0 and "Paris" in second.stdout and "exporting" not in second.stderr


@pytest.mark.slow
def test_run_answers_from_a_huggingface_folder_of_the_same_weights(tmp_path):
    folder = tmp_path / "SmolLM2-135M-Instruct"
    hf_folder_from_gguf(smollm2_gguf(), folder)  # fp32 safetensors, tokenizer.json, chat template
    done = _cli(["run", str(folder), "-p", "What is the capital of France?"], _numba_env(tmp_path / "cache"))
    assert done.returncode == 0 and "Paris" in done.stdout, done.stderr
    assert f"exporting {folder}" in done.stderr


@pytest.mark.slow
def test_run_answers_from_an_mnn_repository_fetched_by_hub_id(hub_env):
    with HubServer({"taobao-mnn/SmolLM2-135M-Instruct-MNN": MODEL_DIR}) as hub:
        done = _cli(["run", "taobao-mnn/SmolLM2-135M-Instruct-MNN", "-p", "What is the capital of France?",
                     "--set", "sampler_type=greedy", "--set", "memory=normal"],
                    {**hub_env, **_numba_env(Path(hub_env["MNNLLM_CACHE"])), "HF_ENDPOINT": hub.endpoint})
    assert done.returncode == 0 and "Paris" in done.stdout, done.stderr
