"""Benchmark output: markdown (default), json (a list of rows), jsonl, csv."""
from __future__ import annotations

import csv
import io
import json
import os

from .bench_tests import label

COLUMNS = ["model", "modelSize", "backend", "threads", "precision", "test", "speed(tok/s)"]


def flatten(results: list[dict]) -> list[dict]:
    """One row per (model, backend, threads, test), carrying the run's context."""
    rows = []
    for result in results:
        for row in result["rows"]:
            rows.append({
                "model": result["model"], "model_size": result.get("model_size"), "backend": result["backend"],
                "threads": result["threads"], "precision": result["precision"], "test": row["test"],
                "n_prompt": row["n_prompt"], "n_gen": row["n_gen"], "n_depth": row.get("n_depth", 0),
                "samples_ts": row["samples_ts"],
                "avg_ts": row["avg_ts"], "stddev_ts": row["stddev_ts"], "load_s": result["load_s"],
                "peak_rss_mb": result["peak_rss_mb"], "device": result["device"],
                "placement": result.get("placement"), "versions": result["versions"],
                **({"honours": result["honours"]} if "honours" in result else {}),
                **({"vs_mnn": row["vs_mnn"]} if "vs_mnn" in row else {}),
                **({"cold_ts": row["cold_ts"]} if "cold_ts" in row else {}),
                **({"mp_s": row["mp_s"]} if "mp_s" in row else {}),
                **({"n_kv": row["n_kv"]} if "n_kv" in row else {}),
                **({"rounds": result["rounds"]} if "rounds" in result else {}),
            })
    return rows


def attach_ratios(results: list[dict], references: list[dict]) -> None:
    """Each row of `results` (and llama.cpp's among `references`) gets avg_ts / MNN's avg_ts for
    the same model, threads, test and depth."""
    mnn = [r for r in references if r["backend"].startswith("mnn")]
    reference = {(r["model"], r["threads"], row["test"], row.get("n_depth", 0)): row["avg_ts"]
                 for r in mnn for row in r["rows"]}
    for result in results + [r for r in references if r not in mnn]:
        for row in result["rows"]:
            base = reference.get((result["model"], result["threads"], row["test"], row.get("n_depth", 0)))
            if base:
                row["vs_mnn"] = row["avg_ts"] / base


def _threads(row: dict) -> str:
    """The thread count, or "-" for a backend that does not honour thread_num (a GPU schedules its own)."""
    honours = row.get("honours")
    return "-" if honours is not None and "thread_num" not in honours else str(row["threads"])


def _size(n: int | None) -> str:
    return "-" if not n else f"{n / 2**20:.1f} MiB"


def markdown(results: list[dict], extra: bool) -> str:
    rows = flatten(results)
    columns = list(COLUMNS)
    if any("vs_mnn" in r for r in rows):
        columns.append("vs MNN")
    if any("cold_ts" in r for r in rows):
        columns.append("cold(tok/s)")  # the untimed first run: resizes, kernel compiles, tuning
    if extra:
        columns += ["load(s)", "peak(MiB)"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---:" if c.startswith(("speed", "vs", "load", "peak",
                                                                                           "threads", "cold")) else "---"
                                                                 for c in columns) + "|"]
    for r in rows:
        cells = [os.path.basename(os.path.dirname(r["model"])) or r["model"], _size(r["model_size"]), r["backend"],
                 _threads(r), r["precision"], label(r["test"], r["n_depth"]),
                 f"{r['avg_ts']:.2f} ± {r['stddev_ts']:.2f}"]
        if "vs MNN" in columns:
            cells.append(f"{r['vs_mnn']:.2f}x" if "vs_mnn" in r else "")
        if "cold(tok/s)" in columns:
            cells.append(f"{r['cold_ts']:.2f}" if "cold_ts" in r else "")
        if extra:
            cells += [f"{r['load_s']:.2f}", f"{r['peak_rss_mb']:.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += _roofline(results)
    return "\n".join(lines)


def _roofline(results: list[dict]) -> list[str]:
    lines = []
    for result in results:
        weight = result.get("decode_weight_bytes")
        tg = sorted((row for row in result["rows"] if row["n_prompt"] == 0 and row["n_gen"]),
                    key=lambda row: row.get("n_depth", 0))  # the shallowest: weights, not the KV cache
        if weight and tg:
            speed = tg[0]["avg_ts"]
            line = (f"\ndecode roofline ({result['backend']}, t{result['threads']}): {weight / 2**20:.1f} MiB "
                    f"of weights per token x {speed:.1f} tok/s = {weight * speed / 1e9:.2f} GB/s")
            if result.get("host_read_gbs"):
                share = weight * speed / 1e9 / result["host_read_gbs"]
                line += (f", {100 * share:.0f}% of the {result['host_read_gbs']:.2f} GB/s this host's memory reads "
                         f"at {result['threads']} thread{'s' if result['threads'] > 1 else ''}")
                if result.get("host_read_median_gbs"):
                    typical = weight * speed / 1e9 / result["host_read_median_gbs"]
                    line += (f" (the best of {result['host_reads']} reads; {100 * typical:.0f}% of their median, "
                             f"{result['host_read_median_gbs']:.2f} GB/s)")
            lines.append(line)
    return lines


def profile_text(results: list[dict]) -> str:
    lines = []
    for result in results:
        for phase, entries in result.get("profile", {}).items():
            lines.append(f"\n{phase} ({result['backend']}, t{result['threads']}): time per op type")
            lines.append("| backend | op | ms | share |\n|---|---|---:|---:|")
            lines += [f"| {e['backend']} | {e['op']} | {e['ms']:.3f} | {100 * e['share']:.1f}% |" for e in entries]
    return "\n".join(lines)


def render(results: list[dict], fmt: str, extra: bool = False) -> str:
    if fmt == "json":
        return json.dumps(flatten(results), indent=2)
    if fmt == "jsonl":
        return "\n".join(json.dumps(r) for r in flatten(results))
    if fmt == "csv":
        out = io.StringIO()
        rows = flatten(results)
        fields = [k for k in rows[0] if k not in ("placement", "versions")] if rows else []
        writer = csv.DictWriter(out, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        for r in rows:
            writer.writerow({**r, "samples_ts": ";".join(f"{s:.3f}" for s in r["samples_ts"])})
        return out.getvalue().rstrip("\n")
    return markdown(results, extra)
