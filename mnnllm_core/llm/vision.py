"""MNN's Omni vision front end: visual.mnn loaded through the same Module path as the LLM (its
own module, on the `mllm` backend or the LLM's, weights packed, placement with fallback), and
what every encoder family shares; vision_encoders.py chooses the family by the graph's inputs
as MNN's Omni::visionProcess does: `patches` first is the Qwen-VL family (vision_qwen2: Qwen2-VL;
vision_qwen3: Qwen3-VL and Qwen3.5, with idx_tensor / weight_tensor), a lone `pixel_values` is
Idefics3 / SmolVLM (vision_idefics3). Each family turns one image into the ids that stand for it in the prompt and the embedding rows
written over its image_pad ids."""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError, FormatError
from ..express.module import Module, NetModule
from ..express.runtime_manager import RuntimeManager
from ..express.static_module import Config
from .config import LlmConfig
from .image import ImageSource

DEFAULT_MEAN = [122.7709383, 116.7460125, 104.09373615]
DEFAULT_NORM = [0.01459843, 0.01500777, 0.01422007]


@dataclass
class VisionOutput:
    """One encoded image: `ids` stand for it in the prompt; `embeds` [pads, hidden] go over its
    image_pad ids in order; `grid` (t, h, w) is its merged grid for M-RoPE (Qwen-VL family);
    `deepstack` [layers, pads, hidden] the features added after the LLM's first layers (Qwen3-VL)."""

    ids: list[int]
    embeds: np.ndarray
    size: tuple[int, int]  # the (height, width) the image was resized to
    grid: tuple[int, int, int] | None = None
    deepstack: np.ndarray | None = None


def round_half_up(value: float) -> int:
    """C's round() for the positive sizes MNN rounds."""
    return int(math.floor(value + 0.5))


def token_id(config: LlmConfig, key: str) -> int:
    """A token id the config must give (vision_start, image_pad, ...)."""
    value = config.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise FormatError(f"{key} must be a token id, got {value!r}", file=config.origin(key) or config.source,
                          field=key)
    return value


class VisionEncoder:
    """visual.mnn and its preprocessing; `encode` turns one image into its VisionOutput.
    A family implements `_encode(image, height, width)`; `height`/`width` come from the prompt's
    <hw> tag (None without one)."""

    def __init__(self, config: LlmConfig, module: NetModule, tokenizer):
        self.config = config
        self.module = module
        self.tokenizer = tokenizer
        self.path = config.visual_model
        self.image_size = int(config.get("image_size", 448))
        self.mean = config.get("image_mean", DEFAULT_MEAN)
        self.norm = config.get("image_norm", DEFAULT_NORM)
        for key, value in (("image_mean", self.mean), ("image_norm", self.norm)):
            if not (isinstance(value, list) and len(value) == 3 and all(isinstance(v, (int, float)) for v in value)):
                raise ConfigError(f"{key} must be a list of three numbers, got {value!r}",
                                  file=config.origin(key), field=key)
        self.vision_us = 0

    def encode(self, image: ImageSource, height: int | None = None, width: int | None = None) -> VisionOutput:
        start = time.perf_counter()
        out = self._encode(image, height, width)
        self.vision_us += int((time.perf_counter() - start) * 1e6)
        return out

    def _encode(self, image: ImageSource, height: int | None, width: int | None) -> VisionOutput:
        raise NotImplementedError

    def target_size(self, height: int | None, width: int | None) -> tuple[int, int]:
        """The (height, width) an image with this <hw> tag (None: none) is resized to."""
        raise NotImplementedError

    def _rows(self, array: np.ndarray, batch: int, output: str) -> np.ndarray:
        """An encoder output as [batch, tokens, hidden_size] float32."""
        hidden = self.config.hidden_size
        if array.size == 0 or array.size % (batch * hidden):
            raise FormatError(f"the vision encoder's {output} has shape {list(array.shape)}, not {batch} image(s) of "
                              f"rows of hidden_size {hidden}", file=self.path, field=output)
        return np.asarray(array, np.float32).reshape(batch, -1, hidden)

    def placement(self) -> dict:
        return self.module.placement()


def load_vision_module(config: LlmConfig, runtime_manager: RuntimeManager) -> NetModule:
    path = config.visual_model
    if not os.path.isfile(path):
        raise ConfigError(f"visual_model names a file that does not exist: {path}",
                          file=config.origin("visual_model") or config.source, field="visual_model")
    llm_weights = runtime_manager.external_file  # the manager may be the LLM's: lend it, then give it back
    runtime_manager.set_external_file(path + ".weight")
    try:
        return Module.load([], [], path, runtime_manager, Config(rearrange=True))
    finally:
        runtime_manager.external_file = llm_weights

