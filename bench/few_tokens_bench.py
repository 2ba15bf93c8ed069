"""What a forward of a few tokens (a speculative verify step) costs against a one-token forward on
the cpu backend's packed path (`memory: "low"`), for several ways of running the linears, side by
side in one process, alternating. With fp32 activations (the default path): "rows" = the
one-token GEMV once per token row (what ran for 2..4 tokens before the few-token kernel, here with
q/k/v and gate/up still grouped; op by op), "few" = the few-token GEMV reading each packed byte
once for all rows (`kernels/linear.py`, `Gemv.few`; replayed inside the step programs like a
decode step), "gemm" = dequantized panels + the register-blocked GEMM (what runs past
FEW_TOKENS). "int8" = a second engine with the backend hint `cpu_int8_activations`
(`ops/int8_linear.py`): its linears run one kernel at every row count (up to 8 rows a call in
registers, each packed byte read once for them), so "rows" and "gemm" have no int8 counterpart.
Each time is a shape's third run (the first goes op by op, the second records), after a dropped
round that runs each shape past the thread team's trial (SETTLE).

    python bench/few_tokens_bench.py [CONFIG] [-n 9] [--tokens 1,2,4,8] [--modes few,int8]
    python bench/few_tokens_bench.py [CONFIG] --profile [--modes few,int8] [-n 5]
    python bench/few_tokens_bench.py [CONFIG] --speculative [--modes few,int8] [-n 2] [-t 32]

Prints, per token count, the median forward time (all logits, after a short prompt) and its
ratio to the one-token forward of the same mode. --profile splits each mode's k-token forward:
the step recorded again as separate kernel calls (no compiled program, no thread team: a linear
over 2 threads runs on numba's pool), each call's time summed per kernel and shape (an int8 or
fp32 linear named by its inputs -> rows, so the lm_head shows as 576->49152), and the host time
outside them (embedding rows, inputs, logits). With --speculative, `speculative_bench.py`'s
strategies run -n rounds of one run each per mode (default rows and few), alternating, each after
an untimed one (a new engine's first steps record and time its thread team), and their speed-up
against AR of the same mode (the mean over the rounds).
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path
from types import MethodType

import numpy as np

import mnnllm_core
from mnnllm_backends.cpu.kernels import int8_dot, linear, team
from mnnllm_backends.cpu.kernels.linear import Gemv
from mnnllm_backends.cpu.ops import packed_linear
from mnnllm_backends.cpu.ops.packed_linear import PackedLinearExecution
from mnnllm_core.backend_api import Execution
from speculative_bench import DEFAULT_CONFIG, prepare, run  # beside this script

FP32_MODES = ("rows", "few", "gemm")
MODES = (*FP32_MODES, "int8")
INT8_SETTINGS = {"backend_hints": {"cpu_int8_activations": True}}
PROMPT = "Hello, how are you?"
# untimed forwards of each shape before its timed ones: op by op, recorded, then past the thread
# team's trial of each program (`team.SETTLED_AFTER`)
SETTLE = 2 + team.SETTLED_AFTER


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
    step recorded in one mode would replay its kernels in another). "few" and "int8" patch
    nothing: "int8" is a matter of the engine's settings (INT8_SETTINGS)."""
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


def load_engines(config: Path, modes: list[str], threads: int) -> dict[str, object]:
    """One engine per mode: the fp32 modes share one, "int8" has its own."""
    engines: dict[str, object] = {}
    shared = None
    for name in modes:
        if name != "int8" and shared is not None:
            engines[name] = shared
            continue
        llm = mnnllm_core.create(config)
        llm.set_config({"sampler_type": "greedy", "thread_num": threads, "memory": "low",
                        **(INT8_SETTINGS if name == "int8" else {})})
        engines[name] = llm.load()
        if name != "int8":
            shared = engines[name]
    return engines


def _after_prompt(llm) -> int:
    """The engine reset and fed PROMPT; the token to repeat in the timed forwards."""
    llm.reset()
    llm.forward(llm.tokenizer_encode(PROMPT))
    return llm.context.history_tokens[-1]


