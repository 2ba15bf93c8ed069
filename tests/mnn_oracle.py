"""Run MNN's own runtime (PyPI MNN) in a subprocess - one model per process - as the oracle."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import json, os, sys, tempfile
    import numpy as np
    import MNN.llm as llm
    job = json.load(sys.stdin)
    config = json.load(open(os.path.join(job["model_dir"], "config.json")))
    config.update(job.get("config", {}))
    config["base_dir"] = job["model_dir"].rstrip("/") + "/"
    folder = tempfile.mkdtemp()
    path = os.path.join(folder, "config.json")
    json.dump(config, open(path, "w"))
    m = llm.create(path)
    m.load()
    out = {"logits": [], "generate": [], "encode": []}
    for ids in job.get("logits", []):
        m.reset()
        v = m.forward(ids)
        out["logits"].append(np.array(v.read() if hasattr(v, "read") else v, dtype=np.float32).reshape(-1).tolist())
    for ids, n in job.get("generate", []):
        m.reset()
        out["generate"].append(list(m._c_obj.generate(ids, n)))
    for text in job.get("encode", []):
        out["encode"].append(list(m.tokenizer_encode(text)))
    print("@@RESULT@@" + json.dumps(out), flush=True)
    os._exit(0)  # MNN 3.6.1 can crash in its destructors at interpreter exit
""")


def run_mnn(model_dir: str, timeout: float = 600, **job) -> dict:
    """job: config={...}, logits=[ids...], generate=[(ids, n)...], encode=[texts]."""
    return run_script(SCRIPT, {"model_dir": str(model_dir), **job}, timeout)


def run_script(script: str, job: dict, timeout: float):
    """Run `script` in a fresh interpreter with `job` as JSON on stdin; what it printed after @@RESULT@@."""
    pytest.importorskip("MNN", reason="PyPI MNN (the reference runtime) is not installed")
    done = subprocess.run([sys.executable, "-c", script], input=json.dumps(job), capture_output=True, text=True,
                          errors="replace",  # a random model's answer printed by MNN may be no UTF-8
                          timeout=timeout)
    marker = "@@RESULT@@"
    if done.returncode != 0 or marker not in done.stdout:
        raise RuntimeError(f"MNN runtime failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.split(marker, 1)[1])
