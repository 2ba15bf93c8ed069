"""The mnnllm command as a user runs it."""
import json
import subprocess
import sys

import pytest

from paths import CONFIG, LLM_MNN, REFERENCE

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


def test_errors_are_one_readable_line_and_exit_code_2(tmp_path):
    done = mnnllm("inspect", str(tmp_path / "missing.mnn"))
    assert done.returncode == 2
    assert done.stderr.startswith("error: ") and "missing.mnn" in done.stderr


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
