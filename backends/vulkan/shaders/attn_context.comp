#version 450
// Attention output, one invocation per (query token t, head h, dim d): sum_j p[t,h,j] * v_j[d],
// written token-major [seq, heads, dim]; total (keys) read from `step`.
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer P { float pr[]; };
layout(std430, binding = 1) readonly buffer V { float v[]; };
layout(std430, binding = 2) writeonly buffer O { float o[]; };
layout(std430, binding = 3) readonly buffer Step { int past; int total; } step;
layout(push_constant) uniform Params {
    int seq; int heads; int kv_heads; int dim; int stride; uint row;
} p;
void main() {
    int id = int(gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * p.row);
    if (id >= p.seq * p.heads * p.dim) return;
    int d = id % p.dim, th = id / p.dim;
    int h = th % p.heads;
    int g = h / (p.heads / p.kv_heads);
    int pb = th * p.stride;
    float acc = 0.0;
    int total = step.total;
    for (int j = 0; j < total; ++j) acc += pr[pb + j] * v[(j * p.kv_heads + g) * p.dim + d];
    o[id] = acc;
}
