"""Qwen3-VL (and Qwen3.5) encoders: Qwen2-VL's patches with 16x16 patches (units of 32) plus
the learned position embedding's bilinear interpolation, fed as `idx_tensor` [4, n] (the four
corner cells of a num_grid_per_side grid) and `weight_tensor` [4, n] (their weights), in the
patches' merge order; the encoder may also give `deepstack_feature` [layers, tokens, hidden],
which the LLM adds after its first layers (deepstack.py)."""
from __future__ import annotations

import numpy as np

from ..errors import ConfigError, FormatError
from .vision_qwen2 import QWEN2_INPUTS, Qwen2VisionEncoder, merge_order

QWEN3_INPUTS = QWEN2_INPUTS + ["idx_tensor", "weight_tensor"]


def position_interpolation(grid_h: int, grid_w: int, num_grid: int) -> tuple[np.ndarray, np.ndarray]:
    """MNN's idx_tensor and weight_tensor: for each patch (merge order) the flat indices of the
    four neighbouring cells of the num_grid x num_grid table, and their bilinear weights, with
    the patch grid spread evenly over the table (float32 as MNN computes them)."""
    one = np.float32(num_grid - 1)

    def spread(count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        where = np.arange(count, dtype=np.float32) * one / np.float32(count - 1)
        low = where.astype(np.int64)  # truncation, as C's cast
        return low, np.minimum(low + 1, num_grid - 1), (where - low.astype(np.float32)).astype(np.float32)

    h_low, h_high, dh = spread(grid_h)
    w_low, w_high, dw = spread(grid_w)
    idx = np.stack([h_low[:, None] * num_grid + w_low[None, :], h_low[:, None] * num_grid + w_high[None, :],
                    h_high[:, None] * num_grid + w_low[None, :], h_high[:, None] * num_grid + w_high[None, :]])
    one_h, one_w = np.float32(1) - dh, np.float32(1) - dw
    weight = np.stack([one_h[:, None] * one_w[None, :], one_h[:, None] * dw[None, :],
                       dh[:, None] * one_w[None, :], dh[:, None] * dw[None, :]]).astype(np.float32)
    order = merge_order(grid_h, grid_w).reshape(-1)
    idx_out = np.empty((4, grid_h * grid_w), np.int32)
    weight_out = np.empty((4, grid_h * grid_w), np.float32)
    idx_out[:, order] = idx.reshape(4, -1)
    weight_out[:, order] = weight.reshape(4, -1)
    return idx_out, weight_out


class Qwen3VisionEncoder(Qwen2VisionEncoder):
    patch_size = 16

    def __init__(self, config, module, tokenizer):
        super().__init__(config, module, tokenizer)
        num_grid = config.get("num_grid_per_side", 1)
        if not isinstance(num_grid, int) or isinstance(num_grid, bool) or num_grid < 1:
            raise ConfigError(f"num_grid_per_side must be a positive integer, got {num_grid!r}",
                              file=config.origin("num_grid_per_side") or config.source, field="num_grid_per_side")
        self.num_grid = num_grid

    def input_names(self) -> list[str]:
        return QWEN3_INPUTS

    def _extra_feeds(self, grid_h: int, grid_w: int) -> dict[str, np.ndarray]:
        idx, weight = position_interpolation(grid_h, grid_w, self.num_grid)
        return {"idx_tensor": idx, "weight_tensor": weight}

    def _deepstack(self, outputs: list[np.ndarray], count: int) -> np.ndarray | None:
        """MNN keeps a second output as the image's deepstack features: [layers, tokens, hidden]."""
        if len(outputs) < 2:
            return None
        features = np.asarray(outputs[1], np.float32)
        hidden = self.config.hidden_size
        if features.size % (count * hidden):
            raise FormatError(f"the vision encoder's deepstack_feature has shape {list(features.shape)}, not layers "
                              f"of {count} rows of {hidden}", file=self.path, field="deepstack_feature")
        return features.reshape(-1, count, hidden)
