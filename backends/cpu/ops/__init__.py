"""Op creators of the cpu backend, one module per op family."""
from . import attention, elementwise, linear, norm, raster, rope, tensor_ops

CREATORS = {}
for _module in (raster, elementwise, linear, norm, rope, attention, tensor_ops):
    CREATORS.update(_module.CREATORS)
