"""Every exporter architecture: a tiny random HF model built with transformers, exported with
`mnnllm export` at 16 and 4 bit, run by our engine and by MNN's runtime, both checked against
transformers (16 bit: its greedy tokens; 4 bit: its greedy tokens on the dequantized weights)."""
from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from hf_tiny import ARCHS, COMPOSITES, PROMPTS, NEW_TOKENS, Arch, build, dequantize_into, greedy, until_stop
from test_export import engine_generate, mnn_generate

pytest.importorskip("transformers", reason="transformers builds the tiny reference models")

BLOCK = 32
CASES = [(arch, bits) for arch in ARCHS for bits in (16, 4)]
IDS = [f"{arch.name}-{bits}bit" for arch, bits in CASES]
# MNN 3.6.1's runtime keeps per-layer-embedding state across reset(): a second prompt in the same
# process decodes wrongly (the first, and Llm::forward step by step, agree with transformers).
MNN_PROMPT_PER_PROCESS = {"gemma4", "gemma4_vl", "gemma4_kv_shared"}


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """(arch name, bits) -> (exported config.json, transformers' tokens for that export); built lazily."""
    root = tmp_path_factory.mktemp("arch")
    cache: dict = {}

    def get(arch: Arch, bits: int) -> tuple[Path, list[list[int]]]:
        if (arch.name, bits) not in cache:
            src = root / arch.name / "hf"
            if arch.name not in cache:
                cache[arch.name] = build(arch, src)
            model = copy.deepcopy(cache[arch.name])
            if bits != 16:
                dequantize_into(model, bits, BLOCK, arch.unquantized, arch.in_out)
            dst = root / arch.name / f"q{bits}"
            export_cli(src, dst, bits)
            cache[(arch.name, bits)] = dst / "config.json", greedy(model)
        return cache[(arch.name, bits)]

    return get


def export_cli(src: Path, dst: Path, bits: int) -> dict:
    done = subprocess.run([sys.executable, "-m", "mnnllm_core.cli", "export", str(src), str(dst), "--quant-bit",
                           str(bits), "--quant-block", str(BLOCK), "--json"], capture_output=True, text=True,
                          timeout=300, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.oracle
@pytest.mark.parametrize("arch,bits", CASES + [(arch, 16) for arch in COMPOSITES],
                         ids=IDS + [f"{arch.name}-16bit" for arch in COMPOSITES])
def test_mnn_runtime_on_our_export_gives_the_transformers_tokens(exports, arch, bits):
    """Composite (vision-language) checkpoints too: the export is their language model."""
    config, expected = exports(arch, bits)
    assert any(len(t) > 3 for t in expected)
    if arch.name in MNN_PROMPT_PER_PROCESS:
        got = [mnn_generate(config, [prompt], NEW_TOKENS)[0] for prompt in PROMPTS]
    else:
        got = mnn_generate(config, PROMPTS, NEW_TOKENS)
    assert [until_stop(t) for t in got] == expected


@pytest.mark.parametrize("arch,bits", CASES, ids=IDS)
def test_our_engine_on_our_export_gives_the_transformers_tokens(exports, arch, bits):
    config, expected = exports(arch, bits)
    got = engine_generate(config, PROMPTS, NEW_TOKENS)
    assert [until_stop(t) for t in got] == expected


@pytest.mark.parametrize("name", ["gpt_oss", "gemma4_moe"])
def test_our_engine_with_memory_low_runs_sinks_and_expert_programs_to_the_transformers_tokens(exports, name):
    """memory "low": packed int4 kernels; gpt-oss's sinks in every Attention, both experts' programs."""
    config, expected = exports(next(a for a in ARCHS if a.name == name), 4)
    got = engine_generate(config, PROMPTS, NEW_TOKENS, memory="low")
    assert [until_stop(t) for t in got] == expected


def test_fused_qwen3_5_moe_experts_export_the_same_bytes_as_per_expert_ones(tmp_path):
    """transformers 5 holds the experts fused ([E, 2I, H] gate_up, [E, H, I] down); save_pretrained writes
    them per expert. Both layouts of one checkpoint give the same llm.mnn.weight."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    from mnnllm_core.export.exporter import write_model

    arch = next(a for a in ARCHS if a.name == "qwen3_5_moe")
    per_expert = tmp_path / "per_expert"
    build(arch, per_expert)
    fused = tmp_path / "fused"
    fused.mkdir()
    for f in per_expert.iterdir():
        if f.suffix != ".safetensors":
            (fused / f.name).write_bytes(f.read_bytes())
    tensors = load_file(per_expert / "model.safetensors")
    experts = arch.config["num_experts"]
    for layer in range(3):
        base = f"model.layers.{layer}.mlp.experts"
        parts = [[tensors.pop(f"{base}.{e}.{p}_proj.weight") for e in range(experts)] for p in ("gate", "up", "down")]
        tensors[f"{base}.gate_up_proj"] = np.stack([np.concatenate([g, u]) for g, u in zip(parts[0], parts[1])])
        tensors[f"{base}.down_proj"] = np.stack(parts[2])
    save_file(tensors, str(fused / "model.safetensors"))
    for src in (per_expert, fused):
        (tmp_path / f"{src.name}-out").mkdir()
        write_model(str(src), tmp_path / f"{src.name}-out", quant_bit=4, quant_block=BLOCK)
    assert ((tmp_path / "fused-out" / "llm.mnn.weight").read_bytes() ==
            (tmp_path / "per_expert-out" / "llm.mnn.weight").read_bytes())
