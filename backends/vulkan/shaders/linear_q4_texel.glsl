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
layout(local_size_x = LANES) in;
layout(binding = 0) uniform textureBuffer X;
layout(binding = 1) uniform utextureBuffer W;
layout(binding = 2) uniform textureBuffer S;
layout(binding = 3) uniform textureBuffer Bias;
layout(std430, binding = 4) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Params { int ic; int oc; int tokens; int block; int has_bias; int act; } p;

void main() {
    int first = int(gl_WorkGroupID.x) * LANES * ROWS + int(gl_LocalInvocationID.x);
    int t0 = int(gl_WorkGroupID.y) * TOKENS;
    int row[ROWS];  // past the last row: read the last one again (fixed trip counts keep acc in registers)
    for (int r = 0; r < ROWS; ++r) row[r] = min(first + LANES * r, p.oc - 1);
    int xrow[TOKENS];
    for (int t = 0; t < TOKENS; ++t) xrow[t] = min(t0 + t, p.tokens - 1) * (p.ic / 4);
    int per_block = p.block / 32;
    int blocks = p.ic / p.block;
    float acc[TOKENS][ROWS];
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
                uvec4 w = texelFetch(W, k4 * p.oc + row[r]);
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
            vec2 sz = texelFetch(S, b * p.oc + row[r]).xy;
            for (int t = 0; t < TOKENS; ++t) {
                float sum_x = dot(xs[t], vec4(1.0));
                acc[t][r] += sz.x * (dot(part[t][r], vec4(1.0)) - 8.0 * sum_x) + sz.y * sum_x;
            }
        }
    }
    for (int r = 0; r < ROWS; ++r) {
        int o = first + LANES * r;
        if (o >= p.oc) break;
        float bv = p.has_bias != 0 ? texelFetch(Bias, o).x : 0.0;
        for (int t = 0; t < TOKENS; ++t) {
            if (t0 + t >= p.tokens) break;
            float v = acc[t][r] + bv;
            if (p.act == 1) v = max(v, 0.0);
            else if (p.act == 2) v = clamp(v, 0.0, 6.0);
            y[(t0 + t) * p.oc + o] = v;
        }
    }
}
