"""The opencl backend (pyopencl; pocl on machines without a GPU): what the conformance suite
(tests/test_backend_ops.py runs it on every backend) does not cover: the device and its probe,
the program cache, the runtime hints (rows split across work-items, fp16 storage, both through
the suite's cases), and the shared model against the cpu backend with nothing going back to the
host between decode steps. Skipped only when no OpenCL driver can build and run a kernel (with
the probe's reason).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from functools import lru_cache

import numpy as np
import pytest

from mnnllm_core.core.backend import ScheduleConfig
from mnnllm_core.express.runtime_manager import RuntimeManager
from mnnllm_core.plugins.manager import registry
from mnnllm_core.testing import FP16_TOL, all_cases, new_runtime, run_suite, select
from paths import SHARED

AVAILABLE, REASON = registry().get("opencl").is_available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=f"OpenCL unavailable: {REASON}")

MODEL = SHARED / "models" / "smollm2-135m-instruct-mnn-q4"


def opencl_runtime(**hints) -> RuntimeManager:
    return RuntimeManager.create(ScheduleConfig(backend_type="opencl", thread_num=2), hints)


@lru_cache(maxsize=None)
def shared_opencl(**hints) -> RuntimeManager:
    return opencl_runtime(**hints)


# ------------------------------------------------------------------ runtime and availability

def test_runtime_reports_the_device_and_forces_static_shapes() -> None:
    runtime = shared_opencl()
    assert runtime.static_shapes
    assert runtime.runtime.device_name()
    assert registry().get("opencl").devices()


def test_programs_are_compiled_once_per_process() -> None:
    first, second = opencl_runtime(), opencl_runtime()
    a = first.create_backends()[0].program("norm.cl", "layernorm")
    b = second.create_backends()[0].program("norm.cl", "layernorm")
    assert a.kernel.program.int_ptr == b.kernel.program.int_ptr


@pytest.mark.parametrize("split", [3, 0, "eight", [8]])
def test_a_bad_linear_split_hint_is_a_config_error_naming_the_hint(split) -> None:
    from mnnllm_core.errors import ConfigError
    with pytest.raises(ConfigError, match="opencl_linear_split"):
        opencl_runtime(opencl_linear_split=split)


def test_without_a_driver_the_backend_is_unavailable_and_selecting_it_names_why(tmp_path) -> None:
    script = textwrap.dedent("""
        from mnnllm_core.core.backend import ScheduleConfig
        from mnnllm_core.errors import BackendError
        from mnnllm_core.express.runtime_manager import RuntimeManager
        from mnnllm_core.plugins.manager import registry
        ok, reason = registry().get("opencl").is_available()
        assert not ok and reason, (ok, reason)
        try:
            RuntimeManager.create(ScheduleConfig(backend_type="opencl"))
        except BackendError as err:
            assert "opencl" in str(err) and reason.split(" (")[0] in str(err), str(err)  # a long reason is cut
            print("unavailable:", reason)
        else:
            raise AssertionError("selecting opencl without a driver must fail")
    """)
    env = dict(os.environ, OCL_ICD_VENDORS=str(tmp_path), OCL_ICD_FILENAMES="")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "unavailable:" in done.stdout


# ------------------------------------------------------------------ hints the suite does not set

def convolution_cases(name: str = "") -> list:
    return select("Convolution", name=name)


@pytest.mark.parametrize("split", [4, 8])
def test_linear_kernels_with_rows_split_across_work_items_pass_every_linear_case(split) -> None:
    hints = {"opencl_linear_split": split, "opencl_cpu_kernels": False}  # the split kernels on a CPU device too
    results = run_suite("opencl", hints=hints, cases=convolution_cases())
    failed = [(r.case.id, r.status, r.reason) for r in results if r.status != "pass"]
    assert not failed, failed


FP16_CASES = ["Convolution[q4 ic=576 block=64 tokens=7]", "LayerNorm[fused residual tokens=7]",
              "RoPE[heads=9/3 dim=64 tokens=7]", "Attention[causal prefill heads=9/3 dim=64 tokens=7]"]


def test_fp16_storage_keeps_every_kernel_within_fp16_tolerance() -> None:
    cases = [c for c in all_cases() if c.id in FP16_CASES]
    assert len(cases) == len(FP16_CASES)
    results = run_suite("opencl", hints={"opencl_fp16": True}, half=True, cases=cases)
    assert all(r.tolerance == FP16_TOL for r in results)
    failed = [(r.case.id, r.status, r.reason) for r in results if r.status != "pass"]
    assert not failed, failed


# ------------------------------------------------------------------ the shared model

def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.reshape(-1).astype(np.float64), b.reshape(-1).astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


class Model:
    """The shared q4 model on one backend: a prefill module and a decode clone, as the LLM's
    ModulePool keeps them (the clone shares packed weights and the KV cache)."""

    def __init__(self, backend: str):
        from mnnllm_core.express.module import Module
        from mnnllm_core.express.static_module import Config
        self.runtime = RuntimeManager.create(ScheduleConfig(backend_type=backend, thread_num=2))
        self.prefill = Module.load([], [], MODEL / "llm.mnn", self.runtime, Config(rearrange=True, shape_mutable=False))
        self.decode = self.prefill.clone() if backend == "opencl" else self.prefill
        self.past = 0

    def forward(self, module, embeddings: np.ndarray) -> np.ndarray:
        seq = embeddings.shape[0]
        meta = self.runtime.kv_meta
        meta.add = seq
        feeds = {"input_ids": embeddings.reshape(seq, 1, -1), "attention_mask": np.zeros((1, 1, 1, 1), np.float32),
                 "position_ids": np.arange(self.past, self.past + seq, dtype=np.int32).reshape(1, seq),
                 "logits_index": np.array([-1], np.int32)}
        logits = module.forward(feeds)[0]
        meta.sync()
        self.past += seq
        return logits.reshape(-1)

    def reset(self) -> None:
        self.runtime.kv_meta.reset()
        self.runtime.kv_meta.sync()
        self.past = 0


@lru_cache(maxsize=1)
def embedding_table():
    """Rows of the tied lm_head, dequantized on demand (the model's embedding lookup)."""
    from mnnllm_core.express.module import Module
    from mnnllm_core.express.static_module import Config
    module = Module.load([], [], MODEL / "llm.mnn", new_runtime(), Config(rearrange=False))
    for node in module.static_module.session.info.nodes:
        if node.op.type == "Convolution" and node.op.param.oc == 49152:
            return node.op.weights.convolution().quantized
    raise AssertionError("no lm_head in the shared model")


@pytest.fixture(scope="module")
def models():
    if not (MODEL / "llm.mnn").exists():
        pytest.skip(f"shared model missing at {MODEL}")
    return Model("cpu"), Model("opencl")


DECODE_STEPS = 4


def count_host_transfers(model: Model, step) -> dict[str, int]:
    """Host<->device copies during one call of `step` on the opencl model."""
    allocator = model.runtime.runtime.allocator
    counts = {"to_device": 0, "to_host": 0}
    copyin, copyout = allocator.copyin, allocator.copyout

    def counted_in(*args):
        counts["to_device"] += 1
        return copyin(*args)

    def counted_out(*args):
        counts["to_host"] += 1
        return copyout(*args)
    allocator.copyin, allocator.copyout = counted_in, counted_out
    try:
        step()
    finally:
        del allocator.copyin, allocator.copyout
    return counts


def test_shared_model_logits_match_the_cpu_backend_on_the_reference_prompts(models) -> None:
    cpu, ocl = models
    table = embedding_table()
    prompts = json.loads((MODEL / "reference.json").read_text())["prompts"]
    for prompt in prompts:
        ids = prompt["prompt_ids"]
        cpu.reset(), ocl.reset()
        embeddings = table.dequantize_rows(ids)
        want, got = cpu.forward(cpu.prefill, embeddings), ocl.forward(ocl.prefill, embeddings)
        assert int(got.argmax()) == int(want.argmax()) == prompt["mnn_cpp_q4_memory_normal"]["gen_ids"][0]
        assert cosine(got, want) >= 0.9999
        token = int(want.argmax())
        for step in range(DECODE_STEPS):
            embedding = table.dequantize_rows([token])
            want, got = cpu.forward(cpu.decode, embedding), ocl.forward(ocl.decode, embedding)
            assert int(got.argmax()) == int(want.argmax()), f"decode step {step}"
            assert cosine(got, want) >= 0.9999, f"decode step {step}"
            token = int(want.argmax())
    transfers = count_host_transfers(ocl, lambda: ocl.forward(ocl.decode, table.dequantize_rows([token])))
    assert transfers == {"to_device": 4, "to_host": 2}, "the 4 inputs in, logits and hidden_states out"
    placement = ocl.decode.placement()
    assert placement["fallbacks"] == [] and placement["copies"] == 0, placement
    assert set(placement["ops_per_backend"]) == {"opencl"}
    assert ocl.decode.static_module.resize_count == 1, "decode never resizes after its first step"
