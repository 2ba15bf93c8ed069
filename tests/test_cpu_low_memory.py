"""The cpu backend's memory "low" path: packed weights and numba kernels, each against the
numpy/float64 reference on odd shapes (int4 and int8 codes, block and per-channel alphas,
re-coded bit widths and value maps), and the shared model's greedy tokens against MNN's."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("numba")

from mnnllm_backends.cpu.kernels import activation, attention, linear, norm, rope, row_reduce  # noqa: E402
from mnnllm_backends.cpu.kernels.exp import exp32  # noqa: E402
from mnnllm_backends.cpu.kernels.layout import dequantize as layout_dequantize  # noqa: E402
from mnnllm_backends.cpu.kernels.layout import pack  # noqa: E402
from mnnllm_backends.cpu.ops.norm import normalize  # noqa: E402
from mnnllm_backends.cpu.ops.rope import rotate  # noqa: E402
from mnnllm_core.core.weights.formats import QuantizedWeight  # noqa: E402
from paths import CONFIG, REFERENCE  # noqa: E402

PROMPTS = json.loads(REFERENCE.read_text())["prompts"]
RNG = np.random.default_rng(7)


def quantized(oc: int, ic: int, bits: int, block: int, *, value_map: bool = False, exact_alpha: bool = True,
              symmetric: bool = False) -> QuantizedWeight:
    """A random weight in MNN's layout: codes packed most significant bit first, fp16-exact alphas."""
    n_blocks = ic // block
    count = (1 << bits) - (3 if value_map else 0)
    codes = RNG.integers(0, count, oc * ic).astype(np.uint8)
    packed = np.packbits(np.unpackbits(codes[:, None], axis=1)[:, 8 - bits:].reshape(-1))
    zero = (RNG.standard_normal((oc, n_blocks)) * 0.1).astype(np.float16).astype(np.float32)
    scale = (RNG.random((oc, n_blocks)) * 0.02 + 0.001).astype(np.float16).astype(np.float32)
    if not exact_alpha:
        zero = zero + np.float32(1e-5)  # no longer fp16 values: stored as float32
    if symmetric:
        zero = np.zeros_like(zero)
    table = np.sort(RNG.choice(np.arange(-128, 128), count, replace=False)).astype(np.int8) if value_map else None
    return QuantizedWeight(bits, block, oc, ic, packed, zero, scale, value_map=table)


WEIGHTS = {
    "int4 block 32": dict(oc=45, ic=96, bits=4, block=32),
    "int4 per channel": dict(oc=33, ic=80, bits=4, block=80),
    "int4 block 64, 3 groups": dict(oc=70, ic=128, bits=4, block=64),
    "int8 block 16": dict(oc=37, ic=48, bits=8, block=16),
    "int8 per channel": dict(oc=31, ic=40, bits=8, block=40),
    "int3 as int4": dict(oc=29, ic=48, bits=3, block=16),
    "int2 as int4": dict(oc=45, ic=128, bits=2, block=64),
    "int3 odd block recoded to int8": dict(oc=9, ic=24, bits=3, block=3),
    "int4 symmetric": dict(oc=40, ic=64, bits=4, block=32, symmetric=True),
    "int8 symmetric": dict(oc=21, ic=64, bits=8, block=64, symmetric=True),
    "int4 odd ic recoded to int8": dict(oc=17, ic=35, bits=4, block=35),
    "int4 value map recoded to int8": dict(oc=40, ic=64, bits=4, block=32, value_map=True),
    "int4 float32 alphas": dict(oc=40, ic=64, bits=4, block=32, exact_alpha=False),
}


def reference(weight: QuantizedWeight) -> np.ndarray:
    return weight.dequantize().astype(np.float64)


def assert_product_close(actual: np.ndarray, w: np.ndarray, x: np.ndarray) -> None:
    """Within fp32 accumulation error of |W| |x| (the products' magnitudes), against float64."""
    expected = x @ w.T
    bound = 2e-6 * (np.abs(x) @ np.abs(w).T) + 1e-30
    assert np.all(np.abs(actual - expected) <= bound), np.max(np.abs(actual - expected) / bound)