def _timed_forward(llm, token: int, seq: int) -> float:
    """ms of one forward of `seq` copies of `token` (all logits), taken back out of the history."""
    start = time.perf_counter()
    llm.forward([token] * seq, all_logits=seq > 1)
    elapsed = (time.perf_counter() - start) * 1e3
    del llm.context.history_tokens[-seq:]
    return elapsed


def measure(engines: dict[str, object], counts: list[int], runs: int) -> dict[tuple[str, int], float]:
    modes = list(engines)
    tokens = {id(llm): _after_prompt(llm) for llm in engines.values()}
    times: dict[tuple[str, int], list[float]] = {}
    for r in range(runs + 1):  # the first round warms every path up (past the team's trial) and is dropped
        for name in modes[r % len(modes):] + modes[:r % len(modes)]:
            llm = engines[name]
            with mode(name, llm):
                for seq in counts:
                    for attempt in range(3 if r else SETTLE):  # a shape's first run goes op by op, its second records
                        elapsed = _timed_forward(llm, tokens[id(llm)], seq)
                    if r:
                        times.setdefault((name, seq), []).append(elapsed)
    return {key: statistics.median(values) for key, values in times.items()}


def _label(call) -> str:
    """A replay call's kernel, a linear's with its shape (inputs -> rows of all its members)."""
    func = getattr(call, "func", call)
    args = getattr(call, "args", ())
    if func in (int8_dot.linear, int8_dot.linear_parallel):
        x, outs = args[0], args[6]
        return f"int8 linear {x.shape[1]}->{sum(o.size for o in outs) // x.shape[0]}"
    if func in (linear._gemv, linear._gemv_parallel, linear._few_gemv, linear._few_gemv_parallel):
        x, outs = args[5], args[3]
        tokens = 1 if x.ndim == 1 else x.shape[0]
        return f"fp32 linear {x.shape[-1]}->{sum(o.size for o in outs) // tokens}"
    if isinstance(func, MethodType):  # an Execution's on_execute (op by op)
        return f"{type(func.__self__).__name__}.{func.__name__}"
    return getattr(getattr(func, "py_func", func), "__name__", type(func).__name__)


def _timed_calls(calls: list, spent: dict[str, float]) -> list:
    def timed(call):
        label = _label(call)

        def run_call():
            start = time.perf_counter()
            call()
            spent[label] += time.perf_counter() - start
        return run_call
    return [timed(call) for call in calls]


def profile(engines: dict[str, object], counts: list[int], runs: int) -> dict[tuple[str, int], dict[str, float]]:
    """Per mode and token count, the median ms of each kernel label over `runs` forwards of the
    step recorded as separate calls, "kernels" their sum, "forward" the whole forward and "host"
    the forward outside the kernels; "replayed" the forward as it runs (compiled programs, the
    thread team), "programs" and "other calls" what its recording holds."""
    found: dict[tuple[str, int], dict[str, float]] = {}
    for name, llm in engines.items():
        with mode(name, llm):
            token = _after_prompt(llm)
            for seq in counts:
                for _ in range(SETTLE):  # op by op, recorded, then past the team's trial
                    _timed_forward(llm, token, seq)
                replay = llm.pool.get(seq, seq > 1).static_module.session.pipeline.replay
                replayed = statistics.median(_timed_forward(llm, token, seq) for _ in range(runs))
                layout = {"programs": replay.programs, "other calls": len(replay.calls) - replay.programs}
                compiled, record = replay.compiled, replay.record
                spent: dict[str, float] = defaultdict(float)

                def record_timed(steps):
                    record(steps)
                    replay.calls = _timed_calls(replay.calls, spent)
                replay.compiled, replay.record = False, record_timed
                replay.record(replay.walk())
                samples: dict[str, list[float]] = defaultdict(list)
                try:
                    for _ in range(runs):
                        spent.clear()
                        forward = _timed_forward(llm, token, seq)
                        kernels = sum(spent.values()) * 1e3
                        for label, seconds in spent.items():
                            samples[label].append(seconds * 1e3)
                        samples["kernels"].append(kernels)
                        samples["forward"].append(forward)
                        samples["host"].append(forward - kernels)
                finally:
                    replay.compiled = compiled
                    del replay.record
                    replay.record(replay.walk())
                found[(name, seq)] = {**{label: statistics.median(values) for label, values in samples.items()},
                                      "replayed": replayed, **layout}
    return found


