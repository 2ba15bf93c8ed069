"""Tuned kernel variants kept per device (`TuningCache`, MNN's mnn_cachefile.bin; runtime hint
"gpu_tuning"): the variants are timed once and the choice written, later caches and later
runtimes read it and time nothing; a corrupt file is ignored with a warning and rewritten; a
forcing hint wins over tuning; and on opencl (pocl) every split gives the reference's outputs,
the tuned one included."""
from __future__ import annotations

import json
import logging
import time

import numpy as np
import pytest

from mnnllm_core.backend_api import TuningCache
from mnnllm_core.errors import ConfigError
from mnnllm_core.plugins.manager import registry
from mnnllm_core.testing import make_module, new_runtime
from test_static_shapes import NormLinearReshape, feeds

OPENCL = pytest.mark.skipif(not registry().get("opencl").is_available()[0], reason="opencl unavailable")


class Timed:
    """A fake kernel: each variant runs in the given seconds; counts its runs."""

    def __init__(self, seconds: dict):
        self.seconds, self.runs = seconds, []

    def __call__(self, variant) -> None:
        self.runs.append(variant)
        deadline = time.perf_counter() + self.seconds[variant]
        while time.perf_counter() < deadline:
            pass


def test_the_fastest_variant_is_stored_once_and_read_by_a_later_cache(tmp_path) -> None:
    path = tmp_path / "tuning.json"
    run = Timed({1: 0.002, 4: 0.0, 16: 0.004})
    cache = TuningCache(path, "dev A", runs=2)
    assert cache.choose("linear 576x576", [1, 4, 16], run) == 4
    assert sorted(run.runs) == [1] * 3 + [4] * 3 + [16] * 3 and cache.tuned == 1
    assert json.loads(path.read_text())["devices"] == {"dev A": {"linear 576x576": 4}}
    assert cache.choose("linear 576x576", [1, 4, 16], run) == 4 and len(run.runs) == 9, "asked again: not timed"
    later = TuningCache(path, "dev A", runs=2)
    never = Timed({})  # any run would raise KeyError
    assert later.choose("linear 576x576", [1, 4, 16], never) == 4 and later.tuned == 0


def test_devices_are_kept_apart_in_one_file_and_a_stale_choice_is_tuned_again(tmp_path) -> None:
    path = tmp_path / "tuning.json"
    TuningCache(path, "dev A", runs=1).choose("p", [1, 4], Timed({1: 0.0, 4: 0.003}))
    TuningCache(path, "dev B", runs=1).choose("p", [1, 4], Timed({1: 0.003, 4: 0.0}))
    assert json.loads(path.read_text())["devices"] == {"dev A": {"p": 1}, "dev B": {"p": 4}}
    run = Timed({8: 0.0, 4: 0.002})
    assert TuningCache(path, "dev A", runs=1).choose("p", [4, 8], run) == 8 and run.runs, "1 is no longer offered"


@pytest.mark.parametrize("content", [b"{not json", b"\xff\xfe", b'{"format": 99, "devices": {}}',
                                     b'{"format": 1, "devices": [1]}', b"[]"])
def test_a_corrupt_file_is_ignored_with_a_warning_and_rewritten(tmp_path, caplog, content: bytes) -> None:
    path = tmp_path / "tuning.json"
    path.write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="mnnllm_core.core.tuning_cache"):
        cache = TuningCache(path, "dev A", runs=1)
    assert "corrupt" in caplog.text and str(path) in caplog.text
    assert cache.choose("p", [1, 4], Timed({1: 0.0, 4: 0.002})) == 1
    assert json.loads(path.read_text()) == {"format": 1, "devices": {"dev A": {"p": 1}}}
    assert [p.name for p in tmp_path.iterdir()] == ["tuning.json"], "no staging file left beside"


def test_a_cache_that_is_a_folder_is_read_as_empty_and_an_unwritable_one_only_warns(tmp_path, caplog) -> None:
    path = tmp_path / "tuning.json"
    path.mkdir()
    with caplog.at_level(logging.WARNING, logger="mnnllm_core.core.tuning_cache"):
        assert TuningCache(path, "dev A", runs=1).choose("p", [1, 4], Timed({1: 0.0, 4: 0.002})) == 1
    assert "cannot be written" in caplog.text


def test_gpu_tuning_takes_mnns_levels_and_none_means_no_cache(tmp_path) -> None:
    assert TuningCache.from_hints({}, "d") is None
    assert TuningCache.from_hints({"gpu_tuning": "none"}, "d") is None
    cache = TuningCache.from_hints({"gpu_tuning": "heavy", "tmp_path": str(tmp_path)}, "d")
    assert cache.path == tmp_path / "tuning.json" and cache.runs == 15
    with pytest.raises(ConfigError, match="gpu_tuning"):
        TuningCache.from_hints({"gpu_tuning": "max"}, "d")


# ------------------------------------------------------------------ opencl's linear split

def _opencl_module(tmp_path, **hints):
    graph = NormLinearReshape()
    runtime = new_runtime("opencl", hints={"tmp_path": str(tmp_path), **hints})
    return graph, make_module(graph.info, runtime, shape_mutable=False)


def _linear_split(module) -> int:
    [linear] = [c.execution for c in module.session.pipeline.commands if c.op.type == "Convolution"]
    local = linear.program.local_size
    return 1 if local is None else local[0]


