"""One int4 linear as an MNN model, run by PyPI MNN under memory "low" (its dynamic-quant int8
path) and by our cpu backend with `cpu_int8_activations`, outputs compared bit for bit (issue #30).

    python bench/mnn_int8_linear_probe.py [--ic 576] [--oc 64] [--block 64] [--rows 1,2,4,7]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np

from mnnllm_core.core.backend import BackendConfig, ScheduleConfig
from mnnllm_core.export.decoder import from_c4, linear, to_c4
from mnnllm_core.export.graph import GraphBuilder
from mnnllm_core.export.sources import LazyTensor
from mnnllm_core.export.weights import WeightWriter
from mnnllm_core.express.module import Module
from mnnllm_core.express.runtime_manager import RuntimeManager
from mnnllm_core.express.static_module import Config
from mnnllm_core.schema.MNN.DataType import DataType

MNN_SCRIPT = textwrap.dedent("""
    import json, os, sys, numpy as np, MNN.nn as nn, MNN.expr as F
    job = json.load(sys.stdin)
    rt = nn.create_runtime_manager(({"backend": 0, "memory": {"normal": 0, "high": 1, "low": 2}[job["memory"]], "precision": job.get("precision", "normal"),
                                     "numThread": job["threads"]},))
    rt.set_external(job["model"] + ".weight")
    mod = nn.load_module_from_file(job["model"], ["x"], ["y"], runtime_manager=rt, rearrange=True)
    out = []
    for rows in job["inputs"]:
        x = np.array(rows, np.float32)
        y = mod.forward([F.const(x.reshape(-1).tolist(), list(x.shape), F.NCHW, F.float)])[0]
        out.append(np.array(y.read(), np.float32).reshape(x.shape[0], -1).view(np.uint32).tolist())
    print("@@RESULT@@" + json.dumps(out), flush=True)
    os._exit(0)
""")


def write_model(folder: Path, w: np.ndarray, block: int) -> Path:
    path = folder / "linear.mnn"
    g = GraphBuilder()
    oc, ic = w.shape
    with open(str(path) + ".weight", "wb") as f:
        writer = WeightWriter(f, 4, block, lambda _: None)
        g.input("x", [-1, ic], DataType.DT_FLOAT)
        out, _ = linear(g, writer, "/lin", to_c4(g, "/lin", "x", ic), LazyTensor("w", w.shape, lambda a, b: w[a:b]))
        from_c4(g, "/lin", out, oc, rows=0, output="y")
    path.write_bytes(g.finish(["y"], "int8-probe"))
    return path


def run_mnn(model: Path, inputs: list[np.ndarray], memory: str = "low", threads: int = 1,
            precision: str = "normal") -> list[np.ndarray]:
    job = {"model": str(model), "memory": memory, "threads": threads, "precision": precision,
           "inputs": [x.tolist() for x in inputs]}
    done = subprocess.run([sys.executable, "-c", MNN_SCRIPT], input=json.dumps(job), capture_output=True,
                          text=True, timeout=600)
    if "@@RESULT@@" not in done.stdout:
        raise RuntimeError(done.stderr[-3000:])
    return [np.array(y, np.uint32).view(np.float32) for y in json.loads(done.stdout.split("@@RESULT@@", 1)[1])]


def run_ours(model: Path, inputs: list[np.ndarray], int8: bool = True) -> list[np.ndarray]:
    runtime = RuntimeManager.create(ScheduleConfig(backend_type="cpu", thread_num=1, backend_config=BackendConfig(memory="low")),
                                    hints={"cpu_int8_activations": int8})
    runtime.set_external_file(str(model) + ".weight")
    module = Module.load(["x"], ["y"], model, runtime, Config(rearrange=True))
    outs = []
    for x in inputs:
        y = module.forward({"x": x})
        y = y[0] if isinstance(y, (list, tuple)) else y
        outs.append(np.array(y, np.float32).reshape(x.shape[0], -1))
    return outs


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ic", type=int, default=576)
    p.add_argument("--oc", type=int, default=64)
    p.add_argument("--block", type=int, default=64)
    p.add_argument("--rows", default="1,2,4,7")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--precision", default="normal", help="MNN's precision (the shared model's config: low)")
    a = p.parse_args()
    rng = np.random.default_rng(a.seed)
    w = (rng.standard_normal((a.oc, a.ic)) * 0.05).astype(np.float32)
    inputs = [(rng.standard_normal((int(r), a.ic)) * 2 + 0.3).astype(np.float32) for r in a.rows.split(",")]
    folder = Path(tempfile.mkdtemp())
    model = write_model(folder, w, a.block)
    inputs.append(inputs[0][:1])  # the first row alone: does MNN give it the same bits as among others?
    mnn = run_mnn(model, inputs, precision=a.precision)
    alone = inputs.pop(), mnn.pop()
    print(f"MNN low, first row alone vs among {inputs[0].shape[0]}: equal {np.mean(alone[1][0] == mnn[0][0]):.3f}")
    mnn_fp32 = run_mnn(model, inputs, memory="normal")
    ours = run_ours(model, inputs)
    for x, m, f, o in zip(inputs, mnn, mnn_fp32, ours):
        print(f"rows {x.shape[0]}: equal {np.mean(m == o):.3f}  max|mnn-ours| {np.abs(m - o).max():.3g}  "
              f"max|mnn-mnn_fp32| {np.abs(m - f).max():.3g}")
    np.savez(folder / "probe.npz", w=w, mnn=np.array(mnn, dtype=object), ours=np.array(ours, dtype=object), *inputs)
    print(folder)


if __name__ == "__main__":
    main()
