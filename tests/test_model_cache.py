"""The default model's cache cannot stay broken: the export records each file's size and
checksum, a later run re-exports a folder cut short or changed, and staging folders of a
killed export are removed; exports replace their destination whole."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mnnllm_core.errors import ConfigError
from mnnllm_core.export import default_model, export_model, model_cache
from mnnllm_core.export.folder import orphaned_staging
from test_export import random_weights, write_hf_folder


@pytest.fixture
def fake_export(tmp_path, monkeypatch):
    """ensure_default_model with a stand-in export that counts its runs."""
    runs = []

    def export(src, dst, **kwargs):
        runs.append(dst)
        for name in model_cache.COMPLETE:
            (Path(dst) / name).write_bytes(name.encode() * 1000)

    monkeypatch.setattr(default_model, "default_gguf", lambda: tmp_path / "tiny.gguf")
    monkeypatch.setattr(default_model, "write_model", export)
    return runs


def ensure(tmp_path) -> Path:
    return Path(default_model.ensure_default_model(str(tmp_path / "cache"))).parent


def test_an_intact_cache_is_reused(tmp_path, fake_export):
    folder = ensure(tmp_path)
    assert ensure(tmp_path) == folder and len(fake_export) == 1
    assert default_model.default_model_ready(str(tmp_path / "cache"))


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete", "manifest"])
def test_a_damaged_cache_is_exported_again(tmp_path, fake_export, damage):
    folder = ensure(tmp_path)
    weight = folder / "llm.mnn.weight"
    good = weight.read_bytes()
    if damage == "truncate":
        weight.write_bytes(good[:100])
    elif damage == "flip":
        weight.write_bytes(bytes([good[0] ^ 1]) + good[1:])  # same size, new time
    elif damage == "delete":
        weight.unlink()
    else:
        (folder / model_cache.MANIFEST).write_text("{")
    assert not default_model.default_model_ready(str(tmp_path / "cache"))
    assert ensure(tmp_path) == folder and len(fake_export) == 2
    assert weight.read_bytes() == good and default_model.default_model_ready(str(tmp_path / "cache"))


def test_a_file_touched_but_unchanged_is_still_intact(tmp_path, fake_export):
    folder = ensure(tmp_path)
    os.utime(folder / "llm.mnn.weight", ns=(1, 1))
    assert ensure(tmp_path) == folder and len(fake_export) == 1


def test_staging_folders_of_a_killed_export_are_removed(tmp_path, fake_export):
    models = tmp_path / "cache" / "models"
    models.mkdir(parents=True)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    orphan = models / f".{default_model.DEFAULT_MODEL_NAME}-{dead}-abcdefgh"
    live = models / f".{default_model.DEFAULT_MODEL_NAME}-{os.getpid()}-efghijkl"
    for folder in (orphan, live):
        folder.mkdir()
        (folder / "llm.mnn.weight").write_bytes(b"partial")
    assert orphaned_staging(models / default_model.DEFAULT_MODEL_NAME) == [orphan]
    ensure(tmp_path)
    assert not orphan.exists() and live.exists()


def test_a_killed_export_leaves_no_model_and_the_next_run_cleans_up(tmp_path, monkeypatch):
    """kill -9 in the middle of the first export, for real: the next run exports and tidies."""
    cache = tmp_path / "cache"
    code = ("import os, signal\nfrom pathlib import Path\nfrom mnnllm_core.export import default_model\n"
            "def export(src, dst, **kw):\n    (Path(dst) / 'llm.mnn').write_bytes(b'half')\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n"
            "default_model.default_gguf = lambda: Path('x.gguf')\ndefault_model.write_model = export\n"
            f"default_model.ensure_default_model({str(cache)!r})\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == -9
    models = cache / "models"
    assert [p.name.startswith(".") for p in models.iterdir()] == [True]  # only the orphan
    runs = []

    def export(src, dst, **kwargs):
        runs.append(dst)
        for name in model_cache.COMPLETE:
            (Path(dst) / name).write_text("x")

    monkeypatch.setattr(default_model, "default_gguf", lambda: tmp_path / "tiny.gguf")
    monkeypatch.setattr(default_model, "write_model", export)
    ensure(tmp_path)
    assert [p.name for p in models.iterdir()] == [default_model.DEFAULT_MODEL_NAME] and len(runs) == 1


# -- export destinations ---------------------------------------------------------------------
def test_an_export_onto_a_file_is_a_config_error(tmp_path):
    dst = tmp_path / "model"
    dst.write_text("a file")
    source = write_hf_folder(tmp_path / "hf", "llama", random_weights("llama", True), True)
    with pytest.raises(ConfigError, match="is a file, not a folder") as err:
        export_model(str(source), str(dst), force=True)
    assert err.value.field == "dst"


def test_a_forced_export_leaves_no_stale_embeddings(tmp_path):
    source = write_hf_folder(tmp_path / "hf", "llama", random_weights("llama", True), True)
    dst = tmp_path / "model"
    export_model(str(source), str(dst), quant_bit=8, separate_embed=True)
    assert (dst / "embeddings_bf16.bin").is_file()
    export_model(str(source), str(dst), quant_bit=8, force=True)
    assert not (dst / "embeddings_bf16.bin").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "model"]
