#version 450
// Linear layer on fp32 weights [oc, ic] (float weights, and quantized weights this backend has
// no packed format for, dequantized once at load). One invocation per (output row, token).
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer W { float w[]; };
layout(std430, binding = 2) readonly buffer S { vec2 unused[]; };
layout(std430, binding = 3) readonly buffer Bias { float bias[]; };
layout(std430, binding = 4) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Params { int ic; int oc; int rows; int block; int has_bias; int act; } p;
void main() {
    int o = int(gl_GlobalInvocationID.x);
    int t = int(gl_GlobalInvocationID.y);
    if (o >= p.oc || t >= p.rows) return;
    float acc = 0.0;
    for (int k = 0; k < p.ic; ++k) acc += w[o * p.ic + k] * x[t * p.ic + k];
    float r = acc + (p.has_bias != 0 ? bias[o] : 0.0);
    if (p.act == 1) r = max(r, 0.0);
    else if (p.act == 2) r = clamp(r, 0.0, 6.0);
    y[t * p.oc + o] = r;
}
