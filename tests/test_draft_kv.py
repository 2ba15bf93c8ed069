"""Eagle and MTP drafts with their own Attention and KV cache (a real export's decoder layer): they
load on a KV meta of their own, greedy decoding with them (chains and token trees) gives exactly
the greedy tokens, and after any number of steps the draft's cache holds exactly the rows of the
kept history (its next step equals one over all of them at once, from an empty cache)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import mnnllm_core
from mnnllm_core.export.draft import fit_drafts, random_attention, random_eagle, random_mtp, write_eagle, write_mtp
from mnnllm_core.llm.generation import EagleGeneration, MtpGeneration, speculative
from mnnllm_core.llm.generation.draft_kv import DraftKV
from mnnllm_core.plugins.manager import registry
from paths import MODEL_DIR, REFERENCE, SHARED
from slow_verify import SlowVerify

PROMPTS = json.loads(REFERENCE.read_text())["prompts"]
SECOND = "tiny-qwen3_moe-mnn-fp16"
N = 24
DRAFT_ATOL = 1e-4  # the draft's fp32 logits for the same rows, one step against many (summation order)
RANDOM = {"eagle_model": "random/eagle.mnn", "eagle_fc": "random/eagle_fc.mnn", "eagle_d2t": "random/eagle_d2t.mnn"}
FITTED = {"eagle_model": "eagle.mnn", "eagle_fc": "eagle_fc.mnn", "eagle_d2t": "eagle_d2t.mnn"}


def linked(folder: Path, source: Path) -> Path:
    folder.mkdir()
    for name in os.listdir(source):
        os.symlink(source / name, folder / name)
    return folder / "config.json"


def model(config: Path, **settings):
    llm = mnnllm_core.create(config)
    # drafting every step (MNN's way): acceptance is asserted (the draft budget: test_draft_budget.py)
    llm.set_config({"sampler_type": "greedy", "thread_num": 2, "hidden_states": True, "draft_adaptive": False,
                    **settings})
    return llm.load()


def write_drafts(config: Path, llm, sequences, hidden: int, heads: int, kv_heads: int, head_dim: int,
                 draft_vocab: int) -> None:
    """random/ and mtp_random.mnn: random weights throughout; eagle*.mnn and mtp.mnn beside the
    model: fitted to the model's hidden states, with a random attention layer added at a small gain."""
    vocab = llm.embedding.vocab
    eagle = random_eagle(hidden, vocab, draft_vocab, seed=2)
    eagle.attention = random_attention(hidden, heads, kv_heads, head_dim, seed=3)
    (config.parent / "random").mkdir()
    write_eagle(config.parent / "random", eagle)
    mtp = random_mtp(hidden, vocab, 2, seed=1)
    mtp.attention = random_attention(2 * hidden, heads, kv_heads, head_dim, seed=4)
    write_mtp(config.parent, mtp, name="mtp_random.mnn")
    mtp, eagle = fit_drafts(llm, sequences, heads=2, draft_vocab=draft_vocab, ridge=1e-2)
    eagle.attention = random_attention(hidden, heads, kv_heads, head_dim, seed=5, gain=0.1)
    mtp.attention = random_attention(2 * hidden, heads, kv_heads, head_dim, seed=6, gain=0.1)
    write_eagle(config.parent, eagle)
    write_mtp(config.parent, mtp)


@pytest.fixture(scope="module")
def drafted(tmp_path_factory):
    config = linked(tmp_path_factory.mktemp("draftkv") / "m", MODEL_DIR)
    llm = model(config)
    write_drafts(config, llm, [p["prompt_ids"] + p["mnn_cpp_q4_memory_normal"]["gen_ids"] for p in PROMPTS],
                 576, 4, 2, 64, 2048)
    return config


