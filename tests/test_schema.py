"""The llm.mnn reader: binary compatibility with MNN, verification, regen."""
from __future__ import annotations

import filecmp
import importlib
import json
import logging
import shutil
import struct
import subprocess
import time
from datetime import timedelta
from pathlib import Path

import flatbuffers
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mnnllm_core.errors import FormatError
from mnnllm_core.schema.MNN import LoopParam as loop_fb
from mnnllm_core.schema.MNN import Net as net_fb
from mnnllm_core.schema.MNN import Op as op_fb
from mnnllm_core.schema.MNN import RegionCommand as command_fb
from mnnllm_core.schema.MNN.Axis import AxisT
from mnnllm_core.schema.MNN.LoopParam import LoopParamT
from mnnllm_core.schema.MNN.Net import NetT
from mnnllm_core.schema.MNN.Op import OpT
from mnnllm_core.schema.MNN.OpParameter import OpParameter
from mnnllm_core.schema.MNN.OpType import OpType
from mnnllm_core.schema.MNN.RegionCommand import RegionCommandT
from mnnllm_core.schema.reader import _schema, op_param_name, op_type_name, read_net, verify_net_buffer
from paths import MODEL_DIR

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent
MODEL = MODEL_DIR / "llm.mnn"
needs_model = pytest.mark.skipif(not MODEL.exists(), reason=f"{MODEL} not present")


@pytest.fixture(scope="module")
def model_bytes() -> bytes:
    return MODEL.read_bytes()


@pytest.fixture(scope="module")
def net(model_bytes: bytes) -> NetT:
    return read_net(model_bytes, str(MODEL))


@pytest.fixture(scope="module")
def dump() -> dict:
    return json.loads((MODEL_DIR / "llm.mnn.json").read_text())


# ---------------------------------------------------------------------------
# comparing with MNN's own JSON dump of the same file
# ---------------------------------------------------------------------------

def _norm(name: str) -> str:
    """flatc's object API renames fields (mnn_uuid -> mnnUuid, useRMSNorm -> useRmsnorm)."""
    return name.replace("_", "").lower()


def _enum_name(enum_type: str, value: int) -> str:
    enum_class = getattr(importlib.import_module(f"mnnllm_core.schema.MNN.{enum_type}"), enum_type)
    names = {v: k for k, v in vars(enum_class).items() if not k.startswith("_")}
    return names[value]


def _is_enum(type_name: str) -> bool:
    inner = type_name.strip("[]")
    return inner not in _schema().tables and inner not in _schema().unions and inner[:1].isupper()


def _attr(obj: object, key: str, where: str) -> object:
    by_norm = {_norm(k): k for k in vars(obj)}
    assert _norm(key) in by_norm, f"{where}: no attribute for JSON key {key!r} in {type(obj).__name__}"
    return getattr(obj, by_norm[_norm(key)])


def _field_type(table: str, key: str) -> str:
    for field in _schema().tables[table]:
        if _norm(field.name) == _norm(key):
            return field.type
    raise AssertionError(f"{table} has no field {key!r} in mnn.fbs")


def _compare(expected: object, actual: object, type_name: str, where: str) -> None:
    """Recursively compare a JSON value from MNN's dump with a NetT value."""
    if isinstance(expected, dict):
        assert actual is not None, f"{where}: missing table"
        table = type(actual).__name__[:-1]  # XxxT -> Xxx
        for key, value in expected.items():
            _compare(value, _attr(actual, key, where), _field_type(table, key), f"{where}.{key}")
    elif isinstance(expected, list):
        assert actual is not None and len(actual) == len(expected), f"{where}: {actual!r} != {expected!r}"
        for i, (e, a) in enumerate(zip(expected, actual)):
            _compare(e, a, type_name.strip("[]"), f"{where}[{i}]")
    elif isinstance(expected, bool):
        assert bool(actual) is expected, f"{where}: {actual!r} != {expected!r}"
    elif isinstance(expected, str) and _is_enum(type_name):
        assert _enum_name(type_name, int(actual)) == expected, f"{where}: {actual!r} != {expected!r}"
    elif isinstance(expected, float) or type_name == "float":
        assert np.float32(actual) == np.float32(expected), f"{where}: {actual!r} != {expected!r}"
    else:
        assert actual == expected, f"{where}: {actual!r} != {expected!r}"


@needs_model
def test_net_header_matches_mnn_json_dump(net: NetT, dump: dict) -> None:
    assert net.bizCode == dump["bizCode"] == "MNNTest"
    assert net.extraInfo.version == dump["extraInfo"]["version"] == "3.6.1"
    assert net.mnnUuid == dump["mnn_uuid"]
    assert net.tensorName == dump["tensorName"]
    assert len(net.tensorName) == 2303
    assert net.outputName == dump["outputName"]
    assert net.tensorNumber == dump["tensorNumber"]
    assert _enum_name("Usage", net.usage) == dump["usage"]
    assert _enum_name("NetSource", net.sourceType) == dump["sourceType"]
    assert _enum_name("ForwardType", net.preferForwardType) == dump["preferForwardType"]
    assert net.subgraphs is None and net.extraTensorDescribe is None


