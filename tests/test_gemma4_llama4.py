"""MNN 3.6.1's exports of Gemma 4 (text) and Llama-4-style dense layers (../shared/models/arch3) run
by our engine: greedy, 24 tokens, the three reference prompts from `mnn_prompt_ids`, on cpu with
memory "normal" and "low", on opencl and vulkan (ops a device cannot run fall back to cpu with the
reason in the placement), with a cached prefix, and the pieces Gemma 4 adds: the per-layer
embeddings the engine feeds (`ple_embeddings`), the config's attn_scale, the tokenizer's bos in
MNN's own chat template, and typed errors for a bad PLE table or config.

Gemma 4's reference lists: MNN's runtime refreshes `ple_embeddings` only when it has none yet or a
step has one token (Llm::embedding), and reset() keeps it; reference.json ran the three prompts in
one process, so the prefill of prompts 2 and 3 fed the PLE row of the previous prompt's last
generated token to every position. Our engine feeds each step's own rows, which is what MNN gives
for each prompt in a fresh process (FRESH_MNN, checked against MNN by the oracle test); the test
that emulates MNN's stale rows reproduces reference.json's lists exactly.
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from mnnllm_core.errors import ConfigError, FormatError, UnsupportedError
from mnnllm_core.llm.create import create
from mnnllm_core.plugins.manager import registry
from paths import SHARED

ARCH3 = SHARED / "models" / "arch3"
REFERENCE = json.loads((ARCH3 / "reference.json").read_text()) if (ARCH3 / "reference.json").exists() else {}
NEW_TOKENS = 24
GEMMA4 = ("tiny-gemma4-mnn-fp16", "tiny-gemma4-mnn-q4")
LLAMA4 = "tiny-llama4_text_dense-mnn-q4"
FOLDERS = (*GEMMA4, LLAMA4)
# MNN 3.6.1 (pip), memory "normal", greedy, each prompt in a fresh process: prompts 2 and 3 of Gemma 4
# (prompt 1 equals reference.json's list)
FRESH_MNN = {
    "tiny-gemma4-mnn-fp16": [
        [25882, 15589, 7504, 33923, 4017, 42131, 2988, 10784, 8681, 41744, 7554, 16593, 18818, 4629, 1898, 44512,
         9854, 3371, 16380, 27505, 6441, 17872, 30332, 38273],
        [2265, 4459, 16098, 36401, 48934, 41301, 44456, 23162, 40944, 34243, 3924, 2473, 13267, 9406, 48665, 46525,
         30058, 46825, 25161, 36694, 5428, 44373, 6165, 343]],
    "tiny-gemma4-mnn-q4": [
        [16406, 29385, 16254, 30458, 9222, 12825, 36077, 982, 15062, 15318, 18543, 40940, 22210, 20700, 24812, 45279,
         38404, 7178, 8291, 40493, 2404, 14214, 9782, 29708],
        [16406, 12462, 36520, 7951, 17817, 25622, 9538, 38886, 36112, 4625, 23908, 6155, 22813, 14825, 21379, 10251,
         33719, 41832, 18528, 28332, 5973, 22703, 10023, 22953]],
}

pytestmark = pytest.mark.skipif(not all(f in REFERENCE for f in FOLDERS), reason=f"arch3 models missing at {ARCH3}")


def load(folder: str, backend: str = "cpu", memory: str = "normal", **extra):
    llm = create(str(ARCH3 / folder / "config.json"))
    llm.set_config({"backend_type": backend, "memory": memory, "sampler_type": "greedy", "thread_num": 2, **extra})
    return llm.load()


def prompts(folder: str) -> list[dict]:
    return REFERENCE[folder]["prompts"][:3]


def expected(folder: str) -> list[list[int]]:
    """What a correct engine gives: reference.json's lists, Gemma 4's later prompts from MNN in a fresh process."""
    lists = [p[REFERENCE[folder]["reference"]] for p in prompts(folder)]
    return lists[:1] + FRESH_MNN[folder] if folder in FRESH_MNN else lists


def generate(llm, folder: str, reset: bool = True) -> list[list[int]]:
    out = []
    for prompt in prompts(folder):
        if reset:
            llm.reset()
        out.append(list(llm.generate(prompt["mnn_prompt_ids"], NEW_TOKENS)))
    return out


@pytest.mark.parametrize("memory", ["normal", "low"])
@pytest.mark.parametrize("folder", FOLDERS)
def test_cpu_reproduces_mnns_tokens(folder, memory) -> None:
    assert generate(load(folder, memory=memory), folder) == expected(folder)


def test_reference_lists_of_later_gemma4_prompts_are_mnns_stale_per_layer_rows() -> None:
    """Fed MNN's stale prefill rows (the previous prompt's last generated token's row at every
    position), our engine gives reference.json's lists token for token."""
    folder = "tiny-gemma4-mnn-fp16"
    llm = load(folder)
    fresh_rows = llm.per_layer.rows
    previous = None
    for prompt in prompts(folder):
        want = prompt[REFERENCE[folder]["reference"]]

        def stale(ids, last=previous):
            if len(ids) > 1 and last is not None:
                return np.repeat(fresh_rows([last]), len(ids), axis=1)
            return fresh_rows(ids)
        llm.per_layer.rows = stale
        llm.reset()
        assert llm.generate(prompt["mnn_prompt_ids"], NEW_TOKENS) == want
        previous = want[-1]


