"""Every public call of the Python API refuses a wrong argument with a typed MnnllmError that
names it, before anything changes: `create`, and each public method of Llm, Omni and Embedding,
found by introspection (a new method is covered as soon as it exists; one with a parameter this
file does not know fails until VALID learns it). After all the bad calls on one loaded Llm its
greedy answer equals the one it gave fresh. Calls that need the model raise NotLoadedError
before load(). The calls a reliability review found untyped are listed one by one."""
from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping, Sequence, Set

import numpy as np
import pytest

import mnnllm_core
from mnnllm_core.errors import ArgumentError, MnnllmError, NotLoadedError, UnsupportedError
from mnnllm_core.llm.config import LlmConfig
from mnnllm_core.llm.constraint import Constraint
from mnnllm_core.llm.llm import Llm
from mnnllm_core.llm.omni import Omni
from mnnllm_core.llm.sampler import Sampler
from mnnllm_core.llm.text_embedding import Embedding
from paths import CONFIG

QUESTION = "What is the capital of France?"
MAX_NEW = 8
EXACT_CPU = {"sampler_type": "greedy", "memory": "normal", "thread_num": 2}


@pytest.fixture(scope="module")
def loaded():
    """The model loaded once, and its greedy answer to QUESTION while fresh."""
    llm = mnnllm_core.create(CONFIG)
    llm.set_config(EXACT_CPU)
    llm.load()
    return llm, llm.response(QUESTION, max_new_tokens=MAX_NEW)


# -- what each parameter takes -------------------------------------------------------------
def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _is_list(v) -> bool:
    return isinstance(v, Sequence) and not isinstance(v, (str, bytes, bytearray, Mapping, Set))


def _is_ids(v) -> bool:
    if isinstance(v, np.ndarray):
        return v.ndim == 1 and np.issubdtype(v.dtype, np.integer)
    return _is_list(v) and all(_is_int(t) for t in v)


def _is_message(m) -> bool:
    if isinstance(m, tuple):
        return len(m) == 2 and all(isinstance(x, str) for x in m)
    return (isinstance(m, Mapping) and isinstance(m.get("role"), str) and "content" in m
            and (isinstance(m["content"], str)
                 or (isinstance(m["content"], list) and all(isinstance(p, Mapping) for p in m["content"]))))


def _is_messages(v) -> bool:
    return isinstance(v, str) or (_is_list(v) and all(_is_message(m) for m in v))


def _optional(check):
    return lambda v: v is None or check(v)


def _is_bool(v) -> bool:
    return isinstance(v, (bool, np.bool_))


IDS = [1, 504, 3458, 282, 4649, 47]  # "What is the capital of France" in SmolLM2's vocabulary

VALID = {  # parameter name -> (a valid value, what the parameter takes)
    "config_path": (str(CONFIG), lambda v: isinstance(v, str)),
    "embedding_model": (False, _is_bool),
    "base": (None, _optional(lambda v: isinstance(v, Llm))),
    "prompt": (QUESTION, _is_messages),
    "messages": (QUESTION, _is_messages),
    "text": (QUESTION, lambda v: isinstance(v, str)),
    "texts": ([QUESTION], lambda v: _is_list(v) and all(isinstance(t, str) for t in v)),
    "input_ids": (IDS, _is_ids),
    "prompt_ids": (IDS, _is_ids),
    "ids": (IDS, _is_ids),
    "parents": (None, _optional(_is_ids)),
    "max_new_tokens": (MAX_NEW, _optional(lambda v: _is_int(v) and v >= 1)),
    "stream": (False, _is_bool),
    "all_logits": (None, _optional(_is_bool)),
    "sampler": (None, _optional(lambda v: isinstance(v, Sampler))),
    "content": ({}, lambda v: isinstance(v, (Mapping, str))),
    "source": ("set_config", lambda v: isinstance(v, str)),
    "overrides": ({}, lambda v: isinstance(v, Mapping)),
    "lora_path": ("lora.mnn", lambda v: isinstance(v, str)),
    "images": (None, _optional(lambda v: isinstance(v, Mapping))),
    "tools": (None, _optional(lambda v: _is_list(v) and all(isinstance(t, Mapping) for t in v))),
    "constraint": (None, _optional(lambda v: isinstance(v, (Constraint, Mapping)))),
    "logits_processor": (None, _optional(lambda v: callable(v) or (_is_list(v) and all(callable(f) for f in v)))),
    "logprobs": (None, _optional(lambda v: _is_int(v) and 0 <= v <= 20)),
    "config": ({}, lambda v: isinstance(v, (Mapping, str))),
    "token": (IDS, _is_ids),
    "begin": (0, lambda v: _is_int(v) and v >= 0),
    "end": (0, lambda v: _is_int(v) and v >= 0),
    "end_with": (None, _optional(lambda v: isinstance(v, str))),
    "what": ("a step", lambda v: isinstance(v, str)),
}
TAKES = {("tokenizer_decode", "token"): lambda v: _is_int(v) or _is_ids(v),  # one id, or a list
         ("generate_init", "stream"): lambda v: v is None or v is False}  # pymnn's: no stream object here

HOSTILE = [None, 7, -3, 2.5, float("nan"), True, "x", "", b"ids", {1: 2}, {"role": "user", "content": "hi"},
           [None], [[1, 2]], ["x"], [1.5], [True], [{"role": 1, "content": "x"}], [{"content": "x"}],
           [{"role": "user"}], [{"role": "user", "content": None}], [{"role": "user", "content": [5]}],
           [("user",)], [1, 2], {1, 2}, np.zeros((2, 2), np.int32), np.array([1.5]), object()]

