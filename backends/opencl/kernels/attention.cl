/* Attention over a token-major KV store: key j of kv head g is at KV_AT(j, g, kv_heads), the
 * layout of the k/v inputs themselves (and, for int8, a scale per row and kv head after them).
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

/* The cache's storage (kv_format.py): as the activations (store_t), KV_HALF (fp16) or KV_INT8
 * (int8, a token's row being kv_heads * HEAD_DIM int8 then kv_heads float scales). KV_AT: the
 * element where (token j, kv head g) starts; KV_SCALE: its scale (int8 only). */
#if defined(KV_INT8)
typedef char kv_t;
#define KV_ROW(kvh) ((size_t)(kvh) * (HEAD_DIM + 4))
#define KV_AT(j, g, kvh) ((size_t)(j) * KV_ROW(kvh) + (size_t)(g) * HEAD_DIM)
#define KV_SCALE(p, j, g, kvh) \
    (*(__global const float *)((p) + (size_t)(j) * KV_ROW(kvh) + (size_t)(kvh) * HEAD_DIM + 4 * (g)))
#define KV_LD(p, i) ((float)(p)[i])
#define KV_LD4(p, i) convert_float4(vload4(0, (p) + (i)))
#elif defined(KV_HALF)
typedef half kv_t;
#define KV_AT(j, g, kvh) (((size_t)(j) * (kvh) + (g)) * HEAD_DIM)
#define KV_LD(p, i) vload_half((i), (p))
#define KV_LD4(p, i) vload_half4(0, (p) + (i))
#else
typedef store_t kv_t;
#define KV_AT(j, g, kvh) (((size_t)(j) * (kvh) + (g)) * HEAD_DIM)
#define KV_LD(p, i) LD(p, i)
#define KV_LD4(p, i) ((float4)(LD(p, i), LD(p, (i) + 1), LD(p, (i) + 2), LD(p, (i) + 3)))
#endif

/* one (token, kv head) row of an input (HEAD_DIM activations at src) into the cache at (j, g) */
static void kv_store(__global kv_t *c, size_t j, int g, int kv_heads, __global const store_t *src) {
    __global kv_t *row = c + KV_AT(j, g, kv_heads);
#if defined(KV_INT8)
    float top = 0.0f;
    for (int d = 0; d < HEAD_DIM; ++d) top = fmax(top, fabs(LD(src, d)));
    const float inverse = top > 0.0f ? 127.0f / top : 0.0f;
    for (int d = 0; d < HEAD_DIM; ++d) row[d] = convert_char_sat_rte(LD(src, d) * inverse);
    *(__global float *)(c + (size_t)j * KV_ROW(kv_heads) + (size_t)kv_heads * HEAD_DIM + 4 * g) = top / 127.0f;
#elif defined(KV_HALF)
    for (int d = 0; d < HEAD_DIM; ++d) vstore_half(LD(src, d), d, row);
#else
    for (int d = 0; d < HEAD_DIM; ++d) ST(row, d, LD(src, d));  /* fp16 storage: through float, exact */
#endif
}

/* A step's rows (the k/v inputs) into the cache at rows past.., one work-item per (row, kv head):
 * the append of a prefill whose attention reads every key from a quantized cache. */
__kernel void kv_append(__global const store_t *k_new, __global const store_t *v_new, __global kv_t *k,
                        __global kv_t *v, __global const int *step, int kv_heads) {
    const int r = get_global_id(0), g = get_global_id(1);
    const size_t from = ((size_t)r * kv_heads + g) * HEAD_DIM;
    kv_store(k, step[0] + r, g, kv_heads, k_new + from);
    kv_store(v, step[0] + r, g, kv_heads, v_new + from);
}

/* the step's rows of k and v into the cache, by work-item (t, h) */
static void append_rows(__global const store_t *k_new, __global const store_t *v_new, __global kv_t *k,
                        __global kv_t *v, int t, int h, int seq, int heads, int kv_heads, int past, int total) {
    const int group = heads / kv_heads;
    if (h % group) return;
    const int g = h / group;
    for (int r = t; r < total - past; r += seq) {
        const size_t from = ((size_t)r * kv_heads + g) * HEAD_DIM;
        kv_store(k, past + r, g, kv_heads, k_new + from);
        kv_store(v, past + r, g, kv_heads, v_new + from);
    }
}

