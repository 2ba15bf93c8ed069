/* Attention over a token-major KV store: key j of kv head g is at (j * kv_heads + g) * HEAD_DIM,
 * the layout of the k/v inputs themselves, so the cache appends with one device copy.
 * One work-item per (query token, head), one pass with an online softmax (no score buffer).
 * mask_mode 0: causal (the scalar mask); 1: a [mask_rows, mask_cols] mask over the last
 * mask_cols keys, added (float) or, with MASK_INT, 0 meaning "masked out".
 * step = {past, total}: the step's cached and attended keys, written into a device buffer per
 * run, so the kernel's arguments are bound once. */
#ifdef MASK_INT
typedef int mask_t;
#else
typedef store_t mask_t;
#endif

__kernel void attention(__global const store_t *q, __global const store_t *k, __global const store_t *v,
                        __global const mask_t *mask, __global store_t *out, __global const int *step, int seq,
                        int heads, int kv_heads, float scale, int mask_mode, int mask_rows, int mask_cols) {
    const int t = get_global_id(0), h = get_global_id(1);
    const int past = step[0], total = step[1];
    const int g = h / (heads / kv_heads);
    const size_t q_at = ((size_t)t * heads + h) * HEAD_DIM;
    float4 qv[HEAD_DIM / 4], acc[HEAD_DIM / 4];
    for (int d = 0; d < HEAD_DIM / 4; ++d) {
        qv[d] = (float4)(LD(q, q_at + 4 * d), LD(q, q_at + 4 * d + 1), LD(q, q_at + 4 * d + 2),
                         LD(q, q_at + 4 * d + 3));
        acc[d] = (float4)(0.0f);
    }
    const int limit = mask_mode == 0 ? min(total, past + t + 1) : total;
    const int mask_start = total - mask_cols;
    const size_t mask_row = (size_t)(mask_rows - seq + t) * mask_cols;
    float best = -INFINITY, norm = 0.0f;
    for (int j = 0; j < limit; ++j) {
        const size_t kv_at = ((size_t)j * kv_heads + g) * HEAD_DIM;
        float4 dot = (float4)(0.0f);
        for (int d = 0; d < HEAD_DIM / 4; ++d)
            dot = fma(qv[d], (float4)(LD(k, kv_at + 4 * d), LD(k, kv_at + 4 * d + 1), LD(k, kv_at + 4 * d + 2),
                                      LD(k, kv_at + 4 * d + 3)), dot);
        float score = (dot.x + dot.y + dot.z + dot.w) * scale;
        if (mask_mode == 1 && j >= mask_start) {
#ifdef MASK_INT
            if (mask[mask_row + j - mask_start] == 0) continue;
#else
            score += LD(mask, mask_row + j - mask_start);
#endif
        }
        if (score == -INFINITY) continue;
        const float top = fmax(best, score);
        const float fade = exp(best - top), weight = exp(score - top);
        norm = norm * fade + weight;
        for (int d = 0; d < HEAD_DIM / 4; ++d)
            acc[d] = acc[d] * fade + weight * (float4)(LD(v, kv_at + 4 * d), LD(v, kv_at + 4 * d + 1),
                                                       LD(v, kv_at + 4 * d + 2), LD(v, kv_at + 4 * d + 3));
        best = top;
    }
    const float inv = 1.0f / norm;
    for (int d = 0; d < HEAD_DIM / 4; ++d) {
        const float4 o = acc[d] * inv;
        ST(out, q_at + 4 * d, o.x);
        ST(out, q_at + 4 * d + 1, o.y);
        ST(out, q_at + 4 * d + 2, o.z);
        ST(out, q_at + 4 * d + 3, o.w);
    }
}
