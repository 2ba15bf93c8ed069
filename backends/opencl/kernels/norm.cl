/* LayerNorm / RMSNorm, one work-item per normalized row (rows are short: the hidden size).
 * Row r holds `length` elements starting at (r / hw) * length * hw + r % hw, `hw` apart
 * (hw > 1: an NC4HW4 tensor normalized over channels). gamma/beta have `length` entries.
 * flags: 1 RMS, 2 gamma, 4 beta, 8 residual (sum = x + x2 is written, then normalized). */
__kernel void layernorm(__global const store_t *x, __global const store_t *x2, __global store_t *sum,
                        __global store_t *y, __global const float *gamma, __global const float *beta,
                        int length, int hw, float eps, int flags) {
    const int r = get_global_id(0);
    const size_t base = (size_t)(r / hw) * length * hw + r % hw;
    __global const store_t *src = x;
    float total = 0.0f;
    if (flags & 8) {
        for (int i = 0; i < length; ++i) {
            const size_t at = base + (size_t)i * hw;
            const float v = LD(x, at) + LD(x2, at);
            ST(sum, at, v);
            total += v;
        }
        src = sum;
    } else {
        for (int i = 0; i < length; ++i) total += LD(x, base + (size_t)i * hw);
    }
    const float mean = (flags & 1) ? 0.0f : total / length;
    float squares = 0.0f;
    for (int i = 0; i < length; ++i) {
        const float d = LD(src, base + (size_t)i * hw) - mean;
        squares += d * d;
    }
    const float inv = rsqrt(squares / length + eps);
    for (int i = 0; i < length; ++i) {
        const size_t at = base + (size_t)i * hw;
        float v = (LD(src, at) - mean) * inv;
        if (flags & 2) v *= gamma[i];
        if (flags & 4) v += beta[i];
        ST(y, at, v);
    }
}
