"""The few-token GEMV of the cpu backend's memory "low" path (2..8 token rows, each packed byte
read once for all of them: a speculative verify step) against the float64 numpy reference on
odd shapes (int4 and int8 codes, block and per-channel alphas, fp16 and float32 alphas), and the
shared model's verify-sized forwards against the panel GEMM they replace."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba")

from mnnllm_backends.cpu.kernels import linear  # noqa: E402
from mnnllm_backends.cpu.kernels.layout import pack  # noqa: E402
from mnnllm_backends.cpu.ops import packed_linear  # noqa: E402
from test_cpu_low_memory import PROMPTS, WEIGHTS, assert_product_close, load, quantized, reference  # noqa: E402

RNG = np.random.default_rng(11)
TOKENS = [*range(2, linear.FEW_TOKENS_MAX + 1), 3]  # growing buffers, then a smaller count in them


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", WEIGHTS)
def test_few_token_gemv_matches_float64_for_2_to_8_rows(case, threads):
    weight = quantized(**WEIGHTS[case])
    gemv = linear.Gemv([pack(weight)])
    gemv.parallel_worth = True
    for tokens in TOKENS:
        x = RNG.standard_normal((tokens, weight.ic)).astype(np.float32)
        result = gemv.few(x, threads)[0]
        assert result.shape == (tokens, gemv.results[0].shape[0]) and np.all(result[:, weight.oc:] == 0)
        assert_product_close(result[:, :weight.oc], reference(weight), x.astype(np.float64))


def test_one_few_token_gemv_over_three_members_equals_each_alone():
    weights = [pack(quantized(oc, 96, 4, 32)) for oc in (45, 20, 33)]
    x = RNG.standard_normal((5, 96)).astype(np.float32)
    together = linear.Gemv(weights)
    together.parallel_worth = True
    for weight, result in zip(weights, together.few(x, 2)):
        assert np.array_equal(result, linear.Gemv([weight]).few(x, 1)[0])


def test_the_few_token_gemv_refuses_a_row_count_it_has_no_kernel_for():
    gemv = linear.Gemv([pack(quantized(32, 48, 8, 16))])
    for tokens in (1, linear.FEW_TOKENS_MAX + 1):
        with pytest.raises(ValueError, match="2 to"):
            gemv.few(np.zeros((tokens, 48), np.float32), 1)


@pytest.mark.slow
def test_forwards_of_2_to_8_tokens_match_the_panel_gemm_they_replace(monkeypatch):
    llm = load("low")
    ids = PROMPTS[0]["prompt_ids"][:16]

    def logits(tokens):
        llm.reset()
        llm.forward(ids[:-tokens])
        return llm.forward(ids[-tokens:], all_logits=True).copy()

    for tokens in (2, 5, 8):
        few = logits(tokens)
        with monkeypatch.context() as patch:
            patch.setattr(packed_linear, "FEW_TOKENS", 1)
            gemm = logits(tokens)
        assert few.shape == gemm.shape and few.shape[0] == tokens
        assert np.array_equal(few.argmax(axis=1), gemm.argmax(axis=1))
        np.testing.assert_allclose(few, gemm, rtol=0, atol=1e-4 * np.abs(gemm).max())  # seen: 4e-6


def _rows_and_singles(llm, ids, tokens):
    """The logits of a `tokens`-token forward after ids[:-tokens], and those of one-token forwards."""
    llm.reset()
    llm.forward(ids[:-tokens])
    together = llm.forward(ids[-tokens:], all_logits=True).reshape(tokens, -1).copy()
    llm.reset()
    llm.forward(ids[:-tokens])
    singles = np.stack([llm.forward([token]).reshape(-1).copy() for token in ids[-tokens:]])
    return together, singles


def test_the_int4_few_token_gemv_row_equals_the_one_token_gemv_bit_for_bit():
    """Same loads, same per-lane FMA order: each row of a k-row int4 GEMV is the one-row result.
    (int8: fast-math lets LLVM reorder the one-row kernel's sums, ~1e-6 relative apart.)"""
    gemv = linear.Gemv([pack(quantized(200, 576, 4, 32))])
    for tokens in range(2, linear.FEW_TOKENS_MAX + 1):
        x = RNG.standard_normal((tokens, 576)).astype(np.float32)
        together = gemv.few(x, 1)[0].copy()
        assert np.array_equal(together, np.stack([gemv(x[t].copy(), 1)[0].copy() for t in range(tokens)]))


@pytest.mark.slow
def test_a_few_token_forward_on_packed_weights_matches_one_token_forwards():
    """Bit for bit when the kernels come from the warm-up (seen in a fresh process); a process that
    compiled other overloads first (tests calling kernels on other array layouts) may run a
    differently vectorized variant for some calls: 3e-5 of the largest logit seen."""
    llm = load("low")
    ids = PROMPTS[0]["prompt_ids"][:20]
    for tokens in (2, 4, 5, 8):
        together, singles = _rows_and_singles(llm, ids, tokens)
        assert np.array_equal(together.argmax(axis=1), singles.argmax(axis=1))
        np.testing.assert_allclose(together, singles, rtol=0, atol=1e-5 * np.abs(singles).max())


@pytest.mark.slow
def test_a_few_token_forward_on_fp32_weights_is_within_blas_rounding_of_one_token_forwards():
    """memory "normal" runs OpenBLAS (GEMV for one row, GEMM for more), whose sums are ordered
    differently: the rows agree to float32 rounding (seen: 4e-6 of the largest logit), not bit for bit."""
    llm = load("normal")
    ids = PROMPTS[0]["prompt_ids"][:20]
    for tokens in (2, 4, 8):
        together, singles = _rows_and_singles(llm, ids, tokens)
        assert np.array_equal(together.argmax(axis=1), singles.argmax(axis=1))
        np.testing.assert_allclose(together, singles, rtol=0, atol=2e-5 * np.abs(singles).max())
