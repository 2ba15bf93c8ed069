/* The prefill linear y[rows, oc] = x[rows, ic] . W^T + bias for a CPU device (pocl), on the
 * packed weights of linear.cl (same arguments, same layouts: see linear.py).
 *
 * Work-group: OB output rows x (local size * T) tokens. The work-items first dequantize a
 * KB-wide slice of the group's OB weight rows once into local memory, transposed to wt[k][row];
 * then each work-item runs an outer-product micro-kernel over that slice for its T tokens:
 * per k, OB/8 float8 loads of wt and T broadcasts of x feed T * OB/8 fmas, all accumulators in
 * registers. So a weight is dequantized once per group (not once per token tile) and no
 * horizontal sums are needed. NDRange: (ceil(rows / T) rounded up to the local size,
 * ceil(oc / OB)), local (local size, 1). KB is a multiple of the quantization block (q4) or of
 * 16 (q8, whose block is a multiple of 16; f, whose ic is). */

#ifdef HALF_STORAGE
#define ST8(p, i, v) vstore_half8((v), 0, (p) + (i))
#else
#define ST8(p, i, v) vstore8((v), 0, (p) + (i))
#endif

#ifdef WEIGHT_HALF
typedef half weight_t;
#define LDW16(p, i) vload_half16(0, (p) + (i))
#else
typedef float weight_t;
#define LDW16(p, i) vload16(0, (p) + (i))
#endif

static inline float8 activate8(float8 v, int act) {
    return act == 1 ? fmax(v, 0.0f) : act == 2 ? clamp(v, 0.0f, 6.0f) : v;
}

/* weights k..k+15 of the group's row r, into wt[k][r] */
static inline void put16(__local float *wt, int k, int r, float16 v) {
    float lanes[16];
    vstore16(v, 0, lanes);
    _Pragma("unroll") for (int e = 0; e < 16; ++e) wt[(k + e) * OB + r] = lanes[e];
}

/* q4: one item per (row, quantization block): block/2 bytes, low nibbles the first half */
static void dequant_q4(__local float *wt, __global const uchar *w, __global const float2 *sz, int ic, int oc,
                       int o0, int k0, int kn, int block, int offset, int lid, int nl) {
    const int nb = ic / block, half_block = block / 2, blocks = kn / block;
    for (int item = lid; item < OB * blocks; item += nl) {
        const int r = item / blocks, bl = item % blocks;
        const int o = min(o0 + r, oc - 1), b = k0 / block + bl;
        const float2 s = sz[(size_t)o * nb + b];
        const float zero = s.y - 8.0f * s.x;
        __global const uchar *src = w + (size_t)o * (ic / 2) + (size_t)b * half_block;
        for (int j = 0; j < half_block; j += 16) {
            const uchar16 c = vload16(0, src + j);
            put16(wt, bl * block + j, r, fma(convert_float16(c & (uchar16)(15)), (float16)(s.x), (float16)(zero)));
            put16(wt, bl * block + half_block + j, r, fma(convert_float16(c >> (uchar16)(4)), (float16)(s.x),
                                                          (float16)(zero)));
        }
    }
}

/* q8: one item per (row, 16 codes); block % 16 == 0, so the 16 share one (scale, zero) */
static void dequant_q8(__local float *wt, __global const uchar *w, __global const float2 *sz, int ic, int oc,
                       int o0, int k0, int kn, int block, int offset, int lid, int nl) {
    const int nb = ic / block, runs = kn / 16;
    for (int item = lid; item < OB * runs; item += nl) {
        const int r = item / runs, k = k0 + (item % runs) * 16;
        const int o = min(o0 + r, oc - 1);
        const float2 s = sz[(size_t)o * nb + k / block];
        const float16 codes = convert_float16(vload16(0, w + (size_t)o * ic + k)) - (float)offset;
        put16(wt, k - k0, r, fma(codes, (float16)(s.x), (float16)(s.y)));
    }
}

