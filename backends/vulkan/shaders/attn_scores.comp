#version 450
#extension GL_EXT_samplerless_texture_functions : require
// Attention scores, one invocation per (query token t, head h, key j): s[(t*heads+h)*stride+j]
// = dot(q, k_j) * scale (+ mask). Keys are token-major: key j of kv head g at (j*kv_heads+g)*dim.
// mask_mode 0: none; 1: causal (j <= past + t); 2: float mask, 3: int mask (0 = masked out),
// a [mask_rows, mask_cols] mask over the last mask_cols keys. Masked scores are -inf.
// The step's past and total (keys attended to) are read from `step`, written by the host before
// each submit, so a recorded command buffer replays for every token: the dispatch covers
// seq * heads * stride invocations (stride: the cache's capacity) and those past total return.
// Inputs are read as texels (vec4 when dim % 4 == 0, else float): lavapipe gathers texels but
// reads a storage buffer one lane at a time.
layout(local_size_x = 256) in;
layout(binding = 0) uniform textureBuffer Q4;
layout(binding = 1) uniform textureBuffer K4;
layout(binding = 2) uniform textureBuffer Q1;  // the same buffers as float texels
layout(binding = 3) uniform textureBuffer K1;
layout(binding = 4) uniform utextureBuffer M;
layout(std430, binding = 5) writeonly buffer S { float s[]; };
layout(binding = 6) uniform itextureBuffer Step;  // past, total
layout(push_constant) uniform Params {
    int seq; int heads; int kv_heads; int dim; int stride; float scale;
    int mask_mode; int mask_rows; int mask_cols; uint row;
} p;
void main() {
    int id = int(gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * p.row);
    int j = id % p.stride, th = id / p.stride;
    int past = texelFetch(Step, 0).x, total = texelFetch(Step, 1).x;
    if (th >= p.seq * p.heads || j >= total) return;
    int h = th % p.heads, t = th / p.heads;
    int g = h / (p.heads / p.kv_heads);
    int qa = (t * p.heads + h) * p.dim, ka = (j * p.kv_heads + g) * p.dim;
    float dot4 = 0.0;
    if (p.dim % 4 == 0) {
        for (int d = 0; d < p.dim / 4; ++d) dot4 += dot(texelFetch(Q4, qa / 4 + d), texelFetch(K4, ka / 4 + d));
    } else {
        for (int d = 0; d < p.dim; ++d) dot4 += texelFetch(Q1, qa + d).x * texelFetch(K1, ka + d).x;
    }
    float score = dot4 * p.scale;
    const float NEG_INF = uintBitsToFloat(0xFF800000u);
    if (p.mask_mode == 1) {
        if (j > past + t) score = NEG_INF;
    } else if (p.mask_mode >= 2) {
        int start = total - p.mask_cols;
        if (j >= start) {
            uint m = texelFetch(M, (p.mask_rows - p.seq + t) * p.mask_cols + j - start).x;
            if (p.mask_mode == 2) score += uintBitsToFloat(m);
            else if (m == 0u) score = NEG_INF;
        }
    }
    s[th * p.stride + j] = score;
}
