#version 450
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_EXT_samplerless_texture_functions : require
// attn_softmax.comp for a device with subgroup arithmetic (subgroups of at least 8): one
// work-group of 8 invocations per score row, each taking every 8th score, joined by
// subgroupMax / subgroupAdd.
layout(local_size_x = 8) in;
layout(binding = 0) uniform textureBuffer In;
layout(std430, binding = 1) writeonly buffer S { float s[]; };
layout(binding = 2) uniform itextureBuffer Step;  // past, total
layout(push_constant) uniform Params { int rows; int stride; uint groups_x; } p;
void main() {
    int r = int(gl_WorkGroupID.x + gl_WorkGroupID.y * p.groups_x);
    if (r >= p.rows) return;
    int lane = int(gl_LocalInvocationID.x);
    int base = r * p.stride;
    int total = texelFetch(Step, 1).x;
    float top = uintBitsToFloat(0xFF800000u);
    for (int j = lane; j < total; j += 8) top = max(top, texelFetch(In, base + j).x);
    top = subgroupMax(top);
    float sum = 0.0;
    for (int j = lane; j < total; j += 8) sum += exp(texelFetch(In, base + j).x - top);
    float inv = 1.0 / subgroupAdd(sum);
    for (int j = lane; j < total; j += 8) s[base + j] = exp(texelFetch(In, base + j).x - top) * inv;
}
