"""The ops the torch backend runs: Convolution (1x1, as a linear layer), LayerNorm (RMS and
plain, with MNN's fused residual form), BinaryOp on float tensors, and Raster.

Every other op type (RoPE, Attention, UnaryOp, Cast, ...) has no creator here, and a creator
refuses a form it does not take: the pipeline then runs that op on the cpu backend and copies
its tensors across. Executions bind views of their tensors' storage in `on_resize` (storage is
fixed from then until the next resize), so `on_execute` is only the torch calls.
"""
from . import elementwise, linear, norm, raster

CREATORS = {}
for _module in (linear, norm, elementwise, raster):
    CREATORS.update(_module.CREATORS)