def test_fresh_mnn_lists_are_what_mnn_gives_in_a_fresh_process() -> None:
    from mnn_oracle import run_mnn
    folder = "tiny-gemma4-mnn-fp16"
    out = run_mnn(ARCH3 / folder, config={"memory": "normal", "thread_num": 2, "sampler_type": "greedy"},
                  generate=[(prompts(folder)[1]["mnn_prompt_ids"], NEW_TOKENS)])
    assert out["generate"][0] == FRESH_MNN[folder][0]


DEVICE_CASES = [(b, f) for b in ("opencl", "vulkan") for f in ("tiny-gemma4-mnn-q4", LLAMA4)]


@pytest.mark.parametrize("backend,folder", DEVICE_CASES, ids=[f"{b}-{f}" for b, f in DEVICE_CASES])
def test_a_device_backend_gives_the_same_tokens_and_names_each_fallback(backend, folder) -> None:
    available, reason = registry().get(backend).is_available()
    if not available:
        pytest.skip(f"{backend} unavailable: {reason}")
    llm = load(folder, backend)
    assert generate(llm, folder) == expected(folder)
    placement = llm.placement()
    assert placement["ops_per_backend"].get(backend, 0) > 0
    assert all(f["reason"] for f in placement["fallbacks"])
    if folder in GEMMA4:  # the norms' ReduceMean: no device kernel yet
        assert "Reduction" in {f["type"] for f in placement["fallbacks"]}
    else:
        assert placement["fallbacks"] == []


@pytest.mark.parametrize("folder", ["tiny-gemma4-mnn-fp16", LLAMA4])
def test_a_second_turn_over_the_cached_conversation_gives_the_tokens_of_a_fresh_start(folder) -> None:
    """The second turn keeps the first turn's KV cache (prompt and answer, past Gemma 4's sliding
    window of 8) and runs only the new tokens; the three reference prompts without reset keep their
    shared prefix and cut back the previous answer."""
    llm = load(folder)
    first = prompts(folder)[0]["mnn_prompt_ids"]
    answer = llm.generate(first, NEW_TOKENS)
    second = first + answer + prompts(folder)[2]["mnn_prompt_ids"]
    assert llm.cached_prefix(second) == len(first) + NEW_TOKENS - 1 > 8
    cached = llm.generate(second, NEW_TOKENS)
    llm.reset()
    assert cached == llm.generate(second, NEW_TOKENS)
    assert generate(llm, folder, reset=False) == expected(folder)


def test_lookahead_verification_gives_gemma4s_greedy_tokens() -> None:
    """Speculative steps run several tokens at once through forward: each gets its own PLE row
    (every step drafting, draft_adaptive off: the draft budget would run plain steps instead)."""
    folder = "tiny-gemma4-mnn-fp16"
    llm = load(folder, speculative_type="lookahead", ngram_update=True, draft_adaptive=False)
    assert generate(llm, folder) == expected(folder)


@pytest.mark.parametrize("folder", FOLDERS)
def test_our_prompt_rendering_gives_mnns_prompt_ids(folder) -> None:
    """MNN's exporter's own chat template (llm_config.json's jinja); Gemma 4's bos_token is the
    tokenizer's (<|im_start|>, id 1), not jinja.bos (<bos>)."""
    llm = create(str(ARCH3 / folder / "config.json")).load()
    for prompt in prompts(folder):
        assert llm._prompt_ids(prompt["prompt"]) == prompt["mnn_prompt_ids"]


def test_per_layer_rows_are_the_files_bf16_rows_times_the_scale() -> None:
    folder = "tiny-gemma4-mnn-fp16"
    llm = load(folder)
    config = json.loads((ARCH3 / folder / "llm_config.json").read_text())
    dim, scale = config["ple_embed_dim"], config["ple_embed_scale"]
    raw = np.fromfile(ARCH3 / folder / config["ple_embed_file"], "<u2").reshape(-1, dim)
    table = (raw.astype(np.uint32) << 16).view(np.float32).astype(np.float64) * scale
    ids = [0, 1, 49151, 7, 7, 30000]
    rows = llm.per_layer.rows(ids)
    assert rows.shape == (1, len(ids), dim) and rows.dtype == np.float32
    np.testing.assert_array_equal(rows[0].astype(np.float64), table[ids])  # bf16 x 2.0 is exact in float32


