"""exp(x) for float32 in plain arithmetic, so loops that call it vectorize (a libm call per
element does not): Cody-Waite range reduction x = n ln2 + r, a degree-6 polynomial for e^r
(the classic single-precision minimax coefficients, ~1 ulp), and 2^n built from its bits."""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from . import jit

_LOG2E = np.float32(1.44269504088896341)
_LN2_HIGH = np.float32(0.693359375)
_LN2_LOW = np.float32(-2.12194440e-4)
_P = tuple(np.float32(c) for c in (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
                                   1.6666665459e-1, 5.0000001201e-1))
_HIGHEST = np.float32(88.72283)  # ln(FLT_MAX): e^x overflows float32 above
_LOWEST = np.float32(-86.6)  # 2^n stays a normal number above; below, the result is taken as 0


@intrinsic
def _float_from_bits(typingctx, bits):
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


@jit()
def exp32(x):
    """e^x (float32): 0 below -86.6 (where e^x < 2.5e-38), inf on overflow, NaN for NaN."""
    clamped = min(max(x, _LOWEST), _HIGHEST)
    n = np.floor(clamped * _LOG2E + np.float32(0.5))
    r = clamped - n * _LN2_HIGH - n * _LN2_LOW
    p = _P[0]
    for c in _P[1:]:
        p = p * r + c
    y = (p * r * r + r) + np.float32(1.0)
    y *= _float_from_bits((np.int32(n) + np.int32(126)) << np.int32(23))  # 2^(n-1): n reaches 128
    y *= np.float32(2.0)
    if x > _HIGHEST:
        y = np.float32(np.inf)
    if x < _LOWEST:
        y = np.float32(0.0)
    return y if x == x else x
