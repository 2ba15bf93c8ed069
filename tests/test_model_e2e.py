"""The shared llm.mnn end to end through Module.load on the cpu backend, against MNN's own
runtime on the same files (memory "normal", whose cpu path computes in fp32 as ours does)."""
import json

import flatbuffers
import numpy as np
import pytest

from mnnllm_core.core.backend import ScheduleConfig
from mnnllm_core.express.module import Module
from mnnllm_core.express.runtime_manager import RuntimeManager
from mnnllm_core.express.static_module import Config
from mnnllm_core.llm.config import LlmConfig
from mnnllm_core.llm.disk_embedding import DiskEmbedding
from mnnllm_core.schema.reader import read_net_file
from mnn_oracle import run_mnn
from paths import CONFIG, LLM_MNN, MODEL_DIR, REFERENCE

PROMPTS = json.loads(REFERENCE.read_text())["prompts"]


@pytest.fixture(scope="module")
def loaded():
    runtime = RuntimeManager.create(ScheduleConfig(backend_type="cpu", thread_num=2))
    module = Module.load([], [], LLM_MNN, runtime, Config(rearrange=True))
    return module, runtime, DiskEmbedding(LlmConfig.from_file(CONFIG))


def _prefill(module, runtime, embedding, ids):
    runtime.kv_meta.remove = runtime.kv_meta.previous
    runtime.kv_meta.add = len(ids)
    logits, _ = module.forward({
        "input_ids": embedding.embedding(ids), "attention_mask": np.zeros((1, 1, 1, 1), np.float32),
        "position_ids": np.arange(len(ids), dtype=np.int32).reshape(1, -1),
        "logits_index": np.array([-1], np.int32)})
    runtime.kv_meta.sync()
    return logits.reshape(-1)


@pytest.mark.oracle
def test_last_token_logits_match_mnn_runtime(loaded):
    module, runtime, embedding = loaded
    mnn = run_mnn(MODEL_DIR, config={"memory": "normal", "thread_num": 2},
                  logits=[p["prompt_ids"] for p in PROMPTS])["logits"]
    for prompt, reference in zip(PROMPTS, mnn):
        ours = _prefill(module, runtime, embedding, prompt["prompt_ids"])
        reference = np.asarray(reference, np.float32)
        cosine = float(ours @ reference / np.linalg.norm(ours) / np.linalg.norm(reference))
        assert ours.argmax() == reference.argmax()
        assert cosine >= 0.9999, cosine
        assert np.abs(ours - reference).max() < 1e-2


def test_module_infers_inputs_outputs_and_header(loaded):
    module, _, _ = loaded
    info = module.get_info()
    assert info["inputs"] == ["input_ids", "attention_mask", "position_ids", "logits_index"]
    assert info["outputs"] == ["logits", "hidden_states"]
    assert info["version"] == "3.6.1" and info["bizCode"] == "MNNTest"
    assert info["uuid"] == "7a3b26ed-e7c3-49d8-8b54-a6df9f55f26d"


def test_rearrange_packs_weights_once_and_drops_raw_weights(loaded):
    module, _, _ = loaded
    nodes = module.static_module.info.nodes
    weighted = [n for n in nodes if n.op.type in ("Convolution", "LayerNorm")]
    assert len(weighted) == 211 + 61
    assert all(n.op.weights is None for n in weighted)
    executions = module.static_module.session.pipeline.executions
    assert all(nodes.index(n) in executions for n in weighted)


def test_clone_shares_packed_weights(loaded):
    module, _, _ = loaded
    twin = module.clone()
    ours = module.static_module.session.pipeline.executions
    theirs = twin.static_module.session.pipeline.executions
    conv = next(i for i, (_, e) in ours.items() if hasattr(e, "weight"))
    assert theirs[conv][1].weight is ours[conv][1].weight
    assert theirs[conv][1] is not ours[conv][1]


def test_all_logits_returns_one_row_per_token(loaded):
    module, runtime, embedding = loaded
    ids = PROMPTS[2]["prompt_ids"]
    runtime.kv_meta.remove, runtime.kv_meta.add = runtime.kv_meta.previous, len(ids)
    logits, hidden = module.forward({
        "input_ids": embedding.embedding(ids), "attention_mask": np.zeros((1, 1, 1, 1), np.float32),
        "position_ids": np.arange(len(ids), dtype=np.int32).reshape(1, -1),
        "logits_index": np.array([0], np.int32)})
    runtime.kv_meta.sync()
    assert logits.shape == (1, len(ids), 49152)
    last = _prefill(module, runtime, embedding, ids)
    np.testing.assert_allclose(logits[0, -1], last, rtol=1e-4, atol=1e-4)


def test_config_base_shares_the_packed_weights_of_the_same_graph(loaded, tmp_path):
    module, runtime, _ = loaded
    twin = Module.load([], [], LLM_MNN, runtime, Config(rearrange=True, base=module))
    ours = module.static_module.session.pipeline.executions
    theirs = twin.static_module.session.pipeline.executions
    conv = next(i for i, (_, e) in ours.items() if hasattr(e, "weight"))
    assert theirs[conv][1].weight is ours[conv][1].weight


def test_config_base_shares_with_another_graph_op_by_op(loaded, tmp_path):
    """A graph other than the base's (another uuid, e.g. a LoRA's lora.mnn) is accepted:
    each op with the base's name and weights shares its Execution."""
    module, runtime, _ = loaded
    net = read_net_file(str(LLM_MNN))
    net.mnnUuid = "another-graph"
    builder = flatbuffers.Builder(1 << 20)
    builder.Finish(net.Pack(builder))
    other = tmp_path / "llm.mnn"
    other.write_bytes(bytes(builder.Output()))
    runtime.set_external_file(str(LLM_MNN) + ".weight")
    twin = Module.load([], [], other, runtime, Config(rearrange=True, base=module))
    session = twin.static_module.session
    assert session.from_base == session.readers.keys() and session.from_base
