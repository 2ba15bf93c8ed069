"""What a forward of a few tokens (a speculative verify step) costs against a one-token forward on
the cpu backend's packed path (`memory: "low"`), for three ways of running the linears, side by
side in one process, alternating: "rows" = the one-token GEMV once per token row (what ran for
2..4 tokens before the few-token kernel, here with q/k/v and gate/up still grouped; op by op), "few"
= the few-token GEMV reading each packed byte once for all rows (`kernels/linear.py`, `Gemv.few`;
replayed inside the step programs like a decode step), "gemm" = dequantized panels + the
register-blocked GEMM (what runs past FEW_TOKENS). Each time is a shape's third run (the first
goes op by op, the second records).

    python bench/few_tokens_bench.py [CONFIG] [-n 9] [--tokens 1,2,4,8]
    python bench/few_tokens_bench.py [CONFIG] --speculative [-n 2] [-t 32]

Prints, per token count, the median forward time (all logits, after a short prompt) and its
ratio to the one-token forward of the same mode; with --speculative, `speculative_bench.py`'s
strategies run -n rounds of one run each in the "rows" and "few" modes alternating, and their
speed-up against AR per mode (the mean over the rounds).
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

import mnnllm_core
from mnnllm_backends.cpu.kernels.linear import Gemv
from mnnllm_backends.cpu.ops import packed_linear
from mnnllm_backends.cpu.ops.packed_linear import PackedLinearExecution
from mnnllm_core.backend_api import Execution
from speculative_bench import DEFAULT_CONFIG, prepare, run  # beside this script

MODES = ("rows", "few", "gemm")


def _rows_as_gemvs(gemv: Gemv, x: np.ndarray, threads: int) -> list[np.ndarray]:
    """`Gemv.few`'s results computed the old way: one one-token GEMV per row."""
    results = [np.empty((x.shape[0], r.shape[0]), np.float32) for r in gemv.results]
    for t in range(x.shape[0]):
        for target, row in zip(results, gemv(x[t], threads)):
            target[t] = row
    return results


def _few_tokens_op_by_op(original):
    """`PackedLinearExecution.replay_steps` leaving forwards of several tokens to on_execute (so
    that a patched `Gemv.few` runs in a replayed step too)."""
    def replay_steps(self, inputs, outputs):
        if self.tokens > 1:
            return Execution.replay_steps(self, inputs, outputs)
        return original(self, inputs, outputs)
    return replay_steps


@contextmanager
def mode(name: str, llm=None):
    """The linears of `name` in force (recorded steps of `llm` dropped on the way in and out: a
    step recorded in one mode would replay its kernels in another)."""
    few, limit, steps = Gemv.few, packed_linear.FEW_TOKENS, PackedLinearExecution.replay_steps
    if name == "rows":
        Gemv.few = _rows_as_gemvs
        PackedLinearExecution.replay_steps = _few_tokens_op_by_op(steps)
    elif name == "gemm":
        packed_linear.FEW_TOKENS = 1
    if llm is not None:
        llm.pool.clear()
    try:
        yield
    finally:
        Gemv.few, packed_linear.FEW_TOKENS, PackedLinearExecution.replay_steps = few, limit, steps
        if llm is not None:
            llm.pool.clear()


def measure(llm, counts: list[int], runs: int) -> dict[tuple[str, int], float]:
    llm.reset()
    llm.forward(llm.tokenizer_encode("Hello, how are you?"))
    token = llm.context.history_tokens[-1]
    times: dict[tuple[str, int], list[float]] = {}
    for r in range(runs + 1):  # the first round warms every path up and is dropped
        order = MODES[r % len(MODES):] + MODES[:r % len(MODES)]
        for name in order:
            with mode(name, llm):
                for seq in counts:
                    for attempt in range(3):  # a shape's first run goes op by op, its second records
                        start = time.perf_counter()
                        llm.forward([token] * seq, all_logits=seq > 1)
                        elapsed = (time.perf_counter() - start) * 1e3
                        del llm.context.history_tokens[-seq:]
                    if r:
                        times.setdefault((name, seq), []).append(elapsed)
    return {key: statistics.median(values) for key, values in times.items()}


def speculative(config: Path, rounds: int, tokens: int) -> None:
    rows: dict[tuple[str, str], dict] = {}
    with tempfile.TemporaryDirectory(prefix="mnnllm-few-") as tmp:
        folder = Path(tmp)
        prepare(config.resolve(), folder)
        for r in range(rounds):
            for name in ("rows", "few") if r % 2 == 0 else ("few", "rows"):
                with mode(name):
                    for row in run(folder / config.name, 1, tokens)[1:]:
                        entry = rows.setdefault((row["prompt"], row["strategy"]), {"rows": [], "few": [], "same": True})
                        entry[name].append(row["speedup"])
                        entry["acceptance"] = row["acceptance"]
                        entry["same"] &= row["same_as_ar"]
    print("| prompt | strategy | acceptance | vs AR, rows | vs AR, few | = AR |\n|---|---|---:|---:|---:|---|")
    for (prompt, strategy), entry in rows.items():
        acceptance = "-" if entry["acceptance"] is None else f"{100 * entry['acceptance']:.0f} %"
        print(f"| {prompt} | {strategy} | {acceptance} | {statistics.mean(entry['rows']):.2f}x | "
              f"{statistics.mean(entry['few']):.2f}x | {'yes' if entry['same'] else 'NO'} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", nargs="?", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("-n", "--runs", type=int, default=9)
    parser.add_argument("--tokens", default="1,2,4,8")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--speculative", action="store_true")
    parser.add_argument("-t", "--generate", type=int, default=32, help="tokens a run (--speculative)")
    args = parser.parse_args()
    if args.speculative:
        speculative(args.config, args.runs, args.generate)
        return
    counts = sorted({1, *(int(t) for t in args.tokens.split(","))})
    llm = mnnllm_core.create(args.config)
    llm.set_config({"sampler_type": "greedy", "thread_num": args.threads, "memory": "low"})
    llm.load()
    medians = measure(llm, counts, args.runs)
    print("| tokens | " + " | ".join(f"{m} ms (x 1 token)" for m in MODES) + " |")
    print("|---:|" + "---:|" * len(MODES))
    for seq in counts:
        cells = [f"{medians[(m, seq)]:.1f} ({medians[(m, seq)] / medians[(m, 1)]:.2f}x)" for m in MODES]
        print(f"| {seq} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
