"""`mnnllm bench --rounds K`: every engine runs K times, in turn, and its rounds count as one run.

On a shared machine the load moves whole minutes of runs by 20-40%: ours running for five
minutes and MNN's for the next five compares two loads as much as two engines. In rounds each
engine runs its -rep repetitions in a fresh process once per round (ours, then MNN's, then
llama.cpp's; again in the next round), so every engine's samples span the same stretch of
time and its ratios hold. A result of several rounds is one result: its samples joined (mean
and spread over all of them), the load time the median of the rounds', the peak memory the
highest, a first (cold) run's speed the median of the rounds'.
"""
from __future__ import annotations

import statistics


def merge_rounds(rounds: list[list[dict]]) -> list[dict]:
    """The results of several rounds (each a list of the same runs in the same order) as one list."""
    if len(rounds) == 1:
        return list(rounds[0])
    return [_merge_result(list(runs)) for runs in zip(*rounds, strict=True)]


def _merge_result(runs: list[dict]) -> dict:
    return {**runs[0], "rounds": len(runs), "load_s": statistics.median(r["load_s"] for r in runs),
            "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
            "rows": [_merge_row(list(rows)) for rows in zip(*(r["rows"] for r in runs), strict=True)]}


def _merge_row(rows: list[dict]) -> dict:
    first = rows[0]
    samples = [s for row in rows for s in row["samples_ts"]]
    merged = {**first, "samples_ts": samples, "avg_ts": statistics.fmean(samples),
              "stddev_ts": statistics.stdev(samples) if len(samples) > 1 else 0.0}
    if "cold_ts" in first:
        merged["cold_ts"] = statistics.median(row["cold_ts"] for row in rows)
    if "mp_s" in first:  # megapixels a second follow the mean speed
        merged["mp_s"] = first["mp_s"] * merged["avg_ts"] / first["avg_ts"]
    return merged
