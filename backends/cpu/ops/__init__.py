"""Op creators of the cpu backend, one module per op family."""
from . import attention, convolution2d, elementwise, linear, norm, raster, rope, slicing, tensor_ops

CREATORS = {}
for _module in (raster, elementwise, linear, convolution2d, norm, rope, attention, tensor_ops, slicing):
    CREATORS.update(_module.CREATORS)
