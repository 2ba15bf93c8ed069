#version 450
// Float BinaryOp with broadcasting over at most 4 dims: each input has its own element strides
// (0 where it broadcasts). op: 0 ADD, 1 SUB, 2 MUL, 3 REALDIV, 4 MUL_SILU (a * silu(b)),
// 5 MAXIMUM, 6 MINIMUM. act: 0 none, 1 relu, 2 relu6. Inputs read as float texels.
#extension GL_EXT_samplerless_texture_functions : require
layout(local_size_x = 256) in;
layout(binding = 0) uniform textureBuffer A;
layout(binding = 1) uniform textureBuffer B;
layout(std430, binding = 2) writeonly buffer C { float c[]; };
layout(push_constant) uniform Params {
    ivec4 dims;
    ivec4 sa;
    ivec4 sb;
    int total;
    int op;
    int act;
    uint row;
} p;
void main() {
    int i = int(gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * p.row);
    if (i >= p.total) return;
    int rest = i;
    int ia = 0, ib = 0;
    for (int d = 3; d >= 0; --d) {
        int k = rest % p.dims[d];
        rest /= p.dims[d];
        ia += k * p.sa[d];
        ib += k * p.sb[d];
    }
    float x = texelFetch(A, ia).x, y = texelFetch(B, ib).x, r;
    if (p.op == 0) r = x + y;
    else if (p.op == 1) r = x - y;
    else if (p.op == 2) r = x * y;
    else if (p.op == 3) r = x / y;
    else if (p.op == 4) r = x * (y / (1.0 + exp(-y)));
    else if (p.op == 5) r = max(x, y);
    else r = min(x, y);
    if (p.act == 1) r = max(r, 0.0);
    else if (p.act == 2) r = clamp(r, 0.0, 6.0);
    c[i] = r;
}
