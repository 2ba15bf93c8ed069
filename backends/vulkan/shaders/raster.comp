#version 450
// One Raster region of 4-byte elements: dst[dst_offset + i.dst_stride] = src[src_offset + i.src_stride]
// over the box `size` (3 dims, the last fastest). Invocations beyond the box do nothing.
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer Src { uint src[]; };
layout(std430, binding = 1) writeonly buffer Dst { uint dst[]; };
layout(push_constant) uniform Params {
    ivec4 size;        // xyz = box extents, w = total elements
    ivec4 src_stride;  // xyz = strides, w = offset
    ivec4 dst_stride;  // xyz = strides, w = offset
    uint row;          // invocations per dispatch row (for dispatches over 65535 groups)
} p;
void main() {
    int i = int(gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * p.row);
    if (i >= p.size.w) return;
    int z = i % p.size.z;
    int rest = i / p.size.z;
    int y = rest % p.size.y;
    int x = rest / p.size.y;
    dst[p.dst_stride.w + x * p.dst_stride.x + y * p.dst_stride.y + z * p.dst_stride.z] =
        src[p.src_stride.w + x * p.src_stride.x + y * p.src_stride.y + z * p.src_stride.z];
}
