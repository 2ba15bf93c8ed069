"""Op creators of the webgpu backend, one module per op family (kernels in shaders/*.wgsl):
Raster, GatherV2, float BinaryOp / UnaryOp / ReLU / TanH / Sigmoid / Softmax, Cast int32 <-> float32,
Convolution 1x1 as a linear layer (2- to 8-bit block-quantized or float weights; fp16 weights kept
fp16 where the adapter has shader-f16: linear_f16, which hands the rest to linear), LayerNorm /
RMSNorm, RoPE and Attention with its KV cache on the device.
Every creator refuses a tensor larger than one storage binding; every other op runs on cpu."""
from . import attention, elementwise, gather, linear, linear_f16, norm, raster, rope

CREATORS: dict = {}
for _module in (raster, gather, elementwise, linear, linear_f16, norm, rope, attention):  # later wins
    CREATORS.update(_module.CREATORS)
