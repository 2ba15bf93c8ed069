"""The conformance results as people read them: one markdown row per case (op, variant, dtype,
status, error against the tolerance, the backend's reason when it did not run the op, time per
run in perf mode), a summary per op type, and JSON on request."""
from __future__ import annotations

import json
from collections import Counter
from typing import Sequence

from .runner import CaseResult

STATUS = {"pass": "pass", "fail": "FAIL", "unsupported": "not supported"}


def _error(result: CaseResult) -> str:
    if result.error is None or result.status == "unsupported":
        return "-"
    if result.tolerance == 0:
        return "exact" if result.error == 0 else f"{result.error:.2g} (exact)"
    return f"{result.error:.1e} / {result.tolerance:.0e}"


def table(results: Sequence[CaseResult], perf: bool = False) -> str:
    head = "| op | case | dtype | status | error / tol |" + (" us/run |" if perf else "") + " reason |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        timing = f" {r.us_per_run:.1f} |" if perf and r.us_per_run is not None else (" - |" if perf else "")
        reason = r.reason.replace("|", "/")
        lines.append(f"| {r.case.op_type} | {r.case.name} | {r.case.dtype} | {STATUS[r.status]} | {_error(r)} |"
                     f"{timing} {reason} |")
    return "\n".join(lines)


def summary(results: Sequence[CaseResult]) -> str:
    """Per op type: cases passed, failed, not supported (and the reasons given)."""
    by_type: dict[str, Counter] = {}
    reasons: dict[str, Counter] = {}
    for r in results:
        by_type.setdefault(r.case.op_type, Counter())[r.status] += 1
        if r.status == "unsupported":
            reasons.setdefault(r.case.op_type, Counter())[r.reason] += 1
    lines = ["| op | pass | fail | not supported | reasons given |", "|---|---|---|---|---|"]
    for op_type, counts in by_type.items():
        why = "; ".join(f"{reason} ({n})" for reason, n in reasons.get(op_type, Counter()).most_common())
        lines.append(f"| {op_type} | {counts['pass']} | {counts['fail']} | {counts['unsupported']} | {why} |")
    total = Counter(r.status for r in results)
    lines.append(f"\n{total['pass']}/{len(results)} passed, {total['fail']} failed, "
                 f"{total['unsupported']} not supported")
    return "\n".join(lines)


def render(backend: str, device: str, results: Sequence[CaseResult], fmt: str = "md", perf: bool = False) -> str:
    if fmt == "json":
        return json.dumps({"backend": backend, "device": device, "results": [r.as_dict() for r in results]}, indent=1)
    return f"## {backend} ({device})\n\n{table(results, perf)}\n\n{summary(results)}"
