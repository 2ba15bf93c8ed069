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

from ..errors import ConfigError, ContextLengthError, FormatError
from ..express.module import Module, NetModule
from ..express.runtime_manager import RuntimeManager
from ..express.static_module import Config
from .config import LlmConfig
from .image import ImageSource

DEFAULT_MEAN = [122.7709383, 116.7460125, 104.09373615]
DEFAULT_NORM = [0.01459843, 0.01500777, 0.01422007]
DEFAULT_MAX_SIZE = 2048  # MNN's Omni reads image_max_size with this default


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
        self.max_side = config.get("image_max_size", DEFAULT_MAX_SIZE)
        if not isinstance(self.max_side, int) or isinstance(self.max_side, bool) or self.max_side < 1:
            raise ConfigError(f"image_max_size must be a positive integer, got {self.max_side!r}",
                              file=config.origin("image_max_size") or config.source, field="image_max_size")
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

    def requested_size(self, height: int | None, width: int | None) -> tuple[int, int]:
        """The <hw> tag's height and width (image_size without one), each at most image_max_size:
        checked before any pixel is resized or any patch built."""
        size = []
        for value, name in ((height, "height"), (width, "width")):
            field = "hw" if value is not None else "image_size"
            value = self.image_size if value is None else int(value)
            if value > self.max_side:
                raise ConfigError(f"an image {name} of {value} is larger than image_max_size {self.max_side}",
                                  file=None if field == "hw" else self.config.origin("image_size"), field=field)
            size.append(value)
        return size[0], size[1]

    def check_tokens(self, tokens: int, height: int, width: int) -> None:
        """An image whose tokens alone pass max_all_tokens is refused before it is encoded."""
        limit = self.config.max_all_tokens
        if tokens > limit:
            raise ContextLengthError(f"an image resized to {height}x{width} stands for {tokens} tokens; "
                                     f"max_all_tokens is {limit}", field="hw")

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

