"""Op creators of the webgpu backend, one module per op family (kernels in shaders/*.wgsl):
Raster, float BinaryOp / UnaryOp / Softmax, Cast int32 <-> float32, LayerNorm/RMSNorm, RoPE.
Every creator refuses a tensor larger than one storage binding; every other op runs on cpu."""
from . import elementwise, norm, raster, rope

CREATORS: dict = {}
for _module in (raster, elementwise, norm, rope):
    CREATORS.update(_module.CREATORS)