/* the 4 floats of key or value row (j, g) at dims 4d.. (the step's own rows from the inputs) */
static float4 kv_load4(__global const kv_t *cache, __global const store_t *fresh, int j, int past, int g,
                       int kv_heads, int d) {
    if (j >= past) {
        const size_t at = ((size_t)(j - past) * kv_heads + g) * HEAD_DIM + 4 * d;
        return (float4)(LD(fresh, at), LD(fresh, at + 1), LD(fresh, at + 2), LD(fresh, at + 3));
    }
    return KV_LD4(cache, KV_AT(j, g, kv_heads) + 4 * d);
}

/* One key j of `attention`'s online softmax, inside its loop over keys: KEY(d) and VALUE(d) load
 * the key's and value's 4 floats at dims 4d.. (streamed, not held: a work-item keeps only q and
 * its output), KS and VS scale them (the int8 scales, else 1); a masked key is skipped. */
#ifdef MASK_INT
#define MASK_KEY(j, score) if (mask_mode == 1 && (j) >= mask_start && mask[mask_row + (j) - mask_start] == 0) continue;
#else
#define MASK_KEY(j, score) if (mask_mode == 1 && (j) >= mask_start) score += LD(mask, mask_row + (j) - mask_start);
#endif
#define ATTEND(j, KEY, VALUE, KS, VS) {                                                   \
        float4 dot = (float4)(0.0f);                                                      \
        for (int d = 0; d < HEAD_DIM / 4; ++d) dot = fma(qv[d], KEY(d), dot);             \
        float score = (dot.x + dot.y + dot.z + dot.w) * scale * (KS);                     \
        MASK_KEY(j, score)                                                                \
        if (score == -INFINITY) continue;                                                 \
        const float top = fmax(best, score);                                              \
        const float fade = exp(best - top), weight = exp(score - top);                    \
        norm = norm * fade + weight;                                                      \
        for (int d = 0; d < HEAD_DIM / 4; ++d)                                            \
            acc[d] = acc[d] * fade + (weight * (VS)) * VALUE(d);                          \
        best = top;                                                                       \
    }

__kernel void attention(__global const store_t *q, __global const store_t *k_new, __global const store_t *v_new,
                        __global const mask_t *mask, __global store_t *out, __global kv_t *k_cache,
                        __global kv_t *v_cache, __global const int *step, int append, int seq,
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
#define CACHED_KEY(d) KV_LD4(k_cache, at + 4 * (d))
#define CACHED_VALUE(d) KV_LD4(v_cache, at + 4 * (d))
#define FRESH(p, d) ((float4)(LD(p, at + 4 * (d)), LD(p, at + 4 * (d) + 1), LD(p, at + 4 * (d) + 2), \
                              LD(p, at + 4 * (d) + 3)))
