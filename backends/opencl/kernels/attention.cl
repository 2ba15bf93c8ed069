/* Attention over a token-major KV store: key j of kv head g is at (j * kv_heads + g) * HEAD_DIM,
 * the layout of the k/v inputs themselves.
 * One work-item per (query token, head), one pass with an online softmax (no score buffer).
 * mask_mode 0: causal (the scalar mask); 1: a [mask_rows, mask_cols] mask over the last
 * mask_cols keys, added (float) or, with MASK_INT, 0 meaning "masked out".
 * step = {past, total}: the step's cached and attended keys, in a device buffer the runtime
 * writes once per step for every layer, so the arguments are bound once. Keys [0, past) are
 * read from the cache, the step's own [past, total) from its k/v inputs; with `append` the
 * kernel also stores the step's rows into the cache (the work-items of each kv head's first
 * query head, rows t, t + seq, ...), so a decode step needs no copy, and no work-item reads a
 * row another writes. */
#ifdef MASK_INT
typedef int mask_t;
#else
typedef store_t mask_t;
#endif

/* the step's rows of k and v into the cache, by work-item (t, h) */
static void append_rows(__global const store_t *k_new, __global const store_t *v_new, __global store_t *k,
                        __global store_t *v, int t, int h, int seq, int heads, int kv_heads, int past, int total) {
    const int group = heads / kv_heads;
    if (h % group) return;
    const int g = h / group;
    for (int r = t; r < total - past; r += seq) {
        const size_t from = ((size_t)r * kv_heads + g) * HEAD_DIM, to = ((size_t)(past + r) * kv_heads + g) * HEAD_DIM;
        for (int d = 0; d < HEAD_DIM; ++d) {
            ST(k, to + d, LD(k_new, from + d));  /* fp16 storage: through float, exact */
            ST(v, to + d, LD(v_new, from + d));
        }
    }
}