@OPENCL
def test_opencl_tunes_each_linear_shape_once_and_a_later_runtime_reads_the_choice(tmp_path) -> None:
    graph, module = _opencl_module(tmp_path, gpu_tuning="fast")
    for seq in (1, 9, 1, 9):
        inputs = feeds(seq)
        np.testing.assert_allclose(module.forward(inputs)[0], graph.reference(inputs["x"], inputs["dims"]),
                                   rtol=1e-5, atol=1e-4)
    runtime = module.session.pipeline.backend.runtime
    assert runtime.tuning.tuned == 2, "decode (1 row) and prefill (9 rows), each once"
    [(device, choices)] = json.loads((tmp_path / "tuning.json").read_text())["devices"].items()
    assert device == runtime.device.tuning_key and len(choices) == 2
    assert _linear_split(module) == choices[next(k for k in choices if "rows=9" in k)]
    _, later = _opencl_module(tmp_path, gpu_tuning="fast")
    later.forward(feeds(1))
    assert later.session.pipeline.backend.runtime.tuning.tuned == 0
    assert _linear_split(later) == choices[next(k for k in choices if "rows=1" in k)]


@OPENCL
def test_opencl_a_forced_split_wins_over_tuning_and_writes_nothing(tmp_path) -> None:
    _, module = _opencl_module(tmp_path, gpu_tuning="fast", opencl_linear_split=4)
    module.forward(feeds(3))
    assert _linear_split(module) == 4
    assert not (tmp_path / "tuning.json").exists()


@OPENCL
@pytest.mark.parametrize("seq", [1, 9])
def test_opencl_every_split_gives_the_same_outputs(tmp_path, seq: int) -> None:
    graph, module = _opencl_module(tmp_path, opencl_linear_split=1)
    runtime = module.session.pipeline.backend.runtime
    inputs = feeds(seq)
    outputs = {}
    for split in (1, 4, 16, 64):  # the same packed weights, each split's kernel bound at a resize
        runtime.linear_split = split
        module.forward(feeds(seq + 1))
        outputs[split] = module.forward(inputs)[0]
        assert _linear_split(module) == split
    reference = graph.reference(inputs["x"], inputs["dims"])
    for split, out in outputs.items():
        np.testing.assert_allclose(out, reference, rtol=1e-5, atol=1e-4, err_msg=f"split {split}")
        np.testing.assert_allclose(out, outputs[1], rtol=1e-6, atol=1e-5, err_msg=f"split {split} vs 1")


# ------------------------------------------------------------------ vulkan's decode kernel per 4-bit shape

VULKAN = pytest.mark.skipif(not registry().get("vulkan").is_available()[0], reason="vulkan unavailable")


def _vulkan_q4_linear(tmp_path, oc: int = 70, ic: int = 128, **hints):
    """A 4-bit linear layer (block 64) alone on vulkan, its reference, and its module."""
    from mnnllm_core.backend_api import ConvolutionWeights
    from mnnllm_core.testing import Weights, one_op_graph
    from mnnllm_core.testing.cases.linear import linear_op
    from mnnllm_core.testing.references import linear_reference, quantize
    rng = np.random.default_rng(5)
    weight, dense = quantize(rng.standard_normal((oc, ic)).astype(np.float32), 4, 64)
    x = rng.standard_normal((1, ic, 1, 1)).astype(np.float32)
    info, inputs = one_op_graph(linear_op(oc, ic, Weights(conv=ConvolutionWeights(weight, None))), [x])
    runtime = new_runtime("vulkan", hints={"tmp_path": str(tmp_path), **hints})
    return make_module(info, runtime, shape_mutable=False), inputs, linear_reference(x, dense, None)


def _vulkan_variant(module) -> str:
    [linear] = [c.execution for c in module.session.pipeline.commands if c.op.type == "Convolution"]
    return linear.packed.variant


@VULKAN
def test_vulkan_tunes_each_4bit_shape_once_on_its_weights_and_a_later_runtime_reads_the_choice(tmp_path) -> None:
    module, inputs, reference = _vulkan_q4_linear(tmp_path, gpu_tuning="fast")
    np.testing.assert_allclose(module.forward(inputs)[0].reshape(reference.shape), reference, rtol=1e-5, atol=1e-4)
    runtime = module.session.pipeline.backend.runtime
    assert runtime.tuning.tuned == 1
    [(device, choices)] = json.loads((tmp_path / "tuning.json").read_text())["devices"].items()
    assert device == runtime.device.tuning_key
    assert choices == {"linear q4 70x128 block 64": _vulkan_variant(module)}
    assert _vulkan_variant(module) in ("texel", "group", "lanes")
    later, _, _ = _vulkan_q4_linear(tmp_path, gpu_tuning="fast")
    later.forward(inputs)
    assert later.session.pipeline.backend.runtime.tuning.tuned == 0 and _vulkan_variant(later) == _vulkan_variant(module)


@VULKAN
@pytest.mark.parametrize("variant", ["texel", "group", "lanes"])
def test_vulkan_a_forced_decode_kernel_wins_over_tuning_and_writes_nothing(tmp_path, variant: str) -> None:
    module, inputs, reference = _vulkan_q4_linear(tmp_path, gpu_tuning="fast", vulkan_linear=variant)
    np.testing.assert_allclose(module.forward(inputs)[0].reshape(reference.shape), reference, rtol=1e-5, atol=1e-4)
    assert _vulkan_variant(module) == variant
    assert not (tmp_path / "tuning.json").exists()
