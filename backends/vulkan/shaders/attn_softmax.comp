#version 450
#extension GL_EXT_samplerless_texture_functions : require
// Softmax in place over each of `rows` score rows (`total` values, read from `step`; rows
// `stride` apart). Scores are read as float texels (gathered on lavapipe) and each is written
// once; an invocation reads a score before it overwrites it and never after.
layout(local_size_x = 64) in;
layout(binding = 0) uniform textureBuffer In;
layout(std430, binding = 1) writeonly buffer S { float s[]; };
layout(binding = 2) uniform itextureBuffer Step;  // past, total
layout(push_constant) uniform Params { int rows; int stride; } p;
void main() {
    int r = int(gl_GlobalInvocationID.x);
    if (r >= p.rows) return;
    int base = r * p.stride;
    int total = texelFetch(Step, 1).x;
    float top = uintBitsToFloat(0xFF800000u);
    for (int j = 0; j < total; ++j) top = max(top, texelFetch(In, base + j).x);
    float sum = 0.0;
    for (int j = 0; j < total; ++j) sum += exp(texelFetch(In, base + j).x - top);
    float inv = 1.0 / sum;
    for (int j = 0; j < total; ++j) s[base + j] = exp(texelFetch(In, base + j).x - top) * inv;
}