def profile_table(found: dict[tuple[str, int], dict[str, float]], modes: list[str], counts: list[int]) -> str:
    totals = ("kernels", "host", "forward", "replayed")
    counted = ("programs", "other calls")
    lines = []
    for name in modes:
        labels = sorted({label for (m, _), row in found.items() if m == name for label in row
                         if label not in totals + counted},
                        key=lambda label: -found[(name, counts[-1])].get(label, 0.0))
        lines += [f"\n{name}: ms per forward (median), separate kernel calls",
                  "| kernel | " + " | ".join(f"{seq} token{'s' if seq > 1 else ''}" for seq in counts) + " |",
                  "|---|" + "---:|" * len(counts)]
        for label in (*labels, *totals, *counted):
            form = "{:.0f}" if label in counted else "{:.2f}"
            lines.append(f"| {label} | " + " | ".join(form.format(found[(name, seq)].get(label, 0.0)) for seq in counts)
                         + " |")
    return "\n".join(lines)


def speculative(config: Path, modes: list[str], rounds: int, tokens: int) -> None:
    rows: dict[tuple[str, str], dict] = {}
    with tempfile.TemporaryDirectory(prefix="mnnllm-few-") as tmp:
        folder = Path(tmp)
        prepare(config.resolve(), folder)
        for r in range(rounds):
            for name in modes[r % len(modes):] + modes[:r % len(modes)]:
                with mode(name):
                    settings = INT8_SETTINGS if name == "int8" else {}
                    for row in run(folder / config.name, 1, tokens, settings=settings)[1:]:
                        entry = rows.setdefault((row["prompt"], row["strategy"]),
                                                {**{m: [] for m in modes}, "same": True})
                        entry[name].append(row["speedup"])
                        entry["acceptance"] = row["acceptance"]
                        entry["same"] &= row["same_as_ar"]
    print("| prompt | strategy | acceptance | " + " | ".join(f"vs AR, {m}" for m in modes) + " | = AR |\n"
          "|---|---|---:|" + "---:|" * len(modes) + "---|")
    for (prompt, strategy), entry in rows.items():
        acceptance = "-" if entry["acceptance"] is None else f"{100 * entry['acceptance']:.0f} %"
        ratios = " | ".join(f"{statistics.mean(entry[m]):.2f}x" for m in modes)
        print(f"| {prompt} | {strategy} | {acceptance} | {ratios} | {'yes' if entry['same'] else 'NO'} |")


def _modes(text: str) -> list[str]:
    names = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in names if m not in MODES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"modes are among {', '.join(MODES)}, got {text!r}")
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", nargs="?", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("-n", "--runs", type=int, default=9)
    parser.add_argument("--tokens", default="1,2,4,8")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--modes", type=_modes, default=None,
                        help=f"comma-separated, among {', '.join(MODES)} (default: rows,few,gemm; rows,few "
                             "with --speculative)")
    parser.add_argument("--profile", action="store_true", help="each k-token forward's time per kernel")
    parser.add_argument("--speculative", action="store_true")
    parser.add_argument("-t", "--generate", type=int, default=32, help="tokens a run (--speculative)")
    args = parser.parse_args()
    if args.speculative:
        speculative(args.config, args.modes or ["rows", "few"], args.runs, args.generate)
        return
    modes = args.modes or list(FP32_MODES)
    counts = sorted({1, *(int(t) for t in args.tokens.split(","))})
    engines = load_engines(args.config, modes, args.threads)
    if args.profile:
        print(profile_table(profile(engines, counts, args.runs), modes, counts))
        return
    medians = measure(engines, counts, args.runs)
    print("| tokens | " + " | ".join(f"{m} ms (x 1 token)" for m in modes) + " |")
    print("|---:|" + "---:|" * len(modes))
    for seq in counts:
        cells = [f"{medians[(m, seq)]:.1f} ({medians[(m, seq)] / medians[(m, 1)]:.2f}x)" for m in modes]
        print(f"| {seq} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
