"""Op creators of the vulkan backend, one module per op family (shaders in shaders/*.comp):
Raster, float BinaryOp / UnaryOp, Cast int32 <-> float32, Convolution 1x1 as a linear layer,
LayerNorm/RMSNorm, RoPE and Attention with a device KV cache (slot-aware: slot_attention.py). Everything else runs on cpu.
Every creator refuses a tensor or weight larger than maxStorageBufferRange (or, read as texels,
maxTexelBufferElements)."""
from . import attention, elementwise, linear, norm, raster, rope, slot_attention

CREATORS = {}
for _module in (raster, elementwise, linear, norm, rope, attention, slot_attention):
    CREATORS.update(_module.CREATORS)