def recorded_generate(llm, ids: list[int], n: int) -> tuple[list[int], list[tuple]]:
    """generate, recording every catch-up of the draft: (its first position, tokens, draft
    inputs, the first output's last rows: the last kept row's logits)."""
    kv: DraftKV = llm.generation.kv
    take_in, calls = kv.take_in, []

    def spy(tokens, hidden):
        first = kv.next
        out = take_in(tokens, hidden)
        calls.append((first, list(tokens), hidden.copy(), out[0][-last_rows(llm):].copy()))
        return out
    kv.take_in = spy
    try:
        llm.reset()
        return llm.generate(ids, n), calls
    finally:
        del kv.take_in


def last_rows(llm) -> int:
    """Output rows of the last kept row: an MTP module's heads (it guesses from the last row only), or 1."""
    strategy = llm.generation
    return 2 if isinstance(strategy, MtpGeneration) else 1


@pytest.mark.slow
def test_an_attending_eagle_step_loads_with_a_kv_meta_of_its_own(drafted) -> None:
    llm = model(drafted, speculative_type="eagle", **RANDOM)
    strategy = llm.generation
    assert isinstance(strategy, EagleGeneration) and strategy.kv is not None
    assert strategy.eagle.step.attends and strategy.kv.meta is not llm.kv_meta
    llm.reset()
    llm.generate(PROMPTS[0]["prompt_ids"], 8)
    assert llm.kv_meta.previous == len(llm.context.history_tokens)
    assert 0 < strategy.kv.meta.previous < llm.kv_meta.previous


@pytest.mark.slow
@pytest.mark.parametrize("draft", ["fitted", "random"])
@pytest.mark.parametrize("topk,depth,nodes", [(1, 3, 3), (2, 3, 6), (4, 4, 10)])
def test_greedy_eagle_with_an_attending_draft_gives_exactly_mnns_tokens(drafted, draft, topk, depth, nodes) -> None:
    llm = model(drafted, speculative_type="eagle", eagle_topk=topk, eagle_depth=depth, draft_predict_length=nodes,
                **(FITTED if draft == "fitted" else RANDOM))
    strategy = llm.generation
    assert strategy.kv is not None and strategy.tree == (topk > 1)
    for prompt in PROMPTS:
        llm.reset()
        assert llm.generate(prompt["prompt_ids"], N) == prompt["mnn_cpp_q4_memory_normal"]["gen_ids"][:N]
    assert strategy.verify_steps
    if draft == "fitted":
        assert strategy.accepted / strategy.verify_steps > 1.0
    else:
        assert strategy.accepted < strategy.proposed / 4


def available(name: str) -> bool:
    return registry().get(name).is_available()[0]


@pytest.mark.slow
@pytest.mark.parametrize("draft", ["fitted", "random"])
def test_greedy_mtp_with_an_attending_module_gives_exactly_mnns_tokens(drafted, draft) -> None:
    llm = model(drafted, speculative_type="mtp", mtp_model="mtp.mnn" if draft == "fitted" else "mtp_random.mnn")
    strategy = llm.generation
    assert isinstance(strategy, MtpGeneration) and strategy.kv is not None
    assert strategy.kv.meta is not llm.kv_meta
    for prompt in PROMPTS:
        llm.reset()
        assert llm.generate(prompt["prompt_ids"], N) == prompt["mnn_cpp_q4_memory_normal"]["gen_ids"][:N]
    if draft == "fitted":
        assert strategy.accepted / strategy.verify_steps > 1.0
    else:
        assert strategy.accepted < strategy.proposed / 4


@pytest.mark.slow
@pytest.mark.parametrize("settings", [
    pytest.param({"speculative_type": "mtp", "mtp_model": "mtp_random.mnn"}, id="cpu-mtp"),
    pytest.param({"eagle_topk": 1}, id="cpu-chain"), pytest.param({"eagle_topk": 3}, id="cpu-tree"),
    pytest.param({"eagle_topk": 3, "backend_type": "opencl"}, id="opencl-tree",
                 marks=pytest.mark.skipif(not available("opencl"), reason="OpenCL unavailable")),
    pytest.param({"eagle_topk": 3, "backend_type": "vulkan"}, id="vulkan-tree",
                 marks=pytest.mark.skipif(not available("vulkan"), reason="Vulkan unavailable"))])
