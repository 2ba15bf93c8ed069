"""The weight formats of MNN 3.6.1's exporter (../shared/models/formats: a tiny llama exported with
`--quant_bit 2/3`, `--sym`, `--quant_block 128` on a 64-wide model, `--embed_bit 8/4 --seperate_embed`),
run by our engine: greedy, the reference length, MNN's three prompts, equal to MNN's memory-normal ids
on cpu (memory normal and low), opencl and vulkan.

Where MNN's runtime reads memory it never wrote, its ids are not a reference, and the tests show why:
- 2/3-bit tied rows: MNN decodes them with its 4-bit routine over 32 bytes of a 16/24-byte buffer.
  A test-only copy of that routine (the 8 bytes after a 24-byte glibc allocation are the next chunk's
  size word, 0x31 at load) gives MNN's q3-b64 prefill logits (to 2e-5) and first ids; the q2 ids
  change from run to run. Our engine
  decodes the rows as the exporter wrote them; MNN's runtime given those rows (as embeddings_bf16.bin)
  gives our ids, so the 2/3-bit layers and lm_head agree.
- `quant_block` 128 on a 64-wide table: MNN reads 64 // 128 = 0 blocks of each row (its ids depend on
  what ran before); ours is a ConfigError naming tie_embeddings.quant_block. With the field set to the
  block its scales hold (64), MNN's runtime and ours agree (including the graph's readType-0 linears).
Formats not in shared (symmetric int4 / int8 embedding files) are made from the shared ones by
re-quantizing the table, with MNN's runtime as the oracle.
Our exporter writes the same formats, and `--hqq` (HQQ-fitted zeros / scales, same layout) and
`--quant-config` (per-linear bits, blocks and symmetry): MNN's runtime on each gives our engine's ids.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from mnnllm_core.errors import ConfigError, FormatError
from mnnllm_core.llm.config import LlmConfig
from mnnllm_core.llm.create import create
from mnnllm_core.llm.disk_embedding import DiskEmbedding
from mnnllm_core.plugins.manager import registry
from mnn_oracle import run_mnn
from paths import SHARED

FORMATS = SHARED / "models" / "formats"
REFERENCE = json.loads((FORMATS / "reference.json").read_text()) if (FORMATS / "reference.json").exists() else {}
MATCHING = ["q4-sym", "q4-emb8-sep", "q4-emb4-sep"]  # MNN's runtime computes these from what it wrote
BACKENDS = [("cpu", "normal"), ("cpu", "low"), ("opencl", "normal"), ("vulkan", "normal")]
GREEDY = {"sampler_type": "greedy", "thread_num": 2}

pytestmark = pytest.mark.skipif(not REFERENCE, reason=f"shared format models missing at {FORMATS}")


def prompts(folder: str) -> list[list[int]]:
    return [p["mnn_prompt_ids"] for p in REFERENCE[folder]["prompts"]]


def expected(folder: str) -> list[list[int]]:
    entry = REFERENCE[folder]
    return [p[entry["reference"]] for p in entry["prompts"]]


def generate(model: Path, ids: list[list[int]], backend: str = "cpu", memory: str = "normal",
             n: int = 24) -> list[list[int]]:
    llm = create(str(model / "config.json"))
    llm.set_config({"backend_type": backend, "memory": memory, **GREEDY})
    llm.load()
    out = []
    for prompt in ids:
        llm.reset()
        out.append(list(llm.generate(prompt, n)))
    return out


def mnn_generate(model: Path, ids: list[list[int]], n: int = 24) -> list[list[int]]:
    return run_mnn(str(model), config={"memory": "normal", **GREEDY}, generate=[(p, n) for p in ids])["generate"]


def writable_copy(folder: str, tmp_path: Path) -> Path:
    target = tmp_path / folder
    shutil.copytree(FORMATS / folder, target)
    for path in target.iterdir():
        path.chmod(0o644)
    return target


def edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text(json.dumps(data))


def available(backend: str) -> None:
    ok, reason = registry().get(backend).is_available()
    if not ok:
        pytest.skip(f"{backend} unavailable: {reason}")


@pytest.mark.parametrize("backend,memory", BACKENDS, ids=[f"{b}-{m}" for b, m in BACKENDS])
@pytest.mark.parametrize("folder", MATCHING)
def test_every_backend_gives_mnns_ids(folder, backend, memory):
    if backend != "cpu":
        available(backend)
    n = len(expected(folder)[0])
    assert generate(FORMATS / folder, prompts(folder), backend, memory, n) == expected(folder)


OTHERS = [("cpu", "low"), ("opencl", "normal"), ("vulkan", "normal")]


@pytest.mark.parametrize("backend,memory", OTHERS, ids=[f"{b}-{m}" for b, m in OTHERS])
@pytest.mark.parametrize("folder", ["q2-b64", "q3-b64"])
def test_2_and_3_bit_models_give_the_ids_of_our_cpu_on_every_backend(folder, backend, memory):
    """MNN's ids for these are no reference (below); the 2/3-bit layers run everywhere as on cpu."""
    if backend != "cpu":
        available(backend)
    ids = prompts(folder)
    assert generate(FORMATS / folder, ids, backend, memory) == generate(FORMATS / folder, ids)