def test_the_config_attn_scale_replaces_one_over_sqrt_head_dim() -> None:
    llm = load("tiny-gemma4-mnn-q4")
    scales = {node.op.param.scale for node in llm.module.static_module.info.nodes if node.op.type == "Attention"}
    assert scales == {1.0}


def test_llama4s_qk_norm_runs_per_head_of_the_rope_it_follows() -> None:
    llm = load(LLAMA4)
    nodes = llm.module.static_module.info.nodes
    assert {n.op.param.heads for n in nodes if n.op.type == "Attention"} == {(4, 2, 16)}
    head_norms = [n for n in nodes if n.op.type == "LayerNorm" and n.op.param.head_dim]
    assert len(head_norms) == 4 and {n.op.param.head_dim for n in head_norms} == {16}  # q and k of layers 0, 2


@pytest.fixture
def gemma4_copy(tmp_path):
    """A copy of the fp16 Gemma 4 folder (the large files linked) whose PLE table a test may replace."""
    source = ARCH3 / "tiny-gemma4-mnn-fp16"
    for name in ("config.json", "llm_config.json", "tokenizer.mtok"):
        shutil.copy(source / name, tmp_path / name)
    for name in ("llm.mnn", "llm.mnn.weight"):
        (tmp_path / name).symlink_to(source / name)
    shutil.copy(source / "ple_embeddings_bf16.bin", tmp_path / "ple_embeddings_bf16.bin")
    return tmp_path


def load_copy(folder, **config):
    llm = create(str(folder / "config.json"))
    llm.set_config({"thread_num": 2, **config})
    return llm.load()


def test_a_ple_table_too_short_for_the_vocab_is_a_format_error(gemma4_copy) -> None:
    table = gemma4_copy / "ple_embeddings_bf16.bin"
    table.write_bytes(table.read_bytes()[:1000 * 16 * 2])
    with pytest.raises(FormatError, match="1000 rows") as err:
        load_copy(gemma4_copy)
    assert err.value.file == str(table) and err.value.field == "ple_embed_file"


def test_a_ple_table_of_partial_rows_is_a_format_error(gemma4_copy) -> None:
    with pytest.raises(FormatError, match="whole number of bf16 rows of 7") as err:
        load_copy(gemma4_copy, ple_embed_dim=7)
    assert err.value.file.endswith("ple_embeddings_bf16.bin") and err.value.field == "ple_embed_dim"


def test_a_ple_embed_dim_the_graph_does_not_take_is_a_config_error(gemma4_copy) -> None:
    with pytest.raises(ConfigError, match="ple_embeddings") as err:
        load_copy(gemma4_copy, ple_embed_dim=12)  # whole rows, enough of them, but the graph takes 16
    assert err.value.field == "ple_embed_dim"


@pytest.mark.parametrize("value", [0, -16, "16", 16.0, True])
def test_an_invalid_ple_embed_dim_is_a_config_error(gemma4_copy, value) -> None:
    with pytest.raises(ConfigError) as err:
        load_copy(gemma4_copy, ple_embed_dim=value)
    assert err.value.field == "ple_embed_dim"


def test_a_missing_ple_table_is_a_config_error(gemma4_copy) -> None:
    (gemma4_copy / "ple_embeddings_bf16.bin").unlink()
    with pytest.raises(ConfigError, match="does not exist") as err:
        load_copy(gemma4_copy)
    assert err.value.field == "ple_embed_file" and err.value.file == str(gemma4_copy / "llm_config.json")


def test_a_quantized_ple_table_is_refused(gemma4_copy) -> None:
    with pytest.raises(UnsupportedError) as err:
        load_copy(gemma4_copy, ple_quant=[4, 32])
    assert err.value.field == "ple_quant"


def test_a_token_outside_the_ple_table_is_a_format_error() -> None:
    llm = load("tiny-gemma4-mnn-fp16")
    with pytest.raises(FormatError) as err:
        llm.per_layer.rows([49152])
    assert err.value.field == "input_ids" and err.value.file.endswith("ple_embeddings_bf16.bin")


def test_an_attention_sharing_another_layers_kv_cache_is_refused() -> None:
    """Gemma 4 exports with num_kv_shared_layers > 0 set kv_shared_layer_index (these set -1)."""
    from mnnllm_core.core.op import Op
    from mnnllm_core.core.op_params import decode
    from mnnllm_core.schema.MNN.AttentionParam import AttentionParamT
    table = AttentionParamT()
    table.kvSharedLayerIndex = 1
    with pytest.raises(UnsupportedError, match="KV sharing") as err:
        decode(Op("Attention", "attn", table))
    assert err.value.field == "kv_shared_layer_index"
