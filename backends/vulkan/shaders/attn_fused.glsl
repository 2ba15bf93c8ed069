// Body of attn_fused64.comp / attn_fused128.comp (HEAD_DIM4: head_dim / 4). Attention in one
// dispatch for a device with subgroups of at least 8: one work-group of 8 invocations per
// (query token t, head h). Keys go by in chunks of 8, one per invocation: its score, then the
// chunk's max and sum by subgroup ops into a running softmax (the running sum is rescaled when
// the max grows); then each invocation adds the chunk's 8 value rows, weighted by the scores
// it gets by subgroupShuffle, into its share of the output (every 8th vec4 of the head).
// Keys and values before step.past are read from the cache, the step's own from the k/v
// inputs; the work-group of a kv head's first query head writes the step's k/v rows into the
// cache (nothing reads those cache rows in this dispatch). Masks as attn_scores.comp.
// The cache's format (kv_format.py): fp32 texels; KV_HALF: fp16 (the same vec4 texels through
// an R16G16B16A16 view, written packed); KV_INT8: 4 int8 per texel, a token's row being
// kv_heads * HEAD_DIM4 texels then kv_heads float scales (read through a float view, bindings 10
// and 11), written quantized by the work-group's subgroupMax of |x| (scale = max / 127).
// SPLIT (attn_split<dim>.comp, flash-decoding of one query token): work-group z is a split,
// walking only its share of the keys (whole chunks, at least p.split_keys keys a split, so at a
// shallow depth the later splits are empty); it leaves per (head, split) HEAD_DIM4 texels of
// unnormalised output then (max, sum, 0, 0) in O, for attn_merge.comp; split 0 appends the row.
#extension GL_EXT_samplerless_texture_functions : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_shuffle : require
layout(local_size_x = 8) in;
layout(binding = 0) uniform textureBuffer Q;
layout(binding = 1) uniform textureBuffer K;    // the step's keys [kv_seq, kv_heads, dim]
layout(binding = 2) uniform textureBuffer V;
#ifdef KV_INT8
layout(binding = 3) uniform itextureBuffer CK;  // the cache (or K again without one)
layout(binding = 4) uniform itextureBuffer CV;
#else
layout(binding = 3) uniform textureBuffer CK;   // the cache (or K again without one)
layout(binding = 4) uniform textureBuffer CV;
#endif
layout(binding = 5) uniform utextureBuffer M;
layout(std430, binding = 6) writeonly buffer O { vec4 o[]; };
#if defined(KV_INT8)
layout(std430, binding = 7) writeonly buffer WK { int wk[]; };  // the cache, written
layout(std430, binding = 8) writeonly buffer WV { int wv[]; };
#elif defined(KV_HALF)
layout(std430, binding = 7) writeonly buffer WK { uvec2 wk[]; };
layout(std430, binding = 8) writeonly buffer WV { uvec2 wv[]; };
#else
layout(std430, binding = 7) writeonly buffer WK { vec4 wk[]; };
layout(std430, binding = 8) writeonly buffer WV { vec4 wv[]; };
#endif
layout(binding = 9) uniform itextureBuffer Step;  // past, total
#ifdef KV_INT8
layout(binding = 10) uniform textureBuffer CKS;  // the caches as float texels: their scales
layout(binding = 11) uniform textureBuffer CVS;
#endif
layout(push_constant) uniform Params {
    int seq; int heads; int kv_heads; int kv_seq; float scale;
    int mask_mode; int mask_rows; int mask_cols; int write_cache; uint groups_x; int splits; int split_keys;
} p;

const int PER_LANE = (HEAD_DIM4 + 7) / 8;  // output vec4s per invocation

#ifdef KV_INT8
int row4() { return p.kv_heads * (HEAD_DIM4 + 1); }  // texels of a token's row
int cached(int j, int g, int d) { return j * row4() + g * HEAD_DIM4 + d; }
float key_scale(int j, int g, int past) {
    return j >= past ? 1.0 : texelFetch(CKS, j * row4() + p.kv_heads * HEAD_DIM4 + g).x;
}
float value_scale(int j, int g, int past) {
    return j >= past ? 1.0 : texelFetch(CVS, j * row4() + p.kv_heads * HEAD_DIM4 + g).x;
}
#define FETCH(T, i) vec4(texelFetch(T, i))
#else
int cached(int j, int g, int d) { return (j * p.kv_heads + g) * HEAD_DIM4 + d; }
float key_scale(int j, int g, int past) { return 1.0; }
float value_scale(int j, int g, int past) { return 1.0; }
#define FETCH(T, i) texelFetch(T, i)
#endif

vec4 key(int j, int g, int d, int past) {
    return j >= past ? texelFetch(K, ((j - past) * p.kv_heads + g) * HEAD_DIM4 + d) : FETCH(CK, cached(j, g, d));
}

vec4 value(int j, int g, int d, int past) {
    return j >= past ? texelFetch(V, ((j - past) * p.kv_heads + g) * HEAD_DIM4 + d) : FETCH(CV, cached(j, g, d));
}

#ifdef KV_INT8
int pack_int8(vec4 x, float inverse) {
    ivec4 q = clamp(ivec4(roundEven(x * inverse)), -127, 127) & 255;
    return q.x | (q.y << 8) | (q.z << 16) | (q.w << 24);
}

