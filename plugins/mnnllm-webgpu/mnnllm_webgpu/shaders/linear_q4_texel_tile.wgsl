// One 4-bit layer over several tokens (prefill) on a CPU adapter (linear_q4_texel_common.wgsl):
// a work-group of 8 invocations computes 64 output rows of 4 tokens (from the dispatch's y
// times 4), 8 rows x 4 tokens each, so that each fetched texel serves 4 tokens. x: the input's
// `tokens` rows from token t0 as a texture; past the last token the last one is read again and nothing written.
${COMMON}
struct Params { rows: i32, width: i32, vecs: i32, vecs_per_block: i32, blocks: i32, has_bias: i32, act: i32,
                offset: f32, tokens: i32, t0: i32 }
@group(0) @binding(1) var w: texture_2d<u32>;
@group(0) @binding(2) var sz: texture_2d<u32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var<uniform> p: Params;

// rows o + 8i (i = 0..3) of token t
fn store(t: i32, o: i32, v: vec4<f32>) {
    if (t >= p.tokens) { return; }
    for (var i = 0; i < 4; i++) {
        let row = o + 8 * i;
        if (row >= p.rows) { return; }
        var b = 0.0;
        if (p.has_bias != 0) { b = bias[row]; }
        y[(p.t0 + t) * p.rows + row] = activated(v[i], b, p.act);
    }
}

struct Words4 { a: vec4<u32>, b: vec4<u32>, c: vec4<u32>, d: vec4<u32> }

// the texels of four rows (columns c) at texel row ky
fn texels4(c: vec4<i32>, ky: i32) -> Words4 {
    return Words4(textureLoad(w, vec2<i32>(c.x, ky), 0), textureLoad(w, vec2<i32>(c.y, ky), 0),
                  textureLoad(w, vec2<i32>(c.z, ky), 0), textureLoad(w, vec2<i32>(c.w, ky), 0));
}

fn dots(t: Words4, a: Vec32) -> vec4<f32> {
    return vec4<f32>(dot32(t.a, a), dot32(t.b, a), dot32(t.c, a), dot32(t.d, a));
}

@compute @workgroup_size(8)
fn main(@builtin(workgroup_id) g: vec3<u32>, @builtin(local_invocation_id) l: vec3<u32>) {
    let first = i32(g.x) * 64;
    let t = i32(g.y) * 4;
    let last = p.tokens - 1;
    let t1 = min(t + 1, last);
    let t2 = min(t + 2, last);
    let t3 = min(t + 3, last);
    let band = first / p.width;
    let r0 = first + i32(l.x);
    let ca = columns(r0, band * p.width, p.rows);
    let cb = columns(r0 + 32, band * p.width, p.rows);
    let ky = band * p.vecs;
    let by = band * p.blocks;
    var a0 = vec4<f32>(0.0);
    var b0 = vec4<f32>(0.0);
    var a1 = vec4<f32>(0.0);
    var b1 = vec4<f32>(0.0);
    var a2 = vec4<f32>(0.0);
    var b2 = vec4<f32>(0.0);
    var a3 = vec4<f32>(0.0);
    var b3 = vec4<f32>(0.0);
    for (var b = 0; b < p.blocks; b++) {
        var pa0 = vec4<f32>(0.0);
        var pb0 = vec4<f32>(0.0);
        var pa1 = vec4<f32>(0.0);
        var pb1 = vec4<f32>(0.0);
        var pa2 = vec4<f32>(0.0);
        var pb2 = vec4<f32>(0.0);
        var pa3 = vec4<f32>(0.0);
        var pb3 = vec4<f32>(0.0);
        var xs = vec4<f32>(0.0);
        for (var j = 0; j < p.vecs_per_block; j++) {
            let k = b * p.vecs_per_block + j;
            let wa = texels4(ca, ky + k);
            let wb = texels4(cb, ky + k);
            let x0 = inputs(t, p.vecs, k);
            let x1 = inputs(t1, p.vecs, k);
            let x2 = inputs(t2, p.vecs, k);
            let x3 = inputs(t3, p.vecs, k);
            xs += vec4<f32>(total(x0), total(x1), total(x2), total(x3));
            let y0 = placed(x0);
            let y1 = placed(x1);
            let y2 = placed(x2);
            let y3 = placed(x3);
            pa0 += dots(wa, y0);
            pb0 += dots(wb, y0);
            pa1 += dots(wa, y1);
            pb1 += dots(wb, y1);
            pa2 += dots(wa, y2);
            pb2 += dots(wb, y2);
            pa3 += dots(wa, y3);
            pb3 += dots(wb, y3);
        }
        let sa = scale_zero(sz, ca, by + b);
        let sb = scale_zero(sz, cb, by + b);
        let off = p.offset * xs;
        a0 += sa.scale * (pa0 - off.x) + sa.zero * xs.x;
        b0 += sb.scale * (pb0 - off.x) + sb.zero * xs.x;
        a1 += sa.scale * (pa1 - off.y) + sa.zero * xs.y;
        b1 += sb.scale * (pb1 - off.y) + sb.zero * xs.y;
        a2 += sa.scale * (pa2 - off.z) + sa.zero * xs.z;
        b2 += sb.scale * (pb2 - off.z) + sb.zero * xs.z;
        a3 += sa.scale * (pa3 - off.w) + sa.zero * xs.w;
        b3 += sb.scale * (pb3 - off.w) + sb.zero * xs.w;
    }
    store(t, r0, a0);
    store(t, r0 + 32, b0);
    store(t + 1, r0, a1);
    store(t + 1, r0 + 32, b1);
    store(t + 2, r0, a2);
    store(t + 2, r0 + 32, b2);
    store(t + 3, r0, a3);
    store(t + 3, r0 + 32, b3);
}
