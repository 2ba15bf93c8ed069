"""A PEFT LoRA adapter folder (adapter_config.json + adapter_model.safetensors), checked, and the
source that merges it into the base weights as they stream to the export: W + scale * B @ A.

PEFT names each pair `base_model.model.<module>.lora_A.weight` ([r, in]) and `...lora_B.weight`
([out, r]); `<module>.weight` is the base tensor it adapts. scale = lora_alpha / r (lora_alpha /
sqrt(r) with use_rslora). `target_modules` is a list of module-name suffixes, or one regular
expression the whole module name must match (PEFT's two forms). What PEFT can also save but a
merge cannot express here (DoRA, trained biases, modules_to_save, per-module rank/alpha
patterns, Conv1D's fan_in_fan_out) is refused by name.
"""
from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mnnllm_core.errors import ConfigError, FormatError, UnsupportedError
from mnnllm_core.json_depth import loads_bounded

from .sources import LazyTensor, Source, TokenizerSpec, _read_safetensors

logger = logging.getLogger(__name__)

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
_KEY = re.compile(r"^base_model\.model\.(?P<module>.+)\.lora_(?P<part>[AB])\.weight$")
# adapter_config.json keys whose non-default values change the math (refused rather than ignored)
_REFUSED = {"use_dora": False, "fan_in_fan_out": False, "bias": "none", "modules_to_save": None,
            "rank_pattern": {}, "alpha_pattern": {}, "layers_to_transform": None}


@dataclass(frozen=True)
class LoraPair:
    """One adapted linear: the base tensor's name, A [r, in], B [out, r] as fp32, and the scale."""

    weight_name: str
    a: np.ndarray
    b: np.ndarray
    scale: float

    def delta_rows(self, start: int, stop: int) -> np.ndarray:
        """scale * B[start:stop] @ A: what the merge adds to rows [start, stop) of the base weight."""
        return (np.float32(self.scale) * self.b[start:stop]) @ self.a


