"""Speculative decoding (MTP, Eagle, lookahead with MNN's keys): greedy output is AR's, token for
token, with random drafts (that guess badly) and fitted ones (that guess well); rejected guesses
leave the history and the KV cache; bad draft files and config values are typed errors."""
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import mnnllm_core
from mnnllm_core.errors import ConfigError, FormatError, UnsupportedError
from mnnllm_core.export.draft import fit_drafts, random_eagle, random_mtp, write_eagle, write_mtp
from mnnllm_core.llm.generation import EagleGeneration, LookaheadGeneration, MtpGeneration
from mnnllm_core.llm.generation.ngram import NgramCache, build_cache
from mnnllm_core.export.graph import GraphBuilder
from mnnllm_core.plugins.manager import registry
from mnnllm_core.schema.MNN.AttentionParam import AttentionParamT
from mnnllm_core.schema.MNN.DataType import DataType
from mnnllm_core.schema.MNN.OpParameter import OpParameter
from mnnllm_core.schema.MNN.OpType import OpType
from paths import MODEL_DIR, REFERENCE, SHARED

PROMPTS = json.loads(REFERENCE.read_text())["prompts"]
ARCH = SHARED / "models" / "arch"
SECOND = "tiny-qwen3_moe-mnn-fp16"
N = 24  # tokens compared per prompt
STRATEGIES = {"mtp": MtpGeneration, "eagle": EagleGeneration, "lookahead": LookaheadGeneration}


def linked(folder: Path, source: Path) -> Path:
    folder.mkdir()
    for name in os.listdir(source):
        os.symlink(source / name, folder / name)
    return folder / "config.json"


