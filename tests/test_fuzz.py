"""A bounded fuzz job over what a model folder holds, on the small corpus in tests/fuzz_corpus (a
tiny exported llama, 4-bit, and a tokenizer.json): the graph reader, the weight headers and
blocks (a full load), both tokenizer formats and both configs, each mutated by bit flips,
truncations, splices and JSON type confusions. Every case must load or raise one of the
project's errors: never another exception, a hang (an alarm per case) or an allocation past
a bound (tracemalloc's peak). Part of the normal test run, about a minute in all."""
from __future__ import annotations

import json
import shutil
import signal
import tracemalloc
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mnnllm_core
from mnnllm_core.errors import MnnllmError
from mnnllm_core.express.module import Module
from mnnllm_core.express.static_module import Config
from mnnllm_core.llm.tokenizer import create_tokenizer
from mnnllm_core.schema.reader import read_net

CORPUS = Path(__file__).parent / "fuzz_corpus"
MODEL = CORPUS / "tiny-llama-q4"
SECONDS = 20  # one case; the slowest correct one (a full load) takes well under a second
MAX_BYTES = 256 << 20  # Python-side allocation of one case
FUZZ = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@contextmanager
def bounded():
    """Fail a case that runs past SECONDS or allocates past MAX_BYTES."""
    def late(signum, frame):
        raise TimeoutError(f"a fuzz case ran past {SECONDS} s")

    previous = signal.signal(signal.SIGALRM, late)
    signal.alarm(SECONDS)
    tracemalloc.start()
    try:
        yield
        peak = tracemalloc.get_traced_memory()[1]
        assert peak < MAX_BYTES, f"a fuzz case allocated {peak} bytes"
    finally:
        tracemalloc.stop()
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def typed_or_loads(call) -> None:
    with bounded():
        try:
            call()
        except MnnllmError:
            pass


@st.composite
def mutated(draw, data: bytes) -> bytes:
    """`data` with a few bit flips, a truncation, a splice of random bytes, or a run of 0xff/0x00."""
    kind = draw(st.sampled_from(["flip", "truncate", "splice", "fill"]))
    out = bytearray(data)
    if kind == "flip":
        for _ in range(draw(st.integers(1, 8))):
            at = draw(st.integers(0, len(out) - 1))
            out[at] ^= 1 << draw(st.integers(0, 7))
    elif kind == "truncate":
        del out[draw(st.integers(0, len(out) - 1)):]
    elif kind == "splice":
        at = draw(st.integers(0, len(out)))
        out[at:at + draw(st.integers(0, 64))] = draw(st.binary(min_size=1, max_size=64))
    else:
        at = draw(st.integers(0, len(out) - 1))
        out[at:at + draw(st.integers(1, 16))] = bytes([draw(st.sampled_from([0x00, 0xff, 0x7f]))]) * 16
    return bytes(out)


def model_copy(tmp_path: Path, name: str, data: bytes) -> Path:
    """The corpus model with the file `name` replaced by `data` (one folder per test, reused)."""
    folder = tmp_path / "model"
    if folder.exists():
        shutil.rmtree(folder)
    shutil.copytree(MODEL, folder)
    (folder / name).write_bytes(data)
    return folder


GRAPH, WEIGHTS, MTOK = (MODEL / name for name in ("llm.mnn", "llm.mnn.weight", "tokenizer.mtok"))


def test_the_corpus_loads_and_answers():
    llm = mnnllm_core.create(MODEL / "config.json")
    llm.set_config({"sampler_type": "greedy"})
    llm.load()
    assert len(llm.generate(llm.tokenizer_encode("hi there"), 3)) == 3


@FUZZ
@given(data=mutated(GRAPH.read_bytes()))
def test_the_graph_reader(data):
    typed_or_loads(lambda: read_net(data, "llm.mnn"))


@FUZZ
@given(data=mutated(GRAPH.read_bytes()))
def test_a_mutated_graph_loads_with_its_weights_or_is_refused(tmp_path, data):
    folder = model_copy(tmp_path, "llm.mnn", data)
    typed_or_loads(lambda: Module.load([], ["logits"], folder / "llm.mnn", config=Config(rearrange=True)))


@FUZZ
@given(data=mutated(WEIGHTS.read_bytes()))
def test_weight_headers_and_blocks(tmp_path, data):
    folder = model_copy(tmp_path, "llm.mnn.weight", data)
    typed_or_loads(lambda: Module.load([], ["logits"], folder / "llm.mnn", config=Config(rearrange=True)))


@FUZZ
@given(data=mutated(MTOK.read_bytes()))
def test_the_mtok_tokenizer(tmp_path, data):
    path = tmp_path / "tokenizer.mtok"
    path.write_bytes(data)
    typed_or_loads(lambda: create_tokenizer(str(path)).encode("Hello, world! 1+1=2"))


@FUZZ
@given(data=mutated((CORPUS / "tokenizer.json").read_bytes()))
def test_the_json_tokenizer(tmp_path, data):
    path = tmp_path / "tokenizer.json"
    path.write_bytes(data)
    typed_or_loads(lambda: create_tokenizer(str(path)).encode("Hello, world! 1+1=2"))


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70)
                           | st.floats(allow_nan=False) | st.text(max_size=20),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                       max_size=4), max_leaves=10)


def confused(document: dict) -> st.SearchStrategy[dict]:
    """The JSON object with some of its keys (nested ones too) given values of any JSON type."""
    paths = []

    def walk(node, path):
        for key, value in node.items():
            paths.append(path + (key,))
            if isinstance(value, dict):
                walk(value, path + (key,))
    walk(document, ())

    @st.composite
    def build(draw):
        out = json.loads(json.dumps(document))
        for path in draw(st.lists(st.sampled_from(paths), min_size=1, max_size=3)):
            node = out
            for key in path[:-1]:
                node = node.get(key) if isinstance(node, dict) else None
            if isinstance(node, dict):
                node[path[-1]] = draw(JSON_VALUES)
        return out
    return build()


def load_and_answer(folder: Path) -> None:
    llm = mnnllm_core.create(folder / "config.json")
    llm.load()
    llm.generate(llm.tokenizer_encode(llm.apply_chat_template("hi")), 2)


@FUZZ
@given(document=confused(json.loads((MODEL / "llm_config.json").read_text())))
def test_llm_config_type_confusions(tmp_path, document):
    folder = model_copy(tmp_path, "llm_config.json", json.dumps(document).encode())
    typed_or_loads(lambda: load_and_answer(folder))


@FUZZ
@given(document=confused(json.loads((MODEL / "config.json").read_text())))
def test_config_type_confusions(tmp_path, document):
    document.pop("thread_num", None)  # a huge thread count is a valid (slow) request, not a fault
    folder = model_copy(tmp_path, "config.json", json.dumps(document).encode())
    typed_or_loads(lambda: load_and_answer(folder))


@FUZZ
@given(data=mutated((MODEL / "llm_config.json").read_bytes()))
def test_llm_config_bytes(tmp_path, data):
    folder = model_copy(tmp_path, "llm_config.json", data)
    typed_or_loads(lambda: mnnllm_core.create(folder / "config.json"))


@pytest.mark.parametrize("name", ["llm.mnn", "llm.mnn.weight", "tokenizer.mtok"])
def test_the_corpus_is_small(name):
    assert (MODEL / name).stat().st_size < 100_000
