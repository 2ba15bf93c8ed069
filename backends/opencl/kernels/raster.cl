/* MNN's Raster region copy: a 3-D box of elements of type T (picked by element size), from
 * src at src_offset + dot(index, src_stride) to dst at dst_offset + dot(index, dst_stride).
 * NDRange (size[2], size[1], size[0]): dimension 0 is the innermost. */
__kernel void raster(__global const T *src, __global T *dst, int src_offset, int4 src_stride,
                     int dst_offset, int4 dst_stride) {
    const int x = get_global_id(0), y = get_global_id(1), z = get_global_id(2);
    dst[dst_offset + z * dst_stride.x + y * dst_stride.y + x * dst_stride.z] =
        src[src_offset + z * src_stride.x + y * src_stride.y + x * src_stride.z];
}
