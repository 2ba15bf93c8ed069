"""The disk caches refuse a file changed after it was written (issue 29, items 1-4): a packed-weight
file (`use_mmap`) whose header or body was edited, a model weight file edited in the middle with
its mtime put back, a prefix-cache file whose token ids were relabelled. Each is detected before
its contents are used, removed with a warning and made again, and the answer is the uncached
one. And our own writer never truncates a pack another process has mapped."""
import json
import logging
import os
import shutil
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import mnnllm_core
from mnnllm_core.backend_api import WeightCache
from paths import CONFIG, REFERENCE, linked_model_copy
from test_prefix_cache import NEW_TOKENS, conversation, files

PROMPT = json.loads(REFERENCE.read_text())["prompts"][0]
EXPECTED = PROMPT["mnn_cpp_q4_memory_normal"]["gen_ids"][:8]
LINEARS = 211
LENGTH = struct.Struct("<I")  # the header's length, after the 8-byte magic, in both files
EDITED_OP = "/layers.0/self_attn/q_proj/Linear"


def load(config=CONFIG, **keys):
    llm = mnnllm_core.create(config)
    llm.set_config({"sampler_type": "greedy", "thread_num": 2, **keys})
    return llm.load()


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> Path:
    """A cache folder holding every pack of the shared model, made by one load."""
    folder = tmp_path_factory.mktemp("packs")
    load(use_mmap=True, tmp_path=str(folder))
    return folder


@pytest.fixture
def packs(packed, tmp_path) -> Path:
    """This test's own copy of the packs."""
    return Path(shutil.copytree(packed, tmp_path / "packs"))


def header_of(data: bytes) -> tuple[int, str]:
    """Where a pack's JSON header starts and its text: wherever the format puts it after the length."""
    (length,) = LENGTH.unpack_from(data, 8)
    start = data.index(b'{"name"')
    return start, data[start:start + length].decode()


def pack_of(folder: Path, op: str = EDITED_OP) -> Path:
    return next(p for p in folder.rglob("*.pw") if json.loads(header_of(p.read_bytes())[1])["name"].endswith(":" + op))


def arrays_of(data: bytes) -> dict[str, dict]:
    return {entry["key"]: entry for entry in json.loads(header_of(data)[1])["arrays"]}


def edit_header(path: Path, old: str, new: str) -> None:
    """One same-length edit of a pack's JSON header."""
    data = path.read_bytes()
    start, text = header_of(data)
    assert old in text and len(old) == len(new), (old, text)
    edited = text.replace(old, new, 1)
    path.write_bytes(data[:start] + edited.encode() + data[start + len(text):])


def answered_after_repacking(folder: Path, caplog) -> None:
    """A load from `folder` refuses the one edited pack with a warning, packs it again, answers
    the reference tokens, and the next load maps the fresh file."""
    with caplog.at_level(logging.WARNING, "mnnllm_core.core.weights.cache"):
        llm = load(use_mmap=True, tmp_path=str(folder))
        cache = llm.runtime_manager.runtime.weight_cache
        assert llm.generate(PROMPT["prompt_ids"], 8) == EXPECTED
    assert (cache.hits, cache.misses) == (LINEARS - 1, 1)
    assert "packing again" in caplog.text and EDITED_OP in caplog.text, caplog.text
    again = load(use_mmap=True, tmp_path=str(folder)).runtime_manager.runtime.weight_cache
    assert (again.hits, again.misses) == (LINEARS, 0)


# -- 1: a pack's header or body edited --------------------------------------------------------------
def test_a_pack_whose_array_offset_lost_a_digit_is_refused(packs, caplog):
    path = pack_of(packs)
    offset = arrays_of(path.read_bytes())["codes"]["offset"]
    edit_header(path, f'"offset": {offset}', f'"offset": {offset - 4}')
    answered_after_repacking(packs, caplog)


def test_a_pack_whose_codes_were_xored_is_refused(packs, caplog):
    path = pack_of(packs)
    data = bytearray(path.read_bytes())
    codes = arrays_of(data)["codes"]
    start, end = codes["offset"], codes["offset"] + int(np.prod(codes["shape"]))
    data[start:end] = (np.frombuffer(data[start:end], np.uint8) ^ 0x5A).tobytes()
    path.write_bytes(bytes(data))
    answered_after_repacking(packs, caplog)


@pytest.mark.parametrize("byte,bit", [(13, 0x01), (14, 0x01)])
def test_a_pack_with_flipped_bytes_is_refused_not_allocated_from(packs, caplog, byte, bit):
    """A flipped bit in a pack's stored shape used to ask numpy for TiBs (_ArrayMemoryError)."""
    path = pack_of(packs)
    data = bytearray(path.read_bytes())
    data[arrays_of(data)["shape"]["offset"] + byte] ^= bit  # the output-channel count, bit 40 or 48
    path.write_bytes(bytes(data))
    answered_after_repacking(packs, caplog)


