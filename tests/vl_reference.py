"""transformers' Qwen2-VL vision tower rebuilt from the shared tiny export (../shared/models/vl):
its config as the export's README/hf_config.json describe it, its weights read from
visual.mnn.weight op by op (the fp16 export stores them exactly), computed in fp32 by torch."""
from __future__ import annotations

import json

import numpy as np
import pytest

from mnnllm_core.core.weights.file import ExternalWeightFile
from mnnllm_core.core.weights.op_weights import OpWeights
from mnnllm_core.schema.reader import op_type_name, read_net_file
from paths import SHARED

VL_DIR = SHARED / "models" / "vl"
FP16 = VL_DIR / "tiny-qwen2_vl-mnn-fp16"
Q4 = VL_DIR / "tiny-qwen2_vl-mnn-q4"
IMAGE = VL_DIR / "test_image.png"
VISION = {"depth": 2, "embed_dim": 32, "hidden_size": 64, "mlp_ratio": 2, "num_heads": 2, "in_channels": 3,
          "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "hidden_act": "quick_gelu"}
# graph op name -> (state dict key, what it holds); q, k and v are three ops in the graph, one qkv in HF
_BLOCK_OPS = [("/Add_{q}_output_0__matmul_converted", "attn.q"), ("/Add_{k}_output_0__matmul_converted", "attn.k"),
              ("/Add_{v}_output_0__matmul_converted", "attn.v"), ("/proj{s}/Add_output_0__matmul_converted", "attn.proj"),
              ("/mlp/fc1{s}/Add_output_0__matmul_converted", "mlp.fc1"),
              ("/mlp/fc2{s}/Add_output_0__matmul_converted", "mlp.fc2"),
              ("/norm1{s}/Add_1_output_0", "norm1"), ("/norm2{s}/Add_1_output_0", "norm2")]


def reference() -> dict:
    if not (VL_DIR / "reference.json").exists():
        pytest.skip(f"the shared vision-language model is not at {VL_DIR}")
    return json.loads((VL_DIR / "reference.json").read_text())


def _op_weights(folder) -> dict[str, OpWeights]:
    path = str(folder / "visual.mnn")
    net = read_net_file(path)
    weight_file = ExternalWeightFile(path + ".weight")
    return {op.name.decode() if isinstance(op.name, bytes) else op.name: OpWeights(op.name, op.main, weight_file, path)
            for op in net.oplists if op_type_name(op.type) in ("Convolution", "LayerNorm")}


def vision_tower(folder=FP16):
    """The HF vision tower with the export's weights (dequantized exactly as MNN does for q4)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel
    config = Qwen2VLVisionConfig(**VISION)
    config._attn_implementation = "eager"
    model = Qwen2VisionTransformerPretrainedModel._from_config(config).float().eval()
    ops = _op_weights(folder)
    state: dict[str, np.ndarray] = {}

    def linear(name: str):
        weights = ops[name].convolution()
        bias = weights.bias if weights.bias is not None else np.zeros(weights.quantized.oc, np.float32)
        return weights.dequantize(), bias

    halves = [linear(f"/patch_embed/proj/Conv_output_0__{t}")[0].reshape(32, 3, 14, 14) for t in (0, 1)]
    state["patch_embed.proj.weight"] = np.stack(halves, axis=2)
    for block in range(VISION["depth"]):
        suffix = "" if block == 0 else f"_{block}"
        first = 8 * block  # /Add_N numbering: 0, 1, 2 for block 0, 8, 9, 10 for block 1
        parts = {}
        for pattern, key in _BLOCK_OPS:
            name = pattern.format(q=first or "", k=first + 1, v=first + 2, s=suffix).replace("/Add__", "/Add_")
            name = name.replace("/Add__output", "/Add_output")
            if key.startswith("norm"):
                gamma, beta = ops[name].layernorm()
                state[f"blocks.{block}.{key}.weight"], state[f"blocks.{block}.{key}.bias"] = gamma, beta
            else:
                parts[key] = linear(name)
        for key in ("attn.proj", "mlp.fc1", "mlp.fc2"):
            state[f"blocks.{block}.{key}.weight"], state[f"blocks.{block}.{key}.bias"] = parts[key]
        state[f"blocks.{block}.attn.qkv.weight"] = np.concatenate([parts[k][0] for k in ("attn.q", "attn.k", "attn.v")])
        state[f"blocks.{block}.attn.qkv.bias"] = np.concatenate([parts[k][1] for k in ("attn.q", "attn.k", "attn.v")])
    state["merger.ln_q.weight"], state["merger.ln_q.bias"] = ops["/merger/ln_q/Add_1_output_0"].layernorm()
    for index in (0, 2):
        w, b = linear(f"/merger/mlp/mlp.{index}/Gemm_output_0__matmul_converted")
        state[f"merger.mlp.{index}.weight"], state[f"merger.mlp.{index}.bias"] = w, b
    model.load_state_dict({k: torch.from_numpy(np.asarray(v, np.float32)) for k, v in state.items()}, strict=True)
    return model


def hf_image_embeds(model, pixel_values: np.ndarray, grid_thw: list[list[int]]) -> np.ndarray:
    import torch
    with torch.no_grad():
        out = model(torch.from_numpy(pixel_values.astype(np.float32)), grid_thw=torch.tensor(grid_thw))
    out = getattr(out, "pooler_output", out)
    return (out[0] if isinstance(out, tuple) else out).numpy()


def hf_processor_patches(image_path) -> tuple[np.ndarray, list[list[int]]]:
    """pixel_values and image_grid_thw of transformers' Qwen2-VL image processor for one image."""
    pytest.importorskip("transformers")
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil as Qwen2VLImageProcessor
    processor = Qwen2VLImageProcessor(patch_size=14, temporal_patch_size=2, merge_size=2)
    with Image.open(image_path) as image:
        out = processor(images=image.convert("RGB"), return_tensors="np")
    return np.asarray(out["pixel_values"]), np.asarray(out["image_grid_thw"]).tolist()
