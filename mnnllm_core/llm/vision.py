"""MNN's Omni vision front end for Qwen2-VL-style encoders (inputs `patches`, `position_ids`,
`attention_mask`): the image resized to multiples of 28, two temporal copies cut into 14x14
patches in the 2x2-merge order, the patches' (row, column) ids, a zero mask; the encoder's
`image_embeds` are one row per image token. The encoder loads through the same Module path
as the LLM: its own module, on the `mllm` backend (or the LLM's), weights packed, placement
with fallback."""
from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError, UnsupportedError
from ..express.module import Module, NetModule
from ..express.runtime_manager import RuntimeManager
from ..express.static_module import Config
from .config import LlmConfig
from .image import ImageSource, load_image, resize_normalize

log = logging.getLogger(__name__)

# MNN's qwen2VisionProcess fixes these for Qwen2-VL / Qwen2.5-VL encoders
PATCH_SIZE, TEMPORAL_PATCH_SIZE, MERGE_SIZE = 14, 2, 2
QWEN2_INPUTS = ["patches", "position_ids", "attention_mask"]
DEFAULT_MEAN = [122.7709383, 116.7460125, 104.09373615]
DEFAULT_NORM = [0.01459843, 0.01500777, 0.01422007]


@dataclass
class VisionOutput:
    """One encoded image: `embeds` [tokens, hidden] and its merged grid (t, h, w) for M-RoPE."""

    embeds: np.ndarray
    grid: tuple[int, int, int]
    size: tuple[int, int]  # the (height, width) the image was resized to


def _round_half_up(value: float) -> int:
    return int(math.floor(value + 0.5))


def qwen2_patches(pixels: np.ndarray) -> tuple[np.ndarray, np.ndarray, tuple[int, int, int]]:
    """[3, H, W] normalized pixels -> patches [t*h*w, 3*2*14*14], position_ids [2, t*h*w] (row,
    column of each patch, in merge order) and the merged grid."""
    channels, height, width = pixels.shape
    grid_t, grid_h, grid_w = 1, height // PATCH_SIZE, width // PATCH_SIZE
    frames = np.stack([pixels] * TEMPORAL_PATCH_SIZE)  # a still image is two identical frames
    blocks = frames.reshape(grid_t, TEMPORAL_PATCH_SIZE, channels, grid_h // MERGE_SIZE, MERGE_SIZE, PATCH_SIZE,
                            grid_w // MERGE_SIZE, MERGE_SIZE, PATCH_SIZE)
    patches = blocks.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8).reshape(
        grid_t * grid_h * grid_w, channels * TEMPORAL_PATCH_SIZE * PATCH_SIZE * PATCH_SIZE)
    rows, cols = np.meshgrid(np.arange(grid_h), np.arange(grid_w), indexing="ij")
    order = ((rows // MERGE_SIZE) * (MERGE_SIZE * grid_w) + (cols // MERGE_SIZE) * MERGE_SIZE * MERGE_SIZE
             + (rows % MERGE_SIZE) * MERGE_SIZE + cols % MERGE_SIZE).reshape(-1)
    position_ids = np.empty((2, grid_h * grid_w), np.int32)
    position_ids[0, order] = rows.reshape(-1)
    position_ids[1, order] = cols.reshape(-1)
    return np.ascontiguousarray(patches), position_ids, (grid_t, grid_h // MERGE_SIZE, grid_w // MERGE_SIZE)


class VisionEncoder:
    """visual.mnn and its preprocessing; `encode` turns one image into its embeddings."""

    def __init__(self, config: LlmConfig, runtime_manager: RuntimeManager):
        self.config = config
        path = config.visual_model
        if not os.path.isfile(path):
            raise ConfigError(f"visual_model names a file that does not exist: {path}",
                              file=config.origin("visual_model") or config.source, field="visual_model")
        self.image_size = int(config.get("image_size", 448))
        self.mean = config.get("image_mean", DEFAULT_MEAN)
        self.norm = config.get("image_norm", DEFAULT_NORM)
        for key, value in (("image_mean", self.mean), ("image_norm", self.norm)):
            if not (isinstance(value, list) and len(value) == 3 and all(isinstance(v, (int, float)) for v in value)):
                raise ConfigError(f"{key} must be a list of three numbers, got {value!r}",
                                  file=config.origin(key), field=key)
        llm_weights = runtime_manager.external_file  # the manager may be the LLM's: lend it, then give it back
        runtime_manager.set_external_file(path + ".weight")
        try:
            self.module: NetModule = Module.load([], [], path, runtime_manager, Config(rearrange=True))
        finally:
            runtime_manager.external_file = llm_weights
        if self.module.input_names[:3] != QWEN2_INPUTS:
            raise UnsupportedError(f"vision encoder inputs {self.module.input_names}: only Qwen2-VL-style encoders "
                                   f"({', '.join(QWEN2_INPUTS)}) are supported", file=path, field="inputs")
        if len(self.module.input_names) > 3:
            raise UnsupportedError("Qwen2.5-VL window attention (window_index) is not supported yet", file=path,
                                   field="inputs")
        self.vision_us = 0

    def target_size(self, height: int | None, width: int | None) -> tuple[int, int]:
        """MNN's size: the <hw> tag's (or image_size's) height and width rounded to multiples of 28."""
        unit = PATCH_SIZE * MERGE_SIZE
        size = []
        for value, name in ((height, "height"), (width, "width")):
            value = self.image_size if value is None else int(value)
            rounded = _round_half_up(value / unit) * unit
            if rounded < unit:
                raise UnsupportedError(f"an image {name} of {value} rounds to {rounded}: at least {unit // 2} needed",
                                       field="hw")
            size.append(rounded)
        return size[0], size[1]

    def encode(self, image: ImageSource, height: int | None = None, width: int | None = None) -> VisionOutput:
        start = time.perf_counter()
        size = self.target_size(height, width)
        pixels = resize_normalize(load_image(image), *size, self.mean, self.norm)
        patches, position_ids, grid = qwen2_patches(pixels)
        tokens = patches.shape[0]
        feeds = {"patches": patches, "position_ids": position_ids,
                 "attention_mask": np.zeros((1, tokens, tokens), np.float32)}
        embeds = self.module.forward(feeds)[0]
        embeds = embeds.reshape(grid[0] * grid[1] * grid[2], -1)
        self.vision_us += int((time.perf_counter() - start) * 1e6)
        return VisionOutput(embeds, grid, size)

    def placement(self) -> dict:
        return self.module.placement()