@pytest.mark.parametrize("old,new", [('"shape": [4]', '"shape": [3]'), ('"dtype": "<i8"', '"dtype": "<i4"'),
                                     ('"dtype": "<u2"', '"dtype": "<f2"')])
def test_a_pack_header_edit_that_used_to_raise_is_refused(packs, caplog, old, new):
    """Edits that used to raise an untyped ValueError (or fail inside a kernel) at load or first run."""
    edit_header(pack_of(packs), old, new)
    answered_after_repacking(packs, caplog)


# -- 2: the model's identity --------------------------------------------------------------------------
def test_a_weight_file_edited_in_the_middle_with_its_mtime_restored_misses_the_cache(tmp_path):
    config = linked_model_copy(tmp_path / "model", "llm.mnn.weight")
    keys = {"use_mmap": True, "tmp_path": str(tmp_path / "packs")}
    load(config, **keys)
    weight = config.parent / "llm.mnn.weight"
    before = os.stat(weight)
    with open(weight, "r+b") as f:
        f.seek(before.st_size // 2)
        byte = f.read(1)
        f.seek(before.st_size // 2)
        f.write(bytes([byte[0] ^ 0x10]))
    os.utime(weight, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (os.stat(weight).st_size, os.stat(weight).st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    changed = load(config, **keys).runtime_manager.runtime.weight_cache
    assert (changed.hits, changed.misses) == (0, LINEARS)


# -- 3: the prefix cache's header ------------------------------------------------------------------------
def test_a_prefix_file_relabelled_with_another_prompts_tokens_is_refused_and_removed(tmp_path, caplog):
    plain = load()
    ids = {q: plain.tokenizer_encode(plain.apply_chat_template(conversation(q)))
           for q in ("When does it open?", "When does it close?")}
    opened, closed = ids.values()
    assert len(opened) == len(closed) and opened != closed
    expected = plain.generate(closed, NEW_TOKENS)
    llm = load(prefix_cache_path=str(tmp_path))
    llm.generate(opened, NEW_TOKENS)
    (saved,) = files(tmp_path)
    data = saved.read_bytes()
    (length,) = LENGTH.unpack_from(data, 8)
    header = json.loads(data[12:12 + length])
    header["tokens"] = closed
    text = json.dumps(header).encode()
    saved.write_bytes(data[:8] + LENGTH.pack(len(text)) + text + data[12 + length:])
    llm.reset()
    with caplog.at_level(logging.INFO, "mnnllm_core.llm.prefix_cache"):
        assert llm.generate(closed, NEW_TOKENS) == expected
    assert f"not using {saved}: " in caplog.text and "prompt tokens from" not in caplog.text, caplog.text
    assert not saved.exists() and len(files(tmp_path)) == 1  # the fresh prefill saved under its own name


# -- 4: our writer never truncates a mapped pack -------------------------------------------------------
MAPPER = textwrap.dedent("""
    import sys
    import numpy as np
    from mnnllm_core.backend_api import WeightCache
    cache = WeightCache.from_hints({"use_mmap": True, "tmp_path": sys.argv[1], "model_identity": "m"}, "cpu")
    made = {"codes": np.arange(4 << 20, dtype=np.uint32).astype(np.uint8)}
    mapped = cache.arrays("op", "v1", lambda: made)
    print("mapped", flush=True)
    sys.stdin.readline()  # another writer works meanwhile
    assert np.array_equal(mapped["codes"], made["codes"])  # a truncated mapping would die of SIGBUS here
    print("OK")
""")


@pytest.mark.parametrize("second", ["another layout version", "a damaged file"])
def test_a_second_writer_leaves_a_mapped_pack_valid(tmp_path, second):
    child = subprocess.Popen([sys.executable, "-c", MAPPER, str(tmp_path)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "mapped"
        cache = WeightCache.from_hints({"use_mmap": True, "tmp_path": str(tmp_path), "model_identity": "m"}, "cpu")
        (path,) = list(cache.folder.iterdir())
        inode = os.stat(path).st_ino
        version = "v1"
        if second == "a damaged file":  # refused, removed and written again by this process
            with open(path, "r+b") as f:
                f.seek(100)
                f.write(b"damage")
        else:
            version = "v2"
        small = cache.arrays("op", version, lambda: {"codes": np.zeros(10, np.uint8)})
        assert cache.misses == 1 and small["codes"].shape == (10,) and os.stat(path).st_ino != inode
        out, _ = child.communicate("go\n", timeout=60)
    finally:
        child.kill()
    assert child.returncode == 0 and out.strip().endswith("OK"), (child.returncode, out)
    assert [p.name for p in cache.folder.iterdir()] == [path.name]  # nothing left beside it
