"""Op creators of the cpu backend, one module per op family."""
from . import (attention, convolution2d, elementwise, fill, gather, linear, linear_attention, matmul, moe, norm, raster,
               reduction, rope, slicing, slot_attention, topk)

CREATORS = {}
for _module in (raster, elementwise, linear, convolution2d, norm, rope, attention, linear_attention, gather, matmul,
                reduction, topk, fill, moe, slicing, slot_attention):
    CREATORS.update(_module.CREATORS)
