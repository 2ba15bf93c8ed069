// One 4-bit layer over several tokens (prefill) on a CPU adapter (linear_q4_texel_common.wgsl):
// a work-group of 8 invocations computes 128 output rows of 4 tokens (from the dispatch's y
// times 4), 16 rows x 4 tokens each, so that each fetched texel serves 4 tokens and each input
// 16 rows. Word by word: the 4 tokens' 8 inputs of one word's codes, then every row's codes of
// that word (lavapipe: ~0.75x the CPU time of holding all 32 inputs of the 4 tokens, which spill).
// WIDE false (a layer's last 64 rows, where its rows are 64 past a multiple of 128): 64 rows, 8 an
// invocation, the other half neither fetched nor summed (a constant: the compiler drops it).
// Work-group g computes rows from (group0 + g) * 128. x: the input's `tokens` rows from token t0
// as a texture; past the last token the last one is read again and nothing written.
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

// four rows' words q (texels t) dotted with one token's placed inputs xa (codes 0..3), xb (4..7)
fn dotq(t: Words4, q: i32, xa: vec4<f32>, xb: vec4<f32>) -> vec4<f32> {
    return vec4<f32>(dot(lo(t.a[q]), xa) + dot(hi(t.a[q]), xb), dot(lo(t.b[q]), xa) + dot(hi(t.b[q]), xb),
                     dot(lo(t.c[q]), xa) + dot(hi(t.c[q]), xb), dot(lo(t.d[q]), xa) + dot(hi(t.d[q]), xb));
}

fn addq(s: Rows16, wa: Words4, wb: Words4, wc: Words4, wd: Words4, q: i32, xa: vec4<f32>, xb: vec4<f32>) -> Rows16 {
    if (!WIDE) { return Rows16(s.a + dotq(wa, q, xa, xb), s.b + dotq(wb, q, xa, xb), s.c, s.d); }
    return Rows16(s.a + dotq(wa, q, xa, xb), s.b + dotq(wb, q, xa, xb), s.c + dotq(wc, q, xa, xb),
                  s.d + dotq(wd, q, xa, xb));
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
            for (var q = 0; q < 4; q++) {
                let v = k * 8 + 2 * q;
                let a0 = input(t, p.vecs, v);
                let b0 = input(t, p.vecs, v + 1);
                let a1 = input(t1, p.vecs, v);
                let b1 = input(t1, p.vecs, v + 1);
                let a2 = input(t2, p.vecs, v);
                let b2 = input(t2, p.vecs, v + 1);
                let a3 = input(t3, p.vecs, v);
                let b3 = input(t3, p.vecs, v + 1);
                let one = vec4<f32>(1.0);
                xs += vec4<f32>(dot(a0 + b0, one), dot(a1 + b1, one), dot(a2 + b2, one), dot(a3 + b3, one));
                p0 = addq(p0, wa, wb, wc, wd, q, a0 * UNPLACE, b0 * UNPLACE);
                p1 = addq(p1, wa, wb, wc, wd, q, a1 * UNPLACE, b1 * UNPLACE);
                p2 = addq(p2, wa, wb, wc, wd, q, a2 * UNPLACE, b2 * UNPLACE);
                p3 = addq(p3, wa, wb, wc, wd, q, a3 * UNPLACE, b3 * UNPLACE);
            }
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