def expected(prompt, n=N):
    return prompt["mnn_cpp_q4_memory_normal"]["gen_ids"][:n]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The shared model beside random drafts (mtp_random.mnn, random/eagle*) and drafts fitted to
    its hidden states over the reference prompts and answers (mtp.mnn, eagle*.mnn)."""
    root = tmp_path_factory.mktemp("spec")
    config = linked(root / "model", MODEL_DIR)
    model = config.parent
    write_mtp(model, random_mtp(576, 49152, 3, seed=1), name="mtp_random.mnn")
    (model / "random").mkdir()
    write_eagle(model / "random", random_eagle(576, 49152, 1024, seed=2))
    llm = mnnllm_core.create(config)
    llm.set_config({"sampler_type": "greedy", "thread_num": 2, "hidden_states": True})
    llm.load()
    sequences = [p["prompt_ids"] + p["mnn_cpp_q4_memory_normal"]["gen_ids"] for p in PROMPTS]
    mtp, eagle = fit_drafts(llm, sequences, heads=3, draft_vocab=2048, ridge=1e-2)
    write_mtp(model, mtp)
    write_eagle(model, eagle)
    return model


RANDOM = {"mtp": {"mtp_model": "mtp_random.mnn"},
          "eagle": {"eagle_model": "random/eagle.mnn", "eagle_fc": "random/eagle_fc.mnn",
                    "eagle_d2t": "random/eagle_d2t.mnn"}}


@pytest.fixture(scope="module")
def engines(folder):
    made = {}

    def get(kind, **extra):
        if kind not in made:
            llm = mnnllm_core.create(folder / "config.json")
            llm.set_config({"sampler_type": "greedy", "thread_num": 2, "speculative_type": kind,
                            "draft_adaptive": False})  # every step drafts (MNN's way): acceptance is asserted
            made[kind] = llm.load()
        llm = made[kind]
        llm.set_config({"speculative_type": kind, **extra})
        return llm
    return get


def checked_generate(llm, ids, n):
    """generate, checking after every verify step that the history drops exactly the rejected
    guesses and the KV meta marks exactly their rows for removal."""
    steps = []
    strategy = llm.generation
    verified = strategy.verified

    def spy(tokens, accepted, rows):
        meta, history = llm.kv_meta, llm.context.history_tokens
        assert meta.kept == len(history)
        steps.append((meta.previous - meta.kept, len(tokens) - 1 - accepted))
        verified(tokens, accepted, rows)
    strategy.verified = spy
    try:
        out = llm.generate(ids, n)
    finally:
        del strategy.verified
    for cached_beyond, rejected in steps:
        assert cached_beyond == rejected
    return out, steps


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["mtp", "eagle"])
@pytest.mark.parametrize("draft", ["fitted", "random"])
def test_greedy_with_a_draft_gives_exactly_the_greedy_tokens(engines, kind, draft):
    llm = engines(kind, **(RANDOM[kind] if draft == "random" else
                           {"mtp_model": "mtp.mnn", "eagle_model": "eagle.mnn", "eagle_fc": "eagle_fc.mnn",
                            "eagle_d2t": "eagle_d2t.mnn"}))
    assert isinstance(llm.generation, STRATEGIES[kind])
    before = (llm.generation.proposed, llm.generation.accepted)
    for prompt in PROMPTS:
        llm.reset()
        out, steps = checked_generate(llm, prompt["prompt_ids"], N)
        assert out == expected(prompt)
        assert steps, "speculative steps ran"
        assert llm.kv_meta.kept == len(llm.context.history_tokens)
    proposed, accepted = llm.generation.proposed - before[0], llm.generation.accepted - before[1]
    assert proposed > 0
    if draft == "fitted":  # fitted to these very answers: most guesses hold
        assert accepted / proposed > 0.3, (accepted, proposed)
    else:
        assert accepted / proposed < 0.3, (accepted, proposed)


@pytest.mark.slow
def test_eagle_topk_verifies_a_token_tree_and_stays_exact(engines):
    """(Trees of every size: test_tree_verify.py.)"""
    llm = engines("eagle", eagle_topk=3, eagle_depth=4, draft_predict_length=4)
    try:
        llm.reset()
        assert llm.generate(PROMPTS[2]["prompt_ids"], N) == expected(PROMPTS[2])
        assert llm.generation.topk == 3 and llm.generation.depth == 4 and llm.generation.tree
    finally:
        llm.set_config({"eagle_topk": 1, "eagle_depth": 3, "draft_predict_length": 3})


@pytest.mark.slow
def test_the_kv_cache_after_speculative_steps_is_the_history(engines):
    llm = engines("mtp", mtp_model="mtp.mnn")
    llm.reset()
    out = llm.generate(PROMPTS[1]["prompt_ids"], 20)
    follow = llm.forward([out[-1]])
    assert llm.kv_meta.previous == len(llm.context.history_tokens)
    llm.reset()
    fresh = llm.forward(PROMPTS[1]["prompt_ids"] + out)
    np.testing.assert_allclose(follow, fresh, rtol=0, atol=5e-3)


@pytest.mark.slow
@pytest.mark.parametrize("settings", [{"draft_selection_rule": "fcfs"}, {"draft_match_strictness": "high"},
                                      {"ngram_update": True, "draft_predict_length": 5}])
def test_lookahead_with_mnn_keys_gives_exactly_the_greedy_tokens(engines, settings):
    """(The defaults: test_generation.py.)"""
    llm = engines("lookahead", **settings)
    try:
        for prompt in PROMPTS[2:]:
            llm.reset()
            out, _ = checked_generate(llm, prompt["prompt_ids"], N)
            assert out == expected(prompt)
    finally:
        llm.set_config({"draft_selection_rule": "freqxlen", "draft_match_strictness": "low", "ngram_update": False,
                        "draft_predict_length": 3})


@pytest.mark.slow
def test_lookahead_reads_guesses_from_the_lookup_file(folder, tmp_path):
    """A lookup_file holding the answer makes nearly every guess right."""
    prompt = PROMPTS[2]
    model = linked(tmp_path / "m", folder).parent
    llm = mnnllm_core.create(model / "config.json")
    llm.set_config({"sampler_type": "greedy", "thread_num": 2, "speculative_type": "lookahead",
                    "draft_adaptive": False})
    llm.load()
    plain = llm.generate(prompt["prompt_ids"], N)
    without = llm.generation.accepted
    (model / "lookup_file.txt").write_text(llm.tokenizer_decode(expected(prompt, 64)))
    llm.set_config({"speculative_type": "lookahead"})
    llm.reset()
    assert llm.generate(prompt["prompt_ids"], N) == plain == expected(prompt)
    assert llm.generation.accepted > max(without, N // 3)


@pytest.mark.slow
def test_a_second_architecture_decodes_the_same_with_every_strategy(tmp_path):
    reference = json.loads((ARCH / "reference.json").read_text())[SECOND]
    config = linked(tmp_path / "m", ARCH / SECOND)
    hidden = json.loads((ARCH / SECOND / "llm_config.json").read_text())["hidden_size"]
    write_mtp(config.parent, random_mtp(hidden, 49152, 2, seed=3))
    write_eagle(config.parent, random_eagle(hidden, 49152, 512, seed=4))
    llm = mnnllm_core.create(config)
    llm.set_config({"sampler_type": "greedy", "thread_num": 2, "memory": "normal", "hidden_states": True})
    llm.load()
    prompts = [p["prompt_ids"] for p in reference["prompts"]]
    ar = []
    for ids in prompts:
        llm.reset()
        ar.append(llm.generate(ids, 24))
    assert ar == [p[reference["reference"]][:24] for p in reference["prompts"]]
    sequences = [ids + out for ids, out in zip(prompts, ar)]
    mtp, eagle = fit_drafts(llm, sequences, heads=2, draft_vocab=256, ridge=1e-2)
    (config.parent / "fitted").mkdir()
    write_mtp(config.parent / "fitted", mtp)
    write_eagle(config.parent / "fitted", eagle)
    fitted = {"mtp_model": "fitted/mtp.mnn", "eagle_model": "fitted/eagle.mnn", "eagle_fc": "fitted/eagle_fc.mnn",
              "eagle_d2t": "fitted/eagle_d2t.mnn"}
    for kind, files in (("mtp", {}), ("eagle", {}), ("lookahead", {}), ("mtp", fitted), ("eagle", fitted)):
        llm.set_config({"speculative_type": kind, **files})
        assert isinstance(llm.generation, STRATEGIES[kind])
        for ids, want in zip(prompts, ar):
            llm.reset()
            assert checked_generate(llm, ids, 24)[0] == want, (kind, files)
    assert llm.generation.accepted > 0  # the fitted eagle guessed some right


# -- the n-gram cache -----------------------------------------------------------------


def test_ngram_cache_copies_what_followed_the_matching_ngram():
    assert build_cache([1, 2, 3, 9, 1, 2], 4, "freqxlen").draft([1, 2, 3, 9, 1, 2], 3) == [3, 9, 1]
    assert build_cache([5, 6, 7], 4, "freqxlen").draft([5, 6, 7], 3) == []


def test_freqxlen_scores_count_times_length_and_fcfs_takes_the_first_follower():
    tokens = [7, 1, 2, 8, 3, 2, 4, 3, 2, 4, 1, 2]
    assert build_cache(tokens, 2, "freqxlen").draft(tokens, 1) == [8]  # "1 2" (2 x 1) ties "2" -> 4 (1 x 2)
    assert build_cache([3, 2, 4, 3, 2, 4, 5, 2], 1, "freqxlen").draft([3, 2, 4, 3, 2, 4, 5, 2], 1) == [4]
    tokens = [2, 5, 2, 4, 2, 4, 2]
    assert build_cache(tokens, 1, "freqxlen").draft(tokens, 1) == [4]
    assert build_cache(tokens, 1, "fcfs").draft(tokens, 1) == [5]


def test_strictness_refuses_an_uncertain_first_guess():
    tokens = [1, 5, 1, 6, 1, 5, 1]  # after 1: 5 twice, 6 once (67 %)
    assert build_cache(tokens, 1, "freqxlen").draft(tokens, 1, "low") == [5]
    assert build_cache(tokens, 1, "freqxlen").draft(tokens, 1, "medium") == [5]  # >= 60 %
    assert build_cache(tokens, 1, "freqxlen").draft(tokens, 1, "high") == []  # < 90 %


def test_a_guess_names_the_length_of_the_key_it_follows():
    tokens = [5, 1, 2, 3, 7, 9, 2]
    for rule in ("freqxlen", "fcfs"):
        cache = build_cache(tokens, 4, rule)
        assert cache.guess([7, 1, 2]) == (3, 2)  # "1 2" -> 3
        assert cache.guess([8, 9, 2]) == (3, 1)  # "9 2" was never followed: "2" -> 3
        assert cache.guess([4, 4]) is None
        assert cache.guess([6, 3, 7]) == (9, 2)
    tokens = [1, 2, 4, 3, 2, 5, 6, 2, 5, 7, 2, 5, 1, 2]  # after "1 2": 4 once (score 2); after "2": 5 three times
    assert build_cache(tokens, 2, "freqxlen").guess(tokens) == (5, 1) == (build_cache(tokens, 2, "freqxlen")
                                                                           .draft(tokens, 1)[0], 1)
    assert build_cache(tokens, 2, "fcfs").guess(tokens) == (4, 2)  # the longest key's first follower
    assert build_cache([1, 5, 1, 6, 1, 5, 1], 1, "freqxlen").guess([1], "high") is None  # as `draft`


def test_ngram_update_counts_only_the_new_tokens():
    cache = NgramCache(2, "freqxlen")
    cache.update([1, 2, 3])
    cache.update([1, 2, 3, 1, 4], new_count=2)
    assert cache.followers[(1,)] == {2: 1, 4: 1} and cache.followers[(3,)] == {1: 1}


# -- errors ---------------------------------------------------------------------------


@pytest.mark.parametrize("key,value", [("draft_predict_length", 0), ("draft_match_strictness", "extreme"),
                                       ("draft_selection_rule", "random"), ("eagle_depth", 0), ("eagle_topk", 0),
                                       ("ngram_match_maxlen", 0), ("ngram_update", "yes")])
def test_a_bad_speculative_value_names_its_field(tmp_path, key, value):
    config = linked(tmp_path / "m", MODEL_DIR)
    data = json.loads(config.read_text())
    config.unlink()
    config.write_text(json.dumps({**data, key: value}))
    with pytest.raises(ConfigError) as err:
        mnnllm_core.create(config)
    assert err.value.field == key and str(config) in str(err.value)


def test_an_ngram_key_longer_than_mnns_is_refused():
    llm = mnnllm_core.create(MODEL_DIR / "config.json")
    llm.set_config({"sampler_type": "greedy", "speculative_type": "lookahead", "ngram_match_maxlen": 9})
    with pytest.raises(ConfigError) as err:
        llm.load()
    assert err.value.field == "ngram_match_maxlen"


def draft_llm(folder, tmp_path, kind, **files):
    model = linked(tmp_path / "m", folder).parent
    llm = mnnllm_core.create(model / "config.json")
    llm.set_config({"sampler_type": "greedy", "thread_num": 2, "speculative_type": kind, **files})
    return llm, model


@pytest.mark.slow
def test_a_missing_draft_file_names_its_key(folder, tmp_path):
    llm, _ = draft_llm(folder, tmp_path, "mtp", mtp_model="nowhere.mnn")
    with pytest.raises(ConfigError) as err:
        llm.load()
    assert err.value.field == "mtp_model" and "nowhere.mnn" in str(err.value)


@pytest.mark.slow
def test_a_corrupt_draft_file_is_a_format_error_naming_it(folder, tmp_path):
    llm, model = draft_llm(folder, tmp_path, "eagle", eagle_model="broken.mnn")
    (model / "broken.mnn").write_bytes(b"\x00not a flatbuffer" * 8)
    with pytest.raises(FormatError) as err:
        llm.load()
    assert str(model / "broken.mnn") in str(err.value)


@pytest.mark.slow
def test_a_d2t_outside_the_vocabulary_is_refused(folder, tmp_path):
    llm, model = draft_llm(folder, tmp_path, "eagle", eagle_d2t="bad_d2t.mnn")
    weights = random_eagle(576, 49152, 16)
    weights.d2t[3] = 10 ** 6
    (model / "bad").mkdir()
    write_eagle(model / "bad", weights)
    shutil.copyfile(model / "bad" / "eagle_d2t.mnn", model / "bad_d2t.mnn")
    with pytest.raises(FormatError) as err:
        llm.load()
    assert err.value.field == "int32s" and "bad_d2t.mnn" in str(err.value)


@pytest.mark.slow
def test_a_draft_of_the_wrong_vocabulary_fails_naming_its_output(folder, tmp_path):
    llm, model = draft_llm(folder, tmp_path, "mtp", mtp_model="small.mnn")
    write_mtp(model, random_mtp(576, 1000, 2), name="small.mnn")
    llm.load()
    with pytest.raises(FormatError) as err:
        llm.generate(PROMPTS[0]["prompt_ids"], 4)
    assert err.value.field == "logits" and "small.mnn" in str(err.value)


@pytest.mark.slow
def test_an_attention_where_no_draft_keeps_a_kv_cache_is_refused_naming_it(folder, tmp_path):
    """(eagle_fc maps hidden states; Eagle steps and MTP modules with Attention: test_draft_kv.py.)"""
    llm, model = draft_llm(folder, tmp_path, "eagle", eagle_fc="attending.mnn")
    g = GraphBuilder()
    for name in ("q", "k", "v", "mask"):
        g.input(name, [1, 1, 8], DataType.DT_FLOAT)
    g.op(OpType.Attention, "attention", ["q", "k", "v", "mask"], ["logits"], OpParameter.AttentionParam,
         AttentionParamT())
    (model / "attending.mnn").write_bytes(g.finish(["logits"], "attending"))
    with pytest.raises(UnsupportedError) as err:
        llm.load()
    assert err.value.field == "oplists" and "attending.mnn" in str(err.value)


@pytest.mark.slow
def test_mtp_set_after_a_load_without_hidden_states_says_so(folder, tmp_path):
    llm, _ = draft_llm(folder, tmp_path, "")
    llm.load()
    with pytest.raises(ConfigError) as err:
        llm.set_config({"speculative_type": "mtp"})
    assert err.value.field == "speculative_type" and "hidden_states" in str(err.value)


# -- a GPU backend ----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(not registry().get("opencl").is_available()[0], reason="OpenCL unavailable")
def test_speculative_decoding_on_opencl_gives_the_greedy_tokens(folder):
    llm = mnnllm_core.create(folder / "config.json")
    llm.set_config({"backend_type": "opencl", "sampler_type": "greedy", "thread_num": 2, "speculative_type": "mtp"})
    llm.load()
    prompt = PROMPTS[2]
    for kind in ("mtp", "eagle"):
        llm.set_config({"speculative_type": kind})
        assert isinstance(llm.generation, STRATEGIES[kind])
        llm.reset()
        out, steps = checked_generate(llm, prompt["prompt_ids"], 16)
        assert out == expected(prompt, 16) and llm.generation.accepted > 0, kind
        follow = llm.forward([out[-1]])
        assert llm.kv_meta.previous == len(llm.context.history_tokens) and np.isfinite(follow).all()
