#version 450
#extension GL_EXT_samplerless_texture_functions : require
// Append a step's keys and values to the device KV cache: `count` floats of k and of v (the
// step's tokens, token-major rows of row_floats) to the caches at row step.past, so that a
// recorded command buffer writes each token where the host's bookkeeping says.
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer K { float k[]; };
layout(std430, binding = 1) readonly buffer V { float v[]; };
layout(std430, binding = 2) writeonly buffer CK { float ck[]; };
layout(std430, binding = 3) writeonly buffer CV { float cv[]; };
layout(binding = 4) uniform itextureBuffer Step;  // past, total
layout(push_constant) uniform Params { int count; int row_floats; uint row; } p;
void main() {
    int i = int(gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * p.row);
    if (i >= p.count) return;
    int at = texelFetch(Step, 0).x * p.row_floats + i;
    ck[at] = k[i];
    cv[at] = v[i];
}
