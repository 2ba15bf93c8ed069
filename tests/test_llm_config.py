"""LlmConfig: MNN's defaults, file merging, path resolution and errors."""
from __future__ import annotations

import importlib.util
import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mnnllm_core.errors import ConfigError
from mnnllm_core.llm.config import LlmConfig, RuntimeOptions
from mnnllm_core.llm.runtime import init_runtime

MODEL_DIR = Path(__file__).resolve().parents[2] / "shared/models/smollm2-135m-instruct-mnn-q4"
MODEL_FILES = ("llm.mnn", "llm.mnn.weight", "tokenizer.mtok")

needs_model = pytest.mark.skipif(not MODEL_DIR.is_dir(), reason=f"no model at {MODEL_DIR}")
needs_mnn = pytest.mark.skipif(importlib.util.find_spec("MNN") is None,
                               reason="PyPI package MNN (the reference runtime) not installed")

B = "/m/"
MNN_DEFAULTS: dict[str, Any] = {
    # Read from MNN's llmconfig.hpp (ujson version) and llm.cpp (setRuntimeHint, load,
    # set_config); file keys are base_dir + value. model_type is the exporter's key.
    "llm_config": B + "llm_config.json", "llm_model": B + "llm.mnn",
    "llm_weight": B + "llm.mnn.weight", "block_model": "block_", "lm_model": B + "lm.mnn",
    "embedding_model": B + "embedding.mnn", "embedding_file": B + "embeddings_bf16.bin",
    "tokenizer_file": B + "tokenizer.txt", "visual_model": B + "visual.mnn",
    "npu_model_dir": B, "audio_model": B + "audio.mnn", "context_file": B + "context.json",
    "max_all_tokens": 2048, "max_new_tokens": 512, "reuse_kv": False, "prompt_cache": False,
    "all_logits": False, "timeout_ms": -1,
    "backend_type": "cpu", "thread_num": 4, "precision": "low", "power": "normal",
    "memory": "low", "mllm": {}, "quant_qkv": 8, "attention_mode": 8, "use_mmap": False,
    "use_cached_mmap": True, "mmap_size": 1024, "dynamic_option": 0, "kvcache_mmap": False, "kvcache_limit": -1,
    "tmp_path": "", "prefix_cache_path": "prefixcache", "cpu_sme2_neon_division_ratio": 41,
    "cpu_sme_core_num": 2, "enable_debug": False, "chunk": 0, "chunk_limits": [],
    "hidden_states": False,
    "talker_model": B + "talker.mnn", "talker_weight": B + "talker.mnn.weight",
    "talker_embedding_file": B + "talker_embeddings_bf16.bin", "predit_model": B + "predit.mnn",
    "dit_model": B + "dit.mnn", "bigvgan_model": B + "bigvgan.mnn",
    "spk_dict": B + "spk_dict.mnn", "talker_max_new_tokens": 2048, "talker_speaker": "Chelsie",
    "dit_steps": 5, "dit_solver": 1,
    "model_type": "", "is_single": True, "is_visual": False, "is_audio": False,
    "audio_type": "whisper", "is_mrope": False, "has_talker": False, "has_deepstack": False,
    "ple_embed_file": B, "ple_embed_scale": 1.0, "ple_embed_dim": 0, "ple_quant": [],
    "attn_scale": 0.0, "use_template": True, "system_prompt": "", "hidden_size": 4096,
    "layer_nums": 32, "key_value_shape": [], "attention_mask": "int", "attention_type": "full",
    "sliding_window": 0, "attention_fused": True, "tie_embeddings": None, "jinja": {},
    "bos": "", "system_prompt_template": "<|im_start|>system\n%s<|im_end|>\n",
    "user_prompt_template": "<|im_start|>user\n%s<|im_end|>\n",
    "assistant_prompt_template": "<|im_start|>assistant\n%s<|im_end|>\n", "chat_template": "",
    "prompt_template": "<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n",
    "sampler_type": "mixed",
    "mixed_samplers": ["topK", "tfs", "typical", "topP", "min_p", "temperature"],
    "temperature": 1.0, "top_k": 40, "top_p": 0.9, "min_p": 0.1, "tfs_z": 1.0, "typical": 1.0,
    "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
    "penalty_window": 0, "n_gram": 8, "ngram_factor": 1.0, "penalty_sampler": "greedy",
    "logit_bias": {}, "banned_tokens": [],
    "speculative_type": "", "draft_predict_length": 3, "draft_match_strictness": "low",
    "draft_selection_rule": "freqxlen", "ngram_match_maxlen": 4,
    "lookup_file": B + "lookup_file.txt", "ngram_update": False, "draft_model": B,
    "mtp_model": B + "mtp.mnn", "eagle_model": B + "eagle.mnn", "eagle_fc": B + "eagle_fc.mnn",
    "eagle_d2t": B + "eagle_d2t.mnn", "eagle_depth": 3, "eagle_topk": 1,
    "draft_adaptive": True,  # ours (draft_budget.py): MNN always drafts
}

