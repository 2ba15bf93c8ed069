"""Descriptor sets on vulkan stay bounded: a Program replaced by a resize, a re-record or a
dropped clone gives its set back to the device, and the next Program of that pipeline reuses
it, so a long chat with many resizes never grows the descriptor pools (each holds
DESCRIPTOR_POOL_SETS sets; before, every resize took new ones for good)."""
from __future__ import annotations

import gc

import numpy as np
import pytest

from mnnllm_core.plugins.manager import registry
from mnnllm_core.testing import make_module, new_runtime
from test_static_shapes import NormLinearReshape, feeds

pytestmark = pytest.mark.skipif(not registry().get("vulkan").is_available()[0], reason="vulkan unavailable")

SEQS = (3, 1, 37, 5, 1, 2, 9)


def _device(module):
    return module.session.pipeline.backend.device


@pytest.mark.parametrize("replay", [True, False])
def test_many_resizes_keep_the_live_and_allocated_descriptor_sets_bounded(replay: bool) -> None:
    graph = NormLinearReshape()
    module = make_module(graph.info, new_runtime("vulkan", hints={"replay": replay}), shape_mutable=False)
    device = _device(module)
    live, allocated = [], []
    for round_ in range(12):
        for seq in SEQS:
            inputs = feeds(seq)
            out = module.forward(inputs)[0]
            np.testing.assert_allclose(out, graph.reference(inputs["x"], inputs["dims"]), rtol=1e-5, atol=1e-4)
        gc.collect()
        live.append(device.live_sets)
        allocated.append(device.allocated_sets)
    assert module.resize_count == 12 * len(SEQS)
    assert max(live[1:]) <= live[0], live
    assert allocated[-1] == allocated[1], f"the pools grew with the resizes: {allocated}"


def test_a_dropped_clone_gives_its_descriptor_sets_back() -> None:
    graph = NormLinearReshape()
    module = make_module(graph.info, new_runtime("vulkan"), shape_mutable=False)
    module.forward(feeds(4))
    device = _device(module)
    gc.collect()
    before, allocated = device.live_sets, device.allocated_sets
    for _ in range(20):
        clone = module.clone()
        inputs = feeds(6)
        np.testing.assert_allclose(clone.forward(inputs)[0], graph.reference(inputs["x"], inputs["dims"]),
                                   rtol=1e-5, atol=1e-4)
        del clone
        gc.collect()
        assert device.live_sets == before
    assert device.allocated_sets <= allocated + 8, "each clone reused the sets of the one before"
