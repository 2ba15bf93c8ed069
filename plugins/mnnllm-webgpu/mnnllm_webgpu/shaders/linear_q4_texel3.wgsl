// Up to three 4-bit layers reading the same input (q, k and v; gate and up), one token (decode),
// in one dispatch on a CPU adapter (linear_q4_texel_common.wgsl): work-groups below ends.x take
// layer 0, below ends.y layer 1, the rest layer 2, each group 128 rows of its layer (so that every
// group reads one layer's textures). Layers share the input, the blocks and the codes' offset.
${COMMON}
struct Params { rows: vec4<i32>, width: vec4<i32>, has_bias: vec4<i32>, act: vec4<i32>, ends: vec4<i32>,
                vecs: i32, vecs_per_block: i32, blocks: i32, offset: f32 }
@group(0) @binding(1) var w0: ${W_TEXTURE};
@group(0) @binding(2) var sz0: ${SZ_TEXTURE};
@group(0) @binding(3) var<storage, read> bias0: array<f32>;
@group(0) @binding(4) var<storage, read_write> y0: array<f32>;
@group(0) @binding(5) var w1: ${W_TEXTURE};
@group(0) @binding(6) var sz1: ${SZ_TEXTURE};
@group(0) @binding(7) var<storage, read> bias1: array<f32>;
@group(0) @binding(8) var<storage, read_write> y1: array<f32>;
@group(0) @binding(9) var w2: ${W_TEXTURE};
@group(0) @binding(10) var sz2: ${SZ_TEXTURE};
@group(0) @binding(11) var<storage, read> bias2: array<f32>;
@group(0) @binding(12) var<storage, read_write> y2: array<f32>;
@group(0) @binding(13) var<uniform> p: Params;

// rows o + 8i (i = 0..3) of layer `layer`
fn store(layer: i32, o: i32, rows: i32, has_bias: bool, act: i32, v: vec4<f32>) {
    for (var i = 0; i < 4; i++) {
        let row = o + 8 * i;
        if (row >= rows) { return; }
        if (layer == 0) {
            var b = 0.0;
            if (has_bias) { b = bias0[row]; }
            y0[row] = activated(v[i], b, act);
        } else if (layer == 1) {
            var b = 0.0;
            if (has_bias) { b = bias1[row]; }
            y1[row] = activated(v[i], b, act);
        } else {
            var b = 0.0;
            if (has_bias) { b = bias2[row]; }
            y2[row] = activated(v[i], b, act);
        }
    }
}

@compute @workgroup_size(8)
fn main(@builtin(workgroup_id) g: vec3<u32>, @builtin(local_invocation_id) l: vec3<u32>) {
    let group = i32(g.x);
    let layer = select(select(2, 1, group < p.ends.y), 0, group < p.ends.x);
    let first = (group - select(0, p.ends[layer - 1], layer > 0)) * 128;
    let lane = i32(l.x);
    let rows = p.rows[layer];
    var acc: Rows16;
    if (layer == 0) {
        acc = rows16(w0, sz0, first, lane, rows, p.width[0], 0, p.vecs, p.vecs_per_block, p.blocks, p.offset);
    } else if (layer == 1) {
        acc = rows16(w1, sz1, first, lane, rows, p.width[1], 0, p.vecs, p.vecs_per_block, p.blocks, p.offset);
    } else {
        acc = rows16(w2, sz2, first, lane, rows, p.width[2], 0, p.vecs, p.vecs_per_block, p.blocks, p.offset);
    }
    let r0 = first + lane;
    let has_bias = p.has_bias[layer] != 0;
    store(layer, r0, rows, has_bias, p.act[layer], acc.a);
    store(layer, r0 + 32, rows, has_bias, p.act[layer], acc.b);
    store(layer, r0 + 64, rows, has_bias, p.act[layer], acc.c);
    store(layer, r0 + 96, rows, has_bias, p.act[layer], acc.d);
}
