"""Qwen3.5 (gated delta-net linear attention + gated full attention, M-RoPE) and its MoE variant,
as MNN 3.6.1's exporter wrote them (../shared/models/arch3), run by our engine: greedy, 24
tokens, the three reference prompts' `mnn_prompt_ids`, each equal to the list reference.json names,
on cpu with memory "normal" and "low", and on opencl/vulkan with LinearAttention handed to cpu
(the reason in the placement summary). The recurrent state follows the KV cache: a prompt that
keeps the cached system prompt, a cut-back into a step (rejected drafts), the prefix cache on disk,
and a prefill in pieces or token by token give what a fresh whole prefill gives. The kernel itself
is checked against transformers' Qwen3.5 code here and against float64 in the conformance cases.

The configs ship `is_visual: true` and a Qwen3-VL-style `visual.mnn`, so "as shipped" they load as
Omni with its vision encoder; the text prompts never reach the encoder, so the checks also run with
`is_visual: false` (a plain Llm, which keeps the prefix cache on disk that Omni turns off).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import sys

import numpy as np
import pytest

from mnnllm_backends.cpu.ops.gated_delta_rule import DeltaRuleHistory, GatedDeltaRuleExecution
from mnnllm_core.core import op_params
from mnnllm_core.core.op_params import LinearAttentionParams
from mnnllm_core.errors import UnsupportedError
from mnnllm_core.llm.config import LlmConfig
from mnnllm_core.llm.create import create
from mnnllm_core.llm.llm import Llm
from mnnllm_core.plugins.manager import registry
from mnnllm_core.testing.cases.linear_attention import gated_delta_rule_op
from mnnllm_core.testing.harness import Const, new_runtime, run_op
from paths import SHARED

ARCH3 = SHARED / "models" / "arch3"
REFERENCE = json.loads((ARCH3 / "reference.json").read_text()) if (ARCH3 / "reference.json").exists() else {}
FOLDERS = ["tiny-qwen3_5-mnn-fp16", "tiny-qwen3_5-mnn-q4", "tiny-qwen3_5_moe-mnn-q4"]
NEW_TOKENS = 24
TEXT_ONLY = {"is_visual": False}
CONFIGS = [pytest.param({}, id="as-shipped"), pytest.param(TEXT_ONLY, id="text-only")]

pytestmark = pytest.mark.skipif(not all(f in REFERENCE for f in FOLDERS), reason=f"arch3 models missing at {ARCH3}")


def load(folder: str, backend: str = "cpu", memory: str = "normal", overrides: dict | None = None):
    llm = create(str(ARCH3 / folder / "config.json"))
    llm.set_config({"backend_type": backend, "memory": memory, "sampler_type": "greedy", "thread_num": 2,
                    **(overrides or {})})
    llm.load()
    return llm


def generate(llm, folder: str, reset: bool = True) -> list[list[int]]:
    """Greedy tokens for the folder's prompts; without `reset` each prompt keeps the cached
    system-prompt prefix and the rest of the history is cut back."""
    out = []
    for prompt in REFERENCE[folder]["prompts"]:
        if reset:
            llm.reset()
        out.append(list(llm.generate(prompt["mnn_prompt_ids"], NEW_TOKENS)))
    return out


def expected(folder: str) -> list[list[int]]:
    entry = REFERENCE[folder]
    return [p[entry["reference"]] for p in entry["prompts"]]


@pytest.mark.parametrize("overrides", CONFIGS)
@pytest.mark.parametrize("memory", ["normal", "low"])
@pytest.mark.parametrize("folder", FOLDERS)
def test_cpu_reproduces_the_reference_tokens(folder, memory, overrides) -> None:
    assert generate(load(folder, memory=memory, overrides=overrides), folder) == expected(folder)


@pytest.mark.parametrize("interval", [DeltaRuleHistory.checkpoint_interval, 8])
@pytest.mark.parametrize("folder", ["tiny-qwen3_5-mnn-fp16", "tiny-qwen3_5_moe-mnn-q4"])
def test_a_prompt_reusing_the_cached_prefix_gives_the_tokens_of_a_fresh_start(folder, interval, monkeypatch) -> None:
    """The second and third prompts keep the system prompt's cache; the recurrent state is
    rebuilt from the last checkpoint at or before the cut (from zeros with the default interval,
    from a checkpoint inside the system prompt with 8)."""
    monkeypatch.setattr(DeltaRuleHistory, "checkpoint_interval", interval)
    llm = load(folder, overrides=TEXT_ONLY)
    assert generate(llm, folder, reset=False) == expected(folder)


def test_a_cut_back_replays_from_the_last_checkpoint_or_step_start_before_it(monkeypatch) -> None:
    """With a checkpoint every 8 tokens: cutting a 30-token prefill back to 21 tokens replays
    from token 16; cutting back into a step of 6 tokens (rejected drafts) replays from that
    step's start. The logits equal a fresh prefill's (within fp32 rounding)."""
    monkeypatch.setattr(DeltaRuleHistory, "checkpoint_interval", 8)
    folder = "tiny-qwen3_5-mnn-fp16"
    ids = REFERENCE[folder]["prompts"][0]["mnn_prompt_ids"]
    llm = load(folder, overrides=TEXT_ONLY)
    histories = list({id(h): h for h in _histories(llm)}.values())
    assert len(histories) == 3

    def replays(prefix: list[int]) -> tuple[list[int], np.ndarray]:
        """Keep all but the last token of `prefix` cached and run it: where each layer's replay began."""
        starts = []
        rewind = DeltaRuleHistory.rewind
        monkeypatch.setattr(DeltaRuleHistory, "rewind", lambda h, past, shape: starts.append(rewind(h, past, shape))
                            or starts[-1])
        llm.context.history_tokens[len(prefix) - 1:] = []
        logits = llm.forward(prefix[-1:])
        monkeypatch.setattr(DeltaRuleHistory, "rewind", rewind)
        return starts, logits

    llm.forward(ids[:30])
    assert [sorted(h.checkpoints) for h in histories] == [[0, 8, 16, 24]] * 3
    starts, cut = replays(ids[:22])
    assert starts == [16] * 3 and [sorted(h.checkpoints) for h in histories] == [[0, 8, 16]] * 3
    llm.forward(ids[22:28])
    starts, drafted = replays(ids[:24])
    assert starts == [22] * 3 and [h.folded for h in histories] == [24] * 3

    fresh = load(folder, overrides=TEXT_ONLY)
    for prefix, logits in ((ids[:22], cut), (ids[:24], drafted)):
        fresh.reset()
        want = fresh.forward(prefix)
        assert np.abs(logits - want).max() <= 1e-4 * float(np.abs(want).max())