#define FRESH_KEY(d) FRESH(k_new, d)
#define FRESH_VALUE(d) FRESH(v_new, d)
    for (int j = 0; j < min(limit, past); ++j) {  /* the cache's keys, in its format */
        const size_t at = KV_AT(j, g, kv_heads);
#ifdef KV_INT8
        ATTEND(j, CACHED_KEY, CACHED_VALUE, KV_SCALE(k_cache, j, g, kv_heads), KV_SCALE(v_cache, j, g, kv_heads))
#else
        ATTEND(j, CACHED_KEY, CACHED_VALUE, 1.0f, 1.0f)
#endif
    }
    for (int j = past; j < limit; ++j) {  /* the step's own keys, from the inputs */
        const size_t at = ((size_t)(j - past) * kv_heads + g) * HEAD_DIM;
        ATTEND(j, FRESH_KEY, FRESH_VALUE, 1.0f, 1.0f)
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

/* Flash-decoding (one query token, GROUP = heads / kv_heads query heads per kv head): work-item
 * (split s, kv head g) reads keys and values of split s once for all GROUP heads of g, with an
 * online softmax, and leaves per (head, split) its running max, sum and unnormalised output in
 * `part` ([heads][splits][HEAD_DIM + 2]); attention_merge combines the splits. The splits
 * divide the attended keys evenly, each at least MIN_SPLIT_KEYS (the rest stay empty: max -inf),
 * so one binding serves every depth. Split 0 appends the step's row (as `attention`). */
#ifdef GROUP
#define MIN_SPLIT_KEYS 32
__kernel void attention_split(__global const store_t *q, __global const store_t *k_new,
                              __global const store_t *v_new, __global const mask_t *mask, __global float *part,
                              __global kv_t *k_cache, __global kv_t *v_cache, __global const int *step, int append,
                              int heads, int kv_heads, float scale, int mask_mode, int mask_rows, int mask_cols) {
    const int s = get_global_id(0), g = get_global_id(1), splits = get_global_size(0);
    const int past = step[0], total = step[1];
    if (append && s == 0)
        append_rows(k_new, v_new, k_cache, v_cache, 0, g * GROUP, 1, heads, kv_heads, past, total);
    const int used = max(1, min(splits, total / MIN_SPLIT_KEYS));
    const int chunk = (total + used - 1) / used;
    const int begin = min(total, s * chunk), end = min(total, begin + chunk);
    const int mask_start = total - mask_cols;
    const size_t mask_row = (size_t)(mask_rows - 1) * mask_cols;
    float4 qv[GROUP][HEAD_DIM / 4], acc[GROUP][HEAD_DIM / 4];
    float best[GROUP], norm[GROUP];
    for (int e = 0; e < GROUP; ++e) {
        const size_t q_at = (size_t)(g * GROUP + e) * HEAD_DIM;
        for (int d = 0; d < HEAD_DIM / 4; ++d) {
            qv[e][d] = (float4)(LD(q, q_at + 4 * d), LD(q, q_at + 4 * d + 1), LD(q, q_at + 4 * d + 2),
                                LD(q, q_at + 4 * d + 3)) * scale;
            acc[e][d] = (float4)(0.0f);
        }
        best[e] = -INFINITY;
        norm[e] = 0.0f;
    }
    for (int j = begin; j < end; ++j) {
        float4 key[HEAD_DIM / 4];
        for (int d = 0; d < HEAD_DIM / 4; ++d) key[d] = kv_load4(k_cache, k_new, j, past, g, kv_heads, d);
        float add = 0.0f, ks = 1.0f, vs = 1.0f;
#ifdef KV_INT8
        if (j < past) {
            ks = KV_SCALE(k_cache, j, g, kv_heads);
            vs = KV_SCALE(v_cache, j, g, kv_heads);
        }
#endif
        if (mask_mode == 1 && j >= mask_start) {
#ifdef MASK_INT
            if (mask[mask_row + j - mask_start] == 0) continue;
#else
            add = LD(mask, mask_row + j - mask_start);
#endif
        }
        float weight[GROUP];
        for (int e = 0; e < GROUP; ++e) {
            float4 dot = (float4)(0.0f);
            for (int d = 0; d < HEAD_DIM / 4; ++d) dot = fma(qv[e][d], key[d], dot);
            const float score = (dot.x + dot.y + dot.z + dot.w) * ks + add;
            const float top = fmax(best[e], score);
            const float fade = top == -INFINITY ? 1.0f : exp(best[e] - top);
            weight[e] = top == -INFINITY ? 0.0f : exp(score - top);
            norm[e] = norm[e] * fade + weight[e];
            best[e] = top;
            for (int d = 0; d < HEAD_DIM / 4; ++d) acc[e][d] *= fade;
        }
        for (int d = 0; d < HEAD_DIM / 4; ++d) {
            const float4 value = kv_load4(v_cache, v_new, j, past, g, kv_heads, d) * vs;
            for (int e = 0; e < GROUP; ++e) acc[e][d] = fma((float4)(weight[e]), value, acc[e][d]);
        }
    }
    for (int e = 0; e < GROUP; ++e) {
        __global float *at = part + ((size_t)(g * GROUP + e) * splits + s) * (HEAD_DIM + 2);
        for (int d = 0; d < HEAD_DIM / 4; ++d) vstore4(acc[e][d], d, at);
        at[HEAD_DIM] = best[e];
        at[HEAD_DIM + 1] = norm[e];
    }
}

/* The splits of attention_split into the output, one work-item per head: each split's output
 * and sum rescaled by exp(its max - the overall max). */
__kernel void attention_merge(__global const float *part, __global store_t *out, int splits) {
    const int h = get_global_id(0);
    __global const float *base = part + (size_t)h * splits * (HEAD_DIM + 2);
    float top = -INFINITY;
    for (int s = 0; s < splits; ++s) top = fmax(top, base[s * (HEAD_DIM + 2) + HEAD_DIM]);
    float4 acc[HEAD_DIM / 4];
    for (int d = 0; d < HEAD_DIM / 4; ++d) acc[d] = (float4)(0.0f);
    float norm = 0.0f;
    for (int s = 0; s < splits; ++s) {
        __global const float *at = base + s * (HEAD_DIM + 2);
        if (at[HEAD_DIM] == -INFINITY) continue;
        const float w = exp(at[HEAD_DIM] - top);
        norm += w * at[HEAD_DIM + 1];
        for (int d = 0; d < HEAD_DIM / 4; ++d) acc[d] = fma((float4)(w), vload4(d, at), acc[d]);
    }
    const float inv = 1.0f / norm;
    for (int d = 0; d < HEAD_DIM / 4; ++d) {
        const float4 o = acc[d] * inv;
        const size_t at = (size_t)h * HEAD_DIM + 4 * d;
        ST(out, at, o.x);
        ST(out, at + 1, o.y);
        ST(out, at + 2, o.z);
        ST(out, at + 3, o.w);
    }
}
#endif

/* The same attention for a prefill on a CPU device: one work-item per (8 queries, head), the 8
 * queries in the lanes of a float8 (q transposed once: qt[d] holds dim d of the 8), so a key's
 * scores for all 8 are 64 fmas with the key's values broadcast and no horizontal sum; keys in
 * chunks of KC with a running softmax per lane; the chunk's values summed into the 8 output rows
 * VW dims at a time (VW 8, or 4 when HEAD_DIM is not a multiple of 8). q is scaled once. Keys
 * past a query's causal limit score -inf (weight 0); loads are clamped to the last attended
 * key, so a tile never reads outside the cache. Every key comes from the cache, in any KV
 * format: the step's rows are copied in (or stored by kv_append) before it runs. */
#ifdef QUERY_LANES
#if HEAD_DIM % 8 == 0
#define VW 8
typedef float8 floatv;
#define LDP(p) vload8(0, (p))
#define STP(p, x) vstore8((x), 0, (p))
#ifdef HALF_STORAGE
#define STV(p, i, x) vstore_half8((x), 0, (p) + (i))
#else
#define STV(p, i, x) vstore8((x), 0, (p) + (i))
#endif
#if defined(KV_INT8)
#define LDV(p, i) convert_float8(vload8(0, (p) + (i)))
#elif defined(KV_HALF) || defined(HALF_STORAGE)
#define LDV(p, i) vload_half8(0, (p) + (i))
#else
#define LDV(p, i) vload8(0, (p) + (i))
#endif
#else
#define VW 4
typedef float4 floatv;
#define LDP(p) vload4(0, (p))
#define STP(p, x) vstore4((x), 0, (p))
#ifdef HALF_STORAGE
#define STV(p, i, x) vstore_half4((x), 0, (p) + (i))
#else
#define STV(p, i, x) vstore4((x), 0, (p) + (i))
#endif
#if defined(KV_INT8)
#define LDV(p, i) convert_float4(vload4(0, (p) + (i)))
#elif defined(KV_HALF) || defined(HALF_STORAGE)
#define LDV(p, i) vload_half4(0, (p) + (i))
#else
#define LDV(p, i) vload4(0, (p) + (i))
#endif
#endif
#define KC 16

__kernel void attention_tiled(__global const store_t *q, __global const kv_t *k, __global const kv_t *v,
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
            __global const kv_t *kr[8];
            float8 dot[8];
            _Pragma("unroll") for (int e = 0; e < 8; ++e) {
                kr[e] = k + KV_AT(min(j0 + jj + e, end - 1), g, kv_heads);
                dot[e] = (float8)(0.0f);
            }
            for (int d = 0; d < HEAD_DIM; ++d) {
                const float8 qd = qt[d];
                _Pragma("unroll") for (int e = 0; e < 8; ++e) dot[e] = fma(qd, (float8)(KV_LD(kr[e], d)), dot[e]);
            }
#ifdef KV_INT8
            _Pragma("unroll") for (int e = 0; e < 8; ++e) dot[e] *= KV_SCALE(k, min(j0 + jj + e, end - 1), g, kv_heads);
#endif
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
                const int row = min(j0 + jj, end - 1);
                const floatv vv = LDV(v, KV_AT(row, g, kv_heads) + c);
#ifdef KV_INT8
                const float vs = KV_SCALE(v, row, g, kv_heads);
                _Pragma("unroll") for (int t = 0; t < 8; ++t) o[t] = fma((floatv)(p[jj][t] * vs), vv, o[t]);
#else
                _Pragma("unroll") for (int t = 0; t < 8; ++t) o[t] = fma((floatv)(p[jj][t]), vv, o[t]);
#endif
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
