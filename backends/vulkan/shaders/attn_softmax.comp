#version 450
// Softmax in place over each of `rows` score rows (`total` values, read from `step`; rows
// `stride` apart).
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer S { float s[]; };
layout(std430, binding = 1) readonly buffer Step { int past; int total; } step;
layout(push_constant) uniform Params { int rows; int stride; } p;
void main() {
    int r = int(gl_GlobalInvocationID.x);
    if (r >= p.rows) return;
    int base = r * p.stride;
    int total = step.total;
    float top = uintBitsToFloat(0xFF800000u);
    for (int j = 0; j < total; ++j) top = max(top, s[base + j]);
    float sum = 0.0;
    for (int j = 0; j < total; ++j) {
        float e = exp(s[base + j] - top);
        s[base + j] = e;
        sum += e;
    }
    float inv = 1.0 / sum;
    for (int j = 0; j < total; ++j) s[base + j] *= inv;
}
