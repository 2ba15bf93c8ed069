#version 450
// 4-bit linear layer for decode (one token) on a GPU: a work-group of 64 invocations takes 8
// output rows, LANES (8) invocations per row, each summing every LANES-th word of the row; the
// lanes' sums meet in shared memory (a work-group reduction). For a given word index the 8
// rows of a group read 8 neighbouring words (the layout of linear_q4.glsl: word k of row o at
// w[k * oc + o], code 8k+n in bits 4n, value = code - 8, sz[b * oc + o] = (scale, zero)).
#define LANES 8
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer X { vec4 x[]; };
layout(std430, binding = 1) readonly buffer W { uint w[]; };
layout(std430, binding = 2) readonly buffer S { vec2 sz[]; };
layout(std430, binding = 3) readonly buffer Bias { float bias[]; };
layout(std430, binding = 4) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Params { int ic; int oc; int rows; int block; int has_bias; int act; } p;
shared float part[64];

void main() {
    int lid = int(gl_LocalInvocationID.x);
    int lane = lid / 8, slot = lid % 8;  // slot: the row within the group, lane: its share of words
    int o = int(gl_WorkGroupID.x) * 8 + slot;
    int per_block = p.block / 8;
    int words = p.ic / 8;
    float acc = 0.0;
    if (o < p.oc) {
        for (int k = lane; k < words; k += LANES) {
            uint word = w[k * p.oc + o];
            vec2 s = sz[(k / per_block) * p.oc + o];
            vec4 lo = vec4(uvec4(word, word >> 4, word >> 8, word >> 12) & 15u) - 8.0;
            vec4 hi = vec4(uvec4(word >> 16, word >> 20, word >> 24, word >> 28) & 15u) - 8.0;
            vec4 a = x[2 * k], c = x[2 * k + 1];
            acc += s.x * (dot(lo, a) + dot(hi, c)) + s.y * dot(a + c, vec4(1.0));
        }
    }
    part[lid] = acc;
    barrier();
    if (lane == 0 && o < p.oc) {
        float v = 0.0;
        for (int l = 0; l < LANES; ++l) v += part[l * 8 + slot];
        v += p.has_bias != 0 ? bias[o] : 0.0;
        if (p.act == 1) v = max(v, 0.0);
        else if (p.act == 2) v = clamp(v, 0.0, 6.0);
        y[o] = v;
    }
}
