#version 450
#extension GL_EXT_samplerless_texture_functions : require
// Fused RoPE on q and k (rotate-half form), one invocation per (token, head): heads
// [0, heads) are q's, [heads, heads + kv_heads) k's. cos/sin rows are cs_stride apart, laid
// out [first half | second half] of rope_dim; dims past rope_dim are copied. Optional per-head
// norm first; flags: 1 on, 2 RMS, 4 beta. Inputs are read as float texels and every output
// element written once (the norm is applied to each value as it is read).
layout(local_size_x = 64) in;
layout(binding = 0) uniform textureBuffer Q;
layout(binding = 1) uniform textureBuffer K;
layout(binding = 2) uniform textureBuffer C;
layout(binding = 3) uniform textureBuffer S;
layout(std430, binding = 4) writeonly buffer QO { float qo[]; };
layout(std430, binding = 5) writeonly buffer KO { float ko[]; };
layout(binding = 6) uniform textureBuffer QG;
layout(binding = 7) uniform textureBuffer QB;
layout(binding = 8) uniform textureBuffer KG;
layout(binding = 9) uniform textureBuffer KB;
layout(push_constant) uniform Params {
    int seq; int heads; int kv_heads; int dim; int rope_dim; int cs_stride;
    float q_eps; float k_eps; int q_flags; int k_flags;
} p;

bool isq;
int base, flags;
float mean, inv;

float source(int i) {  // element i of this head, normed when the flags say so
    float v = isq ? texelFetch(Q, base + i).x : texelFetch(K, base + i).x;
    if ((flags & 1) != 0) {
        v = (v - mean) * inv * (isq ? texelFetch(QG, i).x : texelFetch(KG, i).x);
        if ((flags & 4) != 0) v += isq ? texelFetch(QB, i).x : texelFetch(KB, i).x;
    }
    return v;
}

void store(int i, float v) {
    if (isq) qo[base + i] = v; else ko[base + i] = v;
}

void main() {
    int id = int(gl_GlobalInvocationID.x);
    int per = p.heads + p.kv_heads;
    if (id >= p.seq * per) return;
    int t = id / per, h = id % per;
    isq = h < p.heads;
    base = isq ? (t * p.heads + h) * p.dim : (t * p.kv_heads + h - p.heads) * p.dim;
    flags = isq ? p.q_flags : p.k_flags;
    float eps = isq ? p.q_eps : p.k_eps;
    mean = 0.0;
    inv = 1.0;
    if ((flags & 1) != 0) {
        if ((flags & 2) == 0) {
            for (int i = 0; i < p.dim; ++i) mean += isq ? texelFetch(Q, base + i).x : texelFetch(K, base + i).x;
            mean /= float(p.dim);
        }
        float sq = 0.0;
        for (int i = 0; i < p.dim; ++i) {
            float d = (isq ? texelFetch(Q, base + i).x : texelFetch(K, base + i).x) - mean;
            sq += d * d;
        }
        inv = 1.0 / sqrt(sq / float(p.dim) + eps);
    }
    int half_dim = p.rope_dim / 2;
    int cb = t * p.cs_stride;
    for (int i = 0; i < half_dim; ++i) {
        float a = source(i), b = source(i + half_dim);
        store(i, a * texelFetch(C, cb + i).x - b * texelFetch(S, cb + i).x);
        store(i + half_dim, b * texelFetch(C, cb + i + half_dim).x + a * texelFetch(S, cb + i + half_dim).x);
    }
    for (int i = 2 * half_dim; i < p.dim; ++i) store(i, source(i));
}
