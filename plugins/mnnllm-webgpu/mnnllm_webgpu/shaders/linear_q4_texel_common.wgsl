// The part of the 4-bit texel kernels (linear_q4_texel*.wgsl; a CPU adapter such as lavapipe)
// that they share. Weights are read from textures, which lavapipe fetches with vector gathers (a
// storage-buffer read is a loop over the lanes): read-only storage textures where the device binds
// six (W_TEXTURE, SZ_TEXTURE; LEVEL empty: lavapipe loads such a texel with an address and a bounds
// check), else sampled ones (LEVEL ", 0": a load through the mip level, ~1.4x the time). A layer's
// rows are folded into bands of `width` columns (128, one work-group's rows, where the texture is
// high enough: its texels one contiguous run): texel (c, band * vecs + k) of w holds codes
// 32k .. 32k + 31 of row band * width + c (code 8i + n of word i in bits 4n), texel
// (c, band * blocks + b) of sz that row's block b (scale, zero): two f16 where they are f16
// exactly, else f32 bits (SZ_FETCH). An invocation's rows are 8 apart, so that neighbouring
// lanes fetch neighbouring texels; past the last row the last one is read again. x, the input
// rows (X_UNIFORM or X_TEXTURE of shaders/__init__.py): a uniform block (one token) or an
// rgba32uint texture of their f32 bits, a token a texel row (several tokens); either way one load
// for all lanes. Per block of codes c and inputs x: scale * (sum(c * x) - offset * sum(x)) + zero * sum(x).
struct Vec32 { a0: vec4<f32>, a1: vec4<f32>, a2: vec4<f32>, a3: vec4<f32>,
               a4: vec4<f32>, a5: vec4<f32>, a6: vec4<f32>, a7: vec4<f32> }

// codes 0..3 (lo) or 4..7 (hi) of a word, each times 16^n (n its place in the half): masked,
// not shifted; the inputs they meet are scaled by 16^-n (placed), so that every product is the
// code times the input exactly (powers of two) for one instruction less per code.
const PLACES = vec4<u32>(0xfu, 0xf0u, 0xf00u, 0xf000u);
const UNPLACE = vec4<f32>(1.0, 0.0625, 0.00390625, 0.000244140625);

fn lo(word: u32) -> vec4<f32> {
    return vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(word) & PLACES));
}

fn hi(word: u32) -> vec4<f32> {
    return vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(word >> 16u) & PLACES));
}

${X_INPUTS}

// the sum of code * input over 32 codes (lo, hi) and their inputs, placed
fn dot32(wv: vec4<u32>, a: Vec32) -> f32 {
    return dot(lo(wv.x), a.a0) + dot(hi(wv.x), a.a1) + dot(lo(wv.y), a.a2) + dot(hi(wv.y), a.a3)
         + dot(lo(wv.z), a.a4) + dot(hi(wv.z), a.a5) + dot(lo(wv.w), a.a6) + dot(hi(wv.w), a.a7);
}

// 32 inputs scaled for lo / hi's codes
fn placed(a: Vec32) -> Vec32 {
    return Vec32(a.a0 * UNPLACE, a.a1 * UNPLACE, a.a2 * UNPLACE, a.a3 * UNPLACE,
                 a.a4 * UNPLACE, a.a5 * UNPLACE, a.a6 * UNPLACE, a.a7 * UNPLACE);
}

fn total(a: Vec32) -> f32 {
    let s = a.a0 + a.a1 + a.a2 + a.a3 + a.a4 + a.a5 + a.a6 + a.a7;
    return s.x + s.y + s.z + s.w;
}

// four rows' (columns c) sums of code * input over inputs 32k .. 32k + 31 of token row t, at
// texel row ky: word by word, so that only two of the inputs' vec4 are held at a time
fn dot4(w: ${W_TEXTURE}, c: vec4<i32>, ky: i32, t: i32, vecs: i32, k: i32) -> vec4<f32> {
    let t0 = textureLoad(w, vec2<i32>(c.x, ky)${LEVEL});
    let t1 = textureLoad(w, vec2<i32>(c.y, ky)${LEVEL});
    let t2 = textureLoad(w, vec2<i32>(c.z, ky)${LEVEL});
    let t3 = textureLoad(w, vec2<i32>(c.w, ky)${LEVEL});
    var d = vec4<f32>(0.0);
    for (var q = 0; q < 4; q++) {
        let xa = input(t, vecs, k * 8 + 2 * q) * UNPLACE;
        let xb = input(t, vecs, k * 8 + 2 * q + 1) * UNPLACE;
        d += vec4<f32>(dot(lo(t0[q]), xa) + dot(hi(t0[q]), xb), dot(lo(t1[q]), xa) + dot(hi(t1[q]), xb),
                       dot(lo(t2[q]), xa) + dot(hi(t2[q]), xb), dot(lo(t3[q]), xa) + dot(hi(t3[q]), xb));
    }
    return d;
}

