"""Load time of a model, ours beside MNN's C++ runtime, each in fresh processes (median of N),
and the CPU time of loading its tokenizer alone (the tokenizer file of the config).

    python bench/load_time.py [CONFIG] [-n 5]
"""
import argparse
import json
import statistics
import subprocess
import sys

from shared_models import SHARED_MODEL  # beside this script

OURS = """
import sys, time
start = time.perf_counter()
import mnnllm_core
llm = mnnllm_core.create(sys.argv[1]); llm.set_config({"thread_num": 2}); llm.load()
print(time.perf_counter() - start)
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
MNN = """
import json, os, sys, tempfile, time
import MNN.llm as llm
config = json.load(open(sys.argv[1])); config.update({"base_dir": os.path.dirname(os.path.abspath(sys.argv[1])) + "/",
                                                      "thread_num": 2})
path = os.path.join(tempfile.mkdtemp(), "config.json"); json.dump(config, open(path, "w"))
start = time.perf_counter()
m = llm.create(path); m.load()
print(time.perf_counter() - start, flush=True)
os._exit(0)
"""


def _median(script: str, config: str, runs: int) -> float:
    times = []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", script, config], capture_output=True, text=True, check=True)
        times.append(float(out.stdout.strip().splitlines()[-1]))
    return statistics.median(times)


def main() -> None:
    default = SHARED_MODEL
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("config", nargs="?", default=str(default))
    parser.add_argument("-n", type=int, default=5)
    args = parser.parse_args()
    ours, mnn = _median(OURS, args.config, args.n), _median(MNN, args.config, args.n)
    tokenizer = _median(TOKENIZER, args.config, args.n)
    print(json.dumps({"mnnllm_load_s": round(ours, 3), "mnn_load_s": round(mnn, 3), "ratio": round(ours / mnn, 2),
                      "tokenizer_cpu_s": round(tokenizer, 3)}))


if __name__ == "__main__":
    main()