# -- 2- and 3-bit tied rows -----------------------------------------------------------------
def reference_rows(folder: str, tokens: list[int]) -> np.ndarray:
    """The rows in float64, bit by bit from the file (MSB first, (zero, scale) per row): the decoder's oracle."""
    tie = json.loads((FORMATS / folder / "llm_config.json").read_text())["tie_embeddings"]
    bits, hidden = tie["quant_bit"], 64
    data = (FORMATS / folder / "llm.mnn.weight").read_bytes()
    out = []
    for token in tokens:
        row = data[tie["weight_offset"] + token * hidden * bits // 8:][:hidden * bits // 8]
        stream = "".join(f"{byte:08b}" for byte in row)
        codes = [int(stream[i * bits:(i + 1) * bits], 2) for i in range(hidden)]
        zero, scale = np.frombuffer(data, "<f2", 2, tie["alpha_offset"] + token * 4).astype(np.float64)
        out.append([zero + scale * (c - 2 ** (bits - 1)) for c in codes])
    return np.array(out)


@pytest.mark.parametrize("folder", ["q2-b64", "q3-b64"])
def test_2_and_3_bit_tied_rows_decode_as_the_exporter_wrote_them(folder):
    embedding = DiskEmbedding(LlmConfig.from_file(FORMATS / folder / "config.json"))
    tokens = [0, 1, 34519, 49151]
    got = embedding.embedding(tokens)[:, 0]
    np.testing.assert_allclose(got, reference_rows(folder, tokens), rtol=0, atol=1e-6)


@pytest.mark.parametrize("folder", ["q2-b64", "q3-b64"])
def test_mnn_given_our_2_and_3_bit_rows_gives_our_ids(folder, tmp_path):
    """Our decoded rows as embeddings_bf16.bin (tie_embeddings dropped): the layers, lm_head included, agree."""
    model = writable_copy(folder, tmp_path)
    embedding = DiskEmbedding(LlmConfig.from_file(FORMATS / folder / "config.json"))
    table = np.stack([embedding.rows.row(t) for t in range(embedding.vocab)]).astype(np.float32)
    bits = table.view(np.uint32)
    ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2").tofile(model / "embeddings_bf16.bin")
    edit_json(model / "llm_config.json", tie_embeddings=None)
    edit_json(model / "config.json", embedding_file="embeddings_bf16.bin")
    ids = prompts(folder)
    assert generate(model, ids) == mnn_generate(model, ids)


def mnn_4bit_routine_on_3bit_rows(rows):
    """MNN 3.6.1's read of a 3-bit row, for this test only: its 4-bit routine over the 24 row bytes
    and the 8 bytes after them on the heap (glibc's size word of the next chunk, 0x31)."""
    def row(token: int) -> np.ndarray:
        raw = np.zeros(32, np.uint8)
        raw[:24] = rows.file.read(rows.weight_offset + token * 24, 24, op_name="test", field="row")
        raw[24] = 0x31
        zero, scale = rows.file.read(rows.alpha_offset + token * 4, 4, op_name="test", field="alpha").view(
            "<f2").astype(np.float32)
        codes = np.empty(64, np.float32)
        codes[0::2], codes[1::2] = raw >> 4, raw & 15
        return codes * scale + (zero - 4 * scale)
    return row


def test_mnns_q3_ids_come_from_its_4_bit_routine_reading_past_the_row():
    """The prefill's logits (so each prompt's first id) agree; later steps see other heap bytes there."""
    llm = create(str(FORMATS / "q3-b64" / "config.json"))
    llm.set_config({"memory": "normal", **GREEDY})
    llm.load()
    llm.embedding.rows.row = mnn_4bit_routine_on_3bit_rows(llm.embedding.rows)
    got = []
    for prompt in prompts("q3-b64"):
        llm.reset()
        got.append(list(llm.generate(prompt, 1)))
    assert got == [ids[:1] for ids in expected("q3-b64")]


# -- a quant_block that does not divide the width -------------------------------------------
def test_a_quant_block_wider_than_the_row_is_a_config_error_naming_the_field():
    with pytest.raises(ConfigError, match="does not divide hidden_size 64; alpha_size stores 2 values") as err:
        DiskEmbedding(LlmConfig.from_file(FORMATS / "q4-b128" / "config.json"))
    assert err.value.field == "tie_embeddings.quant_block" and err.value.file.endswith("llm_config.json")


def test_q4_b128_with_the_block_its_scales_hold_gives_mnns_ids(tmp_path):
    """quant_block 64 in llm_config: MNN and we agree, the convs whose readType 0 reads the
    (zero, scale) pairs as the scales of two blocks of 32 included."""
    model = writable_copy("q4-b128", tmp_path)
    tie = json.loads((model / "llm_config.json").read_text())["tie_embeddings"]
    edit_json(model / "llm_config.json", tie_embeddings={**tie, "quant_block": 64})
    ids = prompts("q4-b128")
    theirs = mnn_generate(model, ids)
    assert generate(model, ids) == theirs
    assert generate(model, ids, memory="low") == theirs


# -- embedding files --------------------------------------------------------------------------
def test_a_named_embedding_file_that_was_never_written_is_ignored(tmp_path):
    """`--embed_bit` without `--seperate_embed`: config.json names embeddings_int8.bin, the rows are the lm_head's."""
    model = writable_copy("q4-sym", tmp_path)
    edit_json(model / "config.json", embedding_file="embeddings_int8.bin")
    assert generate(model, prompts("q4-sym")) == expected("q4-sym")


def test_weight_offset_0_with_no_embedding_file_is_a_config_error(tmp_path):
    model = writable_copy("q4-emb8-sep", tmp_path)
    (model / "embeddings_int8.bin").unlink()
    with pytest.raises(ConfigError, match="does not exist") as err:
        DiskEmbedding(LlmConfig.from_file(model / "config.json"))
    assert err.value.field == "embedding_file"


def requantize_embedding_file(folder: str, tmp_path: Path, bits: int, symmetric: bool) -> Path:
    """The folder with its int embedding file re-quantized (block 64, fp32 alphas) as the exporter does."""
    model = writable_copy(folder, tmp_path)
    table = np.stack([r for r in DiskEmbedding(LlmConfig.from_file(FORMATS / folder / "config.json")).embedding(
        list(range(49152)))[:, 0]])
    centre = 1 << (bits - 1)
    if symmetric:
        scale = np.abs(table).max(axis=1, keepdims=True) / (centre - 1)
        codes = np.clip(np.round(table / scale), -(centre - 1), centre - 1) + centre
        alpha = scale
    else:
        lo, hi = table.min(axis=1, keepdims=True), table.max(axis=1, keepdims=True)
        scale = (hi - lo) / (2 ** bits - 1)
        codes = np.clip(np.round((table - lo) / scale), 0, 2 ** bits - 1)
        alpha = np.concatenate([lo + scale * centre, scale], axis=1)
    codes = codes.astype(np.uint8)
    packed = codes.reshape(-1) if bits == 8 else (codes[:, 0::2] << 4) | codes[:, 1::2]
    name = f"embeddings_int{bits}.bin"
    for old in model.glob("embeddings_int*.bin"):
        old.unlink()
    with open(model / name, "wb") as f:
        f.write(packed.tobytes())
        f.write(alpha.astype("<f4").tobytes())
    edit_json(model / "config.json", embedding_file=name)
    edit_json(model / "llm_config.json", tie_embeddings={
        "weight_offset": 0, "alpha_offset": packed.size, "alpha_size": alpha.size * 4, "quant_bit": bits,
        "quant_block": 64, "alpha_dtype": "fp32"})
    return model


@pytest.mark.parametrize("bits", [4, 8])
def test_symmetric_int_embedding_files_give_mnns_ids(bits, tmp_path):
    """The held-out `--embed_bit 4|8 --seperate_embed --sym` layout: one fp32 scale per (row, block)."""
    model = requantize_embedding_file("q4-emb4-sep", tmp_path, bits, symmetric=True)
    assert DiskEmbedding(LlmConfig.from_file(model / "config.json")).rows.symmetric
    ids = prompts("q4-emb4-sep")
    assert generate(model, ids, memory="low") == generate(model, ids) == mnn_generate(model, ids)


# -- sizes that contradict the fields ---------------------------------------------------------
def test_an_embedding_file_shorter_than_its_fields_is_a_format_error_naming_file_and_field(tmp_path):
    model = writable_copy("q4-emb8-sep", tmp_path)
    path = model / "embeddings_int8.bin"
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(FormatError, match="run past the end") as err:
        DiskEmbedding(LlmConfig.from_file(model / "config.json"))
    assert err.value.field == "tie_embeddings.alpha_offset" and err.value.file.endswith("embeddings_int8.bin")


@pytest.mark.parametrize("change, field", [({"alpha_size": 393216 - 4}, "tie_embeddings.alpha_size"),
                                           ({"alpha_size": 3 * 196608}, "tie_embeddings.alpha_size"),
                                           ({"alpha_offset": 3145728 - 3}, "tie_embeddings.alpha_offset"),
                                           ({"quant_bit": 5}, "tie_embeddings.quant_bit"),
                                           ({"quant_block": 48}, "tie_embeddings.quant_block"),
                                           ({"alpha_dtype": "bf16"}, "tie_embeddings.alpha_dtype")])
def test_a_field_the_sizes_contradict_is_a_config_error_naming_it(change, field, tmp_path):
    model = writable_copy("q4-emb8-sep", tmp_path)
    tie = json.loads((model / "llm_config.json").read_text())["tie_embeddings"]
    edit_json(model / "llm_config.json", tie_embeddings={**tie, **change})
    with pytest.raises(ConfigError) as err:
        DiskEmbedding(LlmConfig.from_file(model / "config.json"))
    assert err.value.field == field and err.value.file.endswith("llm_config.json")


# -- our exporter: the same formats, MNN's runtime on them = our engine -----------------------

# `--quant-config`: layer 0 at 8 bits, layer 1 at the default 4 but for a 32-block q_proj, a symmetric
# 3-bit up_proj (its readType 0 in a model whose other convs are asymmetric) and an fp16 o_proj; the lm_head
# at 8 bits.
MIXED = {**{f"/layers.0/{p}/Linear": {"bits": 8} for p in ("self_attn/q_proj", "self_attn/k_proj",
                                                            "self_attn/v_proj", "self_attn/o_proj", "mlp/gate_proj",
                                                            "mlp/up_proj", "mlp/down_proj")},
         "/layers.1/self_attn/q_proj/Linear": {"block_size": 32},
         "/layers.1/mlp/up_proj/Linear": {"bits": 3, "symmetric": True},
         "/layers.1/self_attn/o_proj/Linear": {"bits": 16},
         "/lm/lm_head/Linear": {"bits": 8}}
EXPORTS = {  # name: (tied source, export_model keywords)
    "q2-b64-sep": (True, dict(quant_bit=2, quant_block=64, separate_embed=True)),
    "q3-b64-sep": (True, dict(quant_bit=3, quant_block=64, separate_embed=True)),
    "q4-sym": (True, dict(quant_bit=4, quant_block=64, sym=True)),
    "q8-sym": (True, dict(quant_bit=8, quant_block=32, sym=True)),
    "q4-b128": (True, dict(quant_bit=4, quant_block=128)),
    "q4-lm8": (True, dict(quant_bit=4, quant_block=64, lm_quant_bit=8)),
    "q4-emb8-sep": (False, dict(quant_bit=4, quant_block=64, embed_bit=8, separate_embed=True)),
    "q4-emb4-sep-sym": (False, dict(quant_bit=4, quant_block=64, embed_bit=4, separate_embed=True, sym=True)),
    "q4-hqq": (True, dict(quant_bit=4, quant_block=64, hqq=True)),
    "q4-hqq-sym": (True, dict(quant_bit=4, quant_block=64, hqq=True, sym=True)),
    "q3-hqq-sep": (True, dict(quant_bit=3, quant_block=32, hqq=True, separate_embed=True)),
    "q4-emb8-sep-hqq": (False, dict(quant_bit=4, quant_block=64, embed_bit=8, separate_embed=True, hqq=True)),
    "mixed": (True, dict(quant_bit=4, quant_block=64, quant_config=MIXED)),  # written to a file by export()
}


@pytest.fixture(scope="module")
def hf_sources(tmp_path_factory) -> dict[bool, Path]:
    from test_export import random_weights, write_hf_folder
    root = tmp_path_factory.mktemp("hf")
    return {tied: write_hf_folder(root / f"llama-{tied}", "llama", random_weights("llama", tied, 3), tied)
            for tied in (True, False)}


def export(hf_sources, tmp_path: Path, name: str) -> Path:
    from mnnllm_core.export import export_model
    tied, keywords = EXPORTS[name]
    if isinstance(keywords.get("quant_config"), dict):
        (tmp_path / "quant_config.json").write_text(json.dumps(keywords["quant_config"]))
        keywords = {**keywords, "quant_config": str(tmp_path / "quant_config.json")}
    export_model(str(hf_sources[tied]), str(tmp_path / name), **keywords)
    return tmp_path / name


@pytest.mark.oracle
@pytest.mark.parametrize("name", sorted(EXPORTS))
def test_mnns_runtime_on_our_export_gives_our_ids(name, hf_sources, tmp_path):
    from test_export import PROMPT
    model = export(hf_sources, tmp_path, name)
    ids = [PROMPT, [1, 40, 41, 42, 43]]
    theirs = mnn_generate(model, ids, 12)
    assert all(len(t) > 0 for t in theirs)
    assert generate(model, ids, n=12) == theirs
    assert generate(model, ids, memory="low", n=12) == theirs


DEVICE_EXPORTS = [(b, n) for b in ("opencl", "vulkan")
                  for n in ("q3-b64-sep", "q8-sym", "q4-emb4-sep-sym", "q4-hqq-sym", "mixed")]


@pytest.mark.parametrize("backend,name", DEVICE_EXPORTS, ids=[f"{b}-{n}" for b, n in DEVICE_EXPORTS])
def test_device_backends_on_our_exports_give_our_cpu_ids(backend, name, hf_sources, tmp_path):
    from test_export import PROMPT
    available(backend)
    model = export(hf_sources, tmp_path, name)
    ids = [PROMPT, [1, 40, 41, 42, 43]]
    assert generate(model, ids, backend, n=12) == generate(model, ids, n=12)


@pytest.mark.parametrize("name, quant_bit, block, per_block", [
    ("q4-sym", 4, 64, 1), ("q8-sym", 8, 32, 1), ("q4-b128", 4, 64, 2), ("q4-lm8", 8, 64, 2), ("q4-emb8-sep", 8, 64, 2),
    ("q4-emb4-sep-sym", 4, 64, 1)])
def test_our_export_writes_mnns_layout(name, quant_bit, block, per_block, hf_sources, tmp_path):
    """tie_embeddings as MNN's exporter writes it, but with the block the scales hold (q4-b128: 64);
    symmetric convs with readType 0 and aMin 0, asymmetric ones with readType = rows x blocks."""
    from mnnllm_core.schema.reader import read_net_file
    model = export(hf_sources, tmp_path, name)
    tie = json.loads((model / "llm_config.json").read_text())["tie_embeddings"]
    config = json.loads((model / "config.json").read_text())
    vocab = DiskEmbedding(LlmConfig.from_file(model / "config.json")).vocab
    per_value = 4 if tie["alpha_dtype"] == "fp32" else 2
    assert (tie["quant_bit"], tie["quant_block"]) == (quant_bit, block)
    assert tie["alpha_size"] == vocab * (64 // block) * per_block * per_value
    if "emb" in name:
        assert tie["weight_offset"] == 0 and config["embedding_file"] == f"embeddings_int{quant_bit}.bin"
        assert (model / config["embedding_file"]).stat().st_size == tie["alpha_offset"] + tie["alpha_size"]
    convs = [op.main.quanParameter for op in read_net_file(str(model / "llm.mnn")).oplists
             if op.main is not None and getattr(op.main, "quanParameter", None) is not None]
    assert convs
    for quant in convs:
        assert (quant.readType == 0, quant.aMin) == ((True, 0) if "sym" in name else (False, 1))


@pytest.mark.parametrize("bits", [2, 3])
def test_our_2_and_3_bit_tied_export_reads_back_as_quantized(bits, hf_sources, tmp_path):
    """The tied rows hold what the quantizer made of the embedding (MNN's runtime misreads them, see above)."""
    from mnnllm_core.export.weights import quantize_rows
    from test_export import random_weights
    from mnnllm_core.export import export_model
    export_model(str(hf_sources[True]), str(tmp_path / "m"), quant_bit=bits, quant_block=64)
    table = random_weights("llama", True, 3)["model.embed_tokens.weight"]
    codes, alpha = quantize_rows(table, bits, 64)
    alpha = alpha.astype(np.float32)
    want = alpha[:, :, :1] + alpha[:, :, 1:] * (codes.reshape(len(table), 1, 64) - 2.0 ** (bits - 1))
    embedding = DiskEmbedding(LlmConfig.from_file(tmp_path / "m" / "config.json"))
    tokens = list(range(0, len(table), 7))
    np.testing.assert_allclose(embedding.embedding(tokens)[:, 0], want.reshape(len(table), 64)[tokens], atol=1e-6)


def test_the_mixed_export_stores_each_linear_as_its_entry_says(hf_sources, tmp_path):
    """Bits, blocks and symmetry per conv as MIXED asks, the rest at the defaults; tie_embeddings describes
    the 8-bit lm_head."""
    from mnnllm_core.schema.reader import read_net_file
    model = export(hf_sources, tmp_path, "mixed")
    got = {}
    for op in read_net_file(str(model / "llm.mnn")).oplists:
        quant = getattr(op.main, "quanParameter", None) if op.main is not None else None
        if quant is not None:
            name = op.name.decode() if isinstance(op.name, bytes) else op.name
            oc, ic = op.main.common.outputCount, op.main.common.inputCount
            blocks = quant.readType // oc if quant.readType else None
            got[name] = (16, None, None) if quant.type == 3 else (quant.aMaxOrBits, ic // blocks if blocks else None,
                                                                   quant.aMin)
    assert got.pop("/lm/lm_head/Linear") == (8, 64, 1)
    assert got.pop("/layers.1/self_attn/o_proj/Linear") == (16, None, None)
    for name, (bits, block, a_min) in got.items():
        entry = MIXED.get(name, {})
        want_block = None if entry.get("symmetric") else entry.get("block_size", 64 if "down_proj" not in name else 32)
        assert (bits, block, a_min) == (entry.get("bits", 4), want_block, 0 if entry.get("symmetric") else 1), name
    tie = json.loads((model / "llm_config.json").read_text())["tie_embeddings"]
    assert (tie["quant_bit"], tie["quant_block"], tie["alpha_dtype"]) == (8, 64, "fp16")
