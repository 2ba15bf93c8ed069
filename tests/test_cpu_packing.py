"""Packing a quantized weight into the cpu layout in spans on threads (`layout.pack` with a
spread) gives the bytes of the whole-weight reference: the codes of one span, the alphas of
numpy's exactness test and transpose (`layout._alpha`), for every weight kind the kernels take."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba")

from mnnllm_backends.cpu.host_threads import HostThreads  # noqa: E402
from mnnllm_backends.cpu.kernels import layout  # noqa: E402
from test_cpu_low_memory import WEIGHTS, quantized  # noqa: E402

FINITE_HALVES = (lambda h: h[np.isfinite(h)].astype(np.float32))(np.arange(1 << 16, dtype=np.uint16).view(np.float16))


def same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("case", WEIGHTS)
def test_packing_in_spans_on_two_threads_gives_the_reference_bytes(case, monkeypatch):
    weight = quantized(**WEIGHTS[case])
    monkeypatch.setattr(layout, "SPAN_BYTES", 1 << 40)
    whole = layout.pack(weight)  # one span: the codes as one call of the kernel lays them out
    monkeypatch.setattr(layout, "SPAN_BYTES", 1)  # a span per group, taken by either thread
    spread = layout.pack(weight, HostThreads(2).run)
    assert len(layout._spans(spread.groups, spread.codes.nbytes)) == spread.groups
    assert same_bytes(spread.codes, whole.codes)
    reference = layout._alpha(weight.zero, weight.scale, whole.groups)
    assert same_bytes(whole.alpha, reference) and same_bytes(spread.alpha, reference)
    assert (spread.bits, spread.oc, spread.ic, spread.block) == (whole.bits, whole.oc, whole.ic, whole.block)


def test_every_finite_fp16_value_packs_to_numpys_fp16_bits():
    values = np.concatenate([FINITE_HALVES, np.zeros(64 - FINITE_HALVES.size % 64, np.float32)]).reshape(-1, 64)
    zero, scale = values, values[::-1].copy()
    out = np.empty(-(-values.shape[0] // 32) * 32 * 64 * 2, np.uint16)
    assert layout.interleave_half_alpha(layout._float_bits(zero), layout._float_bits(scale), out)
    assert same_bytes(out, layout._alpha(zero, scale, out.size // (32 * 64 * 2)))


def test_a_value_that_is_not_exactly_an_fp16_is_refused():
    halves = FINITE_HALVES[FINITE_HALVES != 0]
    tiny = np.float32(2.0 ** -24)  # fp16's least subnormal
    inexact = np.concatenate([np.nextafter(halves, np.float32(np.inf)), np.nextafter(halves, np.float32(0)),
                              [tiny / 2, tiny * 1.5, np.float32(65520), np.float32(1e-40), np.float32(-1e-45),
                               np.float32(np.inf), np.float32(-np.inf), np.float32(np.nan)]]).astype(np.float32)
    out, fine = np.empty(2 * 32, np.uint16), np.zeros((1, 1), np.uint32)
    for value in inexact:
        bits = layout._float_bits(np.full((1, 1), value, np.float32))
        assert not layout.interleave_half_alpha(bits, fine, out), value
        assert not layout.interleave_half_alpha(fine, bits, out), value


@pytest.mark.parametrize("bad", [np.nan, np.inf, 1e-5])
def test_alphas_that_are_not_all_fp16_take_the_reference_way(bad):
    weight = quantized(70, 128, 4, 64)
    weight.scale[69, 1] = bad
    packed = layout.pack(weight, HostThreads(2).run)
    assert same_bytes(packed.alpha, layout._alpha(weight.zero, weight.scale, packed.groups))
    assert packed.alpha.dtype == (np.uint16 if bad != 1e-5 else np.float32)
