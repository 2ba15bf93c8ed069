#version 450
// The availability probe: doubles four floats in place.
layout(local_size_x = 4) in;
layout(std430, binding = 0) buffer Data { float a[]; };
void main() { a[gl_GlobalInvocationID.x] *= 2.0; }
