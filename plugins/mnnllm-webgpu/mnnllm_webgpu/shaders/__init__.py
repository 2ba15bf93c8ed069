"""The WGSL kernels (one file per kernel), read by device.Compiler; the snippets a kernel's
`${KEY}` defines take (SUM8_SUBGROUP, SUM8_SHARED) are here too."""

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
