/* Linear layer y[rows, oc] = x[rows, ic] . W^T + bias, on packed weights.
 *
 * NDRange: (oc * SPLIT, ceil(rows / TILE)), local (SPLIT, 1) when SPLIT > 1.
 *   TILE  tokens per work-item: 1 is the GEMV of decode; more reuses each dequantized
 *         weight vector across TILE tokens (the tiled GEMM of prefill).
 *   SPLIT work-items sharing one output row, each taking every SPLIT-th block and summing
 *         through local memory: 1 on a CPU device (one work-item per row, 16-wide loads),
 *         a work-group on a GPU. (A CPU device's one-token q4 layers run gemv_cpu.cl.)
 * Weight formats (see linear.py for the packing):
 *   linear_q4: per row ic/2 bytes; in each block of `block` weights (block % 32 == 0) byte j
 *              holds weight j in its low nibble and weight j + block/2 in its high nibble;
 *              value = nibble - 8.
 *   linear_q8: per row ic bytes, one code per weight, any block; value = code - offset.
 *   both:      sz[row * n_blocks + block] = (scale, zero); w = value * scale + zero.
 *   linear_f:  [oc, ic] fp32, or fp16 with WEIGHT_HALF.
 */

/* what a work-item of output row o holds: its tokens' x rows and accumulators */
#define ROW_SETUP                                                              \
    const int o = (int)get_global_id(0) / SPLIT;                              \
    const int lid = SPLIT > 1 ? (int)get_local_id(0) : 0;                     \
    const int t0 = (int)get_global_id(1) * TILE;                              \
    __global const store_t *xr[TILE];                                         \
    for (int t = 0; t < TILE; ++t)                                            \
        xr[t] = x + (size_t)min(t0 + t, rows - 1) * ic;                       \
    float16 acc[TILE];                                                        \
    float tail[TILE];                                                         \
    for (int t = 0; t < TILE; ++t) { acc[t] = (float16)(0.0f); tail[t] = 0.0f; }

static void finish_rows(float16 *acc, float *tail, __local float *part, int lid, int o, int oc,
                        int t0, int rows, __global const float *bias, int has_bias, int act,
                        __global store_t *y) {
    float sums[TILE];
    for (int t = 0; t < TILE; ++t) sums[t] = sum16(acc[t]) + tail[t];
#if SPLIT > 1
    for (int t = 0; t < TILE; ++t) part[t * SPLIT + lid] = sums[t];
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = SPLIT / 2; s > 0; s >>= 1) {
        if (lid < s)
            for (int t = 0; t < TILE; ++t) part[t * SPLIT + lid] += part[t * SPLIT + lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid != 0) return;
    for (int t = 0; t < TILE; ++t) sums[t] = part[t * SPLIT];
#endif
    const float b = has_bias ? bias[o] : 0.0f;
    for (int t = 0; t < TILE; ++t)
        if (t0 + t < rows) ST(y, (size_t)(t0 + t) * oc + o, activate(sums[t] + b, act));
}

/* code - 8 for a 4-bit code: the code as the low mantissa bits of 2^23, minus 2^23 + 8 (exact;
 * two integer/float ops, where pocl's uchar -> float conversion takes several) */
static inline float16 nibble_value(uint16 code) {
    return as_float16(code | 0x4B000000u) - 8388616.0f;
}

__kernel void linear_q4(__global const store_t *x, __global const uchar *w, __global const float2 *sz,
                        __global const float *bias, __global store_t *y, int ic, int oc, int rows,
                        int block, int offset, int has_bias, int act) {
    ROW_SETUP
    __local float part[TILE * SPLIT];
    const int nb = ic / block, half_block = block / 2;
    __global const uchar *wr = w + (size_t)o * (ic / 2);
    for (int b = lid; b < nb; b += SPLIT) {
        const float2 s = sz[(size_t)o * nb + b];
        const float16 scale = (float16)(s.x), zero = (float16)(s.y);
        for (int j = 0; j < half_block; j += 16) {
            const uint16 c = convert_uint16(vload16(0, wr + b * half_block + j));
            const float16 lo = fma(nibble_value(c & 15u), scale, zero);
            const float16 hi = fma(nibble_value(c >> 4), scale, zero);
            const int base = b * block + j;
            for (int t = 0; t < TILE; ++t) {
                acc[t] = fma(lo, LD16(xr[t], base), acc[t]);
                acc[t] = fma(hi, LD16(xr[t], base + half_block), acc[t]);
            }
        }
    }
    finish_rows(acc, tail, part, lid, o, oc, t0, rows, bias, has_bias, act, y);
}

__kernel void linear_q8(__global const store_t *x, __global const uchar *w, __global const float2 *sz,
                        __global const float *bias, __global store_t *y, int ic, int oc, int rows,
                        int block, int offset, int has_bias, int act) {
    ROW_SETUP
    __local float part[TILE * SPLIT];
    const int nb = ic / block;
    __global const uchar *wr = w + (size_t)o * ic;
    const float off = (float)offset;
    for (int b = lid; b < nb; b += SPLIT) {
        const float2 s = sz[(size_t)o * nb + b];
        const int start = b * block, end = start + block;
        int j = start;
        for (; j + 16 <= end; j += 16) {
            const float16 wv = fma(convert_float16(vload16(0, wr + j)) - off, (float16)(s.x), (float16)(s.y));
            for (int t = 0; t < TILE; ++t) acc[t] = fma(wv, LD16(xr[t], j), acc[t]);
        }
        for (; j < end; ++j) {
            const float wv = fma((float)wr[j] - off, s.x, s.y);
            for (int t = 0; t < TILE; ++t) tail[t] = fma(wv, LD(xr[t], j), tail[t]);
        }
    }
    finish_rows(acc, tail, part, lid, o, oc, t0, rows, bias, has_bias, act, y);
}

#ifdef WEIGHT_HALF
#define LDW16(p, i) vload_half16(0, (p) + (i))
#define LDW(p, i) vload_half((i), (p))
typedef half weight_t;
#else
#define LDW16(p, i) vload16(0, (p) + (i))
#define LDW(p, i) ((p)[i])
typedef float weight_t;
#endif

__kernel void linear_f(__global const store_t *x, __global const weight_t *w, __global const float2 *sz,
                       __global const float *bias, __global store_t *y, int ic, int oc, int rows,
                       int block, int offset, int has_bias, int act) {
    ROW_SETUP
    __local float part[TILE * SPLIT];
    __global const weight_t *wr = w + (size_t)o * ic;
    const int vec_end = ic / 16 * 16;
    for (int j = lid * 16; j < vec_end; j += 16 * SPLIT) {
        const float16 wv = LDW16(wr, j);
        for (int t = 0; t < TILE; ++t) acc[t] = fma(wv, LD16(xr[t], j), acc[t]);
    }
    for (int j = vec_end + lid; j < ic; j += SPLIT) {
        const float wv = LDW(wr, j);
        for (int t = 0; t < TILE; ++t) tail[t] = fma(wv, LD(xr[t], j), tail[t]);
    }
    finish_rows(acc, tail, part, lid, o, oc, t0, rows, bias, has_bias, act, y);
}

