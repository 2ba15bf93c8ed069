#version 450
// Fused RoPE on q and k (rotate-half form), one invocation per (token, head): heads
// [0, heads) are q's, [heads, heads + kv_heads) k's. cos/sin rows are cs_stride apart, laid
// out [first half | second half] of rope_dim; dims past rope_dim are copied. Optional per-head
// norm first; flags: 1 on, 2 RMS, 4 beta.
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Q { float q[]; };
layout(std430, binding = 1) readonly buffer K { float k[]; };
layout(std430, binding = 2) readonly buffer C { float cs[]; };
layout(std430, binding = 3) readonly buffer S { float sn[]; };
layout(std430, binding = 4) buffer QO { float qo[]; };
layout(std430, binding = 5) buffer KO { float ko[]; };
layout(std430, binding = 6) readonly buffer QG { float qg[]; };
layout(std430, binding = 7) readonly buffer QB { float qb[]; };
layout(std430, binding = 8) readonly buffer KG { float kg[]; };
layout(std430, binding = 9) readonly buffer KB { float kb[]; };
layout(push_constant) uniform Params {
    int seq; int heads; int kv_heads; int dim; int rope_dim; int cs_stride;
    float q_eps; float k_eps; int q_flags; int k_flags;
} p;
void main() {
    int id = int(gl_GlobalInvocationID.x);
    int per = p.heads + p.kv_heads;
    if (id >= p.seq * per) return;
    int t = id / per, h = id % per;
    bool isq = h < p.heads;
    int base = isq ? (t * p.heads + h) * p.dim : (t * p.kv_heads + h - p.heads) * p.dim;
    int flags = isq ? p.q_flags : p.k_flags;
    float eps = isq ? p.q_eps : p.k_eps;
    float mean = 0.0, inv = 1.0;
    if ((flags & 1) != 0) {
        if ((flags & 2) == 0) {
            for (int i = 0; i < p.dim; ++i) mean += isq ? q[base + i] : k[base + i];
            mean /= float(p.dim);
        }
        float sq = 0.0;
        for (int i = 0; i < p.dim; ++i) {
            float d = (isq ? q[base + i] : k[base + i]) - mean;
            sq += d * d;
        }
        inv = 1.0 / sqrt(sq / float(p.dim) + eps);
    }
    for (int i = 0; i < p.dim; ++i) {
        float v = isq ? q[base + i] : k[base + i];
        if ((flags & 1) != 0) {
            v = (v - mean) * inv * (isq ? qg[i] : kg[i]);
            if ((flags & 4) != 0) v += isq ? qb[i] : kb[i];
        }
        if (isq) qo[base + i] = v; else ko[base + i] = v;
    }
    int half_dim = p.rope_dim / 2;
    int cb = t * p.cs_stride;
    for (int i = 0; i < half_dim; ++i) {
        float a = isq ? qo[base + i] : ko[base + i];
        float b = isq ? qo[base + i + half_dim] : ko[base + i + half_dim];
        float r0 = a * cs[cb + i] - b * sn[cb + i];
        float r1 = b * cs[cb + i + half_dim] + a * sn[cb + i + half_dim];
        if (isq) { qo[base + i] = r0; qo[base + i + half_dim] = r1; }
        else { ko[base + i] = r0; ko[base + i + half_dim] = r1; }
    }
}
