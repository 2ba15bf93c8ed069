// One 4-bit layer, one token (decode), on a CPU adapter (linear_q4_texel_common.wgsl): a
// work-group of 8 invocations computes 128 output rows, 16 each.
${COMMON}
struct Params { rows: i32, width: i32, vecs: i32, vecs_per_block: i32, blocks: i32, has_bias: i32, act: i32,
                offset: f32 }
@group(0) @binding(1) var w: ${W_TEXTURE};
@group(0) @binding(2) var sz: ${SZ_TEXTURE};
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var<uniform> p: Params;

fn store(o: i32, v: vec4<f32>) {
    for (var i = 0; i < 4; i++) {
        let row = o + 8 * i;
        if (row >= p.rows) { return; }
        var b = 0.0;
        if (p.has_bias != 0) { b = bias[row]; }
        y[row] = activated(v[i], b, p.act);
    }
}

@compute @workgroup_size(8)
fn main(@builtin(workgroup_id) g: vec3<u32>, @builtin(local_invocation_id) l: vec3<u32>) {
    let first = i32(g.x) * 128;
    let acc = rows16(w, sz, first, i32(l.x), p.rows, p.width, 0, p.vecs, p.vecs_per_block, p.blocks, p.offset);
    let r0 = first + i32(l.x);
    store(r0, acc.a);
    store(r0 + 32, acc.b);
    store(r0 + 64, acc.c);
    store(r0 + 96, acc.d);
}
