"""Runtime hints are one typed, frozen value per runtime (RuntimeHints and a backend's subclass):
a wrong type or a key no installed backend declares is a ConfigError naming the config file and
`backend_hints.<key>`; null means unset; a backend reads its own fields as attributes."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from mnnllm_core.backend_api import RuntimeHints
from mnnllm_core.errors import ConfigError
from mnnllm_core.llm.config import LlmConfig
from mnnllm_core.llm.runtime import init_runtime
from mnnllm_core.testing import new_runtime


@dataclasses.dataclass(frozen=True)
class SomeBackendHints(RuntimeHints):
    some_size: int | None = None
    some_scale: float = 1.0


def config_file(tmp_path: Path, hints: dict) -> tuple[LlmConfig, str]:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"backend_type": "cpu", "backend_hints": hints}), encoding="utf-8")
    return LlmConfig.from_file(path), str(path)


@pytest.mark.parametrize(("key", "value"), [("replay", "no"), ("replay", 1), ("gpu_tuning", 3),
                                            ("opencl_linear_split", "8"), ("opencl_fp16", 1),
                                            ("vulkan_subgroups", "yes")])
def test_a_wrongly_typed_hint_in_the_config_names_the_file_and_the_hint(tmp_path, key, value) -> None:
    config, path = config_file(tmp_path, {key: value})
    with pytest.raises(ConfigError, match=key) as err:
        init_runtime(config)
    assert (err.value.file, err.value.field) == (path, f"backend_hints.{key}")


def test_a_key_no_installed_backend_reads_is_a_config_error_naming_it(tmp_path) -> None:
    config, path = config_file(tmp_path, {"opencl_devcie": "0:0"})
    with pytest.raises(ConfigError, match="opencl_devcie") as err:
        init_runtime(config)
    assert (err.value.file, err.value.field) == (path, "backend_hints.opencl_devcie")


def test_the_hints_of_another_backend_are_accepted_and_null_means_unset(tmp_path) -> None:
    config, _ = config_file(tmp_path, {"opencl_fp16": True, "replay": None, "gpu_tuning": None})
    hints = init_runtime(config).runtime.hints
    assert isinstance(hints, RuntimeHints) and hints.replay is True and hints.gpu_tuning == "none"
    assert not hasattr(hints, "opencl_fp16")


def test_the_runtime_reads_typed_attributes_and_the_hints_are_frozen() -> None:
    hints = new_runtime("cpu", hints={"replay": False, "tmp_path": "/tmp/x"}).runtime.hints
    assert (hints.replay, hints.tmp_path, hints.attn_scale) == (False, "/tmp/x", 0.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        hints.replay = True  # type: ignore[misc]


def test_a_subclass_takes_its_own_fields_from_a_mapping_or_from_other_hints() -> None:
    hints = SomeBackendHints.of({"some_size": 4, "some_scale": 2, "replay": False, "other_backend_key": 1})
    assert (hints.some_size, hints.some_scale, hints.replay) == (4, 2.0, False)
    assert isinstance(hints.some_scale, float)
    assert SomeBackendHints.of(RuntimeHints(replay=False)).replay is False
    with pytest.raises(ConfigError, match="some_size must be int or null, got True"):
        SomeBackendHints.of({"some_size": True})


def test_a_runtime_made_without_a_config_rejects_an_unknown_hint_too() -> None:
    with pytest.raises(ConfigError, match="no_such_hint") as err:
        new_runtime("cpu", hints={"no_such_hint": 1})
    assert err.value.field == "backend_hints.no_such_hint"
