#version 450
// Attention scores, one invocation per (query token t, head h, key j): s[(t*heads+h)*stride+j]
// = dot(q, k_j) * scale (+ mask). Keys are token-major: key j of kv head g at (j*kv_heads+g)*dim.
// mask_mode 0: none; 1: causal (j <= past + t); 2: float mask, 3: int mask (0 = masked out),
// a [mask_rows, mask_cols] mask over the last mask_cols keys. Masked scores are -inf.
// The step's past and total (keys attended to) are read from `step`, written by the host before
// each submit, so a recorded command buffer replays for every token: the dispatch covers
// seq * heads * stride invocations (stride: the cache's capacity) and those past total return.
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer Q { float q[]; };
layout(std430, binding = 1) readonly buffer K { float k[]; };
layout(std430, binding = 2) readonly buffer M { uint mask[]; };
layout(std430, binding = 3) writeonly buffer S { float s[]; };
layout(std430, binding = 4) readonly buffer Step { int past; int total; } step;
layout(push_constant) uniform Params {
    int seq; int heads; int kv_heads; int dim; int stride; float scale;
    int mask_mode; int mask_rows; int mask_cols; uint row;
} p;
void main() {
    int id = int(gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * p.row);
    int j = id % p.stride, th = id / p.stride;
    int total = step.total;
    if (th >= p.seq * p.heads || j >= total) return;
    int h = th % p.heads, t = th / p.heads;
    int g = h / (p.heads / p.kv_heads);
    int qa = (t * p.heads + h) * p.dim, ka = (j * p.kv_heads + g) * p.dim;
    float dot = 0.0;
    for (int d = 0; d < p.dim; ++d) dot += q[qa + d] * k[ka + d];
    float score = dot * p.scale;
    const float NEG_INF = uintBitsToFloat(0xFF800000u);
    if (p.mask_mode == 1) {
        if (j > step.past + t) score = NEG_INF;
    } else if (p.mask_mode >= 2) {
        int start = total - p.mask_cols;
        if (j >= start) {
            uint m = mask[(p.mask_rows - p.seq + t) * p.mask_cols + j - start];
            if (p.mask_mode == 2) score += uintBitsToFloat(m);
            else if (m == 0u) score = NEG_INF;
        }
    }
    s[th * p.stride + j] = score;
}