@needs_model
def test_every_op_matches_mnn_json_dump(net: NetT, dump: dict) -> None:
    assert len(net.oplists) == len(dump["oplists"]) == 1133
    for i, (op, expected) in enumerate(zip(net.oplists, dump["oplists"])):
        where = f"oplists[{i}] {expected['name']}"
        assert op_type_name(op.type) == expected["type"], where
        assert op.name == expected["name"], where
        assert op_param_name(op.mainType) == expected["main_type"], where
        assert _enum_name("MNN_DATA_FORMAT", op.defaultDimentionFormat) == expected["defaultDimentionFormat"]
        for key in ("inputIndexes", "outputIndexes"):
            if key in expected:
                assert list(getattr(op, key)) == expected[key], f"{where}.{key}"
            else:
                assert getattr(op, key) is None, f"{where}.{key}"
        if "main" in expected:
            _compare(expected["main"], op.main, op_param_name(op.mainType), f"{where}.main")
        else:
            assert op.main is None, where


@needs_model
def test_fused_llm_ops_unpack_to_their_param_classes(net: NetT) -> None:
    by_type = {op_type_name(op.type): op for op in net.oplists}
    attention, rope = by_type["Attention"].main, by_type["RoPE"].main
    assert type(attention).__name__ == "AttentionParamT"
    assert (attention.kvCache, attention.layerIndex, attention.kvSharedLayerIndex, attention.outputC4) == (
        True, 29, -1, True)
    assert type(rope).__name__ == "RoPEParamT"
    assert (rope.ropeCutHeadDim, rope.numHead, rope.kvNumHead, rope.headDim) == (64, 9, 3, 64)
    conv = by_type["Convolution"].main
    assert type(conv).__name__ == "Convolution2DT"
    assert conv.quanParameter.aMaxOrBits == 4 and conv.quanParameter.scaleStorage == 1
    assert conv.external.dtype == np.int64 and len(conv.external) == 5
    norm = by_type["LayerNorm"].main
    assert norm.useRmsnorm is True and list(norm.external)[1:] == [2304, 2304]


def test_op_names_follow_mnn() -> None:
    assert [op_type_name(v) for v in (0, 12, 31, 129, 256, 299, 306, 512, 603, 604)] == [
        "AbsVal", "Convolution", "GatherV2", "ConvertTensor", "Plugin", "Attention", "RoPE", "Extra",
        "LayerNorm", "GridSample"]
    assert [op_param_name(v) for v in (0, 4, 9, 88, 92, 98, 102)] == [
        "NONE", "Axis", "Convolution2D", "LayerNorm", "LoopParam", "AttentionParam", "RoPEParam"]
    assert op_param_name(57) == "OpParameter(57)"  # RoiParameters: no LLM graph has it, so it is left out
    assert op_type_name(9999) == "OpType(9999)"
    assert op_param_name(250) == "OpParameter(250)"


def test_every_union_member_has_a_table_and_keeps_mnns_number() -> None:
    """The schema declares only the parameter tables LLM graphs use, each at MNN's number."""
    schema = _schema()
    members = schema.unions["OpParameter"]
    assert all(m in schema.tables for m in members.values())
    assert {v: op_param_name(v) for v in members} == members
    assert {members[v] for v in (4, 7, 9, 19, 55, 64, 65, 70, 88, 98, 100, 102)} == {
        "Axis", "Blob", "Convolution2D", "GatherV2", "Reshape", "SqueezeParam", "StridedSliceParam", "UnaryOp",
        "LayerNorm", "AttentionParam", "LinearAttentionParam", "RoPEParam"}
    assert len(members) < 40 and 31 not in members  # Pool (31) and the like are left out


def test_an_op_whose_parameter_table_is_left_out_reads_with_none_and_is_unsupported() -> None:
    net = read_net(net_of_one_op(31, OpType.Pooling))  # MNN's Pool table, not in this schema
    assert (op_type_name(net.oplists[0].type), net.oplists[0].main) == ("Pooling", None)
    from mnnllm_core.core.op import Op
    from mnnllm_core.core.size_computer import compute_size
    from mnnllm_core.errors import UnsupportedError
    with pytest.raises(UnsupportedError, match="Pooling"):
        compute_size(Op("Pooling", "pool"), [])


