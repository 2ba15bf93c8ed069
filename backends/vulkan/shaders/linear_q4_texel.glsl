// Body of linear_q4_texel.comp (TOKENS 1, decode) and linear_q4_texel_tile.comp (prefill).
// 4-bit linear layer for a CPU device (lavapipe): every input is read through a texel buffer,
// which lavapipe fetches with vector gathers (a storage-buffer read is a loop over the lanes,
// several times slower). Each invocation computes ROWS output rows for TOKENS tokens; the rows
// of one invocation are LANES apart, so neighbouring lanes fetch neighbouring texels.
// Weights: texel k4 * oc + o (4 words) holds row o's codes 32 k4 .. 32 k4 + 31, code 8k+n of
// word k in bits 4n; value = code - 8; w = value * scale + zero with (scale, zero) at texel
// b * oc + o of S. Sum over a block: scale * (sum(code * x) - 8 sum(x)) + zero * sum(x).
// x [tokens, ic] as vec4 texels (ic % 32 == 0), y [tokens, oc]. act: 0 none, 1 relu, 2 relu6.
#extension GL_EXT_samplerless_texture_functions : require
// SEGMENTS 2 (decode only): two layers that read the same x (q and k, gate and up) in one
// dispatch; work-groups below p.groups0 take the first layer (W, S, Bias, y), the rest the
// second (W1, S1, Bias1, y1), so every work-group reads one layer's weights.
#ifndef SEGMENTS
#define SEGMENTS 1
#endif
layout(local_size_x = LANES) in;
layout(binding = 0) uniform textureBuffer X;
layout(binding = 1) uniform utextureBuffer W;
layout(binding = 2) uniform textureBuffer S;
layout(binding = 3) uniform textureBuffer Bias;
layout(std430, binding = 4) writeonly buffer Y { float y[]; };
#if SEGMENTS > 1
layout(binding = 5) uniform utextureBuffer W1;
layout(binding = 6) uniform textureBuffer S1;
layout(binding = 7) uniform textureBuffer Bias1;
layout(std430, binding = 8) writeonly buffer Y1 { float y1[]; };
layout(push_constant) uniform Params {
    int ic; int oc; int tokens; int block; int has_bias; int act;
    int oc1; int has_bias1; int act1; int groups0;
} p;
#else
layout(push_constant) uniform Params { int ic; int oc; int tokens; int block; int has_bias; int act; } p;
#endif

// acc[t][r]: rows first + LANES * r (of `oc`) of weights Wt/St for tokens t0 + t.
void dot_rows(utextureBuffer Wt, textureBuffer St, int oc, int first, int t0, out float acc[TOKENS][ROWS]) {
    int row[ROWS];  // past the last row: read the last one again (fixed trip counts keep acc in registers)
    for (int r = 0; r < ROWS; ++r) row[r] = min(first + LANES * r, oc - 1);
    int xrow[TOKENS];
    for (int t = 0; t < TOKENS; ++t) xrow[t] = min(t0 + t, p.tokens - 1) * (p.ic / 4);
    int per_block = p.block / 32;
    int blocks = p.ic / p.block;
    for (int t = 0; t < TOKENS; ++t) for (int r = 0; r < ROWS; ++r) acc[t][r] = 0.0;
    for (int b = 0; b < blocks; ++b) {
        vec4 part[TOKENS][ROWS];  // four partial sums per row: short dependency chains
        vec4 xs[TOKENS];
        for (int t = 0; t < TOKENS; ++t) {
            xs[t] = vec4(0.0);
            for (int r = 0; r < ROWS; ++r) part[t][r] = vec4(0.0);
        }
        for (int j = 0; j < per_block; ++j) {
            int k4 = b * per_block + j;
            vec4 xv[TOKENS][8];
            for (int t = 0; t < TOKENS; ++t) {
                for (int q = 0; q < 8; ++q) {
                    xv[t][q] = texelFetch(X, xrow[t] + 8 * k4 + q);
                    xs[t] += xv[t][q];
                }
            }
            for (int r = 0; r < ROWS; ++r) {
                uvec4 w = texelFetch(Wt, k4 * oc + row[r]);
                vec4 c[8];  // the 32 codes, dequantized once for every token
                for (int q = 0; q < 4; ++q) {
                    c[2 * q] = vec4(uvec4(w[q], w[q] >> 4, w[q] >> 8, w[q] >> 12) & 15u);
                    c[2 * q + 1] = vec4(uvec4(w[q] >> 16, w[q] >> 20, w[q] >> 24, w[q] >> 28) & 15u);
                }
                for (int t = 0; t < TOKENS; ++t) {
                    for (int q = 0; q < 8; ++q) part[t][r] += c[q] * xv[t][q];
                }
            }
        }
        for (int r = 0; r < ROWS; ++r) {
            vec2 sz = texelFetch(St, b * oc + row[r]).xy;
            for (int t = 0; t < TOKENS; ++t) {
                float sum_x = dot(xs[t], vec4(1.0));
                acc[t][r] += sz.x * (dot(part[t][r], vec4(1.0)) - 8.0 * sum_x) + sz.y * sum_x;
            }
        }
    }
}

float finish(float v, float bias, int act) {
    v += bias;
    if (act == 1) v = max(v, 0.0);
    else if (act == 2) v = clamp(v, 0.0, 6.0);
    return v;
}

// y / y1 are storage buffers (not passable to a function): the store loop, for either layer
#define STORE(OUT, BIAS, OC, HAS_BIAS, ACT)                                                   \
    for (int r = 0; r < ROWS; ++r) {                                                         \
        int o = first + LANES * r;                                                           \
        if (o >= OC) break;                                                                  \
        float bv = HAS_BIAS != 0 ? texelFetch(BIAS, o).x : 0.0;                              \
        for (int t = 0; t < TOKENS; ++t) {                                                   \
            if (t0 + t >= p.tokens) break;                                                   \
            OUT[(t0 + t) * OC + o] = finish(acc[t][r], bv, ACT);                             \
        }                                                                                    \
    }

void main() {
    int group = int(gl_WorkGroupID.x);
    int t0 = int(gl_WorkGroupID.y) * TOKENS;
    float acc[TOKENS][ROWS];
#if SEGMENTS > 1
    if (group >= p.groups0) {
        int first = (group - p.groups0) * LANES * ROWS + int(gl_LocalInvocationID.x);
        dot_rows(W1, S1, p.oc1, first, t0, acc);
        STORE(y1, Bias1, p.oc1, p.has_bias1, p.act1)
        return;
    }
#endif
    int first = group * LANES * ROWS + int(gl_LocalInvocationID.x);
    dot_rows(W, S, p.oc, first, t0, acc);
    STORE(y, Bias, p.oc, p.has_bias, p.act)
}
