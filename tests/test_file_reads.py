"""Every file a config names is read only when it is a regular file within the size its kind
can have: /dev/zero, a FIFO, a folder or an oversized file is a typed error at once, and no
error quotes the bytes of the file it names."""
from __future__ import annotations

import os
import threading

import pytest

from mnnllm_core import files
from mnnllm_core.core.weights.file import ExternalWeightFile
from mnnllm_core.errors import ConfigError, FormatError, TokenizerError, WeightFileError
from mnnllm_core.llm import config as llm_config
from mnnllm_core.llm.tokenizer import create_tokenizer
from mnnllm_core.schema.reader import read_net_file


def special_files(tmp_path) -> dict[str, str]:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    return {"/dev/zero": "/dev/zero", "a FIFO": str(fifo), "a folder": str(tmp_path)}


READERS = {"tokenizer": (create_tokenizer, TokenizerError), "graph": (read_net_file, FormatError),
           "weights": (ExternalWeightFile, WeightFileError)}


@pytest.mark.parametrize("reader", READERS)
def test_a_path_that_is_not_a_regular_file_is_refused_at_once(tmp_path, reader):
    read, error = READERS[reader]
    for kind, path in special_files(tmp_path).items():
        done = []
        thread = threading.Thread(target=lambda: done.append(_outcome(read, path)), daemon=True)
        thread.start()
        thread.join(10)
        assert done, f"{reader} of {kind} did not return"
        assert isinstance(done[0], error), (kind, done[0])


def _outcome(read, path):
    try:
        read(path)
    except Exception as err:  # the test asserts the type
        return err
    return None


def test_a_config_fifo_named_json_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "c.json"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="must be a regular file, this is a FIFO"):
        llm_config.LlmConfig.from_file(str(fifo))


def test_llm_config_naming_dev_zero_is_refused(tmp_path):
    (tmp_path / "config.json").write_text('{"llm_config": "' + '../' * 20 + 'dev/zero"}')
    with pytest.raises(ConfigError, match="must be a regular file, this is a character device"):
        llm_config.LlmConfig.from_file(str(tmp_path / "config.json"))


def test_a_file_larger_than_its_kind_can_be_is_refused(tmp_path, monkeypatch):
    big = tmp_path / "config.json"
    big.write_text("{" + " " * 5000 + "}")
    monkeypatch.setattr(files, "CONFIG_LIMIT", 4096)
    monkeypatch.setattr(llm_config, "CONFIG_LIMIT", 4096)
    with pytest.raises(ConfigError, match="5002 bytes, more than a config can be"):
        llm_config.LlmConfig.from_file(str(big))


def test_errors_never_quote_the_bytes_of_the_file_named(tmp_path):
    secret = tmp_path / "passwd"
    secret.write_text("root:x:0:0:root:/root:/bin/bash\n" * 3)
    for read, error in (READERS["tokenizer"], READERS["graph"]):
        with pytest.raises(error) as err:
            read(str(secret))
        assert "root" not in str(err.value).replace(str(secret), "")


def test_a_small_file_costs_its_size_not_the_bound(tmp_path):
    import tracemalloc
    path = tmp_path / "small"
    path.write_bytes(b"0123456789")
    tracemalloc.start()
    try:
        assert files.read_bounded(path, files.GRAPH_LIMIT, FormatError, "graph") == b"0123456789"
        assert tracemalloc.get_traced_memory()[1] < 1 << 20
    finally:
        tracemalloc.stop()


def test_written_beside_replaces_whole_or_not_at_all(tmp_path) -> None:
    """The one write path of the project's own files: renamed into place when the block ends,
    and on an error the old file stays as it was and nothing is left beside it."""
    from mnnllm_core.files import written_beside
    target = tmp_path / "sub" / "cache.bin"
    with written_beside(target) as f:
        f.write(b"first")
    assert target.read_bytes() == b"first"
    with pytest.raises(KeyboardInterrupt):
        with written_beside(target) as f:
            f.write(b"half of the sec")
            raise KeyboardInterrupt
    assert target.read_bytes() == b"first"
    assert sorted(p.name for p in target.parent.iterdir()) == ["cache.bin"]
