"""Op creators of the opencl backend, one module per op family (kernels in kernels/)."""
from . import attention, elementwise, linear, norm, raster, rope

CREATORS = {}
for _module in (raster, elementwise, linear, norm, rope, attention):
    CREATORS.update(_module.CREATORS)
