#version 450
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_EXT_samplerless_texture_functions : require
// LayerNorm / RMSNorm as norm.comp, for a device with subgroup arithmetic and subgroups of at
// least 8 (lavapipe: 8 lanes, one vector): one work-group of 8 invocations per row, each
// summing every 8th element, the sums joined by subgroupAdd; inputs read as float texels.
// The fused residual sum x + r is recomputed where it is needed rather than read back.
layout(local_size_x = 8) in;
layout(binding = 0) uniform textureBuffer X;
layout(binding = 1) uniform textureBuffer R;
layout(std430, binding = 2) writeonly buffer Sum { float sum[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
layout(binding = 4) uniform textureBuffer G;
layout(binding = 5) uniform textureBuffer Bt;
layout(push_constant) uniform Params { int rows; int len; int hw; float eps; int flags; uint groups_x; } p;
void main() {
    int row = int(gl_WorkGroupID.x + gl_WorkGroupID.y * p.groups_x);
    if (row >= p.rows) return;
    int lane = int(gl_LocalInvocationID.x);
    int base = (row / p.hw) * p.len * p.hw + row % p.hw;
    bool residual = (p.flags & 8) != 0;
    float mean = 0.0;
    for (int k = lane; k < p.len; k += 8) {
        int i = base + k * p.hw;
        float v = texelFetch(X, i).x;
        if (residual) { v += texelFetch(R, i).x; sum[i] = v; }
        mean += v;
    }
    mean = (p.flags & 1) != 0 ? 0.0 : subgroupAdd(mean) / float(p.len);
    float var = 0.0;
    for (int k = lane; k < p.len; k += 8) {
        int i = base + k * p.hw;
        float v = texelFetch(X, i).x + (residual ? texelFetch(R, i).x : 0.0) - mean;
        var += v * v;
    }
    float inv = 1.0 / sqrt(subgroupAdd(var) / float(p.len) + p.eps);
    for (int k = lane; k < p.len; k += 8) {
        int i = base + k * p.hw;
        float v = (texelFetch(X, i).x + (residual ? texelFetch(R, i).x : 0.0) - mean) * inv;
        if ((p.flags & 2) != 0) v *= texelFetch(G, k).x;
        if ((p.flags & 4) != 0) v += texelFetch(Bt, k).x;
        y[i] = v;
    }
}