/* f: one item per (row, 16 weights); ic % 16 == 0 */
static void dequant_f(__local float *wt, __global const weight_t *w, __global const float2 *sz, int ic, int oc,
                      int o0, int k0, int kn, int block, int offset, int lid, int nl) {
    const int runs = kn / 16;
    for (int item = lid; item < OB * runs; item += nl) {
        const int r = item / runs, k = k0 + (item % runs) * 16;
        put16(wt, k - k0, r, LDW16(w + (size_t)min(o0 + r, oc - 1) * ic, k));
    }
}

#define LINEAR_CPU(name, wtype, dequant)                                                               \
__kernel void name(__global const store_t *x, __global const wtype *w, __global const float2 *sz,         \
                   __global const float *bias, __global store_t *y, int ic, int oc, int rows, int block,  \
                   int offset, int has_bias, int act) {                                                   \
    __local float wt[KB * OB];                                                                            \
    const int lid = (int)get_local_id(0), nl = (int)get_local_size(0);                                    \
    const int o0 = (int)get_group_id(1) * OB, t0 = (int)get_global_id(0) * T;                             \
    __global const store_t *xr[T];                                                                        \
    float8 acc[T][OB / 8];                                                                                \
    _Pragma("unroll") for (int t = 0; t < T; ++t) {                                                       \
        xr[t] = x + (size_t)min(t0 + t, rows - 1) * ic;                                                   \
        _Pragma("unroll") for (int c = 0; c < OB / 8; ++c) acc[t][c] = (float8)(0.0f);                    \
    }                                                                                                     \
    for (int k0 = 0; k0 < ic; k0 += KB) {                                                                 \
        const int kn = min(KB, ic - k0);                                                                  \
        dequant(wt, w, sz, ic, oc, o0, k0, kn, block, offset, lid, nl);                                   \
        barrier(CLK_LOCAL_MEM_FENCE);                                                                     \
        for (int k = 0; k < kn; ++k) {                                                                    \
            float8 wv[OB / 8];                                                                            \
            _Pragma("unroll") for (int c = 0; c < OB / 8; ++c) wv[c] = vload8(0, wt + k * OB + c * 8);    \
            _Pragma("unroll") for (int t = 0; t < T; ++t) {                                               \
                const float8 xs = (float8)(LD(xr[t], k0 + k));                                            \
                _Pragma("unroll") for (int c = 0; c < OB / 8; ++c) acc[t][c] = fma(xs, wv[c], acc[t][c]); \
            }                                                                                             \
        }                                                                                                 \
        barrier(CLK_LOCAL_MEM_FENCE);                                                                     \
    }                                                                                                     \
    _Pragma("unroll") for (int c = 0; c < OB / 8; ++c) {                                                  \
        const int o = o0 + c * 8;                                                                         \
        float8 b = (float8)(0.0f);                                                                        \
        if (has_bias) {                                                                                   \
            if (o + 8 <= oc) b = vload8(0, bias + o);                                                     \
            else for (int e = 0; o + e < oc; ++e) b[e] = bias[o + e];                                     \
        }                                                                                                 \
        _Pragma("unroll") for (int t = 0; t < T; ++t) {                                                   \
            if (t0 + t >= rows) break;                                                                    \
            const float8 v = activate8(acc[t][c] + b, act);                                               \
            const size_t at = (size_t)(t0 + t) * oc + o;                                                  \
            if (o + 8 <= oc) ST8(y, at, v);                                                               \
            else for (int e = 0; o + e < oc; ++e) ST(y, at + e, v[e]);                                    \
        }                                                                                                 \
    }                                                                                                     \
}

LINEAR_CPU(linear_cpu_f, weight_t, dequant_f)
LINEAR_CPU(linear_cpu_q4, uchar, dequant_q4)
LINEAR_CPU(linear_cpu_q8, uchar, dequant_q8)
