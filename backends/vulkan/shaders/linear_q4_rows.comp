#version 450
// 4-bit linear layer for decode (one token) on a CPU device (lavapipe): ROWS output rows per
// invocation, so each x load serves ROWS rows (on a CPU the loads, not the arithmetic, cost).
// Weights in linear_q4.glsl's layout: word k of row o (codes 8k..8k+7, code 8k+n in bits 4n)
// at w[k * oc + o]; value = code - 8; w = value * scale + zero, sz[b * oc + o] = (scale, zero).
// Sum over a block: scale * (sum(code * x) - 8 sum(x)) + zero * sum(x).
#define ROWS 8
layout(local_size_x = 16) in;
layout(std430, binding = 0) readonly buffer X { vec4 x[]; };
layout(std430, binding = 1) readonly buffer W { uint w[]; };
layout(std430, binding = 2) readonly buffer S { vec2 sz[]; };
layout(std430, binding = 3) readonly buffer Bias { float bias[]; };
layout(std430, binding = 4) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Params { int ic; int oc; int rows; int block; int has_bias; int act; } p;

void main() {
    int o0 = int(gl_GlobalInvocationID.x) * ROWS;
    if (o0 >= p.oc) return;
    int row[ROWS];  // past the last row: read the last one again (fixed trip counts keep acc in registers)
    for (int r = 0; r < ROWS; ++r) row[r] = min(o0 + r, p.oc - 1);
    int per_block = p.block / 8;
    int blocks = p.ic / p.block;
    float acc[ROWS];
    for (int r = 0; r < ROWS; ++r) acc[r] = 0.0;
    for (int b = 0; b < blocks; ++b) {
        float part[ROWS];
        for (int r = 0; r < ROWS; ++r) part[r] = 0.0;
        float xs = 0.0;
        for (int j = 0; j < per_block; ++j) {
            int k = b * per_block + j;
            vec4 a = x[2 * k], c = x[2 * k + 1];
            xs += dot(a + c, vec4(1.0));
            for (int r = 0; r < ROWS; ++r) {
                uint word = w[k * p.oc + row[r]];
                vec4 lo = vec4(uvec4(word, word >> 4, word >> 8, word >> 12) & 15u);
                vec4 hi = vec4(uvec4(word >> 16, word >> 20, word >> 24, word >> 28) & 15u);
                part[r] += dot(lo, a) + dot(hi, c);
            }
        }
        for (int r = 0; r < ROWS; ++r) {
            vec2 s = sz[b * p.oc + row[r]];
            acc[r] += s.x * (part[r] - 8.0 * xs) + s.y * xs;
        }
    }
    for (int r = 0; r < ROWS; ++r) {
        if (o0 + r >= p.oc) break;
        float v = acc[r] + (p.has_bias != 0 ? bias[o0 + r] : 0.0);
        if (p.act == 1) v = max(v, 0.0);
        else if (p.act == 2) v = clamp(v, 0.0, 6.0);
        y[o0 + r] = v;
    }
}
