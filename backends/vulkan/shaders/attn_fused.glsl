// Body of attn_fused64.comp / attn_fused128.comp (HEAD_DIM4: head_dim / 4). Attention in one
// dispatch for a device with subgroups of at least 8: one work-group of 8 invocations per
// (query token t, head h). Keys go by in chunks of 8, one per invocation: its score, then the
// chunk's max and sum by subgroup ops into a running softmax (the running sum is rescaled when
// the max grows); then each invocation adds the chunk's 8 value rows, weighted by the scores
// it gets by subgroupShuffle, into its share of the output (every 8th vec4 of the head).
// Keys and values before step.past are read from the cache, the step's own from the k/v
// inputs; the work-group of a kv head's first query head writes the step's k/v rows into the
// cache (nothing reads those cache rows in this dispatch). Masks as attn_scores.comp.
#extension GL_EXT_samplerless_texture_functions : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_shuffle : require
layout(local_size_x = 8) in;
layout(binding = 0) uniform textureBuffer Q;
layout(binding = 1) uniform textureBuffer K;    // the step's keys [kv_seq, kv_heads, dim]
layout(binding = 2) uniform textureBuffer V;
layout(binding = 3) uniform textureBuffer CK;   // the cache (or K again without one)
layout(binding = 4) uniform textureBuffer CV;
layout(binding = 5) uniform utextureBuffer M;
layout(std430, binding = 6) writeonly buffer O { vec4 o[]; };
layout(std430, binding = 7) writeonly buffer WK { vec4 wk[]; };  // the cache, written
layout(std430, binding = 8) writeonly buffer WV { vec4 wv[]; };
layout(binding = 9) uniform itextureBuffer Step;  // past, total
layout(push_constant) uniform Params {
    int seq; int heads; int kv_heads; int kv_seq; float scale;
    int mask_mode; int mask_rows; int mask_cols; int write_cache; uint groups_x;
} p;

const int PER_LANE = (HEAD_DIM4 + 7) / 8;  // output vec4s per invocation

vec4 key(int j, int g, int d, int past) {
    return j >= past ? texelFetch(K, ((j - past) * p.kv_heads + g) * HEAD_DIM4 + d)
                     : texelFetch(CK, (j * p.kv_heads + g) * HEAD_DIM4 + d);
}

vec4 value(int j, int g, int d, int past) {
    return j >= past ? texelFetch(V, ((j - past) * p.kv_heads + g) * HEAD_DIM4 + d)
                     : texelFetch(CV, (j * p.kv_heads + g) * HEAD_DIM4 + d);
}

void main() {
    int th = int(gl_WorkGroupID.x + gl_WorkGroupID.y * p.groups_x);
    if (th >= p.seq * p.heads) return;
    int lane = int(gl_LocalInvocationID.x);
    int h = th % p.heads, t = th / p.heads;
    int group = p.heads / p.kv_heads, g = h / group;
    int past = texelFetch(Step, 0).x, total = texelFetch(Step, 1).x;
    if (p.write_cache != 0 && h % group == 0 && t < p.kv_seq) {
        int from = (t * p.kv_heads + g) * HEAD_DIM4, to = ((past + t) * p.kv_heads + g) * HEAD_DIM4;
        for (int d = lane; d < HEAD_DIM4; d += 8) {
            wk[to + d] = texelFetch(K, from + d);
            wv[to + d] = texelFetch(V, from + d);
        }
    }
    vec4 q[HEAD_DIM4];
    int qa = (t * p.heads + h) * HEAD_DIM4;
    for (int d = 0; d < HEAD_DIM4; ++d) q[d] = texelFetch(Q, qa + d);
    const float NEG_INF = uintBitsToFloat(0xFF800000u);
    float top = NEG_INF, sum = 0.0;
    vec4 acc[PER_LANE];
    for (int i = 0; i < PER_LANE; ++i) acc[i] = vec4(0.0);
    for (int c = 0; c < total; c += 8) {
        int j = c + lane;
        float s = NEG_INF;
        if (j < total) {
            vec4 dot4 = vec4(0.0);
            for (int d = 0; d < HEAD_DIM4; ++d) dot4 += q[d] * key(j, g, d, past);
            s = dot(dot4, vec4(1.0)) * p.scale;
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
            if (c + k >= total) break;
            for (int i = 0; i < PER_LANE; ++i) {
                int d = lane + 8 * i;
                if (d < HEAD_DIM4) acc[i] += wk_ * value(c + k, g, d, past);
            }
        }
        top = new_top;
    }
    float inv = 1.0 / sum;
    for (int i = 0; i < PER_LANE; ++i) {
        int d = lane + 8 * i;
        if (d < HEAD_DIM4) o[qa + d] = acc[i] * inv;
    }
}
