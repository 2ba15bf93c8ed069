#version 450
#extension GL_EXT_samplerless_texture_functions : require
// Attention output sum_j p[t,h,j] * v_j, written token-major [seq, heads, dim]; total (keys)
// read from `step`. One invocation per (query token t, head h, 4 dims) when dim % 4 == 0
// (vec4 texels of v, vec4 stores), else per (t, h, dim); inputs read as texels.
layout(local_size_x = 256) in;
layout(binding = 0) uniform textureBuffer P;
layout(binding = 1) uniform textureBuffer V4;
layout(binding = 2) uniform textureBuffer V1;  // the same buffer as float texels
layout(std430, binding = 3) writeonly buffer O4 { vec4 o4[]; };
layout(std430, binding = 4) writeonly buffer O1 { float o1[]; };  // the same buffer as floats
layout(binding = 5) uniform itextureBuffer Step;  // past, total
layout(push_constant) uniform Params {
    int seq; int heads; int kv_heads; int dim; int stride; uint row;
} p;
void main() {
    int id = int(gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * p.row);
    int lanes = p.dim % 4 == 0 ? p.dim / 4 : p.dim;  // invocations per (t, h)
    if (id >= p.seq * p.heads * lanes) return;
    int d = id % lanes, th = id / lanes;
    int h = th % p.heads;
    int g = h / (p.heads / p.kv_heads);
    int pb = th * p.stride;
    int total = texelFetch(Step, 1).x;
    if (p.dim % 4 == 0) {
        vec4 acc = vec4(0.0);
        int rowv = p.kv_heads * lanes;
        for (int j = 0; j < total; ++j) acc += texelFetch(P, pb + j).x * texelFetch(V4, j * rowv + g * lanes + d);
        o4[id] = acc;
    } else {
        float acc = 0.0;
        for (int j = 0; j < total; ++j) acc += texelFetch(P, pb + j).x * texelFetch(V1, (j * p.kv_heads + g) * p.dim + d).x;
        o1[id] = acc;
    }
}
