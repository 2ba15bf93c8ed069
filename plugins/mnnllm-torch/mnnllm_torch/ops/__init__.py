"""The ops the torch backend runs: Convolution (1x1, as a linear layer), LayerNorm (RMS and
plain, with MNN's fused residual form), BinaryOp and UnaryOp on float tensors, Cast, Raster,
RoPE, and Attention with its KV cache on the device: the whole decode step of a llama-style
model, so a replay can hold it (replay.py).

Every other op type (MoE, LinearAttention, ...) has no creator here, and a creator
refuses a form it does not take: the pipeline then runs that op on the cpu backend and copies
its tensors across. Executions bind views of their tensors' storage in `on_resize` (storage is
fixed from then until the next resize), so `on_execute` is only the torch calls.
"""
from . import attention, elementwise, linear, norm, raster, rope

CREATORS = {}
for _module in (linear, norm, elementwise, raster, rope, attention):
    CREATORS.update(_module.CREATORS)
