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

/* The same attention for a prefill on a CPU device: one work-item per (QT queries, head), the keys
 * in chunks of KC. Each key row is loaded once for the QT queries, the chunk's scores take one
 * running-softmax update per query (vector exp), and the chunk's values are summed with the
 * output accumulators held in registers for one VW-wide slice of the head at a time.
 * q is scaled once. Keys past a query's causal limit score -inf (their weight is 0); loads are
 * clamped to the last attended key, so the tile never reads outside the cache. */
#ifdef QT
#if HEAD_DIM % 8 == 0
#define VW 8
typedef float8 floatv;
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
#ifdef HALF_STORAGE
#define LDV(p, i) vload_half4(0, (p) + (i))
#define STV(p, i, x) vstore_half4((x), 0, (p) + (i))
#else
#define LDV(p, i) vload4(0, (p) + (i))
#define STV(p, i, x) vstore4((x), 0, (p) + (i))
#endif
#endif
#define NV (HEAD_DIM / VW)
#define KC 16

static inline float sumv(floatv v) {
#if VW == 8
    const float4 a = v.lo + v.hi;
#else
    const float4 a = v;
#endif
    return (a.x + a.y) + (a.z + a.w);
}

__kernel void attention_tiled(__global const store_t *q, __global const store_t *k, __global const store_t *v,
                              __global const mask_t *mask, __global store_t *out, __global const int *step,
                              int seq, int heads, int kv_heads, float scale, int mask_mode, int mask_rows,
                              int mask_cols) {
    const int t0 = get_global_id(0) * QT, h = get_global_id(1);
    const int past = step[0], total = step[1];
    const int g = h / (heads / kv_heads);
    const int mask_start = total - mask_cols;
    floatv qv[QT][NV], acc[QT][NV];
    int limit[QT];
    float best[QT], norm[QT];
    size_t mask_row[QT];
    _Pragma("unroll") for (int t = 0; t < QT; ++t) {
        const int tq = min(t0 + t, seq - 1);
        const size_t q_at = ((size_t)tq * heads + h) * HEAD_DIM;
        _Pragma("unroll") for (int c = 0; c < NV; ++c) {
            qv[t][c] = LDV(q, q_at + c * VW) * scale;
            acc[t][c] = (floatv)(0.0f);
        }
        limit[t] = mask_mode == 0 ? min(total, past + tq + 1) : total;
        mask_row[t] = (size_t)(mask_rows - seq + tq) * mask_cols;
        best[t] = -INFINITY;
        norm[t] = 0.0f;
    }
    const int end = limit[QT - 1];
    for (int j0 = 0; j0 < end; j0 += KC) {
        float s[QT][KC];
        _Pragma("unroll") for (int jj = 0; jj < KC; ++jj) {
            const int j = j0 + jj;
            const size_t kv_at = ((size_t)min(j, end - 1) * kv_heads + g) * HEAD_DIM;
            floatv kk[NV];
            _Pragma("unroll") for (int c = 0; c < NV; ++c) kk[c] = LDV(k, kv_at + c * VW);
            _Pragma("unroll") for (int t = 0; t < QT; ++t) {
                floatv dot = qv[t][0] * kk[0];
                _Pragma("unroll") for (int c = 1; c < NV; ++c) dot = fma(qv[t][c], kk[c], dot);
                float score = j < limit[t] ? sumv(dot) : -INFINITY;
                if (mask_mode == 1 && j >= mask_start && j < limit[t]) {
#ifdef MASK_INT
                    if (mask[mask_row[t] + j - mask_start] == 0) score = -INFINITY;
#else
                    score += LD(mask, mask_row[t] + j - mask_start);
#endif
                }
                s[t][jj] = score;
            }
        }
        _Pragma("unroll") for (int t = 0; t < QT; ++t) {
            const float16 sv = vload16(0, s[t]);
            const float8 m8 = fmax(sv.lo, sv.hi);
            const float4 m4 = fmax(m8.lo, m8.hi);
            const float top = fmax(best[t], fmax(fmax(m4.x, m4.y), fmax(m4.z, m4.w)));
            const float shift = top == -INFINITY ? 0.0f : top;
            const float16 p = exp(sv - shift);
            const float fade = exp(best[t] - shift);
            norm[t] = norm[t] * fade + sum16(p);
            best[t] = top;
            vstore16(p, 0, s[t]);
            _Pragma("unroll") for (int c = 0; c < NV; ++c) acc[t][c] *= fade;
        }
        _Pragma("unroll") for (int c = 0; c < NV; ++c) {
            floatv a[QT];
            _Pragma("unroll") for (int t = 0; t < QT; ++t) a[t] = acc[t][c];
            _Pragma("unroll") for (int jj = 0; jj < KC; ++jj) {
                const floatv vv = LDV(v, ((size_t)min(j0 + jj, end - 1) * kv_heads + g) * HEAD_DIM + c * VW);
                _Pragma("unroll") for (int t = 0; t < QT; ++t) a[t] = fma((floatv)(s[t][jj]), vv, a[t]);
            }
            _Pragma("unroll") for (int t = 0; t < QT; ++t) acc[t][c] = a[t];
        }
    }
    _Pragma("unroll") for (int t = 0; t < QT; ++t) {
        if (t0 + t >= seq) break;
        const float inv = 1.0f / norm[t];
        const size_t q_at = ((size_t)(t0 + t) * heads + h) * HEAD_DIM;
        _Pragma("unroll") for (int c = 0; c < NV; ++c) STV(out, q_at + c * VW, acc[t][c] * inv);
    }
}
#endif
