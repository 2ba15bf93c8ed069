"""Op creators of the cpu backend, one module per op family."""
from . import attention, elementwise, linear, linear_attention, moe, norm, raster, rope, tensor_ops

CREATORS = {}
for _module in (raster, elementwise, linear, norm, rope, attention, linear_attention, tensor_ops, moe):
    CREATORS.update(_module.CREATORS)