@needs_model
def test_loading_the_real_model_takes_well_under_a_second(model_bytes: bytes) -> None:
    best_verify = best_read = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        verify_net_buffer(model_bytes, str(MODEL))
        t1 = time.perf_counter()
        read_net(model_bytes, str(MODEL))
        t2 = time.perf_counter()
        best_verify, best_read = min(best_verify, t1 - t0), min(best_read, t2 - t1)
    logger.info("llm.mnn: verify %.1f ms, verify + unpack %.1f ms", best_verify * 1e3, best_read * 1e3)
    assert best_read < 0.5


@needs_model
def test_memoryview_and_bytearray_read_like_bytes(model_bytes: bytes) -> None:
    for data in (memoryview(model_bytes), bytearray(model_bytes)):
        net = read_net(data)
        assert len(net.oplists) == 1133 and net.oplists[0].name == "input_ids"


# ---------------------------------------------------------------------------
# verification of hand-made and damaged buffers
# ---------------------------------------------------------------------------

def _pack(net: NetT) -> bytearray:
    builder = flatbuffers.Builder(1024)
    builder.Finish(net.Pack(builder))
    return bytearray(builder.Output())


def _small_net() -> NetT:
    op = OpT()
    op.name = "concat"
    op.inputIndexes = [1, 2, 3]
    op.outputIndexes = [4]
    op.type = 10
    op.mainType = OpParameter.Axis
    op.main = AxisT()
    op.main.axis = 7
    net = NetT()
    net.bizCode = "abc"
    net.oplists = [op]
    net.tensorName = ["t0", "t1"]
    return net


def test_a_net_written_by_flatbuffers_reads_back() -> None:
    net = read_net(bytes(_pack(_small_net())))
    op = net.oplists[0]
    assert (net.bizCode, net.tensorName, op.name, op.main.axis) == ("abc", ["t0", "t1"], "concat", 7)
    assert list(op.inputIndexes) == [1, 2, 3]


@pytest.mark.parametrize("data", [b"", b"\x00" * 4, b"\x00" * 11])
def test_empty_or_tiny_input_is_rejected_naming_the_file(data: bytes) -> None:
    with pytest.raises(FormatError, match="too small") as err:
        read_net(data, "some/llm.mnn")
    assert err.value.file == "some/llm.mnn"


@pytest.mark.parametrize("data", [b"\xff" * 64, b"\x00" * 64, bytes(range(256)), b"MNN" * 100])
def test_garbage_is_rejected_naming_the_file(data: bytes) -> None:
    with pytest.raises(FormatError) as err:
        read_net(data, "garbage.mnn")
    assert err.value.file == "garbage.mnn" and err.value.field


def test_root_offset_past_the_end_is_rejected() -> None:
    data = _pack(_small_net())
    struct.pack_into("<I", data, 0, len(data) + 100)
    with pytest.raises(FormatError, match="past the end") as err:
        read_net(bytes(data))
    assert err.value.field == "Net"


def test_vtable_out_of_range_is_rejected() -> None:
    data = _pack(_small_net())
    root = struct.unpack_from("<I", data, 0)[0]
    struct.pack_into("<i", data, root, -len(data))
    with pytest.raises(FormatError, match="vtable"):
        read_net(bytes(data))


def test_unterminated_string_is_rejected_with_its_field() -> None:
    data = _pack(_small_net())
    at = data.index(b"abc\x00")
    data[at + 3] = ord("x")
    with pytest.raises(FormatError, match="zero-terminated") as err:
        read_net(bytes(data))
    assert err.value.field == "Net.bizCode"


def test_vector_running_past_the_end_is_rejected_with_its_field() -> None:
    data = _pack(_small_net())
    at = data.index(struct.pack("<4i", 3, 1, 2, 3))
    struct.pack_into("<I", data, at, 0x10000000)
    with pytest.raises(FormatError, match="past the end") as err:
        read_net(bytes(data))
    assert err.value.field == "Net.oplists[0].inputIndexes"


def finish_net(builder: flatbuffers.Builder, op: int) -> bytes:
    """The bytes of a Net holding the one op `op` built in `builder`."""
    net_fb.NetStartOplistsVector(builder, 1)
    builder.PrependUOffsetTRelative(op)
    ops = builder.EndVector()
    net_fb.NetStart(builder)
    net_fb.NetAddOplists(builder, ops)
    builder.Finish(net_fb.NetEnd(builder))
    return bytes(builder.Output())


def net_of_one_op(main_type: int, op_type: int = 0) -> bytes:
    """A Net whose one op has a union member of type `main_type` (pointing at a string: a
    member that is not read is never followed)."""
    builder = flatbuffers.Builder(256)
    name = builder.CreateString("op")
    op_fb.OpStart(builder)
    op_fb.OpAddName(builder, name)
    op_fb.OpAddType(builder, op_type)
    op_fb.OpAddMainType(builder, main_type)
    op_fb.OpAddMain(builder, name)
    return finish_net(builder, op_fb.OpEnd(builder))


