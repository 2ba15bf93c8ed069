#version 450
// LayerNorm / RMSNorm, one invocation per normalized row of `len` elements spaced `hw`
// apart (hw > 1: the channel axis of an NC4HW4 tensor). flags: 1 rms, 2 gamma, 4 beta,
// 8 fused residual (sum = x + r is written to `sum`, then normalized into `y`).
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer R { float r[]; };
layout(std430, binding = 2) buffer Sum { float sum[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
layout(std430, binding = 4) readonly buffer G { float gamma[]; };
layout(std430, binding = 5) readonly buffer Bt { float beta[]; };
layout(push_constant) uniform Params { int rows; int len; int hw; float eps; int flags; } p;
void main() {
    int row = int(gl_GlobalInvocationID.x);
    if (row >= p.rows) return;
    int base = (row / p.hw) * p.len * p.hw + row % p.hw;
    bool residual = (p.flags & 8) != 0;
    float mean = 0.0;
    for (int k = 0; k < p.len; ++k) {
        int i = base + k * p.hw;
        float v = x[i];
        if (residual) { v += r[i]; sum[i] = v; }
        mean += v;
    }
    mean = (p.flags & 1) != 0 ? 0.0 : mean / float(p.len);
    float var = 0.0;
    for (int k = 0; k < p.len; ++k) {
        int i = base + k * p.hw;
        float v = (residual ? sum[i] : x[i]) - mean;
        var += v * v;
    }
    float inv = 1.0 / sqrt(var / float(p.len) + p.eps);
    for (int k = 0; k < p.len; ++k) {
        int i = base + k * p.hw;
        float v = ((residual ? sum[i] : x[i]) - mean) * inv;
        if ((p.flags & 2) != 0) v *= gamma[k];
        if ((p.flags & 4) != 0) v += beta[k];
        y[i] = v;
    }
}
