"""Hostile input gets a typed error, never a traceback or a silently wrong number: configs
(depth, ranges, tie_embeddings), tokenizer input and ids, native panics, an op failing inside
an Execution, max_new_tokens, huge prompts, one-line CLI errors."""
from __future__ import annotations

import dataclasses
import json

import pytest

import mnnllm_core
from mnnllm_backends.cpu.ops.attention import AttentionExecution
from mnnllm_core import cli
from mnnllm_core.errors import ConfigError, ContextLengthError, ExecutionError, TokenizerError
from mnnllm_core.llm.config import LlmConfig
from mnnllm_core.llm.disk_embedding import DiskEmbedding
from mnnllm_core.llm.tokenizer import create_tokenizer
from mnnllm_core.llm.tokenizer.base import SpecialIds, Tokenizer
from paths import MODEL_DIR, load_shared_greedy

TOKENIZER = MODEL_DIR / "tokenizer.mtok"


@pytest.fixture(scope="module")
def tokenizer():
    return create_tokenizer(str(TOKENIZER))


@pytest.fixture(scope="module")
def llm():
    return load_shared_greedy()


def model_copy(tmp_path, llm_config: dict | None = None, config: dict | None = None, raw_config: str | None = None):
    folder = tmp_path / "model"
    folder.mkdir()
    for name in ("config.json", "llm_config.json", "tokenizer.mtok", "llm.mnn", "llm.mnn.weight"):
        (folder / name).symlink_to(MODEL_DIR / name)
    for name, changes in (("llm_config.json", llm_config), ("config.json", config)):
        if changes:
            data = json.loads((MODEL_DIR / name).read_text())
            for key, value in changes.items():
                *parents, last = key.split(".")
                target = data
                for part in parents:
                    target = target[part]
                target[last] = value
            (folder / name).unlink()
            (folder / name).write_text(json.dumps(data))
    if raw_config is not None:
        (folder / "config.json").unlink()
        (folder / "config.json").write_text(raw_config)
    return folder / "config.json"