def _executions(llm) -> list[GatedDeltaRuleExecution]:
    executions = llm.module.static_module.session.pipeline.executions.values()
    return [e for _, e in executions if isinstance(e, GatedDeltaRuleExecution)]


def _histories(llm) -> list[DeltaRuleHistory]:
    return [e.history for e in _executions(llm)]


@pytest.mark.parametrize("folder", ["tiny-qwen3_5-mnn-fp16", "tiny-qwen3_5_moe-mnn-q4"])
def test_a_prefill_in_pieces_or_token_by_token_equals_one_prefill(folder) -> None:
    """Logits of every prompt token: one forward, pieces of 5, 1 and the rest, and one token at a
    time agree within fp32 rounding (1e-4 of the largest logit: the full-attention layer and the
    linears sum in another order for other row counts)."""
    llm = load(folder, overrides=TEXT_ONLY)
    ids = REFERENCE[folder]["prompts"][1]["mnn_prompt_ids"]
    whole = llm.forward(ids, all_logits=True)
    runs = {}
    for name, cuts in (("pieces", [0, 5, 6, len(ids)]), ("token by token", range(len(ids) + 1))):
        llm.reset()
        runs[name] = np.concatenate([llm.forward(ids[a:b], all_logits=True) for a, b in zip(cuts, cuts[1:])])
    bound = 1e-4 * max(1.0, float(np.abs(whole).max()))
    for name, logits in runs.items():
        assert np.abs(logits - whole).max() <= bound, name


DEVICE_CASES = [("opencl", "tiny-qwen3_5-mnn-fp16"), ("opencl", "tiny-qwen3_5_moe-mnn-q4"),
                ("vulkan", "tiny-qwen3_5-mnn-q4"), ("vulkan", "tiny-qwen3_5_moe-mnn-q4")]


@pytest.mark.parametrize("overrides", CONFIGS)
@pytest.mark.parametrize("backend,folder", DEVICE_CASES, ids=[f"{b}-{f}" for b, f in DEVICE_CASES])
def test_a_device_backend_hands_linear_attention_to_cpu_and_keeps_the_tokens(backend, folder, overrides) -> None:
    available, reason = registry().get(backend).is_available()
    if not available:
        pytest.skip(f"{backend} unavailable: {reason}")
    llm = load(folder, backend, overrides=overrides)
    assert generate(llm, folder) == expected(folder)
    placement = llm.placement()
    assert placement["ops_per_backend"].get(backend, 0) > 0
    handed = [f for f in placement["fallbacks"] if f["type"] == "LinearAttention"]
    assert len(handed) == 3 and all(f["to"] == "cpu" and f["reason"] for f in handed)


@pytest.mark.parametrize("change,why", [({"num_k_heads": 3}, "num_v_heads 4 is not a multiple of num_k_heads 3"),
                                        ({"attn_type": "chunked_delta"}, "attn_type 'chunked_delta'"),
                                        ({"head_v_dim": 0}, "must be positive")])
def test_a_linear_attention_param_the_kernel_cannot_take_is_refused_at_load(change, why, monkeypatch) -> None:
    """cpu refuses the op (there is no backend left to fall back to): an UnsupportedError naming
    the op and the reason, before any token runs."""
    decode = op_params.DECODERS["LinearAttention"]
    monkeypatch.setitem(op_params.DECODERS, "LinearAttention", lambda op: dataclasses.replace(decode(op), **change))
    with pytest.raises(UnsupportedError, match="FusedLinearAttention") as err:
        load("tiny-qwen3_5-mnn-q4", overrides=TEXT_ONLY)
    assert why in str(err.value)


