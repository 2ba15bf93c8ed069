"""The exporter's `--hqq` (Half-Quadratic Quantization, as MNN 3.6.1's `utils/hqq_quantizer.py`) and
`--quant-config FILE` (MNN's per-linear JSON). MNN's runtime on such exports is in test_weight_formats.py.

HQQ is checked against a whole-tensor torch float32 version of the same steps (ours streams the rows and
re-reads them every step), and against min/max on [256, 512] weights of std 0.15, blocks of 64: over the
tensor its mean |error| and mean squared error are lower at 2, 3, 4 and 8 bits, symmetric or not (mean |error|
2.2 / 1.7 / 1.9 / 1.9% lower asymmetric, 51 / 21 / 5.3 / 2.0% symmetric). Per block it is no guarantee:
symmetric, every block's squared error is <= min/max's (its mean |error| in 64-100% of blocks); asymmetric,
the zero moves to lower an l_0.7 error of the whole tensor, and 68-73% of blocks end with a squared error
(56-58% with a mean |error|) <= min/max's.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from mnnllm_core.errors import ConfigError, UnsupportedError
from mnnllm_core.export import export_model
from mnnllm_core.export.hqq import HqqFit
from mnnllm_core.export.quant_config import QuantChoice, QuantConfig
from mnnllm_core.export.weights import quantize_rows

BITS = [2, 3, 4, 8]


def weights(rows: int = 96, cols: int = 256, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((rows, cols)) * 0.15).astype(np.float16).astype(np.float32)


def torch_hqq(w: np.ndarray, bits: int, block: int, symmetric: bool) -> tuple[np.ndarray, np.ndarray]:
    """The steps of hqq.py's docstring on the whole tensor at once, in torch: (codes as stored, alpha)."""
    torch = pytest.importorskip("torch")
    x = torch.from_numpy(w).reshape(-1, block)
    lo, hi = x.min(dim=1, keepdim=True).values, x.max(dim=1, keepdim=True).values
    if symmetric:
        low, high = -2 ** (bits - 1), 2 ** (bits - 1) - 1
        span = torch.maximum(lo.abs(), hi.abs())
    else:
        low, high = 0, 2 ** bits - 1
        span = hi - lo
    s = torch.where(span.abs() <= 1e-4, torch.ones_like(span), high / span).clamp(max=2e4)
    z = None if symmetric else torch.round(-lo * s)

    def shrink(e):
        return torch.sign(e) * torch.relu(e.abs() - e.abs().pow(-0.3) / 10)

    best = float("inf")
    for _ in range(20):
        if symmetric:
            q = torch.round(x * s).clamp(low, high)
            r = q / s
            moved = x - shrink(x - r)
            norm = (q * q).sum(dim=1, keepdim=True)
            s = torch.where(norm == 0, s, norm / ((moved * q).sum(dim=1, keepdim=True) + 1e-8))
        else:
            q = torch.round(x * s + z).clamp(low, high)
            r = (q - z) / s
            z = (q - (x - shrink(x - r)) * s).mean(dim=1, keepdim=True)
        error = (x - r).abs().double().mean().item()
        if not error < best:
            break
        best = error
    offset = 2 ** (bits - 1)
    scale = 1 / s
    if symmetric:
        return (torch.round(x * s).clamp(low, high) + offset).numpy().astype(np.uint8), scale.numpy()
    codes = torch.round(x * s + z).clamp(low, high)
    return codes.numpy().astype(np.uint8), torch.cat([scale * offset - scale * z, scale], dim=1).numpy()


def decoded(codes: np.ndarray, alpha: np.ndarray, bits: int, block: int) -> np.ndarray:
    """float64 w = zero + scale * (code - 2^(bits-1)) (or scale * (...) when symmetric), per block."""
    c = codes.reshape(-1, block).astype(np.float64) - 2 ** (bits - 1)
    a = alpha.reshape(c.shape[0], -1).astype(np.float64)
    return c * a[:, :1] if a.shape[1] == 1 else a[:, :1] + a[:, 1:] * c


@pytest.mark.parametrize("symmetric", [False, True], ids=["asym", "sym"])
@pytest.mark.parametrize("bits", BITS)
def test_streamed_hqq_equals_the_whole_tensor_steps(bits, symmetric):
    w = weights()
    fit = HqqFit.fit(lambda a, b: w[a:b], w.shape[0], w.shape[1], bits, 64, symmetric, step=10)
    codes, alpha = fit.quantize(0, w, np.float32)
    want_codes, want_alpha = torch_hqq(w, bits, 64, symmetric)
    assert np.array_equal(codes.reshape(-1, 64), want_codes)
    np.testing.assert_allclose(alpha.reshape(want_alpha.shape), want_alpha, rtol=1e-5, atol=1e-6)  # float32 sums


@pytest.mark.parametrize("symmetric", [False, True], ids=["asym", "sym"])
@pytest.mark.parametrize("bits", BITS)
def test_hqq_lowers_the_tensors_error_below_min_max(bits, symmetric):
    w = weights(256, 512)
    fit = HqqFit.fit(lambda a, b: w[a:b], 256, 512, bits, 64, symmetric, step=64)
    hqq = np.abs(decoded(*fit.quantize(0, w, np.float32), bits, 64) - w.reshape(-1, 64))
    minmax = np.abs(decoded(*quantize_rows(w, bits, 64, symmetric, np.float32), bits, 64) - w.reshape(-1, 64))
    assert hqq.mean() < minmax.mean() and (hqq ** 2).mean() < (minmax ** 2).mean()
    squared_per_block = (hqq ** 2).mean(axis=1) <= (minmax ** 2).mean(axis=1)
    if symmetric:  # the scale step is a least-squares fit of each block
        assert squared_per_block.all()
    else:  # the zero step lowers the whole tensor's error, not each block's (measured 0.68-0.73)
        assert squared_per_block.mean() > 0.6


