"""The float masks the LLM feeds (MNN's gen_attention_mask): "full" a scalar, "mix" two planes
over the whole KV length (causal, and causal within the window), "sliding" the windowed plane."""
import numpy as np
import pytest

from mnnllm_core.errors import ConfigError
from mnnllm_core.llm.attention_mask import BLOCKED, check_attention_type, float_attention_mask


def allowed(past: int, seq: int, window: int | None) -> np.ndarray:
    """Query i sits at position past + i; it sees key j when j <= its position (and, with a
    window, when fewer than `window` positions back)."""
    out = np.zeros((seq, past + seq), bool)
    for i in range(seq):
        for j in range(past + seq):
            out[i, j] = j <= past + i and (window is None or past + i - j < window)
    return out


@pytest.mark.parametrize("past,seq,window", [(0, 7, 3), (0, 1, 1), (5, 4, 2), (37, 1, 16), (3, 9, 20)])
def test_mix_mask_planes_are_causal_and_windowed_over_the_whole_kv_length(past, seq, window) -> None:
    mask = float_attention_mask("mix", window, past, seq)
    assert mask.shape == (2, 1, 1, seq, past + seq) and mask.dtype == np.float32
    for plane, w in ((mask[0, 0, 0], None), (mask[1, 0, 0], window)):
        assert set(np.unique(plane)) <= {0.0, BLOCKED}
        assert np.array_equal(plane == 0, allowed(past, seq, w))


def test_a_decode_step_masks_as_the_last_row_of_the_prefill_of_the_whole_sequence() -> None:
    whole = float_attention_mask("mix", 4, 0, 12)
    step = float_attention_mask("mix", 4, 11, 1)
    assert np.array_equal(step[:, :, :, 0], whole[:, :, :, -1])


def test_sliding_is_one_windowed_plane_and_full_a_scalar() -> None:
    assert np.array_equal(float_attention_mask("sliding", 3, 2, 4)[0, 0] == 0, allowed(2, 4, 3))
    assert float_attention_mask("full", 0, 9, 4).shape == (1, 1, 1, 1)


@pytest.mark.parametrize("kind,window,field", [("local", 4, "attention_type"), ("mix", 0, "sliding_window"),
                                               ("sliding", -1, "sliding_window")])
def test_an_unknown_attention_type_or_a_missing_window_is_a_config_error(kind, window, field) -> None:
    with pytest.raises(ConfigError) as err:
        check_attention_type(kind, window, "llm_config.json")
    assert err.value.field == field and "llm_config.json" in str(err.value)
