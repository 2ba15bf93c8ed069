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

// acc[t][r]: rows first + LANES * r (of `oc`) of weights Wt/St for tokens t0 + t. Per 32
// codes the rows' texels are fetched once, then each word's 8 codes are dequantized once and
// dotted with the x texels of every token: one scalar partial sum per row and token (lavapipe
// runs LANES invocations in the lanes of a vector register: every per-invocation value costs a
// register, and vec4 partial sums per row spilled).
void dot_rows(utextureBuffer Wt, textureBuffer St, int oc, int first, int t0, out float acc[TOKENS][ROWS]) {
    int row[ROWS];  // past the last row: read the last one again (fixed trip counts keep acc in registers)
    for (int r = 0; r < ROWS; ++r) row[r] = min(first + LANES * r, oc - 1);
    int xrow[TOKENS];
    for (int t = 0; t < TOKENS; ++t) xrow[t] = min(t0 + t, p.tokens - 1) * (p.ic / 4);
    int per_block = p.block / 32;
    int blocks = p.ic / p.block;
    for (int t = 0; t < TOKENS; ++t) for (int r = 0; r < ROWS; ++r) acc[t][r] = 0.0;
    for (int b = 0; b < blocks; ++b) {
        float part[TOKENS][ROWS];
        float xs[TOKENS];
        for (int t = 0; t < TOKENS; ++t) {
            xs[t] = 0.0;
            for (int r = 0; r < ROWS; ++r) part[t][r] = 0.0;
        }
        for (int j = 0; j < per_block; ++j) {
            int k4 = b * per_block + j;
            uvec4 w[ROWS];
            for (int r = 0; r < ROWS; ++r) w[r] = texelFetch(Wt, k4 * oc + row[r]);
            for (int q = 0; q < 4; ++q) {  // word q: codes 8q .. 8q + 7, x texels 2q and 2q + 1
                vec4 xa[TOKENS], xb[TOKENS];
                for (int t = 0; t < TOKENS; ++t) {
                    xa[t] = texelFetch(X, xrow[t] + 8 * k4 + 2 * q);
                    xb[t] = texelFetch(X, xrow[t] + 8 * k4 + 2 * q + 1);
                    xs[t] += dot(xa[t], vec4(1.0)) + dot(xb[t], vec4(1.0));
                }
                for (int r = 0; r < ROWS; ++r) {
                    uint v = w[r][q];
                    vec4 lo = vec4(uvec4(v, v >> 4, v >> 8, v >> 12) & 15u);
                    vec4 hi = vec4(uvec4(v >> 16, v >> 20, v >> 24, v >> 28) & 15u);
                    for (int t = 0; t < TOKENS; ++t) part[t][r] += dot(lo, xa[t]) + dot(hi, xb[t]);
                }
            }
        }
        for (int r = 0; r < ROWS; ++r) {
            vec2 sz = texelFetch(St, b * oc + row[r]).xy;
            for (int t = 0; t < TOKENS; ++t)
                acc[t][r] += sz.x * (part[t][r] - 8.0 * xs[t]) + sz.y * xs[t];
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