def test_the_drafts_cache_holds_exactly_the_rows_of_the_kept_history(drafted, settings) -> None:
    """Every catch-up continues where the last one ended, and the last one's logits equal the
    draft's step over all the rows taken in so far, run at once from an empty cache (so the
    rows each drafting grew are gone, and no kept row is missing or out of place)."""
    llm = model(drafted, **{"speculative_type": "eagle", "eagle_depth": 3, "draft_predict_length": 8, **RANDOM,
                            **settings})
    prompt = PROMPTS[2]
    out, calls = recorded_generate(llm, prompt["prompt_ids"], 20)
    assert out == prompt["mnn_cpp_q4_memory_normal"]["gen_ids"][:20] and len(calls) > 3
    for (first, tokens, _, _), (following, _, _, _) in zip(calls, calls[1:]):
        assert following == first + len(tokens)
    kv = llm.generation.kv
    assert kv.meta.previous - kv.drop == calls[-1][0] + len(calls[-1][1]) - calls[0][0]
    kv.next, kv.drop = calls[0][0], kv.meta.previous  # empty, from the first row's position
    out = kv.take_in([t for c in calls for t in c[1]], np.concatenate([c[2] for c in calls]))
    np.testing.assert_allclose(out[0][-last_rows(llm):], calls[-1][3], rtol=0, atol=DRAFT_ATOL)


@pytest.mark.slow
def test_a_second_architecture_decodes_exactly_with_an_attending_draft(tmp_path) -> None:
    reference = json.loads((SHARED / "models" / "arch" / "reference.json").read_text())[SECOND]
    config = linked(tmp_path / "m", SHARED / "models" / "arch" / SECOND)
    hidden = json.loads((config.parent / "llm_config.json").read_text())["hidden_size"]
    llm = model(config, memory="normal")
    prompts = [p["prompt_ids"] for p in reference["prompts"]]
    want = [p[reference["reference"]][:N] for p in reference["prompts"]]
    write_drafts(config, llm, [ids + out for ids, out in zip(prompts, want)], hidden, 2, 1, 16, 256)
    settings = [{"speculative_type": "eagle", "eagle_topk": topk, "eagle_depth": 3, "draft_predict_length": 6,
                 **files} for files in (RANDOM, FITTED) for topk in (1, 3)]
    for setting in settings + [{"speculative_type": "mtp", "mtp_model": m} for m in ("mtp_random.mnn", "mtp.mnn")]:
        llm.set_config(setting)
        assert llm.generation.kv is not None
        for ids, expected in zip(prompts, want):
            llm.reset()
            assert llm.generate(ids, N) == expected, setting
    assert llm.generation.accepted > 0


@pytest.mark.slow
@pytest.mark.parametrize("setting", [{"speculative_type": "mtp", "mtp_model": "mtp.mnn"},
                                     {"speculative_type": "eagle", "eagle_topk": 1, **FITTED},
                                     {"speculative_type": "eagle", "eagle_topk": 3, "draft_predict_length": 6,
                                      **FITTED}])
def test_plain_steps_between_verify_steps_keep_the_drafts_cache_exact(drafted, setting, monkeypatch) -> None:
    """With the draft budget on and verify steps 'costing' 5 plain ones, most steps run plain: the
    draft catches up over the rows they kept, and the tokens stay MNN's (the budget carried from
    one reply to the next: each after the first starts plain and probes)."""
    monkeypatch.setattr(speculative, "DraftBudget", SlowVerify)
    llm = model(drafted, draft_adaptive=True, **setting)
    strategy = llm.generation
    for prompt in PROMPTS:
        llm.reset()
        assert llm.generate(prompt["prompt_ids"], N) == prompt["mnn_cpp_q4_memory_normal"]["gen_ids"][:N]
        assert strategy.budget.backoff > strategy.budget.first_pause  # drafting was judged not to pay
        assert llm.kv_meta.previous - llm.kv_meta.remove == len(llm.context.history_tokens)
        assert 0 < strategy.kv.meta.previous < llm.kv_meta.previous
