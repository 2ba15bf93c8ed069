"""`mnnllm bench` checks every backend and model before the first run, keeps the rows that finished
when a later run fails, writes one progress line each when stderr is not a terminal, and shows only
the settings a backend honours."""
import json
import os
import subprocess
import sys

from mnnllm_core.bench.report import render
from paths import CONFIG, MODEL_DIR


def bench(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mnnllm_core.cli", "bench", "-p", "8", "-n", "2", "-rep", "1", *args],
                          capture_output=True, text=True, timeout=900, env={**os.environ, **env})


def broken_copy(folder, file: str):
    """The shared model with `file` empty: its config checks out, its load fails in the worker."""
    folder.mkdir()
    for name in os.listdir(MODEL_DIR):
        if name == file:
            (folder / name).write_bytes(b"")
        else:
            (folder / name).symlink_to(MODEL_DIR / name)
    return folder


def test_an_unavailable_backend_is_refused_before_the_first_run(tmp_path):
    (tmp_path / "pyopencl.py").write_text("raise ImportError('no OpenCL here')")
    done = bench("-m", str(CONFIG), "-a", "cpu,opencl", PYTHONPATH=str(tmp_path))
    assert done.returncode == 2 and done.stdout == "" and "[1/" not in done.stderr, done.stderr
    assert done.stderr == ("error: backend 'opencl' is not available: pyopencl cannot be imported "
                           "(pip install 'mnnllm[opencl]'; ImportError: no OpenCL here) (field -a)\n")


def test_a_model_with_a_missing_file_is_refused_before_the_first_run(tmp_path):
    broken = broken_copy(tmp_path / "broken", "tokenizer.mtok")
    os.remove(broken / "tokenizer.mtok")
    done = bench("-m", f"{CONFIG},{broken}", "-a", "cpu")
    assert done.returncode == 2 and done.stdout == "" and "[1/" not in done.stderr, done.stderr
    assert "tokenizer_file names a file that does not exist" in done.stderr


def test_a_later_failure_prints_the_finished_rows_then_the_error(tmp_path):
    broken = broken_copy(tmp_path / "broken", "llm.mnn.weight")
    done = bench("-m", f"{CONFIG},{broken}", "-a", "cpu", "-o", "json")
    assert done.returncode == 2, done.stderr
    rows = json.loads(done.stdout)
    assert [(r["test"], r["model"]) for r in rows] == [("pp8", str(CONFIG)), ("tg2", str(CONFIG))]
    assert done.stderr.splitlines()[-1].startswith("error: ") and "\r" not in done.stderr
    assert "  cpu t2 pp8 1/1\n" in done.stderr  # progress: whole lines when stderr is a pipe
    assert rows[0]["precision"] == "-" and rows[0]["honours"] == ["attention_mode", "memory", "thread_num"]


def test_columns_show_only_what_the_backend_honours():
    result = {"model": "m/config.json", "model_size": 1 << 20, "threads": 2, "load_s": 1.0, "peak_rss_mb": 1.0,
              "device": "d", "versions": {}, "rows": [{"test": "tg2", "n_prompt": 0, "n_gen": 2, "samples_ts": [1.0],
                                                       "avg_ts": 1.0, "stddev_ts": 0.0}]}
    cpu = {**result, "backend": "cpu", "precision": "-", "honours": ["attention_mode", "memory", "thread_num"]}
    gpu = {**result, "backend": "opencl", "precision": "low", "honours": ["precision"]}
    lines = render([cpu, gpu], "md").splitlines()
    assert lines[2].startswith("| m | 1.0 MiB | cpu | 2 | - | tg2 |")
    assert lines[3].startswith("| m | 1.0 MiB | opencl | - | low | tg2 |")


def test_vs_mnn_without_mnn_says_what_to_install_before_the_first_run(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(
        "import importlib.util, sys\n_find = importlib.util.find_spec\n"
        "importlib.util.find_spec = lambda name, *a: None if name == 'MNN' else _find(name, *a)\n")
    done = bench("-m", str(CONFIG), "-a", "cpu", "--vs-mnn", PYTHONPATH=str(tmp_path))
    assert done.returncode == 2 and "[1/" not in done.stderr
    assert done.stderr == ("error: --vs-mnn runs MNN's own runtime, which is not installed: pip install MNN==3.6.1 "
                           "(field --vs-mnn)\n")
