#version 450
// Cast between int32 and float32 on raw 32-bit words. mode 0: float -> int (toward zero),
// 1: int -> float, 2: a copy (float -> float).
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { uint x[]; };
layout(std430, binding = 1) writeonly buffer Y { uint y[]; };
layout(push_constant) uniform Params { int total; int mode; uint row; } p;
void main() {
    int i = int(gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * p.row);
    if (i >= p.total) return;
    if (p.mode == 0) y[i] = uint(int(uintBitsToFloat(x[i])));
    else if (p.mode == 1) y[i] = floatBitsToUint(float(int(x[i])));
    else y[i] = x[i];
}