def test_unknown_union_member_is_accepted_and_left_unread() -> None:
    net = read_net(net_of_one_op(250))
    assert (net.oplists[0].mainType, net.oplists[0].main) == (250, None)
    assert op_param_name(250) == "OpParameter(250)"


def test_nesting_deeper_than_the_cap_is_rejected() -> None:
    inner = OpT()
    for _ in range(30):  # Op -> LoopParam -> RegionCommand -> Op: 3 levels each
        command = RegionCommandT()
        command.op = inner
        loop = LoopParamT()
        loop.commands = [command]
        inner = OpT()
        inner.mainType, inner.main = OpParameter.LoopParam, loop
    net = NetT()
    net.oplists = [inner]
    with pytest.raises(FormatError, match="deeper"):
        read_net(bytes(_pack(net)))


def test_shared_subtables_cannot_make_the_walk_explode() -> None:
    # Op -> LoopParam with 200 slots all pointing at one RegionCommand -> Op,
    # three levels: 200**3 paths through a buffer of a few KB.
    builder = flatbuffers.Builder(1024)
    op_fb.OpStart(builder)
    op = op_fb.OpEnd(builder)
    for _ in range(3):
        command_fb.RegionCommandStart(builder)
        command_fb.RegionCommandAddOp(builder, op)
        command = command_fb.RegionCommandEnd(builder)
        loop_fb.LoopParamStartCommandsVector(builder, 200)
        for _ in range(200):
            builder.PrependUOffsetTRelative(command)
        commands = builder.EndVector()
        loop_fb.LoopParamStart(builder)
        loop_fb.LoopParamAddCommands(builder, commands)
        loop = loop_fb.LoopParamEnd(builder)
        op_fb.OpStart(builder)
        op_fb.OpAddMainType(builder, OpParameter.LoopParam)
        op_fb.OpAddMain(builder, loop)
        op = op_fb.OpEnd(builder)
    data = finish_net(builder, op)
    t0 = time.perf_counter()
    with pytest.raises(FormatError, match="more objects"):
        read_net(data)
    assert time.perf_counter() - t0 < 1.0


def _read_or_format_error(data: bytes) -> None:
    try:
        net = read_net(data, "fuzzed.mnn")
    except FormatError as e:
        assert e.file == "fuzzed.mnn"
    else:
        assert isinstance(net, NetT)


_fuzz = settings(max_examples=40, deadline=timedelta(seconds=5),
                 suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@needs_model
@_fuzz
@given(cut=st.integers(min_value=0, max_value=249_336))
def test_truncated_model_gives_a_net_or_format_error(model_bytes: bytes, cut: int) -> None:
    _read_or_format_error(model_bytes[:cut])


@needs_model
@_fuzz
@given(flips=st.lists(st.tuples(st.integers(0, 249_335), st.integers(0, 255)), min_size=1, max_size=16))
def test_model_with_flipped_bytes_gives_a_net_or_format_error(model_bytes: bytes, flips: list) -> None:
    data = bytearray(model_bytes)
    for at, value in flips:
        data[at % len(data)] = value
    _read_or_format_error(bytes(data))


@needs_model
@_fuzz
@given(flips=st.lists(st.tuples(st.integers(0, 4095), st.integers(0, 255)), min_size=1, max_size=8))
def test_flips_in_the_table_area_give_a_net_or_format_error(model_bytes: bytes, flips: list) -> None:
    # The root table, its vtable and the first ops sit at the start of the file.
    data = bytearray(model_bytes)
    for at, value in flips:
        data[at] = value
    _read_or_format_error(bytes(data))


@_fuzz
@given(data=st.binary(max_size=512))
def test_random_bytes_give_a_net_or_format_error(data: bytes) -> None:
    _read_or_format_error(data)


# ---------------------------------------------------------------------------
# the generated code is the regen script's output
# ---------------------------------------------------------------------------

def test_regen_script_reproduces_the_committed_generated_code(tmp_path: Path) -> None:
    if shutil.which("flatc") is None:
        pytest.skip("flatc not on PATH: cannot regenerate the schema code")
    version = subprocess.run(["flatc", "--version"], capture_output=True, text=True).stdout.split()[-1]
    if version != "2.0.8":
        pytest.skip(f"flatc {version} on PATH; the committed code is from flatc 2.0.8")
    subprocess.run(["bash", str(REPO / "scripts" / "regen_schema.sh"), str(tmp_path)], check=True)
    committed = REPO / "mnnllm_core" / "schema" / "MNN"
    fresh = tmp_path / "MNN"
    names = sorted(p.name for p in committed.glob("*.py"))
    assert names == sorted(p.name for p in fresh.glob("*.py"))
    _, mismatch, errors = filecmp.cmpfiles(committed, fresh, names, shallow=False)
    assert not mismatch and not errors
