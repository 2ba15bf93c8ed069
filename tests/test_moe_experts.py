"""The experts of an MoE op are read from the Net's "/expert/{layer}_{e}" subgraphs; an expert
of another shape than gate_up -> silu(gate) * up -> down, or a missing one, is a typed error."""
import pytest

from mnnllm_core.core.op_params import MoEParams
from mnnllm_core.errors import FormatError, UnsupportedError
from mnnllm_core.express.moe_experts import expert_weights
from mnnllm_core.express.weight_file import ExternalWeightFile
from mnnllm_core.schema.MNN.UnaryOpOperation import UnaryOpOperation
from mnnllm_core.schema.reader import op_type_name, read_net_file
from paths import SHARED

MODEL = SHARED / "models" / "arch" / "tiny-qwen3_moe-mnn-fp16" / "llm.mnn"
pytestmark = pytest.mark.skipif(not MODEL.exists(), reason=f"shared model missing at {MODEL}")


@pytest.fixture
def net():
    return read_net_file(str(MODEL))


def weight_file() -> ExternalWeightFile:
    return ExternalWeightFile(str(MODEL) + ".weight")


def test_each_expert_gives_its_gate_up_and_down_weights(net) -> None:
    experts = expert_weights(net, MoEParams(4, 2, layer_id=1), "moe", weight_file(), str(MODEL)).experts()
    assert len(experts) == 4
    for expert in experts:
        assert expert.gate_up.dequantize().shape == (128, 64) and expert.down.dequantize().shape == (64, 64)
        assert expert.intermediate == 64


def test_an_expert_with_another_activation_is_unsupported(net) -> None:
    graph = next(g for g in net.subgraphs if g.name in (b"/expert/0_2", "/expert/0_2"))
    unary = next(op for op in graph.nodes if op_type_name(op.type) == "UnaryOp")
    unary.main.opType = UnaryOpOperation.SIGMOID
    with pytest.raises(UnsupportedError, match="/expert/0_2"):
        expert_weights(net, MoEParams(4, 2), "moe", weight_file(), str(MODEL))


def test_a_missing_expert_subgraph_is_a_format_error(net) -> None:
    with pytest.raises(FormatError, match="/expert/0_4"):
        expert_weights(net, MoEParams(5, 2), "moe", weight_file(), str(MODEL))
