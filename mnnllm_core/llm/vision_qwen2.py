"""MNN's qwen2VisionProcess for Qwen2-VL encoders (inputs `patches`, `position_ids`,
`attention_mask`): the image resized to multiples of patch x merge (28), two temporal copies
cut into patches in the 2x2-merge order, the patches' (row, column) ids, a zero mask; the
encoder's `image_embeds` are one row per image token, placed between vision_start and
vision_end."""
from __future__ import annotations

import numpy as np

from ..errors import UnsupportedError
from .image import ImageSource, load_image, resize_normalize
from .vision import VisionEncoder, VisionOutput, round_half_up, token_id

TEMPORAL_PATCH_SIZE, MERGE_SIZE = 2, 2  # MNN's qwen2VisionProcess fixes these
QWEN2_INPUTS = ["patches", "position_ids", "attention_mask"]


def qwen_patches(pixels: np.ndarray, patch_size: int = 14) -> tuple[np.ndarray, np.ndarray, tuple[int, int, int]]:
    """[3, H, W] normalized pixels -> patches [t*h*w, 3*2*p*p], position_ids [2, t*h*w] (row,
    column of each patch, in merge order) and the merged grid."""
    channels, height, width = pixels.shape
    grid_t, grid_h, grid_w = 1, height // patch_size, width // patch_size
    frames = np.stack([pixels] * TEMPORAL_PATCH_SIZE)  # a still image is two identical frames
    blocks = frames.reshape(grid_t, TEMPORAL_PATCH_SIZE, channels, grid_h // MERGE_SIZE, MERGE_SIZE, patch_size,
                            grid_w // MERGE_SIZE, MERGE_SIZE, patch_size)
    patches = blocks.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8).reshape(
        grid_t * grid_h * grid_w, channels * TEMPORAL_PATCH_SIZE * patch_size * patch_size)
    rows, cols = np.meshgrid(np.arange(grid_h), np.arange(grid_w), indexing="ij")
    order = merge_order(grid_h, grid_w).reshape(-1)
    position_ids = np.empty((2, grid_h * grid_w), np.int32)
    position_ids[0, order] = rows.reshape(-1)
    position_ids[1, order] = cols.reshape(-1)
    return np.ascontiguousarray(patches), position_ids, (grid_t, grid_h // MERGE_SIZE, grid_w // MERGE_SIZE)


def merge_order(grid_h: int, grid_w: int) -> np.ndarray:
    """[grid_h, grid_w]: where each patch (row-major) sits in the 2x2-merge order."""
    rows, cols = np.meshgrid(np.arange(grid_h), np.arange(grid_w), indexing="ij")
    return ((rows // MERGE_SIZE) * (MERGE_SIZE * grid_w) + (cols // MERGE_SIZE) * MERGE_SIZE * MERGE_SIZE
            + (rows % MERGE_SIZE) * MERGE_SIZE + cols % MERGE_SIZE)


class Qwen2VisionEncoder(VisionEncoder):
    patch_size = 14

    def __init__(self, config, module, tokenizer):
        super().__init__(config, module, tokenizer)
        inputs = module.input_names
        if inputs[:3] != QWEN2_INPUTS:
            raise UnsupportedError(f"vision encoder inputs {inputs}: a Qwen2-VL encoder takes "
                                   f"{', '.join(QWEN2_INPUTS)}", file=self.path, field="inputs")
        if len(inputs) > len(self.input_names()):
            raise UnsupportedError("Qwen2.5-VL window attention (window_index) is not supported yet", file=self.path,
                                   field="inputs")
        self.tokens = [token_id(config, key) for key in ("vision_start", "image_pad", "vision_end")]

    def input_names(self) -> list[str]:
        return QWEN2_INPUTS

    def target_size(self, height: int | None, width: int | None) -> tuple[int, int]:
        """MNN's size: the <hw> tag's (or image_size's) height and width rounded to multiples of
        patch x merge; each side at most image_max_size, and the image's tokens within max_all_tokens."""
        unit = self.patch_size * MERGE_SIZE
        size = []
        for value, name in zip(self.requested_size(height, width), ("height", "width")):
            rounded = round_half_up(value / unit) * unit
            if rounded < unit:
                raise UnsupportedError(f"an image {name} of {value} rounds to {rounded}: at least {unit // 2} needed",
                                       field="hw")
            size.append(rounded)
        self.check_tokens((size[0] // unit) * (size[1] // unit) + 2, size[0], size[1])
        return size[0], size[1]

    def pixels(self, image: ImageSource, height: int | None, width: int | None) -> np.ndarray:
        """[3, H, W]: the image resized (MNN's bilinear) and normalized; its size is checked first."""
        size = self.target_size(height, width)
        return resize_normalize(load_image(image), *size, self.mean, self.norm)

    def _encode(self, image: ImageSource, height: int | None, width: int | None) -> VisionOutput:
        pixels = self.pixels(image, height, width)
        patches, position_ids, grid = qwen_patches(pixels, self.patch_size)
        tokens = patches.shape[0]
        feeds = {"patches": patches, "position_ids": position_ids,
                 "attention_mask": np.zeros((1, tokens, tokens), np.float32),
                 **self._extra_feeds(pixels.shape[1] // self.patch_size, pixels.shape[2] // self.patch_size)}
        outputs = self.module.forward(feeds)
        embeds = self._rows(outputs[0], 1, "image_embeds")[0]
        count = grid[0] * grid[1] * grid[2]
        if len(embeds) != count:
            raise UnsupportedError(f"the vision encoder gave {len(embeds)} image tokens for a merged grid of {count}",
                                   file=self.path, field="image_embeds")
        start, pad, end = self.tokens
        return VisionOutput([start] + [pad] * count + [end], embeds, tuple(pixels.shape[1:]), grid,
                            self._deepstack(outputs, count))

    def _extra_feeds(self, grid_h: int, grid_w: int) -> dict[str, np.ndarray]:
        return {}

    def _deepstack(self, outputs: list[np.ndarray], count: int) -> np.ndarray | None:
        return None