_ORACLE = textwrap.dedent("""
    import json, sys
    import MNN.llm as llm
    m = llm.create(sys.argv[1])
    m.load()
    for change in json.loads(sys.argv[2]):
        assert m.set_config(change)
    print("DUMP" + m._c_obj.dump_config())
""")


def mnn_dump_config(config_path: Path, changes: list[dict[str, Any]] = ()) -> dict[str, Any]:
    """MNN's own merged document after load() (and set_config calls), from a subprocess."""
    run = subprocess.run([sys.executable, "-c", _ORACLE, str(config_path), json.dumps(changes)],
                         capture_output=True, text=True, timeout=300)
    dumps = [line[4:] for line in run.stdout.splitlines() if line.startswith("DUMP")]
    assert run.returncode == 0 and dumps, run.stdout + run.stderr
    return json.loads(dumps[0])


def write_json(path: Path, value: Any) -> Path:
    path.write_text(json.dumps(value), encoding="utf-8")
    return path


def model_copy(folder: Path, config: dict[str, Any], llm_config: dict[str, Any] | None,
               llm_config_name: str = "llm_config.json") -> Path:
    """A model folder with the real weights linked in and the given JSON files."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in MODEL_FILES:
        (folder / name).symlink_to(MODEL_DIR / name)
    if llm_config is not None:
        write_json(folder / llm_config_name, llm_config)
    return write_json(folder / "config.json", config)


def real_json(name: str) -> dict[str, Any]:
    return json.loads((MODEL_DIR / name).read_text(encoding="utf-8"))


def test_every_known_key_defaults_to_mnns_value():
    cfg = LlmConfig({}, base_dir=B)
    assert set(MNN_DEFAULTS) == set(LlmConfig.known_keys())
    assert {key: getattr(cfg, key) for key in MNN_DEFAULTS} == MNN_DEFAULTS
    assert cfg.block_model_path(2) == B + "block_2.mnn"
    assert cfg.runtime_options() == RuntimeOptions("cpu", 4, "low", "normal", "low")


def test_attention_mode_defaults_to_legacy_quant_qkv():
    assert LlmConfig({"quant_qkv": 9}).attention_mode == 9
    assert LlmConfig({"quant_qkv": 9, "attention_mode": 10}).attention_mode == 10


@pytest.mark.parametrize(("keys", "expected"), [
    ({"topK": 5}, 5), ({"top_k": 7, "topK": 5}, 7), ({"top_k": -1, "topK": 5}, 5),
    ({"top_k": -1}, 40)])
def test_snake_case_sampler_key_wins_over_legacy_unless_negative(keys, expected):
    assert LlmConfig(keys).top_k == expected


def test_legacy_penalty_is_read_when_repetition_penalty_is_absent():
    assert LlmConfig({"penalty": 1.3}).repetition_penalty == pytest.approx(1.3)


def test_integer_literal_is_accepted_for_a_float_key():
    value = LlmConfig({"temperature": 1}).temperature
    assert value == 1.0 and isinstance(value, float)


def test_mllm_object_gives_its_own_runtime_options():
    cfg = LlmConfig({"thread_num": 8, "mllm": {"backend_type": "opencl", "thread_num": 2}})
    assert cfg.runtime_options() == RuntimeOptions("cpu", 8, "low", "normal", "low")
    assert cfg.runtime_options(mllm=True) == RuntimeOptions("opencl", 2, "low", "normal", "low")


@needs_model
def test_real_model_files_resolve_next_to_its_config():
    cfg = LlmConfig.from_file(MODEL_DIR / "config.json")
    base = str(MODEL_DIR) + "/"
    assert cfg.base_dir == base
    assert (cfg.llm_model, cfg.llm_weight, cfg.tokenizer_file) == (
        base + "llm.mnn", base + "llm.mnn.weight", base + "tokenizer.mtok")
    assert (cfg.hidden_size, cfg.layer_nums, cfg.attention_mask) == (576, 30, "float")
    assert (cfg.model_type, cfg.temperature, cfg.top_k, cfg.min_p) == ("llama", 0.8, 40, 0.05)
    assert cfg["tie_embeddings"]["quant_block"] == 64


@needs_model
@needs_mnn
@pytest.mark.oracle
def test_merged_real_config_equals_mnns_dump_config():
    cfg = LlmConfig.from_file(MODEL_DIR / "config.json")
    expected = mnn_dump_config(MODEL_DIR / "config.json")
    assert cfg.to_dict() == expected
    assert list(cfg.to_dict()) == list(expected)


@needs_model
@needs_mnn
@pytest.mark.oracle
def test_conflicting_files_and_context_merge_like_mnn(tmp_path):
    config = real_json("config.json") | {
        "hidden_size": 1, "llm_config": "model.json", "only_in_config": True,
        "jinja": {"chat_template": "overridden", "extra": "kept"}}
    llm_config = real_json("llm_config.json") | {"only_in_llm_config": [1, 2]}
    path = model_copy(tmp_path, config, llm_config, "model.json")
    write_json(tmp_path / "context.json", {"tools": [], "enable_thinking": False})
    changes = [{"jinja": {"bos": "X"}, "thread_num": 2, "new_key": {"a": 1}}]

    cfg = LlmConfig.from_file(path)
    for change in changes:
        cfg.set_config(change)
    expected = mnn_dump_config(path, changes)
    assert cfg.to_dict() == expected
    assert list(cfg.to_dict()) == list(expected)
    assert list(cfg.jinja) == list(expected["jinja"])


def test_llm_config_json_wins_and_objects_merge_key_by_key(tmp_path):
    write_json(tmp_path / "llm_config.json", {
        "hidden_size": 576, "jinja": {"chat_template": "T", "bos": "<s>"}, "late": 1})
    path = write_json(tmp_path / "config.json", {
        "hidden_size": 1, "thread_num": 2, "jinja": {"chat_template": "C", "extra": "E"}})
    cfg = LlmConfig.from_file(path)
    assert cfg.hidden_size == 576 and cfg.thread_num == 2
    assert cfg.jinja == {"chat_template": "T", "extra": "E", "bos": "<s>"}
    assert list(cfg.to_dict()) == ["hidden_size", "thread_num", "jinja", "late"]
    assert cfg.origin("jinja") == str(tmp_path / "llm_config.json")
    assert cfg.origin("thread_num") == str(path)


def test_llm_config_key_names_another_file_in_the_folder(tmp_path):
    write_json(tmp_path / "model_info.json", {"layer_nums": 3})
    path = write_json(tmp_path / "config.json", {"llm_config": "model_info.json"})
    cfg = LlmConfig.from_file(path)
    assert cfg.layer_nums == 3
    assert cfg.llm_config == f"{tmp_path}/model_info.json"


def test_base_dir_key_relocates_every_model_file(tmp_path):
    model = tmp_path / "weights"
    model.mkdir()
    write_json(model / "llm_config.json", {"hidden_size": 64})
    write_json(model / "context.json", {"who": "me"})
    path = write_json(tmp_path / "config.json", {"base_dir": f"{model}/", "llm_model": "x.mnn"})
    cfg = LlmConfig.from_file(path)
    assert cfg.base_dir == f"{model}/"
    assert cfg.llm_model == f"{model}/x.mnn"
    assert cfg.hidden_size == 64 and cfg.jinja["context"] == {"who": "me"}


def test_base_dir_is_fixed_when_the_config_is_read(tmp_path):
    cfg = LlmConfig({}, base_dir=f"{tmp_path}/")
    cfg.set_config({"base_dir": "/elsewhere/", "llm_model": "lora.mnn"})
    assert cfg.llm_model == f"{tmp_path}/lora.mnn"


def test_config_named_without_folder_resolves_against_dot_slash(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_json(tmp_path / "config.json", {})
    write_json(tmp_path / "llm_config.json", {"layer_nums": 2})
    cfg = LlmConfig.from_file("config.json")
    assert cfg.base_dir == "./"
    assert cfg.llm_model == "./llm.mnn" and cfg.layer_nums == 2


def test_bare_mnn_path_names_model_and_weight(tmp_path):
    write_json(tmp_path / "llm_config.json", {"hidden_size": 8})
    cfg = LlmConfig.from_file(f"{tmp_path}/qwen.mnn")
    assert cfg.llm_model == f"{tmp_path}/qwen.mnn"
    assert cfg.llm_weight == f"{tmp_path}/qwen.mnn.weight"
    assert cfg.hidden_size == 8


def test_folder_path_is_used_verbatim_as_base_dir(tmp_path, caplog):
    write_json(tmp_path / "llm_config.json", {"hidden_size": 8})
    assert LlmConfig.from_file(f"{tmp_path}/").hidden_size == 8
    with caplog.at_level(logging.WARNING, logger="mnnllm_core.llm.config"):
        cfg = LlmConfig.from_file(str(tmp_path))
    assert cfg.llm_model == f"{tmp_path}llm.mnn"
    assert "no trailing separator" in caplog.text


def test_tmp_and_prefix_cache_paths_are_used_as_given():
    cfg = LlmConfig({"tmp_path": "tmp", "prefix_cache_path": "cache"}, base_dir=B)
    assert (cfg.tmp_path, cfg.prefix_cache_path) == ("tmp", "cache")


def test_context_json_merges_into_jinja_context(tmp_path):
    write_json(tmp_path / "llm_config.json", {"jinja": {"context": {"a": 1, "b": 2}}})
    write_json(tmp_path / "context.json", {"b": 3, "c": [4]})
    cfg = LlmConfig.from_file(write_json(tmp_path / "config.json", {}))
    assert cfg.jinja["context"] == {"a": 1, "b": 3, "c": [4]}
    assert cfg.origin("jinja") == str(tmp_path / "llm_config.json")


def test_context_file_key_picks_another_context(tmp_path):
    write_json(tmp_path / "ctx.json", {"x": 1})
    cfg = LlmConfig.from_file(write_json(tmp_path / "config.json", {"context_file": "ctx.json"}))
    assert cfg.jinja == {"context": {"x": 1}}


def test_unknown_keys_are_kept_and_readable(tmp_path):
    write_json(tmp_path / "llm_config.json", {"rope_theta": 1e5})
    cfg = LlmConfig.from_file(write_json(tmp_path / "config.json", {"my_flag": {"on": True}}))
    assert cfg.get("rope_theta") == 1e5 and cfg["my_flag"] == {"on": True}
    assert "my_flag" in cfg and cfg.get("absent", "d") == "d"
    assert cfg.to_dict() == {"my_flag": {"on": True}, "rope_theta": 1e5}


def test_returned_values_are_copies():
    cfg = LlmConfig({"jinja": {"bos": "<s>"}})
    cfg.jinja["bos"] = "changed"
    cfg.get("jinja")["bos"] = "changed"
    cfg.to_dict()["jinja"]["bos"] = "changed"
    assert cfg.jinja == {"bos": "<s>"}


def test_missing_llm_config_is_allowed_with_a_warning(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="mnnllm_core.llm.config"):
        cfg = LlmConfig.from_file(write_json(tmp_path / "config.json", {"thread_num": 2}))
    assert cfg.thread_num == 2 and cfg.hidden_size == 4096
    assert "llm_config.json" in caplog.text


def test_missing_config_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError) as err:
        LlmConfig.from_file(tmp_path / "config.json")
    assert err.value.file == str(tmp_path / "config.json")


@pytest.mark.parametrize("broken", ["config.json", "llm_config.json", "context.json"])
def test_malformed_json_names_the_file(tmp_path, broken):
    for name in ("config.json", "llm_config.json", "context.json"):
        write_json(tmp_path / name, {})
    (tmp_path / broken).write_text('{"thread_num": 4,,}', encoding="utf-8")
    with pytest.raises(ConfigError, match="malformed JSON") as err:
        LlmConfig.from_file(tmp_path / "config.json")
    assert err.value.file == str(tmp_path / broken)


@pytest.mark.parametrize("text", ['{"temperature": NaN}', "[1, 2]", b"\xff\xfe{}"])
def test_non_json_or_non_object_config_is_rejected(tmp_path, text):
    path = tmp_path / "config.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ConfigError) as err:
        LlmConfig.from_file(path)
    assert err.value.file == str(path)


@pytest.mark.parametrize(("key", "value", "field"), [
    ("thread_num", "abc", "thread_num"), ("thread_num", 4.0, "thread_num"),
    ("thread_num", True, "thread_num"), ("max_all_tokens", 2 ** 40, "max_all_tokens"),
    ("temperature", "hot", "temperature"),
    pytest.param("temperature", 10 ** 400, "temperature", id="temperature-huge-int"), ("reuse_kv", 1, "reuse_kv"),
    ("llm_model", 3, "llm_model"), ("mixed_samplers", ["topK", 1], "mixed_samplers"),
    ("key_value_shape", [1.5], "key_value_shape"), ("topK", "40", "topK"),
    ("jinja", "template", "jinja"), ("async", "yes", "async"),
    ("mllm", {"thread_num": "x"}, "mllm.thread_num")])
def test_wrong_value_type_names_file_and_field(tmp_path, key, value, field):
    path = write_json(tmp_path / "config.json", {key: value})
    with pytest.raises(ConfigError) as err:
        LlmConfig.from_file(path)
    assert (err.value.file, err.value.field) == (str(path), field)


@pytest.mark.parametrize(("key", "value"), [("allow_fallback", "false"), ("allow_fallback", 0),
                                            ("backend_hints", ["torch_device", "cuda"])])
def test_wrongly_typed_runtime_option_is_a_config_error_naming_it(key, value):
    cfg = LlmConfig({"backend_type": "cpu"})
    cfg.set_config({key: value})
    with pytest.raises(ConfigError) as err:
        init_runtime(cfg)
    assert (err.value.file, err.value.field) == ("set_config", key)


def test_wrong_type_in_llm_config_names_that_file(tmp_path):
    llm_config = write_json(tmp_path / "llm_config.json", {"hidden_size": "576"})
    with pytest.raises(ConfigError) as err:
        LlmConfig.from_file(write_json(tmp_path / "config.json", {}))
    assert (err.value.file, err.value.field) == (str(llm_config), "hidden_size")


def test_null_value_means_mnns_default():
    assert LlmConfig({"thread_num": None}).thread_num == 4


def test_set_config_accepts_json_text_and_merges_recursively():
    cfg = LlmConfig({"jinja": {"bos": "<s>", "eos": "</s>"}, "thread_num": 4})
    cfg.set_config('{"jinja": {"eos": "<|end|>"}, "thread_num": 1, "extra": [1]}')
    assert cfg.to_dict() == {"jinja": {"bos": "<s>", "eos": "<|end|>"}, "thread_num": 1,
                             "extra": [1]}
    assert cfg.origin("extra") == "set_config"


@pytest.mark.parametrize(("content", "field"), [
    ('{"thread_num": ', None), ("[1]", None), ({"thread_num": "many"}, "thread_num")])
def test_rejected_set_config_raises_and_changes_nothing(content, field):
    cfg = LlmConfig({"thread_num": 4})
    with pytest.raises(ConfigError) as err:
        cfg.set_config(content)
    assert err.value.field == field and err.value.file == "set_config"
    assert cfg.to_dict() == {"thread_num": 4}


_json_leaf = st.one_of(st.integers(-5, 5), st.text(max_size=3), st.booleans())
_json_tree = st.recursive(_json_leaf, lambda kids: st.dictionaries(
    st.sampled_from("abcd"), kids, max_size=3), max_leaves=8)
_json_doc = st.dictionaries(st.sampled_from(["u1", "u2", "u3"]), _json_tree, max_size=3)


def _leaves(tree: Any, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    if isinstance(tree, dict) and tree:
        return {k: v for key, sub in tree.items() for k, v in _leaves(sub, prefix + (key,)).items()}
    return {prefix: tree}


@settings(max_examples=60, deadline=None)
@given(base=_json_doc, update=_json_doc)
def test_set_config_keeps_every_new_leaf_and_every_untouched_old_one(base, update):
    cfg = LlmConfig(base)
    cfg.set_config(update)
    merged = _leaves(cfg.to_dict())
    new = _leaves(update)
    for path, value in new.items():
        if path and value != {}:  # an empty object merges into, not over, an old one
            assert merged[path] == value
    for path, value in _leaves(base).items():
        touched = any(path[:len(p)] == p or p[:len(path)] == path for p in new if p)
        if path and not touched:
            assert merged[path] == value



# --- the config path a user gives (create and the CLI): a folder, or a file of the model -----------

def test_a_model_folder_stands_for_its_config_json(tmp_path):
    from mnnllm_core.llm.config import resolve_config_path
    write_json(tmp_path / "config.json", {})
    write_json(tmp_path / "llm_config.json", {})
    assert resolve_config_path(tmp_path) == str(tmp_path / "config.json")
    assert resolve_config_path(str(tmp_path) + "/") == str(tmp_path / "config.json")


def test_a_folder_without_config_json_stands_for_its_llm_config_json(tmp_path):
    from mnnllm_core.llm.config import resolve_config_path
    write_json(tmp_path / "llm_config.json", {"hidden_size": 8})
    path = resolve_config_path(tmp_path)
    assert path == str(tmp_path / "llm_config.json")
    assert LlmConfig.from_file(path).llm_model == f"{tmp_path}/llm.mnn"


def test_a_folder_without_any_config_is_a_config_error_naming_it(tmp_path):
    from mnnllm_core.llm.config import resolve_config_path
    with pytest.raises(ConfigError, match="config.json or llm_config.json") as err:
        resolve_config_path(tmp_path)
    assert err.value.file == str(tmp_path)


@pytest.mark.parametrize("name", ["llm.mnn", "llm.mnn.weight"])
def test_a_model_file_is_refused_naming_the_config_to_pass(tmp_path, name):
    from mnnllm_core.llm.config import resolve_config_path
    write_json(tmp_path / "config.json", {})
    (tmp_path / name).write_bytes(b"")
    with pytest.raises(ConfigError, match="not its config") as err:
        resolve_config_path(tmp_path / name)
    assert err.value.file == str(tmp_path / name) and f"pass {tmp_path / 'config.json'}" in str(err.value)


@needs_model
def test_create_takes_the_model_folder_with_no_warning(caplog):
    import mnnllm_core
    with caplog.at_level(logging.WARNING):
        llm = mnnllm_core.create(MODEL_DIR)
    assert llm.config.llm_model == f"{MODEL_DIR}/llm.mnn" and llm.config.tokenizer_file == f"{MODEL_DIR}/tokenizer.mtok"
    assert caplog.text == ""