def test_flat_and_zero_blocks_decode_to_finite_values():
    """A zero block (and, asymmetric, a constant one) stays exact; no scale is inf or NaN."""
    w = weights(4, 128)
    w[0, :64] = 0
    w[1, 64:] = 0.25
    for symmetric in (False, True):
        fit = HqqFit.fit(lambda a, b: w[a:b], 4, 128, 4, 64, symmetric, step=4)
        codes, alpha = fit.quantize(0, w, np.float16)
        assert np.isfinite(alpha.astype(np.float32)).all()
        values = decoded(codes, alpha.astype(np.float32), 4, 64).reshape(4, 128)
        assert np.array_equal(values[0, :64], np.zeros(64))
        if not symmetric:
            np.testing.assert_allclose(values[1, 64:], 0.25, atol=2e-3)


# -- --quant-config -------------------------------------------------------------------------------
def write_config(tmp_path, data) -> str:
    path = tmp_path / "quant.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


@pytest.mark.parametrize("data, field, message", [
    ("{not json", None, "not JSON"),
    ([1, 2], None, "must be an object"),
    ({"/lm/lm_head/Linear": 8}, "/lm/lm_head/Linear", "must be an object"),
    ({"/lm/lm_head/Linear": {"bit": 8}}, "/lm/lm_head/Linear.bit", "unknown key"),
    ({"/lm/lm_head/Linear": {"bits": 5}}, "/lm/lm_head/Linear.bits", "bits must be one of"),
    ({"/lm/lm_head/Linear": {"bits": True}}, "/lm/lm_head/Linear.bits", "bits must be one of"),
    ({"/lm/lm_head/Linear": {"block_size": 48}}, "/lm/lm_head/Linear.block_size", "block_size must be one of"),
    ({"/lm/lm_head/Linear": {"symmetric": 1}}, "/lm/lm_head/Linear.symmetric", "true or false"),
])
def test_a_bad_quant_config_is_a_config_error_naming_file_and_field(tmp_path, data, field, message):
    path = write_config(tmp_path, data)
    with pytest.raises(ConfigError, match=message) as err:
        QuantConfig.load(path)
    assert err.value.file == path and err.value.field == field


def test_a_missing_quant_config_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read") as err:
        QuantConfig.load(tmp_path / "absent.json")
    assert err.value.file.endswith("absent.json")


def test_an_entry_naming_no_linear_is_refused_and_nothing_is_left(tmp_path, llama_dir):
    path = write_config(tmp_path, {"/layers.0/mlp/down_proj/Linear": {"bits": 8},
                                   "/layers.7/mlp/down_proj/Linear": {"bits": 8}})
    with pytest.raises(ConfigError, match="names no linear of this model") as err:
        export_model(str(llama_dir), str(tmp_path / "model"), quant_config=path)
    assert err.value.file == path and err.value.field == "/layers.7/mlp/down_proj/Linear"
    assert not (tmp_path / "model").exists()


def test_entries_override_only_their_keys():
    config = QuantConfig({"/a/Linear": {"bits": 8}, "/b/Linear": {"block_size": 0, "symmetric": True}})
    default = QuantChoice(4, 64, False)
    assert config.choice("/a/Linear", default) == QuantChoice(8, 64, False)
    assert config.choice("/b/Linear", default) == QuantChoice(4, 0, True)
    assert config.choice("/c/Linear", default) == default
    config.check_all_used()


def test_the_cli_passes_hqq_and_the_quant_config(tmp_path, llama_dir):
    from test_export import _cli_export
    path = write_config(tmp_path, {"/lm/lm_head/Linear": {"bits": 8, "block_size": 32}})
    done = _cli_export(str(llama_dir), str(tmp_path / "m"), "--hqq", "--quant-config", path)
    assert done.returncode == 0, done.stderr
    tie = json.loads((tmp_path / "m" / "llm_config.json").read_text())["tie_embeddings"]
    assert (tie["quant_bit"], tie["quant_block"]) == (8, 32)
    done = _cli_export(str(llama_dir), str(tmp_path / "n"), "--quant-config", str(tmp_path / "absent.json"))
    assert done.returncode == 2 and "cannot read the quant config" in done.stderr


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    from test_export import random_weights, write_hf_folder
    return write_hf_folder(tmp_path_factory.mktemp("hf") / "llama", "llama", random_weights("llama", True), True)


def test_an_embedding_model_refuses_hqq(tmp_path):
    from test_export import write_hf_folder, random_weights
    src = write_hf_folder(tmp_path / "bert", "llama", random_weights("llama", True), True)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "model_type": "bert"}))
    with pytest.raises(UnsupportedError, match="--hqq and --quant-config are for decoder models") as err:
        export_model(str(src), str(tmp_path / "m"), hqq=True)
    assert err.value.field == "hqq"
