/* Fused RoPE on q and k in the rotate-half form, one work-item per (token, head); heads
 * [0, heads) are q's, [heads, heads + kv_heads) k's. cos/sin rows are `cs_stride` apart and
 * laid out [first half | second half] of rope_dim; dims past rope_dim are copied.
 * Optional per-head norm first (Qwen3's q_norm/k_norm); nflags: 1 on, 2 RMS, 4 beta. */
static void rope_head(__global const store_t *src, __global store_t *dst, __global const store_t *c,
                      __global const store_t *s, __global const float *gamma, __global const float *beta,
                      int head_dim, int rope_dim, float eps, int nflags) {
    float mean = 0.0f, inv = 1.0f;
    if (nflags & 1) {
        if (!(nflags & 2)) {
            for (int i = 0; i < head_dim; ++i) mean += LD(src, i);
            mean /= head_dim;
        }
        float squares = 0.0f;
        for (int i = 0; i < head_dim; ++i) {
            const float d = LD(src, i) - mean;
            squares += d * d;
        }
        inv = rsqrt(squares / head_dim + eps);
    }
    const int half_dim = rope_dim / 2;
    for (int i = 0; i < head_dim; ++i) {
        float v = LD(src, i);
        if (nflags & 1) {
            v = (v - mean) * inv * gamma[i];
            if (nflags & 4) v += beta[i];
        }
        ST(dst, i, v);
    }
    for (int i = 0; i < half_dim; ++i) {
        const float a = LD(dst, i), b = LD(dst, i + half_dim);
        ST(dst, i, a * LD(c, i) - b * LD(s, i));
        ST(dst, i + half_dim, b * LD(c, i + half_dim) + a * LD(s, i + half_dim));
    }
}

__kernel void rope(__global const store_t *q, __global const store_t *k, __global const store_t *cos_table,
                   __global const store_t *sin_table, __global store_t *q_out, __global store_t *k_out,
                   __global const float *q_gamma, __global const float *q_beta, __global const float *k_gamma,
                   __global const float *k_beta, int heads, int kv_heads, int head_dim, int rope_dim,
                   int cs_stride, float q_eps, float k_eps, int q_flags, int k_flags) {
    const int t = get_global_id(0), h = get_global_id(1);
    __global const store_t *c = cos_table + (size_t)t * cs_stride;
    __global const store_t *s = sin_table + (size_t)t * cs_stride;
    if (h < heads) {
        const size_t at = ((size_t)t * heads + h) * head_dim;
        rope_head(q + at, q_out + at, c, s, q_gamma, q_beta, head_dim, rope_dim, q_eps, q_flags);
    } else {
        const size_t at = ((size_t)t * kv_heads + h - heads) * head_dim;
        rope_head(k + at, k_out + at, c, s, k_gamma, k_beta, head_dim, rope_dim, k_eps, k_flags);
    }
}
