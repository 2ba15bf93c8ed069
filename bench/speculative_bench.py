"""Speculative decoding against token-by-token decoding, side by side in one process (greedy, cpu):
verify steps a reply (those that kept no guess: their work lost), acceptance (guesses the model
kept / guesses verified), tokens per verify step, decode speed
(generated tokens after the first / wall time after the prefill; medians of -n runs after
--warmup untimed ones, the strategies alternating) and its ratio to AR, and whether the tokens are AR's.

Strategies: lookahead (MNN's n-gram cache, defaults), MTP and Eagle with drafts fitted by the
exporter (mnnllm_core/export/draft.py) to the model's own greedy answers to FIT_QUESTIONS
(other questions than the benchmark's), and with random drafts. Prompts: a repetitive one
(the answer quotes the code in the prompt) and a free one. `--tree K:NODES` adds the fitted
Eagle with eagle_topk K verifying a token tree of NODES guesses (draft_predict_length), depth
`--depth`; `--only` keeps AR and the named strategies; `--always` adds each with draft_adaptive off.

    python bench/speculative_bench.py [CONFIG] [-n 3] [-t 48] [--tree 2:6 --tree 4:8] [--only "eagle fitted"] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import mnnllm_core
from mnnllm_core.export.draft import fit_drafts, random_eagle, random_mtp, write_eagle, write_mtp
from shared_models import SHARED_MODEL  # beside this script

DEFAULT_CONFIG = SHARED_MODEL
FIT_QUESTIONS = ["Explain how a bicycle works.", "Write a short story about a cat.",
                 "What are the benefits of exercise?", "Describe the water cycle.",
                 "How do computers store data?", "Give me three tips for learning a language."]
PROMPTS = {"repetitive": "Here is a Python function:\n\ndef add_numbers(first_number, second_number):\n"
                         "    result = first_number + second_number\n    return result\n\n"
                         "Add a docstring to it and show the whole function.",
           "free": "Tell me about the history of Rome."}
FITTED = {"mtp_model": "mtp.mnn", "eagle_model": "eagle.mnn", "eagle_fc": "eagle_fc.mnn",
          "eagle_d2t": "eagle_d2t.mnn"}
RANDOM = {"mtp_model": "random/mtp.mnn", "eagle_model": "random/eagle.mnn", "eagle_fc": "random/eagle_fc.mnn",
          "eagle_d2t": "random/eagle_d2t.mnn"}
STRATEGIES = {"ar": ("", {}), "lookahead": ("lookahead", {}), "mtp fitted": ("mtp", FITTED),
              "eagle fitted": ("eagle", FITTED), "mtp random": ("mtp", RANDOM), "eagle random": ("eagle", RANDOM)}


def prepare(config: Path, folder: Path) -> None:
    """The model's files linked into `folder`, beside random drafts and drafts fitted to it."""
    for name in os.listdir(config.parent):
        os.symlink(config.parent / name, folder / name)
    llm = mnnllm_core.create(folder / config.name)
    llm.set_config({"sampler_type": "greedy", "thread_num": 2, "hidden_states": True})
    llm.load()
    start = time.perf_counter()
    sequences = []
    for question in FIT_QUESTIONS:
        ids = llm.tokenizer_encode(llm.apply_chat_template([{"role": "user", "content": question}]))
        llm.reset()
        sequences.append(ids + llm.generate(ids, 96))
    mtp, eagle = fit_drafts(llm, sequences, heads=3, draft_vocab=2048, ridge=1.0)
    write_mtp(folder, mtp)
    write_eagle(folder, eagle)
    hidden, vocab = llm.config.hidden_size, mtp.lm_head.shape[0]
    (folder / "random").mkdir()
    write_mtp(folder / "random", random_mtp(hidden, vocab, 3))
    write_eagle(folder / "random", random_eagle(hidden, vocab, 2048))
    print(f"drafts fitted on {sum(map(len, sequences))} tokens of the model's answers in "
          f"{time.perf_counter() - start:.1f} s", file=sys.stderr)


def strategies(trees: list[str], depth: int, only: list[str], always: bool = False) -> dict[str, tuple[str, dict]]:
    """STRATEGIES, with a fitted Eagle per `trees` entry "K:NODES", kept to AR and `only` (if given);
    with `always`, each beside its "always" twin that drafts every step (draft_adaptive off, MNN's way)."""
    found = dict(STRATEGIES)
    for tree in trees:
        topk, nodes = (int(n) for n in tree.split(":"))
        found[f"eagle fitted top{topk}/{nodes}"] = ("eagle", {**FITTED, "eagle_topk": topk, "eagle_depth": depth,
                                                               "draft_predict_length": nodes})
    if only:
        found = {name: found[name] for name in found if name == "ar" or name in only or
                 any(name.startswith(o + " top") for o in only)}
    if always:
        found.update({f"{name} always": (kind, {**keys, "draft_adaptive": False})
                      for name, (kind, keys) in list(found.items()) if kind})
    return found


