"""Eagle tree verification (MNN's eagle_topk token tree): the KV meta's reserve keeps the
accepted path's rows (not contiguous) and each cache moves exactly those (numpy references);
one forward over a token tree gives each node the logits of its own path run alone; a step
that keeps a tree's path leaves the cache as a fresh prefill of the history; greedy Eagle with
eagle_topk 2..4 gives exactly the greedy tokens (MNN's on the shared model, AR's on a tiny
Qwen3-MoE)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import mnnllm_core
from mnnllm_backends.cpu.ops.attention import AttentionExecution, HostKVCache
from mnnllm_backends.cpu.ops.linear_attention import ConvHistory
from mnnllm_core.backend_api import DeviceKVCache, KVMeta
from mnnllm_core.errors import KVStateError, UnsupportedError
from mnnllm_core.export.draft import fit_drafts, random_eagle, write_eagle
from mnnllm_core.llm.attention_mask import tree_allowed, tree_attention_mask, tree_depths
from mnnllm_core.llm.generation import EagleGeneration
from mnnllm_core.llm.generation.token_tree import DraftTree, TreeBuilder
from mnnllm_core.llm.prefix_cache import model_caches
from mnnllm_core.plugins.manager import registry
from paths import MODEL_DIR, REFERENCE, SHARED

PROMPTS = json.loads(REFERENCE.read_text())["prompts"]
SECOND = "tiny-qwen3_moe-mnn-fp16"
N = 24
RNG = np.random.default_rng(11)
LOGITS_ATOL = 5e-4  # fp32 logits (|logit| <= ~20) summed in another order: measured <= 5.5e-5 on cpu, vulkan; 0 opencl


# -- the KV meta ----------------------------------------------------------------------------

def test_keep_rows_makes_mnn_reserve_runs_and_sync_counts_them() -> None:
    meta = KVMeta(previous=10)
    meta.keep_rows(4, [4, 6, 7, 9])
    assert (meta.remove, meta.reserve, meta.kept) == (6, ((0, 1), (2, 2), (5, 1)), 8)
    meta.add = 2
    meta.sync()
    assert (meta.previous, meta.remove, meta.reserve, meta.add) == (10, 0, (), 0)


def test_cut_to_a_shorter_history_drops_reserved_rows_from_the_end() -> None:
    meta = KVMeta(previous=10)
    meta.keep_rows(4, [4, 6, 7, 9])
    meta.cut_to(7)
    assert meta.reserve == ((0, 1), (2, 2)) and meta.kept == 7
    meta.cut_to(3)
    assert meta.reserve == () and meta.kept == 3
    plain = KVMeta(previous=5)
    plain.cut_to(5)
    assert (plain.remove, plain.kept) == (0, 5)


def test_a_reserve_outside_the_removed_tail_is_a_kv_state_error() -> None:
    meta = KVMeta(previous=6, remove=2, reserve=((1, 2),))
    with pytest.raises(KVStateError) as err:
        meta.check_reserve()
    assert err.value.field == "reserve"


# -- the caches ---------------------------------------------------------------------------

def reserve_cases():
    """(cached, remove, reserve): runs apart, an overlapping move, a run kept in place."""
    return [(9, 6, ((1, 1), (3, 2), (5, 1))), (9, 6, ((2, 4),)), (8, 4, ((0, 2), (3, 1))), (300, 5, ((4, 1),))]


def expected_rows(rows: np.ndarray, remove: int, reserve) -> np.ndarray:
    start = len(rows) - remove
    keep = list(range(start)) + [start + b + i for b, size in reserve for i in range(size)]
    return rows[keep]


def run_step(cache, cached: int, remove: int, reserve) -> int:
    meta = KVMeta(previous=cached, remove=remove, reserve=reserve)
    return cache.begin_step(meta)


class HostBytes:
    """A device for DeviceKVCache in host memory that, like OpenCL, refuses a copy whose source
    and destination overlap in one buffer."""

    def alloc(self, nbytes: int) -> np.ndarray:
        return np.zeros(nbytes, np.uint8)

    def copy(self, dst, src, nbytes, dst_offset=0, src_offset=0) -> None:
        if dst is src and src_offset < dst_offset + nbytes and dst_offset < src_offset + nbytes:
            raise AssertionError(f"overlapping copy {src_offset} -> {dst_offset} of {nbytes} bytes")
        dst[dst_offset:dst_offset + nbytes] = src[src_offset:src_offset + nbytes]

    def read(self, buffer, nbytes: int) -> np.ndarray:
        return buffer[:nbytes].copy()

    def write(self, buffer, data: np.ndarray) -> None:
        buffer[:data.size] = data


@pytest.mark.parametrize("cached,remove,reserve", reserve_cases())
def test_the_device_cache_moves_the_reserved_rows_without_overlapping_copies(cached, remove, reserve) -> None:
    device = HostBytes()
    cache = DeviceKVCache(device.alloc, device.copy, read=device.read, write=device.write)
    keys = RNG.standard_normal((cached, 2, 4)).astype(np.float32)
    cache.restore(keys.view(np.uint8).reshape(cached, -1), (-keys).view(np.uint8).reshape(cached, -1))
    past = run_step(cache, cached, remove, reserve)
    got_k, got_v = (rows.view(np.float32).reshape(-1, 2, 4) for rows in cache.snapshot())
    want = expected_rows(keys, remove, reserve)
    assert past == len(want) == cache.length
    np.testing.assert_array_equal(got_k, want)
    np.testing.assert_array_equal(got_v, -want)


@pytest.mark.parametrize("transposed", [False, True], ids=["normal", "keys-transposed"])
@pytest.mark.parametrize("cached,remove,reserve", reserve_cases())
def test_the_cpu_cache_moves_the_reserved_rows(cached, remove, reserve, transposed) -> None:
    cache = HostKVCache(keys_transposed=transposed)
    keys = RNG.standard_normal((cached, 2, 16)).astype(np.float32)
    cache.restore(keys, keys * 2)
    assert run_step(cache, cached, remove, reserve) == cache.length
    got_k, got_v = cache.snapshot()
    want = expected_rows(keys, remove, reserve)
    np.testing.assert_array_equal(got_k, want)
    np.testing.assert_array_equal(got_v, want * 2)


def test_a_step_run_again_after_an_interrupt_does_not_move_twice() -> None:
    cache = HostKVCache()
    keys = RNG.standard_normal((8, 1, 4)).astype(np.float32)
    cache.restore(keys, keys)
    meta = KVMeta(previous=8, remove=4, reserve=((1, 1), (3, 1)))
    assert cache.begin_step(meta) == 6
    cache.add(keys[:1], keys[:1])  # the interrupted step appended a row, then the step runs again
    assert cache.begin_step(meta) == 6
    np.testing.assert_array_equal(cache.snapshot()[0], keys[[0, 1, 2, 3, 5, 7]])


def test_a_cache_that_cannot_move_rows_refuses_a_reserve() -> None:
    history = ConvHistory()
    history.add(np.ones((4, 3), np.float32))
    with pytest.raises(UnsupportedError) as err:
        run_step(history, 4, 2, ((1, 1),))
    assert err.value.field == "reserve" and "ConvHistory" in str(err.value)


# -- the tree and its mask -------------------------------------------------------------------

def test_the_tree_mask_lets_a_node_see_the_cache_its_ancestors_and_itself() -> None:
    parents = [-1, 0, 0, 1, 2, 4]
    allowed = tree_allowed(parents, 3)
    for node in range(len(parents)):
        ancestors, at = set(), node
        while at >= 0:
            ancestors.add(at)
            at = parents[at]
        assert allowed[node].tolist() == [True] * 3 + [j in ancestors for j in range(len(parents))]
    assert tree_depths(parents).tolist() == [0, 1, 1, 2, 2, 3]
    full = tree_attention_mask("full", 0, 3, parents)
    assert full.shape == (1, 1, 6, 6) and ((full[0, 0] == 0) == allowed[:, 3:]).all()
    window = tree_attention_mask("mix", 2, 3, parents)[1, 0, 0]  # node 5 (position 6) sees positions 5, 6
    assert (window[5] == 0).tolist() == [False] * 3 + [False, False, False, False, True, True]


def test_greedy_acceptance_follows_the_models_choice_down_the_tree() -> None:
    tree = DraftTree([7, 8, 9, 5, 6], [-1, -1, 0, 1, 1])  # rows: 0 pending, 1: 7, 2: 8, 3: 9, 4: 5, 5: 6
    predictions = np.array([8, 0, 6, 0, 0, 3])
    assert tree.accepted_rows(predictions) == [0, 2, 5]
    assert tree.accepted_rows(np.array([1, 0, 0, 0, 0, 0])) == [0]
    assert tree.forward_parents() == [-1, 0, 0, 1, 2, 2]


def test_the_builder_keeps_the_best_nodes_by_summed_log_probability() -> None:
    tree = TreeBuilder(2)
    tree.init([10, 20], np.log([0.7, 0.2]))
    rows = tree.grow([[11, 12], [21, 22]], np.log([[0.5, 0.3], [0.9, 0.05]]))
    assert rows == [0, 0] and [tree.tokens[n] for n in tree.actives] == [11, 12]  # .35, .21 beat .18
    draft = tree.finalize(4)  # .7, .35, .21, .2 in creation order
    assert draft.tokens == [10, 20, 11, 12] and draft.parents == [-1, -1, 0, 0]
    assert tree.best_path() == [10, 11]


# -- the model ------------------------------------------------------------------------------

def linked(folder: Path, source: Path) -> Path:
    folder.mkdir()
    for name in os.listdir(source):
        os.symlink(source / name, folder / name)
    return folder / "config.json"


def available(name: str) -> bool:
    return registry().get(name).is_available()[0]


def model(config: Path, **settings):
    llm = mnnllm_core.create(config)
    # drafting every step (MNN's way): acceptance is asserted (the draft budget: test_draft_budget.py)
    llm.set_config({"sampler_type": "greedy", "thread_num": 2, "hidden_states": True, "draft_adaptive": False,
                    **settings})
    return llm.load()


def fresh_logits(llm, ids: list[int]) -> np.ndarray:
    llm.reset()
    return llm.forward(ids)


BACKENDS = [pytest.param({"memory": "normal"}, id="cpu"), pytest.param({"memory": "low"}, id="cpu-low"),
            pytest.param({"backend_type": "opencl"}, id="opencl",
                         marks=pytest.mark.skipif(not available("opencl"), reason="OpenCL unavailable")),
            pytest.param({"backend_type": "vulkan"}, id="vulkan",
                         marks=pytest.mark.skipif(not available("vulkan"), reason="Vulkan unavailable"))]


def tree_step(llm):
    """After the prompt of PROMPTS[1], verify a tree whose right answer lies on second branches
    and keep its accepted rows 0 (pending), 2 and 4 (not rows 1 and 3: not contiguous)."""
    prompt = PROMPTS[1]["prompt_ids"]
    answer = PROMPTS[1]["mnn_cpp_q4_memory_normal"]["gen_ids"]
    wrong = [t for t in (198, 260, 1012, 30) if t not in answer[:4]]
    tree = DraftTree([wrong[0], answer[1], wrong[1], answer[2], wrong[2]], [-1, -1, 0, 1, 1])
    tokens, parents = [answer[0]] + tree.tokens, tree.forward_parents()
    llm.reset()
    llm.forward(prompt)
    rows = llm.forward(tokens, all_logits=True, parents=parents)
    kept = tree.accepted_rows(rows.argmax(axis=-1))
    assert kept == [0, 2, 4]
    llm.conversation.keep_rows(tokens, kept)
    return prompt, answer, tokens, parents, rows


@pytest.mark.slow
@pytest.mark.parametrize("settings", BACKENDS)
def test_a_tree_step_gives_each_node_its_paths_logits_and_keeps_the_accepted_rows(tmp_path, settings) -> None:
    """(The tree of tree_step.)"""
    llm = model(linked(tmp_path / "m", MODEL_DIR), **settings)
    prompt, answer, tokens, parents, rows = tree_step(llm)
    follow = llm.forward([int(rows[4].argmax())])
    assert int(rows[4].argmax()) == answer[3]
    assert llm.context.history_tokens == prompt + answer[:4]
    np.testing.assert_allclose(follow, fresh_logits(llm, prompt + answer[:4]), rtol=0, atol=LOGITS_ATOL)
    for row in range(len(tokens)):
        path, at = [], row
        while at >= 0:
            path.append(tokens[at])
            at = parents[at]
        np.testing.assert_allclose(rows[row], fresh_logits(llm, prompt + path[::-1]), rtol=0, atol=LOGITS_ATOL,
                                   err_msg=f"tree row {row}")


@pytest.mark.slow
def test_a_step_interrupted_after_some_layers_moved_their_rows_runs_again_right(tmp_path, monkeypatch) -> None:
    """Ctrl-C inside layer 10 of the step after a tree's: ten layers have moved the kept rows and
    appended, the rest not; the step run again moves nothing twice."""
    llm = model(linked(tmp_path / "m", MODEL_DIR))
    prompt, answer, _, _, rows = tree_step(llm)
    calls = [0]

    def interrupting(original):  # a replayed cpu step moves each layer's rows in before_run
        def interrupted(self, *args):
            result = original(self, *args)
            calls[0] += 1
            if calls[0] == 10:
                raise KeyboardInterrupt
            return result
        return interrupted
    with monkeypatch.context() as patch:
        for name in ("on_execute", "before_run"):
            patch.setattr(AttentionExecution, name, interrupting(getattr(AttentionExecution, name)))
        with pytest.raises(KeyboardInterrupt):
            llm.forward([answer[3]])
    follow = llm.forward([answer[3]])
    np.testing.assert_allclose(follow, fresh_logits(llm, prompt + answer[:4]), rtol=0, atol=LOGITS_ATOL)


@pytest.fixture(scope="module")
def drafted(tmp_path_factory):
    """The shared model beside a random Eagle draft (random/) and one fitted to its hidden states
    over the reference prompts and answers."""
    config = linked(tmp_path_factory.mktemp("tree") / "m", MODEL_DIR)
    (config.parent / "random").mkdir()
    write_eagle(config.parent / "random", random_eagle(576, 49152, 1024, seed=2))
    llm = model(config)
    sequences = [p["prompt_ids"] + p["mnn_cpp_q4_memory_normal"]["gen_ids"] for p in PROMPTS]
    write_eagle(config.parent, fit_drafts(llm, sequences, heads=3, draft_vocab=2048, ridge=1e-2)[1])
    llm.set_config({"speculative_type": "eagle"})
    return llm


RANDOM = {"eagle_model": "random/eagle.mnn", "eagle_fc": "random/eagle_fc.mnn", "eagle_d2t": "random/eagle_d2t.mnn"}
FITTED = {"eagle_model": "eagle.mnn", "eagle_fc": "eagle_fc.mnn", "eagle_d2t": "eagle_d2t.mnn"}


def tree_generate(llm, ids: list[int], n: int) -> list[int]:
    """generate, checking after every verify step that the history keeps exactly the pending
    token and the accepted path, and the KV meta keeps exactly as many rows."""
    strategy = llm.generation
    verified = strategy.verified

    def spy(tokens, accepted, rows):
        assert llm.kv_meta.kept == len(llm.context.history_tokens)
        assert llm.kv_meta.previous - llm.kv_meta.kept == len(tokens) - 1 - accepted
        verified(tokens, accepted, rows)
    strategy.verified = spy
    try:
        llm.reset()
        return llm.generate(ids, n)
    finally:
        del strategy.verified


@pytest.mark.slow
@pytest.mark.parametrize("draft", ["fitted", "random"])
@pytest.mark.parametrize("topk,depth,nodes", [(2, 2, 4), (2, 4, 8), (3, 3, 8), (4, 2, 8), (4, 4, 12)])
def test_greedy_eagle_over_a_token_tree_gives_exactly_mnns_tokens(drafted, draft, topk, depth, nodes) -> None:
    llm = drafted
    llm.set_config({"speculative_type": "eagle", "eagle_topk": topk, "eagle_depth": depth,
                    "draft_predict_length": nodes, **(FITTED if draft == "fitted" else RANDOM)})
    strategy = llm.generation
    assert isinstance(strategy, EagleGeneration) and strategy.tree
    for prompt in PROMPTS:
        assert tree_generate(llm, prompt["prompt_ids"], N) == prompt["mnn_cpp_q4_memory_normal"]["gen_ids"][:N]
    assert strategy.verify_steps and strategy.proposed > strategy.verify_steps  # trees, not chains
    if draft == "fitted":
        assert strategy.accepted / strategy.verify_steps > 1.0  # over a token per step accepted
    else:
        assert strategy.accepted < strategy.proposed / 4


@pytest.mark.slow
def test_eagle_topk_one_still_guesses_a_chain(drafted) -> None:
    llm = drafted
    llm.set_config({"speculative_type": "eagle", "eagle_topk": 1, "eagle_depth": 3, "draft_predict_length": 3,
                    **FITTED})
    assert not llm.generation.tree
    llm.reset()
    llm.forward(PROMPTS[2]["prompt_ids"])
    llm.generation.start([])
    assert isinstance(llm.generation.draft(PROMPTS[2]["mnn_cpp_q4_memory_normal"]["gen_ids"][0], 3), list)


@pytest.mark.slow
def test_a_second_architecture_verifies_token_trees_exactly(tmp_path) -> None:
    reference = json.loads((SHARED / "models" / "arch" / "reference.json").read_text())[SECOND]
    config = linked(tmp_path / "m", SHARED / "models" / "arch" / SECOND)
    hidden = json.loads((config.parent / "llm_config.json").read_text())["hidden_size"]
    (config.parent / "random").mkdir()
    write_eagle(config.parent / "random", random_eagle(hidden, 49152, 512, seed=4))
    llm = model(config, memory="normal")
    prompts = [p["prompt_ids"] for p in reference["prompts"]]
    want = [p[reference["reference"]][:N] for p in reference["prompts"]]
    write_eagle(config.parent, fit_drafts(llm, [ids + out for ids, out in zip(prompts, want)], heads=2,
                                          draft_vocab=256, ridge=1e-2)[1])
    assert all(cache.reservable for cache in model_caches(llm.module))
    for files in (RANDOM, FITTED):
        for topk, depth, nodes in ((2, 3, 6), (4, 4, 12)):
            llm.set_config({"speculative_type": "eagle", "eagle_topk": topk, "eagle_depth": depth,
                            "draft_predict_length": nodes, **files})
            assert llm.generation.tree
            for ids, expected in zip(prompts, want):
                assert tree_generate(llm, ids, N) == expected, (files, topk, depth)
    assert llm.generation.accepted > 0


@pytest.mark.slow
@pytest.mark.parametrize("name,tree", [("tiny-gemma2-mnn-fp16", True), ("tiny-gemma3_text-mnn-fp16", True),
                                       ("tiny-hunyuan-mnn-fp16", True), ("tiny-lfm2-mnn-fp16", False)])
def test_other_attention_kinds_verify_trees_as_ar_decodes(tmp_path, name, tree) -> None:
    """Gemma's "mix" attention (a sliding window of 16, passed within the 40 tokens: the tree's
    window plane counts positions), Hunyuan; LFM2's short convolution cannot keep a tree's path,
    so Eagle verifies its best path as a chain. Fitted drafts, so that paths are accepted."""
    arch = SHARED / "models" / "arch"
    prompts = [p["prompt_ids"] for p in json.loads((arch / "reference.json").read_text())[name]["prompts"]]
    config = linked(tmp_path / "m", arch / name)
    llm = model(config, memory="normal")
    ar = []
    for ids in prompts:
        llm.reset()
        ar.append(llm.generate(ids, 40))
    write_eagle(config.parent, fit_drafts(llm, [i + o for i, o in zip(prompts, ar)], heads=2, draft_vocab=256,
                                          ridge=1e-2)[1])
    llm.set_config({"speculative_type": "eagle", "eagle_topk": 3, "eagle_depth": 3, "draft_predict_length": 6})
    assert llm.generation.tree == tree
    for ids, expected in zip(prompts, ar):
        assert tree_generate(llm, ids, 40) == expected
    assert llm.generation.accepted > 10


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(PROMPTS)))
def test_a_conversation_goes_on_right_after_a_tree_verified_reply(drafted, index) -> None:
    """The last verify step's kept rows may still be pending (KV meta reserve), and a stop token or
    the budget may have cut the accepted path short: the next forward sees exactly the history."""
    llm = drafted
    llm.set_config({"speculative_type": "eagle", "eagle_topk": 3, "eagle_depth": 3, "draft_predict_length": 8,
                    **FITTED})
    prompt = PROMPTS[index]["prompt_ids"]
    out = tree_generate(llm, prompt, 9 + 4 * index)
    assert out == PROMPTS[index]["mnn_cpp_q4_memory_normal"]["gen_ids"][:len(out)]
    history = list(llm.context.history_tokens)
    assert history == prompt + out[:-1]  # the last token emitted has not run yet
    follow = llm.forward(out[-1:])
    np.testing.assert_allclose(follow, fresh_logits(llm, history + out[-1:]), rtol=0, atol=LOGITS_ATOL)
