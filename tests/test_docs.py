"""The user documentation stays true to the repository: every repository path, file name and
module it names in backticks exists, the README opens with the two commands that work on a
fresh machine, and the README and the benchmark guide describe the software as it is (no
issue numbers, no clock times of a night's measurements)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BENCH_README = ROOT / "bench" / "README.md"
DESIGN = ROOT / "docs" / "DESIGN.md"
DOCS = [README, BENCH_README, *sorted((ROOT / "docs").glob("*.md"))]
USER_DOCS = [README, BENCH_README]

TOP_LEVEL = tuple(p.name for p in ROOT.iterdir() if not p.name.startswith(".") or p.name == ".ci")
SOURCE_SUFFIXES = (".py", ".cl", ".glsl", ".comp", ".sh", ".fbs", ".toml")
FIRST_COMMANDS = [
    'bash .ci/setup && .venv/bin/mnnllm run -p "What is the capital of France?"',
    "bash .ci/setup-test && .venv/bin/python -m pytest -q -p no:cacheprovider -n auto --dist loadfile",
]


def inline_code(text: str) -> list[str]:
    """The contents of single-backtick spans outside fenced blocks."""
    outside = re.sub(r"```.*?```", "", text, flags=re.S)
    return re.findall(r"`([^`\n]+)`", outside)


def words(span: str) -> list[str]:
    """The span's whitespace-separated words, without the punctuation around them, the
    `:line` or `::test` after a path, or the `[...]` of an option."""
    out = []
    for word in span.split():
        word = word.strip("'\"(),;[]")
        word = re.sub(r"::?\w*$", "", word) if re.search(r"\.\w+::?\w*$", word) else word
        if word:
            out.append(word)
    return out


def is_template(word: str) -> bool:
    return any(c in word for c in "<>{}$=|")


def repo_paths(span: str) -> list[str]:
    """Words that start with a top-level entry of the repository (`bench/x.py`, `.ci/setup`)."""
    return [w.rstrip("/.") for w in words(span)
            if not is_template(w) and w.split("/")[0] in TOP_LEVEL and ("/" in w or w in TOP_LEVEL)]


def file_names(span: str) -> list[str]:
    """Relative source files (`kernels/layout.py`, `vision_qwen2.py`) that are not repo paths;
    a glob (`schema/default/*.fbs`) names another project's files."""
    return [w for w in words(span) if w.endswith(SOURCE_SUFFIXES) and not is_template(w) and "*" not in w
            and w.split("/")[0] not in TOP_LEVEL and not w.startswith(("../", "/", "~"))]


def module_names(span: str) -> list[str]:
    return [w for w in words(span) if re.fullmatch(r"(mnnllm_core|mnnllm_backends)(\.\w+)+", w)]


def module_exists(dotted: str) -> bool:
    """`mnnllm_core.a.b[.attribute]`: the parts are packages down to a module, or a package
    whose `__init__.py` names the next part."""
    parts = dotted.split(".")
    base = {"mnnllm_core": ROOT / "mnnllm_core", "mnnllm_backends": ROOT / "backends"}[parts[0]]
    for part in parts[1:]:
        if (base / part).is_dir():
            base = base / part
        elif (base / f"{part}.py").is_file():
            return True
        else:
            init = base / "__init__.py"
            return init.is_file() and re.search(rf"\b{part}\b", init.read_text()) is not None
    return True


def source_files() -> set[str]:
    return {p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*")
            if p.is_file() and ".venv" not in p.parts and ".git" not in p.parts}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_repository_path_a_document_names_exists(doc: Path) -> None:
    missing = [p for span in inline_code(doc.read_text()) for p in repo_paths(span)
               if not any(ROOT.glob(p)) and not (ROOT / p).exists()]
    assert not missing, f"{doc.relative_to(ROOT)} names paths that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_source_file_and_module_a_document_names_exists(doc: Path) -> None:
    files = source_files()
    spans = inline_code(doc.read_text())
    missing = [f for span in spans for f in file_names(span)
               if not any(path == f or path.endswith("/" + f) for path in files)]
    missing += [m for span in spans for m in module_names(span) if not module_exists(m)]
    assert not missing, f"{doc.relative_to(ROOT)} names files or modules that do not exist: {missing}"


def test_the_path_checks_catch_a_stale_path() -> None:
    span = "python bench/no_such_bench.py and mnnllm_core/llm/gone.py, `mnnllm_core.nowhere`"
    assert repo_paths(span) == ["bench/no_such_bench.py", "mnnllm_core/llm/gone.py"]
    assert not (ROOT / "bench/no_such_bench.py").exists()
    assert file_names("kernels/nowhere.py") == ["kernels/nowhere.py"]
    assert not module_exists("mnnllm_core.nowhere") and not module_exists("mnnllm_core.llm.nowhere")
    assert module_exists("mnnllm_core.backend_api.WeightCache") and module_exists("mnnllm_backends.cpu")


@pytest.mark.parametrize("doc", USER_DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_user_documents_cite_no_issue_numbers_and_no_clock_times(doc: Path) -> None:
    text = doc.read_text()
    issues = re.findall(r"\bissues?\s+#?\d+|(?<![\w&/])#\d+\b", text, flags=re.I)
    clock = re.findall(r"(?<![\d.:])\b(?:[01]?\d|2[0-3]):[0-5]\d\b(?![\d:])", text)
    assert not issues and not clock, f"{doc.relative_to(ROOT)}: {issues + clock}"


def test_the_readme_opens_with_the_two_fresh_machine_commands() -> None:
    """The first two commands a reader meets set up and answer a chat, then set up and test."""
    commands = [line.strip() for line in README.read_text().splitlines() if line.startswith("    ")]
    assert commands[:2] == FIRST_COMMANDS


def test_ci_runs_the_readmes_test_command() -> None:
    """`.ci/run` is the README's second command, a step a line: the two cannot drift apart."""
    steps = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
             if line.strip() and not line.startswith(("#", "set ", "cd "))]
    assert steps == [step.strip() for step in FIRST_COMMANDS[1].split("&&")]


def test_the_readme_and_the_tests_point_to_the_design_document_in_the_repository() -> None:
    assert DESIGN.is_file()
    assert "docs/DESIGN.md" in README.read_text()
    assert "../shared/DESIGN.md" not in README.read_text()