def run(config: Path, runs: int, tokens: int, chosen: dict[str, tuple[str, dict]] = STRATEGIES,
        settings: dict | None = None, warmup: int = 1) -> list[dict]:
    """Every strategy of `chosen` (and AR) in an engine of its own, with `settings` (config keys,
    e.g. backend_hints) on top of each; `warmup` untimed runs per engine and prompt first (a new
    engine's first steps of each shape run op by op, record, and time its thread team)."""
    engines = {}
    for name, (kind, files) in chosen.items():
        llm = mnnllm_core.create(config)
        llm.set_config({"sampler_type": "greedy", "thread_num": 2, "speculative_type": kind, **files,
                        **(settings or {})})
        engines[name] = llm.load()
    first = engines["ar"]
    prompts = {p: first.tokenizer_encode(first.apply_chat_template([{"role": "user", "content": text}]))
               for p, text in PROMPTS.items()}
    results = {(p, s): {"tok_s": [], "proposed": 0, "accepted": 0, "steps": 0, "empty": 0, "tokens": None}
               for p in prompts for s in engines}
    names = list(engines)
    for _ in range(warmup):
        for ids in prompts.values():
            for llm in engines.values():
                llm.reset()
                llm.generate(ids, tokens)
    for r in range(runs):
        order = names[r % len(names):] + names[:r % len(names)]
        for prompt, ids in prompts.items():
            for name in order:
                llm, row = engines[name], results[(prompt, name)]
                strategy = llm.generation
                before = (getattr(strategy, "proposed", 0), getattr(strategy, "accepted", 0),
                          getattr(strategy, "verify_steps", 0), getattr(strategy, "empty_steps", 0))
                llm.reset()
                start = time.perf_counter()
                out = llm.generate(ids, tokens)
                wall = time.perf_counter() - start - llm.context.prefill_us / 1e6
                row["tok_s"].append((len(out) - 1) / wall)
                row["proposed"] += getattr(strategy, "proposed", 0) - before[0]
                row["accepted"] += getattr(strategy, "accepted", 0) - before[1]
                row["steps"] += getattr(strategy, "verify_steps", 0) - before[2]
                row["empty"] += getattr(strategy, "empty_steps", 0) - before[3]
                row["tokens"] = out
    table = [forward_costs(first, first.config.draft_predict_length + 1, runs)]
    for (prompt, name), row in results.items():
        ar = results[(prompt, "ar")]
        median = statistics.median(row["tok_s"])
        table.append({"prompt": prompt, "strategy": name, "generated": len(row["tokens"]),
                      "acceptance": row["accepted"] / row["proposed"] if row["proposed"] else None,
                      "accepted_per_step": row["accepted"] / row["steps"] if row["steps"] else None,
                      "verify_steps": row["steps"] / runs, "empty_steps": row["empty"] / runs,
                      "decode_tok_s": median, "speedup": median / statistics.median(ar["tok_s"]),
                      "same_as_ar": row["tokens"] == ar["tokens"], "runs": row["tok_s"]})
    return table


def forward_costs(llm, verify: int, runs: int) -> dict:
    """What one verify step costs against one decode step: the main model's forward of `verify`
    tokens (all logits) and of one token, after a short prompt (medians of the replayed runs: a
    shape's first two runs, op by op and recording, are not timed, as in generation they happen
    once)."""
    llm.reset()
    llm.forward(llm.tokenizer_encode("Hello, how are you?"))
    costs = {}
    for index, seq in enumerate((1, verify) * (2 + max(3, runs))):
        start = time.perf_counter()
        llm.forward([llm.context.history_tokens[-1]] * seq, all_logits=seq > 1)
        if index >= 4:
            costs.setdefault(seq, []).append((time.perf_counter() - start) * 1e3)
        del llm.context.history_tokens[-seq:]
    llm.reset()
    one, many = statistics.median(costs[1]), statistics.median(costs[verify])
    return {"forward_ms": {"1": one, str(verify): many}, "ratio": many / one}


def markdown(table: list[dict]) -> str:
    lines = ["| prompt | strategy | tokens | verify steps (none kept) a reply | acceptance | accepted / step | "
             "decode tok/s (median) | vs AR | = AR |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    costs, table = table[0], table[1:]
    for row in table:
        acc = "-" if row["acceptance"] is None else f"{100 * row['acceptance']:.0f} %"
        per = "-" if row["accepted_per_step"] is None else f"{row['accepted_per_step']:.2f}"
        steps = f"{row['verify_steps']:.1f} ({row['empty_steps']:.1f})" if row["verify_steps"] else "-"
        lines.append(f"| {row['prompt']} | {row['strategy']} | {row['generated']} | {steps} | {acc} | {per} | "
                     f"{row['decode_tok_s']:.1f} | {row['speedup']:.2f}x | {'yes' if row['same_as_ar'] else 'NO'} |")
    (one, verify), (one_ms, verify_ms) = costs["forward_ms"].keys(), costs["forward_ms"].values()
    lines.append(f"\nmain model forward: {one} token {one_ms:.1f} ms, {verify} tokens (a verify step) {verify_ms:.1f} ms "
                 f"({costs['ratio']:.2f}x): a step must keep more than {costs['ratio'] - 1:.2f} guesses to pay off")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", nargs="?", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("-n", "--runs", type=int, default=3)
    parser.add_argument("-t", "--tokens", type=int, default=48)
    parser.add_argument("--tree", action="append", default=[], metavar="K:NODES",
                        help="add the fitted Eagle with eagle_topk K and a tree of NODES guesses")
    parser.add_argument("--depth", type=int, default=3, help="eagle_depth of the --tree rows")
    parser.add_argument("--only", action="append", default=[], help="keep AR and this strategy (repeatable)")
    parser.add_argument("--always", action="store_true",
                        help="add each strategy with draft_adaptive off (drafting every step, as MNN)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs per engine and prompt first")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mnnllm-spec-") as tmp:
        folder = Path(tmp)
        prepare(args.config.resolve(), folder)
        table = run(folder / args.config.name, args.runs, args.tokens,
                    strategies(args.tree, args.depth, args.only, args.always), warmup=args.warmup)
    print(json.dumps({"forward": table[0], "rows": table[1:]}, indent=1) if args.json else markdown(table))


if __name__ == "__main__":
    main()
