"""Op creators of the opencl backend, one module per op family (kernels in kernels/)."""
from . import attention, elementwise, linear, norm, raster, rope, slot_attention

CREATORS = {}
for _module in (raster, elementwise, linear, norm, rope, attention, slot_attention):
    CREATORS.update(_module.CREATORS)