NEEDS_NO_MODEL = {"load", "reset", "set_config", "dim", "cached_prefix", "make_sampler", "dump_config", "get_log",
                  "generate_init", "reply_budget", "exclusive"}  # the config is enough


def _public_methods(cls) -> list[str]:
    return sorted(name for name, member in inspect.getmembers(cls, inspect.isfunction) if not name.startswith("_"))


def _parameters(function) -> list[str]:
    names = [p for p in inspect.signature(function).parameters if p != "self"]
    unknown = [p for p in names if p not in VALID]
    assert not unknown, f"{function.__qualname__}: add a valid value for {unknown} to VALID"
    return names


def _call(function, **arguments):
    """The call's result, an iterator (a stream) run to its end."""
    result = function(**arguments)
    return list(result) if isinstance(result, Iterator) else result


def _bad_calls(name, function):
    """(parameter, hostile value, the call) for each hostile value the parameter does not take."""
    params = _parameters(function)
    for param in params:
        takes = TAKES.get((name, param), VALID[param][1])
        for bad in HOSTILE:
            if not takes(bad):
                arguments = {p: VALID[p][0] for p in params}
                arguments[param] = bad
                yield param, bad, lambda arguments=arguments: _call(function, **arguments)


def _assert_refused(what, param, bad, call, exempt=()):
    try:
        result = call()
    except MnnllmError as err:
        if isinstance(err, exempt):
            return
        assert (err.field or "").startswith(param), f"{what}({param}={bad!r}): {err!r} does not name {param}"
    except Exception as err:  # noqa: BLE001 - the point: nothing untyped gets out
        pytest.fail(f"{what}({param}={bad!r}) raised {type(err).__name__}: {err}")
    else:
        pytest.fail(f"{what}({param}={bad!r}) was accepted: {result!r:.80}")


# -- the calls the review found, one by one ------------------------------------------------------
FOUND_UNTYPED = {
    "generate(None)": lambda llm: llm.generate(None),
    "response(None)": lambda llm: llm.response(None),
    "response(123)": lambda llm: llm.response(123),
    "response role 1": lambda llm: llm.response([{"role": 1, "content": "x"}]),
    "response without role": lambda llm: llm.response([{"content": "x"}]),
    "response([1, 2])": lambda llm: llm.response([1, 2]),
    "tokenizer_decode(None)": lambda llm: llm.tokenizer_decode(None),
    "apply_chat_template(5)": lambda llm: llm.apply_chat_template(5),
    "forward(None)": lambda llm: llm.forward(None),
    "create(None)": lambda llm: mnnllm_core.create(None),
    "create(5)": lambda llm: mnnllm_core.create(5),
    "generate({1: 2}, 2)": lambda llm: llm.generate({1: 2}, 2),
}


@pytest.mark.parametrize("call", FOUND_UNTYPED.values(), ids=FOUND_UNTYPED.keys())
def test_the_calls_the_review_found_raise_argument_errors(loaded, call):
    with pytest.raises(ArgumentError):
        call(loaded[0])


@pytest.mark.parametrize("call", [lambda llm: llm.response(QUESTION), lambda llm: llm.generate(IDS, 2)],
                         ids=["response", "generate"])
def test_generating_before_load_is_a_not_loaded_error(call):
    with pytest.raises(NotLoadedError, match=r"call load\(\) before"):
        call(mnnllm_core.create(CONFIG))


# -- every public call -----------------------------------------------------------------------
def test_create_refuses_wrong_arguments():
    for param, bad, call in _bad_calls("create", mnnllm_core.create):
        _assert_refused("create", param, bad, call)


@pytest.mark.parametrize("cls", [Llm, Omni, Embedding])
def test_every_public_method_needs_the_model_or_works_before_load(cls):
    """Before load(), a call that needs the model (its valid arguments given) is a NotLoadedError
    (an embedding model's generation calls are unsupported whatever its state)."""
    unloaded = cls(LlmConfig.from_file(str(CONFIG)))
    for name in _public_methods(cls):
        if name in NEEDS_NO_MODEL:
            continue
        arguments = {p: VALID[p][0] for p in _parameters(getattr(cls, name))}
        expected = (NotLoadedError, UnsupportedError) if cls is Embedding else NotLoadedError
        with pytest.raises(expected, match=None if cls is Embedding else rf"before {name}"):
            _call(getattr(unloaded, name), **arguments)


@pytest.mark.parametrize("cls", [Omni, Embedding])
def test_the_subclasses_check_arguments_before_the_model(cls):
    unloaded = cls(LlmConfig.from_file(str(CONFIG)))
    exempt = (UnsupportedError,) if cls is Embedding else ()  # an embedding model does not generate
    for name in _public_methods(cls):
        if name == "set_config":  # it changes the config: run on the loaded Llm below
            continue
        for param, bad, call in _bad_calls(name, getattr(unloaded, name)):
            _assert_refused(f"{cls.__name__}.{name}", param, bad, call, exempt)


def test_every_public_method_refuses_wrong_arguments_and_leaves_the_llm_as_it_was(loaded):
    llm, fresh_answer = loaded
    covered = []
    for name in _public_methods(Llm):
        calls = list(_bad_calls(name, getattr(llm, name)))
        for param, bad, call in calls:
            _assert_refused(f"Llm.{name}", param, bad, call)
        covered += [name] if calls else []
    assert {"response", "generate", "stream_ids", "stream_text", "forward", "tokenizer_encode", "tokenizer_decode",
            "apply_chat_template", "set_config", "make_sampler", "cached_prefix", "create_lora"} <= set(covered)
    assert llm.response(QUESTION, max_new_tokens=MAX_NEW) == fresh_answer
