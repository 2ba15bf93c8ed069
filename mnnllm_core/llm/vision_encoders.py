"""The vision encoder of a visual.mnn, its family chosen by the graph's inputs as MNN's
Omni::visionProcess does (the families build on vision.py's VisionEncoder)."""
from __future__ import annotations

from ..errors import UnsupportedError
from ..express.runtime_manager import RuntimeManager
from .config import LlmConfig
from .vision import VisionEncoder, load_vision_module
from .vision_idefics3 import Idefics3VisionEncoder
from .vision_qwen2 import Qwen2VisionEncoder
from .vision_qwen3 import QWEN3_INPUTS, Qwen3VisionEncoder


def create_vision_encoder(config: LlmConfig, runtime_manager: RuntimeManager, tokenizer) -> VisionEncoder:
    """MNN's choice by the encoder's inputs: `patches` first (Qwen2-VL, or Qwen3-VL with
    idx_tensor), or a lone `pixel_values` (Idefics3 / SmolVLM)."""
    module = load_vision_module(config, runtime_manager)
    inputs = module.input_names
    if inputs == QWEN3_INPUTS:
        return Qwen3VisionEncoder(config, module, tokenizer)
    if inputs[:1] == ["patches"]:
        return Qwen2VisionEncoder(config, module, tokenizer)
    if inputs == ["pixel_values"]:
        return Idefics3VisionEncoder(config, module, tokenizer)
    raise UnsupportedError(f"vision encoder inputs {inputs}: mnnllm runs Qwen2-VL ({', '.join(QWEN3_INPUTS[:3])}), "
                           f"Qwen3-VL ({', '.join(QWEN3_INPUTS)}) and Idefics3/SmolVLM (pixel_values) encoders",
                           file=config.visual_model, field="inputs")
