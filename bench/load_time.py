"""Load time and peak memory of a model, ours beside MNN's C++ runtime, each load in a fresh
process, the engines taking turns round after round (medians of `-n` rounds), and the CPU time of
loading its tokenizer alone (the tokenizer file of the config).

    python bench/load_time.py [CONFIG] [-n 5] [--baseline PYTHON] [--mmap] [--threads 2]

A load is `create()` + `load()` (as `mnnllm bench` times it), then one 1-token forward, timed
apart: MNN's `load()` with `use_mmap` returns before it reads the weights, so the first token
shows where that work went. `--baseline PYTHON`: also our loader under another interpreter, whose
`mnnllm_core` is the code before a change (e.g. the main checkout's venv), in the same rounds.
`--mmap`: each engine also loads twice with `use_mmap` over an empty `tmp_path` of its own (the
first load packs and writes its cache, the second maps it), removed at the end of the round.
The rounds are interleaved so that the page cache and the machine's load weigh on every engine
alike; a warm-up round (untimed, `--warm-config`, the shared 135M model) first loads or
compiles the kernels of every interpreter.
"""
import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from shared_models import SHARED_MODEL  # beside this script

OURS = """
import json, resource, sys, time
import mnnllm_core
config, threads, tmp = sys.argv[1], int(sys.argv[2]), sys.argv[3]
settings = {"thread_num": threads, **({"use_mmap": True, "tmp_path": tmp} if tmp else {})}
start = time.perf_counter()
llm = mnnllm_core.create(config); llm.set_config(settings); llm.load()
load_s = time.perf_counter() - start
start = time.perf_counter()
llm.forward([1])
print(json.dumps({"load_s": load_s, "first_token_s": time.perf_counter() - start, "code": mnnllm_core.__file__,
                  "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""
MNN = """
import json, os, resource, sys, tempfile, time
import MNN.llm as llm
config_path, threads, tmp = sys.argv[1], int(sys.argv[2]), sys.argv[3]
config = json.load(open(config_path))
config.update({"base_dir": os.path.dirname(os.path.abspath(config_path)) + "/", "thread_num": threads,
               **({"use_mmap": True, "tmp_path": tmp} if tmp else {})})
path = os.path.join(tempfile.mkdtemp(), "config.json"); json.dump(config, open(path, "w"))
start = time.perf_counter()
m = llm.create(path); m.load()
load_s = time.perf_counter() - start
start = time.perf_counter()
m.forward([1])
print(json.dumps({"load_s": load_s, "first_token_s": time.perf_counter() - start, "code": "MNN",
                  "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}), flush=True)
os._exit(0)  # MNN 3.6.1 can crash in its destructors at exit
"""
TOKENIZER = """
import sys, time
from mnnllm_core.llm.config import LlmConfig
from mnnllm_core.llm.tokenizer import create_tokenizer
path = LlmConfig.from_file(sys.argv[1]).tokenizer_file
create_tokenizer(path)  # imports and first-use costs out of the way
start = time.process_time()
create_tokenizer(path)
print(time.process_time() - start)
"""


def _run(python: str, script: str, config: str, threads: int, tmp: str, cwd: str) -> dict:
    """One load in a fresh process; run from `cwd` (not a checkout) so `python` imports its own mnnllm_core."""
    out = subprocess.run([python, "-c", script, config, str(threads), tmp], capture_output=True, text=True,
                         cwd=cwd)
    if out.returncode:
        return {"failed": f"exit {out.returncode}: {out.stderr.strip().splitlines()[-1:] or ''}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="?", default=str(SHARED_MODEL))
    parser.add_argument("-n", type=int, default=5, help="rounds")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--baseline", help="another interpreter whose mnnllm_core is the code before a change")
    parser.add_argument("--mmap", action="store_true", help="also two use_mmap loads per engine and round")
    parser.add_argument("--tmp", default=tempfile.gettempdir(), help="where the use_mmap caches are made")
    parser.add_argument("--warm-config", default=str(SHARED_MODEL))
    args = parser.parse_args()
    config = str(Path(args.config).resolve())
    engines = {"ours": (sys.executable, OURS)}
    if args.baseline:
        engines["baseline"] = (args.baseline, OURS)
    engines["MNN"] = (sys.executable, MNN)
    work = tempfile.mkdtemp(prefix="load-time-", dir=args.tmp)
    samples: dict[tuple[str, str], list[dict]] = {}
    try:
        for python, script in engines.values():
            _run(python, script, str(Path(args.warm_config).resolve()), args.threads, "", work)
        for round_ in range(args.n):
            for engine, (python, script) in engines.items():
                runs = [("load", "")]
                if args.mmap:
                    cache = tempfile.mkdtemp(prefix=f"{engine}-", dir=work)
                    runs += [("use_mmap first", cache), ("use_mmap second", cache)]
                for kind, tmp in runs:
                    result = _run(python, script, config, args.threads, tmp, work)
                    samples.setdefault((engine, kind), []).append(result)
                    print(f"round {round_ + 1} {engine} {kind}: {json.dumps(result)}", file=sys.stderr, flush=True)
            for cache in Path(work).iterdir():
                shutil.rmtree(cache, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("| engine | load | load (s) | first token (s) | peak (MiB) | runs |")
    print("|---|---|---:|---:|---:|---:|")
    for (engine, kind), results in samples.items():
        good = [r for r in results if "failed" not in r]
        if not good:
            print(f"| {engine} | {kind} | failed | | | 0 |")
            continue
        med = {key: statistics.median(r[key] for r in good) for key in ("load_s", "first_token_s", "peak_mib")}
        print(f"| {engine} | {kind} | {med['load_s']:.2f} | {med['first_token_s']:.2f} | {med['peak_mib']:.0f} "
              f"| {len(good)} |")
    tokenizer = subprocess.run([sys.executable, "-c", TOKENIZER, config], capture_output=True, text=True, check=True)
    print(f"\ntokenizer load (CPU): {float(tokenizer.stdout.strip().splitlines()[-1]):.3f} s")


if __name__ == "__main__":
    main()
