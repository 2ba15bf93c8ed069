"""The experts of an MoE op are read from the Net's "/expert/{layer}_{e}" subgraphs: the gate_up
and down Linears and, between them, the expression of the two halves as an ExpertProgram. An
expression with an op outside the expert operations, halves sliced elsewhere, or a missing
expert subgraph is a typed error naming the file and field."""
import numpy as np
import pytest

from mnnllm_backends.cpu.ops.elementwise import BINARY, UNARY
from mnnllm_backends.cpu.ops.moe import bind_program
from mnnllm_core.core.expert_program import EXPERT_BINARY, EXPERT_UNARY, SILU_GLU, ExpertStep
from mnnllm_core.core.op_params import MoEParams
from mnnllm_core.core.weights.file import ExternalWeightFile
from mnnllm_core.core.weights.moe_experts import expert_weights
from mnnllm_core.errors import FormatError, UnsupportedError
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


def expert_graph(net, name: str = "/expert/0_2"):
    return next(g for g in net.subgraphs if g.name in (name.encode(), name))


def test_each_expert_gives_its_gate_up_and_down_weights_and_mnns_silu_program(net) -> None:
    experts = expert_weights(net, MoEParams(4, 2, layer_id=1), "moe", weight_file(), str(MODEL)).experts()
    assert len(experts) == 4
    for expert in experts:
        assert expert.gate_up.dequantize().shape == (128, 64) and expert.down.dequantize().shape == (64, 64)
        assert expert.intermediate == 64
        assert expert.program == SILU_GLU


def test_an_expert_with_another_activation_reads_as_that_program(net) -> None:
    unary = next(op for op in expert_graph(net).nodes if op_type_name(op.type) == "UnaryOp")
    unary.main.opType = UnaryOpOperation.SIGMOID
    programs = expert_weights(net, MoEParams(4, 2), "moe", weight_file(), str(MODEL)).programs
    assert programs[2] == (ExpertStep("SIGMOID", ("gate",)), ExpertStep("MUL", ("up", "step0")))
    assert programs[1] == SILU_GLU


def test_an_expert_op_the_interpreter_does_not_know_is_unsupported_naming_file_and_field(net) -> None:
    unary = next(op for op in expert_graph(net).nodes if op_type_name(op.type) == "UnaryOp")
    unary.main.opType = UnaryOpOperation.COS
    with pytest.raises(UnsupportedError, match=r"'/expert/0_2'.*UnaryOp COS") as raised:
        expert_weights(net, MoEParams(4, 2), "moe", weight_file(), str(MODEL))
    assert raised.value.file == str(MODEL) and raised.value.field == "subgraphs"


def test_halves_that_do_not_start_at_zero_are_unsupported(net) -> None:
    graph = expert_graph(net)
    names = [t.decode() if isinstance(t, bytes) else t for t in graph.tensors]
    begin = next(op for op in graph.nodes if op_type_name(op.type) == "Const"
                 and names[op.outputIndexes[0]] == "/Constant_1_output_0")
    begin.main.int32s = [1]
    with pytest.raises(UnsupportedError, match="first half") as raised:
        expert_weights(net, MoEParams(4, 2), "moe", weight_file(), str(MODEL))
    assert raised.value.field == "subgraphs"


def test_a_missing_expert_subgraph_is_a_format_error(net) -> None:
    with pytest.raises(FormatError, match="/expert/0_4"):
        expert_weights(net, MoEParams(5, 2), "moe", weight_file(), str(MODEL))


def test_the_cpu_backend_has_a_function_for_every_expert_operation() -> None:
    assert EXPERT_UNARY <= UNARY.keys() and EXPERT_BINARY <= BINARY.keys()


def test_the_cpu_silu_program_gives_the_bits_of_the_fixed_silu_expert() -> None:
    h = np.random.default_rng(0).standard_normal((5, 2 * 7)).astype(np.float32) * 4
    gate, up = h[:, :7], h[:, 7:]
    assert np.array_equal(bind_program(SILU_GLU)(gate, up), gate / (1.0 + np.exp(-gate)) * up)
