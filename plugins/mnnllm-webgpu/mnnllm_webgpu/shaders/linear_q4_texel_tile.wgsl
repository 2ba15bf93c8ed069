// One 4-bit layer over several tokens (prefill) on a CPU adapter (linear_q4_texel_common.wgsl):
// a work-group of 8 invocations computes 128 output rows of 4 tokens (from the dispatch's y
// times 4), 16 rows x 4 tokens each, so that each fetched texel serves 4 tokens and each input
// 16 rows. WIDE false (a layer's last 64 rows, where its rows are 64 past a multiple of 128): 64
// rows, 8 an invocation, the other half neither fetched nor summed (a constant: the compiler drops
// it). Work-group g computes rows from (group0 + g) * 128. x: the input's `tokens` rows from token t0 as a texture; past the last token the last
// one is read again and nothing written.
${COMMON}
struct Params { rows: i32, width: i32, vecs: i32, vecs_per_block: i32, blocks: i32, has_bias: i32, act: i32,
                offset: f32, tokens: i32, t0: i32, group0: i32 }
const WIDE = ${WIDE};
@group(0) @binding(1) var w: ${W_TEXTURE};
@group(0) @binding(2) var sz: ${SZ_TEXTURE};
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
    return Words4(textureLoad(w, vec2<i32>(c.x, ky)${LEVEL}), textureLoad(w, vec2<i32>(c.y, ky)${LEVEL}),
                  textureLoad(w, vec2<i32>(c.z, ky)${LEVEL}), textureLoad(w, vec2<i32>(c.w, ky)${LEVEL}));
}

fn dots(t: Words4, a: Vec32) -> vec4<f32> {
    return vec4<f32>(dot32(t.a, a), dot32(t.b, a), dot32(t.c, a), dot32(t.d, a));
}

// one token's partial sums of 16 rows (groups of 4: texels wa .. wd) plus this k's
fn add16(s: Rows16, wa: Words4, wb: Words4, wc: Words4, wd: Words4, a: Vec32) -> Rows16 {
    if (!WIDE) { return Rows16(s.a + dots(wa, a), s.b + dots(wb, a), s.c, s.d); }
    return Rows16(s.a + dots(wa, a), s.b + dots(wb, a), s.c + dots(wc, a), s.d + dots(wd, a));
}

// acc plus one block's partial sums scaled: scale * (part - offset * xs) + zero * xs
fn scaled16(acc: Rows16, part: Rows16, sa: ScaleZero, sb: ScaleZero, sc: ScaleZero, sd: ScaleZero, xs: f32) -> Rows16 {
    let off = p.offset * xs;
    if (!WIDE) {
        return Rows16(acc.a + sa.scale * (part.a - off) + sa.zero * xs, acc.b + sb.scale * (part.b - off) + sb.zero * xs,
                      acc.c, acc.d);
    }
    return Rows16(acc.a + sa.scale * (part.a - off) + sa.zero * xs, acc.b + sb.scale * (part.b - off) + sb.zero * xs,
                  acc.c + sc.scale * (part.c - off) + sc.zero * xs, acc.d + sd.scale * (part.d - off) + sd.zero * xs);
}

fn store16(t: i32, r0: i32, v: Rows16) {
    store(t, r0, v.a);
    store(t, r0 + 32, v.b);
    if (!WIDE) { return; }
    store(t, r0 + 64, v.c);
    store(t, r0 + 96, v.d);
}

@compute @workgroup_size(8)
fn main(@builtin(workgroup_id) g: vec3<u32>, @builtin(local_invocation_id) l: vec3<u32>) {
    let first = (p.group0 + i32(g.x)) * 128;
    let t = i32(g.y) * 4;
    let last = p.tokens - 1;
    let t1 = min(t + 1, last);
    let t2 = min(t + 2, last);
    let t3 = min(t + 3, last);
    let band = first / p.width;
    let r0 = first + i32(l.x);
    let ca = columns(r0, band * p.width, p.rows);
    let cb = columns(r0 + 32, band * p.width, p.rows);
    let cc = columns(r0 + 64, band * p.width, p.rows);
    let cd = columns(r0 + 96, band * p.width, p.rows);
    let ky = band * p.vecs;
    let by = band * p.blocks;
    let zero = Rows16(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
    var acc0 = zero;
    var acc1 = zero;
    var acc2 = zero;
    var acc3 = zero;
    for (var b = 0; b < p.blocks; b++) {
        var p0 = zero;
        var p1 = zero;
        var p2 = zero;
        var p3 = zero;
        var xs = vec4<f32>(0.0);
        for (var j = 0; j < p.vecs_per_block; j++) {
            let k = b * p.vecs_per_block + j;
            let wa = texels4(ca, ky + k);
            let wb = texels4(cb, ky + k);
            var wc = wa;
            var wd = wa;
            if (WIDE) {
                wc = texels4(cc, ky + k);
                wd = texels4(cd, ky + k);
            }
            let x0 = inputs(t, p.vecs, k);
            let x1 = inputs(t1, p.vecs, k);
            let x2 = inputs(t2, p.vecs, k);
            let x3 = inputs(t3, p.vecs, k);
            xs += vec4<f32>(total(x0), total(x1), total(x2), total(x3));
            p0 = add16(p0, wa, wb, wc, wd, placed(x0));
            p1 = add16(p1, wa, wb, wc, wd, placed(x1));
            p2 = add16(p2, wa, wb, wc, wd, placed(x2));
            p3 = add16(p3, wa, wb, wc, wd, placed(x3));
        }
        let sa = scale_zero(sz, ca, by + b);
        let sb = scale_zero(sz, cb, by + b);
        var sc = sa;
        var sd = sa;
        if (WIDE) {
            sc = scale_zero(sz, cc, by + b);
            sd = scale_zero(sz, cd, by + b);
        }
        acc0 = scaled16(acc0, p0, sa, sb, sc, sd, xs.x);
        acc1 = scaled16(acc1, p1, sa, sb, sc, sd, xs.y);
        acc2 = scaled16(acc2, p2, sa, sb, sc, sd, xs.z);
        acc3 = scaled16(acc3, p3, sa, sb, sc, sd, xs.w);
    }
    store16(t, r0, acc0);
    store16(t + 1, r0, acc1);
    store16(t + 2, r0, acc2);
    store16(t + 3, r0, acc3);
}
