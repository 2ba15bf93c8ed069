"""Op creators of the cpu backend, one module per op family."""
from . import attention, elementwise, linear, moe, norm, raster, rope, tensor_ops

CREATORS = {}
for _module in (raster, elementwise, linear, norm, rope, attention, tensor_ops, moe):
    CREATORS.update(_module.CREATORS)
