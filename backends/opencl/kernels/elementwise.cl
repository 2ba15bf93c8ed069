/* Float BinaryOp with broadcasting, UnaryOp, and Cast; one work-item per output element.
 * Binary: the output is viewed as 4-D `shape`; each input is read at the dot product of the
 * element's coordinates with its strides (0 along a broadcast axis); binary_*_flat is the
 * same op on inputs of the output's shape, without the index arithmetic. */

#define BINARY(name, expr)                                                                      \
__kernel void binary_##name(__global const store_t *A, __global const store_t *B,               \
                            __global store_t *C, int4 shape, int4 sa, int4 sb, int act) {       \
    const int i = get_global_id(0);                                                             \
    int rest = i;                                                                               \
    const int i3 = rest % shape.w; rest /= shape.w;                                             \
    const int i2 = rest % shape.z; rest /= shape.z;                                             \
    const int i1 = rest % shape.y; const int i0 = rest / shape.y;                               \
    const float a = LD(A, i0 * sa.x + i1 * sa.y + i2 * sa.z + i3 * sa.w);                       \
    const float b = LD(B, i0 * sb.x + i1 * sb.y + i2 * sb.z + i3 * sb.w);                       \
    ST(C, i, activate(expr, act));                                                              \
}                                                                                               \
__kernel void binary_##name##_flat(__global const store_t *A, __global const store_t *B,        \
                                   __global store_t *C, int act) {                              \
    const int i = get_global_id(0);                                                             \
    const float a = LD(A, i), b = LD(B, i);                                                     \
    ST(C, i, activate(expr, act));                                                              \
}

BINARY(ADD, a + b)
BINARY(SUB, a - b)
BINARY(MUL, a * b)
BINARY(REALDIV, a / b)
BINARY(MAXIMUM, fmax(a, b))
BINARY(MINIMUM, fmin(a, b))
BINARY(POW, pow(a, b))
BINARY(SquaredDifference, (a - b) * (a - b))
BINARY(ATAN2, atan2(a, b))
BINARY(MOD, fmod(a, b))
BINARY(FLOORDIV, floor(a / b))
BINARY(FLOORMOD, a - floor(a / b) * b)
BINARY(MUL_SILU, a * silu(b))

#define UNARY(name, expr)                                                                       \
__kernel void unary_##name(__global const store_t *X, __global store_t *Y) {                    \
    const int i = get_global_id(0);                                                             \
    const float x = LD(X, i);                                                                   \
    ST(Y, i, expr);                                                                             \
}

UNARY(ABS, fabs(x))
UNARY(NEG, -x)
UNARY(FLOOR, floor(x))
UNARY(CEIL, ceil(x))
UNARY(SQUARE, x * x)
UNARY(SQRT, sqrt(x))
UNARY(RSQRT, rsqrt(x))
UNARY(EXP, exp(x))
UNARY(LOG, log(x))
UNARY(SIN, sin(x))
UNARY(COS, cos(x))
UNARY(TAN, tan(x))
UNARY(ASIN, asin(x))
UNARY(ACOS, acos(x))
UNARY(ATAN, atan(x))
UNARY(RECIPROCAL, 1.0f / x)
UNARY(LOG1P, log1p(x))
UNARY(BNLL, log1p(exp(x)))
UNARY(ACOSH, acosh(x))
UNARY(SINH, sinh(x))
UNARY(ASINH, asinh(x))
UNARY(ATANH, atanh(x))
UNARY(SIGN, sign(x))
UNARY(ROUND, round(x))
UNARY(COSH, cosh(x))
UNARY(EXPM1, expm1(x))
UNARY(SIGMOID, 1.0f / (1.0f + exp(-x)))
UNARY(TANH, tanh(x))
UNARY(HARDSWISH, x * clamp(x + 3.0f, 0.0f, 6.0f) / 6.0f)
UNARY(SILU, silu(x))
UNARY(GELU, 0.5f * x * (1.0f + tanh(0.7978845608f * (x + 0.044715f * x * x * x))))
UNARY(GELU_STANDARD, 0.5f * x * (1.0f + erf(x * 0.70710678118f)))
UNARY(ERF, erf(x))

__kernel void cast_int_to_float(__global const int *X, __global store_t *Y) {
    const int i = get_global_id(0);
    ST(Y, i, (float)X[i]);
}

__kernel void cast_float_to_int(__global const store_t *X, __global int *Y) {
    const int i = get_global_id(0);
    Y[i] = (int)LD(X, i);
}