def test_the_prefix_cache_on_disk_restores_the_recurrence_from_its_inputs(tmp_path, caplog) -> None:
    """The history saves each token's recurrence inputs; a second engine restores them (its
    attention caches too) and replays the recurrence from zeros: the tokens of a fresh start.
    (Omni turns the prefix cache off, so this runs the text model as an Llm.)"""
    folder = "tiny-qwen3_5-mnn-q4"
    ids = REFERENCE[folder]["prompts"][0]["mnn_prompt_ids"]

    def text_llm() -> Llm:
        llm = Llm(LlmConfig.from_file(ARCH3 / folder / "config.json"))
        llm.set_config({"memory": "normal", "thread_num": 2, "sampler_type": "greedy",
                        "prefix_cache_path": str(tmp_path), **TEXT_ONLY})
        return llm.load()

    assert text_llm().generate(ids, NEW_TOKENS) == expected(folder)[0]
    with caplog.at_level(logging.INFO, "mnnllm_core.llm.prefix_cache"):
        assert text_llm().generate(ids, NEW_TOKENS) == expected(folder)[0]
    assert f"{len(ids) - 1} of {len(ids)} prompt tokens from" in caplog.text


def test_a_history_of_odd_width_snapshots_and_restores_row_for_row() -> None:
    rows = np.arange(3 * 7, dtype=np.float32).reshape(3, 7)
    saved = DeltaRuleHistory(7)
    saved.add(rows)
    keys, values = saved.snapshot()
    assert keys.shape == values.shape == (3, 4)
    restored = DeltaRuleHistory(7)
    restored.restore(keys, values)
    assert restored.length == 3 and np.array_equal(restored.rows[:3], rows)


def test_the_kernel_matches_transformers_chunked_gated_delta_net() -> None:
    """Our per-token recurrence against transformers' Qwen3.5 path for a prefill (causal conv1d +
    SiLU, then torch_chunk_gated_delta_rule: the chunked algorithm, 64 tokens a chunk), on 70
    tokens of random projections, k heads 2 serving v heads 4: within 2e-5 of the largest output."""
    torch = pytest.importorskip("torch")
    hf = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    hk, hv, dk, dv, taps, tokens = 2, 4, 16, 8, 4, 70
    channels = 2 * hk * dk + hv * dv
    rng = np.random.default_rng(7)
    qkv = rng.standard_normal((tokens, channels)).astype(np.float32)
    weight = (0.5 * rng.standard_normal((channels, 1, taps))).astype(np.float32)
    a, b = rng.standard_normal((2, tokens, hv)).astype(np.float32)
    g = (-np.exp(0.1 * rng.standard_normal(hv)) * np.log1p(np.exp(a))).astype(np.float32)
    beta = (1 / (1 + np.exp(-b))).astype(np.float32)

    conv = torch.nn.functional.conv1d(torch.from_numpy(qkv.T[None]), torch.from_numpy(weight), padding=taps - 1,
                                      groups=channels)[..., :tokens]
    x = torch.nn.functional.silu(conv).transpose(1, 2)
    q, k, v = torch.split(x, [hk * dk, hk * dk, hv * dv], dim=-1)
    want, _ = hf.torch_chunk_gated_delta_rule(q.reshape(1, tokens, hk, dk), k.reshape(1, tokens, hk, dk),
                                              v.reshape(1, tokens, hv, dv), g=torch.from_numpy(g[None]),
                                              beta=torch.from_numpy(beta[None]), use_qk_l2norm_in_kernel=True)
    op = gated_delta_rule_op(LinearAttentionParams("gated_delta_rule", hk, hv, dk, dv, True))
    got = run_op(op, [qkv.reshape(tokens, channels, 1, 1), g.reshape(tokens, hv, 1, 1), beta.reshape(tokens, hv, 1, 1),
                      Const(weight)], runtime=new_runtime()).outputs[0]
    want = want.numpy().reshape(tokens, hv * dv)
    assert np.abs(got.reshape(tokens, -1) - want).max() <= 2e-5 * max(1.0, float(np.abs(want).max()))


def test_memory_low_runs_the_recurrence_on_kernels_loaded_at_load() -> None:
    """memory "low" takes the numba scan (heads in parallel for a long prefill, one thread for a
    decode step), compiled or loaded at load: no forward compiles more."""
    from numba.core.registry import CPUDispatcher

    def overloads() -> dict[str, int]:
        return {f"{name}.{key}": len(value.overloads) for name, module in list(sys.modules.items())
                if name.startswith("mnnllm_backends.cpu.kernels") for key, value in vars(module).items()
                if isinstance(value, CPUDispatcher)}

    llm = load("tiny-qwen3_5-mnn-q4", memory="low", overrides=TEXT_ONLY)
    assert all(e.scan.__module__.endswith("kernels.delta_rule") for e in _executions(llm))
    before = overloads()
    assert before.get("mnnllm_backends.cpu.kernels.delta_rule._scan_parallel")
    llm.forward(list(range(100, 200)))
    llm.forward([5])
    assert overloads() == before
