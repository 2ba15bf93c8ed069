"""The flags people know from llama.cpp as aliases of config keys, options after the verb, each
verb's errors pointing to its own help, and the timing line after a reply."""
import os
import subprocess
import sys

import pytest

from mnnllm_core.cli import build_parser
from mnnllm_core.cli_flags import alias_updates, parse_command_line
from mnnllm_core.llm.context import CONSTRAINT_UNFINISHED, CONTEXT_FULL, FINISHED, MAX_TOKENS, STOPPED, LlmContext
from mnnllm_core.reply_summary import summary_line
from paths import CONFIG


def mnnllm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mnnllm_core.cli", *args], capture_output=True, text=True,
                          timeout=600)


def parse(*argv: str):
    return parse_command_line(build_parser(), list(argv))


@pytest.mark.parametrize("flags,key,value", [
    (["--temp", "0.7"], "temperature", 0.7), (["--top-k", "5"], "top_k", 5), (["--top-p", "0.5"], "top_p", 0.5),
    (["--min-p", "0.05"], "min_p", 0.05), (["--seed", "3"], "seed", 3), (["-c", "512"], "max_all_tokens", 512),
    (["--ctx-size", "256"], "max_all_tokens", 256), (["-sys", "Be brief."], "system_prompt", "Be brief."),
    (["--system", "Be brief."], "system_prompt", "Be brief."), (["--temp", "0"], "sampler_type", "greedy"),
])
@pytest.mark.parametrize("verb", ["run", "chat", "serve"])
def test_each_alias_sets_its_config_key(verb, flags, key, value):
    updates = alias_updates(parse(verb, "model", *flags))
    assert {k: v for k, (v, _flag) in updates.items()} == {key: value}


def test_n_predict_is_max_new_tokens_in_all_its_spellings():
    for flag in ("-n", "--n-predict", "--max-new-tokens"):
        assert parse("run", flag, "7").max_new_tokens == 7


def test_global_options_are_accepted_after_the_verb_too():
    assert parse("run", "--debug", "-vv").debug and parse("run", "-vv").verbose == 2
    before = parse("--debug", "-v", "chat")
    assert before.debug and before.verbose == 1  # the verb's copy does not hide the top-level value
    assert not parse("bench").debug and parse("bench").verbose == 0


@pytest.mark.parametrize("argv,prog", [
    (["run", "-n", "x"], "mnnllm run"), (["run", "--bogus"], "mnnllm run"), (["bench", "--nope"], "mnnllm bench"),
    (["chat", "--temp", "warm"], "mnnllm chat"), (["serve", "-c", "big"], "mnnllm serve"),
])
def test_a_verbs_error_points_to_its_own_help(argv, prog, capsys):
    with pytest.raises(SystemExit) as stop:
        parse(*argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.startswith(f"error: {prog}: ") and err.endswith(f"(see {prog} --help)\n")
    assert err.count("\n") == 1


def context(status: int) -> LlmContext:
    return LlmContext(prompt_len=40, gen_seq_len=9, prefill_us=100_000, decode_us=200_000, status=status)


@pytest.mark.parametrize("status,ending", [
    (FINISHED, "end of reply]"), (MAX_TOKENS, "cut at max_new_tokens 9 (-n N raises it)]"),
    (CONTEXT_FULL, "cut at the end of the context, max_all_tokens 64 (/reset or -c N makes room)]"),
    (STOPPED, "stopped by Ctrl-C]"), (CONSTRAINT_UNFINISHED, "ended before the constrained output was complete]"),
])
def test_the_summary_line_says_speeds_and_why_the_reply_ended(status, ending):
    line = summary_line(context(status), 9, 64)
    assert line.startswith("[prompt 40 tok, 400.0 tok/s | generated 9 tok, 40.0 tok/s | ") and line.endswith(ending)


def test_run_with_familiar_flags_marks_a_cut_reply(tmp_path):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("What is the capital of France?")
    done = mnnllm("run", str(CONFIG), "--temp", "0", "-n", "5", "-f", str(prompt), "--debug")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "The capital of France is\n"
    assert done.stderr.startswith("[prompt 37 tok, ") and "| generated 5 tok, " in done.stderr
    assert done.stderr.rstrip().endswith("cut at max_new_tokens 5 (-n N raises it)]")


def test_the_reply_line_ends_before_the_summary_when_both_go_to_one_pipe():
    env = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}  # a user's buffering
    done = subprocess.run([sys.executable, "-m", "mnnllm_core.cli", "run", str(CONFIG), "--temp", "0", "-n", "5",
                           "-p", "What is the capital of France?"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=600, env=env)
    assert done.returncode == 0 and "The capital of France is\n[prompt 37 tok, " in done.stdout, done.stdout


def test_a_bad_alias_value_names_the_flag():
    done = mnnllm("run", str(CONFIG), "--top-p", "2", "-p", "hi")
    assert done.returncode == 2 and "from --top-p" in done.stderr and "top_p" in done.stderr, done.stderr


def test_an_empty_prompt_file_is_refused_before_loading(tmp_path):
    (tmp_path / "empty.txt").write_text(" \n")
    done = mnnllm("run", "/nonexistent/config.json", "-f", str(tmp_path / "empty.txt"))
    assert done.returncode == 2 and "the prompt file is empty" in done.stderr and "field --file" in done.stderr
