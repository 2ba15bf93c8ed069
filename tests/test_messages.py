"""Messages that used to mislead (issue 34, item 6), and install hints of the optional backends."""
import os
import subprocess
import sys

import pytest

from mnnllm_core.errors import ConfigError, cut_at_clause
from mnnllm_core.export.folder import staging_folder
from paths import CONFIG, smollm2_gguf


def mnnllm(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mnnllm_core.cli", *args], capture_output=True, text=True,
                          timeout=600, env={**os.environ, **env})


def error_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    return lines[0]


def test_an_export_destination_that_cannot_be_made_is_named_not_its_staging_folder():
    line = error_line(mnnllm("export", str(smollm2_gguf()), "/proc/x"))
    assert "(file /proc/x, field dst)" in line and "/proc/." not in line, line


def test_a_write_error_inside_the_staging_folder_names_the_destination(tmp_path):
    target = tmp_path / "model"
    with pytest.raises(ConfigError) as err:
        with staging_folder(target) as tmp:
            open(tmp / "sub" / "llm.mnn", "wb")
    assert err.value.file == str(target) and "cannot write sub/llm.mnn of the export destination" in err.value.reason
    assert list(tmp_path.iterdir()) == []  # the staging folder is gone


@pytest.mark.parametrize("args,field,text", [
    (["--case", "zzzz"], "--case", "no case name contains 'zzzz' (of "),
    (["--op", "Softmax", "--case", "zzzz"], "--case", "among the 3 cases of op Softmax; names: axis=-1"),
    (["--op", "Nope"], "--op", "no op type 'Nope'; op types: Attention"),
])
def test_test_backend_blames_the_option_that_matched_nothing(args, field, text):
    line = error_line(mnnllm("test-backend", "cpu", *args))
    assert text in line and line.endswith(f"(field {field})"), line


LONG_IMPORT_ERROR = ("libOpenCL.so.1: cannot open shared object file: No such file or directory, and a long "
                     "explanation that goes on about loaders, installable client drivers and their search paths")


def test_a_backend_that_cannot_load_says_what_to_install_in_whole_clauses(tmp_path):
    (tmp_path / "pyopencl.py").write_text(f"raise ImportError({LONG_IMPORT_ERROR!r})")
    line = error_line(mnnllm("run", str(CONFIG), "--backend", "opencl", "-p", "hi", PYTHONPATH=str(tmp_path)))
    assert "pyopencl cannot be imported (pip install 'mnnllm[opencl]'; ImportError: libOpenCL.so.1" in line
    assert "(cut; `mnnllm backends` shows it whole); other registered backends: cpu" in line
    assert " ... " not in line and line.endswith("(from --backend, field backend_type)"), line


def test_vulkan_says_what_to_install_too(tmp_path):
    (tmp_path / "vulkan.py").write_text("raise ImportError('no module')")
    done = mnnllm("backends", PYTHONPATH=str(tmp_path))
    assert "the vulkan package cannot be imported (pip install 'mnnllm[vulkan]'; ImportError" in done.stdout


@pytest.mark.parametrize("text,limit,expected", [
    ("short", 80, "short"),
    ("alpha beta: gamma delta; epsilon zeta eta theta", 30, "alpha beta: gamma delta (cut)"),
    ("one two three four five six seven", 16, "one two three (cut)"),
])
def test_cut_at_clause_never_cuts_a_word(text, limit, expected):
    assert cut_at_clause(text, limit) == expected


def test_the_cli_cuts_an_overlong_message_between_words():
    from mnnllm_core.cli import _report
    from mnnllm_core.errors import MnnllmError
    import io
    from contextlib import redirect_stderr
    err = io.StringIO()
    with redirect_stderr(err):
        _report(MnnllmError(" ".join(f"word{i}" for i in range(100)), field="x"), debug=False)
    words = err.getvalue().removeprefix("error: ").split()
    assert "..." in words and all(w == "..." or w.startswith(("word", "(field", "x)")) for w in words), words
