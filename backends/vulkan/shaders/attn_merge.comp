#version 450
#extension GL_EXT_samplerless_texture_functions : require
// The splits of attn_split (flash-decoding) into the output: an invocation per (head, texel),
// each split's output and sum weighted by exp(its max - the overall max); an empty split (max
// -inf) adds nothing. Part: per (head, split) dim4 texels of output then (max, sum, 0, 0).
layout(local_size_x = 64) in;
layout(binding = 0) uniform textureBuffer Part;
layout(std430, binding = 1) writeonly buffer O { vec4 o[]; };
layout(push_constant) uniform Params { int heads; int dim4; int splits; uint groups_x; } p;

void main() {
    int i = int(gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * p.groups_x);
    if (i >= p.heads * p.dim4) return;
    int h = i / p.dim4, d = i % p.dim4, row = p.dim4 + 1;
    int base = h * p.splits * row;
    const float NEG_INF = uintBitsToFloat(0xFF800000u);
    float top = NEG_INF;
    for (int s = 0; s < p.splits; ++s) top = max(top, texelFetch(Part, base + s * row + p.dim4).x);
    vec4 acc = vec4(0.0);
    float sum = 0.0;
    for (int s = 0; s < p.splits; ++s) {
        vec2 stats = texelFetch(Part, base + s * row + p.dim4).xy;
        if (stats.x == NEG_INF) continue;
        float w = exp(stats.x - top);
        sum += w * stats.y;
        acc += w * texelFetch(Part, base + s * row + d);
    }
    o[i] = acc * (1.0 / sum);
}
