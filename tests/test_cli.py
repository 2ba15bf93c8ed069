"""The mnnllm command as a user runs it."""
import json
import subprocess
import sys

import pytest

from mnnllm_core.testing import FP16_TOL, FP32_TOL
from paths import CONFIG, LLM_MNN, MODEL_DIR, REFERENCE

PROMPTS = json.loads(REFERENCE.read_text())["prompts"]


def mnnllm(*args, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mnnllm_core.cli", *args], capture_output=True, text=True,
                          input=stdin, timeout=600)


def test_run_json_gives_mnn_tokens_for_the_capital_of_france():
    done = mnnllm("run", str(CONFIG), "--set", "sampler_type=greedy", "--set", "memory=normal",
                  "-p", "What is the capital of France?", "--json")
    assert done.returncode == 0, done.stderr
    row = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(row) == {"prompt", "prompt_ids", "gen_ids", "text", "prefill_tok_s", "decode_tok_s"}
    assert row["prompt_ids"] == PROMPTS[0]["prompt_ids"]
    assert row["gen_ids"] == PROMPTS[0]["mnn_cpp_q4_memory_normal"]["gen_ids"]
    assert row["text"] == "The capital of France is Paris."
    assert row["prefill_tok_s"] > 0 and row["decode_tok_s"] > 0


def test_run_reads_prompts_from_stdin_one_json_line_each():
    done = mnnllm("run", str(CONFIG), "--set", "sampler_type=greedy", "--max-new-tokens", "3", "--json",
                  stdin="1+1=\nWhat is the capital of France?\n")
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.strip().splitlines()]
    assert [r["prompt"] for r in rows] == ["1+1=", "What is the capital of France?"]
    assert all(len(r["gen_ids"]) <= 3 for r in rows)


