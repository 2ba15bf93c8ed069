"""The WGSL kernels (one file per kernel), read by device.Compiler; the snippets a kernel's
`${KEY}` defines take (SUM8_SUBGROUP, SUM8_SHARED, X_UNIFORM, X_TEXTURE) are here too."""

# the sum over 8 consecutive lanes, in linear_q4.wgsl's sum8(li, v): a butterfly of subgroup
# shuffles (lanes li ^ 4, ^ 2, ^ 1: the same tree as the shared-memory one) or a shared-memory tree.
# Naga (wgpu 0.32) takes the subgroup builtins on a device opened with "subgroup" and rejects
# WGSL's `enable subgroups;`, so the kernel has no enable directive.
SUM8_SUBGROUP = """var s = v;
    s += subgroupShuffleXor(s, 4u);
    s += subgroupShuffleXor(s, 2u);
    s += subgroupShuffleXor(s, 1u);
    return s;"""
SUM8_SHARED = """part[li] = v;
    workgroupBarrier();
    for (var h = 4u; h > 0u; h >>= 1u) {
        if (li % 8u < h) { part[li] += part[li + h]; }
        workgroupBarrier();
    }
    let s = part[li - li % 8u];
    workgroupBarrier();
    return s;"""

# linear_q4_texel_common.wgsl's input x and its readers input(t, vecs, v) (vec4 v of token t's
# row of `vecs` x 8 vec4) and inputs(t, vecs, k) (the eight of 32k .. 32k + 31): a uniform block
# of XV vec4 (one token: decode), or a texture of the rows' f32 bits, one token per texel row
# (several tokens: prefill; not bound by uniform blocks' 64 KiB).
X_UNIFORM = """@group(0) @binding(0) var<uniform> x: array<vec4<f32>, ${XV}>;

fn input(t: i32, vecs: i32, v: i32) -> vec4<f32> {
    return x[t * vecs * 8 + v];
}"""
X_TEXTURE = """@group(0) @binding(0) var x: ${W_TEXTURE};

fn input(t: i32, vecs: i32, v: i32) -> vec4<f32> {
    return bitcast<vec4<f32>>(textureLoad(x, vec2<i32>(v, t)${LEVEL}));
}"""
INPUTS = """
fn inputs(t: i32, vecs: i32, k: i32) -> Vec32 {
    let v = k * 8;
    return Vec32(input(t, vecs, v), input(t, vecs, v + 1), input(t, vecs, v + 2), input(t, vecs, v + 3),
                 input(t, vecs, v + 4), input(t, vecs, v + 5), input(t, vecs, v + 6), input(t, vecs, v + 7));
}"""
X_UNIFORM += INPUTS
X_TEXTURE += INPUTS
