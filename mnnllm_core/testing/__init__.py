"""The conformance suite every backend passes, ours and third-party ones (`mnnllm test-backend
NAME`), in the spirit of llama.cpp's test-backend-ops: every op type and parameter variant the
LLM graphs use, odd shapes, each dtype, against float64 numpy references with stated
tolerances; a table of pass / fail / not supported (with the backend's reason) and a perf mode.

    from mnnllm_core.testing import run_suite
    results = run_suite("mybackend", op="BinaryOp")
    assert all(r.status != "fail" for r in results)

`harness` runs one op through the real core path (also for a backend's own tests), `cases`
holds the catalogue, `references` the float64 references, `runner` and `report` the rest.
"""
from .cases import FP16_TOL, FP32_TOL, INT8_KV_TOL, Case, Step, Trial, all_cases, perf_cases
from .cases.case import randn, single
from .cases.linear import LINEAR_TOL, linear_op
from .harness import Again, Const, Graph, OpResult, Weights, make_module, new_runtime, one_op_graph, run_op
from .report import render, summary, table
from .references import linear_reference, quantize
from .runner import CaseResult, Runner, compare, run_suite, select

__all__ = ["Case", "Step", "Trial", "all_cases", "perf_cases", "FP32_TOL", "FP16_TOL", "INT8_KV_TOL", "Again",
           "Const", "Graph", "OpResult", "Weights", "make_module", "new_runtime", "one_op_graph", "run_op", "render",
           "summary", "table", "CaseResult", "Runner", "compare", "run_suite", "select",
           # a backend's own cases build on these (plugins import nothing deeper)
           "randn", "single", "LINEAR_TOL", "linear_op", "linear_reference", "quantize"]