def test_inspect_json_has_the_header_and_histogram():
    done = mnnllm("inspect", str(LLM_MNN), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["version"] == "3.6.1" and report["biz_code"] == "MNNTest"
    assert report["op_count"] == 1133 and report["tensor_count"] == 2303
    assert report["op_histogram"]["Convolution"] == 211 and sum(report["op_histogram"].values()) == 1133
    assert [i["name"] for i in report["inputs"]] == ["input_ids", "attention_mask", "position_ids", "logits_index"]
    assert report["inputs"][2]["dtype"] == "int32"
    assert report["external_weight_bytes"] == sum(report["external_weight_bytes_by_op"].values()) > 70_000_000


def test_inspect_reports_a_scalar_input_without_dims(tmp_path):
    import flatbuffers

    from mnnllm_core.inspect_model import inspect_graph
    from mnnllm_core.schema.reader import op_type_name, read_net
    net = read_net(LLM_MNN.read_bytes(), str(LLM_MNN))
    next(op for op in net.oplists if op_type_name(op.type) == "Input").main.dims = None
    builder = flatbuffers.Builder(1 << 20)
    builder.Finish(net.Pack(builder))
    path = tmp_path / "llm.mnn"
    path.write_bytes(bytes(builder.Output()))
    assert inspect_graph(str(path))["inputs"][0]["shape"] == []


def test_inspect_with_a_backend_shows_the_placement():
    done = mnnllm("inspect", str(CONFIG), "--backend", "cpu", "--json")
    assert done.returncode == 0, done.stderr
    placement = json.loads(done.stdout)["placement"]
    assert placement["ops_per_backend"]["cpu"] > 300 and placement["fallbacks"] == []


def test_backends_json_lists_cpu_as_available():
    done = mnnllm("backends", "--json")
    assert done.returncode == 0, done.stderr
    rows = {row["name"]: row for row in json.loads(done.stdout)["backends"]}
    assert rows["cpu"]["available"] and rows["cpu"]["static_shapes"] is False


def test_test_backend_hints_set_the_kv_storage_and_the_attention_tolerance_follows_it():
    case = ("test-backend", "cpu", "--op", "Attention", "--case", "decode 4 steps on a 7-token cache heads=9/3",
            "--json")
    tolerances = {}
    for hint in ((), ("--hint", "kv_fp16=true")):
        done = mnnllm(*case, *hint)
        assert done.returncode == 0, done.stderr
        tolerances[hint] = {row["tolerance"] for row in json.loads(done.stdout)["results"]}
    assert tolerances == {(): {FP32_TOL}, ("--hint", "kv_fp16=true"): {FP16_TOL}}


def test_errors_are_one_readable_line_and_exit_code_2(tmp_path):
    done = mnnllm("inspect", str(tmp_path / "missing.mnn"))
    assert done.returncode == 2
    assert done.stderr.startswith("error: ") and "missing.mnn" in done.stderr


def one_line_error(*args: str) -> str:
    """The error line of a command that must fail with status 2: the last line of stderr, and
    the only one but progress lines ("[1/2] ..." of bench)."""
    done = mnnllm(*args)
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = [line for line in done.stderr.splitlines() if not line.startswith("[")]
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert done.stderr.rstrip().endswith(lines[0])
    return lines[0]


def test_a_model_folder_is_a_config_path_for_run():
    done = mnnllm("run", str(MODEL_DIR), "--set", "sampler_type=greedy", "-p", "What is the capital of France?")
    assert done.returncode == 0 and done.stderr.startswith("[prompt 37 tok, ") and done.stderr.count("\n") == 1, \
        done.stderr
    assert done.stdout == "The capital of France is Paris.\n"


def test_an_llm_mnn_given_as_config_names_the_config_json_to_pass():
    line = one_line_error("run", str(LLM_MNN), "-p", "hi")
    assert f"pass {CONFIG}" in line and f"file {LLM_MNN}" in line


BAD_ARGUMENTS = {
    "negative token count": (["run", str(CONFIG), "--max-new-tokens", "-5", "-p", "hi"], ["--max-new-tokens", ">= 1"]),
    "empty prompt": (["run", str(CONFIG), "-p", ""], ["--prompt", "empty"]),
    "typo in a --set key": (["run", str(CONFIG), "--set", "temprature=0.5", "-p", "hi"],
                            ["'temprature'", "did you mean temperature?", "from --set"]),
    "--set value out of range": (["run", str(CONFIG), "--set", "top_p=2", "-p", "hi"], ["top_p", "from --set"]),
    "unknown --backend": (["run", str(CONFIG), "--backend", "cuda", "-p", "hi"],
                          ["unknown backend 'cuda'", "available backends: cpu", "from --backend"]),
    "missing config": (["run", "/nonexistent/config.json", "-p", "hi"], ["no such file", "/nonexistent/config.json"]),
    "bench on an unknown backend": (["bench", "-m", str(CONFIG), "-a", "cuda", "-p", "8", "-n", "0", "-rep", "1"],
                                    ["unknown backend 'cuda'", "field -a"]),
    "bench with a missing -m": (["bench", "-m", "/nonexistent/config.json", "-p", "8", "-n", "0", "-rep", "1"],
                                ["no such file", "file /nonexistent/config.json"]),
    "bench with zero threads": (["bench", "-m", str(CONFIG), "-t", "0"], ["-t", ">= 1"]),
}


@pytest.mark.parametrize("case", BAD_ARGUMENTS)
def test_a_bad_argument_is_one_line_naming_what_is_wrong(case):
    args, expected = BAD_ARGUMENTS[case]
    line = one_line_error(*args)
    for text in expected:
        assert text in line, line
    assert "backend_type" not in line or "--backend" in line


def test_a_bench_worker_reports_its_own_error_in_one_line(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    for name in ("llm.mnn", "llm.mnn.weight", "llm_config.json"):
        (model / name).symlink_to(MODEL_DIR / name)
    config = json.loads(CONFIG.read_text())
    (model / "config.json").write_text(json.dumps({**config, "tokenizer_file": "missing.mtok"}))
    line = one_line_error("bench", "-m", str(model), "-p", "8", "-n", "0", "-rep", "1")
    assert line == (f"error: tokenizer_file names a file that does not exist: {model / 'missing.mtok'} "
                    f"(file {model / 'config.json'}, field tokenizer_file)")


def test_debug_shows_the_traceback_of_an_error():
    done = mnnllm("--debug", "run", str(LLM_MNN), "-p", "hi")
    assert done.returncode == 2 and "Traceback" in done.stderr
    assert done.stderr.splitlines()[-1].startswith("error: ")


def test_version_is_the_installed_distributions():
    from importlib.metadata import version
    done = mnnllm("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"mnnllm {version('mnnllm')}"


def test_every_option_of_every_command_has_help_text():
    import argparse

    from mnnllm_core.cli import build_parser
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    commands = {"mnnllm": parser, **subparsers.choices}
    missing = [f"{name} {action.dest}" for name, command in commands.items() for action in command._actions
               if not isinstance(action, argparse._SubParsersAction) and not action.help]
    assert set(subparsers.choices) == {"run", "embed", "chat", "serve", "inspect", "backends", "test-backend",
                                       "export", "bench", "list", "rm"}
    assert missing == []


@pytest.mark.parametrize("value,expected", [("2", 2), ("true", True), ("[1,2]", [1, 2]), ("cpu", "cpu")])
def test_set_values_are_json_when_they_parse(value, expected):
    from mnnllm_core.cli import _parse_set
    assert _parse_set([f"k={value}"]) == {"k": expected}


def test_chat_is_multi_turn_and_streams_answers():
    done = mnnllm("chat", str(CONFIG), "--set", "sampler_type=greedy", "--max-new-tokens", "24",
                  stdin="What is the capital of France?\nWhat is 2+2?\n/reset\nWhat is the capital of France?\n/exit\n")
    assert done.returncode == 0, done.stderr
    answers = [line for line in done.stdout.split("> ") if line.strip()]
    assert len(answers) == 3
    assert answers[0].strip() == answers[2].strip() == "The capital of France is Paris."
