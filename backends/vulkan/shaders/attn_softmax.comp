#version 450
// Softmax in place over each of `rows` score rows (`total` values, rows `stride` apart).
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer S { float s[]; };
layout(push_constant) uniform Params { int rows; int total; int stride; } p;
void main() {
    int r = int(gl_GlobalInvocationID.x);
    if (r >= p.rows) return;
    int base = r * p.stride;
    float top = uintBitsToFloat(0xFF800000u);
    for (int j = 0; j < p.total; ++j) top = max(top, s[base + j]);
    float sum = 0.0;
    for (int j = 0; j < p.total; ++j) {
        float e = exp(s[base + j] - top);
        s[base + j] = e;
        sum += e;
    }
    float inv = 1.0 / sum;
    for (int j = 0; j < p.total; ++j) s[base + j] *= inv;
}
