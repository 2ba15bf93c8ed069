"""The first run on a new machine: `mnnllm run` with an empty numba cache compiles the cpu kernels
(`backends/cpu/kernels/warmup.py`). Wall time and CPU time (the run and its compile processes),
each run with a fresh cache folder, then a second run on that cache; with `--vs`, another
checkout's `mnnllm` (before a change) interleaved with this one. `--parts` instead times each
warm-up part's compile alone in a fresh process (CPU seconds, the figures of `warmup.PARTS`).

    python bench/first_compile.py -n 3
    python bench/first_compile.py -n 3 --vs ../main/.venv/bin/mnnllm
    python bench/first_compile.py --parts -n 3

The machine's load changes wall times much more than CPU times: the load average is printed.
"""
from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHARED = Path(os.environ.get("MNNLLM_SHARED") or Path(__file__).resolve().parents[2] / "shared")
MODEL = SHARED / "models" / "smollm2-135m-instruct-mnn-q4"
HERE = Path(sys.executable).with_name("mnnllm")


def _load() -> str:
    return Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else "?"


def _timed(command: list[str], cache: str) -> tuple[float, float, str]:
    """Wall and CPU seconds (user + sys of the command and its children) of a run on `cache`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, env={**os.environ, "NUMBA_CACHE_DIR": cache}, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr}")
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, cpu, done.stderr


def first_runs(runs: dict[str, Path], reps: int, model: Path) -> None:
    rows: dict[str, list[tuple[float, float, float]]] = {name: [] for name in runs}
    print("| run | first wall s | first CPU s | compile (as announced) | second wall s | load |")
    print("|---|---|---|---|---|---|")
    for _ in range(reps):
        for name, mnnllm in runs.items():
            command = [str(mnnllm), "run", str(model), "-p", "Hi", "-n", "8"]
            with tempfile.TemporaryDirectory() as cache:
                load = _load()
                wall, cpu, said = _timed(command, cache)
                again, _, _ = _timed(command, cache)
            compiled = " / ".join(re.findall(r"(?:about \d+ s in \d+ process\w*|compiled the cpu kernels in \d+ s)", said))
            rows[name].append((wall, cpu, again))
            print(f"| {name} | {wall:.1f} | {cpu:.1f} | {compiled} | {again:.1f} | {load}-{_load()} |", flush=True)
    for name, values in rows.items():
        wall, cpu, again = (statistics.median(v[i] for v in values) for i in range(3))
        print(f"median {name}: first {wall:.1f} s wall, {cpu:.1f} s CPU; second {again:.1f} s")


def part_times(reps: int, threads: int) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from mnnllm_backends.cpu.kernels.warmup import PARTS
    seconds: dict[str, list[float]] = {name: [] for name in ["(none)", *PARTS]}
    for _ in range(reps):
        for name in seconds:
            with tempfile.TemporaryDirectory() as cache:
                command = [sys.executable, "-m", "mnnllm_backends.cpu.kernels.warmup", str(threads)]
                _, cpu, _ = _timed(command + ([] if name == "(none)" else [name]), cache)
                seconds[name].append(cpu)
    base = statistics.median(seconds.pop("(none)"))
    print(f"a compile process that compiles nothing: {base:.2f} s CPU (load {_load()})")
    for name, values in seconds.items():
        print(f"{name:12s} {statistics.median(values):5.2f} s CPU alone (process start included)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--reps", type=int, default=3)
    parser.add_argument("--vs", type=Path, help="another checkout's mnnllm executable, run interleaved as 'before'")
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--parts", action="store_true", help="time each warm-up part's compile alone")
    parser.add_argument("--threads", type=int, default=2, help="with --parts: the warm-up's threads")
    args = parser.parse_args()
    if args.parts:
        part_times(args.reps, args.threads)
        return
    runs = {"before": args.vs} if args.vs else {}
    runs["this checkout"] = HERE
    first_runs(runs, args.reps, args.model)


if __name__ == "__main__":
    main()
