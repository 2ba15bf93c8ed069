"""Per-linear quantization (`--quant-config FILE`), in the JSON of MNN's exporter (`--quant_config`):

    {"/layers.0/mlp/down_proj/Linear": {"bits": 8, "block_size": 32, "symmetric": true},
     "/lm/lm_head/Linear": {"bits": 8}, ...}

Keys are the names of the Convolution ops in llm.mnn (`/layers.{i}/self_attn/q_proj/Linear`,
`/layers.{i}/mlp/gate_proj/Linear`, `/expert/{i}_{e}/gate_up_proj_linear`, `/lm/lm_head/Linear`, ...);
each entry overrides any of `bits`, `block_size` and `symmetric` of that linear, the rest coming from
`--quant-bit` / `--quant-block` / `--sym` (the lm_head: `--lm-quant-bit`). The embedding file
(`--embed-bit`) keeps the global block and symmetry, as in MNN.

MNN ignores keys it does not know and names that match no linear; here both are ConfigErrors naming
the file and the entry, since a misspelt name would silently export another model than the one asked for.
MNN's exporter also writes every conv's readType from the global `--sym`, so an entry whose
`symmetric` differs from it gives a conv MNN's runtime misreads; here each conv's readType is its own.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from mnnllm_core.errors import ConfigError
from mnnllm_core.json_depth import loads_bounded

QUANT_BITS = (2, 3, 4, 8, 16)
QUANT_BLOCKS = (0, 32, 64, 128)
FIELDS = ("bits", "block_size", "symmetric")


@dataclass(frozen=True)
class QuantChoice:
    """How one linear is stored: bits (16: fp16), requested block (0: one per row), symmetric or not."""

    bits: int
    block: int
    symmetric: bool


class QuantConfig:
    """The entries of one quant-config file, and which of them the export used."""

    def __init__(self, entries: dict[str, dict[str, Any]], file: str | None = None):
        self.file = file
        self.entries: dict[str, dict[str, Any]] = {}
        for name, entry in entries.items():
            self.entries[name] = self._checked(name, entry)
        self.used: set[str] = set()

    @classmethod
    def load(cls, path: str | Path) -> "QuantConfig":
        try:
            data = loads_bounded(Path(path).read_text(encoding="utf-8"), str(path), ConfigError)
        except OSError as exc:
            raise ConfigError(f"cannot read the quant config: {exc.strerror}", file=str(path)) from None
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(f"the quant config is not JSON: {exc}", file=str(path)) from None
        if not isinstance(data, dict):
            raise ConfigError(f"the quant config must be an object of op name -> settings, got "
                              f"{type(data).__name__}", file=str(path))
        return cls(data, str(path))

    def _checked(self, name: str, entry: Any) -> dict[str, Any]:
        if not isinstance(entry, dict):
            raise ConfigError(f"entry {name!r} must be an object with {', '.join(FIELDS)}, got {entry!r}",
                              file=self.file, field=name)
        unknown = sorted(set(entry) - set(FIELDS))
        if unknown:
            raise ConfigError(f"entry {name!r} has unknown key(s) {', '.join(unknown)} (known: {', '.join(FIELDS)})",
                              file=self.file, field=f"{name}.{unknown[0]}")
        checks = {"bits": (lambda v: v in QUANT_BITS, f"one of {QUANT_BITS}"),
                  "block_size": (lambda v: v in QUANT_BLOCKS, f"one of {QUANT_BLOCKS}"),
                  "symmetric": (lambda v: isinstance(v, bool), "true or false")}
        for key, value in entry.items():
            ok, allowed = checks[key]
            if isinstance(value, bool) != (key == "symmetric") or not ok(value):
                raise ConfigError(f"entry {name!r}: {key} must be {allowed}, got {value!r}", file=self.file,
                                  field=f"{name}.{key}")
        return dict(entry)

    def choice(self, name: str, default: QuantChoice) -> QuantChoice:
        """`default` with the entry of `name` applied (and the entry marked used)."""
        entry = self.entries.get(name)
        if entry is None:
            return default
        self.used.add(name)
        return replace(default, bits=entry.get("bits", default.bits), block=entry.get("block_size", default.block),
                       symmetric=entry.get("symmetric", default.symmetric))

    def check_all_used(self) -> None:
        """After the graph: an entry that named no linear is refused (a typo would change nothing silently)."""
        unused = sorted(set(self.entries) - self.used)
        if unused:
            raise ConfigError(f"{len(unused)} entr{'y names' if len(unused) == 1 else 'ies name'} no linear of this "
                              f"model: {', '.join(unused[:5])}{' ...' if len(unused) > 5 else ''} (keys are the "
                              "Convolution names in llm.mnn, e.g. /layers.0/mlp/down_proj/Linear)",
                              file=self.file, field=unused[0])