@pytest.mark.parametrize("case", WEIGHTS)
def test_packed_layout_holds_exactly_the_reference_weights(case):
    weight = quantized(**WEIGHTS[case])
    packed = pack(weight)
    assert packed.bits == (4 if case.startswith(("int4 block", "int4 per", "int4 float", "int4 sym")) or "as int4" in case
                           else 8)
    assert packed.alpha.dtype == (np.float32 if "float32" in case else np.uint16)
    assert np.array_equal(layout_dequantize(packed), weight.dequantize())
    assert np.array_equal(linear.dequantize(packed), weight.dequantize())  # the GEMM's panels


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", WEIGHTS)
def test_gemv_matches_float64(case, threads):
    weight = quantized(**WEIGHTS[case])
    x = RNG.standard_normal(weight.ic).astype(np.float32)
    gemv = linear.Gemv([pack(weight)])
    gemv.parallel_worth = True
    result = gemv(x, threads)[0]
    assert result.shape[0] % 32 == 0 and np.all(result[weight.oc:] == 0)  # padding rows
    assert_product_close(result[:weight.oc], reference(weight), x.astype(np.float64))


@pytest.mark.parametrize("half", [True, False])
def test_two_groups_at_once_give_each_groups_bits(half):
    """`q4_group_pair_dot` (what the GEMV runs at 16 lanes) against `q4_group_dot` group by group."""
    from numba import njit

    from mnnllm_backends.cpu.kernels.simd import GROUP_ROWS, q4_group_dot, q4_group_pair_dot

    @njit
    def run(codes, alpha, xe, xo, xs, out, n_blocks, block, groups, paired):
        group_bytes = xe.shape[0] * GROUP_ROWS
        for g in range(0, groups, 2 if paired else 1):
            if paired:
                q4_group_pair_dot(codes, g * group_bytes, alpha, g * n_blocks * 2 * GROUP_ROWS, xe, xo, xs, n_blocks,
                                  block // 2, out, g * GROUP_ROWS)
            else:
                q4_group_dot(codes, g * group_bytes, alpha, g * n_blocks * 2 * GROUP_ROWS, xe, xo, xs, n_blocks,
                             block // 2, out, g * GROUP_ROWS)

    oc, ic, block = 192, 256, 64
    n_blocks = ic // block
    codes = RNG.integers(0, 256, oc * ic // 2, dtype=np.uint8)
    alpha = RNG.standard_normal(oc // GROUP_ROWS * n_blocks * 2 * GROUP_ROWS).astype(np.float32)
    alpha = alpha.astype(np.float16).view(np.uint16) if half else alpha
    xe, xo = (RNG.standard_normal(ic // 2).astype(np.float32) for _ in range(2))
    xs = RNG.standard_normal(n_blocks).astype(np.float32)
    one, two = np.zeros(oc, np.float32), np.zeros(oc, np.float32)
    run(codes, alpha, xe, xo, xs, one, n_blocks, block, oc // GROUP_ROWS, False)
    run(codes, alpha, xe, xo, xs, two, n_blocks, block, oc // GROUP_ROWS, True)
    assert np.any(one != 0) and np.array_equal(one.view(np.int32), two.view(np.int32))


def test_one_gemv_over_three_members_equals_each_alone():
    weights = [pack(quantized(oc, 96, 4, 32)) for oc in (45, 20, 33)]
    x = RNG.standard_normal(96).astype(np.float32)
    together = linear.Gemv(weights)(x, 2)
    for weight, result in zip(weights, together):
        assert np.array_equal(result, linear.Gemv([weight])(x, 1)[0])
    with pytest.raises(ValueError):
        linear.Gemv([weights[0], pack(quantized(32, 48, 8, 16))])


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("tokens", [5, 13])
@pytest.mark.parametrize("case", ["int4 block 32", "int4 per channel", "int8 block 16", "int4 float32 alphas",
                                  "int3 as int4", "int2 as int4"])
def test_matmul_on_dequantized_panels_matches_float64(case, tokens, threads):
    weight = quantized(**WEIGHTS[case])
    x = RNG.standard_normal((tokens, weight.ic)).astype(np.float32)
    out = np.empty((tokens, weight.oc), np.float32)
    linear.matmul(pack(weight), x, out, threads)
    assert_product_close(out, reference(weight), x.astype(np.float64))


@pytest.mark.parametrize("threads", [2, 3])
def test_matmul_spans_on_threads_give_the_serial_bits(threads):
    """`matmul` with threads runs a span of groups a thread: each group by the serial code (called
    by address), so the same bits; a last group of fewer rows too."""
    weight = pack(quantized(oc=7 * 32 + 5, ic=128, bits=4, block=64))
    x = RNG.standard_normal((11, 128)).astype(np.float32)
    serial, shared = (np.full((11, weight.oc), np.nan, np.float32) for _ in range(2))
    linear.matmul(weight, x, serial, 1)
    linear.matmul(weight, x, shared, threads)
    assert np.array_equal(shared, serial)


def test_matmul_with_an_inner_dimension_over_one_depth_block():
    weight = quantized(40, 2 * linear.DEPTH + 64, 4, 64)
    x = RNG.standard_normal((7, weight.ic)).astype(np.float32)
    out = np.empty((7, 40), np.float32)
    linear.matmul(pack(weight), x, out, 2)
    assert_product_close(out, reference(weight), x.astype(np.float64))


def test_matmul_walking_rows_first_gives_the_depth_first_bits():
    """From ROWS_FIRST_FROM inputs a group's product loops over rows outside the depth blocks: the
    same partial sums added in the same order as the depth-first loop (written out here), so the
    same bits, and within the float64 bound."""
    from mnnllm_backends.cpu.kernels import jit
    from mnnllm_backends.cpu.kernels.gemm import GEMM_ROWS, gemm_columns

    @jit()
    def depth_first(packed_codes, alpha, n_blocks, block, x, out, ic, groups):
        panel = np.empty(ic * 32, np.float32)
        flat_x, flat_out, stride = x.reshape(-1), out.reshape(-1), np.int64(32)
        for g in range(groups):
            linear._dequantize(4, packed_codes, alpha, n_blocks, block, g, g + 1, panel, g, 32)
            for k0 in range(0, ic, linear.DEPTH):
                for m0 in range(0, x.shape[0], GEMM_ROWS):
                    gemm_columns(min(GEMM_ROWS, x.shape[0] - m0), flat_x, m0 * ic + k0, ic, panel, k0 * 32, stride,
                                 min(linear.DEPTH, ic - k0), flat_out, m0 * out.shape[1] + g * 32, out.shape[1],
                                 stride, k0 > 0)

    weight = quantized(64, linear.ROWS_FIRST_FROM + 2 * 64, 4, 64)
    packed = pack(weight)
    x = RNG.standard_normal((13, weight.ic)).astype(np.float32)
    out, expected = np.empty((13, 64), np.float32), np.empty((13, 64), np.float32)
    linear.matmul(packed, x, out, 1)
    depth_first(packed.codes, packed.alpha, packed.n_blocks, packed.block, x, expected, packed.ic, packed.groups)
    assert np.array_equal(out.view(np.uint32), expected.view(np.uint32))
    assert_product_close(out, reference(weight), x.astype(np.float64))


def test_gemm_core_gives_the_same_bits_at_8_and_16_lanes():
    """The GEMM core's lanes run over C's columns, so each element is one chain of FMAs over k at
    any width: the 16-lane (zmm) core this machine may pick and the 8-lane one agree bit for bit,
    the 6 x 32 block and 6 x 16 block alike, overwriting C and adding to it."""
    from mnnllm_backends.cpu.kernels import jit
    from mnnllm_backends.cpu.kernels.gemm import gemm_rows

    cores = {(lanes, columns): gemm_rows(6, columns // lanes, lanes) for lanes in (8, 16) for columns in (16, 32)}

    def runner(core, columns):
        @jit()
        def run(a, b, c, depth, accumulate):
            for m0 in range(0, a.shape[0] // depth, 6):
                for n0 in range(0, 64, columns):
                    core(a, m0 * depth, depth, b, n0, 64, depth, c, m0 * 64 + n0, 64, accumulate)
        return run

    depth = 300
    a = RNG.standard_normal(12 * depth).astype(np.float32)
    b = RNG.standard_normal(depth * 64).astype(np.float32)
    start = RNG.standard_normal(12 * 64).astype(np.float32)
    expected = start.astype(np.float64).reshape(12, 64) + a.reshape(12, depth).astype(np.float64) @ b.reshape(depth, 64)
    results = {}
    for (lanes, columns), core in cores.items():
        c = start.copy()
        runner(core, columns)(a, b, c, depth, np.bool_(True))
        results[lanes, columns] = c.view(np.uint32)
        assert np.allclose(c.reshape(12, 64), expected, rtol=0, atol=1e-4)
        runner(core, columns)(a, b, c, depth, np.bool_(False))
        assert np.allclose(c.reshape(12, 64), expected - start.reshape(12, 64), rtol=0, atol=1e-4)
    first = results[8, 16]
    assert all(np.array_equal(first, bits) for bits in results.values())


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6])
def test_gemm_columns_wider_blocks_for_few_rows_give_the_16_column_blocks_bits(rows):
    """A decode step's attention has a row or a few per kv head; gemm_columns gives them blocks
    of up to 128 columns (`FEW_COLUMNS`, and half that) so that more chains of FMAs run at once.
    Each element stays one chain over k: the bits are those of the 16-column core block by block,
    for every width the blocks split into, overwriting C and adding to it."""
    from mnnllm_backends.cpu.kernels import jit
    from mnnllm_backends.cpu.kernels.gemm import FEW_COLUMNS, gemm_block, gemm_columns

    @jit()
    def by_columns(rows, a, b, c, depth, ldb, columns, accumulate):
        gemm_columns(rows, a, 0, depth, b, 0, ldb, depth, c, 0, ldb, columns, accumulate)

    @jit()
    def by_16(rows, a, b, c, depth, ldb, columns, accumulate):
        for n0 in range(0, columns, 16):
            gemm_block(rows, a, 0, depth, b, n0, ldb, depth, c, n0, ldb, accumulate)

    assert all(width % 16 == 0 for width in FEW_COLUMNS)
    depth, ldb = 77, 240
    a = RNG.standard_normal(rows * depth).astype(np.float32)
    b = RNG.standard_normal(depth * ldb).astype(np.float32)
    start = RNG.standard_normal(rows * ldb).astype(np.float32)
    for columns in (16, 48, 64, 80, 128, 144, 208, 240):
        for accumulate in (np.bool_(False), np.bool_(True)):
            wide, narrow = start.copy(), start.copy()
            by_columns(rows, a, b, wide, depth, ldb, columns, accumulate)
            by_16(rows, a, b, narrow, depth, ldb, columns, accumulate)
            assert np.array_equal(wide.view(np.uint32), narrow.view(np.uint32)), (columns, accumulate)
            expected = (a.reshape(rows, depth).astype(np.float64) @ b.reshape(depth, ldb)[:, :columns]
                        + (start.reshape(rows, ldb)[:, :columns] if accumulate else 0))
            assert np.allclose(wide.reshape(rows, ldb)[:, :columns], expected, rtol=0, atol=1e-4)
            assert np.array_equal(wide.reshape(rows, ldb)[:, columns:], start.reshape(rows, ldb)[:, columns:])


def attention_reference(q, keys, values, past, scale, sinks=None):
    """float64; a head's sink logit (when given) adds exp(sink) to its softmax denominator."""
    tokens, heads, dim = q.shape
    group = heads // keys.shape[0]
    out = np.zeros(q.shape)
    for t in range(tokens):
        for h in range(heads):
            visible = past + t + 1
            s = keys[h // group, :visible].astype(np.float64) @ q[t, h] * scale
            top = s.max() if sinks is None else max(s.max(), float(sinks[h]))
            p = np.exp(s - top)
            total = p.sum() + (0.0 if sinks is None else np.exp(float(sinks[h]) - top))
            out[t, h] = (p / total) @ values[h // group, :visible]
    return out


@pytest.mark.parametrize("with_sinks", [False, True])
@pytest.mark.parametrize("tokens, past, heads, kv_heads, dim", [
    (1, 0, 9, 3, 64), (1, 70, 9, 3, 64), (5, 17, 4, 2, 32), (37, 0, 6, 3, 16), (100, 29, 4, 1, 48),
    (1, 150, 4, 4, 64), (1, 200, 8, 2, 128)])
def test_attention_kernels_match_float64(tokens, past, heads, kv_heads, dim, with_sinks):
    capacity = -(-(past + tokens) // 16) * 16 + 16
    keys = RNG.standard_normal((kv_heads, capacity, dim)).astype(np.float32)
    values = RNG.standard_normal((kv_heads, capacity, dim)).astype(np.float32)
    q = RNG.standard_normal((tokens, heads, dim)).astype(np.float32)
    sinks = (RNG.standard_normal(heads) * 2).astype(np.float32) if with_sinks else np.zeros(0, np.float32)
    expected = attention_reference(q, keys, values, past, 0.2, sinks if with_sinks else None)
    keys_t = np.ascontiguousarray(keys.transpose(0, 2, 1))
    out = np.full_like(q, np.nan)
    attention.attend(q, keys_t, values, past, np.float32(0.2), sinks, out)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    for threads in (2, 3):  # a prompt's tasks shared by threads: attend's bits
        shared = np.full_like(q, np.nan)
        attention.attend_parallel(q, keys_t, values, past, np.float32(0.2), sinks, shared, threads)
        assert np.array_equal(shared, out)


@pytest.mark.parametrize("count", [0, 1, 7, 8, 9, 300, 1000])
def test_the_softmax_sum_has_its_documented_order(count):
    """`row_reduce.ordered_sum`: element i into chain i % 8, the chains pairwise, then the tail in order,
    whatever LLVM does with its callers (fastmath off); the softmax normalizes by it."""
    values = (RNG.standard_normal(count + 5) * 10).astype(np.float32)
    start, first = 3, np.float32(0.25)
    row = values[start:start + count]
    whole = count // 8 * 8
    chains = [np.float32(0.0)] * 8
    for i in range(whole):
        chains[i % 8] = np.float32(chains[i % 8] + row[i])
    tail = np.float32(0.0)
    for value in row[whole:]:
        tail = np.float32(tail + value)
    c = chains
    tree = np.float32(np.float32(np.float32(c[0] + c[1]) + np.float32(c[2] + c[3]))
                      + np.float32(np.float32(c[4] + c[5]) + np.float32(c[6] + c[7])))
    expected = np.float32(first + np.float32(tree + tail))
    got = row_reduce.ordered_sum(values, np.uint64(start), count, first)
    assert np.float32(got).view(np.uint32) == expected.view(np.uint32)
    scores = np.concatenate([row, np.full(16, 5.0, np.float32)])
    attention._softmax(scores, 0, count, count + 16, False, np.float32(0.0))
    if count:
        exps = np.exp(row.astype(np.float64) - row.max())
        np.testing.assert_allclose(scores[:count], exps / exps.sum(), rtol=1e-5, atol=1e-7)
    assert not scores[count:].any()  # the columns past the visible ones are zeroed


@pytest.mark.parametrize("count", [1, 7, 8, 9, 17, 300])
def test_the_softmax_row_max_is_the_rows_max(count):
    values = (RNG.standard_normal(count + 4) * 10).astype(np.float32)
    values[2 + count // 2] = -np.inf
    row = values[2:2 + count]
    assert row_reduce.row_max(values, np.uint64(2), count) == row.max()
    values[2 + count - 1] = np.float32(1e30)  # in the tail past the last 8, or a chain's last
    assert row_reduce.row_max(values, np.uint64(2), count) == np.float32(1e30)


@pytest.mark.parametrize("rms", [True, False])
@pytest.mark.parametrize("with_beta", [True, False])
def test_norm_kernels_match_the_reference(rms, with_beta):
    rows, n = 3, 77
    a, b = (RNG.standard_normal(rows * n).astype(np.float32) for _ in range(2))
    gamma = RNG.standard_normal(n).astype(np.float32)
    beta = RNG.standard_normal(n).astype(np.float32) if with_beta else np.zeros(0, np.float32)
    expected = normalize((a + b).astype(np.float64).reshape(rows, n), gamma, beta if with_beta else None, 1e-5, rms)
    total, out = np.empty_like(a), np.empty_like(a)
    norm.add_normalize_rows(a, b, n, gamma, beta, 1e-5, rms, total, out)
    assert np.array_equal(total, a + b)
    np.testing.assert_allclose(out.reshape(rows, n), expected, rtol=2e-5, atol=2e-5)
    # the buffers a step shares (output 0 in input 0's storage) take loops of their own: the same bits
    shared, shared_out = a.copy(), np.empty_like(a)
    norm.add_normalize_rows(shared, b, n, gamma, beta, 1e-5, rms, shared, shared_out)
    assert np.array_equal(shared.view(np.int32), total.view(np.int32))
    assert np.array_equal(shared_out.view(np.int32), out.view(np.int32))
    norm.normalize_rows(shared, n, gamma, beta, 1e-5, rms, shared)
    assert np.array_equal(shared.view(np.int32), out.view(np.int32))


@pytest.mark.parametrize("with_norm", [False, True])
def test_rope_kernel_matches_the_reference(with_norm):
    tokens, heads, kv_heads, dim, rope_dim = 3, 4, 2, 16, 12
    q = RNG.standard_normal((tokens, heads, dim)).astype(np.float32)
    k = RNG.standard_normal((tokens, kv_heads, dim)).astype(np.float32)
    cos, sin = (RNG.standard_normal((tokens, rope_dim)).astype(np.float32) for _ in range(2))
    gamma = RNG.standard_normal(dim).astype(np.float32)
    empty = np.zeros(0, np.float32)

    def expected(x):
        h = normalize(x.astype(np.float64), gamma, None, 1e-6, True) if with_norm else x.astype(np.float64)
        return rotate(h, cos, sin, rope_dim)

    q_out, k_out = np.empty_like(q), np.empty_like(k)
    g = gamma if with_norm else empty
    rope.rope_qk(q.reshape(-1), k.reshape(-1), heads, kv_heads, dim, rope_dim, cos, sin, with_norm, g, empty, 1e-6,
                 True, with_norm, g, empty, 1e-6, True, q_out.reshape(-1), k_out.reshape(-1))
    np.testing.assert_allclose(q_out, expected(q), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(k_out, expected(k), rtol=1e-5, atol=1e-5)
    q_in, k_in = q.copy(), k.copy()  # in place (a step may give the output the input's buffer): the same bits
    rope.rope_qk(q_in.reshape(-1), k_in.reshape(-1), heads, kv_heads, dim, rope_dim, cos, sin, with_norm, g, empty,
                 1e-6, True, with_norm, g, empty, 1e-6, True, q_in.reshape(-1), k_in.reshape(-1))
    assert np.array_equal(q_in.view(np.int32), q_out.view(np.int32))
    assert np.array_equal(k_in.view(np.int32), k_out.view(np.int32))


def test_mul_silu_and_exp_match_float64():
    a, b = (RNG.standard_normal(1001).astype(np.float32) * 8 for _ in range(2))
    out = np.empty_like(a)
    activation.mul_silu(a, b, out)
    np.testing.assert_allclose(out, a * (b / (1 + np.exp(-b.astype(np.float64)))), rtol=1e-6, atol=1e-6)
    in_place = a.copy()  # the MLP's gate buffer takes the output: its own loop, the same bits
    activation.mul_silu(in_place, b, in_place)
    assert np.array_equal(in_place.view(np.int32), out.view(np.int32))
    x = np.linspace(-86, 88.7, 20001).astype(np.float32)
    got = np.array([exp32(v) for v in x[::97]])
    np.testing.assert_allclose(got, np.exp(x[::97].astype(np.float64)), rtol=5e-7)
    assert exp32(np.float32(100.0)) == np.inf and exp32(np.float32(-np.inf)) == 0.0
    assert np.isnan(exp32(np.float32(np.nan)))


def load(memory: str):
    import mnnllm_core
    model = mnnllm_core.create(CONFIG)
    model.set_config({"sampler_type": "greedy", "thread_num": 2, "memory": memory})
    return model.load()


@pytest.fixture(scope="module")
def low_llm():
    return load("low")


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(PROMPTS)))
def test_memory_low_greedy_tokens_equal_mnn_memory_normal(low_llm, index):
    prompt = PROMPTS[index]
    low_llm.reset()
    assert low_llm.generate(prompt["prompt_ids"], 64) == prompt["mnn_cpp_q4_memory_normal"]["gen_ids"]


@pytest.mark.slow
def test_memory_normal_stays_the_fp32_reference_path():
    from mnnllm_backends.cpu.ops.linear import LinearExecution
    llm = load("normal")
    executions = [e for _, e in llm.pool.get(1, False).static_module.session.pipeline.executions.values()]
    assert all(isinstance(e, LinearExecution) for e in executions if "Linear" in type(e).__name__)
    for prompt in PROMPTS:
        llm.reset()
        assert llm.generate(prompt["prompt_ids"], 64) == prompt["mnn_cpp_q4_memory_normal"]["gen_ids"]


def test_memory_low_keeps_weights_packed_and_reads_a_quarter_of_the_fp32_bytes(low_llm):
    from mnnllm_backends.cpu.ops.packed_linear import PackedLinearExecution
    pipeline = low_llm.pool.get(1, False).static_module.session.pipeline
    executions = [e for _, e in pipeline.executions.values()]
    linears = [e for e in executions if type(e).__name__.endswith("LinearExecution")]
    assert linears and all(isinstance(e, PackedLinearExecution) for e in linears)
    packed = sum(e.packed_bytes for e in executions)
    fp32 = sum(4 * e.weight.oc * e.weight.ic for e in linears)
    assert 0.12 * fp32 < packed < 0.16 * fp32  # 4-bit codes + fp16 (zero, scale) per 64 weights


def test_thread_num_reaches_the_kernels(low_llm):
    import numba
    low_llm.forward([5])
    assert numba.get_num_threads() == 2


def test_the_kernels_are_loaded_at_load_and_no_run_compiles_more(low_llm):
    from numba.core.registry import CPUDispatcher

    def overloads():
        return {name + "." + key: len(value.overloads) for name, module in list(sys.modules.items())
                if name.startswith("mnnllm_backends.cpu.kernels") for key, value in vars(module).items()
                if isinstance(value, CPUDispatcher)}

    def steps():
        low_llm.reset()
        low_llm.forward(list(range(100, 140)))
        low_llm.forward([5])

    before = overloads()
    steps()
    assert overloads() == before  # a prompt and a decode step: parts the warm-up loaded at load
    low_llm.forward([6, 7, 8])  # a 2..8-token step loads its rarer part when resized (on demand)
    grown = {k for k, v in overloads().items() if v != before.get(k)}
    assert all("_few_" in k for k in grown), grown
    after = overloads()
    steps()
    low_llm.forward([6, 7, 8])
    assert overloads() == after  # and no later run adds any


def test_compiled_kernels_are_cached_outside_the_package(tmp_path):
    """A fresh cache folder fills on first use; a second process loads from it."""
    script = ("import numpy as np\nfrom mnnllm_backends.cpu.kernels.activation import mul_silu\n"
              "a = np.ones(4, np.float32)\nmul_silu(a, a, a.copy())\n")
    env = {**os.environ, "MNNLLM_CACHE": str(tmp_path), "NUMBA_DEBUG_CACHE": "1"}
    env.pop("NUMBA_CACHE_DIR", None)
    first = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    cached = list((tmp_path / "numba").rglob("activation.mul_silu*.nbi"))
    assert cached, "no index file under $MNNLLM_CACHE/numba"
    second = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0 and "data loaded" in second.stdout + second.stderr


def test_a_kernel_address_is_looked_up_by_what_its_arguments_types_depend_on():
    """`calls.address_for` caches addresses by dtype, dimensions, flags (and a tuple's members),
    so arguments numba types differently never share an entry: a call through a wrong address
    would read its arguments wrongly."""
    from mnnllm_backends.cpu.kernels.calls import _kind, address_for
    x = np.zeros((4, 4), np.float32)
    readonly = x.copy()
    readonly.setflags(write=False)
    kinds = {_kind(v) for v in (x, x[:, :2], x.T, readonly, x.astype(np.float64), x[0], (x, x[0]), (x[0], x))}
    assert len(kinds) == 8
    assert address_for(attention.attend, x[None], x[None], x[None], 0, np.float32(1), x[0], x[None]) == \
        address_for(attention.attend, x[None], x[None], x[None], 3, np.float32(2), x[1], x[None])
