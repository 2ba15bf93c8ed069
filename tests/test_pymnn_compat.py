"""pymnn's `MNN.llm` (3.6.1) as a contract: every public name of it (the Python module and its C
extension `_mnncengine.llm`), read from the installed MNN, exists on ours with the same signature,
or is in pymnn_compat.DIFFERENT with the reason; and the behaviours the contract promises."""
import inspect
import json
import re
from pathlib import Path

import pytest

import mnnllm_core
from mnnllm_core.errors import ArgumentError, ConfigError
from mnnllm_core.llm.context import LlmContext, LlmStatus
from mnnllm_core.llm.llm import Llm
from mnnllm_core.llm.pymnn_compat import DIFFERENT, documented, markdown_table, pymnn_names
from paths import CONFIG, REFERENCE


def unloaded() -> Llm:
    return mnnllm_core.create(str(CONFIG))


OURS = {"Llm": unloaded, "LLM": unloaded, "Context": LlmContext, "LlmStatus": lambda: LlmStatus,
        "create": lambda: mnnllm_core.create}


@pytest.fixture(scope="module", name="pymnn_names")
def installed_pymnn_names() -> dict:
    pytest.importorskip("MNN", reason="PyPI MNN (pymnn) is not installed")
    return pymnn_names()


def ours(name: str):
    """Our object for a pymnn name, or AttributeError."""
    owner, _, member = name.partition(".")
    if owner not in OURS:
        raise AttributeError(name)
    obj = OURS[owner]()
    return getattr(obj, member) if member else obj


def test_every_pymnn_name_is_ours_or_documented(pymnn_names):
    assert {"Llm.generate", "Llm.stoped", "LlmStatus.USER_CANCEL", "LLM.erase_history", "Context.status"} \
        <= set(pymnn_names)
    missing = []
    for name in sorted(pymnn_names):
        if documented(name):
            continue
        try:
            ours(name)
        except AttributeError:
            missing.append(name)
    assert missing == [], f"pymnn names neither ours nor in pymnn_compat.DIFFERENT: {missing}"


def test_the_documented_list_names_only_pymnn_names(pymnn_names):
    assert sorted(set(DIFFERENT) - set(pymnn_names)) == []


def test_signatures_agree_where_pymnn_has_one(pymnn_names):
    """pymnn's parameters are ours in the same order, with the same defaults; ours may add
    parameters after them, each with a default."""
    for name, params in sorted(pymnn_names.items()):
        if documented(name) or not isinstance(params, list):
            continue
        mine = [p for p in inspect.signature(ours(name)).parameters.values() if p.name != "self"]
        assert [p.name for p in mine[:len(params)]] == [p for p, _ in params], name
        for (_, default), p in zip(params, mine):
            assert default is None or repr(p.default) == default, (name, p.name)
        assert all(p.default is not p.empty for p in mine[len(params):]), name


def test_llm_status_has_pymnns_members_and_values(pymnn_names):
    theirs = {k.split(".", 1)[1]: v for k, v in pymnn_names.items() if k.startswith("LlmStatus.")
              and isinstance(v, int)}
    assert {m.name: m.value for m in LlmStatus if m.name in theirs} == theirs
    assert LlmStatus.NORMAL_FINISHED == 1 and str(LlmStatus.USER_CANCEL) == "LlmStatus.USER_CANCEL"


def test_the_readme_table_when_present_is_the_generated_one():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    header = "| pymnn `MNN.llm` | mnnllm |"
    if header not in readme:
        pytest.skip("the README has no pymnn table yet")
    block = readme[readme.index(header):].split("\n\n", 1)[0].strip()
    same = [m.group(1) for m in re.finditer(r"^\| `([^`]+)` \| same \|$", block, re.M)]
    assert block == markdown_table(same)


@pytest.fixture(scope="module")
def llm():
    model = mnnllm_core.create(str(CONFIG))
    model.set_config({"sampler_type": "greedy"})
    return model.load()


def test_generate_with_one_argument_gives_mnns_tokens(llm):
    prompt = json.loads(REFERENCE.read_text())["prompts"][0]
    llm.reset()
    assert llm.generate(prompt["prompt_ids"]) == prompt["mnn_cpp_q4_memory_normal"]["gen_ids"]
    assert llm.context.status is LlmStatus.NORMAL_FINISHED and llm.context.status == 1
    assert llm.stoped() and llm.get_current_history() == len(llm.context.history_tokens)


def test_a_cut_reply_is_max_tokens_finished_and_not_stopped(llm):
    llm.reset()
    llm.generate(llm.tokenizer_encode(llm.apply_chat_template("Count to twenty.")), 3)
    assert llm.context.status == LlmStatus.MAX_TOKENS_FINISHED and not llm.stoped()


def test_erase_history_to_the_end_then_answers_as_fresh(llm):
    ids = llm.tokenizer_encode(llm.apply_chat_template("What is the capital of France?"))
    llm.reset()
    fresh = llm.generate(ids, 6)
    held = llm.get_current_history()
    llm.erase_history(len(ids) - 3)
    assert llm.get_current_history() == len(ids) - 3 < held
    assert llm.generate(ids, 6) == fresh
    with pytest.raises(ArgumentError, match="not a range"):
        llm.erase_history(5, held + 100)


def test_set_config_refuses_an_unknown_key_as_the_cli_does():
    model = mnnllm_core.create(str(CONFIG))
    with pytest.raises(ConfigError, match=r"unknown config key 'temprature'; did you mean temperature\?") as err:
        model.set_config({"temprature": 0.5})
    assert err.value.field == "temprature"
    with pytest.raises(ConfigError, match="unknown config key 'foo'"):
        model.set_config('{"foo": 1}')
    model.set_config({"temperature": 0.5, "max_new_tokens": 8})  # known keys still merge
    assert json.loads(model.dump_config())["max_new_tokens"] == 8


def test_roles_are_checked_as_the_server_checks_them(llm):
    from mnnllm_core.serve.schemas import Message
    from mnnllm_core.llm.arguments import CHAT_ROLES
    assert set(Message.model_fields["role"].annotation.__args__) == set(CHAT_ROLES)
    with pytest.raises(ArgumentError, match="role must be one of system, developer, user, assistant, tool, got 'bob'"):
        llm.apply_chat_template([{"role": "bob", "content": "hi"}])
    developer = llm.apply_chat_template([{"role": "developer", "content": "Be brief."}, ("user", "hi")])
    assert developer == llm.apply_chat_template([{"role": "system", "content": "Be brief."}, ("user", "hi")])


def test_context_update_and_generate_init_as_pymnn(llm):
    llm.context.update({"end_with": "\n"}, current_token=5)
    assert llm.context.end_with == "\n" and llm.context.current_token == 5
    with pytest.raises(ArgumentError):
        llm.context.update(nonsense=1)
    llm.generate_init(None, "\n")
    assert llm.context.status == LlmStatus.RUNNING and llm.context.gen_seq_len == 0
    assert llm.get_log() == ""