# -- configs ------------------------------------------------------------------------------
def test_deeply_nested_json_is_a_config_error(tmp_path):
    path = model_copy(tmp_path, raw_config='{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(ConfigError, match="nested deeper than 64"):
        mnnllm_core.create(path)


def test_nesting_within_the_limit_loads(tmp_path):
    path = model_copy(tmp_path, config={"deep": json.loads("[" * 60 + "]" * 60)})
    assert mnnllm_core.create(path).config.get("deep") is not None


@pytest.mark.parametrize("key, value, problem", [
    ("hidden_size", 0, "at least 1"), ("layer_nums", -3, "at least 1"), ("max_all_tokens", 0, "at least 1"),
    ("attention_mask", "banana", "one of 'int', 'float'"), ("hidden_size", 1.5, "a 32-bit integer")])
def test_numbers_and_words_out_of_range_are_config_errors_naming_file_and_field(tmp_path, key, value, problem):
    path = model_copy(tmp_path, llm_config={key: value})
    with pytest.raises(ConfigError, match=problem) as err:
        mnnllm_core.create(path)
    assert err.value.field == key and err.value.file.endswith("llm_config.json")


def test_a_huge_bad_value_is_quoted_short(tmp_path):
    path = model_copy(tmp_path, config={"thread_num": "x" * 100_000})
    with pytest.raises(ConfigError) as err:
        mnnllm_core.create(path)
    assert len(str(err.value)) < 300 and "more characters" in str(err.value)


@pytest.mark.parametrize("key, value", [("quant_block", 1e-320), ("weight_offset", 60005410.5),
                                        ("quant_bit", True), ("alpha_size", "1769472"), ("alpha_offset", -1)])
def test_tie_embeddings_numbers_must_be_integers(tmp_path, key, value):
    config = LlmConfig.from_file(model_copy(tmp_path, llm_config={f"tie_embeddings.{key}": value}))
    with pytest.raises(ConfigError, match=f"tie_embeddings.{key} must be an integer") as err:
        DiskEmbedding(config)
    assert err.value.field == f"tie_embeddings.{key}"


def test_a_quant_block_that_does_not_match_alpha_size_is_refused_not_read_as_garbage(tmp_path):
    config = LlmConfig.from_file(model_copy(tmp_path, llm_config={"tie_embeddings.quant_block": 0}))
    with pytest.raises(ConfigError, match="alpha_size 1769472 is neither 49152 rows x 1 blocks") as err:
        DiskEmbedding(config)
    assert err.value.field == "tie_embeddings.alpha_size"


def test_tie_embeddings_quant_block_0_is_one_block_per_row_as_mnn(tmp_path):
    tie = json.loads((MODEL_DIR / "llm_config.json").read_text())["tie_embeddings"]
    config = LlmConfig.from_file(model_copy(tmp_path, llm_config={
        "tie_embeddings.quant_block": 0, "tie_embeddings.alpha_size": tie["alpha_size"] // 9}))
    embedding = DiskEmbedding(config)
    assert embedding.rows.block == embedding.hidden == 576 and embedding.rows.blocks == 1


def test_a_path_that_is_not_unicode_is_a_config_error(tmp_path):
    llm = mnnllm_core.create(model_copy(tmp_path, raw_config='{"tokenizer_file": "\\ud800"}'))
    with pytest.raises(ConfigError, match="does not exist") as err:
        llm.load()
    assert err.value.field == "tokenizer_file"


# -- tokenizer ----------------------------------------------------------------------------
def test_text_that_is_not_unicode_is_a_tokenizer_error(tokenizer):
    with pytest.raises(TokenizerError, match="not valid Unicode"):
        tokenizer.encode("caf\udcff")


@pytest.mark.parametrize("ids", [[-1], [49152], [2 ** 64], ["5"], [1.0], [True]])
def test_ids_outside_the_vocabulary_are_tokenizer_errors(tokenizer, ids):
    with pytest.raises(TokenizerError, match="not in the vocabulary"):
        tokenizer.decode(ids)
    with pytest.raises(TokenizerError):
        tokenizer.decode_id(ids[0])


def test_stop_ids_outside_the_vocabulary_are_refused_at_load(tokenizer):
    with pytest.raises(TokenizerError, match="stop_ids are outside the vocabulary") as err:
        Tokenizer(tokenizer.backend, SpecialIds(stop=[2, 10 ** 6]), file="t.mtok")
    assert (err.value.file, err.value.field) == ("t.mtok", "stop_ids")


def test_a_panic_in_native_code_is_a_tokenizer_error(tokenizer, monkeypatch):
    PanicException = type("PanicException", (BaseException,), {})  # pyo3's is a BaseException

    class Panicking:
        def __getattr__(self, name):
            return getattr(tokenizer.backend, name)

        def encode(self, *args, **kwargs):
            raise PanicException("capacity overflow")

    monkeypatch.setattr(tokenizer, "backend", Panicking())
    with pytest.raises(TokenizerError, match="PanicException: capacity overflow"):
        tokenizer.encode("hello")


def test_a_huge_prompt_is_refused_without_tokenizing_it_whole(tokenizer, monkeypatch):
    seen = []
    original = tokenizer.backend

    class Counting:
        def __getattr__(self, name):
            return getattr(original, name)

        def encode(self, text, **kwargs):
            seen.append(len(text))
            return original.encode(text, **kwargs)

    monkeypatch.setattr(tokenizer, "backend", Counting())
    assert tokenizer.exceeds("cat " * 250_000, 2048)
    assert sum(seen) < 40_000  # of 1,000,000 characters
    seen.clear()
    assert not tokenizer.exceeds("cat " * 1000, 2048)  # short: encode it whole
    assert not tokenizer.exceeds("cat " * 10_000, 20_000)  # 10,000 tokens, in pieces, under the limit


def test_the_piecewise_count_never_refuses_a_text_that_fits(tokenizer):
    text = "The quick brown fox jumps over the lazy dog. " * 2000  # 90,000 characters, 20,001 tokens
    whole = len(tokenizer.encode(text))
    assert not tokenizer.exceeds(text, whole) and not tokenizer.exceeds(text, whole - 5)  # a lower bound...
    assert tokenizer.exceeds(text, whole // 2)  # ...that refuses a text well past the limit


# -- the engine ---------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [0, -5, 2.7, "5", True])
def test_max_new_tokens_must_be_a_positive_integer(llm, bad):
    llm.reset()
    with pytest.raises(ConfigError, match="max_new_tokens must be an integer >= 1") as err:
        llm.generate(llm.tokenizer_encode("Hi"), bad)
    assert err.value.field == "max_new_tokens"
    assert llm.context.history_tokens == []  # refused before anything ran


def test_a_1mb_prompt_is_a_context_length_error(llm):
    with pytest.raises(ContextLengthError, match="more than 2048 tokens"):
        llm.response("cat " * 250_000)


@pytest.mark.parametrize("replay", [False, True])
def test_an_op_failing_inside_its_execution_is_an_execution_error_naming_the_op(llm, monkeypatch, replay):
    def broken(self, *args):
        raise ValueError("operands could not be broadcast together")

    runtime = llm.runtime_manager.runtime
    hints = runtime.hints
    llm.reset()
    with monkeypatch.context() as patch:
        patch.setattr(runtime, "hints", dataclasses.replace(hints, replay=replay))
        llm.pool.clear()  # fresh clones read the hint
        patch.setattr(AttentionExecution, "on_execute", broken)
        patch.setattr(AttentionExecution, "before_run", broken)  # where a replayed cpu step keeps the KV books
        where = "the replayed step failed on cpu" if replay else r"op Attention '.*' failed while running on cpu"
        with pytest.raises(ExecutionError, match=where + ": ValueError") as err:
            llm.forward([1, 2, 3])
    llm.pool.clear()
    assert err.value.field == "replay" if replay else err.value.field and "Attention" in str(err.value)
    llm.reset()
    assert llm.response("What is the capital of France?") == "The capital of France is Paris."


# -- the CLI ------------------------------------------------------------------------------
def test_a_native_base_exception_is_one_line_in_the_cli(monkeypatch, capsys):
    PanicException = type("PanicException", (BaseException,), {})

    def panic(args):
        raise PanicException("called `Result::unwrap()` on an `Err` value " + "x" * 5000)

    monkeypatch.setattr(cli, "cmd_backends", panic)
    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    for action in parser._subparsers._group_actions[0].choices.values():
        if action.prog.endswith("backends"):
            action.set_defaults(func=panic)
    assert cli.main(["backends"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: unexpected PanicException") and len(err) < 320


def test_cli_errors_stay_one_short_line(tmp_path, capsys):
    path = model_copy(tmp_path, config={"thread_num": "y" * 100_000})
    assert cli.main(["run", str(path), "-p", "hi"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) < 320 and "thread_num" in err