struct ScaleZero { scale: vec4<f32>, zero: vec4<f32> }

// one row's (scale, zero) at texel `at` of sz: f32 bits (rg32uint) or two f16 (r32uint; SZ_FETCH)
fn pair(sz: ${SZ_TEXTURE}, at: vec2<i32>) -> vec2<f32> {
    return ${SZ_FETCH};
}

// four rows' (scale, zero) at texel row by
fn scale_zero(sz: ${SZ_TEXTURE}, c: vec4<i32>, by: i32) -> ScaleZero {
    let s0 = pair(sz, vec2<i32>(c.x, by));
    let s1 = pair(sz, vec2<i32>(c.y, by));
    let s2 = pair(sz, vec2<i32>(c.z, by));
    let s3 = pair(sz, vec2<i32>(c.w, by));
    return ScaleZero(vec4<f32>(s0.x, s1.x, s2.x, s3.x), vec4<f32>(s0.y, s1.y, s2.y, s3.y));
}

// the columns of rows r0 + 8i (i = 0..3) of a band starting at row `band_row0`, within the layer's `rows`
fn columns(r0: i32, band_row0: i32, rows: i32) -> vec4<i32> {
    return min(vec4<i32>(r0 - band_row0) + vec4<i32>(0, 8, 16, 24), vec4<i32>(rows - 1 - band_row0));
}

struct Rows16 { a: vec4<f32>, b: vec4<f32>, c: vec4<f32>, d: vec4<f32> }

// one token (row t of x): rows first + lane + 8i (i = 0..15) of a layer, first a multiple of 128
fn rows16(w: ${W_TEXTURE}, sz: ${SZ_TEXTURE}, first: i32, lane: i32, rows: i32, width: i32, t: i32,
          vecs: i32, vecs_per_block: i32, blocks: i32, offset: f32) -> Rows16 {
    let band = first / width;
    let r0 = first + lane;
    let ca = columns(r0, band * width, rows);
    let cb = columns(r0 + 32, band * width, rows);
    let cc = columns(r0 + 64, band * width, rows);
    let cd = columns(r0 + 96, band * width, rows);
    let ky = band * vecs;
    let by = band * blocks;
    var acc = Rows16(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
    for (var b = 0; b < blocks; b++) {
        var pa = vec4<f32>(0.0);
        var pb = vec4<f32>(0.0);
        var pc = vec4<f32>(0.0);
        var pd = vec4<f32>(0.0);
        var xs = 0.0;
        for (var j = 0; j < vecs_per_block; j++) {
            let k = b * vecs_per_block + j;
            xs += total(inputs(t, vecs, k));
            pa += dot4(w, ca, ky + k, t, vecs, k);
            pb += dot4(w, cb, ky + k, t, vecs, k);
            pc += dot4(w, cc, ky + k, t, vecs, k);
            pd += dot4(w, cd, ky + k, t, vecs, k);
        }
        let sa = scale_zero(sz, ca, by + b);
        let sb = scale_zero(sz, cb, by + b);
        let sc = scale_zero(sz, cc, by + b);
        let sd = scale_zero(sz, cd, by + b);
        acc.a += sa.scale * (pa - offset * xs) + sa.zero * xs;
        acc.b += sb.scale * (pb - offset * xs) + sb.zero * xs;
        acc.c += sc.scale * (pc - offset * xs) + sc.zero * xs;
        acc.d += sd.scale * (pd - offset * xs) + sd.zero * xs;
    }
    return acc;
}

// the output of one row: plus its bias, through the activation (1 relu, 2 relu6)
fn activated(v: f32, bias: f32, act: i32) -> f32 {
    let r = v + bias;
    if (act == 1) { return max(r, 0.0); }
    if (act == 2) { return clamp(r, 0.0, 6.0); }
    return r;
}