class LoraAdapter:
    """The pairs of an adapter folder, keyed by the base tensor each one adapts."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.config_path = self.folder / CONFIG_FILE
        self.weights_path = self.folder / WEIGHTS_FILE
        if not self.folder.is_dir():
            raise ConfigError("a LoRA adapter must be a folder holding adapter_config.json and "
                              "adapter_model.safetensors", file=str(self.folder))
        config = self._config()
        self.r = config["r"]
        self.scale = float(config["lora_alpha"]) / (math.sqrt(self.r) if config.get("use_rslora") else self.r)
        self.targets = config["target_modules"]
        self.pairs: dict[str, LoraPair] = self._pairs()

    def _config(self) -> dict[str, Any]:
        path = str(self.config_path)
        if not self.config_path.is_file():
            raise ConfigError("the adapter folder has no adapter_config.json", file=path)
        try:
            config = loads_bounded(self.config_path.read_text(encoding="utf-8"), path, ConfigError)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(f"not valid JSON: {exc}", file=path) from None
        if not isinstance(config, dict):
            raise ConfigError("expected a JSON object", file=path)
        peft_type = config.get("peft_type", "LORA")
        if peft_type != "LORA":
            raise UnsupportedError(f"peft_type {peft_type!r}: only LoRA adapters merge", file=path, field="peft_type")
        r = config.get("r")
        if isinstance(r, bool) or not isinstance(r, int) or r < 1:
            raise ConfigError(f"r must be a positive integer, got {r!r}", file=path, field="r")
        alpha = config.get("lora_alpha")
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
            raise ConfigError(f"lora_alpha must be a number, got {alpha!r}", file=path, field="lora_alpha")
        targets = config.get("target_modules")
        if not (isinstance(targets, str) and targets) and not (
                isinstance(targets, list) and targets and all(isinstance(t, str) and t for t in targets)):
            raise ConfigError(f"target_modules must be a list of module names or a regular expression, got "
                              f"{targets!r}", file=path, field="target_modules")
        for key, default in _REFUSED.items():
            if config.get(key, default) not in (default, None, {}, [], False):
                raise UnsupportedError(f"{key} {config[key]!r} cannot be merged here (only plain LoRA of linear "
                                       f"weights)", file=path, field=key)
        return config

    def targeted(self, module: str) -> bool:
        """PEFT's rule: a regex matches the whole module name; a name in the list matches its last parts."""
        if isinstance(self.targets, str):
            return re.fullmatch(self.targets, module) is not None
        return any(module == t or module.endswith("." + t) for t in self.targets)

    def _pairs(self) -> dict[str, LoraPair]:
        path = str(self.weights_path)
        if not self.weights_path.is_file():
            raise FormatError(f"the adapter folder has no {WEIGHTS_FILE} (only safetensors adapters are read)",
                              file=path)
        halves: dict[str, dict[str, LazyTensor]] = {}
        for tensor in _read_safetensors(self.weights_path):
            match = _KEY.match(tensor.name)
            if match is None:
                raise UnsupportedError("not a LoRA A/B weight of a linear layer (expected "
                                       "base_model.model.<module>.lora_A.weight or .lora_B.weight)", file=path,
                                       field=tensor.name)
            module = match["module"]
            if not self.targeted(module):
                raise FormatError(f"module {module!r} is not among target_modules {self.targets!r} of "
                                  f"{CONFIG_FILE}", file=path, field=tensor.name)
            halves.setdefault(module, {})[match["part"]] = tensor
        if not halves:
            raise FormatError("the adapter holds no LoRA weights", file=path)
        pairs = {}
        for module, parts in sorted(halves.items()):
            pairs[f"{module}.weight"] = self._pair(module, parts, path)
        if isinstance(self.targets, list):
            for target in self.targets:
                if not any(m == target or m.endswith("." + target) for m in halves):
                    raise FormatError(f"target module {target!r} of {CONFIG_FILE} has no lora_A/lora_B weights",
                                      file=path, field=f"base_model.model.*.{target}.lora_A.weight")
        return pairs

    def _pair(self, module: str, parts: dict[str, LazyTensor], path: str) -> LoraPair:
        for part in "AB":
            if part not in parts:
                raise FormatError(f"module {module!r} has lora_{'B' if part == 'A' else 'A'} but no lora_{part}",
                                  file=path, field=f"base_model.model.{module}.lora_{part}.weight")
        a, b = parts["A"], parts["B"]
        if len(a.shape) != 2 or len(b.shape) != 2:
            bad = a if len(a.shape) != 2 else b
            raise FormatError(f"LoRA weights are matrices, got shape {list(bad.shape)}", file=path, field=bad.name)
        if a.shape[0] != self.r:
            raise FormatError(f"lora_A has rank {a.shape[0]} (shape {list(a.shape)}) but {CONFIG_FILE} says r "
                              f"{self.r}", file=path, field=a.name)
        if b.shape[1] != self.r:
            raise FormatError(f"lora_B has rank {b.shape[1]} (shape {list(b.shape)}) but {CONFIG_FILE} says r "
                              f"{self.r}", file=path, field=b.name)
        return LoraPair(f"{module}.weight", a.load(), b.load(), self.scale)

    def check_base(self, source: Source) -> None:
        """Every adapted weight exists in the base with shape [out, in] = [B rows, A columns]."""
        for name, pair in self.pairs.items():
            field = f"base_model.model.{name[:-len('.weight')]}.lora_A.weight"
            if not source.has(name):
                raise FormatError(f"the adapter adapts {name!r}, which the base model {source.path} does not have",
                                  file=str(self.weights_path), field=field)
            shape = tuple(source.tensor(name).shape)
            if shape != (pair.b.shape[0], pair.a.shape[1]):
                raise FormatError(f"lora_B @ lora_A is [{pair.b.shape[0]}, {pair.a.shape[1]}] but {name} of the "
                                  f"base is {list(shape)}", file=str(self.weights_path), field=field)


class MergedSource(Source):
    """The base source with every adapted linear weight read as W + scale * B @ A, row chunk by row chunk."""

    def __init__(self, base: Source, adapter: LoraAdapter):
        """`adapter` fits `base` (LoraAdapter.check_base)."""
        self.base = base
        self.adapter = adapter
        self.path = base.path
        self.config = base.config
        self.merged: set[str] = set()  # adapted tensors the export has read

    def has(self, name: str) -> bool:
        return self.base.has(name)

    def tokenizer(self) -> TokenizerSpec:
        return self.base.tokenizer()

    def tensor(self, name: str) -> LazyTensor:
        tensor = self.base.tensor(name)
        pair = self.adapter.pairs.get(name)
        if pair is None:
            return tensor
        self.merged.add(name)

        def rows(start: int, stop: int) -> np.ndarray:
            return tensor.rows(start, stop) + pair.delta_rows(start, stop)
        return LazyTensor(name, tensor.shape, rows)

    def check_all_merged(self) -> None:
        """After an export: an adapted weight the export never read (not a linear it writes) is an error."""
        unused = sorted(set(self.adapter.pairs) - self.merged)
        if unused:
            raise UnsupportedError(f"the adapter adapts {unused[0]!r}, which the export does not write as a linear "
                                   f"layer ({len(unused)} such)", file=str(self.adapter.weights_path),
                                   field=unused[0])
        logger.info("merged LoRA %s into %d linear weights (scale %g)", self.adapter.folder, len(self.merged),
                    self.adapter.scale)
