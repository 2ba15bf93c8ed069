"""Op creators of the cpu backend, one module per op family."""
from . import (attention, convolution2d, elementwise, linear, linear_attention, moe, norm, raster, rope, slicing,
               tensor_ops)

CREATORS = {}
for _module in (raster, elementwise, linear, convolution2d, norm, rope, attention, linear_attention, tensor_ops, moe,
                slicing):
    CREATORS.update(_module.CREATORS)
