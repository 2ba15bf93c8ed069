"""`mnnllm chat`'s slash commands: handled locally, never sent to the model."""
import json
import subprocess
import sys

import pytest

import mnnllm_core
from mnnllm_core.chat_commands import ChatSession
from paths import CONFIG


def chat(stdin: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mnnllm_core.cli", "chat", str(CONFIG), "--temp", "0", *args],
                          capture_output=True, text=True, input=stdin, timeout=600)


@pytest.fixture(scope="module")
def session():
    llm = mnnllm_core.create(str(CONFIG))
    llm.set_config({"sampler_type": "greedy"})
    return ChatSession(llm.load(), None, lambda path: "")


def test_commands_are_answered_locally_and_a_conversation_survives_save_and_load(tmp_path):
    saved = tmp_path / "chat.json"
    done = chat(f"/help\n/foo bar\nWhat is the capital of France?\n/set max_new_tokens 4\n/show\n/save {saved}\n"
                f"/reset\n/load {saved}\n/show\n/exit\n")
    assert done.returncode == 0, done.stderr
    replies = [r.strip() for r in done.stdout.split("> ") if r.strip()]
    assert replies == ["The capital of France is Paris."]  # neither /help nor /foo reached the model
    err = done.stderr
    assert "/save FILE" in err and "unknown command /foo; /help lists the commands" in err
    assert "[max_new_tokens = 4]" in err and "max_new_tokens 4" in err
    assert "backend: cpu" in err and "of 2048 tokens used" in err
    assert "[conversation reset: 2 messages forgotten]" in err and "[loaded 2 messages from" in err
    assert json.loads(saved.read_text())["messages"] == [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "The capital of France is Paris."}]
    assert "generated" in err and "end of reply]" in err  # the timing line after the reply


def test_set_refuses_an_unknown_key_with_a_suggestion(session, capsys):
    assert session.command("/set temprature 0.5") is True
    assert "unknown config key 'temprature'; did you mean temperature?" in capsys.readouterr().err
    assert session.command("/set top_k 5") is True and session.llm.config.to_dict()["top_k"] == 5


def test_load_refuses_a_bad_file_and_keeps_the_conversation(session, tmp_path, capsys):
    session.messages = [{"role": "user", "content": "hi"}]
    for name, text in [("a.json", "not json"), ("b.json", '{"messages": [{"role": "bob", "content": "x"}]}'),
                       ("c.json", '{"messages": 3}')]:
        (tmp_path / name).write_text(text)
        assert session.command(f"/load {tmp_path / name}") is True
    err = capsys.readouterr().err
    assert "not JSON" in err and "role must be one of" in err and "not a saved conversation" in err
    assert session.messages == [{"role": "user", "content": "hi"}]


def test_save_writes_beside_then_renames(session, tmp_path):
    session.messages = [{"role": "user", "content": "hi"}]
    target = tmp_path / "deep" / "c.json"
    assert session.command(f"/save {target}") is True
    assert json.loads(target.read_text()) == {"messages": session.messages}
    assert sorted(p.name for p in target.parent.iterdir()) == ["c.json"]  # no staging file left


def test_a_double_slash_sends_a_line_starting_with_a_slash(session):
    assert session.command("//etc is a folder") is None
    assert session.message("//etc is a folder") == "/etc is a folder"
    assert session.command("/exit") is False and session.command("hello") is None