__kernel void attention(__global const store_t *q, __global const store_t *k_new, __global const store_t *v_new,
                        __global const mask_t *mask, __global store_t *out, __global store_t *k_cache,
                        __global store_t *v_cache, __global const int *step, int append, int seq,
                        int heads, int kv_heads, float scale, int mask_mode, int mask_rows, int mask_cols) {
    const int t = get_global_id(0), h = get_global_id(1);
    const int past = step[0], total = step[1];
    if (append)
        append_rows(k_new, v_new, k_cache, v_cache, t, h, seq, heads, kv_heads, past, total);
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
        __global const store_t *k = j < past ? k_cache : k_new, *v = j < past ? v_cache : v_new;
        const size_t kv_at = ((size_t)(j < past ? j : j - past) * kv_heads + g) * HEAD_DIM;
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

/* The same attention for a prefill on a CPU device: one work-item per (8 queries, head), the 8
 * queries in the lanes of a float8 (q transposed once: qt[d] holds dim d of the 8), so a key's
 * scores for all 8 are 64 fmas with the key's values broadcast and no horizontal sum; keys in
 * chunks of KC with a running softmax per lane; the chunk's values summed into the 8 output rows
 * VW dims at a time (VW 8, or 4 when HEAD_DIM is not a multiple of 8). q is scaled once. Keys
 * past a query's causal limit score -inf (weight 0); loads are clamped to the last attended
 * key, so a tile never reads outside the cache. Every key comes from the cache: the step's rows
 * are copied in before it runs. */
#ifdef QUERY_LANES
#if HEAD_DIM % 8 == 0
#define VW 8
typedef float8 floatv;
#define LDP(p) vload8(0, (p))
#define STP(p, x) vstore8((x), 0, (p))
#ifdef HALF_STORAGE
#define LDV(p, i) vload_half8(0, (p) + (i))
#define STV(p, i, x) vstore_half8((x), 0, (p) + (i))
#else
#define LDV(p, i) vload8(0, (p) + (i))
#define STV(p, i, x) vstore8((x), 0, (p) + (i))
#endif
#else
#define VW 4
typedef float4 floatv;
#define LDP(p) vload4(0, (p))
#define STP(p, x) vstore4((x), 0, (p))
#ifdef HALF_STORAGE
#define LDV(p, i) vload_half4(0, (p) + (i))
#define STV(p, i, x) vstore_half4((x), 0, (p) + (i))
#else
#define LDV(p, i) vload4(0, (p) + (i))
#define STV(p, i, x) vstore4((x), 0, (p) + (i))
#endif
#endif
#define KC 16

__kernel void attention_tiled(__global const store_t *q, __global const store_t *k, __global const store_t *v,
                              __global const mask_t *mask, __global store_t *out, __global const int *step,
                              int seq, int heads, int kv_heads, float scale, int mask_mode, int mask_rows,
                              int mask_cols) {
    const int t0 = get_global_id(0) * 8, h = get_global_id(1);
    const int past = step[0], total = step[1];
    const int g = h / (heads / kv_heads);
    const int mask_start = total - mask_cols;
    float8 qt[HEAD_DIM];
    float acc[8][HEAD_DIM];
    int lim[8];
    for (int t = 0; t < 8; ++t) {
        const int tq = min(t0 + t, seq - 1);
        const size_t q_at = ((size_t)tq * heads + h) * HEAD_DIM;
        for (int d = 0; d < HEAD_DIM; ++d) {
            qt[d][t] = LD(q, q_at + d) * scale;
            acc[t][d] = 0.0f;
        }
        lim[t] = mask_mode == 0 ? min(total, past + tq + 1) : total;
    }
    const int8 limit = vload8(0, lim);
    const int end = lim[7];
    float8 best = (float8)(-INFINITY), norm = (float8)(0.0f);
    for (int j0 = 0; j0 < end; j0 += KC) {
        float8 s[KC];
        _Pragma("unroll") for (int jj = 0; jj < KC; jj += 8) {
            __global const store_t *kr[8];
            float8 dot[8];
            _Pragma("unroll") for (int e = 0; e < 8; ++e) {
                kr[e] = k + ((size_t)min(j0 + jj + e, end - 1) * kv_heads + g) * HEAD_DIM;
                dot[e] = (float8)(0.0f);
            }
            for (int d = 0; d < HEAD_DIM; ++d) {
                const float8 qd = qt[d];
                _Pragma("unroll") for (int e = 0; e < 8; ++e) dot[e] = fma(qd, (float8)(LD(kr[e], d)), dot[e]);
            }
            _Pragma("unroll") for (int e = 0; e < 8; ++e) s[jj + e] = dot[e];
        }
        float8 top = best;
        _Pragma("unroll") for (int jj = 0; jj < KC; ++jj) {
            const int j = j0 + jj;
            float8 score = select(s[jj], (float8)(-INFINITY), (int8)(j) >= limit);
            if (mask_mode == 1 && j >= mask_start) {
                for (int t = 0; t < 8; ++t) {
                    const size_t at = (size_t)(mask_rows - seq + min(t0 + t, seq - 1)) * mask_cols + j - mask_start;
#ifdef MASK_INT
                    if (j < lim[t] && mask[at] == 0) score[t] = -INFINITY;
#else
                    if (j < lim[t]) score[t] += LD(mask, at);
#endif
                }
            }
            s[jj] = score;
            top = fmax(top, score);
        }
        const float8 shift = select(top, (float8)(0.0f), top == (float8)(-INFINITY));
        const float8 fade = exp(best - shift);
        float p[KC][8], f[8];
        float8 sum = (float8)(0.0f);
        _Pragma("unroll") for (int jj = 0; jj < KC; ++jj) {
            const float8 weight = exp(s[jj] - shift);
            sum += weight;
            vstore8(weight, 0, p[jj]);
        }
        norm = norm * fade + sum;
        best = top;
        vstore8(fade, 0, f);
        for (int c = 0; c < HEAD_DIM; c += VW) {
            floatv o[8];
            _Pragma("unroll") for (int t = 0; t < 8; ++t) o[t] = LDP(acc[t] + c) * f[t];
            _Pragma("unroll") for (int jj = 0; jj < KC; ++jj) {
                const floatv vv = LDV(v, ((size_t)min(j0 + jj, end - 1) * kv_heads + g) * HEAD_DIM + c);
                _Pragma("unroll") for (int t = 0; t < 8; ++t) o[t] = fma((floatv)(p[jj][t]), vv, o[t]);
            }
            _Pragma("unroll") for (int t = 0; t < 8; ++t) STP(acc[t] + c, o[t]);
        }
    }
    float inv[8];
    vstore8(1.0f / norm, 0, inv);
    for (int t = 0; t < 8; ++t) {
        if (t0 + t >= seq) break;
        const size_t q_at = ((size_t)(t0 + t) * heads + h) * HEAD_DIM;
        for (int c = 0; c < HEAD_DIM; c += VW) STV(out, q_at + c, LDP(acc[t] + c) * inv[t]);
    }
}
#endif
