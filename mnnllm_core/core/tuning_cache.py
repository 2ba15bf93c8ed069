"""Kernel variants chosen by timing them once per device, kept in a cache file: MNN's
`mnn_cachefile.bin` (its LLM engine calls `setCache(tmp_path + "/mnn_cachefile.bin")` for any
GPU backend, and its MNN_GPU_TUNING_* modes fill it with the tuned choices).

A backend with several variants of a kernel (opencl's rows per work-group of a linear layer,
vulkan's decode shader) asks `choose(problem, variants, run)` at resize, on the real shapes:
the first time on a device each variant runs `runs` timed times (after one untimed run that
compiles it) and the fastest is stored; later resizes and later processes read the stored
choice and time nothing. A backend hint that forces a variant is the backend's to apply before
it asks.

The runtime hint "gpu_tuning" takes MNN's levels: "none" (the default here: no timing, the
backend's choice by device class), "fast", "normal", "wide" (MNN's default), "heavy" (more
timed runs each). The file is `<tmp_path>/tuning.json` (tmp_path empty: `$MNNLLM_CACHE`, else
~/.cache/mnnllm): JSON, one entry per device key (the backend, platform, device and driver
version), each mapping a problem to its choice. It is written beside and renamed into place; a
file that cannot be read or parsed is ignored with a warning and rewritten.
"""
from __future__ import annotations

import json
import logging
import os
import statistics
import time
from pathlib import Path
from collections.abc import Mapping
from typing import Any, Callable, Sequence

from ..errors import ConfigError
from ..files import open_regular_file, written_beside
from .runtime_hints import RuntimeHints
from .weights.cache import default_folder

log = logging.getLogger(__name__)

TUNING_HINT = "gpu_tuning"
# MNN_GPU_TUNING_* level -> timed runs per variant (0: no tuning)
LEVELS = {"none": 0, "fast": 1, "normal": 3, "wide": 5, "heavy": 15}
FILE_NAME = "tuning.json"
FORMAT = 1
MAX_BYTES = 4 << 20  # a tuning file is a few KiB; anything this large is not ours


def tuning_runs(hints: RuntimeHints) -> int:
    """Timed runs per variant the "gpu_tuning" hint asks for (0: do not tune)."""
    level = hints.gpu_tuning or "none"
    if level not in LEVELS:
        raise ConfigError(f"{TUNING_HINT} must be one of {sorted(LEVELS)}, got {level!r}",
                          field=f"backend_hints.{TUNING_HINT}")
    return LEVELS[level]


class TuningCache:
    """The tuned choices of one device, read from and written to one file."""

    def __init__(self, path: str | os.PathLike[str], device_key: str, runs: int = LEVELS["wide"]):
        self.path = Path(path)
        self.device_key = device_key
        self.runs = max(1, int(runs))
        self.choices: dict[str, Any] = self._read().get(device_key, {})
        self.tuned = 0  # problems timed by this object (the rest came from the file)

    @classmethod
    def from_hints(cls, hints: RuntimeHints | Mapping[str, Any], device_key: str) -> "TuningCache | None":
        """The cache a runtime's hints ask for, or None when "gpu_tuning" is "none" (unset)."""
        hints = RuntimeHints.of(hints)
        runs = tuning_runs(hints)
        if not runs:
            return None
        return cls(Path(hints.tmp_path or default_folder()) / FILE_NAME, device_key, runs)

    def choose(self, problem: str, variants: Sequence[Any], run: Callable[[Any], None]) -> Any:
        """The stored choice for `problem` when it is one of `variants`; else each variant timed
        (`run(variant)` runs it once and waits for it), the fastest stored and returned."""
        stored = self.choices.get(problem)
        if stored in variants:
            return stored
        medians = {}
        for variant in variants:
            run(variant)  # compiles, warms
            times = []
            for _ in range(self.runs):
                start = time.perf_counter()
                run(variant)
                times.append(time.perf_counter() - start)
            medians[variant] = statistics.median(times)
        best = min(variants, key=medians.__getitem__)
        log.info("tuned %s on %s: %s (%s)", problem, self.device_key, best,
                 ", ".join(f"{v}: {t * 1e6:.0f} us" for v, t in medians.items()))
        self.choices[problem] = best
        self.tuned += 1
        self._write()
        return best

    # -- the file -------------------------------------------------------------------
    def _read(self) -> dict[str, dict[str, Any]]:
        """Every device's choices in the file; {} when there is none or it is not ours."""
        try:
            with open_regular_file(self.path) as f:
                data = f.read(MAX_BYTES + 1)
        except FileNotFoundError:
            return {}
        except OSError as err:
            log.warning("tuning cache %s cannot be read (%s): tuning again", self.path, err)
            return {}
        try:
            if len(data) > MAX_BYTES:
                raise ValueError(f"larger than {MAX_BYTES} bytes")
            parsed = json.loads(data)
            if not isinstance(parsed, dict) or parsed.get("format") != FORMAT:
                raise ValueError(f"not a tuning file of format {FORMAT}")
            devices = parsed.get("devices")
            if not isinstance(devices, dict) or not all(isinstance(v, dict) for v in devices.values()):
                raise ValueError("'devices' is not a mapping of mappings")
            return devices
        except ValueError as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            log.warning("tuning cache %s is corrupt (%s): ignored, and rewritten", self.path, err)
            return {}

    def _write(self) -> None:
        """This device's choices merged into what the file holds now (another process may have
        tuned another device), written beside and renamed; a failed write is only logged."""
        devices = self._read()
        devices[self.device_key] = dict(self.choices)
        text = json.dumps({"format": FORMAT, "devices": devices}, indent=1, sort_keys=True)
        try:
            with written_beside(self.path) as f:
                f.write(text.encode())
        except OSError as err:
            log.warning("tuning cache %s cannot be written (%s): the choice holds for this process only",
                        self.path, err)
