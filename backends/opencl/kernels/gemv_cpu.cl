/* The one-token 4-bit linear y[oc] = x[ic] . W^T + bias for a CPU device (pocl), on linear.cl's
 * q4 layout (see linear.py): what every decode step spends most of its time in.
 *
 * One work-item per output row, in work-groups of GEMV_GROUP rows. The group first stages x in
 * local memory as floats (so fp16 activations are widened once, not once per row) with its
 * block sums X_b; then a row's blocks are summed with the zero term factored out:
 *     y = sum_b s_b * P_b + (z_b - 8 s_b) * X_b,   P_b = sum_j code_j * x_j,
 * so a weight costs one int -> float conversion and one fma (the dequantize-then-multiply of
 * linear_q4 costs four vector ops more per 16 weights, and pocl's kernels are bound by those
 * ops, not by memory). NDRange: (oc rounded up to GEMV_GROUP), local (GEMV_GROUP); the local
 * argument holds ic + ic / block floats. */

static void stage_x(__global const store_t *x, __local float *xl, int ic, int block) {
    const int lid = get_local_id(0), group = get_local_size(0), nb = ic / block;
    __local float *xsum = xl + ic;
    for (int b = lid; b < nb; b += group) {
        float16 s = (float16)(0.0f);
        for (int j = 0; j < block; j += 16) {
            const float16 v = LD16(x, b * block + j);
            vstore16(v, 0, xl + b * block + j);
            s += v;
        }
        xsum[b] = sum16(s);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
}

/* row o of one layer, from the staged x */
static float q4_row(__local const float *xl, __global const uchar *w, __global const float2 *sz, int ic,
                    int block, int o) {
    const int nb = ic / block, half_block = block / 2;
    __local const float *xsum = xl + ic;
    __global const uchar *wr = w + (size_t)o * (ic / 2);
    __global const float2 *sr = sz + (size_t)o * nb;
    float16 acc = (float16)(0.0f);
    float zero_terms = 0.0f;
    for (int b = 0; b < nb; ++b) {
        const float2 s = sr[b];
        float16 lo = (float16)(0.0f), hi = (float16)(0.0f);
        for (int j = 0; j < half_block; j += 16) {
            const int16 c = convert_int16(vload16(0, wr + b * half_block + j));
            lo = fma(convert_float16(c & 15), vload16(0, xl + b * block + j), lo);
            hi = fma(convert_float16(c >> 4), vload16(0, xl + b * block + j + half_block), hi);
        }
        acc = fma(lo + hi, (float16)(s.x), acc);
        zero_terms = fma(fma(-8.0f, s.x, s.y), xsum[b], zero_terms);
    }
    return sum16(acc) + zero_terms;
}

static void q4_out(__global store_t *y, __global const float *bias, int has_bias, int act, int o, float sum) {
    ST(y, o, activate(sum + (has_bias ? bias[o] : 0.0f), act));
}

__kernel void gemv_q4(__global const store_t *x, __global const uchar *w, __global const float2 *sz,
                      __global const float *bias, __global store_t *y, int ic, int oc, int block, int has_bias,
                      int act, __local float *xl) {
    stage_x(x, xl, ic, block);
    const int o = get_global_id(0);
    if (o < oc)
        q4_out(y, bias, has_bias, act, o, q4_row(xl, w, sz, ic, block, o));
}

/* A few tokens (a batch's decode rows, one per KV slot; a short prompt chunk): gemv_q4 for each,
 * dimension 1 of the NDRange naming the token (local size (GEMV_GROUP, 1), so a group stages one
 * token's x). Each token's values equal gemv_q4's on that token alone, bit for bit. */
__kernel void gemv_q4_tokens(__global const store_t *x, __global const uchar *w, __global const float2 *sz,
                             __global const float *bias, __global store_t *y, int ic, int oc, int block,
                             int has_bias, int act, __local float *xl) {
    const int t = get_global_id(1);
    stage_x(x + (size_t)t * ic, xl, ic, block);
    const int o = get_global_id(0);
    if (o < oc)
        q4_out(y + (size_t)t * oc, bias, has_bias, act, o, q4_row(xl, w, sz, ic, block, o));
}

/* Two layers that read the same x (q and k, gate and up) in one launch: work-items [0, oc0) take
 * layer 0's rows, [oc0, oc0 + oc1) layer 1's (OpenCLReplay pairs them); the same q4_row, so the
 * values equal the two launches' bit for bit. */
__kernel void gemv_q4_pair(__global const store_t *x,
                           __global const uchar *w0, __global const float2 *sz0, __global const float *bias0,
                           __global store_t *y0,
                           __global const uchar *w1, __global const float2 *sz1, __global const float *bias1,
                           __global store_t *y1,
                           int ic, int block, int oc0, int oc1, int has_bias0, int has_bias1, int act0, int act1,
                           __local float *xl) {
    stage_x(x, xl, ic, block);
    const int g = get_global_id(0);
    if (g < oc0)
        q4_out(y0, bias0, has_bias0, act0, g, q4_row(xl, w0, sz0, ic, block, g));
    else if (g < oc0 + oc1)
        q4_out(y1, bias1, has_bias1, act1, g - oc0, q4_row(xl, w1, sz1, ic, block, g - oc0));
}

/* gate, up and MUL_SILU's y = activate(up * silu(gate), act) in one launch (OpenCLReplay fuses
 * the three): work-item o computes row o of both layers and stores it, as the two launches
 * would, and y from those stored values, so all three outputs equal the three launches' bit for
 * bit. Layer a is MUL_SILU's first input (up), b its second (gate). */
__kernel void gemv_q4_gated(__global const store_t *x,
                            __global const uchar *wa, __global const float2 *sza, __global const float *biasa,
                            __global store_t *ya,
                            __global const uchar *wb, __global const float2 *szb, __global const float *biasb,
                            __global store_t *yb,
                            __global store_t *y, int ic, int block, int oc, int has_bias_a, int has_bias_b,
                            int act_a, int act_b, int act, __local float *xl) {
    stage_x(x, xl, ic, block);
    const int o = get_global_id(0);
    if (o >= oc) return;
    q4_out(ya, biasa, has_bias_a, act_a, o, q4_row(xl, wa, sza, ic, block, o));
    q4_out(yb, biasb, has_bias_b, act_b, o, q4_row(xl, wb, szb, ic, block, o));
    ST(y, o, activate(LD(ya, o) * silu(LD(yb, o)), act));
}
