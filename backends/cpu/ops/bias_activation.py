"""The epilogue of every cpu linear layer and convolution: the op's bias and fused activation,
in place. A file of its own so the fp32 and the packed linear layers share it without importing
each other."""
from __future__ import annotations

import numpy as np

from mnnllm_core.backend_api import RELU, RELU6


def finish(out: np.ndarray, bias: np.ndarray | None, activation: int) -> None:
    """The convolution's bias and activation, in place."""
    if bias is not None:
        out += bias
    if activation == RELU6:
        np.clip(out, 0, 6, out=out)
    elif activation == RELU:
        np.maximum(out, 0, out=out)
