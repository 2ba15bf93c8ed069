"""Prompt: chat templates render exactly the text MNN (and Hugging Face) feed the model."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from mnnllm_core.errors import ArgumentError, ConfigError
from mnnllm_core.llm.config import LlmConfig
from mnnllm_core.llm.prompt import Prompt

MODEL_DIR = Path(__file__).resolve().parents[2] / "shared/models/smollm2-135m-instruct-mnn-q4"
MODEL_FILES = ("llm.mnn", "llm.mnn.weight", "tokenizer.mtok")
SMOLLM_SYSTEM = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
                 "trained by Hugging Face<|im_end|>\n")

needs_model = pytest.mark.skipif(not MODEL_DIR.is_dir(), reason=f"no model at {MODEL_DIR}")
needs_mnn = pytest.mark.skipif(importlib.util.find_spec("MNN") is None,
                               reason="PyPI package MNN (the reference runtime) not installed")

_ORACLE = textwrap.dedent("""
    import json, sys
    import MNN.llm as llm
    m = llm.create(sys.argv[1])
    m.load()
    out = []
    for change, messages in json.loads(sys.argv[2]):
        if change:
            assert m.set_config(change)
        out.append(m.apply_chat_template(messages))
    print("OUT" + json.dumps(out))
""")

Case = tuple[dict[str, Any], Any]  # (set_config change applied first, messages)


def mnn_templates(config_path: Path, cases: list[Case]) -> list[str]:
    """MNN's own apply_chat_template for each case, in one subprocess (one model per process)."""
    run = subprocess.run([sys.executable, "-c", _ORACLE, str(config_path), json.dumps(cases)],
                         capture_output=True, text=True, timeout=300)
    outs = [line[3:] for line in run.stdout.splitlines() if line.startswith("OUT")]
    assert run.returncode == 0 and outs, run.stdout + run.stderr
    return json.loads(outs[0])


def our_templates(config_path: Path, cases: list[Case]) -> list[str]:
    cfg = LlmConfig.from_file(config_path)
    prompt = Prompt(cfg)
    out = []
    for change, messages in cases:
        if change:
            cfg.set_config(change)
            prompt.set_params(cfg)
        out.append(prompt.apply_chat_template(messages))
    return out


def reference_prompts() -> list[str]:
    reference = json.loads((MODEL_DIR / "reference.json").read_text(encoding="utf-8"))
    return [p["prompt"] for p in reference["prompts"]]


def jinja_prompt(template: str, **jinja: Any) -> Prompt:
    return Prompt(LlmConfig({"jinja": {"chat_template": template, **jinja}}))


def model_with_template(folder: Path, template: str) -> Path:
    """The real model linked into `folder`, with its chat template replaced."""
    folder.mkdir()
    for name in MODEL_FILES:
        (folder / name).symlink_to(MODEL_DIR / name)
    llm_config = json.loads((MODEL_DIR / "llm_config.json").read_text(encoding="utf-8"))
    llm_config["jinja"]["chat_template"] = template
    (folder / "llm_config.json").write_text(json.dumps(llm_config), encoding="utf-8")
    config = folder / "config.json"
    config.write_text((MODEL_DIR / "config.json").read_text(encoding="utf-8"), encoding="utf-8")
    return config


@pytest.fixture(scope="module")
def smollm() -> Prompt:
    if not MODEL_DIR.is_dir():
        pytest.skip(f"no model at {MODEL_DIR}")
    return Prompt(LlmConfig.from_file(MODEL_DIR / "config.json"))


def test_reference_prompts_render_the_smollm_chat_text(smollm):
    for text in reference_prompts():
        assert smollm.apply_chat_template(text) == (
            f"{SMOLLM_SYSTEM}<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")


def test_single_user_message_renders_like_a_string(smollm):
    assert smollm.apply_chat_template([{"role": "user", "content": "1+1="}]) == \
        smollm.apply_chat_template("1+1=")


def test_multi_turn_history_renders_every_turn_in_order(smollm):
    text = smollm.apply_chat_template([
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
        ("user", "Bye")])
    assert text == (SMOLLM_SYSTEM + "<|im_start|>user\nHi<|im_end|>\n"
                    "<|im_start|>assistant\nHello!<|im_end|>\n"
                    "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n")


