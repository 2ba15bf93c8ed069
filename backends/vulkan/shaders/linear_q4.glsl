// Body of linear_q4.comp (TILE 1, decode) and linear_q4_tile.comp (TILE 8, prefill).
// Linear layer on 4-bit weights dequantized in the shader; one invocation per (output row,
// tile of TILE tokens). Weights are column-interleaved so that neighbouring invocations
// (neighbouring rows) read neighbouring words: word k of row o (codes 8k..8k+7, code 8k+n in
// bits 4n) at w[k * oc + o]; value = code - 8; w = value * scale + zero with
// sz[b * oc + o] = (scale, zero) of block b. x [rows, ic] (ic % 8 == 0), y [rows, oc].
// act: 0 none, 1 relu, 2 relu6.
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer X { vec4 x[]; };
layout(std430, binding = 1) readonly buffer W { uint w[]; };
layout(std430, binding = 2) readonly buffer S { vec2 sz[]; };
layout(std430, binding = 3) readonly buffer Bias { float bias[]; };
layout(std430, binding = 4) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Params { int ic; int oc; int rows; int block; int has_bias; int act; } p;

void main() {
    int o = int(gl_GlobalInvocationID.x);
    int t0 = int(gl_GlobalInvocationID.y) * TILE;
    if (o >= p.oc) return;
    int per_block = p.block / 8;
    int blocks = p.ic / p.block;
    int row4 = p.ic / 4;
    int xrow[TILE];
    for (int t = 0; t < TILE; ++t) xrow[t] = min(t0 + t, p.rows - 1) * row4;
    float acc[TILE];
    for (int t = 0; t < TILE; ++t) acc[t] = 0.0;
    for (int b = 0; b < blocks; ++b) {
        vec2 s = sz[b * p.oc + o];
        float part[TILE];
        float xsum[TILE];
        for (int t = 0; t < TILE; ++t) { part[t] = 0.0; xsum[t] = 0.0; }
        for (int j = 0; j < per_block; ++j) {
            int k = b * per_block + j;
            uint word = w[k * p.oc + o];
            vec4 lo = vec4(ivec4(word, word >> 4, word >> 8, word >> 12) & 15) - 8.0;
            vec4 hi = vec4(ivec4(word >> 16, word >> 20, word >> 24, word >> 28) & 15) - 8.0;
            for (int t = 0; t < TILE; ++t) {
                vec4 a = x[xrow[t] + 2 * k];
                vec4 c = x[xrow[t] + 2 * k + 1];
                part[t] += dot(lo, a) + dot(hi, c);
                xsum[t] += dot(a + c, vec4(1.0));
            }
        }
        for (int t = 0; t < TILE; ++t) acc[t] += s.x * part[t] + s.y * xsum[t];
    }
    float bv = p.has_bias != 0 ? bias[o] : 0.0;
    for (int t = 0; t < TILE; ++t) {
        if (t0 + t >= p.rows) break;
        float r = acc[t] + bv;
        if (p.act == 1) r = max(r, 0.0);
        else if (p.act == 2) r = clamp(r, 0.0, 6.0);
        y[(t0 + t) * p.oc + o] = r;
    }
}