// one (token, kv head) row of an input into the int8 cache: the work-group's 8 lanes together
void store_row(int from, int j, int g, int lane) {
    float kt = 0.0, vt = 0.0;
    for (int d = lane; d < HEAD_DIM4; d += 8) {
        vec4 k = abs(texelFetch(K, from + d)), v = abs(texelFetch(V, from + d));
        kt = max(kt, max(max(k.x, k.y), max(k.z, k.w)));
        vt = max(vt, max(max(v.x, v.y), max(v.z, v.w)));
    }
    kt = subgroupMax(kt);
    vt = subgroupMax(vt);
    float ki = kt > 0.0 ? 127.0 / kt : 0.0, vi = vt > 0.0 ? 127.0 / vt : 0.0;
    for (int d = lane; d < HEAD_DIM4; d += 8) {
        wk[cached(j, g, d)] = pack_int8(texelFetch(K, from + d), ki);
        wv[cached(j, g, d)] = pack_int8(texelFetch(V, from + d), vi);
    }
    if (lane == 0) {
        wk[j * row4() + p.kv_heads * HEAD_DIM4 + g] = floatBitsToInt(kt / 127.0);
        wv[j * row4() + p.kv_heads * HEAD_DIM4 + g] = floatBitsToInt(vt / 127.0);
    }
}
#else
void store_row(int from, int j, int g, int lane) {
    for (int d = lane; d < HEAD_DIM4; d += 8) {
        vec4 k = texelFetch(K, from + d), v = texelFetch(V, from + d);
#ifdef KV_HALF
        wk[cached(j, g, d)] = uvec2(packHalf2x16(k.xy), packHalf2x16(k.zw));
        wv[cached(j, g, d)] = uvec2(packHalf2x16(v.xy), packHalf2x16(v.zw));
#else
        wk[cached(j, g, d)] = k;
        wv[cached(j, g, d)] = v;
#endif
    }
}
#endif

void main() {
    int th = int(gl_WorkGroupID.x + gl_WorkGroupID.y * p.groups_x);
    if (th >= p.seq * p.heads) return;
    int lane = int(gl_LocalInvocationID.x);
    int h = th % p.heads, t = th / p.heads;
    int group = p.heads / p.kv_heads, g = h / group;
    int past = texelFetch(Step, 0).x, total = texelFetch(Step, 1).x;
#ifdef SPLIT
    int s = int(gl_WorkGroupID.z);  // this work-group's share of the keys: whole chunks, >= split_keys a split
    int used = clamp(total / p.split_keys, 1, p.splits);
    int chunk = (total + used * 8 - 1) / (used * 8) * 8;
    int begin = min(total, s * chunk), end = min(total, begin + chunk);
    if (p.write_cache != 0 && s == 0 && h % group == 0 && t < p.kv_seq)
#else
    int begin = 0, end = total;
    if (p.write_cache != 0 && h % group == 0 && t < p.kv_seq)
#endif
        store_row((t * p.kv_heads + g) * HEAD_DIM4, past + t, g, lane);
    vec4 q[HEAD_DIM4];
    int qa = (t * p.heads + h) * HEAD_DIM4;
    for (int d = 0; d < HEAD_DIM4; ++d) q[d] = texelFetch(Q, qa + d);
    const float NEG_INF = uintBitsToFloat(0xFF800000u);
    float top = NEG_INF, sum = 0.0;
    vec4 acc[PER_LANE];
    for (int i = 0; i < PER_LANE; ++i) acc[i] = vec4(0.0);
    for (int c = begin; c < end; c += 8) {
        int j = c + lane;
        float s = NEG_INF;
        if (j < end) {
            vec4 dot4 = vec4(0.0);
            for (int d = 0; d < HEAD_DIM4; ++d) dot4 += q[d] * key(j, g, d, past);
            s = dot(dot4, vec4(1.0)) * p.scale * key_scale(j, g, past);
            if (p.mask_mode == 1) {
                if (j > past + t) s = NEG_INF;
            } else if (p.mask_mode >= 2) {
                int start = total - p.mask_cols;
                if (j >= start) {
                    uint m = texelFetch(M, (p.mask_rows - p.seq + t) * p.mask_cols + j - start).x;
                    if (p.mask_mode == 2) s += uintBitsToFloat(m);
                    else if (m == 0u) s = NEG_INF;
                }
            }
        }
        float new_top = max(top, subgroupMax(s));
        if (new_top == NEG_INF) continue;  // every key so far masked out
        float rescale = exp(top - new_top);
        float w = exp(s - new_top);
        sum = sum * rescale + subgroupAdd(w);
        for (int i = 0; i < PER_LANE; ++i) acc[i] *= rescale;
        for (int k = 0; k < 8; ++k) {
            float wk_ = subgroupShuffle(w, uint(k));
            if (c + k >= end) break;
            wk_ *= value_scale(c + k, g, past);
            for (int i = 0; i < PER_LANE; ++i) {
                int d = lane + 8 * i;
                if (d < HEAD_DIM4) acc[i] += wk_ * value(c + k, g, d, past);
            }
        }
        top = new_top;
    }
#ifdef SPLIT
    int at = (th * p.splits + s) * (HEAD_DIM4 + 1);  // unnormalised, then (max, sum): attn_merge.comp
    for (int i = 0; i < PER_LANE; ++i) {
        int d = lane + 8 * i;
        if (d < HEAD_DIM4) o[at + d] = acc[i];
    }
    if (lane == 0) o[at + HEAD_DIM4] = vec4(top, sum, 0.0, 0.0);
#else
    float inv = 1.0 / sum;
    for (int i = 0; i < PER_LANE; ++i) {
        int d = lane + 8 * i;
        if (d < HEAD_DIM4) o[qa + d] = acc[i] * inv;
    }
#endif
}