def test_explicit_system_message_replaces_the_default_one(smollm):
    text = smollm.apply_chat_template([{"role": "system", "content": "Be terse."},
                                       {"role": "user", "content": "Hi"}])
    assert text == ("<|im_start|>system\nBe terse.<|im_end|>\n"
                    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_no_generation_prompt_ends_after_the_last_turn(smollm):
    text = smollm.apply_chat_template("Hi", add_generation_prompt=False)
    assert text == SMOLLM_SYSTEM + "<|im_start|>user\nHi<|im_end|>\n"


@needs_model
def test_configured_system_prompt_is_sent_with_a_string_prompt():
    cfg = LlmConfig.from_file(MODEL_DIR / "config.json")
    cfg.set_config({"system_prompt": "Be brief."})
    assert Prompt(cfg).apply_chat_template("Hi").startswith(
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi")


@needs_model
@needs_mnn
@pytest.mark.oracle
def test_smollm_prompts_equal_mnns_apply_chat_template():
    cases: list[Case] = [({}, text) for text in reference_prompts()]
    cases += [
        ({}, [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
              {"role": "user", "content": "c"}]),
        ({}, [{"role": "system", "content": "S"}, {"role": "user", "content": "a"}]),
        ({"system_prompt": "Be brief."}, "Hi"),
        ({"system_prompt": "Be brief."}, [{"role": "user", "content": "Hi"}]),
    ]
    path = MODEL_DIR / "config.json"
    assert our_templates(path, cases) == mnn_templates(path, cases)


_ENCODE = textwrap.dedent("""
    import json, sys
    import MNN.llm as llm
    m = llm.create(sys.argv[1])
    m.load()
    print("IDS" + json.dumps([m.tokenizer_encode(text) for text in json.loads(sys.argv[2])]))
""")


@needs_model
@needs_mnn
@pytest.mark.oracle
def test_rendered_reference_prompts_tokenize_to_the_reference_ids(smollm):
    reference = json.loads((MODEL_DIR / "reference.json").read_text(encoding="utf-8"))
    texts = [smollm.apply_chat_template(p["prompt"]) for p in reference["prompts"]]
    run = subprocess.run([sys.executable, "-c", _ENCODE, str(MODEL_DIR / "config.json"),
                          json.dumps(texts)], capture_output=True, text=True, timeout=300)
    ids = [line[3:] for line in run.stdout.splitlines() if line.startswith("IDS")]
    assert run.returncode == 0 and ids, run.stdout + run.stderr
    assert json.loads(ids[0]) == [p["prompt_ids"] for p in reference["prompts"]]


@needs_model
@needs_mnn
@pytest.mark.oracle
def test_template_variables_whitespace_and_context_equal_mnns(tmp_path):
    template = ("{{ bos_token }}{% for m in messages %}\n"
                "  {% if m.role != 'system' %}[{{ m.role }}:{{ m.content|trim }}]{% endif %}\n"
                "{% endfor %}\n{{ eos_token }}{{ greeting }}{{ messages|length }}"
                "{% if add_generation_prompt %}<gen>{% endif %}\n")
    path = model_with_template(tmp_path / "m", template)
    (tmp_path / "m" / "context.json").write_text('{"greeting": "hi", "eos_token": "<E>"}')
    cases: list[Case] = [
        ({}, "q"),
        ({}, [{"role": "system", "content": "dropped"}, {"role": "user", "content": " a "},
              {"role": "assistant", "content": "b"}]),
    ]
    assert our_templates(path, cases) == mnn_templates(path, cases)


def test_bos_eos_and_context_values_reach_the_template():
    prompt = jinja_prompt("{{ bos_token }}|{{ eos_token }}|{{ today }}|{{ messages[0].content }}",
                          bos="<s>", eos="</s>", context={"today": "Monday"})
    assert prompt.apply_chat_template("x") == "<s>|</s>|Monday|x"


def test_context_value_overrides_a_built_in_variable():
    prompt = jinja_prompt("{{ bos_token }}", bos="<s>", context={"bos_token": "<ctx>"})
    assert prompt.apply_chat_template("x") == "<ctx>"


def test_strftime_now_formats_the_current_time():
    year = datetime.now().year
    assert jinja_prompt("{{ strftime_now('%Y') }}").apply_chat_template("x") in (
        str(year), str(year + 1))


def test_loop_controls_are_available():
    prompt = jinja_prompt("{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
                          "{{ m.content }}{% endfor %}")
    assert prompt.apply_chat_template([("user", "a"), ("user", "b")]) == "a"


def test_tojson_keeps_key_order_and_unicode():
    prompt = jinja_prompt("{{ messages[0]|tojson }}")
    assert prompt.apply_chat_template([("user", "é<>")]) == '{"role": "user", "content": "é<>"}'


def test_extra_message_keys_reach_the_template():
    prompt = jinja_prompt("{{ messages[0].name }}")
    assert prompt.apply_chat_template([{"role": "user", "content": "", "name": "ann"}]) == "ann"


def test_raise_exception_in_the_template_is_a_config_error():
    prompt = jinja_prompt("{{ raise_exception('roles must alternate') }}")
    with pytest.raises(ConfigError, match="roles must alternate") as err:
        prompt.apply_chat_template("x")
    assert err.value.field == "jinja.chat_template"


def test_template_syntax_error_is_reported_when_the_prompt_is_built(tmp_path):
    (tmp_path / "llm_config.json").write_text('{"jinja": {"chat_template": "{% for m in %}"}}')
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="syntax error") as err:
        Prompt(LlmConfig.from_file(tmp_path / "config.json"))
    assert (err.value.file, err.value.field) == (str(tmp_path / "llm_config.json"),
                                                 "jinja.chat_template")


def test_sandbox_refuses_reaching_python_internals():
    prompt = jinja_prompt("{{ messages.__class__.__mro__ }}{{ ''.format.__globals__ }}")
    with pytest.raises(ConfigError) as err:
        prompt.apply_chat_template("x")
    assert err.value.field == "jinja.chat_template"


def test_non_string_chat_template_is_a_config_error():
    with pytest.raises(ConfigError) as err:
        Prompt(LlmConfig({"jinja": {"chat_template": ["not", "text"]}}))
    assert err.value.field == "jinja.chat_template"


def test_message_without_role_is_rejected():
    with pytest.raises(ArgumentError, match="role"):
        jinja_prompt("{{ messages }}").apply_chat_template([{"content": "x"}])


def test_set_params_picks_up_a_new_template():
    cfg = LlmConfig({"jinja": {"chat_template": "A"}})
    prompt = Prompt(cfg)
    cfg.set_config({"jinja": {"chat_template": "B"}})
    prompt.set_params(cfg)
    assert prompt.apply_chat_template("x") == "B"


def test_legacy_template_keys_render_without_jinja():
    prompt = Prompt(LlmConfig({"bos": "<B>", "system_prompt": "sys",
                               "system_prompt_template": "S[%s]", "user_prompt_template": "U[%s]",
                               "assistant_prompt_template": "A[%s]"}))
    assert not prompt.uses_jinja
    assert prompt.apply_chat_template("hi") == "<B>S[sys]U[hi]A["
    assert prompt.apply_chat_template([("user", "a"), ("assistant", "b"), ("user", "c")],
                                      add_generation_prompt=False) == "<B>U[a]A[b]U[c]"


def test_legacy_defaults_are_chatml_and_skip_an_empty_system_prompt():
    assert Prompt(LlmConfig({})).apply_chat_template("hi") == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize(("prompt_template", "expected"), [
    ("[INST] %s [/INST]", "[INST] <<SYS>>\nsys\n<</SYS>>\n\nhi [/INST]"),
    ("<bos>%s", "<bos>syshi"),
    ("<start_of_turn>user\n%s<end_of_turn>\n<start_of_turn>model\n",
     "<bos><start_of_turn>system\nsys<end_of_turn>\n<start_of_turn>user\nhi<end_of_turn>\n"
     "<start_of_turn>model\n"),
    ("<reserved_106>%s<reserved_107>", "system\nsys\n<reserved_106>hi<reserved_107>"),
    ("Q: %s A:", "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                 "<|im_start|>assistant\n"),
])
def test_legacy_prompt_template_selects_its_model_family(prompt_template, expected):
    prompt = Prompt(LlmConfig({"prompt_template": prompt_template, "system_prompt": "sys"}))
    assert prompt.apply_chat_template("hi") == expected
